// Counters every rein limiter keeps about its waiting line.
#pragma once

#include <rein/algo/log_histogram.hpp>
#include <rein/observer.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace rein {

/// A histogram of durations (fixed log-linear buckets; percentiles within 1/64 from 512 ns to 73 minutes):
/// see rein::algo::log_histogram.
using duration_histogram = algo::log_histogram;

/// The part of every limiter's `snapshot()` that describes waiting; each limiter's snapshot adds its own
/// fields (in_flight, limit, utilisation, tokens, ...) to these, under the same names for the same facts.
/// Plain data, copied out under the limiter's lock (the histogram's copy is one allocation of 256 bytes per
/// block of buckets in use, at most 8.7 KB; an idle limiter's histogram allocates nothing).
///
/// Rejections: `rejected_total` is the sum of the per-reason counters that for_each_rejected() lists
/// (queue_full, timed_out, exceeds_capacity, closed, unavailable, overloaded: the limiter turned the caller
/// away). Cancellations are counted apart, in `cancelled_total`: the caller gave up, the limiter refused
/// nothing.
struct wait_stats {
  std::size_t waiting = 0;             ///< operations parked now
  std::uint64_t acquired_total = 0;    ///< grants, immediate or after waiting
  std::uint64_t rejected_total = 0;    ///< queue_full + timed_out + exceeds_capacity + closed + unavailable
                                       ///< + overloaded
  std::uint64_t queue_full_total = 0;  ///< completed at once with errc::queue_full
  std::uint64_t timed_out_total = 0;   ///< completed with errc::timed_out (at once or on expiry)
  std::uint64_t exceeds_capacity_total = 0;  ///< completed at once with errc::exceeds_capacity
  std::uint64_t closed_total = 0;      ///< completed with errc::closed (waiting when close() came, or after)
  std::uint64_t unavailable_total = 0;  ///< completed with errc::upstream_unavailable (an open circuit), or
                                        ///< a shared limiter's rein::redis::errc::unavailable
  std::uint64_t overloaded_total = 0;  ///< completed with errc::overloaded: shed by the line's sojourn rule
  std::uint64_t cancelled_total = 0;   ///< completed with operation_aborted by a cancellation slot
  std::chrono::nanoseconds wait_total{0};  ///< summed over grants: time from the acquire call to the grant
                                           ///< (zero for a semaphore with line_options::measure_wait off)
  std::chrono::nanoseconds wait_max{0};    ///< the longest such wait (likewise)
  /// Every grant's wait, from the acquire call to the grant: one zero for each grant made at once
  /// (try_acquire, or an acquire that found room), the measured time for each grant made after waiting.
  /// Empty when wait measurement is off (line_options::measure_wait = false). While it is on, its
  /// count() is acquired_total plus the grants taken back by a late cancellation (the histogram keeps
  /// their entry; acquired_total no longer counts them).
  duration_histogram wait{};

  /// Calls f(reject_reason, std::uint64_t count) for each reason summed in rejected_total.
  template <class F>
  void for_each_rejected(F&& f) const {
    f(reject_reason::queue_full, queue_full_total);
    f(reject_reason::timed_out, timed_out_total);
    f(reject_reason::exceeds_capacity, exceeds_capacity_total);
    f(reject_reason::closed, closed_total);
    f(reject_reason::unavailable, unavailable_total);
    f(reject_reason::overloaded, overloaded_total);
  }
};

}  // namespace rein
