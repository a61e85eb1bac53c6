// Partitions of one limit with guaranteed shares (line_options::partitions of a semaphore or adaptive limiter).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace rein {

/// One partition of a concurrency limit: a guaranteed share of it for one kind of caller (batch and live
/// traffic, tenants, endpoints), as in Netflix concurrency-limits' partitioned limiter. Given in
/// rein::line_options::partitions of rein::semaphore and rein::adaptive_limiter; acquires name one through
/// `limiter.partition(name)`.
///
/// The rule, on the limiter's one waiting line:
/// - Partition p is guaranteed floor(share x limit) permits (the semaphore's permits, the adaptive
///   limiter's current limit; a product within 1e-9 of an integer counts as that integer). Rounding down
///   keeps every guarantee satisfiable at once, since the shares sum to at most 1 (give or take the 1e-9
///   that the sum may exceed 1 by, for shares such as 0.1 + 0.2 + 0.7).
/// - Any acquire may take permits that are free, beyond its partition's guarantee (idle capacity is lent),
///   in the line's order. The total in flight never exceeds the limit.
/// - While some partition below its guarantee has waiters, each permit that comes free goes to such a
///   partition's first waiter in the line's order, ahead of the head: a partition that lent its share gets
///   it back as fast as permits are released, and never waits behind another partition's backlog for it.
///   A waiter that arrives in a partition below its guarantee is served at once if its request fits.
/// - Acquires made without a partition (the limiter's own doors) belong to the unnamed rest, guaranteed
///   floor((1 - sum of shares) x limit).
/// Within a partition, head-of-line semantics hold: its first waiter, if its weighted request does not fit
/// yet, keeps the permits that come free until it fits (they are not lent to the head meanwhile), while the
/// first waiter of another partition below its guarantee that fits is still served. A request larger than
/// the whole current limit (an adaptive limiter's limit that fell) claims nothing until the limit allows it.
/// try_acquire takes nothing while anyone waits, in any partition.
struct partition {
  /// What `limiter.partition(name)` finds it by: not empty, unique among the limiter's partitions.
  std::string name;
  /// The fraction of the limit guaranteed to it, in (0, 1]; the shares of a limiter sum to at most 1.
  double share = 0.0;
};

/// One partition in a limiter's snapshot (`snapshot().partitions`): the unnamed rest first, then the
/// partitions in the order the options gave them.
struct partition_snapshot {
  std::string name;                  ///< "" for the rest (acquires made without a partition)
  double share = 0.0;                ///< as given (the rest: 1 - the sum of the shares)
  std::size_t guaranteed = 0;        ///< floor(share x limit) at the snapshot
  std::size_t in_flight = 0;         ///< permits its acquires hold, grants not yet delivered included
  std::size_t waiting = 0;           ///< its waiters in the line
  std::uint64_t acquired_total = 0;  ///< grants made to it (a grant taken back by a late cancellation is not one)
};

}  // namespace rein
