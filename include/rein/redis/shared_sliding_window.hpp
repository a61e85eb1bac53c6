// One sliding window shared by many processes and machines: the admissions' stamps live in Redis, in a
// sorted set pruned and counted by a Lua script.
#pragma once

#include <rein/config.hpp>
#include <rein/redis/connection.hpp>
#include <rein/redis/detail/scripted_admission.hpp>
#include <rein/redis/detail/scripted_transport.hpp>
#include <rein/redis/detail/window_admission.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>

namespace rein::redis {

namespace detail {

/// The Lua script: the sliding log. KEYS[1] is a sorted set of admission stamps (score: the server's TIME in
/// microseconds; member: a number from the counter KEYS[2], so that admissions in the same microsecond
/// stay apart). Each call first drops the stamps that left the window (score <= now - window), then admits
/// n if count + n <= limit, adding n stamps. A denial says when the k-th oldest stamp leaves, k = count + n -
/// limit: then n fit. Only the server's clock is read (TIME; effects replication, as the token bucket's
/// script), so clients' clock skew does not matter. A negative n gives |n| places back by removing the
/// oldest stamps: never more admissions in a window than without the refund. Both keys expire a window
/// after the last admission, so idle windows cost no memory. KEYS[3], when set (set_limit), holds the limit
/// for the whole fleet, which replaces ARGV's; a request for more than it gets an error reply (it could only
/// wait forever).
///
/// ARGV: window (microseconds), limit, n. Returns {allowed (1/0), retry_after (microseconds until n would
/// fit; 0 if allowed), free places after the decision}.
inline constexpr std::string_view sliding_window_script = R"lua(
if redis.replicate_commands then redis.replicate_commands() end
local window = tonumber(ARGV[1])
local limit = tonumber(redis.call('GET', KEYS[3]) or ARGV[2])
local n = tonumber(ARGV[3])
if n > limit then
  return redis.error_reply('ERR rein: the window asks for ' .. n .. ' places, above the limit of ' .. limit)
end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local count = redis.call('ZCARD', KEYS[1])
if n < 0 then
  local back = math.min(-n, count)
  if back > 0 then redis.call('ZPOPMIN', KEYS[1], back) end
  return {1, 0, limit - count + back}
end
if count + n > limit then
  local k = count + n - limit
  local stamp = redis.call('ZRANGE', KEYS[1], k - 1, k - 1, 'WITHSCORES')
  return {0, tonumber(stamp[2]) + window - now, limit - count}
end
local last = redis.call('INCRBY', KEYS[2], n)
for i = 1, n do
  redis.call('ZADD', KEYS[1], now, last - n + i)
end
local ttl = math.ceil(window / 1000) + 1
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return {1, 0, limit - count - n}
)lua";

/// How the window's messages become commands: EVALSHA of sliding_window_script on the window's two keys (a
/// refund is a negative n).
struct window_commands {
  static constexpr std::string_view script = sliding_window_script;

  explicit window_commands(const shared_sliding_window_options& o)
      : log(tagged_key(o, ":window")),
        seq(tagged_key(o, ":window:seq")),
        stored_limit(tagged_key(o, ":window:limit")),
        window(std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(o.window).count())),
        limit(std::to_string(o.limit)) {}

  /// The key whose Redis Cluster slot holds every key of the script.
  const std::string& routing_key() const noexcept { return log; }

  std::string command(const message& m, std::string_view sha) const {
    const std::int64_t n = m.what == message::kind::refund ? -m.n : m.n;
    return encode_command({"EVALSHA", sha, "3", log, seq, stored_limit, window, limit, std::to_string(n)});
  }

  std::string log;
  std::string seq;
  std::string stored_limit;
  std::string window;
  std::string limit;
};

template <class Executor, class Clock, class Mutex>
using window_base = basic_scripted_limiter<window_admission<Clock>, window_commands, Executor, Clock, Mutex>;

}  // namespace detail

/// A sliding window shared by every process that names the same key: never more than `limit` admissions in
/// any window of `window`, fleet-wide, exactly (by the Redis server's clock).
///
/// `co_await window.acquire(n)` inside `net::awaitable<>` returns once n admissions were recorded in the
/// shared log. Each admission is one round trip: an EVALSHA of a Lua script that prunes, counts and adds
/// atomically on the server (see detail::sliding_window_script: one sorted set of admission stamps per
/// window). Requests from all the coroutines using a limiter are pipelined on one connection (up to
/// `max_in_flight`, and no more than the free places the last reply reported, at least one).
///
/// Bound: for every t, the admissions with server stamps in (t - window, t] number at most `limit`. Unlike a
/// token bucket there is no burst above it, and unlike a fixed window no doubling at a window's edge.
///
/// Waiting is local: a denied caller waits in this process, FIFO with head-of-line blocking, until the
/// moment Redis said the needed places free up (when the oldest admissions leave the window), on the same
/// wait line as every rein limiter (one timer, deadlines, cancellation, completions); then the head asks
/// again. While that hold lasts, a caller whose deadline comes before its end fails at once with
/// rein::errc::timed_out. Order holds within a process; between processes, whoever asks first after a place
/// frees gets it.
///
/// Rule from: the sliding log kept in a Redis sorted set (ZREMRANGEBYSCORE, ZCARD, ZADD in one script), the
/// classic Redis sliding-log pattern, as in Redisson's RRateLimiter (a sorted set of permits pruned by
/// score in a script); the waiter discipline is that of every rein limiter.
///
/// Failures (see failure_policy): while Redis cannot be asked, `fail_closed` completes waiting and new
/// acquires with errc::unavailable and admits nothing; `fail_open` admits from a local
/// rein::algo::sliding_window with `fail_open_share` of the limit (the fleet-wide bound then no longer holds
/// exactly). The connection reconnects by itself (with backoff); admissions go back to Redis once it is
/// connected and `recheck_interval` has passed. No operation waits on Redis longer than the connection's
/// `request_timeout`, and none past its own deadline.
///
/// Members: the constructors, `try_acquire` (always busy: an answer needs a round trip), `async_acquire`,
/// `async_acquire_for`, `async_acquire_until` (completion signature `void(error_code)`, every completion
/// token), `acquire`, `acquire_for`, `acquire_until` (awaitables), `close`, `options`, `get_executor` and
/// `connection_snapshot` are those of every scripted limiter (detail::basic_scripted_limiter, documented
/// there); errors: rein::errc::exceeds_capacity (n > limit), queue_full, closed, timed_out, errc::unavailable,
/// errc::server_error, operation_aborted. Cancellation (terminal, partial, total) completes at once; a grant
/// Redis makes to a cancelled request is refunded.
///
/// @tparam Executor the I/O executor; completions default to it. With a shared connection, the connection's.
/// @tparam Clock    the clock of deadlines and local waiting (std::chrono::steady_clock). Redis's clock
///                  stamps the admissions.
/// @tparam Mutex    std::mutex (default), or rein::null_mutex when everything runs on one thread.
///
/// @par Thread Safety
/// With std::mutex, every member function may be called concurrently, except destruction.
///
/// @par Lifetime
/// Not copyable or movable. Destroying it completes every waiter with `operation_aborted`; admissions Redis
/// grants to requests still on the wire are refunded if the connection is still up. A connection passed in
/// must outlive the limiter or the limiter sees Redis as unavailable.
template <class Executor = net::any_io_executor, class Clock = std::chrono::steady_clock, class Mutex = std::mutex>
class basic_shared_sliding_window : public detail::window_base<Executor, Clock, Mutex> {
  using base = detail::window_base<Executor, Clock, Mutex>;

 public:
  /// The same limiter type on another executor (Asio's convention).
  template <class OtherExecutor>
  struct rebind_executor {
    /// The same limiter type on `OtherExecutor`.
    using other = basic_shared_sliding_window<OtherExecutor, Clock, Mutex>;
  };

  /// The constructors: (connection&, options) on a shared connection; (cluster&, options) on a Redis
  /// Cluster, talking to the master of its key's slot; (executor or execution context,
  /// connection_options, options) with a connection of its own.
  /// @throws std::invalid_argument naming the type, field and value if an option is out of range.
  using base::base;

  /// Gives n places back (admissions that did not happen after all, e.g. a request never sent): removes the
  /// n oldest stamps still in the window, at most `limit`. One request, not awaited, best effort (lost if
  /// Redis is unavailable). Removing the oldest rather than the caller's own keeps the bound: the window
  /// never admits more than if the refunded admissions had not been made.
  void refund(std::size_t n) {
    if (n == 0) return;
    const auto most = static_cast<std::size_t>(this->options().limit);
    this->line().update([&](detail::window_admission<Clock>& p, typename Clock::time_point) {
      p.refund(static_cast<std::int64_t>(std::min(n, most)));
    });
  }

  /// Sets the limit for every process sharing the window, stored in Redis (`prefix{key}:window:limit`, kept
  /// until set again): each process's next request is judged by it, in place of its own options' `limit`.
  /// Admissions already in the window stay; none more until fewer than the new limit remain. One request,
  /// not awaited; false if it could not be sent (Redis unavailable). A request for more than this
  /// process's `options().limit` still fails with rein::errc::exceeds_capacity; one for more than the stored
  /// limit fails with errc::server_error (it could only wait forever). With fail_open, the local window
  /// keeps its share of `options().limit`. True means on its way, not stored: an error reply is counted in
  /// snapshot().server_errors.
  /// @throws std::invalid_argument naming the type, field and value unless 1 <= limit <= 2^27.
  bool set_limit(std::int64_t limit) {
    if (limit < 1 || limit > (std::int64_t{1} << 27))
      throw std::invalid_argument("rein::redis::shared_sliding_window: limit must be in [1, 2^27] admissions, got " +
                                  std::to_string(limit));
    return this->send_setting({"SET", detail::tagged_key(this->options(), ":window:limit"), std::to_string(limit)});
  }

  /// Counters and state, including round-trip latency, copied under the lock.
  shared_sliding_window_snapshot snapshot() const { return this->scripted_snapshot(); }
};

/// The thread-safe shared sliding window on any I/O executor.
using shared_sliding_window = basic_shared_sliding_window<>;

}  // namespace rein::redis
