// An awaitable retry loop: exponential backoff with full jitter, a cap, a maximum number of attempts,
// Retry-After honoured, and a retry budget so that retries cannot snowball.
#pragma once

#include <rein/algo/backoff.hpp>
#include <rein/algo/retry_budget.hpp>
#include <rein/config.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/detail/format.hpp>
#include <rein/detail/invalid_option.hpp>
#include <rein/detail/random_seed.hpp>
#include <rein/null_mutex.hpp>
#include <rein/observer.hpp>

#include REIN_ASIO_HEADER(any_io_executor.hpp)
#include REIN_ASIO_HEADER(awaitable.hpp)
#include REIN_ASIO_HEADER(basic_waitable_timer.hpp)
#include REIN_ASIO_HEADER(this_coro.hpp)
#include REIN_ASIO_HEADER(use_awaitable.hpp)
#include REIN_ASIO_HEADER(wait_traits.hpp)

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

namespace rein {

/// How one attempt of a retried operation ended.
enum class attempt_kind {
  success,    ///< done; no retry
  retryable,  ///< failed for a reason that may pass (429, 503, a timeout, a reset connection)
  permanent,  ///< failed for a reason a retry would not change (400, 401, 404); no retry
};

/// What one attempt of an operation run by rein::retry returns: success (with a value), a retryable failure
/// (optionally with the wait the upstream asked for), or a permanent failure. A failure may carry a value too
/// (the 429 response itself), so that the caller sees it if retrying stops there.
///
/// ```
/// if (r.status == 429)  // net::error::try_again: any error code of the caller's
///   co_return rein::attempt<response>::retryable(net::error::try_again,
///                                                rein::parse_retry_after(r.header("Retry-After"), now))
///       .with_value(std::move(r));
/// ```
/// (From tests/async/doc_snippets.cpp, which compiles and runs it.)
template <class T = void>
class attempt {
  using stored = std::conditional_t<std::is_void_v<T>, std::monostate, T>;

 public:
  /// The value an attempt carries (void: none).
  using value_type = T;

  /// No attempt: a permanent failure without an error code or value. (Asio needs it, e.g. co_spawn hands a
  /// default-constructed result along with an exception.)
  attempt() = default;

  /// A success carrying `value`.
  static attempt success(stored value)
    requires(!std::is_void_v<T>)
  {
    return attempt(attempt_kind::success, {}, std::nullopt, std::move(value));
  }

  /// A success (attempt<void>).
  static attempt success()
    requires std::is_void_v<T>
  {
    return attempt(attempt_kind::success, {}, std::nullopt, std::monostate{});
  }

  /// A failure worth retrying. `retry_after` is the upstream's requested wait, if it sent one
  /// (rein::parse_retry_after); the next delay is then at least that much, up to backoff's max_retry_after.
  /// A negative one is a wait already over, as for every pause rein takes (quota_gate::pause_for,
  /// throttle_guard::reject): it reads as none (no floor on the delay) rather than an error at the retry's
  /// decision.
  static attempt retryable(error_code error, std::optional<std::chrono::nanoseconds> retry_after = std::nullopt) {
    if (retry_after && *retry_after < std::chrono::nanoseconds::zero()) retry_after.reset();
    return attempt(attempt_kind::retryable, error, retry_after, std::nullopt);
  }

  /// A failure not worth retrying: retry stops here.
  static attempt permanent(error_code error) { return attempt(attempt_kind::permanent, error, std::nullopt, std::nullopt); }

  /// Attaches a value to a failure (e.g. the response of a 429).
  attempt with_value(stored value) &&
    requires(!std::is_void_v<T>)
  {
    value_ = std::move(value);
    return std::move(*this);
  }

  /// How the attempt ended.
  attempt_kind kind() const noexcept { return kind_; }
  /// The failure's error code (empty for a success).
  error_code error() const noexcept { return error_; }
  /// The wait the upstream asked for (a Retry-After), if any; >= 0.
  std::optional<std::chrono::nanoseconds> retry_after() const noexcept { return retry_after_; }
  /// Whether a value is attached (always for a success of attempt<T>, T not void).
  bool has_value() const noexcept { return value_.has_value(); }

  /// The value; precondition: has_value().
  stored& value() & noexcept
    requires(!std::is_void_v<T>)
  {
    return *value_;
  }
  /// The value; precondition: has_value().
  const stored& value() const& noexcept
    requires(!std::is_void_v<T>)
  {
    return *value_;
  }
  /// The value, moved out; precondition: has_value().
  stored&& value() && noexcept
    requires(!std::is_void_v<T>)
  {
    return std::move(*value_);
  }

 private:
  attempt(attempt_kind kind, error_code error, std::optional<std::chrono::nanoseconds> retry_after,
          std::optional<stored> value)
      : kind_(kind), error_(error), retry_after_(retry_after), value_(std::move(value)) {}

  attempt_kind kind_ = attempt_kind::permanent;
  error_code error_;
  std::optional<std::chrono::nanoseconds> retry_after_;
  std::optional<stored> value_;
};

/// Why rein::retry stopped.
enum class retry_stop {
  succeeded,           ///< an attempt succeeded
  permanent_failure,   ///< an attempt failed permanently
  attempts_exhausted,  ///< the last allowed attempt failed (backoff_options::max_attempts)
  budget_exhausted,    ///< a retry was due but the retry budget had none left
};

/// What rein::retry returns: the last attempt as the operation returned it, how many attempts were made
/// (the first included), and why it stopped.
template <class T = void>
struct retry_result {
  /// The last attempt, as the operation returned it.
  attempt<T> last;
  /// Attempts made, the first included.
  std::uint32_t attempts = 0;
  /// Why retrying stopped.
  retry_stop stop = retry_stop::succeeded;

  /// True if an attempt succeeded.
  explicit operator bool() const noexcept { return stop == retry_stop::succeeded; }
};

/// Options of a retry policy.
struct retry_options {
  /// Delays and the number of attempts: base, cap, max_attempts, max_retry_after (rein::algo::backoff).
  algo::backoff_options backoff{};
  /// The retry budget shared by every retry() using the policy (rein::algo::retry_budget; Finagle's
  /// defaults: 20% of the requests of the last 10 s, plus 10 per second). nullopt: no budget.
  std::optional<algo::retry_budget_options> budget{algo::retry_budget_options{}};
  /// Seed of the jitter; nullopt: drawn from std::random_device.
  std::optional<std::uint64_t> seed{};
  /// Replaces the seeded generator: returns a number in [0, 1] per delay (tests pass a constant; 1.0 gives
  /// plain exponential backoff without jitter). A function cannot be checked where it is given: a draw
  /// outside [0, 1] (NaN included) throws std::invalid_argument naming rein::retry_policy, `random()` and
  /// the value at the decision that drew it, before anything is counted or charged to the budget (the rule
  /// of every draw rein takes: algo::backoff's `uniform01`, algo::admission_throttle's `draw`).
  std::function<double()> random{};
  /// Names the policy in metrics. Default: none.
  std::string name{};
};

/// Counters of a retry policy.
struct retry_snapshot {
  std::uint64_t requests_total = 0;          ///< retry() calls (each deposits into the budget)
  std::uint64_t attempts_total = 0;          ///< attempts made, first ones included
  std::uint64_t retries_total = 0;           ///< attempts after a failure
  std::uint64_t succeeded_total = 0;         ///< calls that ended in success
  std::uint64_t permanent_total = 0;         ///< calls that ended in a permanent failure
  std::uint64_t attempts_exhausted_total = 0;  ///< calls that used every attempt and failed
  std::uint64_t budget_exhausted_total = 0;  ///< calls that stopped because the budget refused a retry
  /// Calls that ended without success: permanent + attempts_exhausted + budget_exhausted (see
  /// for_each_rejected), in the vocabulary every rein snapshot shares.
  std::uint64_t rejected_total = 0;
  std::uint64_t acquired_total = 0;          ///< the same as succeeded_total, in the shared vocabulary

  /// Calls f(reject_reason, std::uint64_t count) for each reason summed in rejected_total.
  template <class F>
  void for_each_rejected(F&& f) const {
    f(reject_reason::permanent, permanent_total);
    f(reject_reason::attempts_exhausted, attempts_exhausted_total);
    f(reject_reason::budget_exhausted, budget_exhausted_total);
  }
};

/// One line: `requests=10 attempts=14 retries=4 succeeded=9 rejected=1 (budget_exhausted=1)`.
inline std::ostream& operator<<(std::ostream& os, const retry_snapshot& s) {
  os << "requests=" << s.requests_total << " attempts=" << s.attempts_total << " retries=" << s.retries_total
     << " succeeded=" << s.succeeded_total << ' ';
  const std::uint64_t rejected = s.permanent_total + s.attempts_exhausted_total + s.budget_exhausted_total;
  retry_snapshot copy = s;
  copy.rejected_total = rejected;  // the total is filled by snapshot(); a hand-made one may lack it
  detail::write_rejected(os, copy);
  return os;
}

/// The shared part of retrying calls to one dependency: backoff settings, the retry budget (which must be
/// shared to mean anything: it limits retries to a fraction of all recent requests), the jitter generator
/// and counters. Pass it to rein::retry.
///
/// @tparam Clock the clock of delays and of the budget's window (rein::testing::manual_clock in tests).
/// @tparam Mutex std::mutex (default): usable from many threads; rein::null_mutex: one thread or strand.
///
/// @par Thread Safety
/// With std::mutex, every member function may be called concurrently.
template <class Clock = std::chrono::steady_clock, class Mutex = std::mutex>
class basic_retry_policy {
 public:
  /// The clock that times the rule and the deadlines.
  using clock_type = Clock;
  /// A point in time of `clock_type`.
  using time_point = typename Clock::time_point;
  /// A duration of `clock_type`.
  using duration = typename Clock::duration;

  /// What to do after a failed attempt: stop (and why), or wait `delay` and try again.
  struct decision {
    /// Set: stop, for this reason. Unset: wait `delay`, then try again.
    std::optional<retry_stop> stop;
    /// The wait before the next attempt (when not stopping).
    std::chrono::nanoseconds delay{0};
  };

  /// @throws std::invalid_argument naming the field and value when a backoff or budget option is out of range.
  explicit basic_retry_policy(retry_options options = {})
      : backoff_(detail::renaming_errors("rein::algo::backoff", {"rein::retry_policy", options.name},
                                         [&] { return algo::backoff(options.backoff); }, "backoff.")),
        random_(std::move(options.random)),
        state_(options.seed ? *options.seed : detail::random_seed()),
        name_(std::move(options.name)) {
    if (!options.budget) return;
    detail::renaming_errors("rein::algo::retry_budget", {"rein::retry_policy", name_},
                            [&] { budget_.emplace(*options.budget); }, "budget.");
  }

  basic_retry_policy(const basic_retry_policy&) = delete;
  basic_retry_policy& operator=(const basic_retry_policy&) = delete;

  /// The backoff rule, as validated at construction.
  const algo::backoff& backoff() const noexcept { return backoff_; }

  /// Records a new request (a first attempt): a deposit into the budget.
  void on_request() {
    std::lock_guard<Mutex> lock(mutex_);
    ++stats_.requests_total;
    ++stats_.attempts_total;
    if (budget_) budget_->deposit(Clock::now());
  }

  /// Records the end of attempt number `attempt_number` (1 = the first) and decides what follows: stop on
  /// success or permanent failure; stop when max_attempts were made or the budget refuses a retry; otherwise
  /// wait `delay` (full jitter, at least the attempt's Retry-After up to max_retry_after) and try again (the
  /// retry is counted, and charged to the budget, now).
  template <class T>
  decision on_attempt(std::uint32_t attempt_number, const attempt<T>& result) {
    std::lock_guard<Mutex> lock(mutex_);
    switch (result.kind()) {
      case attempt_kind::success: return stop_locked(retry_stop::succeeded, stats_.succeeded_total);
      case attempt_kind::permanent: return stop_locked(retry_stop::permanent_failure, stats_.permanent_total);
      case attempt_kind::retryable: break;
    }
    if (!backoff_.may_retry(attempt_number)) return stop_locked(retry_stop::attempts_exhausted, stats_.attempts_exhausted_total);
    // The delay first: it throws on a bad jitter draw, and then nothing may have been charged to the budget
    // or counted as a retry. (A retry the budget then refuses has still drawn its
    // jitter: a seeded sequence moves on.)
    const std::chrono::nanoseconds delay = detail::renaming_errors(
        "rein::algo::backoff", {"rein::retry_policy", name_},
        [&] { return backoff_.delay(attempt_number, draw_locked(), result.retry_after()); });
    if (budget_ && !budget_->try_withdraw(Clock::now()))
      return stop_locked(retry_stop::budget_exhausted, stats_.budget_exhausted_total);
    ++stats_.retries_total;
    ++stats_.attempts_total;
    return {std::nullopt, delay};
  }

  /// Counters, copied under the lock.
  retry_snapshot snapshot() const {
    std::lock_guard<Mutex> lock(mutex_);
    retry_snapshot s = stats_;
    s.rejected_total = s.permanent_total + s.attempts_exhausted_total + s.budget_exhausted_total;
    s.acquired_total = s.succeeded_total;
    return s;
  }

  /// The name given in the options (empty if none).
  const std::string& name() const noexcept { return name_; }

  /// Whole retries the budget would allow now (unbounded: the maximum of std::int64_t without a budget).
  std::int64_t retries_available() const {
    std::lock_guard<Mutex> lock(mutex_);
    if (!budget_) return std::numeric_limits<std::int64_t>::max();
    return budget_->retries_available(Clock::now());
  }

 private:
  decision stop_locked(retry_stop why, std::uint64_t& counter) {
    ++counter;
    return {why, std::chrono::nanoseconds{0}};
  }

  double draw_locked() {
    if (random_) {
      return detail::checked_draw(detail::describe("rein::retry_policy", name_), "random()", random_());
    }
    // SplitMix64: one 64-bit state, full period, good enough to decorrelate clients.
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1.0p-53;
  }

  algo::backoff backoff_;
  std::function<double()> random_;
  std::uint64_t state_;
  std::string name_;
  mutable Mutex mutex_;
  std::optional<algo::basic_retry_budget<Clock>> budget_;
  retry_snapshot stats_{};
};

/// The retry policy on std::chrono::steady_clock.
using retry_policy = basic_retry_policy<>;

namespace detail {

template <class>
struct attempt_awaitable_traits {
  static constexpr bool valid = false;
  using value_type = void;
};

template <class T, class Executor>
struct attempt_awaitable_traits<net::awaitable<attempt<T>, Executor>> {
  static constexpr bool valid = true;
  using value_type = T;
};

template <class Op>
auto invoke_attempt(Op& op, std::uint32_t attempt_number) {
  if constexpr (std::is_invocable_v<Op&, std::uint32_t>) return op(attempt_number);
  else return op();
}

template <class Op>
using attempt_awaitable_t = decltype(invoke_attempt(std::declval<Op&>(), std::uint32_t{}));

// What an op passed to retry returns: valid, with the attempt's value type, only for a callable op(n) or op()
// returning net::awaitable<attempt<T>>; anything else is said in one sentence by retry's static_assert.
template <class Op>
struct op_attempt : attempt_awaitable_traits<void> {};

template <class Op>
  requires std::is_invocable_v<Op&, std::uint32_t> || std::is_invocable_v<Op&>
struct op_attempt<Op> : attempt_awaitable_traits<std::remove_cvref_t<attempt_awaitable_t<Op>>> {};

}  // namespace detail

/// Runs `op` until it succeeds, fails permanently, runs out of attempts, or the retry budget refuses a
/// retry; between attempts it sleeps on a timer of the policy's clock.
///
/// @param policy the shared policy (backoff, budget, jitter); must outlive the returned awaitable.
/// @param op     `op(std::uint32_t attempt_number)` or `op()`, returning `net::awaitable<rein::attempt<T>>`;
///               called once per attempt (1 = the first). Each attempt should acquire its own permit and
///               complete it with its own outcome (`co_await limiter.acquire()` inside op): a 429 then a
///               success are two samples for an adaptive limiter, not one slow success, and no permit is
///               held while retry sleeps.
/// @returns the last attempt, the number of attempts and why it stopped (success is `bool(result)`).
///
/// Delays (rein::algo::backoff): after the n-th failure, uniform in [0, min(cap, base * 2^(n-1))) ("full
/// jitter", AWS Architecture Blog), raised to the failure's Retry-After if it carried one (cut to
/// max_retry_after). The budget (rein::algo::retry_budget, Finagle's RetryBudget): each call deposits a
/// fraction of a retry, each retry withdraws one, so that retries stay a bounded fraction of traffic when a
/// dependency fails instead of multiplying it.
///
/// Exceptions thrown by `op` propagate at once (they are not retried: return attempt::retryable for what
/// should be). Cancellation: the sleep is an Asio timer wait on the coroutine's executor, so cancelling the
/// calling coroutine (terminal, partial or total, per its cancellation state's filter) ends the sleep and
/// retry throws `net::error::operation_aborted`; an attempt in progress sees the cancellation itself.
template <class Clock, class Mutex, class Op>
auto retry(basic_retry_policy<Clock, Mutex>& policy, Op op)
    -> net::awaitable<retry_result<typename detail::op_attempt<Op>::value_type>> {
  static_assert(detail::op_attempt<Op>::valid,
                "rein::retry: op must be callable as op(std::uint32_t attempt_number) or op(), and return "
                "net::awaitable<rein::attempt<T>> (co_return rein::attempt<T>::success(value), ::retryable(ec) or "
                "::permanent(ec))");
  if constexpr (detail::op_attempt<Op>::valid) {
    using timer_type = net::basic_waitable_timer<Clock, net::wait_traits<Clock>, net::any_io_executor>;
    timer_type timer(co_await net::this_coro::executor);
    policy.on_request();
    for (std::uint32_t n = 1;; ++n) {
      auto result = co_await detail::invoke_attempt(op, n);
      const auto next = policy.on_attempt(n, result);
      if (next.stop) co_return retry_result<typename decltype(result)::value_type>{std::move(result), n, *next.stop};
      timer.expires_after(std::chrono::ceil<typename Clock::duration>(next.delay));
      co_await timer.async_wait(net::use_awaitable);
    }
  }
}

}  // namespace rein
