// Hedged requests under a budget: a second attempt when the first is slower than a delay (fixed, or a
// quantile of recent latencies), the first success wins and the other attempt is cancelled, and a hedge
// budget bounds the extra load.
#pragma once

#include <rein/algo/hedge_delay.hpp>
#include <rein/algo/log_histogram.hpp>
#include <rein/algo/retry_budget.hpp>
#include <rein/config.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/detail/format.hpp>
#include <rein/detail/invalid_option.hpp>
#include <rein/retry.hpp>

#include REIN_ASIO_HEADER(any_io_executor.hpp)
#include REIN_ASIO_HEADER(awaitable.hpp)
#include REIN_ASIO_HEADER(basic_waitable_timer.hpp)
#include REIN_ASIO_HEADER(cancellation_type.hpp)
#include REIN_ASIO_HEADER(co_spawn.hpp)
#include REIN_ASIO_HEADER(experimental/parallel_group.hpp)
#include REIN_ASIO_HEADER(redirect_error.hpp)
#include REIN_ASIO_HEADER(this_coro.hpp)
#include REIN_ASIO_HEADER(use_awaitable.hpp)
#include REIN_ASIO_HEADER(wait_traits.hpp)

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <utility>

namespace rein {

/// What became of the hedge of one call.
enum class hedge_decision {
  not_needed,  ///< the first attempt ended before the hedge delay: no second attempt
  refused,     ///< the delay passed but the hedge budget had none left: no second attempt
  started,     ///< a second attempt was started
};

/// What rein::hedge returns: the attempt that ended the call, how many attempts were started, which one it
/// was, and what became of the hedge.
template <class T = void>
struct hedge_result {
  /// The attempt that ended the call, as the operation returned it (the winner, or the failure that ended it).
  attempt<T> last;
  /// Attempts started: 1, or 2 when a hedge was started.
  std::uint32_t attempts = 0;
  /// Which attempt `last` is: 1 (the first) or 2 (the hedge).
  std::uint32_t winner = 0;
  /// Whether a hedge was started, and if not, why.
  hedge_decision hedge = hedge_decision::not_needed;

  /// True if the returned attempt succeeded.
  explicit operator bool() const noexcept { return last.kind() == attempt_kind::success; }
};

/// The budget a hedge policy starts with: hedges may be 10% of the calls of the last 10 s, plus 1 per
/// second (so that a quiet client may still hedge), at most 1.1 times the load plus that trickle.
inline algo::retry_budget_options default_hedge_budget() {
  algo::retry_budget_options budget;
  budget.ttl = std::chrono::seconds{10};
  budget.min_retries_per_second = 1.0;
  budget.retry_ratio = 0.1;
  return budget;
}

/// Options of a hedge policy. The first four are rein::algo::hedge_delay_options, the delay rule.
struct hedge_options {
  /// The hedge delay when `quantile` is unset, and while the latencies read hold fewer than `min_samples`
  /// values. > 0. Default 2 s (Polly's HedgingStrategyOptions.Delay).
  std::chrono::nanoseconds delay{std::chrono::seconds{2}};
  /// Set: the hedge delay is this percentile, in (0, 100), of the latencies read (95.0: hedge the calls
  /// slower than 95% of recent ones, as "The Tail at Scale" suggests). Unset: the fixed `delay`.
  std::optional<double> quantile{};
  /// The fewest latencies a quantile is read from (tower's min_data_points); >= 1.
  std::uint64_t min_samples = 20;
  /// The policy's own latencies are those of the last full period of this length (tower's rotating
  /// histogram: rein::algo::hedge_delay); > 0.
  std::chrono::nanoseconds latency_period{std::chrono::seconds{10}};
  /// The hedge budget shared by every hedge() using the policy (rein::algo::retry_budget: each call deposits
  /// `retry_ratio` of a hedge, each hedge withdraws one). Default: default_hedge_budget(). nullopt: none.
  std::optional<algo::retry_budget_options> budget{default_hedge_budget()};
  /// Names the policy in metrics and errors. Default: none.
  std::string name{};
};

/// Counters of a hedge policy.
struct hedge_snapshot {
  std::uint64_t requests_total = 0;          ///< hedge() calls (each deposits into the budget)
  std::uint64_t attempts_total = 0;          ///< attempts started, hedges included
  std::uint64_t hedges_total = 0;            ///< hedges started
  std::uint64_t hedges_won_total = 0;        ///< calls whose hedge was the success returned
  std::uint64_t hedges_cancelled_total = 0;  ///< hedges cancelled because the first attempt ended first
  std::uint64_t hedges_refused_total = 0;    ///< hedges due that the hedge budget refused
  std::uint64_t succeeded_total = 0;         ///< calls that ended in success
  std::uint64_t failed_total = 0;            ///< calls that ended in a failure (not counted: exceptions, cancellations)
  std::uint64_t acquired_total = 0;          ///< the same as succeeded_total, in the shared vocabulary
  /// Latencies of the attempts that ended by themselves (not cancelled), in the current period.
  duration_histogram latency{};
};

/// One line: `requests=10 attempts=12 hedges=2 won=1 cancelled=1 refused=1 succeeded=10 failed=0`.
inline std::ostream& operator<<(std::ostream& os, const hedge_snapshot& s) {
  return os << "requests=" << s.requests_total << " attempts=" << s.attempts_total << " hedges=" << s.hedges_total
            << " won=" << s.hedges_won_total << " cancelled=" << s.hedges_cancelled_total
            << " refused=" << s.hedges_refused_total << " succeeded=" << s.succeeded_total
            << " failed=" << s.failed_total;
}

/// The shared part of hedging calls to one dependency: the delay rule, the latencies it reads, the hedge
/// budget (shared to mean anything: it bounds hedges to a share of all recent calls) and counters. Pass it
/// to rein::hedge.
///
/// @tparam Clock the clock of delays, latencies and the budget's window (rein::testing::manual_clock in tests).
/// @tparam Mutex std::mutex (default): usable from many threads; rein::null_mutex: one thread or strand.
///
/// @par Thread Safety
/// With std::mutex, every member function may be called concurrently.
template <class Clock = std::chrono::steady_clock, class Mutex = std::mutex>
class basic_hedge_policy {
 public:
  /// The clock that times delays, latencies and the budget.
  using clock_type = Clock;
  /// A point in time of `clock_type`.
  using time_point = typename Clock::time_point;
  /// A duration of `clock_type`.
  using duration = typename Clock::duration;

  /// @throws std::invalid_argument naming rein::hedge_policy, the field and the value when an option is out
  /// of range (delay, quantile, min_samples and latency_period as documented; budget.* as
  /// rein::algo::retry_budget requires).
  explicit basic_hedge_policy(hedge_options options = {})
      : rule_(detail::renaming_errors("rein::algo::hedge_delay", {"rein::hedge_policy", options.name},
                                      [&] { return algo::basic_hedge_delay<Clock>(delay_options(options)); })),
        name_(std::move(options.name)) {
    if (!options.budget) return;
    detail::renaming_errors(
        "rein::algo::retry_budget", {"rein::hedge_policy", name_}, [&] { budget_.emplace(*options.budget); },
        "budget.");
  }

  basic_hedge_policy(const basic_hedge_policy&) = delete;
  basic_hedge_policy& operator=(const basic_hedge_policy&) = delete;

  /// The hedge delay read from `latencies`: its `quantile` percentile once it holds min_samples values,
  /// otherwise (or without a quantile) the fixed delay.
  std::chrono::nanoseconds delay_for(const duration_histogram& latencies) const noexcept {
    return rule_.delay_for(latencies);  // reads only the options, fixed at construction: no lock
  }

  /// The hedge delay read from the policy's own latencies (those of the last full latency_period).
  std::chrono::nanoseconds delay() {
    std::lock_guard<Mutex> lock(mutex_);
    return rule_.delay(Clock::now());
  }

  /// Records a new call (a first attempt): a deposit into the budget.
  void on_request() {
    std::lock_guard<Mutex> lock(mutex_);
    ++stats_.requests_total;
    ++stats_.attempts_total;
    if (budget_) budget_->deposit(Clock::now());
  }

  /// Asks to start a hedge now: true (counted, charged to the budget) or false (refused by the budget).
  [[nodiscard]] bool try_hedge() {
    std::lock_guard<Mutex> lock(mutex_);
    if (budget_ && !budget_->try_withdraw(Clock::now())) {
      ++stats_.hedges_refused_total;
      return false;
    }
    ++stats_.hedges_total;
    ++stats_.attempts_total;
    return true;
  }

  /// Records the latency of an attempt that ended by itself, from its start (its wait for a permit
  /// included) to its end. A cancelled one is not recorded: its latency is unknown, only longer than it ran
  /// (tower's hedge records the same way).
  void on_latency(std::chrono::nanoseconds latency) {
    std::lock_guard<Mutex> lock(mutex_);
    rule_.record(Clock::now(), latency);
  }

  /// Records how a call ended: whether it succeeded, whether the hedge won, whether the hedge was cancelled.
  void on_end(bool succeeded, bool hedge_won, bool hedge_cancelled) {
    std::lock_guard<Mutex> lock(mutex_);
    ++(succeeded ? stats_.succeeded_total : stats_.failed_total);
    if (hedge_won) ++stats_.hedges_won_total;
    if (hedge_cancelled) ++stats_.hedges_cancelled_total;
  }

  /// Counters and the current period's latencies, copied under the lock.
  hedge_snapshot snapshot() const {
    std::lock_guard<Mutex> lock(mutex_);
    hedge_snapshot s = stats_;
    s.acquired_total = s.succeeded_total;
    s.latency = rule_.current();
    return s;
  }

  /// The name given in the options (empty if none).
  const std::string& name() const noexcept { return name_; }

  /// Whole hedges the budget would allow now (unbounded: the maximum of std::int64_t without a budget).
  std::int64_t hedges_available() const {
    std::lock_guard<Mutex> lock(mutex_);
    if (!budget_) return std::numeric_limits<std::int64_t>::max();
    return budget_->retries_available(Clock::now());
  }

 private:
  static algo::hedge_delay_options delay_options(const hedge_options& o) {
    algo::hedge_delay_options rule;
    rule.delay = o.delay;
    rule.quantile = o.quantile;
    rule.min_samples = o.min_samples;
    rule.latency_period = o.latency_period;
    return rule;
  }

  algo::basic_hedge_delay<Clock> rule_;
  std::string name_;
  mutable Mutex mutex_;
  std::optional<algo::basic_retry_budget<Clock>> budget_;
  hedge_snapshot stats_{};
};

/// The hedge policy on std::chrono::steady_clock.
using hedge_policy = basic_hedge_policy<>;

namespace detail {

// Who decides the hedge: 0 while the first attempt runs alone; whoever moves it on first wins the race
// between the first attempt ending and the delay passing (hedging: the hedge is due; settled: the first
// attempt ended first; refused: the hedge was due but the budget refused it).
struct hedge_race {
  static constexpr int alone = 0, hedging = 1, settled = 2, refused = 3;
  std::atomic<int> phase{alone};
  bool leave_alone(int to) noexcept {
    int expected = alone;
    return phase.compare_exchange_strong(expected, to);
  }
};

// An attempt's arm of the parallel group: nullopt when it never started its attempt (the hedge not made).
template <class T>
using hedge_arm_result = std::optional<attempt<T>>;

// Whether an arm's end decides the call: an exception, a success or a permanent failure does; a retryable
// failure does not while the other attempt may still succeed.
template <class T>
bool hedge_decides(const std::exception_ptr& e, const hedge_arm_result<T>& r) noexcept {
  return e || (r && r->kind() != attempt_kind::retryable);
}

// The parallel group's cancellation condition: what an arm's end does to the other arm.
template <class T>
struct hedge_condition {
  hedge_race* race;
  net::cancellation_type_t operator()(const std::exception_ptr& e, const hedge_arm_result<T>& r) const noexcept {
    if (!e && !r) return net::cancellation_type::none;  // the hedge was not made: the first decides
    if (race->leave_alone(hedge_race::settled)) return net::cancellation_type::terminal;  // ended before the delay
    return hedge_decides(e, r) ? net::cancellation_type::terminal : net::cancellation_type::none;
  }
};

// Runs attempt `n` and records its latency unless a cancellation ended it (a success that came although a
// cancellation was asked for ended by itself, and counts).
template <class T, class Clock, class Mutex, class Op>
net::awaitable<hedge_arm_result<T>> hedge_attempt(basic_hedge_policy<Clock, Mutex>& policy, Op& op, std::uint32_t n) {
  const auto start = Clock::now();
  auto result = co_await invoke_attempt(op, n);
  const auto state = co_await net::this_coro::cancellation_state;
  if (state.cancelled() == net::cancellation_type::none || result.kind() == attempt_kind::success)
    policy.on_latency(Clock::now() - start);
  co_return hedge_arm_result<T>(std::move(result));
}

// Each arm of the parallel group reads any cancellation that passed the caller's filter as terminal. A
// spawned coroutine's own filter lets only terminal through, and the group forwards the caller's
// cancellation once: a partial or total one it dropped would have used up that one forwarding, and a later
// terminal one (the caller's, or the group's own when an arm decides) would never reach the other arm.
inline auto hedge_any_as_terminal() {
  return net::this_coro::reset_cancellation_state([](net::cancellation_type_t t) {
    return t != net::cancellation_type::none ? net::cancellation_type::terminal : t;
  });
}

// The first attempt's arm.
template <class T, class Clock, class Mutex, class Op>
net::awaitable<hedge_arm_result<T>> hedge_first(basic_hedge_policy<Clock, Mutex>& policy, Op& op) {
  co_await hedge_any_as_terminal();
  co_return co_await hedge_attempt<T>(policy, op, 1);
}

// Waits `delay`, then starts the hedge unless the first attempt ended meanwhile or the budget refuses.
template <class T, class Clock, class Mutex, class Op>
net::awaitable<hedge_arm_result<T>> hedge_after(basic_hedge_policy<Clock, Mutex>& policy, Op& op, hedge_race& race,
                                                std::chrono::nanoseconds delay) {
  co_await hedge_any_as_terminal();
  using timer_type = net::basic_waitable_timer<Clock, net::wait_traits<Clock>, net::any_io_executor>;
  timer_type timer(co_await net::this_coro::executor);
  timer.expires_after(std::chrono::ceil<typename Clock::duration>(delay));
  error_code ec;
  co_await timer.async_wait(net::redirect_error(net::use_awaitable, ec));
  if (ec || !race.leave_alone(hedge_race::hedging)) co_return std::nullopt;
  if (!policy.try_hedge()) {
    race.phase = hedge_race::refused;
    co_return std::nullopt;
  }
  co_return co_await hedge_attempt<T>(policy, op, 2);
}

// Both arms' ends, in the order they ended.
template <class T>
struct hedge_ends {
  std::array<std::size_t, 2> order;
  std::array<std::exception_ptr, 2> errors;
  std::array<hedge_arm_result<T>, 2> results;
};

// Picks the call's result from both arms' ends (see rein::hedge), counts it, and rethrows what must be.
template <class T, class Clock, class Mutex>
hedge_result<T> hedge_settle(basic_hedge_policy<Clock, Mutex>& policy, hedge_ends<T>& ends, const hedge_race& race,
                             bool caller_cancelled) {
  std::optional<std::size_t> chosen;
  for (const std::size_t i : ends.order)
    if (!chosen && hedge_decides(ends.errors[i], ends.results[i])) chosen = i;
  if (!chosen)  // no arm decided: both failed retryably (the later one is returned), or only the first ran
    for (const std::size_t i : ends.order)
      if (ends.results[i]) chosen = i;
  const std::size_t w = *chosen;
  const bool started = race.phase == hedge_race::hedging;
  const bool succeeded = ends.results[w] && ends.results[w]->kind() == attempt_kind::success;
  if (!succeeded && caller_cancelled) throw system_error(net::error::operation_aborted, "rein::hedge");
  if (ends.errors[w]) std::rethrow_exception(ends.errors[w]);
  // Cancelled: the first attempt decided first and the hedge then ended without a success of its own (one
  // that succeeded in the same instant was not cancelled, whatever was asked of it).
  const bool hedge_succeeded = ends.results[1] && ends.results[1]->kind() == attempt_kind::success;
  const bool hedge_cancelled = started && w == 0 && ends.order[0] == 0 &&
                               hedge_decides(ends.errors[0], ends.results[0]) && !hedge_succeeded;
  policy.on_end(succeeded, succeeded && w == 1, hedge_cancelled);
  const hedge_decision decision = started                             ? hedge_decision::started
                                  : race.phase == hedge_race::refused ? hedge_decision::refused
                                                                      : hedge_decision::not_needed;
  return {std::move(*ends.results[w]), started ? 2U : 1U, static_cast<std::uint32_t>(w + 1), decision};
}

// The body of both rein::hedge overloads; `delay` unset: read from the policy's own latencies now.
template <class Clock, class Mutex, class Op>
auto run_hedge(basic_hedge_policy<Clock, Mutex>& policy, Op op, std::optional<std::chrono::nanoseconds> delay)
    -> net::awaitable<hedge_result<typename op_attempt<Op>::value_type>> {
  using T = typename op_attempt<Op>::value_type;
  if (!delay) delay = policy.delay();
  policy.on_request();
  auto executor = co_await net::this_coro::executor;
  hedge_race race;
  hedge_ends<T> ends;
  auto [order, e1, r1, e2, r2] =
      co_await net::experimental::make_parallel_group(
          net::co_spawn(executor, hedge_first<T>(policy, op), default_token_t{}),
          net::co_spawn(executor, hedge_after<T>(policy, op, race, *delay), default_token_t{}))
          .async_wait(hedge_condition<T>{&race}, net::use_awaitable);
  ends.order = order;
  ends.errors = {e1, e2};
  ends.results = {std::move(r1), std::move(r2)};
  const auto state = co_await net::this_coro::cancellation_state;
  co_return hedge_settle(policy, ends, race, state.cancelled() != net::cancellation_type::none);
}

template <class Op>
constexpr void check_hedge_op() {
  static_assert(op_attempt<Op>::valid,
                "rein::hedge: op must be callable as op(std::uint32_t attempt_number) or op(), and return "
                "net::awaitable<rein::attempt<T>> (co_return rein::attempt<T>::success(value), ::retryable(ec) or "
                "::permanent(ec))");
}

}  // namespace detail

/// Runs `op`; if it has not ended after the hedge delay, starts a second attempt (a hedge) beside it, if the
/// hedge budget allows; the first success wins and the other attempt is cancelled. The delay is the fixed
/// `hedge_options::delay` or, with `quantile` set, that percentile of the policy's own latencies (those of
/// the attempts that ended by themselves in the last full latency_period).
///
/// @param policy the shared policy (delay rule, latencies, budget); must outlive the returned awaitable.
/// @param op     `op(std::uint32_t attempt_number)` or `op()`, returning `net::awaitable<rein::attempt<T>>`;
///               called once per attempt (1 = the first, 2 = the hedge), the two running at the same time.
///               Each attempt acquires its own permit (`co_await limiter.acquire()` inside op), so both are
///               charged through the same limiter and quota, and a hedge waits like any other call when the
///               limiter is full; the loser's permit comes back when its cancellation unwinds it.
/// @returns the attempt that ended the call, the attempts started, which one it was, and what became of the
///          hedge (success is `bool(result)`).
///
/// Which attempt ends the call:
/// - the first to succeed; the other, if still running, is cancelled (terminal cancellation through its
///   coroutine's cancellation slot: its pending Asio operations complete with `operation_aborted`);
/// - the first permanent failure, which a second attempt would not change; the other is cancelled;
/// - a retryable failure of the first attempt before the delay ends the call at once, with no hedge: hedging
///   answers slowness, not failure (wrap the hedge in rein::retry for failures: hedge inside, retry outside);
/// - a retryable failure while the other attempt runs waits for it; if both fail so, the later failure.
/// hedge completes only once both attempts have ended (so nothing op captured is used after it returns).
///
/// The rule is "hedged requests" from Dean and Barroso, "The Tail at Scale" (CACM 56(2), 2013): send a second
/// request after the first has been outstanding longer than the 95th-percentile expected latency, which
/// there cut the 99.9th percentile from 1,800 ms to 74 ms for 2% more requests. The delay from a rotating
/// histogram with a minimum of samples is tower's `hedge` middleware; the fixed delay of 2 s and the shape
/// of the outcome rules follow Polly's hedging strategy; the budget is rein::algo::retry_budget (Finagle's
/// RetryBudget) with hedges in place of retries, so that hedging cannot double the load when a dependency
/// slows down for everyone.
///
/// Exceptions thrown by an attempt that decides the call propagate (after the other attempt ended);
/// those of a loser (usually its `operation_aborted`) are dropped.
///
/// @par Per-Operation Cancellation
/// Cancelling the calling coroutine (per its cancellation state's filter, terminal by default) cancels both
/// attempts and the hedge delay, waits for the attempts to end, and throws `net::error::operation_aborted`
/// unless an attempt had succeeded (then that success is returned).
///
/// @par Thread Safety
/// Both attempts run on the caller's executor, and the group's cancellation is emitted from where they end:
/// on a multi-threaded io_context, run the caller on a strand (net::make_strand), as Asio's awaitable
/// operators require. The policy may be shared by any number of calls on any threads.
template <class Clock, class Mutex, class Op>
auto hedge(basic_hedge_policy<Clock, Mutex>& policy, Op op)
    -> net::awaitable<hedge_result<typename detail::op_attempt<Op>::value_type>> {
  detail::check_hedge_op<Op>();
  if constexpr (detail::op_attempt<Op>::valid) return detail::run_hedge(policy, std::move(op), std::nullopt);
  else return {};
}

/// As hedge(policy, op), with the delay read from `latencies` when hedge is called (e.g. a limiter's
/// `snapshot().service`, or `wait` plus service, the latencies the caller already keeps): its
/// `hedge_options::quantile` percentile once it holds `min_samples` values, otherwise the fixed delay (also
/// when the policy has no quantile). The histogram is read at once and not kept.
template <class Clock, class Mutex, class Op>
auto hedge(basic_hedge_policy<Clock, Mutex>& policy, Op op, const duration_histogram& latencies)
    -> net::awaitable<hedge_result<typename detail::op_attempt<Op>::value_type>> {
  detail::check_hedge_op<Op>();
  if constexpr (detail::op_attempt<Op>::valid)
    return detail::run_hedge(policy, std::move(op), policy.delay_for(latencies));
  else return {};
}

}  // namespace rein
