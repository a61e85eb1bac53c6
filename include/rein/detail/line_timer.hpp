// The waiting line's timer: the members of limiter_core (detail/limiter_core.hpp) that arm its one Asio timer
// for the next instant anything can change, with the wake-up jitter, and run the line when it fires.
// Not API.
#pragma once

#include <rein/detail/limiter_core.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>

namespace rein::detail {

template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
struct limiter_core<Policy, Executor, Clock, Mutex, Signature>::timer_handler {
  std::shared_ptr<limiter_core> self;
  std::uint64_t generation;
  void operator()(const error_code&) const noexcept { self->on_timer(generation); }
};

// One timer per limiter, armed for the earliest of: the head's grant time, the nearest deadline. It is
// never re-armed for a later time (an early wake-up just recomputes), only for an earlier one, and it is
// cancelled when nothing needs it, so a stale deadline does not keep the execution context busy.
// Throws only if the timer wait cannot be started (no memory; for the first timer, also a system_error if
// the execution context cannot make its reactor); the timer is then left unarmed.
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline void limiter_core<Policy, Executor, Clock, Mutex, Signature>::arm_timer_locked(time_point now) {
  if (shut_down_.load(std::memory_order_relaxed)) return;
  time_point wake = time_point::max();
  if (const wait_op* head = first_waiting_locked()) {
    wake = policy_.ready_at(head->count, now);
    // A policy whose ready_at is not after now yet refused: retry one tick later rather than spin.
    if (wake <= now) wake = now + duration(1);
    if (wake_jitter_ns_ > 0 && wake != time_point::max()) wake = jittered_locked(wake);
    if (sojourn_) wake = std::min(wake, std::max(sojourn_wake_locked(*head), now + duration(1)));
  }
  if (!deadlines_.empty()) wake = std::min(wake, time_point(std::chrono::duration_cast<duration>(
                                                    std::chrono::nanoseconds(deadlines_.top()->deadline_ns))));
  if constexpr (leasable) {
    if (leases_) [[unlikely]] wake = std::min(wake, lease_wake_locked());
  }
  if (wake == time_point::max()) return cancel_timer_locked();
  if (timer_armed_ && timer_at_ <= wake) return;
  start_timer_locked(wake);
}

// The head's wake-up moved `draw` later, in [0, wake_jitter], drawn once per ready instant (re-arming for
// the same instant keeps its draw), so that lines on many replicas ready at one tick of a shared quota
// do not all ask at that tick (governor's until_ready_with_jitter). SplitMix64 on the seed: seeded and
// reproducible, no <random> in the core.
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline auto limiter_core<Policy, Executor, Clock, Mutex, Signature>::jittered_locked(
    time_point ready) noexcept -> time_point {
  const std::int64_t at = to_ns(ready).count();
  if (at != jitter_for_ns_) {
    jitter_for_ns_ = at;
    std::uint64_t z = (jitter_state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    jitter_draw_ns_ = static_cast<std::int64_t>(z % (static_cast<std::uint64_t>(wake_jitter_ns_) + 1));
  }
  const auto draw = std::chrono::duration_cast<duration>(std::chrono::nanoseconds(jitter_draw_ns_));
  return ready > time_point::max() - draw ? time_point::max() : ready + draw;
}

// Out of line: the checks above run on every grant, this only when the wake-up moves earlier.
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
REIN_NOINLINE inline void limiter_core<Policy, Executor, Clock, Mutex, Signature>::start_timer_locked(time_point wake) {
  timer_armed_ = false;
  ++timer_generation_;
  // Made on first use: creating a timer starts its execution context's reactor, which makes every later
  // post there dearer, and a semaphore without deadlines never
  // needs one.
  if (!timer_) timer_.emplace(executor_);
  timer_->expires_at(wake);  // cancels a later wait; its handler sees a stale generation
  timer_->async_wait(timer_handler{this->shared_from_this(), timer_generation_});
  timer_armed_ = true;
  timer_at_ = wake;
}

template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline void limiter_core<Policy, Executor, Clock, Mutex, Signature>::cancel_timer_locked() noexcept {
  if (timer_armed_) stop_timer_locked();
}

template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
REIN_NOINLINE inline void limiter_core<Policy, Executor, Clock, Mutex, Signature>::stop_timer_locked() noexcept {
  timer_armed_ = false;
  ++timer_generation_;
  try {
    timer_->cancel();
  } catch (...) {  // it then fires on time and finds a stale generation
  }
}

// For paths that must not throw (a release, a cancellation, close). If the timer wait cannot be started
// (no memory, or the first timer could not start its reactor: descriptors exhausted), the next wake-up
// waits for the next event (release, acquire, cancellation).
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline void limiter_core<Policy, Executor, Clock, Mutex, Signature>::arm_timer_locked_noexcept(
    time_point now) noexcept {
  try {
    arm_timer_locked(now);
  } catch (...) {
  }
}

// The timer fired: runs the line, unless a later arm or the shutdown superseded this wait. With
// REIN_SEPARATE_COMPILATION compiled in one unit only (config.hpp: REIN_SEPARATE_INLINE).
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
REIN_SEPARATE_INLINE void limiter_core<Policy, Executor, Clock, Mutex, Signature>::on_timer(
    std::uint64_t generation) noexcept {
  completions done(this);
  line_lock lock(*this);
  if (shut_down_.load(std::memory_order_relaxed) || generation != timer_generation_) return;  // superseded
  timer_armed_ = false;
  const time_point now = Clock::now();
  // A lease that ended by now goes first: a waiter is granted its units at that very instant.
  if constexpr (leasable) {
    if (leases_) expire_leases_locked(now, done);
  }
  dispatch_locked(now, done);
  if (has_observer_) observe_locked(now, done);
}

}  // namespace rein::detail
