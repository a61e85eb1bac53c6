// The waiting line's placement orders: the members of limiter_core (detail/limiter_core.hpp) that place a
// newcomer in fifo, lifo, priority or fair order (rein/queue_order.hpp), and choose whom a full line
// evicts. Not API.
#pragma once

#include <rein/detail/limiter_core.hpp>
#include <rein/detail/fair_schedule.hpp>
#include <rein/detail/wait_op.hpp>
#include <rein/queue_order.hpp>

#include <cstddef>
#include <optional>

namespace rein::detail {

template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline auto limiter_core<Policy, Executor, Clock, Mutex, Signature>::place_locked(
    const wait_op* op) const noexcept -> place {
  switch (order_) {
    case queue_order::lifo: return {nullptr, 0};
    case queue_order::priority: {
      // Keys grow from the front: walk back past every waiter keyed after the newcomer (an equal key
      // stays ahead: it arrived first). The walk passes only more recent or less urgent waiters.
      const priority_key_type key = priority_key(*op);
      place at{queue_.back(), queued_units_};
      while (at.after != nullptr && priority_key(*at.after) > key) {
        at.ahead -= at.after->count;
        at.after = at.after->prev;
      }
      return at;
    }
    case queue_order::fair: return place_fair_locked(op->fair_tag());
    case queue_order::fifo: break;
  }
  return {queue_.back(), queued_units_};
}

// A fair line's newcomer gets its start tag: V first moves up to the first waiter's tag (a key that was
// idle joins the round being served, behind its first waiter).
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline void limiter_core<Policy, Executor, Clock, Mutex, Signature>::tag_fair_locked(wait_op& op, bool first) {
  if (!first) fair_->advance(queue_.front()->fair_tag());
  op.fair_state().tag = fair_->start_tag(op.fair_state().key);
}

// Start tags grow from the front, as priority keys do; the newcomer goes after the last waiter tagged at or
// before it (an equal tag stays ahead: it arrived first). Found by walking from both ends at once, so
// that it costs the fewer of the waiters before and after that place: a key that was idle belongs near
// the front, a flooding key's next waiter at the back, and neither walks past the other's backlog.
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline auto limiter_core<Policy, Executor, Clock, Mutex, Signature>::place_fair_locked(
    double tag) const noexcept -> place {
  wait_op* back = queue_.back();
  std::size_t back_ahead = queued_units_;  // units up to and including `back`
  wait_op* front = queue_.front();
  std::size_t front_ahead = 0;  // units before `front`
  for (;;) {
    if (back == nullptr || back->fair_tag() <= tag) return {back, back_ahead};
    back_ahead -= back->count;
    back = back->prev;
    if (front->fair_tag() > tag) return {front->prev, front_ahead};
    front_ahead += front->count;
    front = front->next;
  }
}

// A fair line's newcomer joined the line: its key's finish tag moves past it.
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline void limiter_core<Policy, Executor, Clock, Mutex, Signature>::fair_admitted_locked(wait_op& op) noexcept {
  const fair_node& f = op.fair_state();
  fair_->admitted(f.key, f.weight, f.tag, op.count);
}

// arrival + class x aging, exact in 128 bits, so the classes stay ordered at every aging up to
// nanoseconds::max() and on clocks before their epoch.
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline priority_key_type limiter_core<Policy, Executor, Clock, Mutex, Signature>::priority_key(
    const wait_op& op) const noexcept {
  return priority_key_type{op.stamp_ns} + priority_key_type{op.priority} * priority_key_type{priority_aging_ns_};
}

// The prediction counts the units placed ahead of the newcomer; a newcomer that evicts the oldest waiter
// in fifo order will not wait behind it (the prediction is a lower bound either way: in lifo and
// priority order later arrivals may still pass it).
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline bool limiter_core<Policy, Executor, Clock, Mutex, Signature>::cannot_meet(
    std::size_t n, time_point deadline, time_point now, std::size_t ahead, bool evicting) const {
  if (evicting && order_ == queue_order::fifo) ahead -= queue_.front()->count;
  const std::optional<time_point> predicted = policy_.predict(ahead, n, now);
  return predicted && *predicted > deadline;
}

// queue_full_policy::evict_oldest on a full line: the longest waiter leaves (the front in fifo order, the
// back in lifo order), or in priority and fair order the one that would be served last (the back).
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline void limiter_core<Policy, Executor, Clock, Mutex, Signature>::evict_oldest_locked(completions& done) noexcept {
  wait_op* oldest = order_ == queue_order::fifo ? queue_.front() : queue_.back();
  count_rejection_locked(wait_status::queue_full, done);
  unlink_locked(oldest, wait_status::queue_full, done);
}

}  // namespace rein::detail
