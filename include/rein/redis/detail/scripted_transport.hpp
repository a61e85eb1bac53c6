// The I/O half every rein::redis limiter decided by a Lua script shares: reading a script's reply as a
// verdict, the transport that moves a scripted_admission's messages to a connection and its replies back,
// and the I/O object's doors (constructors, the acquire functions, close). Each limiter brings its script
// and how its messages become commands (a Commands type). Not API.
#pragma once

#include <rein/config.hpp>
#include <rein/detail/acquire_doors.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/detail/clock_time.hpp>
#include <rein/detail/limiter_core.hpp>
#include <rein/detail/remote_admission.hpp>
#include <rein/error.hpp>
#include <rein/redis/cluster.hpp>
#include <rein/redis/connection.hpp>
#include <rein/redis/detail/scripted_admission.hpp>
#include <rein/redis/detail/sha1.hpp>
#include <rein/redis/error.hpp>
#include <rein/redis/reply.hpp>
#include <rein/try_result.hpp>
#include <rein/wait_stats.hpp>

#include <hiredis/hiredis.h>

#include REIN_ASIO_HEADER(any_io_executor.hpp)
#include REIN_ASIO_HEADER(async_result.hpp)
#include REIN_ASIO_HEADER(awaitable.hpp)
#include REIN_ASIO_HEADER(execution_context.hpp)
#include REIN_ASIO_HEADER(use_awaitable.hpp)

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace rein::redis::detail {

inline bool starts_with_any(std::string_view text, std::initializer_list<std::string_view> prefixes) {
  return std::any_of(prefixes.begin(), prefixes.end(), [&](std::string_view p) { return text.starts_with(p); });
}

/// What a reply to a limiter's script says: every script answers integers {allowed (1/0; -1: the caller's
/// lease is lost), retry_after (microseconds), available (the model's number), [the model's own numbers,]
/// the server's TIME (microseconds since the Unix epoch)}; the bucket's own numbers are the units granted
/// and, when a rate is stored for the fleet, that rate (nanoseconds per token) and capacity.
inline verdict read_verdict(const error_code& ec, const ::redisReply* r) {
  using kind = verdict::kind;
  if (ec || r == nullptr) return {kind::unavailable, 0, 0, {}, 0};
  if (r->type == REDIS_REPLY_ERROR) {
    std::string text = r->str != nullptr ? std::string(r->str, r->len) : std::string();
    if (text.starts_with("NOSCRIPT")) return {kind::no_script, 0, 0, std::move(text), 0};
    // The server is up but cannot serve now: an outage for our purposes, not a bug.
    if (starts_with_any(text, {"LOADING", "BUSY", "MASTERDOWN", "READONLY", "TRYAGAIN", "CLUSTERDOWN", "OOM"}))
      return {kind::unavailable, 0, 0, std::move(text), 0};
    return {kind::server_error, 0, 0, std::move(text), 0};
  }
  const bool shaped = r->type == REDIS_REPLY_ARRAY && (r->elements == 4 || r->elements == 5 || r->elements == 7) &&
                      std::all_of(r->element, r->element + r->elements,
                                  [](const ::redisReply* e) { return e->type == REDIS_REPLY_INTEGER; });
  if (!shaped) return {kind::server_error, 0, 0, "rein: unexpected reply to a limiter's script", 0};
  const long long first = r->element[0]->integer;
  const kind what = first == 1 ? kind::allowed : first == -1 ? kind::lost : kind::denied;
  const std::size_t time_at = r->elements - 1;  // the model's own numbers lie between available and the time
  const auto number = [&](std::size_t i) {
    return i < time_at ? static_cast<std::int64_t>(r->element[i]->integer) : std::int64_t{0};
  };
  return {what,      static_cast<double>(r->element[1]->integer), static_cast<double>(r->element[2]->integer), {},
          number(3), number(4), number(5), static_cast<std::int64_t>(r->element[time_at]->integer)};
}

/// A scripted admission on rein's wait line: the line owns waiting (queue, deadlines, one timer,
/// cancellation, completions); the policy decides; the transport below is the only I/O. A rate rule's
/// grants complete with an error code only; a shared semaphore's are permits (`void(error_code, permit)`).
template <class Policy, class Executor, class Clock, class Mutex, class Signature = void(rein::error_code)>
using scripted_line = rein::detail::limiter_core<Policy, Executor, Clock, Mutex, Signature>;

/// Moves a scripted policy's messages to Redis and its replies back as verdicts. Owned by the line; each
/// request on the wire holds the line alive (so a reply arriving after the limiter is destroyed still
/// settles, and a late grant is refunded).
///
/// Commands (one per limiter): `static constexpr std::string_view script`, constructed from the options,
/// and `std::string command(const message&, std::string_view sha)` for admissions, refunds and pauses.
template <class Policy, class Commands, class Executor, class Clock, class Mutex, class Signature>
class scripted_transport final : public rein::detail::remote_transport<message_list> {
 public:
  using line_type = scripted_line<Policy, Executor, Clock, Mutex, Signature>;
  using connection_type = command_link;

  scripted_transport(std::weak_ptr<line_type> line, std::shared_ptr<connection_type> connection,
                     const typename Policy::options_type& o)
      : line_(std::move(line)),
        connection_(std::move(connection)),
        commands_(o),
        sha_(sha1_hex(Commands::script)),
        load_command_(encode_command({"SCRIPT", "LOAD", Commands::script})),
        take_one_command_(commands_.command(message{message::kind::admission, 0, 1, 0, 1}, sha_)) {
    // "SCRIPT LOAD once": on this and every later connection, before any EVALSHA.
    connection_->add_startup_command(load_command_);
  }

  const std::shared_ptr<connection_type>& connection() const noexcept { return connection_; }

  /// Sends a command that is no admission (a stored setting), not awaited: an error reply is counted as a
  /// server error. False if the connection refused it (down or closed).
  bool send_side(std::string command) {
    const std::shared_ptr<line_type> line = line_.lock();
    if (!line) return false;
    return hand_over(command, std::make_unique<side_node>(line, message{}, false));
  }

  // An admission the connection refuses (down, backing off, closed) is settled as unavailable at once. That
  // degrades the limiter until the connection says it is up again, so the settle queues no admission; what
  // it queues, the line's sender (limiter_core::send_pending, which called this) sends next.
  void transmit(message_list& sends) noexcept override {
    const std::shared_ptr<line_type> line = line_.lock();
    if (!line) return;
    message_list refused;
    for (std::size_t i = 0; i < sends.size(); ++i) {
      bool ok = false;
      try {
        ok = submit(line, sends[i]);
      } catch (...) {  // no memory for the request: as if refused
      }
      if (!ok && sends[i].what == message::kind::admission) {
        try {
          refused.push(sends[i]);
        } catch (...) {  // not reached: four refusals fit without allocating, and a fifth is rarer still
        }
      }
    }
    sends.clear();
    for (std::size_t i = 0; i < refused.size(); ++i) settle(*line, refused[i].ticket, verdict{});
  }

 private:
  static void settle(line_type& line, std::uint64_t ticket, const verdict& v) noexcept {
    try {
      line.settle(ticket, v);
    } catch (...) {  // no memory to complete it now: the op keeps waiting, until its deadline or cancellation
    }
  }

  class admission_node final : public request_node {
   public:
    admission_node(std::shared_ptr<line_type> line, std::uint64_t ticket) noexcept
        : line_(std::move(line)), ticket_(ticket) {}
    void complete(const error_code& ec, const ::redisReply* reply) noexcept override {
      const std::shared_ptr<line_type> line = std::move(line_);
      const std::uint64_t ticket = ticket_;
      delete this;
      try {
        settle(*line, ticket, read_verdict(ec, reply));
      } catch (...) {  // no memory for the error text: settle as a request without reply
        settle(*line, ticket, verdict{});
      }
    }

   private:
    std::shared_ptr<line_type> line_;
    std::uint64_t ticket_;
  };

  // Refunds, pauses and script loads: fire and forget; error replies go back to the policy, which counts
  // them and sends again one that the server could not run for want of its script.
  class side_node final : public request_node {
   public:
    // `resendable`: `m` is the request (a refund, a pause), sent again after NOSCRIPT; a stored setting's
    // plain command is not one of ours to resend.
    side_node(std::shared_ptr<line_type> line, const message& m, bool resendable = true) noexcept
        : line_(std::move(line)), m_(m), resendable_(resendable) {}
    void complete(const error_code& ec, const ::redisReply* reply) noexcept override {
      const std::shared_ptr<line_type> line = std::move(line_);
      const message m = m_;
      const bool ok = ec || (reply != nullptr && reply->type != REDIS_REPLY_ERROR);  // a lost one is no error
      const bool no_script = !ok && resendable_ && reply != nullptr && reply->str != nullptr &&
                             std::string_view(reply->str, reply->len).starts_with("NOSCRIPT");
      delete this;
      if (ok) return;
      try {
        line->update([&](Policy& p, typename Clock::time_point) { p.on_side_error(m, no_script); });
      } catch (...) {
      }
    }

   private:
    std::shared_ptr<line_type> line_;
    message m_;
    bool resendable_;
  };

  // A lease renewal: its answer may say the lease was lost, or how long the lease surely holds (from
  // `sent`, taken before the connection had the command: no later than Redis read it).
  class renewal_node final : public request_node {
   public:
    renewal_node(std::shared_ptr<line_type> line, std::int64_t tag, typename Clock::time_point sent) noexcept
        : line_(std::move(line)), tag_(tag), sent_(sent) {}
    void complete(const error_code& ec, const ::redisReply* reply) noexcept override {
      const std::shared_ptr<line_type> line = std::move(line_);
      const std::int64_t tag = tag_;
      const typename Clock::time_point sent = sent_;
      delete this;
      try {
        const verdict v = read_verdict(ec, reply);
        line->update([&](Policy& p, typename Clock::time_point now) { p.on_renewed(tag, v, sent, now); });
      } catch (...) {  // no memory: the next renewal asks again
      }
    }

   private:
    std::shared_ptr<line_type> line_;
    std::int64_t tag_;
    typename Clock::time_point sent_;
  };

  // Hands one request to the connection. False: the connection refused it (down or closed).
  bool submit(const std::shared_ptr<line_type>& line, const message& m) {
    if (m.what == message::kind::admission) {
      auto node = std::make_unique<admission_node>(line, m.ticket);
      // Made once, at construction: one unit, no tag, wanting no more (0 and 1 read alike: at least n).
      if (m.n == 1 && m.extra == 0 && m.wanted <= 1) return hand_over(take_one_command_, std::move(node));
      return hand_over(commands_.command(m, sha_), std::move(node));
    }
    if (m.what == message::kind::renew)
      return hand_over(commands_.command(m, sha_), std::make_unique<renewal_node>(line, m.extra, Clock::now()));
    if (m.what == message::kind::script_load) return hand_over(load_command_, std::make_unique<side_node>(line, m));
    return hand_over(commands_.command(m, sha_), std::make_unique<side_node>(line, m));
  }

  // The node is the connection's once it took the command; until then (refused, or an exception) ours.
  template <class Node>
  bool hand_over(const std::string& command, std::unique_ptr<Node> node) {
    if (!connection_->submit(command, node.get())) return false;
    node.release();
    return true;
  }

  std::weak_ptr<line_type> line_;
  const std::shared_ptr<connection_type> connection_;
  const Commands commands_;
  const std::string sha_;
  const std::string load_command_;
  const std::string take_one_command_;
};

/// The doors every scripted limiter shares: its connection (shared or owned), the line and its transport,
/// the acquire functions, try_acquire, close and the connection's counters. The public limiters derive
/// from it and document these members in their own class comment. `Signature` is the completion signature
/// of an acquire: `void(error_code)` for the rate rules, `void(error_code, rein::permit)` for a semaphore.
template <class Policy, class Commands, class Executor, class Clock, class Mutex, class Signature = void(error_code)>
class basic_scripted_limiter {
 protected:
  using line_type = scripted_line<Policy, Executor, Clock, Mutex, Signature>;
  using transport_type = scripted_transport<Policy, Commands, Executor, Clock, Mutex, Signature>;
  using options_type = typename Policy::options_type;
  using doors_type = rein::detail::line_doors<line_type>;

 public:
  /// The executor that runs completion handlers without an associated executor of their own.
  using executor_type = Executor;
  /// The clock that times the deadlines and local waiting.
  using clock_type = Clock;
  /// A point in time of `clock_type`.
  using time_point = typename Clock::time_point;
  /// A duration of `clock_type`.
  using duration = typename Clock::duration;
  /// The connection type it shares or owns.
  using connection_type = basic_connection<Executor>;
  /// The Redis Cluster client type it can share.
  using cluster_type = basic_cluster<Executor>;

  /// A limiter on an existing connection (shared with other limiters and users).
  /// @throws std::invalid_argument naming the type, field and value if an option is out of range.
  basic_scripted_limiter(connection_type& shared, options_type options, line_options line = {})
      : options_(Policy::model_type::validated(std::move(options))),
        line_(make_line(shared.get_executor(), shared.core(), options_, std::move(line))) {}

  /// A limiter on a Redis Cluster: its commands go to the node that serves its keys' hash slot.
  basic_scripted_limiter(cluster_type& nodes, options_type options, line_options line = {})
      : options_(Policy::model_type::validated(std::move(options))),
        line_(make_line(nodes.get_executor(), nodes.core()->route(Commands(options_).routing_key()), options_,
                        std::move(line))) {}

  /// A limiter with a connection of its own, closed when the limiter is destroyed.
  basic_scripted_limiter(const executor_type& ex, connection_options redis, options_type options,
                         line_options line = {})
      : options_(Policy::model_type::validated(std::move(options))),
        owned_(std::make_shared<typename connection_type::core_type>(ex, std::move(redis))),
        line_(make_line(ex, owned_, options_, std::move(line))) {}

  /// A limiter with a connection of its own on `context`'s executor.
  template <class ExecutionContext>
    requires std::is_convertible_v<ExecutionContext&, net::execution_context&>
  basic_scripted_limiter(ExecutionContext& context, connection_options redis, options_type options,
                         line_options line = {})
      : basic_scripted_limiter(context.get_executor(), std::move(redis), std::move(options), std::move(line)) {}

  basic_scripted_limiter(const basic_scripted_limiter&) = delete;
  basic_scripted_limiter& operator=(const basic_scripted_limiter&) = delete;

  /// Completes every waiter with `operation_aborted`; closes the connection if it is the limiter's own.
  ~basic_scripted_limiter() {
    try {
      line_->update([](Policy& p, time_point) { p.release_unspent(); });  // a batch's rest goes back
    } catch (...) {  // best effort, as every refund
    }
    line_->shutdown();
    if (owned_) owned_->close();
  }

  /// The executor given at construction.
  executor_type get_executor() const noexcept { return line_->get_executor(); }

  /// The rule it takes.
  using rule_type = options_type;

  /// The rule in force (as validated at construction).
  const options_type& get_options() const noexcept { return options_; }

  /// The name given in the options (empty if none): in events, metrics (the collector's default
  /// registration name) and the errors the coroutine doors throw.
  const std::string& name() const noexcept { return line_->name(); }

  /// Always false (try_status::busy, no retry hint), taking nothing: whether Redis admits needs a round
  /// trip, which a function that never waits cannot make (and a local guess would break the fleet-wide
  /// bound). It exists so that generic code written against rein's rate limiters compiles and takes its
  /// waiting path (e.g. rein::throttle's). Use async_acquire_until with a deadline for "at most this long".
  typename doors_type::try_type try_acquire(std::size_t = 1) const noexcept {
    return typename doors_type::try_type(try_status::busy);
  }

  /// Waits for admission of n units. The initiating function; every Asio completion token works.
  ///
  /// @param n     units wanted. 0 is granted without asking Redis: at once unless another caller waits its
  ///              turn ahead of it (FIFO, as in every rein limiter).
  /// @param token completion token; signature `void(error_code)` (a shared semaphore: `void(error_code,
  ///              rein::permit)`). Default: `deferred`.
  ///
  /// Errors: rein::errc::exceeds_capacity (n can never be admitted, at once), rein::errc::queue_full
  /// (max_waiters reached, when it would have to wait), rein::errc::closed, errc::unavailable (Redis cannot
  /// be asked and on_failure is fail_closed), errc::server_error (an error reply, e.g. WRONGTYPE),
  /// `operation_aborted` (cancelled, or the limiter was destroyed). The handler is never invoked from inside
  /// this function.
  ///
  /// @par Per-Operation Cancellation
  /// terminal, partial and total: the operation completes at once with operation_aborted. If its request
  /// is on the wire and Redis grants it, the grant is given back with a refund request (best effort: lost
  /// if the connection fails first).
  template <REIN_COMPLETION_TOKEN_FOR(Signature) Token = default_token_t>
  auto async_acquire(std::size_t n = 1, Token&& token = Token{}) {
    return doors().async_acquire_until(n, time_point::max(), std::forward<Token>(token));
  }

  /// As async_acquire, failing with rein::errc::timed_out if not granted within `timeout` (a timeout too
  /// long to represent, such as duration::max(), means none).
  template <REIN_COMPLETION_TOKEN_FOR(Signature) Token = default_token_t>
  auto async_acquire_for(std::size_t n, duration timeout, Token&& token = Token{}) {
    return doors().async_acquire_for(n, timeout, std::forward<Token>(token));
  }

  /// As async_acquire, failing with rein::errc::timed_out if not granted by `deadline` (time_point::max():
  /// never), also when the request is on the wire at that moment. A deadline already past fails at once,
  /// and so does one before the end of a hold Redis announced (a denial's retry-after).
  template <REIN_COMPLETION_TOKEN_FOR(Signature) Token = default_token_t>
  auto async_acquire_until(std::size_t n, time_point deadline, Token&& token = Token{}) {
    return doors().async_acquire_until(n, deadline, std::forward<Token>(token));
  }

  /// Waits inside a coroutine: `co_await limiter.acquire();`. Always one round trip at least (there is no
  /// synchronous fast path). Throws rein::system_error with async_acquire's errors.
  net::awaitable<typename doors_type::result_type> acquire(std::size_t n = 1) {
    return doors().acquire_until(n, time_point::max());
  }

  /// As acquire, throwing rein::errc::timed_out if not granted within `timeout`.
  net::awaitable<typename doors_type::result_type> acquire_for(std::size_t n, duration timeout) {
    return doors().acquire_for(n, timeout);
  }

  /// As acquire, throwing rein::errc::timed_out if not granted by `deadline`.
  net::awaitable<typename doors_type::result_type> acquire_until(std::size_t n, time_point deadline) {
    return doors().acquire_until(n, deadline);
  }

  /// Completes every waiter with rein::errc::closed; later acquires fail the same way. The limiter's own
  /// connection is closed too (so `io_context::run()` can return); a shared one stays open.
  void close() {
    line_->close();
    if (owned_) owned_->close();
  }

  /// The counters of the connection this limiter uses.
  rein::redis::connection_snapshot connection_snapshot() const { return transport_->connection()->snapshot(); }

 protected:
  /// Sends a command of a stored setting (see scripted_transport::send_side). False if it could not be sent.
  bool send_setting(std::initializer_list<std::string_view> args) { return transport_->send_side(encode_command(args)); }

 public:

 protected:
  /// The policy's snapshot with the line's statistics and the connection's state.
  typename Policy::snapshot_type scripted_snapshot() const {
    const bool up = transport_->connection()->connected();
    auto s = line_->inspect([](const Policy& p, const wait_stats& line) {
      auto mine = p.snapshot(Clock::now());
      static_cast<wait_stats&>(mine) = line;
      return mine;
    });
    s.connected = up;
    return s;
  }

  line_type& line() const noexcept { return *line_; }

 private:
  std::shared_ptr<line_type> make_line(const Executor& ex, std::shared_ptr<command_link> link,
                                       const options_type& o, line_options options) {
    auto up = [c = link] { return c->connected(); };
    auto line = std::make_shared<line_type>(ex, line_options_of(Policy::type_name, std::move(options)), o,
                                            std::move(up), Clock::now());
    transport_ = std::make_shared<transport_type>(line, std::move(link), o);
    line->set_transport(transport_);
    return line;
  }

  // Every door is written once, in rein/detail/acquire_doors.hpp (a remote line has no synchronous try).
  doors_type doors() const noexcept { return {line_.get(), Policy::type_name}; }

  options_type options_;
  std::shared_ptr<typename connection_type::core_type> owned_;
  std::shared_ptr<transport_type> transport_;  // also held by the line (it outlives the limiter while requests fly)
  std::shared_ptr<line_type> line_;
};

}  // namespace rein::redis::detail
