// rein::admission_throttle: client-side adaptive throttling (the Google SRE book's rule), thread-safe, with a
// seeded draw, outcomes as feedback, counters and the common events.
#pragma once

#include <rein/algo/admission_throttle.hpp>
#include <rein/detail/format.hpp>
#include <rein/detail/invalid_option.hpp>
#include <rein/observer.hpp>
#include <rein/outcome.hpp>
#include <rein/try_result.hpp>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <ostream>
#include <string>
#include <string_view>

namespace rein {

/// Options of `rein::admission_throttle`. Write them with designated initializers: `{.multiplier = 3}`.
struct admission_throttle_options {
  /// The trailing window of requests and accepts; a positive multiple of 10 clock ticks. Default 2 min.
  std::chrono::nanoseconds window = std::chrono::minutes(2);
  /// K: the client sends up to K times what the backend accepts; in [1, 1000]. Default 2.
  double multiplier = 2.0;
  /// The most a call is refused with, in [0, 1]. Default 1 (the rule's own bound; Envoy uses 0.8).
  double max_rejection = 1.0;
  /// The seed of the draws that decide each call: give each replica its own. Default 0.
  std::uint64_t seed = 0;
  /// Names the throttle in events and error messages. Default: none.
  std::string name{};
  /// Called outside the lock with each local refusal (event_kind::rejected, reject_reason::admission).
  limiter_observer observer{};
};

/// An admission throttle's counters, copied out under its lock (rein::prometheus::collector exports
/// `acquired_total` and the rejections as rein_acquired_total and rein_rejected_total{reason="admission"}).
struct admission_throttle_snapshot {
  std::int64_t requests = 0;         ///< in the window now: refused ones and admitted ones recorded
  std::int64_t accepts = 0;          ///< in the window now: recorded outcomes other than congestion
  double rejection_probability = 0;  ///< what a call asking now is refused with
  std::uint64_t acquired_total = 0;  ///< try_acquire calls admitted since construction
  std::uint64_t rejected_total = 0;  ///< try_acquire calls refused locally since construction

  /// Calls f(reason, count) for the one reason a throttle refuses: reject_reason::admission.
  template <class F>
  void for_each_rejected(F&& f) const {
    f(reject_reason::admission, rejected_total);
  }
};

/// One line: `requests=100 accepts=30 rejection_probability=0.396 acquired=12 rejected=5 (admission=5)`.
inline std::ostream& operator<<(std::ostream& os, const admission_throttle_snapshot& s) {
  os << "requests=" << s.requests << " accepts=" << s.accepts << " rejection_probability=";
  detail::write_number(os, s.rejection_probability, 3);
  os << " acquired=" << s.acquired_total << ' ';
  detail::write_rejected(os, s);
  return os;
}

/// Client-side adaptive throttling: refuses locally, at once, a share
/// p = max(0, (requests - K x accepts) / (requests + 1)) of new calls, counted over a trailing window, so
/// that a backend refusing for overload is not also sent the calls it would only refuse. The rule, what
/// counts as an accept and when a request counts are those of `rein::algo::basic_admission_throttle`
/// (source: the Google SRE book, "Handling Overload"; Envoy's admission_control filter).
///
/// Use: ask with `try_acquire()`; if admitted, make the call and report its outcome with `record(outcome)`
/// (`rein::classify_http_status` maps a status: 429, 503, 504 and 408 are `congestion`, the backend's
/// refusal); if refused (`try_status::unavailable`), fail the call without sending it. Every admitted call
/// must be recorded once, `ignored` if it ended without an answer.
///
/// ```
/// rein::admission_throttle admit({.seed = replica_id, .name = "search"});
/// const auto call = [&](int request) {
///   if (!admit.try_acquire()) return fail_fast();
///   const int status = send(request);
///   admit.record(rein::classify_http_status(status));
///   return status;
/// };
/// ```
/// (From tests/async/admission_throttle.cpp, which runs it against a backend that refuses every call.)
///
/// Or list it first in a rein::throttle (`rein::throttle t(admission, gates, per_host, global, rate);`): the
/// throttle asks it before anything is taken, fails a refused call at once (errc::admission_refused on the
/// waiting doors), and records each admitted call's outcome from its guard (docs/throttle.md).
///
/// A refusal costs nothing but a draw: there is no line and no waiting, so it needs no executor. Each
/// refusal is reported to the observer as `rejected` with reason `admission` (the `rein_rejected_total`
/// vocabulary).
///
/// @par Thread Safety
/// Every member may be called concurrently (under `Mutex`; `rein::null_mutex` for one thread or strand).
/// @tparam Clock the clock that times the window (default std::chrono::steady_clock).
/// @tparam Mutex guards the counters and the generator (default std::mutex).
template <class Clock = std::chrono::steady_clock, class Mutex = std::mutex>
class basic_admission_throttle {
 public:
  /// The clock that times the window.
  using clock_type = Clock;
  /// A point in time of `clock_type`.
  using time_point = typename Clock::time_point;
  /// The options type, as the constructor takes them.
  using options = admission_throttle_options;

  /// @throws std::invalid_argument naming the throttle, the field and the value when an option is out of
  /// range ("rein::admission_throttle \"search\": multiplier must be in [1, 1000], got 0.5").
  explicit basic_admission_throttle(const options& o = {})
      : rule_(detail::renaming_errors(
            "rein::algo::admission_throttle", {"rein::admission_throttle", o.name},
            [&] {
              return algo::basic_admission_throttle<Clock>(
                  {.window = o.window, .multiplier = o.multiplier, .max_rejection = o.max_rejection});
            })),
        random_(o.seed),
        name_(o.name),
        observer_(o.observer) {}

  basic_admission_throttle(const basic_admission_throttle&) = delete;
  basic_admission_throttle& operator=(const basic_admission_throttle&) = delete;

  /// Decides a new call now: `acquired`, or `unavailable` when refused locally (a refused call counts as
  /// a request at once; an admitted one when its outcome is recorded). Never waits.
  try_result try_acquire() {
    const time_point now = Clock::now();
    detail::event_buffer events;
    bool admitted = false;
    {
      std::lock_guard lock(mutex_);
      admitted = rule_.try_admit(now, draw());
      if (admitted) {
        ++acquired_total_;
      } else {
        ++rejected_total_;
        events.reject(reject_reason::admission);
      }
    }
    if (observer_ && !events.empty()) events.deliver(observer_, name_);
    return try_result(admitted ? try_status::acquired : try_status::unavailable);
  }

  /// An admitted call's outcome: `congestion` is the backend refusing for load, anything else an accept.
  void record(outcome result) {
    const time_point now = Clock::now();
    std::lock_guard lock(mutex_);
    rule_.record(result, now);
  }

  /// What a call asking now is refused with, in [0, max_rejection].
  double rejection_probability() const {
    const time_point now = Clock::now();
    std::lock_guard lock(mutex_);
    return rule_.rejection_probability(now);
  }

  /// The counters now.
  admission_throttle_snapshot snapshot() const {
    const time_point now = Clock::now();
    std::lock_guard lock(mutex_);
    return {rule_.requests(now), rule_.accepts(now), rule_.rejection_probability(now), acquired_total_,
            rejected_total_};
  }

  /// The name given in the options.
  std::string_view name() const noexcept { return name_; }

 private:
  // splitmix64 (Steele, Lea and Flood, 2014): seedable and the same on every platform, so a seed replays
  // the same decisions. 53 bits make a double uniform in [0, 1).
  double draw() noexcept {
    std::uint64_t z = (random_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
  }

  mutable Mutex mutex_;
  algo::basic_admission_throttle<Clock> rule_;
  std::uint64_t random_;
  std::uint64_t acquired_total_ = 0;
  std::uint64_t rejected_total_ = 0;
  std::string name_;
  limiter_observer observer_;
};

/// The thread-safe admission throttle on std::chrono::steady_clock.
using admission_throttle = basic_admission_throttle<>;

}  // namespace rein
