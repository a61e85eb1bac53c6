// An awaitable concurrency limiter whose limit is found by feedback.
#pragma once

#include <rein/algo/aimd.hpp>
#include <rein/algo/circuit.hpp>
#include <rein/algo/gradient.hpp>
#include <rein/algo/limit_algorithm.hpp>
#include <rein/algo/tuned_aimd.hpp>
#include <rein/completion_hint.hpp>
#include <rein/config.hpp>
#include <rein/detail/acquire_doors.hpp>
#include <rein/detail/adaptive_policy.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/detail/core_owner.hpp>
#include <rein/detail/format.hpp>
#include <rein/detail/invalid_option.hpp>
#include <rein/detail/limiter_core.hpp>
#include <rein/detail/line_setup.hpp>
#include <rein/error.hpp>
#include <rein/line_view.hpp>
#include <rein/line_options.hpp>
#include <rein/null_mutex.hpp>
#include <rein/observer.hpp>
#include <rein/outcome.hpp>
#include <rein/partition.hpp>
#include <rein/permit.hpp>
#include <rein/queue_order.hpp>
#include <rein/try_result.hpp>
#include <rein/wait_stats.hpp>

#include REIN_ASIO_HEADER(any_io_executor.hpp)
#include REIN_ASIO_HEADER(async_result.hpp)
#include REIN_ASIO_HEADER(awaitable.hpp)
#include REIN_ASIO_HEADER(execution_context.hpp)
#include REIN_ASIO_HEADER(redirect_error.hpp)
#include REIN_ASIO_HEADER(use_awaitable.hpp)

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace rein {

/// An adaptive limiter's circuit: fail fast while the limit sits at its floor under congestion
/// (see algo::circuit_options for the rule, its sources and why it is off by default).
using circuit_options = algo::circuit_options;
/// Where an adaptive limiter's circuit is: closed, open, half_open.
using circuit_state = algo::circuit_state;

/// An adaptive limiter's own options, beyond its rule (the algorithm's options, e.g. `algo::aimd_options`)
/// and its waiting line's (rein::line_options): how it reads outcomes, its circuit and its idle restart. The
/// constructor takes them last: `adaptive_limiter(io, {.initial_limit = 10}, {.name = "db"}, {.circuit =
/// ...})`, as rein::keyed takes its own.
struct adaptive_limiter_options {
  /// Maps a call's status code to an outcome, for `complete(permit&, int)`. Default: rein::classify_http_status
  /// (408, 429, 503, 504 are congestion; 2xx and 3xx success; the rest ignored). Replace it when a dependency
  /// signals overload differently (say, a 500 with a known body). Must not be empty. Called outside the lock.
  std::function<outcome(int)> classify = classify_http_status;

  /// Fail fast at the floor (an open circuit): after `circuit.open_after` consecutive congestion outcomes
  /// that leave the limit at its floor, every waiter and every new acquire completes at once with
  /// errc::upstream_unavailable (try_acquire: try_status::unavailable) for `circuit.open_for`; then
  /// `circuit.probes` calls are granted (half-open: acquires wait for room as usual until that many were
  /// granted, later ones fail at once); the first probe to succeed closes the circuit, the first to report
  /// congestion opens it again. Each transition is an event (circuit_opened, circuit_half_open,
  /// circuit_closed); the open-to-half-open one is seen by the first acquire or release after the open
  /// period. Default: off (open_after 0). See algo::circuit_options.
  circuit_options circuit{};

  /// The restart window after an idle spell (TCP's, RFC 2861): each whole `idle_restart` with nothing in
  /// flight halves the calls admitted at once when demand returns, down to the algorithm's `initial_limit`;
  /// each success then adds one call back (the window doubles per round trip) until the learned limit is
  /// reached. A limit learned before the spell is kept, but not all of it is trusted at once: the capacity may
  /// have dropped while nobody was calling. An empty limiter always admits one request that fits the limit.
  /// Default: 1 s (RFC 6298's minimum retransmission timeout, the idle time after which TCP restarts);
  /// 0: off (the whole limit at once, whatever the spell). >= 0.
  std::chrono::nanoseconds idle_restart = std::chrono::seconds(1);
};

/// An adaptive limiter's state, copied out under its lock in O(1) (O(partitions) with partitions).
///
/// Read the numbers together: sustained `at_ceiling` means the ceiling, not the dependency,
/// is the constraint; sustained `at_floor` with congestion means the dependency is in trouble; `utilisation`
/// well below 1 means the limit is not the bottleneck. Alert on `decreases` (its rate) and on `at_floor`.
struct adaptive_limiter_snapshot : wait_stats {
  double limit = 0.0;             ///< the algorithm's current limit, in calls (fractional)
  /// How many calls may hold a slot at once: floor(limit), or fewer in a restart window after an idle spell
  /// (adaptive_limiter_options::idle_restart)
  std::size_t admitted = 0;
  double min_limit = 0.0;         ///< the floor
  double max_limit = 0.0;         ///< the ceiling
  std::size_t in_flight = 0;      ///< slots held now, including grants not yet delivered
  double utilisation = 0.0;       ///< in_flight / max(1, limit)
  std::uint64_t decreases = 0;    ///< samples that lowered the limit
  std::uint64_t increases = 0;    ///< samples that raised the limit
  bool at_floor = false;          ///< floor(limit) <= min_limit
  bool at_ceiling = false;        ///< floor(limit) >= max_limit
  circuit_state circuit = circuit_state::closed;  ///< the circuit now (always closed when it is off)
  std::uint64_t circuit_opens = 0;                ///< how many times the circuit opened
  std::uint64_t success_total = 0;     ///< permits completed with outcome::success
  std::uint64_t congestion_total = 0;  ///< permits completed with outcome::congestion
  /// permits completed with outcome::ignored or released without an outcome, and grants taken back before
  /// their handler ran (cancelled after the grant, or the limiter destroyed meanwhile)
  std::uint64_t ignored_total = 0;
  /// Service time of every permit completed with success or congestion: from the grant to the report (the
  /// latency the algorithm is fed, queue time excluded). Recorded always: the clock is read anyway.
  duration_histogram service{};
  /// With line_options::partitions: the rest, then each partition, their guarantees of the current limit.
  std::vector<partition_snapshot> partitions{};
};

/// One line: `limit=12.5 admitted=12 in_flight=10 utilisation=0.8 floor=1 ceiling=100 decreases=2 ...`.
inline std::ostream& operator<<(std::ostream& os, const adaptive_limiter_snapshot& s) {
  os << "limit=";
  detail::write_number(os, s.limit);
  os << " admitted=" << s.admitted << " in_flight=" << s.in_flight << " utilisation=";
  detail::write_number(os, s.utilisation);
  os << " floor=";
  detail::write_number(os, s.min_limit);
  os << " ceiling=";
  detail::write_number(os, s.max_limit);
  if (s.at_floor) os << " at_floor";
  if (s.at_ceiling) os << " at_ceiling";
  if (s.circuit != circuit_state::closed) os << " circuit=" << to_string(s.circuit);
  if (s.circuit_opens != 0) os << " circuit_opens=" << s.circuit_opens;
  os << " decreases=" << s.decreases << " increases=" << s.increases << " success=" << s.success_total
     << " congestion=" << s.congestion_total << " ignored=" << s.ignored_total << " service[";
  detail::write_histogram(os, s.service);
  os << "] ";
  detail::write_wait_stats(os, s);
  return os;
}

/// An awaitable concurrency limiter whose limit is found by feedback from the calls it admits.
///
/// `co_await limiter.acquire()` inside `net::awaitable<>` yields a rein::permit for one call; the caller
/// reports how the call went with `permit.complete(outcome)` (or `limiter.complete(permit, status)`), which
/// gives the slot back and feeds the algorithm one sample:
/// - `success`: latency is measured by the limiter, from the grant to the report, never including time spent
///   waiting for the slot;
/// - `congestion`: a timeout, 429, 503, 504 ("you are sending too much");
/// - `ignored`: says nothing about capacity (400, 401, 404, caller cancelled); no sample. A permit released or
///   destroyed without an outcome counts as ignored.
///
/// Admission is `in_flight < floor(limit)`, re-checked whenever the limit moves either way: a release that raises the
/// limit admits waiters at once; a cut admits nobody until enough calls have finished, and never takes a slot back.
/// Waiting is FIFO (or LIFO, or by priority class: line_options::order) with per-operation deadlines,
/// cancellation, `max_waiters` and `close()`, exactly as rein::semaphore (the same waiter core). The limit
/// always lies in the algorithm's [min_limit, max_limit].
///
/// A call whose latency follows the work it asks for (an LLM answer's tokens, a payload's bytes) may say how
/// much work that was when it completes, so that a long answer is not read as a queue:
/// `permit.complete(outcome::success, {.work = tokens})` (rein::completion_hint). The sample then carries
/// it (`algo::basic_sample::work`), and every rein algorithm judges the latency per unit of work. A work of 0 is a call that did no work: its outcome counts, its latency is not
/// judged. A negative, NaN or infinite work throws std::invalid_argument before the permit lets go of its
/// slot.
///
/// Each sample also carries `in_flight` as it was right after that call's grant, this call included
/// (Netflix concurrency-limits' convention, used by the algorithms' app-limited guards): the permit carries
/// the count from its grant, so calls granted at the same instant each report their own, in any order
/// (a split permit's parts both report the whole grant's).
///
/// @tparam Algorithm a rein::algo::limit_algorithm (algo::aimd, algo::tuned_aimd, algo::gradient,
///                   algo::vegas, algo::pid, algo::windowed_aimd, or your own), on any clock: the limiter
///                   uses `Algorithm::rebind_clock<Clock>`.
/// @tparam Executor  the I/O executor; completions default to it.
/// @tparam Clock     measures latency and deadlines (std::chrono::steady_clock; rein::testing::manual_clock
///                   in tests).
/// @tparam Mutex     std::mutex (default): safe to use from many threads and strands; rein::null_mutex: one
///                   thread or strand only.
///
/// @par Thread Safety
/// With std::mutex, every member function may be called concurrently, except destruction (which, as for
/// Asio's I/O objects, must not race with its own operations, their cancellation signals included). With
/// null_mutex, all use must happen on one thread or strand. The algorithm runs under the lock and never sees
/// concurrent calls.
///
/// @par Lifetime
/// Movable, not copyable. Destroying it completes every waiter with `net::error::operation_aborted`.
/// Permits may outlive it: giving one back later is safe and changes nothing any more.
template <class Algorithm, class Executor = net::any_io_executor, class Clock = std::chrono::steady_clock,
          class Mutex = std::mutex>
class basic_adaptive_limiter {
 public:
  /// The executor that runs completion handlers without an associated executor of their own.
  using executor_type = Executor;
  /// The clock that times the rule and the deadlines.
  using clock_type = Clock;
  /// A point in time of `clock_type`.
  using time_point = typename Clock::time_point;
  /// A duration of `clock_type`.
  using duration = typename Clock::duration;
  /// The algorithm as the limiter holds it: on the limiter's clock.
  using algorithm_type = typename Algorithm::template rebind_clock<Clock>;
  /// The algorithm's options type, as the constructor takes them.
  using algorithm_options = typename algorithm_type::options;
  /// The rule it takes: the algorithm's options.
  using rule_type = algorithm_options;
  static_assert(algo::limit_algorithm<algorithm_type>, "rein: Algorithm must model rein::algo::limit_algorithm");

 private:
  using policy_type = detail::adaptive_policy<algorithm_type, Clock>;
  using core_type = detail::limiter_core<policy_type, Executor, Clock, Mutex, void(error_code, permit)>;

 public:
  /// The limiter type when rebound to another executor.
  template <class OtherExecutor>
  struct rebind_executor {
    /// The same limiter type on `OtherExecutor`.
    using other = basic_adaptive_limiter<Algorithm, OtherExecutor, Clock, Mutex>;
  };

  /// Constructs a limiter completing operations on `ex` by default; `line` is its waiting line's
  /// (rein::line_options: all of them apply, partitions included), `options` its own, beyond the rule.
  ///
  /// @throws std::invalid_argument naming the type, field and value if `algorithm` is invalid (from the
  ///         algorithm's constructor: min_limit >= 1, min <= initial <= max, backoff in (0, 1), ...), if
  ///         `options.classify` is empty, if `options.circuit` is invalid (open_for <= 0, probes 0), or if a
  ///         line option is invalid.
  basic_adaptive_limiter(const executor_type& ex, const algorithm_options& algorithm = {}, line_options line = {},
                         adaptive_limiter_options options = {})
      : classify_(validated(std::move(options.classify), options.idle_restart, line.name)),
        // Worded at once: the name is moved from inside.
        core_(detail::renaming_nested_errors({detail::describe("rein::adaptive_limiter", line.name)}, [&] {
          return detail::core_owner<core_type>(
              ex, detail::line_of("rein::adaptive_limiter", std::move(line), {.partitions = true}), algorithm,
              options.circuit, options.idle_restart);
        })) {}

  /// Constructs a limiter on an execution context (an io_context).
  template <class ExecutionContext>
    requires std::is_convertible_v<ExecutionContext&, net::execution_context&>
  basic_adaptive_limiter(ExecutionContext& context, const algorithm_options& algorithm = {}, line_options line = {},
                         adaptive_limiter_options options = {})
      : basic_adaptive_limiter(context.get_executor(), algorithm, std::move(line), std::move(options)) {}

  basic_adaptive_limiter(const basic_adaptive_limiter&) = delete;
  basic_adaptive_limiter& operator=(const basic_adaptive_limiter&) = delete;

  /// Moves the limiter: waiters, permits and state stay with it (permits point at its shared state, not at
  /// this object). The moved-from object may only be destroyed or assigned to.
  basic_adaptive_limiter(basic_adaptive_limiter&&) noexcept = default;

  /// Destroys this limiter's state as the destructor does, then takes `other`'s.
  basic_adaptive_limiter& operator=(basic_adaptive_limiter&&) noexcept = default;

  /// Completes every waiter with `net::error::operation_aborted`.
  ~basic_adaptive_limiter() = default;

  /// The executor given at construction.
  executor_type get_executor() const noexcept { return core_->get_executor(); }

  /// The name given in the options (empty if none).
  const std::string& name() const noexcept { return core_->name(); }

  /// Takes n slots now if `in_flight + n <= floor(limit)` and nobody waits; otherwise returns an empty
  /// permit whose status() says why: try_status::busy, closed (after close()), exceeds_capacity (n above
  /// floor(max_limit)), unavailable (the circuit is open, or half-open with its probes out). Never waits;
  /// allocates only past 4096 outstanding permits (the grant log).
  try_permit try_acquire(std::size_t n = 1) { return doors().try_acquire(n); }

  /// Waits for n slots (a weighted call, e.g. a batch that costs n). The initiating function; every Asio
  /// completion token works.
  ///
  /// @param n     slots wanted; at most floor(max_limit). The permit reports one sample when it comes back.
  /// @param token completion token; signature `void(error_code, rein::permit)`. Default: `deferred`.
  ///
  /// Errors: errc::exceeds_capacity (n above floor(max_limit), at once), errc::queue_full (max_waiters
  /// reached, at once), errc::upstream_unavailable (the circuit is open: at once, and every waiter when it
  /// opens; see adaptive_limiter_options::circuit), errc::closed, `net::error::operation_aborted`
  /// (cancelled, or the limiter was destroyed). The handler is never invoked from inside this function: it
  /// goes through its associated executor.
  ///
  /// @par Per-Operation Cancellation
  /// terminal, partial and total: a waiting operation is removed and completes with operation_aborted. A
  /// cancellation that arrives after the grant but before the handler runs takes the grant back (the slots
  /// go to the next waiter, reported as ignored); once the handler runs, it holds the permit. No slot is
  /// lost or handed out twice.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, permit)) Token = default_token_t>
  auto async_acquire(std::size_t n, Token&& token = Token{}) {
    return doors().async_acquire_until(n, time_point::max(), std::forward<Token>(token));
  }

  /// As async_acquire(1, token).
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, permit)) Token = default_token_t>
  auto async_acquire(Token&& token = Token{}) {
    return doors().async_acquire_until(1, time_point::max(), std::forward<Token>(token));
  }

  /// As async_acquire, failing with errc::timed_out if not granted within `timeout` (a timeout too long to
  /// represent, such as duration::max(), means none).
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, permit)) Token = default_token_t>
  auto async_acquire_for(std::size_t n, duration timeout, Token&& token = Token{}) {
    return doors().async_acquire_for(n, timeout, std::forward<Token>(token));
  }

  /// As async_acquire_for(1, timeout, token).
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, permit)) Token = default_token_t>
  auto async_acquire_for(duration timeout, Token&& token = Token{}) {
    return doors().async_acquire_for(1, timeout, std::forward<Token>(token));
  }

  /// As async_acquire, failing with errc::timed_out if not granted by `deadline` (time_point::max(): never).
  /// A deadline already past fails at once unless the slots are free right now.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, permit)) Token = default_token_t>
  auto async_acquire_until(std::size_t n, time_point deadline, Token&& token = Token{}) {
    return doors().async_acquire_until(n, deadline, std::forward<Token>(token));
  }

  /// As async_acquire_until(1, deadline, token).
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, permit)) Token = default_token_t>
  auto async_acquire_until(time_point deadline, Token&& token = Token{}) {
    return doors().async_acquire_until(1, deadline, std::forward<Token>(token));
  }

  /// Waits for n slots inside a coroutine: `auto p = co_await limiter.acquire();`.
  ///
  /// When the slots are free and nobody waits, it completes without suspending through the scheduler.
  /// Otherwise it waits as async_acquire does. Throws `rein::system_error` with the errors listed for
  /// async_acquire.
  net::awaitable<permit> acquire(std::size_t n = 1) { return doors().acquire_until(n, time_point::max()); }

  /// As acquire, throwing errc::timed_out if not granted within `timeout` (a timeout too long to represent,
  /// such as duration::max(), means none).
  net::awaitable<permit> acquire_for(std::size_t n, duration timeout) { return doors().acquire_for(n, timeout); }

  /// As acquire_for(1, timeout).
  net::awaitable<permit> acquire_for(duration timeout) { return doors().acquire_for(1, timeout); }

  /// As acquire, throwing errc::timed_out if not granted by `deadline`. Behind other waiters it does not
  /// try first (that would fail, and cost a lock).
  net::awaitable<permit> acquire_until(std::size_t n, time_point deadline) { return doors().acquire_until(n, deadline); }

  /// As acquire_until(1, deadline).
  net::awaitable<permit> acquire_until(time_point deadline) { return doors().acquire_until(1, deadline); }

  /// The order in which its line serves waiters (line_options::order).
  queue_order order() const noexcept { return core_->order(); }

  /// This limiter's acquire doors at priority class `c` (0 the most urgent; a plain acquire is class 0), for
  /// a limiter whose options chose `order = queue_order::priority`: `co_await lim.at_priority(2).acquire()`.
  /// See rein::line_view and queue_order::priority. Throws std::invalid_argument naming the limiter if
  /// its options chose another order (the class would be ignored).
  auto at_priority(std::uint8_t c) const { return detail::at_priority(doors(), c); }

  /// This limiter's acquire doors for the key `key` (a tenant, a host) at `weight` (1 to 1,000,000), for a
  /// limiter whose options chose `order = queue_order::fair`: `co_await lim.for_key(tenant, 2).acquire()`.
  /// While keys wait, each is served its weight's share of the units granted, whatever its arrival rate; a
  /// plain acquire is the key "" at weight 1. See rein::line_view and queue_order::fair for the rule and its
  /// bound. Throws std::invalid_argument naming the limiter if its options chose another order, or if the
  /// weight is out of range.
  auto for_key(std::string_view key, std::uint32_t weight = 1) const { return detail::for_key(doors(), key, weight); }

  /// This limiter's acquire doors in the partition called `name` (line_options::partitions), with try_acquire:
  /// `co_await lim.partition("live").acquire()`. Its grants count against that partition's guaranteed share
  /// of the current limit (see rein::partition); a plain acquire belongs to the unnamed rest. See
  /// rein::line_view. Throws std::invalid_argument naming the limiter and the name if no partition is
  /// called so.
  auto partition(std::string_view name) const { return detail::in_partition(doors(), name); }

  /// Waits until every permit this limiter handed out has come back: completes at once if none is out
  /// (what tokio users write as `close()` then `acquire_many(total)`, and Go's `sync.WaitGroup.Wait`).
  /// With close() first, it is how a service stops without cutting calls in flight:
  /// `limiter.close(); co_await limiter.async_drain_for(30s, net::use_awaitable);`. Without close(), new
  /// grants may follow; it completes at a moment when none is out.
  ///
  /// @param token completion token; signature `void(error_code)`. Default: `deferred`.
  ///
  /// Errors: `net::error::operation_aborted` (cancelled, or the limiter was destroyed). close() does not end
  /// it. While it waits, it counts as outstanding work on the executor, as any pending Asio operation does.
  ///
  /// @par Per-Operation Cancellation
  /// terminal, partial and total: the wait is removed and completes with operation_aborted.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code)) Token = default_token_t>
  auto async_drain(Token&& token = Token{}) {
    return doors().async_drain_until(time_point::max(), std::forward<Token>(token));
  }

  /// As async_drain, failing with errc::timed_out if permits are still out after `timeout` (a timeout too
  /// long to represent means none).
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code)) Token = default_token_t>
  auto async_drain_for(duration timeout, Token&& token = Token{}) {
    return doors().async_drain_for(timeout, std::forward<Token>(token));
  }

  /// As async_drain, failing with errc::timed_out if permits are still out at `deadline`.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code)) Token = default_token_t>
  auto async_drain_until(time_point deadline, Token&& token = Token{}) {
    return doors().async_drain_until(deadline, std::forward<Token>(token));
  }

  /// The outcome this limiter's classifier (options.classify) gives `status`.
  outcome classify(int status) const { return classify_(status); }

  /// Reports a call's status through this limiter's classifier and gives its slot back:
  /// `p.complete(classify(status))`. Does nothing if `p` is empty.
  void complete(permit& p, int status) const {
    if (p) p.complete(classify_(status));
  }

  /// As complete(p, status), with what the caller knows of the call besides (rein::completion_hint):
  /// `p.complete(classify(status), hint)`, e.g. `limiter.complete(slot, 200, {.work = tokens})`. On an empty
  /// permit it only checks the hint.
  /// @throws std::invalid_argument if `hint.work` is negative, NaN or infinite, before the permit gives
  ///   anything back (it still holds its slot).
  void complete(permit& p, int status, const completion_hint& hint) const {
    detail::check_hint(hint);
    if (p) p.complete(classify_(status), hint);
  }

  /// Completes every waiter with errc::closed; later acquires fail the same way and try_acquire returns an
  /// empty permit. Permits already held stay valid and still report their outcomes.
  void close() { core_->close(); }

  /// The current limit, in calls (fractional; floor(limit) calls are admitted).
  double limit() const {
    return core_->inspect([](const policy_type& p, const wait_stats&) { return p.algorithm.limit(); });
  }

  /// Slots held now.
  std::size_t in_flight() const {
    return core_->inspect([](const policy_type& p, const wait_stats&) { return p.in_flight; });
  }

  /// Runs `f(algorithm_type&)` under the lock, then admits whatever waiters now fit: for limits driven from
  /// outside the samples (an operator override, a capacity announced by the dependency). Returns f's result.
  /// `f` must not block, call into this limiter, or throw after partly changing the algorithm.
  template <class F>
  auto update_algorithm(F&& f) {
    return core_->update([&f](policy_type& p, time_point) { return std::forward<F>(f)(p.algorithm); });
  }

  /// Runs `f(const algorithm_type&)` under the lock and returns a copy of its result (e.g. a tuned_aimd's
  /// baseline). `f` must not block or call into this limiter.
  template <class F>
  auto inspect_algorithm(F&& f) const {
    return core_->inspect([&f](const policy_type& p, const wait_stats&) { return std::forward<F>(f)(p.algorithm); });
  }

  /// Replaces the algorithm's options at run time (an operator's new floor or ceiling, a retuned backoff),
  /// validated as the constructor validates them. Applied under the lock; the limit learned so far is kept,
  /// moved into the new [min_limit, max_limit] (each algorithm's `set_options` says what else carries on).
  ///
  /// Effect on waiters: re-examined at once, in the line's order: a limit that rose (a higher floor) admits them
  /// before this returns (their handlers run through their executors as usual); one that fell (a lower
  /// ceiling) admits nobody until enough calls have finished, and takes no slot back. A waiter for more
  /// than the new floor(max_limit) completes with errc::exceeds_capacity at once (it could only wait
  /// forever); later acquires of that size fail the same way.
  ///
  /// @throws std::invalid_argument naming the type, field and value if `o` is invalid; nothing changed then.
  /// @par Thread Safety
  /// As every member: may be called concurrently with acquires and releases.
  void set_options(const algorithm_options& o) {
    detail::renaming_nested_errors(who(), [&] {
      core_->update_and_refuse([&o](policy_type& p, time_point) { p.algorithm.set_options(o); });
    });
  }

  /// The algorithm's options in force.
  algorithm_options get_options() const {
    return core_->inspect([](const policy_type& p, const wait_stats&) { return p.algorithm.get_options(); });
  }

  /// Replaces the circuit's options at run time (see adaptive_limiter_options::circuit), validated as the
  /// constructor validates them. An open circuit stays open until the end it was given; `open_after` 0
  /// switches the circuit off and closes it at once.
  ///
  /// Effect on waiters: re-examined at once: a circuit closed by this admits them by the limit as usual.
  ///
  /// @throws std::invalid_argument naming the field and value if `o` is invalid; nothing changed then.
  void set_circuit(const circuit_options& o) {
    detail::renaming_nested_errors(who(), [&] {
      core_->update([&o](policy_type& p, time_point) { p.circuit.set_options(o); });
    });
  }

  /// The circuit's state now (circuit_state::closed while it is off).
  circuit_state circuit() const {
    return core_->inspect([](const policy_type& p, const wait_stats&) { return p.circuit.state(clock_type::now()); });
  }

  /// Counters and state, copied under the lock in O(1) (O(partitions) with partitions, whose names it copies).
  adaptive_limiter_snapshot snapshot() const {
    return core_->inspect([](const policy_type& p, const wait_stats& w, const detail::partition_table& parts) {
      adaptive_limiter_snapshot s;
      static_cast<wait_stats&>(s) = w;
      const algorithm_type& a = p.algorithm;
      s.limit = a.limit();
      s.admitted = p.admitted();
      s.min_limit = a.min_limit();
      s.max_limit = a.max_limit();
      s.in_flight = p.in_flight;
      s.utilisation = static_cast<double>(p.in_flight) / std::max(1.0, s.limit);
      s.decreases = a.decreases();
      s.increases = a.increases();
      s.at_floor = p.at_floor();
      s.at_ceiling = static_cast<double>(algo::admitted(s.limit)) >= s.max_limit;
      s.circuit = p.circuit.state(clock_type::now());
      s.circuit_opens = p.circuit.opens();
      s.success_total = p.successes;
      s.congestion_total = p.congestions;
      s.ignored_total = p.ignored;
      s.service = p.service;
      if (!parts.empty()) s.partitions = parts.snapshot(p.partition_limit());
      return s;
    });
  }

 private:
  detail::named who() const noexcept { return {"rein::adaptive_limiter", core_->name()}; }

  // The fourth argument's checks, before the line takes the name: errors name the limiter as its line's do.
  static std::function<outcome(int)> validated(std::function<outcome(int)> classify,
                                               std::chrono::nanoseconds idle_restart, std::string_view name) {
    if (idle_restart < std::chrono::nanoseconds::zero())
      detail::throw_invalid(detail::describe("rein::adaptive_limiter", name), "idle_restart must be >= 0 ns",
                            detail::show(idle_restart));
    if (!classify)
      detail::throw_invalid(detail::describe("rein::adaptive_limiter", name), "classify must be a callable",
                            "an empty std::function");
    return classify;
  }

  // Every door is written once, in detail/acquire_doors.hpp.
  detail::line_doors<core_type> doors() const noexcept { return {core_.get(), "rein::adaptive_limiter"}; }

  std::function<outcome(int)> classify_;
  detail::core_owner<core_type> core_;
};

/// The thread-safe adaptive limiter on any I/O executor and the steady clock.
template <class Algorithm>
using adaptive_limiter = basic_adaptive_limiter<Algorithm>;

/// The single-threaded adaptive limiter: no locking; use from one thread or strand only.
template <class Algorithm>
using single_thread_adaptive_limiter =
    basic_adaptive_limiter<Algorithm, net::any_io_executor, std::chrono::steady_clock, null_mutex>;

/// AIMD (`algo::aimd`): +1/limit per fast success, x backoff on congestion (an error, or a success slower than
/// 1.75 x the fastest recent one), waiting below a level that cuts keep finding.
using aimd_limiter = adaptive_limiter<algo::aimd>;

/// AIMD against a rolling-median baseline, one cut per round trip, growth only while used (`algo::tuned_aimd`).
using tuned_aimd_limiter = adaptive_limiter<algo::tuned_aimd>;

/// Baseline/latency gradient with a small queue allowance (`algo::gradient`, after Gradient2 and Envoy).
using gradient_limiter = adaptive_limiter<algo::gradient>;

}  // namespace rein
