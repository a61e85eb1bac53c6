// One sliding window shared by many processes and machines: the admissions' stamps live in Redis, in a
// sorted set pruned and counted by a Lua script.
#pragma once

#include <rein/config.hpp>
#include <rein/line_options.hpp>
#include <rein/redis/connection.hpp>
#include <rein/redis/detail/random_name.hpp>
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

/// The Lua script: the sliding log and the fleet's queue. KEYS[1] is a sorted set of admission stamps
/// (score: the server's TIME in microseconds; member: a number from the counter KEYS[2], so that admissions
/// in the same microsecond stay apart) and, below score 0, of the processes that asked lately: member
/// "q:<name>:<served>:<wanted>:<kept until, microseconds>", score the counter's value at the process's
/// first request - 2^52, so the queue ranks processes by arrival and sorts before every stamp. (In the
/// stamps' key rather than a key of its own: a script on a migrating Cluster slot runs only where all its
/// keys exist, and a queue key would not always.) Each call first drops the stamps that left the window
/// (0 < score <= now - window) and the processes whose time is up. Then places go round-robin, one unit a
/// turn (start-time fair queuing): `served` counts a process's units admitted since it joined (it joins at
/// the least count of those queued), and the caller's units number served .. served + n - 1. Every other
/// process is owed its units numbered up to the caller's last (that one too if it ranks first), at most
/// what it waits for (`wanted`). n is admitted if the free places (limit - stamps) hold n and everything
/// owed (ahead): a place freed goes to whoever is owed it even when another process asks first, and a
/// process that wakes first in a burst of freed places takes its share, not the burst. An admission adds
/// n stamps and keeps the caller's entry `grace` (ARGV[5]) from now, its count raised by n. A denial says
/// when the k-th oldest stamp leaves, k = stamps + n + ahead - limit (a window from now if k > stamps:
/// those places are not taken yet; sooner if the entry of a process owed some ends first), and keeps the
/// caller's entry until then plus `grace`, unless the caller said it will not wait that long (its deadline
/// comes first: it fails at once). Only the server's clock is read (TIME; effects replication, as the token
/// bucket's script), so clients' clock skew does not matter. A negative n gives |n| places back by
/// removing the oldest stamps: never more admissions in a window than without the refund. Both keys expire
/// when the newest stamp leaves the window and the last entry's time is up, so idle windows cost no memory.
/// KEYS[3], when set (set_limit), holds the limit for the whole fleet, which replaces ARGV's; a request for
/// more than it gets an error reply (it could only wait forever).
///
/// ARGV: window (microseconds), limit, n, the caller's name, grace (microseconds), how long the caller will
/// wait (microseconds; 0: no deadline), the units its process waits for in all (at least n is read).
/// Returns {allowed (1/0), retry_after (microseconds until n would fit after what others are owed; 0 if
/// allowed), free places left to the caller's next unit after the decision (net of what others are owed
/// before it), the server's TIME (microseconds since the Unix epoch: an admission's stamp)}.
inline constexpr std::string_view sliding_window_script = R"lua(
if redis.replicate_commands then redis.replicate_commands() end
local window = tonumber(ARGV[1])
local limit = tonumber(redis.call('GET', KEYS[3]) or ARGV[2])
local n = tonumber(ARGV[3])
local me = ARGV[4]
if n > limit then
  return redis.error_reply('ERR rein: the window asks for ' .. n .. ' places, above the limit of ' .. limit)
end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, now - window)
local raw = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(0', 'WITHSCORES')
local others, mine, least, queued, keep = {}, nil, nil, 0, 0
for i = 1, #raw, 2 do
  local name, served, wanted, til = string.match(raw[i], '^q:([^:]*):(%d+):(%d+):(%d+)$')
  til = tonumber(til or '0')
  if til <= now then
    redis.call('ZREM', KEYS[1], raw[i])
  else
    local e = {member = raw[i], rank = tonumber(raw[i + 1]), served = tonumber(served), wanted = tonumber(wanted)}
    e.til = til
    if name == me then mine = e else others[#others + 1] = e end
    if not least or e.served < least then least = e.served end
    queued = queued + 1
    keep = math.max(keep, til - now)
  end
end
local count = redis.call('ZCARD', KEYS[1]) - queued
if n < 0 then
  local back = math.min(-n, count)
  if back > 0 then redis.call('ZREMRANGEBYRANK', KEYS[1], queued, queued + back - 1) end
  return {1, 0, limit - count + back, now}
end
local served = mine and mine.served or (least or 0)
local function owed(last)
  local sum, soonest = 0, nil
  for _, e in ipairs(others) do
    local first = (not mine or e.rank < mine.rank) and 1 or 0
    local units = math.max(0, math.min(last - e.served + first, e.wanted))
    if units > 0 and (not soonest or e.til < soonest) then soonest = e.til end
    sum = sum + units
  end
  return sum, soonest
end
local wants = math.min(math.max(n, tonumber(ARGV[7])), limit)
local free = limit - count
-- What the others are owed before this request's first unit (start-time order): counted to its last unit,
-- two processes each asking for more than limit / 2 places were each owed too much to ever get in.
local ahead, soonest = owed(served)
local reply, entry
if n + ahead > free then
  local k = count + n + ahead - limit
  local wait = window
  if k <= count then
    local stamp = redis.call('ZRANGE', KEYS[1], queued + k - 1, queued + k - 1, 'WITHSCORES')
    wait = tonumber(stamp[2]) + window - now
  end
  if soonest then wait = math.max(1, math.min(wait, soonest - now)) end
  local patience = tonumber(ARGV[6])
  if patience == 0 or patience >= wait then entry = {served, wants, now + wait + tonumber(ARGV[5])} end
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if newest[2] and tonumber(newest[2]) > 0 then keep = math.max(keep, tonumber(newest[2]) + window - now) end
  reply = {0, wait, math.max(0, free - owed(served))}
else
  local last = redis.call('INCRBY', KEYS[2], n)
  for i = 1, n do
    redis.call('ZADD', KEYS[1], now, last - n + i)
  end
  entry = {served + n, wants - n, now + tonumber(ARGV[5])}
  keep = math.max(keep, window)
  reply = {1, 0, math.max(0, free - n - owed(served + n))}
end
if entry then
  local rank = mine and mine.rank or redis.call('INCR', KEYS[2]) - 2 ^ 52
  if mine then redis.call('ZREM', KEYS[1], mine.member) end
  redis.call('ZADD', KEYS[1], rank, string.format('q:%s:%d:%d:%d', me, entry[1], entry[2], entry[3]))
  keep = math.max(keep, entry[3] - now)
end
local ttl = math.ceil(keep / 1000) + 1
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
reply[4] = now
return reply
)lua";

/// How the window's messages become commands: EVALSHA of sliding_window_script on the window's three keys
/// (a refund is a negative n), as this limiter object's name in the fleet's queue.
struct window_commands {
  static constexpr std::string_view script = sliding_window_script;

  explicit window_commands(const shared_sliding_window_options& o)
      : log(tagged_key(o, ":window")),
        seq(tagged_key(o, ":window:seq")),
        stored_limit(tagged_key(o, ":window:limit")),
        window(std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(o.window).count())),
        limit(std::to_string(o.limit)),
        name(random_name()),
        grace(std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(o.queue_grace).count())) {}

  /// The key whose Redis Cluster slot holds every key of the script.
  const std::string& routing_key() const noexcept { return log; }

  std::string command(const message& m, std::string_view sha) const {
    const std::int64_t n = m.what == message::kind::refund ? -m.n : m.n;
    return encode_command({"EVALSHA", sha, "3", log, seq, stored_limit, window, limit, std::to_string(n), name, grace,
                           std::to_string(m.extra), std::to_string(m.wanted)});
  }

  std::string log;
  std::string seq;
  std::string stored_limit;
  std::string window;
  std::string limit;
  std::string name;  // this window object's name in the fleet's queue
  std::string grace;
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
/// moment Redis said its turn comes (when the admissions that must leave before it do), on the same wait
/// line as every rein limiter (one timer, deadlines, cancellation, completions); then the head asks again.
/// While that hold lasts, a caller whose deadline comes before its end fails at once with
/// rein::errc::timed_out.
///
/// Order between processes (the fleet queue): every process that asks is entered in a queue kept in Redis,
/// ranked by its first request, with the units it was admitted since it joined and the units it waits for.
/// Places go round-robin, one unit a turn: a request is admitted only if the free places hold it and
/// everything the other waiting processes are owed before it (each its units up to the count this request
/// would bring its process to, one more if it ranks first, at most what it waits for). So a place freed goes
/// to the process owed it even if another asks first, a request ranked beyond the free places is denied
/// though a place is free, and a process that wakes first in a burst of freed places takes its share of
/// them, not the burst. Each denial tells its process when its turn comes (when the admissions that must
/// leave before it do, those owed to others counted), so waiting processes ask one after another. Order
/// holds within a process as well. Guaranteed: no process is admitted a unit while another waiting process
/// that has been admitted fewer since both joined (or as many, and joined first) waits for one, as far as
/// each keeps asking. Not guaranteed: the admissions made before a process joined (it joins at the least
/// count of those in the queue), e.g. what processes starting together got before the window first filled.
/// A process that stops asking (it died, gave up, or wants no more) keeps its entry until `queue_grace`
/// (200 ms) past the retry-after Redis last gave it (after an admission, `queue_grace` from then): the
/// places it waited for stay free that long after they free up, then go to the others; one slower than
/// that to ask again (a stalled event loop) joins anew. A caller whose deadline comes before its turn fails
/// at once and is not queued. Extra Redis cost per call: one range read of the queue and a pass over it
/// (O(log N + W), W processes that asked within their grace), and one entry rewritten (ZREM, ZADD; the first
/// time, a number from the counter); a member of about 60 characters per process in the sorted set. The
/// queue lives in the stamps' sorted set, below score 0, so the window keeps its three keys in one Cluster
/// slot.
///
/// Rule from: the sliding log kept in a Redis sorted set (ZREMRANGEBYSCORE, ZCARD, ZADD in one script), the
/// classic Redis sliding-log pattern, as in Redisson's RRateLimiter (a sorted set of permits pruned by
/// score in a script); the waiter discipline is that of every rein limiter; the fleet queue is the shared
/// semaphore's (waiting processes ranked by first denial, dropped when they stop asking).
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

  /// The constructors: (connection&, rule, line_options = {}) on a shared connection; (cluster&, rule,
  /// line_options = {}) on a Redis Cluster, talking to the master of its key's slot; (executor or execution
  /// context, connection_options, rule, line_options = {}) with a connection of its own. The line serves in
  /// fifo order and refuses the newest when full (rein::line_options: another order, evict_oldest and
  /// partitions are refused).
  /// @throws std::invalid_argument naming the type, field and value if an option is out of range.
  using base::base;

  /// Gives n places back (admissions that did not happen after all, e.g. a request never sent): removes the
  /// n oldest stamps still in the window, at most `limit`. One request, not awaited, best effort (lost if
  /// Redis is unavailable). Removing the oldest rather than the caller's own keeps the bound: the window
  /// never admits more than if the refunded admissions had not been made.
  void refund(std::size_t n) {
    if (n == 0) return;
    const auto most = static_cast<std::size_t>(this->get_options().limit);
    this->line().update([&](detail::window_admission<Clock>& p, typename Clock::time_point) {
      p.refund(static_cast<std::int64_t>(std::min(n, most)));
    });
  }

  /// Sets the limit for every process sharing the window, stored in Redis (`prefix{key}:window:limit`, kept
  /// until set again): each process's next request is judged by it, in place of its own options' `limit`.
  /// Admissions already in the window stay; none more until fewer than the new limit remain. One request,
  /// not awaited; false if it could not be sent (Redis unavailable). A request for more than this
  /// process's `get_options().limit` still fails with rein::errc::exceeds_capacity; one for more than the stored
  /// limit fails with errc::server_error (it could only wait forever). With fail_open, the local window
  /// keeps its share of `get_options().limit`. True means on its way, not stored: an error reply is counted in
  /// snapshot().server_errors.
  /// @throws std::invalid_argument naming the type, field and value unless 1 <= limit <= 2^27.
  bool set_limit(std::int64_t limit) {
    if (limit < 1 || limit > (std::int64_t{1} << 27))
      throw std::invalid_argument("rein::redis::shared_sliding_window: limit must be in [1, 2^27] admissions, got " +
                                  std::to_string(limit));
    return this->send_setting({"SET", detail::tagged_key(this->get_options(), ":window:limit"), std::to_string(limit)});
  }

  /// Counters and state, including round-trip latency, copied under the lock.
  shared_sliding_window_snapshot snapshot() const { return this->scripted_snapshot(); }
};

/// The thread-safe shared sliding window on any I/O executor.
using shared_sliding_window = basic_shared_sliding_window<>;

}  // namespace rein::redis
