// What a caller may tell an adaptive limiter of a completed call besides its outcome.
#pragma once

#include <rein/detail/invalid_option.hpp>

#include <optional>

namespace rein {

/// What the caller knows of a completed call beyond its outcome, given with it:
/// `permit.complete(outcome::success, {.work = tokens})` or `guard.complete(outcome::success, {.work = tokens})`.
///
/// An adaptive limiter hands it to its algorithm with the call's sample (`algo::basic_sample::work`); a
/// semaphore and the rate stages of a throttle ignore it. The hint is advice: an empty one is the same as
/// completing without it.
struct completion_hint {
  /// How much work the call asked of the dependency (an answer's tokens, a payload's bytes), in any unit, the
  /// same for every call of one limiter. Given, rein's adaptive algorithms (rein::algo::tuned_aimd, aimd,
  /// gradient, vegas, windowed_aimd, pid) judge the latency per unit of work, so that a long answer is not read as a queue. 0: the call did no work (a
  /// cached or empty answer); its latency is neither judged nor learned, its outcome still counts. Unset:
  /// the latency is judged as it is. Must be finite and >= 0: anything else is refused where it is given,
  /// before the permit or guard lets go of anything (std::invalid_argument
  /// "rein::completion_hint: work must be >= 0 and finite, got <value>").
  std::optional<double> work{};
};

namespace detail {

/// Validates a hint where it is given (see completion_hint::work).
inline void check_hint(const completion_hint& hint) {
  if (hint.work) (void)checked_work("rein::completion_hint", *hint.work);
}

}  // namespace detail
}  // namespace rein
