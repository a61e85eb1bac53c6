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
// Optional:
//   void on_revoke(std::size_t n, time_point now);
//                                       a grant of n was taken back before its handler ran (a cancellation
//                                       that arrived after the grant): undo the try_take, e.g. refund tokens.
//                                       Without it, a concurrency limiter's revoked grant goes back through
//                                       on_release(n, stamp, outcome::ignored, now), and a rate limiter's grant
//                                       is not revocable (the handler gets it: the grant wins).
//
// Locking discipline: under the lock the core only moves pointers, asks the policy, and arms its own timer
// (Asio timers are not thread-safe, so the lock is what serialises them; the timer's handler is ours). User
// handlers are posted after the lock is released (class completions).
//
// Outstanding work: while anyone waits, the core holds a work guard on its executor, so `run()` does not
// return under a parked operation (as with any pending Asio operation); it is dropped after the last
// completion is posted. A handler bound to another execution context does not keep that context running.
//
// Lifetime: the public limiter owns the core through a shared_ptr; a pending timer wait holds another, and so
// does the runner of a granted op (see wait_op.hpp), so completions already queued when the limiter is
// destroyed still find the core alive. Permits and cancellation handlers hold plain pointers: permits must
// not outlive the limiter (a debug assertion checks it at shutdown), and cancellation handlers look at their
// op's status before touching the core.
//
// Observation: with an observer set, every locked path that can change what the policy reports (its
// optional `observed_state observe(time_point now) const`) compares it with the state last seen, and the
// events found, with rejections, are delivered after the lock is released (class completions). Without one,
// the only cost is a test of a bool on try_acquire and on an uncontended release.
//
// Wait histogram: a grant from the queue records its wait; grants made at once are added as zeros at the
// next inspect (every grant ever made, revoked ones included, has exactly one entry: the histogram's count
// catches up with acquired_total plus the revocations), so the fast path does no extra work. inspect hands
// out the statistics themselves, not a copy (8.7 KB with the histogram).
//
// Failure: an allocation failure while starting an acquire (the op, the cancellation slot, the timer wait,
// the work guard) leaves everything as it was and propagates. Completion never throws: a completion that
// cannot be posted (no memory) is dropped like one whose execution context was destroyed, giving its
// grant back, and a timer wait that cannot be started leaves the next wake-up to the next event.
#pragma once

#include <rein/config.hpp>
#include <rein/detail/deadline_heap.hpp>
#include <rein/detail/op_queue.hpp>
#include <rein/detail/permit_source.hpp>
#include <rein/detail/wait_op.hpp>
#include <rein/null_mutex.hpp>
#include <rein/observer.hpp>
#include <rein/outcome.hpp>
#include <rein/permit.hpp>
#include <rein/wait_stats.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/basic_waitable_timer.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/wait_traits.hpp>
#else
#include <boost/asio/basic_waitable_timer.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/wait_traits.hpp>
#endif

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <ratio>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace rein::detail {

/// What the public limiters pass to their core besides the policy.
struct line_options {
  std::size_t max_waiters;    ///< one more waiter completes with errc::queue_full
  bool measure_wait = true;   ///< time waits for wait_total, wait_max and the wait histogram (a timeless
                              ///< policy reads no clock for waits without a deadline when false)
  std::string name{};         ///< the limiter's name, for events, metrics and error messages
  limiter_observer observer{};  ///< called with events outside the lock; empty: none
};

/// "rein::semaphore" or, for a named limiter, "rein::semaphore \"api\"": how messages name a limiter.
inline std::string describe(std::string_view type, std::string_view name) {
  std::string s(type);
  if (!name.empty()) {
    s += " \"";
    s += name;
    s += '"';
  }
  return s;
}

template <class Policy, class Executor, class Clock, class Mutex, bool WithPermit>
class limiter_core final : public permit_source,
                           public wait_owner,
                           public std::enable_shared_from_this<limiter_core<Policy, Executor, Clock, Mutex, WithPermit>> {
 public:
  using executor_type = Executor;
  using clock_type = Clock;
  using time_point = typename Clock::time_point;
  using duration = typename Clock::duration;
  using timer_type = net::basic_waitable_timer<Clock, net::wait_traits<Clock>, Executor>;

  template <class... PolicyArgs>
  limiter_core(const Executor& ex, line_options options, PolicyArgs&&... policy_args)
      : executor_(ex),
        policy_(std::forward<PolicyArgs>(policy_args)...),
        max_waiters_(options.max_waiters),
        measure_wait_(Policy::needs_time || options.measure_wait),
        has_observer_(static_cast<bool>(options.observer)),
        name_(std::move(options.name)),
        observer_(std::move(options.observer)) {
    if (has_observer_) last_observed_ = observe_now(Clock::now());
  }

  limiter_core(const limiter_core&) = delete;
  limiter_core& operator=(const limiter_core&) = delete;
  ~limiter_core() = default;

  const Executor& get_executor() const noexcept { return executor_; }

  /// The name given in the options (empty if none).
  const std::string& name() const noexcept { return name_; }

  /// Takes n at once if nobody waits and the policy allows it. The fast path: no allocation, no scheduler.
  /// On success, `stamp` receives the grant time (nanoseconds since the clock's epoch; zero when the policy
  /// does not need time).
  bool try_acquire(std::size_t n, std::chrono::nanoseconds& stamp) {
    if (has_observer_) return try_acquire_observed(n, stamp);
    std::lock_guard<Mutex> lock(mutex_);
    if (closed_ || !queue_.empty() || policy_.exceeds(n)) return false;
    const time_point now = policy_now();
    if (!policy_.try_take(n, now)) return false;
    ++stats_.acquired_total;
    stamp = to_ns(now);
    return true;
  }

  /// Whether anyone waited a moment ago, read without the lock: true means try_acquire would most likely
  /// fail, so a caller about to wait anyway can skip it (and its lock). Either answer may be stale.
  bool waiting_hint() const noexcept { return waiting_.load(std::memory_order_relaxed); }

  /// Starts a waiting acquire of n, completing through `handler` (see wait_op_impl for the signature).
  /// `deadline` of time_point::max() means none (deadline_after() computes one without overflow).
  /// If this throws (no memory), nothing changed and the handler was destroyed uncalled.
  template <class Handler>
  void async_acquire(Handler&& handler, std::size_t n, time_point deadline) {
    using op_type = wait_op_impl<std::decay_t<Handler>, Executor, WithPermit, !std::is_same_v<Mutex, null_mutex>>;
    op_type* op = op_type::create(std::forward<Handler>(handler), n);  // allocate before taking the lock
    completions done(this);
    try {
      std::lock_guard<Mutex> lock(mutex_);
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

  /// Runs f(policy, now) under the lock, then grants whatever became grantable. For releases, rate changes,
  /// added permits: anything that can let waiters through.
  template <class F>
  decltype(auto) update(F&& f) {
    completions done(this);  // posts after the lock below is released, also for a void f
    std::lock_guard<Mutex> lock(mutex_);
    // With nobody waiting and a timeless policy (a semaphore's release), the clock is not read.
    const time_point now = (Policy::needs_time || !queue_.empty()) ? Clock::now() : time_point{};
    struct dispatcher {
      limiter_core* self;
      time_point now;
      completions* done;
      ~dispatcher() {
        self->dispatch_locked(now, *done);
        if (self->has_observer_) self->observe_locked(now, *done);
      }
    } dispatch_after{this, now, &done};
    return std::forward<F>(f)(policy_, now);
  }

  /// Runs f(const policy&, const wait_stats&) under the lock and returns its result (snapshots, queries).
  /// The statistics are the core's own (valid during the call only), brought up to date first.
  template <class F>
  decltype(auto) inspect(F&& f) const {
    std::lock_guard<Mutex> lock(mutex_);
    stats_.waiting = queue_.size();
    // Grants made at once since the last inspect, as zero waits (see the top of the file).
    if (measure_wait_) {
      const std::uint64_t recorded = stats_.wait.count();
      const std::uint64_t granted = stats_.acquired_total + revoked_grants_;
      if (granted > recorded) stats_.wait.record(std::chrono::nanoseconds{0}, granted - recorded);
    }
    return std::forward<F>(f)(policy_, static_cast<const wait_stats&>(stats_));
  }

  /// Completes every waiter with errc::closed; later acquires fail the same way. Idempotent.
  void close() {
    completions done(this);
    std::lock_guard<Mutex> lock(mutex_);
    fail_all_locked(wait_status::closed, done);
  }

  /// For the limiter's destructor: waiters complete with operation_aborted, grants not yet delivered will
  /// complete with operation_aborted too, the timer stops.
  void shutdown() {
    completions done(this);
    std::lock_guard<Mutex> lock(mutex_);
    fail_all_locked(wait_status::aborted, done);
    shut_down_.store(true, std::memory_order_release);
    cancel_timer_locked();
#ifndef NDEBUG
    assert(live_permits_.load(std::memory_order_relaxed) == 0 && "rein: a permit outlived its limiter");
#endif
  }

  bool is_closed() const {
    std::lock_guard<Mutex> lock(mutex_);
    return closed_;
  }

  /// The deadline `timeout` from now, saturated: a timeout too long to represent means none
  /// (time_point::max()), one too far negative means the earliest representable instant.
  static time_point deadline_after(duration timeout) {
    const time_point now = Clock::now();
    if (timeout > duration::zero() && now > time_point::max() - timeout) return time_point::max();
    if (timeout < duration::zero() && now < time_point::min() - timeout) return time_point::min();
    return now + timeout;
  }

  // permit_source
  void release_permit(std::size_t n, std::chrono::nanoseconds stamp, outcome result) noexcept override {
#ifndef NDEBUG
    live_permits_.fetch_sub(1, std::memory_order_relaxed);
#endif
    std::unique_lock<Mutex> lock(mutex_);
    if (queue_.empty() && !timer_armed_) {
      // Nobody to grant and no timer to re-aim (the uncontended case): no dispatch, nothing to post.
      if (has_observer_) return release_observed(lock, n, stamp, result);
      policy_.on_release(n, stamp, result, policy_now());
      return;
    }
    completions done(this);
    const time_point now = clock_now_locked();
    policy_.on_release(n, stamp, result, now);
    dispatch_locked(now, done);
    if (has_observer_) observe_locked(now, done);
    lock.unlock();  // before `done` posts, although it was declared after the lock
  }

  void permit_created() noexcept override {
#ifndef NDEBUG
    live_permits_.fetch_add(1, std::memory_order_relaxed);
#endif
  }

  /// A permit for n just taken on the fast path.
  permit make_permit(std::size_t n, std::chrono::nanoseconds stamp) noexcept { return permit(this, n, stamp); }

  // wait_owner
  void cancel_wait(wait_op* op) noexcept override {
    completions done(this);
    std::lock_guard<Mutex> lock(mutex_);
    switch (op->status.load(std::memory_order_relaxed)) {
      case wait_status::queued:
        ++stats_.cancelled_total;
        if (done.observing) done.buffer().reject(reject_reason::cancelled);
        unlink_locked(op, wait_status::aborted, done);
        break;
      case wait_status::granted:
        if (!revoke_locked(op)) return;
        break;
      default: return;  // final: someone else owns it
    }
    // The cancelled op may have been the head blocking smaller requests behind it, or its units are back.
    dispatch_locked(Clock::now(), done);
  }

  bool deliver(std::size_t, std::chrono::nanoseconds) noexcept override {
    return !shut_down_.load(std::memory_order_acquire);
  }

  void abandon(std::size_t n, std::chrono::nanoseconds stamp) noexcept override {
    update([&](Policy& p, time_point now) { give_back(p, n, stamp, now); });
  }

  permit_source* source() noexcept override {
    if constexpr (WithPermit) return this;
    else return nullptr;
  }

  static std::chrono::nanoseconds to_ns(time_point t) noexcept {
    return std::chrono::nanoseconds(to_ns_saturated(t));
  }

 private:
  using work_guard = net::executor_work_guard<Executor>;

  // What to do once the lock is released: post the completions made ready under it, then drop the work
  // guard if the line emptied (in that order, so that the context cannot run out of work in between).
  // Declared before the lock_guard in every path, so that its destructor runs after the unlock.
  class completions {
   public:
    explicit completions(limiter_core* core) noexcept : observing(core->has_observer_), core_(core) {}
    completions(const completions&) = delete;
    completions& operator=(const completions&) = delete;
    ~completions() {
      std::shared_ptr<wait_owner> keep = std::move(keep_alive_);  // released last, after the posting
      ready.complete_all(&core_->executor_, core_, keep);
      if (events && !events->empty()) events->deliver(core_->observer_, core_->name_);
      idle_work.reset();
    }

    // Every op made ready goes through here, under the lock. The ops are posted after the lock is released,
    // when another thread may already have destroyed a limiter that became idle (rein::keyed evicts idle
    // ones): so the core is kept alive until they are posted, by a reference that the runners of granted
    // ops then share (a runner keeps the core alive until its handler has the permit; see wait_op.hpp).
    void push(wait_op* op) noexcept {
      if (!keep_alive_) keep_alive_ = core_->weak_from_this().lock();
      ready.push(op);
    }

    ready_list ready;
    std::optional<work_guard> idle_work;
    const bool observing;                // the limiter has an observer
    std::optional<event_buffer> events;  // engaged at the first event

    event_buffer& buffer() noexcept {
      if (!events) events.emplace();
      return *events;
    }

   private:
    limiter_core* core_;
    std::shared_ptr<wait_owner> keep_alive_;
  };

  static constexpr bool revocable = WithPermit || requires(Policy& p, std::size_t n, time_point t) { p.on_revoke(n, t); };

  static void give_back(Policy& p, std::size_t n, std::chrono::nanoseconds stamp, time_point now) noexcept {
    if constexpr (requires { p.on_revoke(n, now); }) p.on_revoke(n, now);
    else if constexpr (WithPermit) p.on_release(n, stamp, outcome::ignored, now);
    else (void)p, (void)n, (void)stamp, (void)now;
  }

  // Takes back a grant whose handler has not run, if the runner has not claimed it (see wait_op.hpp).
  bool revoke_locked(wait_op* op) noexcept {
    if constexpr (!revocable) {
      (void)op;
      return false;
    } else {
      wait_status expected = wait_status::granted;
      if (!op->status.compare_exchange_strong(expected, wait_status::aborted, std::memory_order_acq_rel)) return false;
      give_back(policy_, op->count, std::chrono::nanoseconds(op->stamp_ns), policy_now());
      --stats_.acquired_total;
      ++stats_.cancelled_total;
      ++revoked_grants_;
      return true;
    }
  }

  time_point policy_now() const {
    if constexpr (Policy::needs_time) return Clock::now();
    else return time_point{};
  }

  // The time for grants and expiries while ops may wait: needed by the policy, the wait statistics, or a
  // deadline. A clock read costs about a tenth of a contended handoff (two per waited acquire).
  time_point clock_now_locked() const {
    if (measure_wait_ || !deadlines_.empty()) return Clock::now();
    return time_point{};
  }

  static std::int64_t to_ns_saturated(time_point t) noexcept {
    using ns = std::chrono::nanoseconds;
    const duration d = t.time_since_epoch();
    if constexpr (!std::ratio_less_equal_v<typename duration::period, std::nano>) {
      // A coarser clock can hold instants beyond what nanoseconds can (about 292 years).
      constexpr duration most = std::chrono::duration_cast<duration>(ns::max());
      constexpr duration least = std::chrono::duration_cast<duration>(ns::min());
      if (d >= most) return ns::max().count();
      if (d <= least) return ns::min().count();
    }
    return std::chrono::duration_cast<ns>(d).count();
  }

  // Decides a new op's fate under the lock. Returns true if it was queued. If it throws (no memory for the
  // work guard or the timer wait), it changed nothing.
  bool admit_locked(wait_op* op, time_point deadline, completions& done) {
    const std::size_t n = op->count;
    if (closed_) return reject_locked(op, wait_status::closed, done), false;
    if (policy_.exceeds(n)) return reject_locked(op, wait_status::exceeds_capacity, done), false;
    time_point now = policy_now();
    // A timeless policy read no clock: its state does not depend on time, so any instant observes it.
    if (has_observer_) observe_locked(now, done);
    if (queue_.empty() && policy_.try_take(n, now)) {
      op->stamp_ns = to_ns(now).count();
      ++stats_.acquired_total;
      return finish_locked(op, wait_status::granted, done), false;
    }
    // A timeless policy read no clock above; the wait statistics and the deadline need one from here on.
    if (!Policy::needs_time && (measure_wait_ || deadline != time_point::max())) now = Clock::now();
    if (queue_.size() >= max_waiters_) return reject_locked(op, wait_status::queue_full, done), false;
    if (deadline != time_point::max() && (deadline <= now || cannot_meet(n, deadline, now)))
      return reject_locked(op, wait_status::timed_out, done), false;
    const bool first = queue_.empty();
    if (first) {
      work_.emplace(executor_);
      waiting_.store(true, std::memory_order_relaxed);
    }
    op->stamp_ns = to_ns(now).count();
    op->seq = next_seq_++;
    queue_.push_back(op);
    queued_units_ += n;
    // A deadline beyond what nanoseconds can count (a coarse clock's far future) is no deadline: the heap
    // holds exactly the ops whose deadline_ns is not no_deadline, which is how dequeue_locked finds them.
    if (deadline != time_point::max()) op->deadline_ns = to_ns_saturated(deadline);
    if (op->deadline_ns != no_deadline) deadlines_.push(op);
    // The timer serves the head and the nearest deadline: an op queued behind others without a deadline
    // changes neither (the common case under contention), so the timer needs no work if it is armed, or if
    // nothing can need it (no time-based policy, no deadline). Otherwise an arm that failed before (see
    // dispatch_locked) is retried here.
    if (!first && op->deadline_ns == no_deadline && (timer_armed_ || (!Policy::needs_time && deadlines_.empty())))
      return true;
    try {
      arm_timer_locked(now);
    } catch (...) {
      dequeue_locked(op, done);
      throw;
    }
    return true;
  }

  bool cannot_meet(std::size_t n, time_point deadline, time_point now) const {
    const time_point predicted = policy_.predict(queued_units_, n, now);
    return predicted != time_point::max() && predicted > deadline;
  }

  static void finish_locked(wait_op* op, wait_status status, completions& done) noexcept {
    op->status.store(status, std::memory_order_release);
    done.push(op);
  }

  // Counts a rejection for its reason (queue_full, timed_out, exceeds_capacity, closed) and reports it.
  void count_rejection_locked(wait_status status, completions& done) noexcept {
    ++stats_.rejected_total;
    reject_reason why = reject_reason::closed;
    switch (status) {
      case wait_status::queue_full: ++stats_.queue_full_total; why = reject_reason::queue_full; break;
      case wait_status::timed_out: ++stats_.timed_out_total; why = reject_reason::timed_out; break;
      case wait_status::exceeds_capacity: ++stats_.exceeds_capacity_total; why = reject_reason::exceeds_capacity; break;
      default: ++stats_.closed_total; break;
    }
    if (done.observing) done.buffer().reject(why);
  }

  // A new op turned away at once.
  void reject_locked(wait_op* op, wait_status status, completions& done) noexcept {
    count_rejection_locked(status, done);
    finish_locked(op, status, done);
  }

  template <class P>
  static constexpr bool observable = requires(const P& p, time_point t) {
    { p.observe(t) } -> std::same_as<observed_state>;
  };

  observed_state observe_now(time_point now) const noexcept {
    if constexpr (observable<Policy>) return policy_.observe(now);
    else return (void)now, observed_state{};
  }

  // Events of a locked section that completes nothing (the observed fast paths), delivered after the lock
  // (declared before it): lighter than a completions batch.
  class event_sink {
   public:
    explicit event_sink(limiter_core* core) noexcept : core_(core) {}
    event_sink(const event_sink&) = delete;
    event_sink& operator=(const event_sink&) = delete;
    ~event_sink() {
      if (events && !events->empty()) events->deliver(core_->observer_, core_->name_);
    }
    static constexpr bool observing = true;
    event_buffer& buffer() noexcept {
      if (!events) events.emplace();
      return *events;
    }
    std::optional<event_buffer> events;

   private:
    limiter_core* core_;
  };

  // Finds what changed since the last observation (see the top of the file).
  template <class Sink>
  void observe_locked(time_point now, Sink& done) noexcept {
    if constexpr (observable<Policy>) {
      const observed_state current = policy_.observe(now);
      if (done.observing && !(current == last_observed_)) current.diff(last_observed_, done.buffer());
      last_observed_ = current;
    } else {
      (void)now, (void)done;
    }
  }

  // try_acquire with an observer: the same, and what it found is delivered after the lock.
  REIN_NOINLINE bool try_acquire_observed(std::size_t n, std::chrono::nanoseconds& stamp) {
    event_sink done(this);
    std::lock_guard<Mutex> lock(mutex_);
    const time_point now = policy_now();
    observe_locked(now, done);
    if (closed_ || !queue_.empty() || policy_.exceeds(n)) return false;
    if (!policy_.try_take(n, now)) return false;
    ++stats_.acquired_total;
    stamp = to_ns(now);
    observe_locked(now, done);
    return true;
  }

  // The uncontended release with an observer: the limit may have moved (an adaptive limiter's sample).
  REIN_NOINLINE void release_observed(std::unique_lock<Mutex>& lock, std::size_t n, std::chrono::nanoseconds stamp,
                                      outcome result) noexcept {
    event_sink done(this);
    const time_point now = policy_now();
    policy_.on_release(n, stamp, result, now);
    observe_locked(now, done);
    lock.unlock();  // before `done` delivers, although it was declared after the lock
  }

  // Takes a queued op out of the line and the heap, without completing it.
  void dequeue_locked(wait_op* op, completions& done) noexcept {
    queue_.erase(op);
    queued_units_ -= op->count;
    if (op->deadline_ns != no_deadline) deadlines_.erase(op);
    if (queue_.empty()) {
      waiting_.store(false, std::memory_order_relaxed);
      if (work_) {
        done.idle_work.emplace(std::move(*work_));
        work_.reset();
      }
    }
  }

  void unlink_locked(wait_op* op, wait_status status, completions& done) noexcept {
    dequeue_locked(op, done);
    finish_locked(op, status, done);
  }

  // Grants from the head while the policy allows, expires deadlines, then arms the timer for what is next.
  // A grant and an expiry at the same instant: the grant wins (the deadline was "by then", inclusive).
  void dispatch_locked(time_point now, completions& done) noexcept {
    for (;;) {
      while (!queue_.empty() && policy_.try_take(queue_.front()->count, now)) grant_locked(queue_.front(), now, done);
      if (deadlines_.empty() || deadlines_.top()->deadline_ns > to_ns(now).count()) break;
      count_rejection_locked(wait_status::timed_out, done);
      unlink_locked(deadlines_.top(), wait_status::timed_out, done);
    }
    try {
      arm_timer_locked(now);
    } catch (...) {
      // No memory for the timer wait, or the first timer could not start its reactor (descriptors
      // exhausted): the next wake-up waits for the next event (release, acquire, cancellation) instead of
      // failing a release, which must not throw.
    }
  }

  void grant_locked(wait_op* op, time_point now, completions& done) noexcept {
    if (measure_wait_) {
      const std::chrono::nanoseconds waited(to_ns(now).count() - op->stamp_ns);
      stats_.wait_total += waited;
      stats_.wait_max = std::max(stats_.wait_max, waited);
      stats_.wait.record(waited);
    }
    ++stats_.acquired_total;
    op->stamp_ns = to_ns(now).count();
    unlink_locked(op, wait_status::granted, done);
  }

  // One timer per limiter, armed for the earliest of: the head's grant time, the nearest deadline. It is
  // never re-armed for a later time (an early wake-up just recomputes), only for an earlier one, and it is
  // cancelled when nothing needs it, so a stale deadline does not keep the execution context busy.
  // Throws only if the timer wait cannot be started (no memory; for the first timer, also a system_error if
  // the execution context cannot make its reactor); the timer is then left unarmed.
  void arm_timer_locked(time_point now) {
    if (shut_down_.load(std::memory_order_relaxed)) return;
    time_point wake = time_point::max();
    if (!queue_.empty()) {
      wake = policy_.ready_at(queue_.front()->count, now);
      // A policy whose ready_at is not after now yet refused: retry one tick later rather than spin.
      if (wake <= now) wake = now + duration(1);
    }
    if (!deadlines_.empty()) wake = std::min(wake, time_point(std::chrono::duration_cast<duration>(
                                                      std::chrono::nanoseconds(deadlines_.top()->deadline_ns))));
    if (wake == time_point::max()) return cancel_timer_locked();
    if (timer_armed_ && timer_at_ <= wake) return;
    start_timer_locked(wake);
  }

  // Out of line: the checks above run on every grant, this only when the wake-up moves earlier.
  REIN_NOINLINE void start_timer_locked(time_point wake) {
    timer_armed_ = false;
    ++timer_generation_;
    // Made on first use: creating a timer starts its execution context's reactor, which makes every later
    // post there dearer (about 120 ns to 290 ns a round trip here), and a semaphore without deadlines never
    // needs one.
    if (!timer_) timer_.emplace(executor_);
    timer_->expires_at(wake);  // cancels a later wait; its handler sees a stale generation
    timer_->async_wait(timer_handler{this->shared_from_this(), timer_generation_});
    timer_armed_ = true;
    timer_at_ = wake;
  }

  void cancel_timer_locked() noexcept {
    if (timer_armed_) stop_timer_locked();
  }

  REIN_NOINLINE void stop_timer_locked() noexcept {
    timer_armed_ = false;
    ++timer_generation_;
    try {
      timer_->cancel();
    } catch (...) {  // it then fires on time and finds a stale generation
    }
  }

  struct timer_handler {
    std::shared_ptr<limiter_core> self;
    std::uint64_t generation;
    void operator()(const error_code&) const noexcept { self->on_timer(generation); }
  };

  void on_timer(std::uint64_t generation) noexcept {
    completions done(this);
    std::lock_guard<Mutex> lock(mutex_);
    if (shut_down_.load(std::memory_order_relaxed) || generation != timer_generation_) return;  // superseded
    timer_armed_ = false;
    const time_point now = Clock::now();
    dispatch_locked(now, done);
    if (has_observer_) observe_locked(now, done);
  }

  void fail_all_locked(wait_status status, completions& done) noexcept {
    closed_ = true;
    while (!queue_.empty()) {
      if (status == wait_status::closed) count_rejection_locked(status, done);
      unlink_locked(queue_.front(), status, done);
    }
    cancel_timer_locked();
  }

  Executor executor_;
  mutable Mutex mutex_;
  std::optional<timer_type> timer_;  // made when first armed
  Policy policy_;
  op_queue queue_;
  deadline_heap deadlines_;
  std::optional<work_guard> work_;  // engaged while anyone waits
  std::size_t max_waiters_;
  bool measure_wait_;
  bool has_observer_;
  std::size_t queued_units_ = 0;
  std::uint64_t revoked_grants_ = 0;  // grants taken back by a late cancellation (their histogram entry stays)
  std::string name_;
  limiter_observer observer_;
  observed_state last_observed_{};
  mutable wait_stats stats_{};  // inspect brings `waiting` and the histogram's zeros up to date
  time_point timer_at_{};
  std::uint64_t timer_generation_ = 0;
  std::uint32_t next_seq_ = 0;
  bool timer_armed_ = false;
  bool closed_ = false;
  std::atomic<bool> waiting_{false};  // !queue_.empty(), written under the lock (waiting_hint)
  std::atomic<bool> shut_down_{false};
#ifndef NDEBUG
  std::atomic<std::size_t> live_permits_{0};
#endif
};

}  // namespace rein::detail
