// One token bucket shared by many processes and machines: its state lives in Redis, updated by a Lua script.
#pragma once

#include <rein/config.hpp>
#include <rein/line_options.hpp>
#include <rein/redis/connection.hpp>
#include <rein/redis/detail/bucket_admission.hpp>
#include <rein/redis/detail/scripted_admission.hpp>
#include <rein/redis/detail/scripted_transport.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

namespace rein::redis {

namespace detail {

/// The Lua script. One hash per quota: `at`, the server time of the last change (microseconds), and `debt`,
/// how far the bucket is below full, in microseconds of refill. This is GCRA (ITU-T I.371, the "virtual
/// scheduling" form: debt = TAT - now) written as a token bucket: tokens = (capacity * interval - debt) /
/// interval. A request for n is allowed when debt + n * interval <= capacity * interval. Only the server's
/// clock (TIME) is read, so clients' clock skew does not matter; Redis >= 5 replicates a script's effects
/// rather than the script, which is what makes TIME allowed (redis.replicate_commands for 3.2 and 4).
/// A negative n gives tokens back (never above full). The key expires when the bucket would be full again,
/// so idle quotas cost no memory. With a fourth argument `most` > n (a batch), an allowed request takes up to
/// `most` tokens, as many whole tokens as the bucket holds beyond n.
///
/// KEYS[2] is a hash holding a rate set for the whole fleet (set_rate: `interval`, `capacity`); when it
/// exists it replaces ARGV's, and the reply says so.
///
/// ARGV: interval (microseconds per token), capacity (tokens), n[, most]. Returns {allowed (1/0),
/// retry_after (microseconds until n would be allowed; 0 if allowed), available (microseconds of refill in
/// the bucket after the decision: tokens * interval), tokens taken[, stored interval (nanoseconds per
/// token), stored capacity], the server's TIME (microseconds since the Unix epoch)}.
inline constexpr std::string_view token_bucket_script = R"lua(
if redis.replicate_commands then redis.replicate_commands() end
local interval = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local stored = redis.call('HMGET', KEYS[2], 'interval', 'capacity')
local told = {}
if stored[1] and stored[2] then
  interval = tonumber(stored[1])
  capacity = tonumber(stored[2])
  told = {math.floor(interval * 1000 + 0.5), capacity}
end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local function reply(r)
  for _, v in ipairs(told) do table.insert(r, v) end
  table.insert(r, now)
  return r
end
local n = tonumber(ARGV[3])
local limit = capacity * interval
local debt = 0
local state = redis.call('HMGET', KEYS[1], 'at', 'debt')
if state[1] and state[2] then
  debt = tonumber(state[2]) - math.max(0, now - tonumber(state[1]))
  if debt < 0 then debt = 0 end
end
local after = debt + n * interval
if n > 0 and after > limit then
  return reply({0, math.ceil(after - limit), math.floor(limit - debt), 0})
end
local most = tonumber(ARGV[4] or ARGV[3])
if most > n then
  local more = math.min(most - n, math.floor((limit - after) / interval))
  if more > 0 then
    n = n + more
    after = debt + n * interval
  end
end
if after <= 0 then
  redis.call('DEL', KEYS[1])
  return reply({1, 0, math.floor(limit), n})
end
redis.call('HSET', KEYS[1], 'at', now, 'debt', after)
redis.call('PEXPIRE', KEYS[1], math.ceil(after / 1000) + 1)
return reply({1, 0, math.floor(limit - after), n})
)lua";

/// How the bucket's messages become commands: EVALSHA of token_bucket_script on the bucket's key, with the
/// interval and capacity of the options (a refund is a negative n).
struct bucket_commands {
  static constexpr std::string_view script = token_bucket_script;

  explicit bucket_commands(const shared_token_bucket_options& o)
      : key(o.key), stored_rate(rate_key(o.key)), interval(format_number(1e6 / o.rate)), capacity(std::to_string(o.capacity)) {}

  /// The key whose Redis Cluster slot holds every key of the script.
  const std::string& routing_key() const noexcept { return key; }

  /// Where set_rate's hash lives: in the key's Cluster slot (its hash tag, or the whole key as the tag).
  static std::string rate_key(const std::string& key) {
    return hash_tag(key).empty() ? "{" + key + "}:rate" : key + ":rate";
  }

  std::string command(const message& m, std::string_view sha) const {
    const std::int64_t n = m.what == message::kind::refund ? -m.n : m.n;
    if (m.what == message::kind::admission && m.extra > n)  // a batch: up to m.extra tokens
      return encode_command({"EVALSHA", sha, "2", key, stored_rate, interval, capacity, std::to_string(n), std::to_string(m.extra)});
    return encode_command({"EVALSHA", sha, "2", key, stored_rate, interval, capacity, std::to_string(n)});
  }

  std::string key;
  std::string stored_rate;  // key + ":rate": set_rate's hash
  std::string interval;
  std::string capacity;
};

template <class Executor, class Clock, class Mutex>
using bucket_base = basic_scripted_limiter<bucket_admission<Clock>, bucket_commands, Executor, Clock, Mutex>;

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
/// within a process; between processes, whoever asks first after a refill gets the token: nothing enforces
/// fairness between processes, but with equal demand their shares come out even (four processes on one
/// server: Jain's index over their admissions >= 0.95, tests/redis/quota_processes.cpp).
///
/// Rule from: the token bucket kept in Redis by a Lua script, GCRA as in ITU-T I.371 and redis-cell; the
/// waiter discipline is that of every rein limiter (FIFO, one timer). The admission rule itself
/// (detail::bucket_admission) does no I/O: it says what to send and reads the verdicts, as boostorg/redis
/// keeps its state machines apart from the socket; the only I/O is the connection.
///
/// Failures (see failure_policy): while Redis cannot be asked, `fail_closed` completes waiting and new
/// acquires with errc::unavailable and admits nothing; `fail_open` admits from a local bucket with
/// `fail_open_share` of the quota. The connection reconnects by itself (with backoff); admissions go back to
/// Redis once it is connected and `recheck_interval` has passed. A grant cancelled before its handler ran
/// goes back where it came from: to Redis, or to the local bucket for one the local bucket made, even when
/// Redis answers again meanwhile (Redis is never refunded tokens it did not give). No operation waits on Redis longer than
/// the connection's `request_timeout`, and none past its own deadline.
///
/// Differences from rein::token_bucket: `try_acquire` always refuses, since an answer needs a round trip
/// (it exists for generic code; use `async_acquire_until` with a deadline); a deadline that cannot be met
/// is found out only when it passes, not predicted; `set_rate` changes the rate for the whole fleet (stored
/// in Redis), not only for this process. Otherwise it is used like any rein rate limiter (same acquire
/// functions and completion signature `void(error_code)`), including inside rein::throttle.
///
/// @tparam Executor the I/O executor; completions default to it. With a shared connection, the connection's.
/// @tparam Clock    the clock of deadlines and local waiting (std::chrono::steady_clock). Redis's clock
///                  decides the rate.
/// @tparam Mutex    std::mutex (default), or rein::null_mutex when everything runs on one thread.
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
template <class Executor = net::any_io_executor, class Clock = std::chrono::steady_clock, class Mutex = std::mutex>
class basic_shared_token_bucket : public detail::bucket_base<Executor, Clock, Mutex> {
  using base = detail::bucket_base<Executor, Clock, Mutex>;

 public:
  /// The same limiter type on another executor (Asio's convention).
  template <class OtherExecutor>
  struct rebind_executor {
    /// The same limiter type on `OtherExecutor`.
    using other = basic_shared_token_bucket<OtherExecutor, Clock, Mutex>;
  };

  /// The constructors: (connection&, rule, line_options = {}) on a shared connection; (cluster&, rule,
  /// line_options = {}) on a Redis Cluster, talking to the master of its key's slot; (executor or execution
  /// context, connection_options, rule, line_options = {}) with a connection of its own. The line serves in
  /// fifo order and refuses the newest when full (rein::line_options: another order, evict_oldest and
  /// partitions are refused).
  /// @throws std::invalid_argument naming the type, field and value if an option is out of range.
  using base::base;

  /// Gives n tokens back to the shared bucket (the unused part of an estimate), never above full: one
  /// request, not awaited, best effort (lost if Redis is unavailable).
  void refund(std::size_t n) {
    if (n == 0) return;
    const auto most = static_cast<std::size_t>(this->get_options().capacity);
    this->line().update([&](detail::bucket_admission<Clock>& p, typename Clock::time_point) {
      p.refund(static_cast<std::int64_t>(std::min(n, most)));
    });
  }

  /// Sets the rate (tokens per second) and capacity for every process sharing the key, stored in Redis (a
  /// hash beside the key, see the options, kept until set again): each process's next request is decided
  /// by them in place of its own options' (a waiting process within its current hold), and its estimates
  /// follow from the first reply that says so; this process's at once (a waiter asking for more than a
  /// lowered capacity fails with rein::errc::exceeds_capacity). One request, not awaited: true once it is
  /// on its way, false if it could not be sent (Redis unavailable; nothing changes). An error reply is
  /// counted in snapshot().server_errors. The fail_open local bucket keeps the options' rate.
  /// @throws std::invalid_argument naming the type, field and value, as for the options.
  bool set_rate(double rate, std::int64_t capacity) {
    auto checked = this->get_options();
    checked.rate = rate;
    checked.capacity = capacity;
    checked.batch = std::min(checked.batch, std::max<std::int64_t>(1, capacity));
    (void)detail::bucket_model<Clock>::validated(checked);
    const bool sent = this->send_setting({"HSET", detail::bucket_commands::rate_key(this->get_options().key), "interval",
                                          detail::format_number(1e6 / rate), "capacity", std::to_string(capacity)});
    if (sent) {
      this->line().update_and_refuse(
          [&](detail::bucket_admission<Clock>& p, typename Clock::time_point) { p.model().set_rate(rate, capacity); });
    }
    return sent;
  }

  /// Counters and state, including round-trip latency, copied under the lock.
  shared_token_bucket_snapshot snapshot() const { return this->scripted_snapshot(); }
};

/// The thread-safe shared token bucket on any I/O executor.
using shared_token_bucket = basic_shared_token_bucket<>;

}  // namespace rein::redis
