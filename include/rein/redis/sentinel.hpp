// A connection to the master of a Redis Sentinel deployment: the master is found from the sentinels before
// every connection attempt, so a failover is followed by reconnecting.
#pragma once

#include <rein/config.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/error.hpp>
#include <rein/redis/cluster.hpp>
#include <rein/redis/connection.hpp>
#include <rein/redis/detail/sentinel_discovery.hpp>
#include <rein/redis/error.hpp>
#include <rein/redis/reply.hpp>

#include <hiredis/hiredis.h>

#include REIN_ASIO_HEADER(any_io_executor.hpp)
#include REIN_ASIO_HEADER(async_result.hpp)
#include REIN_ASIO_HEADER(execution_context.hpp)

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace rein::redis {

/// How to reach the master of a Redis Sentinel deployment. Write with designated initializers:
/// `{.sentinels = {{"10.0.0.7", 26379}, {"10.0.0.8", 26379}}, .master_name = "mymaster"}`.
struct sentinel_options {
  /// The sentinels, asked in this order at first; the one that answered last is asked first afterwards.
  /// At least one; name them all, so that a client started while some are down still finds the master.
  std::vector<endpoint> sentinels{};
  /// The name the sentinels monitor the master under (`sentinel monitor <name> ...`). Not empty.
  std::string master_name{};
  /// The options of the connection to the master: credentials, database, timeouts, reconnection backoff
  /// (see connection_options). `host` and `port` are ignored: they come from the sentinels. The default
  /// reconnect_cap is 250 ms here (1 s for a plain connection): while a failover is under way every attempt
  /// fails, and the cap bounds how long after the sentinels name the new master the next attempt waits.
  connection_options connection = [] {
    connection_options c;
    c.reconnect_cap = std::chrono::milliseconds{250};
    return c;
  }();
  /// `AUTH` to the sentinels (`requirepass` in sentinel.conf), when not empty; with `sentinel_username`
  /// for an ACL user. The master's credentials are in `connection`.
  std::string sentinel_username{};
  /// See sentinel_username.
  std::string sentinel_password{};
  /// Each question to a sentinel, and each ROLE check of a candidate master, fails after this long without
  /// an answer (the connection, then the reply, each), and the next sentinel is asked. One search for the
  /// master takes at most 4 x sentinels.size() x sentinel_timeout (question and ROLE check, each a
  /// connection and a reply); commands issued meanwhile wait for it. Must be > 0.
  std::chrono::milliseconds sentinel_timeout{250};
};

/// A Sentinel client's counters, copied under its lock.
struct sentinel_snapshot {
  bool master_known = false;          ///< a search found a master (ever)
  endpoint master{};                  ///< the master the last successful search found
  std::uint64_t discoveries = 0;      ///< searches that found a master (one before every connection attempt)
  std::uint64_t failed_discoveries = 0;  ///< searches that found none (the attempt then failed, and backs off)
  /// Failovers followed: searches that found the master at another address than the search before.
  std::uint64_t failovers = 0;
  std::uint64_t sentinel_queries = 0;   ///< GET-MASTER-ADDR-BY-NAME questions sent (or refused at once)
  std::uint64_t sentinel_failures = 0;  ///< of those, without a usable answer (down, timeout, null, error)
  std::uint64_t role_checks = 0;        ///< ROLE checks of a candidate master
  std::uint64_t role_mismatches = 0;    ///< of those, a candidate unreachable or not a master
  connection_snapshot connection{};     ///< the connection to the master
};

namespace detail {

inline sentinel_options validated(sentinel_options o) {
  const auto fail = [](const std::string& what) { throw std::invalid_argument("rein::redis::sentinel: " + what); };
  if (o.sentinels.empty()) fail("sentinels must name at least one sentinel");
  for (const endpoint& e : o.sentinels) {
    if (e.host.empty()) fail("sentinels: a host must not be empty");
    if (e.port == 0) fail("sentinels: port must be in [1, 65535], got 0 (host " + e.host + ")");
  }
  if (o.master_name.empty()) fail("master_name must not be empty");
  if (o.sentinel_timeout.count() <= 0)
    fail("sentinel_timeout must be > 0, got " + std::to_string(o.sentinel_timeout.count()) + "ms");
  if (!o.sentinel_username.empty() && o.sentinel_password.empty()) fail("sentinel_username needs a sentinel_password");
  try {
    o.connection = validated(std::move(o.connection));
  } catch (const std::invalid_argument& e) {
    const std::string_view text = e.what();
    const std::string_view prefix = "rein::redis::connection: ";
    fail("connection." + std::string(text.starts_with(prefix) ? text.substr(prefix.size()) : text));
  }
  return o;
}

// The address source of a Sentinel client's master connection: runs a sentinel_discovery per connection
// attempt over one connection per sentinel (kept open, so a sentinel that is down is passed over at once
// while its connection backs off) and a short-lived connection per ROLE check.
//
// Threads: async_address may run on any thread, and searches may overlap (an attempt abandoned by close
// while its search runs); each search owns its machine, and the shared order and counters are under mutex_.
template <class Executor>
class sentinel_source final : public address_source, public std::enable_shared_from_this<sentinel_source<Executor>> {
 public:
  using core_type = connection_core<Executor>;

  sentinel_source(const Executor& ex, const sentinel_options& o)
      : executor_(ex),
        query_(encode_command({"SENTINEL", "GET-MASTER-ADDR-BY-NAME", o.master_name})),
        role_(encode_command({"ROLE"})),
        check_options_(o.connection),
        order_(o.sentinels.size()) {
    std::iota(order_.begin(), order_.end(), std::size_t{0});
    check_options_.connect_timeout = check_options_.request_timeout = o.sentinel_timeout;
    sentinels_.reserve(o.sentinels.size());
    for (const endpoint& e : o.sentinels) {
      connection_options s;  // assigned field by field: fields added later keep their defaults
      s.host = e.host;
      s.port = e.port;
      s.username = o.sentinel_username;
      s.password = o.sentinel_password;
      s.connect_timeout = s.request_timeout = o.sentinel_timeout;
      s.reconnect_base = std::chrono::milliseconds{10};
      s.reconnect_cap = std::max(std::chrono::milliseconds{10}, o.sentinel_timeout);
      sentinels_.push_back(std::make_shared<core_type>(ex, std::move(s)));
    }
  }

  sentinel_source(const sentinel_source&) = delete;
  sentinel_source& operator=(const sentinel_source&) = delete;
  ~sentinel_source() { close(); }

  void async_address(done_type done) override {
    std::vector<std::size_t> order;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!closed_) order = order_;  // closed: an empty order, a search that fails at once
    }
    auto s = std::make_shared<search>(std::move(order), std::move(done));
    const discovery_step first = s->machine.start();
    step(std::move(s), first);
  }

  void close() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
    }
    for (const auto& c : sentinels_) c->close();
  }

  sentinel_snapshot snapshot() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

 private:
  struct search {
    search(std::vector<std::size_t> order, done_type d) : machine(std::move(order)), done(std::move(d)) {}
    sentinel_discovery machine;
    done_type done;
  };

  // Completes a GET-MASTER-ADDR-BY-NAME or a ROLE: reads the reply and takes the search's next step.
  class answer_node final : public request_node {
   public:
    answer_node(std::shared_ptr<sentinel_source> source, std::shared_ptr<search> s, std::shared_ptr<core_type> checked)
        : source_(std::move(source)), search_(std::move(s)), checked_(std::move(checked)) {}

    void complete(const error_code& ec, const ::redisReply* reply) noexcept override {
      auto source = std::move(source_);
      auto s = std::move(search_);
      auto checked = std::move(checked_);
      delete this;
      try {
        if (checked) {
          checked->close();  // one question per candidate; its connection must not reconnect on its own
          source->on_role(s, !ec && reply != nullptr && reads_as_master(*reply));
        } else {
          source->on_master_address(s, ec || reply == nullptr ? std::nullopt : parse_master_address(*reply));
        }
      } catch (...) {  // no memory to go on: the search ends, and the connection attempt fails
        source->finish(*s, errc::unavailable, {});
      }
    }

   private:
    std::shared_ptr<sentinel_source> source_;
    std::shared_ptr<search> search_;
    std::shared_ptr<core_type> checked_;  // set for a ROLE check
  };

  void on_master_address(std::shared_ptr<search> s, std::optional<endpoint> address) {
    if (!address) {
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.sentinel_failures;
    }
    const discovery_step next = s->machine.on_master_address(std::move(address));
    step(std::move(s), next);
  }

  void on_role(std::shared_ptr<search> s, bool master) {
    if (!master) {
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.role_mismatches;
    }
    const discovery_step next = s->machine.on_role(master);
    step(std::move(s), next);
  }

  // Takes steps until one waits for an answer (a request on the wire) or the search ends. A refused
  // request is answered at once, so the loop, not recursion, walks a list of sentinels that are all down.
  void step(std::shared_ptr<search> s, discovery_step next) {
    using kind = discovery_step::kind;
    for (;;) {
      switch (next.what) {
        case kind::ask_sentinel: {
          {
            std::lock_guard<std::mutex> lock(mutex_);
            ++stats_.sentinel_queries;
          }
          auto node = std::make_unique<answer_node>(this->shared_from_this(), s, nullptr);
          if (sentinels_[next.sentinel]->submit(query_, node.get())) {
            node.release();
            return;
          }
          {
            std::lock_guard<std::mutex> lock(mutex_);
            ++stats_.sentinel_failures;
          }
          next = s->machine.on_master_address(std::nullopt);
          continue;
        }
        case kind::check_role: {
          {
            std::lock_guard<std::mutex> lock(mutex_);
            ++stats_.role_checks;
          }
          connection_options o = check_options_;
          o.host = next.address.host;
          o.port = next.address.port;
          auto checked = std::make_shared<core_type>(executor_, std::move(o));
          auto node = std::make_unique<answer_node>(this->shared_from_this(), s, checked);
          if (checked->submit(role_, node.get())) {
            node.release();
            return;
          }
          checked->close();
          {
            std::lock_guard<std::mutex> lock(mutex_);
            ++stats_.role_mismatches;
          }
          next = s->machine.on_role(false);
          continue;
        }
        case kind::found:
          return finish(*s, {}, next);
        case kind::failed:
          return finish(*s, errc::unavailable, next);
      }
    }
  }

  void finish(search& s, const error_code& ec, const discovery_step& last) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (ec) {
        ++stats_.failed_discoveries;
      } else {
        ++stats_.discoveries;
        if (stats_.master_known && (stats_.master.host != last.address.host || stats_.master.port != last.address.port))
          ++stats_.failovers;
        stats_.master_known = true;
        stats_.master = last.address;
        put_first(order_, last.sentinel);
      }
    }
    done_type done = std::move(s.done);
    if (done) done(ec, last.address.host, last.address.port);
  }

  Executor executor_;
  const std::string query_;
  const std::string role_;
  connection_options check_options_;
  std::vector<std::shared_ptr<core_type>> sentinels_;

  mutable std::mutex mutex_;
  // Under mutex_:
  std::vector<std::size_t> order_;
  bool closed_ = false;
  sentinel_snapshot stats_{};
};

}  // namespace detail

/// A pipelined connection to the master of a Redis Sentinel deployment, for the Redis-backed limiters and
/// for plain commands. Every shared limiter runs over it unchanged: give it (or `connection()`) where a
/// connection is expected, e.g. `rein::redis::shared_semaphore sem(sentinel, {.key = "db", .limit = 8});`.
///
/// Finding the master, before every connection attempt (the first, and every reconnection after a lost
/// connection, a request_timeout, or a READONLY reply from a demoted master): the sentinels are asked
/// `SENTINEL GET-MASTER-ADDR-BY-NAME <master_name>` in order; a sentinel down, silent for
/// `sentinel_timeout`, or answering null is passed over; a named address is used only once `ROLE` on it
/// (a connection of its own, closed after) says master; otherwise the next sentinel is asked. The sentinel
/// that answered is asked first next time. If no sentinel names a confirmed master, the attempt fails as a
/// refused connection would: commands fail with errc::unavailable, and the next attempt (and search) comes
/// after the connection's jittered backoff. Sentinels also disconnect the clients of an instance they
/// reconfigure, so a demoted master's clients reconnect and search again.
///
/// Following a failover: after the master dies, every attempt fails until the sentinels promote a
/// replica; the first attempt after that connects to it, at most `connection.reconnect_cap` plus one search
/// and one connection later. Meanwhile commands fail at once (errc::unavailable), so the limiters apply
/// their failure policy (fail-closed or fail-open) as for any outage.
///
/// Over-admission across a failover: Redis replicates asynchronously, so the new master may lack the
/// writes the old one acknowledged in its last moments (its replication lag; on one host, well under a
/// millisecond). A shared semaphore's grants among them are held but unknown to the new master, which can
/// grant those places again: at most min(limit, grants acknowledged and not replicated) more holders than
/// the limit, until those permits are released or their leases lapse. A shared rate limiter's admissions
/// among them can be admitted again within the same window. Sentinel itself does not wait for replicas.
///
/// @par Thread Safety
/// Every member function may be called concurrently, except destruction.
///
/// @par Lifetime
/// Not copyable or movable. Destroying it closes its connections. It must outlive the limiters given its
/// connection only as a basic_connection must (they see it closed once it is gone), and be destroyed before
/// its execution context.
template <class Executor = net::any_io_executor>
class basic_sentinel {
 public:
  /// The executor that runs completion handlers without an associated executor of their own.
  using executor_type = Executor;
  /// The connection type the limiters take.
  using connection_type = basic_connection<Executor>;

  /// The Sentinel client type when rebound to another executor.
  template <class OtherExecutor>
  struct rebind_executor {
    /// The same client type on `OtherExecutor`.
    using other = basic_sentinel<OtherExecutor>;
  };

  /// A Sentinel client on `ex`; nothing happens on the network until the first command.
  /// @throws std::invalid_argument naming the type, the field and the value if an option is out of range
  /// (also one of `connection`'s, named `connection.<field>`).
  basic_sentinel(const executor_type& ex, sentinel_options options)
      : options_(detail::validated(std::move(options))),
        source_(std::make_shared<detail::sentinel_source<Executor>>(ex, options_)),
        master_(ex, options_.connection) {
    master_.core()->set_address_source(source_);
  }

  /// A Sentinel client whose handlers run on `context`'s executor by default.
  template <class ExecutionContext>
    requires std::is_convertible_v<ExecutionContext&, net::execution_context&>
  basic_sentinel(ExecutionContext& context, sentinel_options options)
      : basic_sentinel(context.get_executor(), std::move(options)) {}

  basic_sentinel(const basic_sentinel&) = delete;
  basic_sentinel& operator=(const basic_sentinel&) = delete;

  ~basic_sentinel() { close(); }

  /// The executor given at construction.
  executor_type get_executor() const noexcept { return master_.get_executor(); }

  /// The connection to the master, wherever it is now: give it to any rein::redis limiter.
  connection_type& connection() noexcept { return master_; }

  /// As connection(), so that a limiter can be built from the Sentinel client itself.
  operator connection_type&() noexcept { return master_; }  // NOLINT(google-explicit-constructor)

  /// True while the connection to the master is established and its circuit closed.
  bool connected() const noexcept { return master_.connected(); }

  /// Closes the connections to the master and to the sentinels for good; pending commands complete with
  /// operation_aborted. Idempotent.
  void close() {
    master_.close();
    source_->close();
  }

  /// The counters of the searches and of the connection to the master, copied under their locks.
  sentinel_snapshot snapshot() const {
    sentinel_snapshot s = source_->snapshot();
    s.connection = master_.snapshot();
    return s;
  }

  /// The options in force (as validated at construction).
  const sentinel_options& get_options() const noexcept { return options_; }

  /// Sends one command to the master; as basic_connection::async_execute (the same completion signature
  /// `void(error_code, rein::redis::reply)` and errors; errc::unavailable also while no sentinel names a
  /// confirmed master). A command issued while a search runs waits for it and for the connection.
  ///
  /// @par Per-Operation Cancellation
  /// None: a command on the wire cannot be taken back.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, reply)) Token = default_token_t>
  auto async_execute(std::span<const std::string_view> args, Token&& token = Token{}) {
    return master_.async_execute(args, std::forward<Token>(token));
  }

  /// As above, for a braced list of arguments.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, reply)) Token = default_token_t>
  auto async_execute(std::initializer_list<std::string_view> args, Token&& token = Token{}) {
    return master_.async_execute(args, std::forward<Token>(token));
  }

 private:
  sentinel_options options_;
  std::shared_ptr<detail::sentinel_source<Executor>> source_;
  connection_type master_;
};

/// A Sentinel client on any I/O executor.
using sentinel = basic_sentinel<>;

}  // namespace rein::redis
