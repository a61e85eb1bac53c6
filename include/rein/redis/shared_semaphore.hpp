// One concurrency limit shared by many processes and machines: the permits each process holds live in
// Redis under a lease that the process renews, updated by a Lua script.
#pragma once

#include <rein/config.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/line_options.hpp>
#include <rein/permit.hpp>
#include <rein/redis/connection.hpp>
#include <rein/redis/detail/random_name.hpp>
#include <rein/redis/detail/scripted_admission.hpp>
#include <rein/redis/detail/scripted_transport.hpp>
#include <rein/redis/detail/semaphore_admission.hpp>

#include REIN_ASIO_HEADER(basic_waitable_timer.hpp)

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace rein::redis {

namespace detail {

/// The Lua script: permits held per lease. KEYS[1] is a hash lease -> permits held, KEYS[2] a sorted set
/// lease -> expiry (the server's TIME in microseconds), KEYS[3] the total held, KEYS[4] the queue of
/// waiting leases (a sorted set: lease -> when it was first denied), KEYS[5] until when each of them
/// stays in the queue without asking again (a hash: three of its own poll intervals after its last ask) and KEYS[6] the limit set for the whole fleet (set_limit), which replaces ARGV's. Every call first takes back the permits of the leases that expired (their holders were
/// silent longer than the lease: crashed, hung or cut off), then:
/// - 'f' / 'a' (acquire n): admits if total + n <= limit and no other lease waits longer (the queue's head
///   goes first; a lease that has not asked for three of its poll intervals leaves the queue). A denied lease
///   joins the queue. So processes take turns under saturation: one that just released cannot take the
///   permit back from one that waited. 'f' creates the lease if missing (the first request of a lease); 'a'
///   of a lease Redis does not know answers "lost" (-1), so that a process whose lease expired never counts
///   its old permits under a new one. A denial's retry-after is a quarter of the poll interval per
///   place in the queue (the head asks most often, so a permit freed elsewhere idles little), at most the
///   poll interval, and less if a lease expires sooner.
/// - 'r' (release n): gives back at most what the lease holds.
/// - 'h' (renew, n = the most the process may hold under the lease: granted and not given back, plus asked
///   for on the wire; ARGV[7] = the least: granted and not given back): lowers the lease's count to n if it
///   is higher (releases the server never received, e.g. sent while the connection was down), so a
///   process's lost releases do not keep permits forever, and raises it to the least if it is lower (a
///   release that arrived late by another connection after a renewal), so it cannot stay too low either.
/// - An acquire of more than the limit in force (a lowered set_limit) is an error reply: it would wait
///   forever at the head of the queue, holding up every process.
/// Every call of a known lease extends it to now + lease. Only the server's clock is read (TIME; effects
/// replication, as the other scripts), so clients' clock skew does not matter. The keys expire when the
/// longest lease does (processes may use different leases), so an abandoned semaphore costs no memory.
///
/// ARGV: lease id, lease (microseconds), limit, n, operation, poll interval (microseconds). Returns
/// {allowed (1 / 0 / -1 lost), retry_after (microseconds; 0 unless denied), free permits after the call,
/// the server's TIME (microseconds since the Unix epoch)}.
inline constexpr std::string_view shared_semaphore_script = R"lua(
if redis.replicate_commands then redis.replicate_commands() end
local holder = ARGV[1]
local lease = tonumber(ARGV[2])
local limit = tonumber(redis.call('GET', KEYS[6]) or ARGV[3])
local n = tonumber(ARGV[4])
local op = ARGV[5]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local total = tonumber(redis.call('GET', KEYS[3]) or '0')
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, h in ipairs(gone) do
  total = total - tonumber(redis.call('HGET', KEYS[1], h) or '0')
  redis.call('HDEL', KEYS[1], h)
end
if #gone > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now) end
if total < 0 then total = 0 end
local held = redis.call('HGET', KEYS[1], holder)
local poll = tonumber(ARGV[6])
local head = nil
if op == 'a' or op == 'f' then
  for _, w in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
    if tonumber(redis.call('HGET', KEYS[5], w) or '0') < now then
      redis.call('ZREM', KEYS[4], w)
      redis.call('HDEL', KEYS[5], w)
    elseif not head then
      head = w
    end
  end
end
local reply
if not held and op ~= 'f' then
  reply = {-1, 0, limit - total}
else
  held = tonumber(held or '0')
  if op == 'r' then
    local back = math.min(n, held)
    held = held - back
    total = total - back
    reply = {1, 0, limit - total}
  elseif op == 'h' then
    local lo = tonumber(ARGV[7] or '0')
    if held > n then
      total = total - (held - n)
      held = n
    elseif held < lo then
      total = total + (lo - held)
      held = lo
    end
    reply = {1, 0, limit - total}
  elseif n > limit then
    return redis.error_reply('ERR rein: the semaphore asks for ' .. n .. ' permits, above the limit of ' .. limit)
  elseif total + n > limit or (head and head ~= holder) then
    redis.call('ZADD', KEYS[4], 'NX', now, holder)
    redis.call('HSET', KEYS[5], holder, now + 3 * poll)
    local place = redis.call('ZRANK', KEYS[4], holder)
    local wait = math.max(1, math.floor(math.min(poll, poll * (place + 1) / 4)))
    local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    if first[2] then wait = math.max(1, math.min(wait, tonumber(first[2]) - now)) end
    reply = {0, wait, limit - total}
  else
    held = held + n
    total = total + n
    if head == holder then
      redis.call('ZREM', KEYS[4], holder)
      redis.call('HDEL', KEYS[5], holder)
    end
    reply = {1, 0, limit - total}
  end
  redis.call('HSET', KEYS[1], holder, held)
  redis.call('ZADD', KEYS[2], now + lease, holder)
end
redis.call('SET', KEYS[3], total)
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
local ttl = lease
if last[2] then ttl = math.max(ttl, tonumber(last[2]) - now) end
ttl = math.ceil(ttl / 1000) + 1
for i = 1, 5 do redis.call('PEXPIRE', KEYS[i], ttl) end
reply[4] = now
return reply
)lua";

/// How the semaphore's messages become commands: EVALSHA of shared_semaphore_script on its six keys, as
/// the lease the message's tag names (lease number tag / 2; an odd tag is the first request of a lease).
struct semaphore_commands {
  static constexpr std::string_view script = shared_semaphore_script;

  explicit semaphore_commands(const shared_semaphore_options& o)
      : holders(tagged_key(o, ":sem:holders")),
        leases(tagged_key(o, ":sem:leases")),
        total(tagged_key(o, ":sem:total")),
        queue(tagged_key(o, ":sem:queue")),
        seen(tagged_key(o, ":sem:seen")),
        stored_limit(tagged_key(o, ":sem:limit")),
        name(random_name()),  // a lease id no other semaphore object uses
        lease(std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(o.lease).count())),
        limit(std::to_string(o.limit)),
        poll(std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(o.poll_interval).count())) {}

  /// The key whose Redis Cluster slot holds every key of the script.
  const std::string& routing_key() const noexcept { return holders; }

  std::string command(const message& m, std::string_view sha) const {
    const char* op = m.what == message::kind::admission ? ((m.extra & 1) != 0 ? "f" : "a")
                     : m.what == message::kind::renew   ? "h"
                                                        : "r";
    const std::string holder = name + ":" + std::to_string(m.extra / 2);
    if (m.what == message::kind::renew)  // the least it holds travels in `ticket`
      return encode_command({"EVALSHA", sha, "6", holders, leases, total, queue, seen, stored_limit, holder, lease, limit,
                             std::to_string(m.n), op, poll, std::to_string(m.ticket)});
    return encode_command(
        {"EVALSHA", sha, "6", holders, leases, total, queue, seen, stored_limit, holder, lease, limit, std::to_string(m.n), op, poll});
  }

  std::string holders;
  std::string leases;
  std::string total;
  std::string queue;
  std::string seen;
  std::string stored_limit;
  std::string name;  // this semaphore object's lease id; ":<lease number>" is appended
  std::string lease;
  std::string limit;
  std::string poll;
};

template <class Executor, class Clock, class Mutex>
using semaphore_base = basic_scripted_limiter<semaphore_admission<Clock>, semaphore_commands, Executor, Clock, Mutex,
                                              void(error_code, permit)>;

/// Renews a semaphore's lease every `period` on the semaphore's executor, until stop(). Its own timer (the
/// line's serves waiting); held by its pending wait, so stop() may be called from any thread.
template <class Line, class Executor, class Clock, class Mutex>
class lease_keeper : public std::enable_shared_from_this<lease_keeper<Line, Executor, Clock, Mutex>> {
  using timer_type = net::basic_waitable_timer<Clock, net::wait_traits<Clock>, Executor>;

 public:
  lease_keeper(const Executor& ex, std::weak_ptr<Line> line, typename Clock::duration period)
      : timer_(std::in_place, ex), line_(std::move(line)), period_(period) {}

  void start() {
    std::lock_guard<Mutex> lock(mutex_);
    arm_locked();
  }

  /// No renewal after this; the timer is destroyed while its execution context surely exists.
  void stop() noexcept {
    std::lock_guard<Mutex> lock(mutex_);
    timer_.reset();  // a pending wait completes with operation_aborted
  }

 private:
  void arm_locked() {
    timer_->expires_after(period_);
    timer_->async_wait([self = this->shared_from_this()](const error_code& ec) { self->fire(ec); });
  }

  void fire(const error_code& ec) {
    if (ec == net::error::operation_aborted) return;
    const std::shared_ptr<Line> line = line_.lock();
    if (!line) return;
    {
      std::lock_guard<Mutex> lock(mutex_);
      if (!timer_) return;
      try {
        arm_locked();
      } catch (...) {  // no memory for the next wait: the lease runs out, and the next request starts a new one
        return;
      }
    }
    try {
      line->update([](auto& policy, typename Clock::time_point) { policy.renew(); });
    } catch (...) {  // no memory for the message: the next period renews
    }
  }

  Mutex mutex_;
  std::optional<timer_type> timer_;
  std::weak_ptr<Line> line_;
  typename Clock::duration period_;
};

}  // namespace detail

/// A concurrency limit shared by every process that names the same key: never more than `limit` permits
/// held at once, fleet-wide (a distributed semaphore).
///
/// `auto permit = co_await sem.acquire(n);` inside `net::awaitable<>` returns a rein::permit once Redis
/// counted n permits for this process; destroying the permit (or `release()`, `complete(outcome)`) gives
/// them back with one request, not awaited. Each acquire is one round trip: an EVALSHA of a Lua script
/// that counts permits per lease atomically on the server (see detail::shared_semaphore_script). Requests
/// from all the coroutines using a semaphore are pipelined on one connection (up to `max_in_flight`, and no
/// more than the free permits the last reply reported, at least one).
///
/// Leases: the server counts each semaphore object's permits under a lease that the object renews every
/// `lease / 3` (one small request) for as long as it exists. If the process crashes, hangs or loses its
/// network, the server takes its permits back one `lease` after the last renewal, so they are never lost
/// for good. A process that was silent longer than its lease finds it expired: its permits still held no
/// longer count (for a while the fleet may hold more than `limit`: the price of any lease, as with
/// Redisson's lock watchdog), the next lease starts with nothing, and `snapshot().leases_lost` counts it.
/// Each renewal also tells the server the most this process can hold, which corrects releases the server
/// never received (sent while Redis was unreachable).
///
/// Stale grants: a grant is honoured only if its reply is read less than `lease` after its request left
/// (on `Clock`, from before the request was handed to the connection, so its age is overestimated) and
/// under the lease still current. A process that stalled longer (a GC pause, SIGSTOP) with a grant in its
/// socket may find its lease expired and every permit held by others since: it gives the grant back (a
/// release under that lease, which Redis ignores if the lease is gone) and asks again, never honours it
/// (`snapshot().stale_grants`). This assumes the local clock and Redis's run at the same rate. A holder
/// asks `lease_held()` whether its lease (and so its permits) surely still counts.
///
/// Bound: at every instant, the permits the server counts number at most `limit`, and every permit a
/// process holds is counted from before its grant until after its release, as long as its lease holds and
/// Redis keeps its data. Redis restarted without persistence forgets every lease: the permits then held
/// no longer count, and the fleet may hold up to twice the limit until they come back (use persistence or
/// a replica if that matters). Do not let Redis evict these keys (a maxmemory policy other than
/// noeviction, or volatile-* only for other keys).
///
/// Waiting is local: a denied caller waits in this process, FIFO with head-of-line blocking, and the first
/// waiting asks again after the retry-after Redis gave (a quarter of `poll_interval` per place in the
/// fleet's queue, at most all of it), or at once after a permit of this process is given back. A
/// permit another process gives back is seen at the next poll. Between processes, waiting processes take
/// turns through a queue in Redis (the longest waiting goes first, and asks most often); a process whose
/// waiter gave up stays at the head until three of its poll intervals pass. A retry-after is a polling
/// hint, so a deadline before it still waits. Deadlines, cancellation and completions are those of every
/// rein limiter (one wait line, one timer).
///
/// Rule from: a counting semaphore with expiring per-holder leases, as Redisson's RPermitExpirableSemaphore
/// and Apache Curator's InterProcessSemaphoreV2 (leases that die with their holder); the renewal every
/// lease / 3 is Redisson's lock watchdog's.
///
/// Failures (see failure_policy): while Redis cannot be asked, `fail_closed` completes waiting and new
/// acquires with errc::unavailable and grants nothing; `fail_open` grants from a local semaphore with
/// `fail_open_share` of the limit (the fleet-wide bound then no longer holds). Permits granted before the
/// outage stay valid; their releases during it are lost, and corrected by the next renewal. No operation
/// waits on Redis longer than the connection's `request_timeout`, and none past its own deadline.
///
/// Members: the constructors, `try_acquire` (always busy: an answer needs a round trip), `async_acquire`,
/// `async_acquire_for`, `async_acquire_until` (completion signature `void(error_code, rein::permit)`, every
/// completion token), `acquire`, `acquire_for`, `acquire_until` (awaitables returning the permit),
/// `close`, `options`, `get_executor` and `connection_snapshot` are those of every scripted limiter
/// (detail::basic_scripted_limiter, documented there); errors: rein::errc::exceeds_capacity (n > limit),
/// queue_full, closed, timed_out, errc::unavailable, errc::server_error, operation_aborted. Cancellation
/// (terminal, partial, total) completes at once; a grant Redis makes to a cancelled request is given back.
///
/// @tparam Executor the I/O executor; completions default to it. With a shared connection, the connection's.
/// @tparam Clock    the clock of deadlines, local waiting and renewals (std::chrono::steady_clock). Redis's
///                  clock times the leases.
/// @tparam Mutex    std::mutex (default), or rein::null_mutex when everything runs on one thread.
///
/// @par Thread Safety
/// With std::mutex, every member function may be called concurrently, except destruction; permits may be
/// given back from any thread.
///
/// @par Lifetime
/// Not copyable or movable. The renewals keep the executor's `run()` from returning while the semaphore
/// exists and is not closed. Destroying it (or `close()`) stops the renewals and completes every waiter;
/// permits still held can be given back as usual, through a connection that is still open (a shared one),
/// but the server counts them only until the lease ends, one `lease` after the last renewal. A connection passed in must
/// outlive the semaphore or the semaphore sees Redis as unavailable.
template <class Executor = net::any_io_executor, class Clock = std::chrono::steady_clock, class Mutex = std::mutex>
class basic_shared_semaphore : public detail::semaphore_base<Executor, Clock, Mutex> {
  using base = detail::semaphore_base<Executor, Clock, Mutex>;
  using keeper_type = detail::lease_keeper<typename base::line_type, Executor, Clock, Mutex>;

 public:
  /// The same semaphore type on another executor (Asio's convention).
  template <class OtherExecutor>
  struct rebind_executor {
    /// The same semaphore type on `OtherExecutor`.
    using other = basic_shared_semaphore<OtherExecutor, Clock, Mutex>;
  };

  /// On an existing connection (shared with other limiters and users). `line` is its waiting line's
  /// (rein::line_options; another order than fifo, evict_oldest and partitions are refused).
  /// @throws std::invalid_argument naming the type, field and value if an option is out of range.
  basic_shared_semaphore(basic_connection<Executor>& shared, shared_semaphore_options options, line_options line = {})
      : base(shared, std::move(options), std::move(line)) {
    start_renewals();
  }

  /// On a Redis Cluster: its commands go to the master of its keys' hash slot.
  /// @throws std::invalid_argument naming the type, field and value if an option is out of range.
  basic_shared_semaphore(basic_cluster<Executor>& nodes, shared_semaphore_options options, line_options line = {})
      : base(nodes, std::move(options), std::move(line)) {
    start_renewals();
  }

  /// With a connection of its own, closed when the semaphore is destroyed.
  /// @throws std::invalid_argument naming the type, field and value if an option is out of range.
  basic_shared_semaphore(const Executor& ex, connection_options redis, shared_semaphore_options options,
                         line_options line = {})
      : base(ex, std::move(redis), std::move(options), std::move(line)) {
    start_renewals();
  }

  /// With a connection of its own on `context`'s executor.
  template <class ExecutionContext>
    requires std::is_convertible_v<ExecutionContext&, net::execution_context&>
  basic_shared_semaphore(ExecutionContext& context, connection_options redis, shared_semaphore_options options,
                         line_options line = {})
      : basic_shared_semaphore(context.get_executor(), std::move(redis), std::move(options), std::move(line)) {}

  ~basic_shared_semaphore() { keeper_->stop(); }

  /// Completes every waiter with rein::errc::closed, stops the renewals (the lease then ends by itself);
  /// later acquires fail the same way.
  void close() {
    keeper_->stop();
    base::close();
  }

  /// Sets the limit for every process sharing the key, stored in Redis (`prefix{key}:sem:limit`, kept until
  /// set again): each process's next request is judged by it, in place of its own options' `limit` (so a
  /// waiting process sees it within one poll interval). Permits held above a lowered limit stay valid; no
  /// more are granted until the count is below it. One request, not awaited; false if it could not be sent
  /// (Redis unavailable). A request for more than this process's `get_options().limit` still fails with
  /// rein::errc::exceeds_capacity; one for more than the stored limit fails with errc::server_error (it
  /// could only wait forever). True means on its way, not stored: an error reply is counted in
  /// snapshot().server_errors.
  /// @throws std::invalid_argument naming the type, field and value unless 1 <= limit < 2^31.
  bool set_limit(std::int64_t limit) {
    if (limit < 1 || limit > std::numeric_limits<std::int32_t>::max())
      throw std::invalid_argument("rein::redis::shared_semaphore: limit must be in [1, 2^31) permits, got " + std::to_string(limit));
    return this->send_setting({"SET", detail::tagged_key(this->get_options(), ":sem:limit"), std::to_string(limit)});
  }

  /// Counters and state, including round-trip latency and the lease, copied under the lock.
  shared_semaphore_snapshot snapshot() const { return this->scripted_snapshot(); }

  /// Whether this process's lease surely still holds now: Redis confirmed it (any reply to an acquire or a
  /// renewal) in answer to a request sent less than `lease` ago on the local clock, and no reply since said
  /// it was lost. While true, every permit granted since the last loss (`snapshot().leases_lost` unchanged
  /// since before its acquire) is counted by Redis; once false, a holder doing work that must not overlap
  /// with other processes' should stop or re-acquire. The renewals (every `lease / 3`) keep it true as long
  /// as each is answered within `2 * lease / 3` of being sent. Conservative: it assumes the local clock and
  /// Redis's run at the same rate, and is false when unsure (before the first reply, after a stall or an
  /// outage longer than the lease). Thread-safe (under the semaphore's lock).
  bool lease_held() const {
    return this->line().inspect([](const auto& p, const wait_stats&) { return p.model().lease_held(Clock::now()); });
  }

 private:
  void start_renewals() {
    const auto period = std::chrono::duration_cast<typename Clock::duration>(this->get_options().lease) / 3;
    keeper_ = std::make_shared<keeper_type>(this->get_executor(), this->line().weak_from_this(), period);
    keeper_->start();
  }

  std::shared_ptr<keeper_type> keeper_;
};

/// The thread-safe shared semaphore on any I/O executor.
using shared_semaphore = basic_shared_semaphore<>;

/// When Redis granted `p`, by the server's clock: its `TIME` when the script counted the permits, to the
/// microsecond (every process's grants on one clock, for auditing the fleet's bound without MONITOR).
/// The epoch (`time_point{}`) for an empty permit and one that fail_open granted locally. A part made by
/// `p.split(n)` keeps its grant's time.
/// @pre `p` was granted by a shared semaphore (other limiters note other things in a permit).
/// @par Thread Safety
/// As reading `p` (distinct permits from any threads).
inline std::chrono::system_clock::time_point server_time(const rein::permit& p) noexcept {
  const auto us = static_cast<std::int64_t>(rein::detail::permit_access::note(p));
  return std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::microseconds(us)));
}

}  // namespace rein::redis
