// One quota gate shared by many processes and machines: a pause that one process learns from an upstream
// (a 429 or 503 with Retry-After) is stored in Redis, and every process waits it out.
#pragma once

#include <rein/config.hpp>
#include <rein/line_options.hpp>
#include <rein/redis/connection.hpp>
#include <rein/redis/detail/gate_admission.hpp>
#include <rein/redis/detail/scripted_admission.hpp>
#include <rein/redis/detail/scripted_transport.hpp>
#include <rein/retry_after.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace rein::redis {

namespace detail {

/// The Lua script. One hash per gate: `until`, the end of the latest pause, and `release`, when every
/// process resumes (`until` plus the jitter its writer drew), both in server microseconds since the Unix
/// epoch. A pause (ARGV[1] > 0 microseconds, ARGV[2] its jitter) is stored if it ends later than the stored
/// one; the release never moves earlier (pauses only extend). An admission (ARGV[1] = 0) is allowed once
/// the server's clock has reached the release. Only the server's clock is read (TIME; effects replication,
/// as the token bucket's script). The key expires a millisecond after the release.
///
/// Returns {allowed (1/0), retry_after (microseconds until the release; 0 if allowed), release (0: none),
/// the server's TIME (microseconds since the Unix epoch)}.
inline constexpr std::string_view quota_gate_script = R"lua(
if redis.replicate_commands then redis.replicate_commands() end
local pause = tonumber(ARGV[1])
local jitter = tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local state = redis.call('HMGET', KEYS[1], 'until', 'release')
local release = tonumber(state[2]) or 0
if pause > 0 then
  local ends = now + pause
  if not state[1] or ends > tonumber(state[1]) then
    release = math.max(release, ends + jitter)
    redis.call('HSET', KEYS[1], 'until', ends, 'release', release)
    redis.call('PEXPIRE', KEYS[1], math.ceil((release - now) / 1000) + 1)
  end
  return {1, 0, release, now}
end
if release > now then
  return {0, release - now, release, now}
end
return {1, 0, release, now}
)lua";

/// How the gate's messages become commands: EVALSHA of quota_gate_script on the gate's key.
struct gate_commands {
  static constexpr std::string_view script = quota_gate_script;

  explicit gate_commands(const shared_quota_gate_options& o) : key(tagged_key(o, ":pause")) {}

  /// The key whose Redis Cluster slot holds every key of the script.
  const std::string& routing_key() const noexcept { return key; }

  std::string command(const message& m, std::string_view sha) const {
    if (m.what == message::kind::pause)
      return encode_command({"EVALSHA", sha, "1", key, std::to_string(m.n), std::to_string(m.extra)});
    return encode_command({"EVALSHA", sha, "1", key, "0", "0"});
  }

  std::string key;
};

template <class Executor, class Clock, class Mutex>
using gate_base = basic_scripted_limiter<gate_admission<Clock>, gate_commands, Executor, Clock, Mutex>;

}  // namespace detail

/// A quota gate shared by every process that names the same key: when an upstream tells one process to wait
/// (a 429 or 503 with Retry-After), `on_retry_after` or `pause_for` stores the pause in Redis, and every
/// process's `acquire` waits until the pause's release.
///
/// Use: `co_await gate.acquire();` before each call to the host (one round trip: is the host paused?), and on a
/// 429 or 503, `gate.on_retry_after(retry_after_field, 1s);`, as with rein::quota_gate.
///
/// The pause: its end is the server's clock plus the pause (TIME inside the script), so the writer's clock
/// and the readers' clocks do not matter; the later of the stored and the new pause wins (pauses only
/// extend, as in rein::quota_gate). Its release is its end plus a jitter drawn once, by the writer, and
/// stored with it (a random part of `jitter` times the pause, at most `max_jitter`): every process resumes
/// at the same instant. The writer holds its own callers at once, before Redis has answered.
///
/// Admission: each acquire is one round trip (EVALSHA of detail::quota_gate_script, pipelined up to
/// `max_in_flight`). While a pause holds, Redis refuses with the time to the release; the caller waits in
/// this process, FIFO on rein's wait line, and the line asks again at the release: no polling. While that
/// hold lasts, a caller whose deadline comes before the release fails at once with rein::errc::timed_out.
/// Bound: no acquire is admitted by Redis between a pause's store and its release (server clock).
///
/// Rule from: Retry-After (RFC 9110 section 10.2.3) applied fleet-wide, as rein::quota_gate applies it
/// in-process; seed advice on shared limits: "always keep 429 handling in the client too". The waiter
/// discipline is that of every rein limiter.
///
/// Failures (see failure_policy): while Redis cannot be asked, `fail_closed` completes waiting and new
/// acquires with errc::unavailable; `fail_open` admits every acquire except during a pause this process
/// wrote. A pause written while Redis is unreachable is lost for the other processes (best effort).
///
/// Members: the constructors, `try_acquire` (always busy), `async_acquire`, `async_acquire_for`,
/// `async_acquire_until` (completion signature `void(error_code)`, every completion token), `acquire`,
/// `acquire_for`, `acquire_until`, `close`, `options`, `get_executor` and `connection_snapshot` are those of
/// every scripted limiter (detail::basic_scripted_limiter, documented there); errors: queue_full, closed,
/// timed_out, errc::unavailable, errc::server_error, operation_aborted. n is not counted (any n passes when
/// the gate is open). Cancellation (terminal, partial, total) completes at once.
///
/// @tparam Executor the I/O executor; completions default to it. With a shared connection, the connection's.
/// @tparam Clock    the clock of deadlines and local waiting (std::chrono::steady_clock). Redis's clock
///                  times the pauses.
/// @tparam Mutex    std::mutex (default), or rein::null_mutex when everything runs on one thread.
///
/// @par Thread Safety
/// With std::mutex, every member function may be called concurrently, except destruction.
///
/// @par Lifetime
/// Not copyable or movable. Destroying it completes every waiter with `operation_aborted`. A connection
/// passed in must outlive the gate or the gate sees Redis as unavailable.
template <class Executor = net::any_io_executor, class Clock = std::chrono::steady_clock, class Mutex = std::mutex>
class basic_shared_quota_gate : public detail::gate_base<Executor, Clock, Mutex> {
  using base = detail::gate_base<Executor, Clock, Mutex>;

 public:
  /// The same gate type on another executor (Asio's convention).
  template <class OtherExecutor>
  struct rebind_executor {
    /// The same gate type on `OtherExecutor`.
    using other = basic_shared_quota_gate<OtherExecutor, Clock, Mutex>;
  };

  /// The constructors: (connection&, rule, line_options = {}) on a shared connection; (cluster&, rule,
  /// line_options = {}) on a Redis Cluster, talking to the master of its key's slot; (executor or execution
  /// context, connection_options, rule, line_options = {}) with a connection of its own. The line serves in
  /// fifo order and refuses the newest when full (rein::line_options: another order, evict_oldest and
  /// partitions are refused).
  /// @throws std::invalid_argument naming the type, field and value if an option is out of range.
  using base::base;

  /// Pauses the gate for every process for `d` from now (server clock), plus the jitter drawn here, unless
  /// a pause already stored ends later. A pause longer than max_pause is cut to it; `d <= 0` is a wait
  /// already over and changes nothing (as quota_gate::pause_for). One request, not awaited, best effort (lost for the other processes if Redis is unavailable;
  /// this process holds its own callers in any case).
  /// @returns when this process resumes at the earliest, by `Clock` (its own pause's release).
  typename Clock::time_point pause_for(typename Clock::duration d) {
    return this->line().update([&](detail::gate_admission<Clock>& p, typename Clock::time_point now) {
      if (d > Clock::duration::zero()) p.send(p.model().pause(d, now));
      return p.model().local_release();
    });
  }

  /// Applies an upstream's Retry-After field value (RFC 9110 section 10.2.3, parsed by
  /// rein::parse_retry_after) to every process: delta-seconds or an HTTP-date pauses for that long; an empty,
  /// negative or unparseable value pauses for `default_pause`; `0` or a date already past pauses not at all.
  ///
  /// @param value         the field value, as received.
  /// @param default_pause the pause when the value says nothing usable (1 to 5 s is usual).
  /// @param wall_now      the current wall-clock time, the origin of an HTTP-date (a parameter for tests).
  /// @returns as pause_for.
  typename Clock::time_point on_retry_after(std::string_view value, typename Clock::duration default_pause,
                                            std::chrono::system_clock::time_point wall_now = std::chrono::system_clock::now()) {
    return pause_for(rein::detail::retry_after_pause(value, default_pause, wall_now));
  }

  /// Counters and state, including round-trip latency and the latest release seen, copied under the lock.
  shared_quota_gate_snapshot snapshot() const { return this->scripted_snapshot(); }
};

/// The thread-safe shared quota gate on any I/O executor.
using shared_quota_gate = basic_shared_quota_gate<>;

}  // namespace rein::redis
