// The waiter core every async rein limiter is built on. Not API.
//
// A limiter = a Policy (the admission rule: counts, tokens, a limit) + this core (lock, FIFO of parked ops,
// deadline heap, one timer, statistics). The core asks the policy about the head of the line only, so
// admission is strictly FIFO with head-of-line blocking: a big request is not starved by small ones.
//
// Policy requirements. Every member is called under the core's lock and must neither block nor call user code:
//   static constexpr bool needs_time;   false: `now` arguments are never read (the clock is not consulted
//                                       on the fast path)
//   bool exceeds(std::size_t n) const;  n can never be granted: complete with errc::exceeds_capacity at once
//   bool try_take(std::size_t n, time_point now);
//                                       take n and return true, or change nothing and return false
//   time_point ready_at(std::size_t n, time_point now) const;
//                                       the earliest instant try_take(n) succeeds if nothing else changes;
//                                       time_point::max() if only an event (a release) can make it succeed
//   time_point predict(std::size_t ahead, std::size_t n, time_point now) const;
//                                       when a waiter for n queued behind `ahead` units would be granted;
//                                       max() when unknown. Lets a deadline that cannot be met fail at once.
//   void on_release(std::size_t n, std::chrono::nanoseconds stamp, outcome result, time_point now);
//                                       a permit came back (concurrency limiters only)
//
// Locking discipline: under the lock the core only moves pointers, asks the policy, and arms its own timer
// (Asio timers are not thread-safe, so the lock is what serialises them; the timer's handler is ours). User
// handlers are posted after the lock is released, through ready_list::complete_all.
//
// Lifetime: the public limiter owns the core through a shared_ptr; a pending timer wait holds another, so a
// timer completion already queued when the limiter is destroyed still finds the core alive (it then does
// nothing). Permits and cancellation handlers hold plain pointers: permits must not outlive the limiter (a
// debug assertion checks it), and cancellation handlers look at their op's status before touching the core.
#pragma once

#include <rein/config.hpp>
#include <rein/detail/deadline_heap.hpp>
#include <rein/detail/op_queue.hpp>
#include <rein/detail/permit_source.hpp>
#include <rein/detail/wait_op.hpp>
#include <rein/outcome.hpp>
#include <rein/permit.hpp>
#include <rein/wait_stats.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/basic_waitable_timer.hpp>
#include <asio/wait_traits.hpp>
#else
#include <boost/asio/basic_waitable_timer.hpp>
#include <boost/asio/wait_traits.hpp>
#endif

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

namespace rein::detail {

template <class Policy, class Executor, class Clock, class Mutex, bool WithPermit>
class limiter_core final : public permit_source,
                           public canceller,
                           public std::enable_shared_from_this<limiter_core<Policy, Executor, Clock, Mutex, WithPermit>> {
 public:
  using executor_type = Executor;
  using clock_type = Clock;
  using time_point = typename Clock::time_point;
  using duration = typename Clock::duration;
  using timer_type = net::basic_waitable_timer<Clock, net::wait_traits<Clock>, Executor>;

  template <class... PolicyArgs>
  limiter_core(const Executor& ex, std::size_t max_waiters, PolicyArgs&&... policy_args)
      : executor_(ex), timer_(ex), policy_(std::forward<PolicyArgs>(policy_args)...), max_waiters_(max_waiters) {}

  limiter_core(const limiter_core&) = delete;
  limiter_core& operator=(const limiter_core&) = delete;

  ~limiter_core() {
#ifndef NDEBUG
    assert(live_permits_.load(std::memory_order_relaxed) == 0 && "rein: a permit outlived its limiter");
#endif
  }

  const Executor& get_executor() const noexcept { return executor_; }

  /// Takes n at once if nobody waits and the policy allows it. The fast path: no allocation, no scheduler.
  /// On success, `stamp` receives the grant time (nanoseconds since the clock's epoch; zero when the policy
  /// does not need time).
  bool try_acquire(std::size_t n, std::chrono::nanoseconds& stamp) {
    std::lock_guard<Mutex> lock(mutex_);
    if (closed_ || !queue_.empty() || policy_.exceeds(n)) return false;
    const time_point now = policy_now();
    if (!policy_.try_take(n, now)) return false;
    ++stats_.acquired_total;
    stamp = to_ns(now);
    return true;
  }

  /// Starts a waiting acquire of n, completing through `handler` (see wait_op_impl for the signature).
  /// `deadline` of time_point::max() means none.
  template <class Handler>
  void async_acquire(Handler&& handler, std::size_t n, time_point deadline) {
    using op_type = wait_op_impl<std::decay_t<Handler>, Executor, WithPermit>;
    op_type* op = op_type::create(std::forward<Handler>(handler), n);  // allocate before taking the lock
    ready_list ready;
    bool queued = false;
    {
      std::lock_guard<Mutex> lock(mutex_);
      queued = admit_locked(op, deadline, ready);
      // The slot is connected under the lock so that a grant racing with it cannot free the op first.
      if (queued) op->connect_cancellation(this);
    }
    ready.complete_all(&executor_, source());
  }

  /// Runs f(policy, now) under the lock, then grants whatever became grantable. For releases, rate changes,
  /// added permits: anything that can let waiters through.
  template <class F>
  decltype(auto) update(F&& f) {
    ready_list ready;
    struct completer {
      limiter_core* self;
      ready_list* list;
      ~completer() { list->complete_all(&self->executor_, self->source()); }
    } complete_after{this, &ready};  // runs after the lock below is released, also for a void f
    std::lock_guard<Mutex> lock(mutex_);
    // With nobody waiting and a timeless policy (a semaphore's release), the clock is not read.
    const time_point now = (Policy::needs_time || !queue_.empty()) ? Clock::now() : time_point{};
    struct dispatcher {
      limiter_core* self;
      time_point now;
      ready_list* list;
      ~dispatcher() { self->dispatch_locked(now, *list); }
    } dispatch_after{this, now, &ready};
    return std::forward<F>(f)(policy_, now);
  }

  /// Runs f(const policy&, const wait_stats&) under the lock and returns its result (snapshots, queries).
  template <class F>
  decltype(auto) inspect(F&& f) const {
    std::lock_guard<Mutex> lock(mutex_);
    wait_stats s = stats_;
    s.waiting = queue_.size();
    return std::forward<F>(f)(policy_, s);
  }

  /// Completes every waiter with errc::closed; later acquires fail the same way. Idempotent.
  void close() { fail_all(wait_status::closed); }

  /// For the limiter's destructor: waiters complete with operation_aborted, the timer stops.
  void shutdown() {
    fail_all(wait_status::aborted);
    std::lock_guard<Mutex> lock(mutex_);
    shut_down_ = true;
    timer_.cancel();
  }

  bool is_closed() const {
    std::lock_guard<Mutex> lock(mutex_);
    return closed_;
  }

  // permit_source
  void release_permit(std::size_t n, std::chrono::nanoseconds stamp, outcome result) noexcept override {
#ifndef NDEBUG
    live_permits_.fetch_sub(1, std::memory_order_relaxed);
#endif
    update([&](Policy& p, time_point now) { p.on_release(n, stamp, result, now); });
  }

  void permit_created() noexcept override {
#ifndef NDEBUG
    live_permits_.fetch_add(1, std::memory_order_relaxed);
#endif
  }

  /// A permit for n just taken on the fast path.
  permit make_permit(std::size_t n, std::chrono::nanoseconds stamp) noexcept { return permit(this, n, stamp); }

  // canceller
  void cancel_wait(wait_op* op) noexcept override {
    ready_list ready;
    {
      std::lock_guard<Mutex> lock(mutex_);
      if (op->status.load(std::memory_order_relaxed) != wait_status::queued) return;  // lost the race
      ++stats_.cancelled_total;
      unlink_locked(op, wait_status::aborted, ready);
      // The cancelled op may have been the head blocking smaller requests behind it.
      dispatch_locked(Clock::now(), ready);
    }
    ready.complete_all(&executor_, source());
  }

  static std::chrono::nanoseconds to_ns(time_point t) noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch());
  }

 private:
  permit_source* source() noexcept {
    if constexpr (WithPermit) return this;
    else return nullptr;
  }

  time_point policy_now() const {
    if constexpr (Policy::needs_time) return Clock::now();
    else return time_point{};
  }

  // Decides a new op's fate under the lock. Returns true if it was queued.
  bool admit_locked(wait_op* op, time_point deadline, ready_list& ready) {
    const std::size_t n = op->count;
    if (closed_) return finish_locked(op, wait_status::closed, ready), false;
    if (policy_.exceeds(n)) return finish_locked(op, wait_status::exceeds_capacity, ready), false;
    const time_point now = Clock::now();
    if (queue_.empty() && policy_.try_take(n, now)) {
      op->stamp_ns = to_ns(now).count();
      ++stats_.acquired_total;
      return finish_locked(op, wait_status::granted, ready), false;
    }
    if (queue_.size() >= max_waiters_) {
      ++stats_.queue_full_total;
      ++stats_.rejected_total;
      return finish_locked(op, wait_status::queue_full, ready), false;
    }
    if (deadline != time_point::max() && (deadline <= now || cannot_meet(n, deadline, now))) {
      ++stats_.timed_out_total;
      ++stats_.rejected_total;
      return finish_locked(op, wait_status::timed_out, ready), false;
    }
    op->stamp_ns = to_ns(now).count();
    queue_.push_back(op);
    queued_units_ += n;
    if (deadline != time_point::max()) {
      op->deadline_ns = to_ns(deadline).count();
      deadlines_.push(op);
    }
    arm_timer_locked(now);
    return true;
  }

  bool cannot_meet(std::size_t n, time_point deadline, time_point now) const {
    const time_point predicted = policy_.predict(queued_units_, n, now);
    return predicted != time_point::max() && predicted > deadline;
  }

  static void finish_locked(wait_op* op, wait_status status, ready_list& ready) noexcept {
    op->status.store(status, std::memory_order_release);
    ready.push(op);
  }

  void unlink_locked(wait_op* op, wait_status status, ready_list& ready) noexcept {
    queue_.erase(op);
    queued_units_ -= op->count;
    if (op->deadline_ns != no_deadline) deadlines_.erase(op);
    finish_locked(op, status, ready);
  }

  // Grants from the head while the policy allows, expires deadlines, then arms the timer for what is next.
  // A grant and an expiry at the same instant: the grant wins (the deadline was "by then", inclusive).
  void dispatch_locked(time_point now, ready_list& ready) {
    for (;;) {
      while (!queue_.empty() && policy_.try_take(queue_.front()->count, now)) grant_locked(queue_.front(), now, ready);
      if (deadlines_.empty() || deadlines_.top()->deadline_ns > to_ns(now).count()) break;
      ++stats_.timed_out_total;
      ++stats_.rejected_total;
      unlink_locked(deadlines_.top(), wait_status::timed_out, ready);
    }
    arm_timer_locked(now);
  }

  void grant_locked(wait_op* op, time_point now, ready_list& ready) {
    const std::chrono::nanoseconds waited(to_ns(now).count() - op->stamp_ns);
    stats_.wait_total += waited;
    stats_.wait_max = std::max(stats_.wait_max, waited);
    ++stats_.acquired_total;
    op->stamp_ns = to_ns(now).count();
    unlink_locked(op, wait_status::granted, ready);
  }

  // One timer per limiter, armed for the earliest of: the head's grant time, the nearest deadline. It is
  // never re-armed for a later time (an early wake-up just recomputes), only for an earlier one.
  void arm_timer_locked(time_point now) {
    if (shut_down_) return;
    time_point wake = time_point::max();
    if (!queue_.empty()) {
      wake = policy_.ready_at(queue_.front()->count, now);
      // A policy whose ready_at is not after now yet refused: retry one tick later rather than spin.
      if (wake <= now) wake = now + duration(1);
    }
    if (!deadlines_.empty()) wake = std::min(wake, time_point(std::chrono::duration_cast<duration>(
                                                      std::chrono::nanoseconds(deadlines_.top()->deadline_ns))));
    if (wake == time_point::max()) return;
    if (timer_armed_ && timer_at_ <= wake) return;
    timer_armed_ = true;
    timer_at_ = wake;
    ++timer_generation_;
    timer_.expires_at(wake);  // cancels a later wait; its handler sees a stale generation
    timer_.async_wait(timer_handler{this->shared_from_this(), timer_generation_});
  }

  struct timer_handler {
    std::shared_ptr<limiter_core> self;
    std::uint64_t generation;
    void operator()(const error_code&) const { self->on_timer(generation); }
  };

  void on_timer(std::uint64_t generation) {
    ready_list ready;
    {
      std::lock_guard<Mutex> lock(mutex_);
      if (shut_down_ || generation != timer_generation_) return;  // superseded by a re-arm
      timer_armed_ = false;
      dispatch_locked(Clock::now(), ready);
    }
    ready.complete_all(&executor_, source());
  }

  void fail_all(wait_status status) {
    ready_list ready;
    {
      std::lock_guard<Mutex> lock(mutex_);
      closed_ = true;
      while (!queue_.empty()) unlink_locked(queue_.front(), status, ready);
    }
    ready.complete_all(&executor_, source());
  }

  Executor executor_;
  mutable Mutex mutex_;
  timer_type timer_;
  Policy policy_;
  op_queue queue_;
  deadline_heap deadlines_;
  std::size_t max_waiters_;
  std::size_t queued_units_ = 0;
  wait_stats stats_{};
  time_point timer_at_{};
  std::uint64_t timer_generation_ = 0;
  bool timer_armed_ = false;
  bool closed_ = false;
  bool shut_down_ = false;
#ifndef NDEBUG
  std::atomic<std::size_t> live_permits_{0};
#endif
};

}  // namespace rein::detail
