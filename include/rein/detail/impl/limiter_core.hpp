// The bodies of the waiting line's own members, declared in detail/limiter_core.hpp (as Asio keeps a
// service's bodies in detail/impl/); the members of one concern are defined with it (line_*.hpp). Not API.
#pragma once

#include <rein/detail/limiter_core.hpp>
#include <rein/detail/wait_op.hpp>

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <type_traits>

namespace rein::detail {

// Members defined outside the class, so that REIN_SEPARATE_COMPILATION compiles them in one unit only: a
// unit that declares the class extern then neither instantiates them nor copies them in (config.hpp). A
// member template such as async_acquire is not covered by the class's declaration: only the specializations
// declared extern by REIN_DETAIL_LINE_INSTANTIATIONS (rein/impl/line_instantiations.hpp) are left to src.hpp.
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
template <class Handler>
REIN_SEPARATE_INLINE void limiter_core<Policy, Executor, Clock, Mutex, Signature>::async_acquire(
    Handler&& handler, std::size_t n, time_point deadline, line_place where) {
  using op_type = basic_wait_op<std::decay_t<Handler>, Executor, signature, concurrent, op_base>;
  // Allocated before taking the lock, with a node if it has a deadline or its line is fair.
  op_node node = deadline != time_point::max() ? op_node::deadline : op_node::none;
  if (order_ == queue_order::fair) node = op_node::fair;
  op_type* op = op_type::create(std::forward<Handler>(handler), n, node);
  op->priority = where.priority;
  op->partition = where.partition;
  if (op->fair) {
    op->fair_state().key = where.key;
    op->fair_state().weight = std::max<std::uint32_t>(where.weight, 1);
  }
  completions done(this);
  try {
    line_lock lock(*this);
    // Connected first, so that a grant made at once can still be taken back by a cancellation that arrives
    // before the handler runs; under the lock, so that a cancellation finds the op decided (its handler
    // locks before it acts on a queued op).
    op->connect_cancellation(this);
    try {
      admit_locked(op, deadline, done);
    } catch (...) {
      op->disconnect_cancellation();
      throw;
    }
  } catch (...) {
    op->destroy();  // outside the lock: the handler's destructor is user code
    throw;
  }
}

template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
REIN_SEPARATE_INLINE try_status limiter_core<Policy, Executor, Clock, Mutex, Signature>::try_acquire(
    std::size_t n, std::chrono::nanoseconds& stamp, std::int64_t* retry_ns, std::uint8_t partition,
    const time_point* at, std::uint64_t* note) {
  if constexpr (pooled) {
    if (pool_.try_take(n)) {
      stamp = to_ns(time_point{});  // a timeless policy's grant time, as on the locked path
      return try_status::acquired;
    }
  }
  if (has_observer_) return try_acquire_observed(n, stamp, retry_ns, partition, at, note);
  line_lock lock(*this);
  if (closed_) return try_status::closed;
  if (policy_.exceeds(n)) return try_status::exceeds_capacity;
  return take_locked(n, at != nullptr ? *at : policy_now(), stamp, retry_ns, partition, note);
}

template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
REIN_SEPARATE_INLINE limiter_core<Policy, Executor, Clock, Mutex, Signature>::completions::~completions() {
  std::shared_ptr<wait_owner> keep = std::move(keep_alive_);  // released last, after the posting
  ready.complete_all(&core_->executor_, core_, keep, direct);
  if constexpr (remote) {
    if (send) core_->send_pending();
  }
  if (events) [[unlikely]] deliver_events();
  idle_work.reset();
}

template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
REIN_SEPARATE_INLINE void limiter_core<Policy, Executor, Clock, Mutex, Signature>::shutdown() noexcept {
  completions done(this);
  line_lock lock(*this);
  fail_all_locked(wait_status::aborted, done);
  shut_down_.store(true, std::memory_order_release);
  cancel_timer_locked();
  timer_.reset();  // while its execution context is surely alive; a pending wait completes aborted
  if (holders_ != 0) self_ = this->shared_from_this();  // until the last permit comes back
  has_observer_ = false;  // a permit given back later must not call an observer its owner may have freed
}

template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
REIN_SEPARATE_INLINE void limiter_core<Policy, Executor, Clock, Mutex, Signature>::release_permit(
    std::size_t n, std::chrono::nanoseconds stamp, std::uint64_t note, outcome result) noexcept {
  release(n, stamp, note, result, std::nullopt);
}

template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
REIN_SEPARATE_INLINE void limiter_core<Policy, Executor, Clock, Mutex, Signature>::release_permit_with_work(
    std::size_t n, std::chrono::nanoseconds stamp, std::uint64_t note, outcome result, double work) noexcept {
  release(n, stamp, note, result, std::nullopt, work);
}

template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
REIN_SEPARATE_INLINE void limiter_core<Policy, Executor, Clock, Mutex, Signature>::cancel_wait(wait_op* op) noexcept {
  std::shared_ptr<limiter_core> last;  // the core's own reference after shutdown: dropped after the unlock
  completions done(this);
  line_lock lock(*this);
  switch (op->status.load(std::memory_order_relaxed)) {
    case wait_status::queued:
      if (!op->drain) {  // a drain is not an acquire
        ++stats_.cancelled_total;
        if (done.observing()) done.buffer().reject(reject_reason::cancelled);
      }
      unlink_locked(op, wait_status::aborted, done);
      break;
    case wait_status::granted:
      if (!revoke_locked(op, last)) return;
      break;
    default: return;  // final: someone else owns it
  }
  // The cancelled op may have been the head blocking smaller requests behind it, or its units are back.
  dispatch_locked(Clock::now(), done);
}

template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
REIN_SEPARATE_INLINE bool limiter_core<Policy, Executor, Clock, Mutex, Signature>::deliver(
    std::size_t n, std::chrono::nanoseconds stamp, std::uint8_t partition) noexcept {
  if (!shut_down_.load(std::memory_order_acquire)) return true;
  // Shut down between the grant and its runner: the grant never becomes a permit. A remote grant goes
  // back to the server (nobody will use those tokens).
  if constexpr (remote) return abandon(n, stamp, partition), false;
  std::shared_ptr<limiter_core> last;
  line_lock lock(*this);
  partition_released_locked(partition, n);
  if constexpr (with_permit) last = holder_gone_locked();
  return false;
}

template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
REIN_SEPARATE_INLINE void limiter_core<Policy, Executor, Clock, Mutex, Signature>::abandon(
    std::size_t n, std::chrono::nanoseconds stamp, std::uint8_t partition) noexcept {
  std::shared_ptr<limiter_core> last;  // declared first: dropped after update's lock is released
  update([&](Policy& p, time_point now) {
    partition_released_locked(partition, n);
    give_back(p, n, stamp, now);
    if constexpr (with_permit) last = holder_gone_locked();
  });
}

template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline try_status limiter_core<Policy, Executor, Clock, Mutex, Signature>::take_locked(
    std::size_t n, time_point now, std::chrono::nanoseconds& stamp, std::int64_t* retry_ns, std::uint8_t partition,
    std::uint64_t* note) {
  if (refused_locked(n, now)) return try_status::unavailable;
  if (!queue_.empty()) return busy_locked(queued_units_, n, now, retry_ns);
  if (!policy_.try_take(n, now)) return busy_locked(0, n, now, retry_ns);
  ++stats_.acquired_total;
  if constexpr (with_permit) ++holders_;
  partition_granted_locked(partition, n);
  stamp = to_ns(now);
  if (note != nullptr) *note = note_locked();
  return try_status::acquired;
}

template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
REIN_SEPARATE_INLINE bool limiter_core<Policy, Executor, Clock, Mutex, Signature>::admit_locked(
    wait_op* op, time_point deadline, completions& done) {
  const std::size_t n = op->count;
  if (closed_) return reject_locked(op, wait_status::closed, done), false;
  if (policy_.exceeds(n)) return reject_locked(op, wait_status::exceeds_capacity, done), false;
  time_point now = policy_now();
  // A timeless policy read no clock: its state does not depend on time, so any instant observes it.
  if (has_observer_) observe_locked(now, done);
  if constexpr (remote) return admit_remote_locked(static_cast<remote_wait_op*>(op), deadline, now, done);
  if (refused_locked(n, now)) return reject_locked(op, wait_status::unavailable, done), false;
  const bool first = queue_.empty();
  if (first && policy_.try_take(n, now)) return grant_at_once_locked(op, now, done), false;
  // A timeless policy read no clock above; the wait statistics, the deadline, a priority key and the
  // sojourn rule need one (a line with a sojourn rule times its waits on Clock: wait_clock_now is precise).
  if (!Policy::needs_time && (deadline != time_point::max() || order_ == queue_order::priority)) now = Clock::now();
  else if (!Policy::needs_time && (measure_wait_ || sojourn_)) now = wait_clock_now();
  // A coarse-timed wait starts on the coarse clock even when a deadline made `now` precise: both of its
  // ends are read on one clock (grant_locked), so its error stays below a tick and averages out.
  op->stamp_ns = to_ns(coarse_wait_ && deadline != time_point::max() ? wait_clock_now() : now).count();
  // May throw (a new key, no memory) having moved only V up to the first waiter's tag, as any arrival does.
  if (op->fair) tag_fair_locked(*op, first);
  const place at = first ? place{nullptr, 0} : place_locked(op);
  // A fair newcomer is tagged at or after the first waiter, so never placed ahead of it.
  assert(!op->fair || first || at.after != nullptr);
  // A newcomer placed at the head (lifo order, an urgent priority class) is served now if it fits,
  // whoever waits behind it (with partitions, once queued: dispatch puts a partition below its
  // guarantee first).
  if (!first && at.after == nullptr && !partitioned() && policy_.try_take(n, now))
    return grant_at_once_locked(op, now, done), false;
  const bool full = queue_.size() >= max_waiters_;
  // In a sorted order the evicted waiter is the last one: a newcomer that would be last is refused.
  if (full && (!evict_oldest_ || first || (sorted() && at.after == queue_.back())))
    return reject_locked(op, wait_status::queue_full, done), false;
  if (deadline != time_point::max() && (deadline <= now || cannot_meet(n, deadline, now, at.ahead, full)))
    return reject_locked(op, wait_status::timed_out, done), false;
  if (first) {
    if (!work_) work_.emplace(executor_);
    waiting_.store(true, std::memory_order_relaxed);
    if (sojourn_) sojourn_->empty_at(now);  // empty until now: the interval in force drained
  }
  queue_.insert_after(at.after, op);
  queued_units_ += n;
  if constexpr (partitionable) {
    if (sources_) partitions_.queued(op->partition);
  }
  const bool timed = push_deadline_locked(op, deadline);
  // The timer serves the head and the nearest deadline: an op queued behind others without a deadline
  // changes neither (the common case under contention), so the timer needs no work if it is armed, or if
  // nothing can need it (no time-based policy, no deadline). Otherwise an arm that failed before (see
  // dispatch_locked) is retried here.
  // A newcomer placed at the head changes the grant time the timer must serve.
  if (at.after == nullptr || timed ||
      !(timer_armed_ || (!Policy::needs_time && deadlines_.empty() && !sojourn_))) {
    try {
      arm_timer_locked(now);
    } catch (...) {
      dequeue_locked(op, done);
      throw;
    }
  }
  // Only now that it is queued for good does its key's turn move (the table has its slot: start_tag).
  if (op->fair) fair_admitted_locked(*op);
  // With partitions, a newcomer at the head, or one whose partition is below its guarantee, may be served
  // now (ahead of a head that does not fit): the line moves by the partition rule.
  const bool serve_now = partitioned() && (at.after == nullptr || partition_starved_locked(op->partition));
  if (!full && !serve_now) return true;
  // Evicted only now that nothing can throw. A weighted head that left may let the next ones in.
  if (full) evict_oldest_locked(done);
  dispatch_locked(Policy::needs_time ? now : clock_now_locked(), done);
  return op->status.load(std::memory_order_relaxed) == wait_status::queued;
}

template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
REIN_SEPARATE_INLINE void limiter_core<Policy, Executor, Clock, Mutex, Signature>::dispatch_locked(
    time_point now, completions& done) noexcept {
  for (;;) {
    if constexpr (remote) {
      serve_remote_locked(now, done);
    } else {
      while (!queue_.empty()) {
        wait_op* head = queue_.front();
        if (shed_head_locked(head, now, done)) continue;
        if (refused_locked(head->count, now)) {  // an open circuit fails the line at once
          count_rejection_locked(wait_status::unavailable, done);
          unlink_locked(head, wait_status::unavailable, done);
          continue;
        }
        if (partitioned()) {
          const starved_step step = serve_starved_locked(now, done);
          if (step == starved_step::granted) continue;
          if (step == starved_step::hold) break;
        }
        if (policy_.try_take(head->count, now)) {
          grant_locked(head, now, done);
        } else {
          break;
        }
      }
      if (sojourn_ && queue_.empty()) sojourn_->empty_at(now);  // drained (granted, shed or cancelled)
    }
    if (deadlines_.empty() || deadlines_.top()->deadline_ns > to_ns(now).count()) break;
    wait_op* expired = deadlines_.top()->op;
    if (!expired->drain) count_rejection_locked(wait_status::timed_out, done);  // a drain is no rejection
    unlink_locked(expired, wait_status::timed_out, done);
  }
  if (!drainers_.empty() && holders_ == inert_locked()) finish_drains_locked(done);
  arm_timer_locked_noexcept(now);
  if constexpr (remote) {
    policy_.take_outbox(pending_out_);
    // Sent after the unlock, when another thread may have destroyed the limiter: the batch keeps the core.
    if (!pending_out_.empty()) done.keep_for_sending();
  }
}

// Members defined outside the class only so that the class reads as a list: inline, as a definition in the
// class is.
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
template <class F>
inline void limiter_core<Policy, Executor, Clock, Mutex, Signature>::update_and_refuse(F&& f) {
  completions done(this);
  line_lock lock(*this);
  const time_point now = clock_now_locked();
  bool refuse = true;
  if constexpr (std::is_same_v<std::invoke_result_t<F&, Policy&, time_point>, bool>) refuse = f(policy_, now);
  else f(policy_, now);
  for (wait_op* op = refuse ? queue_.front() : nullptr; op != nullptr;) {
    wait_op* next = op->next;
    if (policy_.exceeds(op->count)) {
      count_rejection_locked(wait_status::exceeds_capacity, done);
      unlink_locked(op, wait_status::exceeds_capacity, done);
    }
    op = next;
  }
  dispatch_locked(now, done);
  if (has_observer_) observe_locked(now, done);
}

// Takes back a grant whose handler has not run, if the runner has not claimed it (see wait_op.hpp).
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline bool limiter_core<Policy, Executor, Clock, Mutex, Signature>::revoke_locked(
    wait_op* op, std::shared_ptr<limiter_core>& last) noexcept {
  if constexpr (!revocable) {
    (void)op, (void)last;
    return false;
  } else {
    wait_status expected = wait_status::granted;
    if (!op->status.compare_exchange_strong(expected, wait_status::aborted, std::memory_order_acq_rel)) return false;
    give_back(policy_, op->count, std::chrono::nanoseconds(op->stamp_ns), policy_now());
    if constexpr (with_permit) last = holder_gone_locked();  // after shutdown, maybe the last holder
    if constexpr (partitionable) {
      if (sources_) partitions_.revoked(op->partition, op->count);
    }
    --stats_.acquired_total;
    ++stats_.cancelled_total;
    ++revoked_grants_;
    return true;
  }
}

// A try that found no room: fills the retry hint if asked. Only a time-based policy knows one; `ahead`
// units wait in front (the policy's prediction is then a lower bound).
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
REIN_NOINLINE inline try_status limiter_core<Policy, Executor, Clock, Mutex, Signature>::busy_locked(
    std::size_t ahead, std::size_t n, time_point now, std::int64_t* retry_ns) const {
  if (retry_ns == nullptr) return try_status::busy;
  *retry_ns = -1;
  if constexpr (Policy::needs_time) {
    const std::optional<time_point> at =
        ahead == 0 ? std::optional<time_point>(policy_.ready_at(n, now)) : policy_.predict(ahead, n, now);
    if (at && *at == time_point::max()) *retry_ns = std::numeric_limits<std::int64_t>::max();
    else if (at) *retry_ns = std::max<std::int64_t>(0, ns_between(to_ns_saturated(*at), to_ns_saturated(now)));
  }
  return try_status::busy;
}

template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline bool limiter_core<Policy, Executor, Clock, Mutex, Signature>::admit_drain_locked(
    wait_op* op, time_point deadline, completions& done) {
  if (holders_ == inert_locked()) return finish_locked(op, wait_status::delivered, done), false;
  if (deadline != time_point::max() && deadline <= Clock::now())
    return finish_locked(op, wait_status::timed_out, done), false;
  if (!work_) work_.emplace(executor_);
  drainers_.push_back(op);
  if (!push_deadline_locked(op, deadline)) return true;
  try {
    arm_timer_locked(Clock::now());
  } catch (...) {
    dequeue_locked(op, done);
    throw;
  }
  return true;
}

// Takes a queued op out of its line and the heap, without completing it.
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline void limiter_core<Policy, Executor, Clock, Mutex, Signature>::dequeue_locked(
    wait_op* op, completions& done) noexcept {
  if (op->drain) {
    drainers_.erase(op);
  } else {
    if constexpr (remote) {
      auto* remote_op = static_cast<remote_wait_op*>(op);
      if (remote_op->in_flight) {  // its verdict will find no op (see remote_admission.hpp)
        remote_op->in_flight = false;
        --in_flight_ops_;
        policy_.forget(remote_op->ticket);
      }
    }
    queue_.erase(op);
    queued_units_ -= op->count;
    if constexpr (partitionable) {
      if (sources_) partitions_.dequeued(op->partition);
    }
    if (queue_.empty()) {
      waiting_.store(false, std::memory_order_relaxed);
      if (fair_) fair_->idle();
    }
  }
  if (op->deadline_ns() != no_deadline) deadlines_.erase(op->timer);
  if (queue_.empty() && drainers_.empty() && work_) {
    done.idle_work.emplace(std::move(*work_));
    work_.reset();
  }
}

// Fails every acquire waiting; drain waits too when the limiter goes away (not on close).
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline void limiter_core<Policy, Executor, Clock, Mutex, Signature>::fail_all_locked(
    wait_status status, completions& done) noexcept {
  closed_ = true;
  while (!queue_.empty()) {
    if (status == wait_status::closed) count_rejection_locked(status, done);
    unlink_locked(queue_.front(), status, done);
  }
  if (status == wait_status::aborted)
    while (!drainers_.empty()) unlink_locked(drainers_.front(), status, done);
  // What is still due keeps the timer: a drainer's deadline, and a lease's end (a hung holder's slots come
  // back, and a drain waiting for them ends). Nothing due: the arm cancels it.
  arm_timer_locked_noexcept(clock_now_locked());
}

}  // namespace rein::detail
