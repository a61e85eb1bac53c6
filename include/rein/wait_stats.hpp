// Counters every rein limiter keeps about its waiting line.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace rein {

/// The part of every limiter's `snapshot()` that describes waiting; each limiter's snapshot adds its own
/// fields (tokens, limit, ...) to these. Plain data, copied out under the limiter's lock in O(1).
struct wait_stats {
  std::size_t waiting = 0;             ///< operations parked now
  std::uint64_t acquired_total = 0;    ///< grants, immediate or after waiting
  std::uint64_t rejected_total = 0;    ///< queue_full + timed_out
  std::uint64_t queue_full_total = 0;  ///< completed at once with errc::queue_full
  std::uint64_t timed_out_total = 0;   ///< completed with errc::timed_out (at once or on expiry)
  std::uint64_t cancelled_total = 0;   ///< completed with operation_aborted by a cancellation slot
  std::chrono::nanoseconds wait_total{0};  ///< summed over grants: time from the acquire call to the grant
                                           ///< (zero for a semaphore with semaphore_options::measure_wait off)
  std::chrono::nanoseconds wait_max{0};    ///< the longest such wait (likewise)
};

}  // namespace rein
