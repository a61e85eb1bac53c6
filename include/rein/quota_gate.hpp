// An awaitable quota gate: when the upstream says "stop" (a 429 or 503 with Retry-After), nothing starts
// until the pause ends, and the callers who waited resume spread out instead of all at once.
#pragma once

#include <rein/config.hpp>
#include <rein/detail/acquire_doors.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/detail/core_owner.hpp>
#include <rein/detail/format.hpp>
#include <rein/detail/invalid_option.hpp>
#include <rein/detail/limiter_core.hpp>
#include <rein/detail/line_setup.hpp>
#include <rein/detail/quota_gate_policy.hpp>
#include <rein/detail/random_seed.hpp>
#include <rein/error.hpp>
#include <rein/impl/line_instantiations.hpp>
#include <rein/line_options.hpp>
#include <rein/null_mutex.hpp>
#include <rein/observer.hpp>
#include <rein/queue_order.hpp>
#include <rein/retry_after.hpp>
#include <rein/try_result.hpp>
#include <rein/wait_stats.hpp>

#include REIN_ASIO_HEADER(any_io_executor.hpp)
#include REIN_ASIO_HEADER(async_result.hpp)
#include REIN_ASIO_HEADER(awaitable.hpp)
#include REIN_ASIO_HEADER(execution_context.hpp)
#include REIN_ASIO_HEADER(redirect_error.hpp)
#include REIN_ASIO_HEADER(use_awaitable.hpp)

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace rein {

/// The rule of a quota gate: how long a pause may be and how its waiters resume. The waiting line's options
/// (name, max_waiters, ...) are rein::line_options, the constructor's next argument; its line serves in fifo
/// order only (the jittered release is spread in arrival order), and line_options::observer also receives
/// the pauses started and ended (an end is seen by the first acquire, pause or wake-up of waiters after it).
struct quota_gate_options {
  /// The longest pause any request may impose; a longer one (an absurd Retry-After, a date years ahead) is
  /// cut to this and counted in `snapshot().capped`. Must be > 0. Default: 10 minutes.
  std::chrono::nanoseconds max_pause{std::chrono::minutes{10}};
  /// The callers who waited out a pause resume spread over a window of `jitter` times the pause's length
  /// (from the moment the gate closed to the moment it reopens), at most `max_jitter`. In [0, 1]; 0 releases
  /// them all at the pause's end. Default: 0.1 (a 30 s pause spreads its waiters over 3 s).
  double jitter = 0.1;
  /// Upper bound of the spreading window. Must be >= 0. Default: 30 s.
  std::chrono::nanoseconds max_jitter{std::chrono::seconds{30}};
  /// Seed of the jitter; the same seed gives the same release instants. Default (nullopt): drawn from
  /// std::random_device, so that processes sharing an upstream do not resume in lockstep.
  std::optional<std::uint64_t> seed{};
};

/// A quota gate's state, copied out under its lock.
template <class TimePoint>
struct basic_quota_gate_snapshot : wait_stats {
  TimePoint paused_until = TimePoint::min();  ///< when the current or latest pause ends; min() if never paused
  bool paused = false;                        ///< whether the pause was still in effect at the snapshot
  std::uint64_t pause_requests = 0;           ///< requests for a pause ending in the future
  std::uint64_t pauses = 0;                   ///< requests that moved paused_until later (the others ended sooner)
  std::uint64_t capped = 0;                   ///< requests cut to max_pause
  std::chrono::nanoseconds jitter_window{0};  ///< the window the latest resumption was spread over
};

/// One line: `paused=no pauses=1 pause_requests=2 capped=0 jitter_window=100ms waiting=0 acquired=3 ...`.
template <class TimePoint>
std::ostream& operator<<(std::ostream& os, const basic_quota_gate_snapshot<TimePoint>& s) {
  os << "paused=" << (s.paused ? "yes" : "no") << " pauses=" << s.pauses << " pause_requests=" << s.pause_requests
     << " capped=" << s.capped << " jitter_window=";
  detail::write_duration(os, s.jitter_window);
  os << ' ';
  detail::write_wait_stats(os, s);
  return os;
}

/// The snapshot of a gate on std::chrono::steady_clock.
using quota_gate_snapshot = basic_quota_gate_snapshot<std::chrono::steady_clock::time_point>;

/// An awaitable quota gate: when an upstream says "stop" (a 429 or 503 with Retry-After), `pause_for(d)`
/// closes the gate for everyone, and callers of `acquire()` wait until it reopens.
///
/// ```
/// rein::quota_gate gate(io);
/// co_await gate.acquire();                     // at once unless a pause is in effect
/// auto response = co_await call();
/// if (response.status == 429) gate.on_retry_after(response.header("Retry-After"), 1s);
/// ```
/// (From tests/async/doc_snippets.cpp, which compiles and runs it.)
///
/// Rules (a 429 with Retry-After, RFC 9110 section 10.2.3, handled for every caller of the host at once):
/// - Pauses only extend: the latest end wins. A Retry-After of 90 s at 0.00 and one of 60 s at 0.01 leave
///   the gate closed until 90.00, not 60.01.
/// - `max_pause` caps absurd requests (visible in `snapshot().capped`).
/// - Callers arriving while the gate is closed wait in FIFO order, with deadlines, cancellation,
///   `max_waiters` and close() as every rein limiter. When the pause ends they resume spread over a jitter
///   window (a fraction of the pause, see quota_gate_options) instead of in one burst that would trip the
///   upstream again (a thundering herd after the pause). The spread is stratified: of the N callers
///   that arrived during the pause, the k-th resumes at a random instant within the k-th of N equal slices
///   of the window, so arrival order is kept and the release rate is even. Callers arriving after the pause
///   ended go at once, or straight after those still being released (they are not overtaken).
/// - There is no resume(): a pause ends when its time comes.
///
/// Nothing is taken or held, so the completion signature is `void(error_code)` as for a rate limiter; the
/// count `n` of every acquire is accepted so that the gate composes with weighted limiters, and ignored.
///
/// @tparam Executor the I/O executor; completions default to it.
/// @tparam Clock    the clock of pauses and deadlines (std::chrono::steady_clock; rein::testing::manual_clock
///                  in tests).
/// @tparam Mutex    std::mutex (default): safe from many threads and strands; rein::null_mutex: one thread or
///                  strand only.
///
/// @par Thread Safety
/// With std::mutex, every member function may be called concurrently, except destruction (which, as for
/// Asio's I/O objects, must not race with its own operations, their cancellation signals included).
/// With null_mutex, all use must happen on one thread or strand.
///
/// @par Lifetime
/// Movable, not copyable (as Asio's I/O objects; `as_default_on` needs it). Destroying it completes every
/// waiter with `net::error::operation_aborted`.
template <class Executor = net::any_io_executor, class Clock = std::chrono::steady_clock, class Mutex = std::mutex>
class basic_quota_gate {
  using policy_type = detail::quota_gate_policy<Clock>;
  using core_type = detail::limiter_core<policy_type, Executor, Clock, Mutex, void(error_code)>;
  using tickets_type = detail::quota_tickets<typename Clock::rep>;

 public:
  /// The executor that runs completion handlers without an associated executor of their own.
  using executor_type = Executor;
  /// The clock that times the rule and the deadlines.
  using clock_type = Clock;
  /// A point in time of `clock_type`.
  using time_point = typename Clock::time_point;
  /// A duration of `clock_type`.
  using duration = typename Clock::duration;
  /// What snapshot() returns.
  using snapshot_type = basic_quota_gate_snapshot<time_point>;

  /// The gate type when rebound to another executor.
  template <class OtherExecutor>
  struct rebind_executor {
    /// The same limiter type on `OtherExecutor`.
    using other = basic_quota_gate<OtherExecutor, Clock, Mutex>;
  };

  /// The rule it takes.
  using rule_type = quota_gate_options;

  /// Constructs an open gate, completing operations on `ex` by default; `line` is its waiting line's
  /// (rein::line_options; an order other than fifo and partitions are refused).
  /// @throws std::invalid_argument naming the type, the field and the value when an option is out of range.
  explicit basic_quota_gate(const executor_type& ex, const quota_gate_options& rule = {}, line_options line = {});

  /// Constructs an open gate on an execution context (an io_context).
  template <class ExecutionContext>
    requires std::is_convertible_v<ExecutionContext&, net::execution_context&>
  explicit basic_quota_gate(ExecutionContext& context, const quota_gate_options& rule = {}, line_options line = {})
      : basic_quota_gate(context.get_executor(), rule, std::move(line)) {}

  basic_quota_gate(const basic_quota_gate&) = delete;
  basic_quota_gate& operator=(const basic_quota_gate&) = delete;

  /// Moves the gate: its waiters, pause and counters stay with it (they live in its shared state, not in
  /// this object). The moved-from object may only be destroyed or assigned to.
  basic_quota_gate(basic_quota_gate&&) noexcept = default;

  /// Destroys this gate's state as the destructor does, then takes `other`'s.
  basic_quota_gate& operator=(basic_quota_gate&&) noexcept = default;

  /// Completes every waiter with `net::error::operation_aborted`.
  ~basic_quota_gate() = default;

  /// The executor given at construction.
  executor_type get_executor() const noexcept { return core_->get_executor(); }

  /// The name given in the options (empty if none).
  const std::string& name() const noexcept { return core_->name(); }

  /// True, at once, if the gate is open and nobody waits (a waiter is never overtaken). Never waits, never
  /// allocates. Otherwise status() is try_status::busy (paused, or others wait; retry_after() is the time
  /// until the pause ends, before any jitter) or closed (after close()). `n` is ignored.
  try_result try_acquire(std::size_t n = 1) { return doors().try_acquire(n); }

  /// As try_acquire(n), decided at `now` instead of at a clock read of its own (one reading shared by the
  /// stages of a call). Precondition: `now` is not later than `clock_type::now()`: a later one would let a
  /// call through a pause that has not ended; an earlier one only ends a pause later. retry_after() counts
  /// from `now` (nanoseconds::max() when that distance does not fit, as from time_point::min()).
  try_result try_acquire_at(std::size_t n, time_point now) { return doors().try_acquire(n, &now); }

  /// Waits until the gate is open. The initiating function; every Asio completion token works.
  ///
  /// @param n     ignored (accepted so that the gate composes with weighted limiters).
  /// @param token completion token; signature `void(error_code)`. Default: `deferred`.
  ///
  /// Errors: errc::queue_full (max_waiters waiting, at once), errc::timed_out, errc::closed,
  /// `net::error::operation_aborted` (cancelled, or the gate was destroyed). The handler is never invoked
  /// from inside this function: it goes through its associated executor.
  ///
  /// @par Per-Operation Cancellation
  /// terminal, partial and total: a waiting operation is removed and completes with operation_aborted
  /// (nothing was taken, nothing is lost). A cancellation that arrives after the release but before the
  /// handler runs takes the release back (the handler gets operation_aborted too); once the handler runs,
  /// it was let through.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code)) Token = default_token_t>
  auto async_acquire(std::size_t n = 1, Token&& token = Token{}) {
    return doors().async_acquire_until(n, time_point::max(), std::forward<Token>(token));
  }

  /// As async_acquire, failing with errc::timed_out if the gate does not let the caller through within
  /// `timeout` (a timeout too long to represent, such as duration::max(), means none).
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code)) Token = default_token_t>
  auto async_acquire_for(std::size_t n, duration timeout, Token&& token = Token{}) {
    return doors().async_acquire_for(n, timeout, std::forward<Token>(token));
  }

  /// As async_acquire, failing with errc::timed_out if not through by `deadline` (time_point::max():
  /// never). A deadline before the current pause's end fails at once (pauses never shorten); one after it
  /// may still expire during the jitter. A release due at the deadline's very instant wins.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code)) Token = default_token_t>
  auto async_acquire_until(std::size_t n, time_point deadline, Token&& token = Token{}) {
    return doors().async_acquire_until(n, deadline, std::forward<Token>(token));
  }

  /// Waits inside a coroutine: `co_await gate.acquire();`. When the gate is open and nobody waits, returns
  /// without suspending through the scheduler. Throws `rein::system_error` with the errors of async_acquire.
  net::awaitable<void> acquire(std::size_t n = 1) { return doors().acquire_until(n, time_point::max()); }

  /// As acquire, throwing errc::timed_out if not through within `timeout` (a timeout too long to represent,
  /// such as duration::max(), means none).
  net::awaitable<void> acquire_for(std::size_t n, duration timeout) { return doors().acquire_for(n, timeout); }

  /// As acquire, throwing errc::timed_out if not through by `deadline`. Behind other waiters it does not try
  /// first (that would fail, and cost a lock).
  net::awaitable<void> acquire_until(std::size_t n, time_point deadline) { return doors().acquire_until(n, deadline); }

  /// Closes the gate for `d` from now, unless it is already closed until later (pauses only extend).
  /// A pause longer than max_pause is cut to it. `d <= 0` is a wait already over and changes nothing: the
  /// rule of every pause in rein (throttle_guard::reject, a Retry-After of `0` or a date already past).
  /// @returns when the gate reopens (the latest pause's end; in the past if it is open).
  time_point pause_for(duration d) {
    return core_->update([&](policy_type& p, time_point now) {
      if (d > duration::zero()) p.pause_until(detail::add_saturated(now, d), now);
      return publish(p);
    });
  }

  /// Closes the gate until `t`, unless it is already closed until later. A `t` beyond now + max_pause is cut
  /// to it; a `t` not after now changes nothing.
  /// @returns when the gate reopens.
  time_point pause_until(time_point t) {
    return core_->update([&](policy_type& p, time_point now) {
      p.pause_until(t, now);
      return publish(p);
    });
  }

  /// Applies an upstream's Retry-After field value (RFC 9110 section 10.2.3, parsed by
  /// rein::parse_retry_after): delta-seconds or an HTTP-date pauses for that long; an empty, negative or
  /// unparseable value (`-5`, `soon`) pauses for `default_pause`; `0` or a date already past pauses not at
  /// all (the upstream says "go ahead"; an existing pause still stands).
  ///
  /// @param value         the field value, as received.
  /// @param default_pause  the pause when the value says nothing usable (1 to 5 s is usual).
  /// @param wall_now       the current wall-clock time, the origin of an HTTP-date (a parameter for tests).
  /// @returns when the gate reopens.
  time_point on_retry_after(std::string_view value, duration default_pause,
                            std::chrono::system_clock::time_point wall_now = std::chrono::system_clock::now()) {
    return pause_for(detail::retry_after_pause(value, default_pause, wall_now));
  }

  /// Completes every waiter with errc::closed; later acquires fail the same way and try_acquire returns
  /// false. Idempotent. (Closing is for shutdown; a pause is pause_for.)
  void close() { core_->close(); }

  /// When the current or latest pause ends (time_point::min() if there never was one).
  time_point paused_until() const {
    return core_->inspect([](const policy_type& p, const wait_stats&) { return p.paused_until; });
  }

  /// Whether a pause is in effect now.
  bool is_paused() const { return Clock::now() < paused_until(); }

  /// True when the gate is indistinguishable from a new one: open and nobody waiting (rein::keyed evicts
  /// such gates). Counters are not compared.
  bool idle() const {
    const time_point now = Clock::now();
    return core_->inspect([now](const policy_type& p, const wait_stats& w) { return w.waiting == 0 && now >= p.paused_until; });
  }

  /// Counters and state, copied under the lock in O(1).
  snapshot_type snapshot() const {
    const time_point now = Clock::now();
    return core_->inspect([now](const policy_type& p, const wait_stats& w) {
      snapshot_type s;
      static_cast<wait_stats&>(s) = w;
      s.paused_until = p.paused_until;
      s.paused = now < p.paused_until;
      s.pause_requests = p.pause_requests;
      s.pauses = p.pauses;
      s.capped = p.capped;
      s.jitter_window = p.batch_window;
      return s;
    });
  }

 private:
  // Every door is written once, in detail/acquire_doors.hpp; the gate counts its waiters by ticket.
  detail::line_doors<core_type, detail::quota_counter<Clock>> doors() const noexcept {
    return {core_.get(), "rein::quota_gate", detail::quota_counter<Clock>{tickets_.get()}};
  }

  time_point publish(const policy_type& p) noexcept {
    tickets_->paused_until_ticks.store(p.paused_until.time_since_epoch().count(), std::memory_order_relaxed);
    return p.paused_until;
  }

  template <class Value>
  [[noreturn]] static void fail(std::string_view rule, Value got) {
    detail::throw_invalid("rein::quota_gate", rule, detail::show(got));
  }

  static duration validated_max_pause(const quota_gate_options& o) {
    if (o.max_pause <= o.max_pause.zero()) fail("max_pause must be > 0", o.max_pause);
    // A clock coarser than nanoseconds rounds the cap up to a whole tick.
    return std::chrono::ceil<duration>(o.max_pause);
  }

  static double validated_jitter(const quota_gate_options& o) {
    if (!(o.jitter >= 0.0 && o.jitter <= 1.0)) fail("jitter must be in [0, 1]", o.jitter);
    return o.jitter;
  }

  static std::chrono::nanoseconds validated_max_jitter(const quota_gate_options& o) {
    if (o.max_jitter < o.max_jitter.zero()) fail("max_jitter must be >= 0", o.max_jitter);
    return o.max_jitter;
  }

  static constexpr std::string_view release_order = "its release is spread in arrival order";

  std::shared_ptr<tickets_type> tickets_;  // shared with the policy, which may outlive this object
  detail::core_owner<core_type> core_;
};

// Members defined outside the class, so that REIN_SEPARATE_COMPILATION compiles them in one unit only: a
// unit that declares the class extern then neither instantiates them nor copies them in (config.hpp).
template <class Executor, class Clock, class Mutex>
REIN_SEPARATE_INLINE basic_quota_gate<Executor, Clock, Mutex>::basic_quota_gate(const executor_type& ex,
                                                                                const quota_gate_options& rule,
                                                                                line_options line)
    : tickets_(std::make_shared<tickets_type>()),
      // The jittered release numbers a pause's waiters in arrival order, from the head: in lifo order the
      // head is the newest, and every older waiter would be released at the batch's end at once.
      // A named gate's option errors name it, as its line's do (worded at once: the name is moved inside).
      core_(detail::renaming_errors("rein::quota_gate", {detail::describe("rein::quota_gate", line.name)}, [&] {
        return detail::core_owner<core_type>(
            ex,
            detail::line_of("rein::quota_gate", std::move(line),
                            {.fifo_only = release_order, .no_sojourn = detail::paced_line}),
            validated_max_pause(rule), validated_jitter(rule), validated_max_jitter(rule),
            rule.seed ? *rule.seed : detail::random_seed(), tickets_);
      })) {}

/// The thread-safe quota gate on any I/O executor and std::chrono::steady_clock.
using quota_gate = basic_quota_gate<>;

/// The single-threaded quota gate: no locking; use from one thread or strand only.
using single_thread_quota_gate = basic_quota_gate<net::any_io_executor, std::chrono::steady_clock, null_mutex>;

/// The instantiations behind `quota_gate`, compiled once with REIN_SEPARATE_COMPILATION (rein/config.hpp).
#define REIN_DETAIL_QUOTA_GATE_INSTANTIATIONS(kind)                                                     \
  REIN_DETAIL_LINE_INSTANTIATIONS(kind, detail::limiter_core<detail::quota_gate_policy<std::chrono::steady_clock>, \
                                                            net::any_io_executor, std::chrono::steady_clock,     \
                                                            std::mutex, void(error_code)>)                       \
  kind template class basic_quota_gate<>;

#if defined(REIN_SEPARATE_COMPILATION)
REIN_DETAIL_QUOTA_GATE_INSTANTIATIONS(extern)
#if defined(REIN_DETAIL_KEYED_INSTANTIATION)  // rein/keyed.hpp came first
REIN_DETAIL_KEYED_INSTANTIATION(extern, quota_gate)
#endif
#endif

}  // namespace rein
