// The one translation of rein::line_options into the line's own (limiter_core.hpp), checked. Not API.
#pragma once

#include <rein/algo/codel.hpp>
#include <rein/detail/invalid_option.hpp>
#include <rein/detail/limiter_core.hpp>
#include <rein/detail/partition_table.hpp>
#include <rein/line_options.hpp>
#include <rein/queue_order.hpp>

#include <string>
#include <string_view>
#include <utility>

namespace rein::detail {

/// Why a rate line (a rate limiter's, a window's, the quota gate's) refuses a sojourn rule: its waiters wait
/// for the rule's own pacing, which a sojourn target would read as a standing queue and shed.
inline constexpr std::string_view paced_line = "its waits are the rule's pacing, not a queue";

/// What a line refuses beyond the checks every line makes (an empty reason: it accepts every value).
struct line_rules {
  std::string_view fifo_only{};  ///< why the line serves in fifo order only ("its release is spread ...")
  std::string_view no_evict{};   ///< why it refuses queue_full_policy::evict_oldest
  std::string_view no_sojourn{}; ///< why it refuses a sojourn rule (sojourn.target > 0)
  bool partitions = false;       ///< whether it has partitions (it hands out permits against a limit)
};

/// `o` checked for the public type `type` (named as its messages name it: "rein::semaphore") and
/// translated: throws std::invalid_argument naming the type, its name, the field and the value.
inline line_options line_of(std::string_view type, rein::line_options o, line_rules rules = {}) {
  const named who{type, o.name};
  if (o.priority_aging.count() < 0)
    throw_invalid(describe(type, o.name), "priority_aging must be >= 0", show(o.priority_aging));
  if (o.wake_jitter.count() < 0) throw_invalid(describe(type, o.name), "wake_jitter must be >= 0", show(o.wake_jitter));
  if (!rules.fifo_only.empty() && o.order != queue_order::fifo)
    throw_invalid(describe(type, o.name), "order must be fifo (" + std::string(rules.fifo_only) + ")",
                  to_string(o.order));
  if (!rules.no_evict.empty() && o.when_full != queue_full_policy::reject_newest)
    throw_invalid(describe(type, o.name), "when_full must be reject_newest (" + std::string(rules.no_evict) + ")",
                  to_string(o.when_full));
  if (!rules.partitions && !o.partitions.empty())
    throw_invalid(describe(type, o.name),
                  "partitions must be empty (only rein::semaphore and rein::adaptive_limiter have partitions)",
                  show(o.partitions.size()) + " partitions");
  if (!rules.no_sojourn.empty() && o.sojourn.target.count() > 0)
    throw_invalid(describe(type, o.name), "sojourn.target must be 0 (" + std::string(rules.no_sojourn) + ")",
                  show(o.sojourn.target));
  (void)algo::basic_codel<>(o.sojourn, describe(type, o.name));  // checks it, naming the limiter
  // Only the head is judged: in fifo order it is the oldest waiter; in the others older ones could wait
  // behind a younger head for ever.
  if (o.sojourn.target.count() > 0 && o.order != queue_order::fifo)
    throw_invalid(describe(type, o.name), "sojourn needs queue_order::fifo", to_string(o.order));
  auto parts = partition_table::make(who, o.partitions);
  return {.max_waiters = o.max_waiters,
          .measure_wait = o.measure_wait,
          .name = std::move(o.name),
          .observer = std::move(o.observer),
          .order = o.order,
          .when_full = o.when_full,
          .priority_aging = o.priority_aging,
          .partitions = std::move(parts),
          .coarse_wait_clock = o.coarse_wait_clock,
          .wake_jitter = o.wake_jitter,
          .jitter_seed = o.jitter_seed,
          .direct_handoff = o.direct_handoff,
          .sojourn = o.sojourn};
}

}  // namespace rein::detail
