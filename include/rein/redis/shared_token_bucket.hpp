// One token bucket shared by many processes and machines: its state lives in Redis, updated by a Lua script.
#pragma once

#include <rein/config.hpp>
#include <rein/detail/acquire_doors.hpp>
#include <rein/detail/limiter_core.hpp>
#include <rein/detail/remote_admission.hpp>
#include <rein/error.hpp>
#include <rein/redis/connection.hpp>
#include <rein/redis/detail/bucket_admission.hpp>
#include <rein/redis/detail/sha1.hpp>
#include <rein/redis/error.hpp>
#include <rein/redis/reply.hpp>
#include <rein/try_result.hpp>
#include <rein/wait_stats.hpp>

#include <hiredis/hiredis.h>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/any_io_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/execution_context.hpp>
#include <asio/use_awaitable.hpp>
#else
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/execution_context.hpp>
#include <boost/asio/use_awaitable.hpp>
#endif

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace rein::redis {

namespace detail {

/// The Lua script. One hash per quota: `at`, the server time of the last change (microseconds), and `debt`,
/// how far the bucket is below full, in microseconds of refill. This is GCRA (ITU-T I.371, the "virtual
/// scheduling" form: debt = TAT - now) written as a token bucket: tokens = (capacity * interval - debt) /
/// interval. A request for n is allowed when debt + n * interval <= capacity * interval. Only the server's
/// clock (TIME) is read, so clients' clock skew does not matter; Redis >= 5 replicates a script's effects
/// rather than the script, which is what makes TIME allowed (redis.replicate_commands for 3.2 and 4).
/// A negative n gives tokens back (never above full). The key expires when the bucket would be full again,
/// so idle quotas cost no memory.
///
/// ARGV: interval (microseconds per token), capacity (tokens), n. Returns {allowed (1/0), retry_after
/// (microseconds until n would be allowed; 0 if allowed), available (microseconds of refill in the bucket
/// after the decision: tokens * interval)}.
inline constexpr std::string_view token_bucket_script = R"lua(
if redis.replicate_commands then redis.replicate_commands() end
local interval = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local limit = capacity * interval
local debt = 0
local state = redis.call('HMGET', KEYS[1], 'at', 'debt')
if state[1] and state[2] then
  debt = tonumber(state[2]) - math.max(0, now - tonumber(state[1]))
  if debt < 0 then debt = 0 end
end
local after = debt + n * interval
if n > 0 and after > limit then
  return {0, math.ceil(after - limit), math.floor(limit - debt)}
end
if after <= 0 then
  redis.call('DEL', KEYS[1])
  return {1, 0, math.floor(limit)}
end
redis.call('HSET', KEYS[1], 'at', now, 'debt', after)
redis.call('PEXPIRE', KEYS[1], math.ceil(after / 1000) + 1)
return {1, 0, math.floor(limit - after)}
)lua";

/// What a reply to the script says, as the admission rule reads it.
inline bool starts_with_any(std::string_view text, std::initializer_list<std::string_view> prefixes) {
  return std::any_of(prefixes.begin(), prefixes.end(), [&](std::string_view p) { return text.starts_with(p); });
}

inline verdict read_verdict(const error_code& ec, const ::redisReply* r) {
  using kind = verdict::kind;
  if (ec || r == nullptr) return {kind::unavailable, 0, 0, {}};
  if (r->type == REDIS_REPLY_ERROR) {
    std::string text = r->str != nullptr ? std::string(r->str, r->len) : std::string();
    if (text.starts_with("NOSCRIPT")) return {kind::no_script, 0, 0, std::move(text)};
    // The server is up but cannot serve now: an outage for our purposes, not a bug.
    if (starts_with_any(text, {"LOADING", "BUSY", "MASTERDOWN", "READONLY", "TRYAGAIN", "CLUSTERDOWN", "OOM"}))
      return {kind::unavailable, 0, 0, std::move(text)};
    return {kind::server_error, 0, 0, std::move(text)};
  }
  const bool shaped = r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
                      std::all_of(r->element, r->element + 3, [](const ::redisReply* e) { return e->type == REDIS_REPLY_INTEGER; });
  if (!shaped) return {kind::server_error, 0, 0, "rein: unexpected reply to the token bucket script"};
  return {r->element[0]->integer == 1 ? kind::allowed : kind::denied, static_cast<double>(r->element[1]->integer),
          static_cast<double>(r->element[2]->integer), {}};
}


// The bucket's admission rule on rein's wait line: the line owns waiting (queue, deadlines, one timer,
// cancellation, completions); bucket_admission decides; the transport below is the only I/O.
template <class Executor, class Mutex, class Clock>
using bucket_line = rein::detail::limiter_core<bucket_admission<Clock>, Executor, Clock, Mutex, void(error_code)>;

// Moves a bucket's messages to Redis and its replies back as verdicts. Owned by the line; each request on
// the wire holds the line alive (so a reply arriving after the limiter is destroyed still settles, and a
// late grant is refunded).
template <class Executor, class Mutex, class Clock>
class bucket_transport final : public rein::detail::remote_transport<message_list> {
 public:
  using line_type = bucket_line<Executor, Mutex, Clock>;
  using connection_type = connection_core<Executor>;

  bucket_transport(std::weak_ptr<line_type> line, std::shared_ptr<connection_type> connection,
                   const shared_token_bucket_options& o, double interval_us)
      : line_(std::move(line)),
        connection_(std::move(connection)),
        key_(o.key),
        interval_(format_number(interval_us)),
        capacity_(std::to_string(o.capacity)),
        sha_(sha1_hex(token_bucket_script)),
        load_command_(encode_command({"SCRIPT", "LOAD", token_bucket_script})),
        take_one_command_(eval_command(1)) {
    // "SCRIPT LOAD once": on this and every later connection, before any EVALSHA.
    connection_->add_startup_command(load_command_);
  }

  const std::shared_ptr<connection_type>& connection() const noexcept { return connection_; }

  // An admission the connection refuses (down, backing off, closed) is settled as unavailable at once. That
  // degrades the bucket until the connection says it is up again, so the settle sends no admission and
  // this recursion ends at the next level.
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

  // Refunds and script loads: fire and forget; only error replies are counted.
  class side_node final : public request_node {
   public:
    explicit side_node(std::shared_ptr<line_type> line) noexcept : line_(std::move(line)) {}
    void complete(const error_code& ec, const ::redisReply* reply) noexcept override {
      const std::shared_ptr<line_type> line = std::move(line_);
      const bool ok = ec || (reply != nullptr && reply->type != REDIS_REPLY_ERROR);  // a lost one is no error
      delete this;
      if (ok) return;
      try {
        line->update([](bucket_admission<Clock>& p, typename Clock::time_point) { p.on_side_error(); });
      } catch (...) {
      }
    }

   private:
    std::shared_ptr<line_type> line_;
  };

  std::string eval_command(std::int64_t n) const {
    return encode_command({"EVALSHA", sha_, "1", key_, interval_, capacity_, std::to_string(n)});
  }

  // Hands one request to the connection. False: the connection refused it (down or closed).
  bool submit(const std::shared_ptr<line_type>& line, const message& m) {
    if (m.what == message::kind::admission) {
      auto* node = new admission_node(line, m.ticket);
      const bool ok = m.n == 1 ? connection_->submit(take_one_command_, node) : connection_->submit(eval_command(m.n), node);
      if (!ok) delete node;
      return ok;
    }
    auto* node = new side_node(line);
    const bool ok = m.what == message::kind::refund ? connection_->submit(eval_command(-m.n), node)
                                                   : connection_->submit(load_command_, node);
    if (!ok) delete node;
    return ok;
  }

  static std::string format_number(double v) {
    std::array<char, 32> buffer{};
    const auto result = std::to_chars(buffer.data(), buffer.data() + buffer.size(), v);  // shortest round trip
    return std::string(buffer.data(), result.ptr);
  }

  std::weak_ptr<line_type> line_;
  const std::shared_ptr<connection_type> connection_;
  const std::string key_;
  const std::string interval_;
  const std::string capacity_;
  const std::string sha_;
  const std::string load_command_;
  const std::string take_one_command_;
};

}  // namespace detail

/// A token bucket shared by every process that names the same Redis key: one quota for a whole fleet.
///
/// `co_await bucket.acquire(n)` inside `net::awaitable<>` returns once n tokens were taken from the shared
/// bucket. Each admission is one round trip: an EVALSHA of a Lua script that refills and takes atomically
/// on the server, by the server's clock (see detail::token_bucket_script: GCRA in token-bucket form, state in
/// one hash per quota, loaded with SCRIPT LOAD on every connection and reloaded on NOSCRIPT). Requests from
/// all the coroutines using a limiter are pipelined on one connection (up to `max_in_flight`), and several
/// limiters can share one connection.
///
/// Waiting is local: a denied caller waits in this process, FIFO with head-of-line blocking, for the
/// retry-after the script returned, on the same wait line as every rein limiter (one timer, deadlines,
/// cancellation, completions); then the head asks again. Every reply also
/// says what is left in the bucket, so the next caller is held until the refill rather than sent to be
/// refused, and no more requests are put on the wire than the bucket is believed to hold tokens (at least
/// one). A fleet thus sends about one request per admission plus one per denial, never a stream of polls.
/// The bucket admits at most `capacity + rate * t` in any interval of length t, fleet-wide. Order holds
/// within a process; between processes, whoever asks first after a refill gets the token (no fairness
/// between processes is promised).
///
/// Rule from: the token bucket kept in Redis by a Lua script, GCRA as in ITU-T I.371 and redis-cell; the
/// waiter discipline is that of every rein limiter (FIFO, one timer). The admission rule itself
/// (detail::bucket_admission) does no I/O: it says what to send and reads the verdicts, as boostorg/redis
/// keeps its state machines apart from the socket; the only I/O is the connection.
///
/// Failures (see failure_policy): while Redis cannot be asked, `fail_closed` completes waiting and new
/// acquires with errc::unavailable and admits nothing; `fail_open` admits from a local bucket with
/// `fail_open_share` of the quota. The connection reconnects by itself (with backoff); admissions go back to
/// Redis once it is connected and `recheck_interval` has passed. No operation waits on Redis longer than
/// the connection's `request_timeout`, and none past its own deadline.
///
/// Differences from rein::token_bucket: `try_acquire` always refuses, since an answer needs a round trip
/// (it exists for generic code; use `async_acquire_until` with a deadline); a deadline that cannot be met
/// is found out only when it passes, not predicted; `set_rate` does not exist (every process passes its own
/// rate: change the options everywhere). Otherwise it is used like any rein rate limiter (same acquire
/// functions and completion signature `void(error_code)`), including inside rein::throttle.
///
/// @tparam Executor the I/O executor; completions default to it. With a shared connection, the connection's.
/// @tparam Mutex    std::mutex (default), or rein::null_mutex when everything runs on one thread.
/// @tparam Clock    the clock of deadlines and local waiting (std::chrono::steady_clock). Redis's clock
///                  decides the rate.
///
/// @par Thread Safety
/// With std::mutex, every member function may be called concurrently, except destruction.
///
/// @par Lifetime
/// Not copyable or movable. Destroying it completes every waiter with `operation_aborted`, also one whose
/// grant was made but whose handler had not run yet; tokens Redis grants to requests still on the wire, and
/// those of such grants, are refunded if the connection is still up. While operations wait, the limiter
/// keeps its executor's `run()` from returning, as any pending Asio operation does. A connection passed in
/// must outlive the limiter or the limiter sees Redis as unavailable.
template <class Executor = net::any_io_executor, class Mutex = std::mutex, class Clock = std::chrono::steady_clock>
class basic_shared_token_bucket {
  using line_type = detail::bucket_line<Executor, Mutex, Clock>;
  using transport_type = detail::bucket_transport<Executor, Mutex, Clock>;

 public:
  /// The executor that runs completion handlers without an associated executor of their own.
  using executor_type = Executor;
  /// The clock that times the rule and the deadlines.
  using clock_type = Clock;
  /// A point in time of `clock_type`.
  using time_point = typename Clock::time_point;
  /// A duration of `clock_type`.
  using duration = typename Clock::duration;
  /// The connection type it shares or owns.
  using connection_type = basic_connection<Executor>;

  /// The same limiter type on another executor (Asio's convention).
  template <class OtherExecutor>
  struct rebind_executor {
    /// The same limiter type on `OtherExecutor`.
    using other = basic_shared_token_bucket<OtherExecutor, Mutex, Clock>;
  };

  /// A limiter on an existing connection (shared with other limiters and users).
  /// @throws std::invalid_argument naming the field and value if an option is out of range.
  basic_shared_token_bucket(connection_type& shared, shared_token_bucket_options options)
      : options_(detail::validated(std::move(options))), line_(make_line(shared.get_executor(), shared.core(), options_)) {}

  /// A limiter with a connection of its own, closed when the limiter is destroyed.
  basic_shared_token_bucket(const executor_type& ex, connection_options redis, shared_token_bucket_options options)
      : options_(detail::validated(std::move(options))),
        owned_(std::make_shared<typename connection_type::core_type>(ex, std::move(redis))),
        line_(make_line(ex, owned_, options_)) {}

  /// A limiter with a connection of its own on `context`'s executor.
  template <class ExecutionContext>
    requires std::is_convertible_v<ExecutionContext&, net::execution_context&>
  basic_shared_token_bucket(ExecutionContext& context, connection_options redis, shared_token_bucket_options options)
      : basic_shared_token_bucket(context.get_executor(), std::move(redis), std::move(options)) {}

  basic_shared_token_bucket(const basic_shared_token_bucket&) = delete;
  basic_shared_token_bucket& operator=(const basic_shared_token_bucket&) = delete;

  /// Completes every waiter with `operation_aborted`; closes the connection if it is the limiter's own.
  ~basic_shared_token_bucket() {
    line_->shutdown();
    if (owned_) owned_->close();
  }

  /// The executor given at construction.
  executor_type get_executor() const noexcept { return line_->get_executor(); }

  /// The options in force (as validated at construction).
  const shared_token_bucket_options& options() const noexcept { return options_; }

  /// Always false (try_status::busy, no retry hint), taking nothing: whether Redis admits needs a round
  /// trip, which a function that never waits cannot make (and a local guess would break the fleet-wide
  /// bound). It exists so that generic code written against rein's rate limiters compiles and takes its
  /// waiting path, e.g. rein::throttle's
  /// `if (!rate.try_acquire(1)) co_await rate.async_acquire_until(1, deadline, ...)`; a throttle's own
  /// try_acquire therefore refuses at a Redis rate stage. Use async_acquire_until with a deadline for
  /// "at most this long".
  try_result try_acquire(std::size_t = 1) const noexcept { return try_result(try_status::busy); }

  /// Waits for n tokens from the shared bucket. The initiating function; every Asio completion token works.
  ///
  /// @param n     tokens wanted, at most the capacity. 0 is granted without asking Redis: at once
  ///              unless another caller waits its turn ahead of it (FIFO, as in every rein limiter).
  /// @param token completion token; signature `void(error_code)`. Default: `deferred`.
  ///
  /// Errors: rein::errc::exceeds_capacity (n above the capacity, at once), rein::errc::queue_full
  /// (max_waiters reached, when it would have to wait), rein::errc::closed, errc::unavailable (Redis cannot
  /// be asked and on_failure is fail_closed; with fail_open, when n exceeds the local bucket's capacity),
  /// errc::server_error (an error reply, e.g. WRONGTYPE), `operation_aborted` (cancelled, or the limiter was
  /// destroyed). The handler is never invoked from inside this function.
  ///
  /// @par Per-Operation Cancellation
  /// terminal, partial and total: the operation completes at once with operation_aborted. If its request
  /// is on the wire and Redis grants it, the tokens are given back with a refund request (best effort: lost
  /// if the connection fails first).
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code)) Token = default_token_t>
  auto async_acquire(std::size_t n = 1, Token&& token = Token{}) {
    return doors().async_acquire_until(n, time_point::max(), std::forward<Token>(token));
  }

  /// As async_acquire, failing with rein::errc::timed_out if not granted within `timeout` (a timeout too
  /// long to represent, such as duration::max(), means none).
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code)) Token = default_token_t>
  auto async_acquire_for(std::size_t n, duration timeout, Token&& token = Token{}) {
    return doors().async_acquire_for(n, timeout, std::forward<Token>(token));
  }

  /// As async_acquire, failing with rein::errc::timed_out if not granted by `deadline` (time_point::max():
  /// never), also when the request is on the wire at that moment. A deadline already past fails at once.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code)) Token = default_token_t>
  auto async_acquire_until(std::size_t n, time_point deadline, Token&& token = Token{}) {
    return doors().async_acquire_until(n, deadline, std::forward<Token>(token));
  }

  /// Waits for n tokens inside a coroutine: `co_await bucket.acquire();`. Always one round trip at least
  /// (there is no synchronous fast path). Throws rein::system_error with async_acquire's errors.
  net::awaitable<void> acquire(std::size_t n = 1) { return doors().acquire_until(n, time_point::max()); }

  /// As acquire, throwing rein::errc::timed_out if not granted within `timeout` (a timeout too long to
  /// represent, such as duration::max(), means none).
  net::awaitable<void> acquire_for(std::size_t n, duration timeout) { return doors().acquire_for(n, timeout); }

  /// As acquire, throwing rein::errc::timed_out if not granted by `deadline`.
  net::awaitable<void> acquire_until(std::size_t n, time_point deadline) { return doors().acquire_until(n, deadline); }

  /// Gives n tokens back to the shared bucket (the unused part of an estimate), never above full: one
  /// request, not awaited, best effort (lost if Redis is unavailable).
  void refund(std::size_t n) {
    if (n == 0) return;
    const auto most = static_cast<std::size_t>(options_.capacity);
    line_->update([&](detail::bucket_admission<Clock>& p, time_point) { p.refund(static_cast<std::int64_t>(std::min(n, most))); });
  }

  /// Completes every waiter with rein::errc::closed; later acquires fail the same way. The limiter's own
  /// connection is closed too (so `io_context::run()` can return); a shared one stays open.
  void close() {
    line_->close();
    if (owned_) owned_->close();
  }

  /// Counters and state, including round-trip latency, copied under the lock.
  shared_token_bucket_snapshot snapshot() const {
    const bool up = transport_->connection()->connected();
    shared_token_bucket_snapshot s = line_->inspect([](const detail::bucket_admission<Clock>& p, const wait_stats& line) {
      shared_token_bucket_snapshot mine = p.snapshot(Clock::now());
      static_cast<wait_stats&>(mine) = line;
      return mine;
    });
    s.connected = up;
    return s;
  }

  /// The counters of the connection this limiter uses.
  rein::redis::connection_snapshot connection_snapshot() const { return transport_->connection()->snapshot(); }

 private:
  std::shared_ptr<line_type> make_line(const Executor& ex, std::shared_ptr<typename connection_type::core_type> link,
                                       const shared_token_bucket_options& o) {
    auto up = [c = link] { return c->connected(); };
    auto line = std::make_shared<line_type>(ex, rein::detail::line_options{.max_waiters = o.max_waiters}, o, std::move(up),
                                            Clock::now());
    const double interval_us = line->inspect([](const detail::bucket_admission<Clock>& p, const wait_stats&) { return p.interval_us(); });
    transport_ = std::make_shared<transport_type>(line, std::move(link), o, interval_us);
    line->set_transport(transport_);
    return line;
  }

  // Every door is written once, in rein/detail/acquire_doors.hpp (a remote line has no synchronous try).
  rein::detail::line_doors<line_type> doors() const noexcept { return {line_.get(), "rein::redis::shared_token_bucket"}; }

  shared_token_bucket_options options_;
  std::shared_ptr<typename connection_type::core_type> owned_;
  std::shared_ptr<transport_type> transport_;  // also held by the line (it outlives the limiter while requests fly)
  std::shared_ptr<line_type> line_;
};

/// The thread-safe shared token bucket on any I/O executor.
using shared_token_bucket = basic_shared_token_bucket<>;

}  // namespace rein::redis
