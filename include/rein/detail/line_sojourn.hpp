// The waiting line's sojourn rule (line_options::sojourn, rein/algo/codel.hpp): the members of limiter_core
// (detail/limiter_core.hpp) that shed a head which queued past the slough time while the line stands, and
// say when the line must look again. Not API.
#pragma once

#include <rein/detail/limiter_core.hpp>

#include <algorithm>

namespace rein::detail {

// Only the head is judged: the public types allow the rule in fifo order only, where the head is the oldest
// waiter (a starved partition's waiter granted past it is younger still).
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline bool limiter_core<Policy, Executor, Clock, Mutex, Signature>::shed_head_locked(
    wait_op* head, time_point now, completions& done) noexcept {
  if (!sojourn_ || !sojourn_->should_shed(stamp_time(*head), now)) return false;
  count_rejection_locked(wait_status::overloaded, done);
  unlink_locked(head, wait_status::overloaded, done);
  return true;
}

// At the end of the interval in force (to judge a line that stands still) and, while the line stands,
// when the head passes the slough time.
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline auto limiter_core<Policy, Executor, Clock, Mutex, Signature>::sojourn_wake_locked(
    const wait_op& head) const noexcept -> time_point {
  const time_point end = sojourn_->interval_end();
  return sojourn_->standing() ? std::min(end, sojourn_->slough_at(stamp_time(head))) : end;
}

}  // namespace rein::detail
