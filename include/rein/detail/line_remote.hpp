// The waiting line's remote driver: the members of limiter_core (detail/limiter_core.hpp) that serve a
// remote policy. Not API.
//
// A remote policy (detail/remote_admission.hpp: a rule decided by a server) uses the same line: its ops may
// be in flight (their request out) while they keep their place, deadline and cancellation; verdicts come back
// through settle(); what it wants sent is taken under the lock and handed to its transport after the unlock.
#pragma once

#include <rein/detail/limiter_core.hpp>
#include <rein/detail/remote_admission.hpp>
#include <rein/detail/wait_op.hpp>

#include <atomic>
#include <utility>

namespace rein::detail {

// A remote policy's new op joins the line, then the line moves: it may be sent, granted or refused at once.
// Only the ops that wait their turn count against max_waiters, not those in flight.
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline bool limiter_core<Policy, Executor, Clock, Mutex, Signature>::admit_remote_locked(
    remote_wait_op* op, time_point deadline, time_point now, completions& done) {
  if (deadline != time_point::max() && deadline <= now) return reject_locked(op, wait_status::timed_out, done), false;
  if (queue_.empty()) {
    if (!work_) work_.emplace(executor_);
    waiting_.store(true, std::memory_order_relaxed);
  }
  op->stamp_ns = to_ns(now).count();
  queue_.push_back(op);
  queued_units_ += op->count;
  push_deadline_locked(op, deadline);
  dispatch_locked(now, done);
  if (op->status.load(std::memory_order_relaxed) != wait_status::queued) return false;
  if (!op->in_flight && queue_.size() - in_flight_ops_ > max_waiters_) {
    count_rejection_locked(wait_status::queue_full, done);
    unlink_locked(op, wait_status::queue_full, done);
    return false;
  }
  return true;
}

// Walks a remote line from the front: every op not in flight is offered to the policy, in order, until
// one must wait (ops in flight are passed over: their verdict decides them).
// A template, as send_pending: an explicit instantiation of a local line (rein/impl/src.hpp) then skips
// it (clang 14 instantiates a member of an explicitly instantiated class despite an unmet requires).
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
template <bool Remote>
  requires Remote
inline void limiter_core<Policy, Executor, Clock, Mutex, Signature>::serve_remote_locked(
    time_point now, completions& done) noexcept {
  for (wait_op* w = queue_.front(); w != nullptr;) {
    auto* op = static_cast<remote_wait_op*>(w);
    wait_op* next = w->next;  // read first: op may be unlinked below
    if (!op->in_flight && !apply_step_locked(op, policy_.admit(op, op->count, now), now, done)) break;
    w = next;
  }
}

// Applies a remote policy's answer for `op`; false if it must wait (and so must everyone behind it).
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline bool limiter_core<Policy, Executor, Clock, Mutex, Signature>::apply_step_locked(
    remote_wait_op* op, const remote_step& step, time_point now, completions& done) noexcept {
  switch (step.what) {
    case remote_step::kind::grant: grant_locked(op, now, done); return true;
    case remote_step::kind::sent:
      op->in_flight = true;
      op->ticket = step.ticket;
      ++in_flight_ops_;
      return true;
    case remote_step::kind::keep: return true;
    case remote_step::kind::fail:
      if (step.rejects) count_reason_locked(step.reason, done);
      op->failure = step.error;
      unlink_locked(op, wait_status::failed, done);
      return true;
    case remote_step::kind::wait: break;
  }
  return false;
}

// Sends what remote policies queued, in the order of the locked steps that queued it, although each step
// sends after its unlock and two threads may get there in either order: one thread at a time sends, the
// queue's head first, until the queue is empty; a thread that finds another sending leaves its messages
// to it (also a send that completes a refused request and so queues more, on the same thread). Order
// matters to a policy whose messages do not commute (a lease renewal states an absolute count).
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
template <bool Remote>
  requires Remote
inline void limiter_core<Policy, Executor, Clock, Mutex, Signature>::send_pending() noexcept {
  for (;;) {
    if (sending_.exchange(true, std::memory_order_acq_rel)) return;  // the sender sends ours too
    for (;;) {
      outbox_type batch;
      {
        line_lock lock(*this);
        if (pending_out_.empty()) break;
        std::swap(batch, pending_out_);
      }
      if (transport_) transport_->transmit(batch);
    }
    sending_.store(false, std::memory_order_release);
    // Queued after our last look but before the flag went down: its thread saw us sending and left.
    line_lock lock(*this);
    if (pending_out_.empty()) return;
  }
}

}  // namespace rein::detail
