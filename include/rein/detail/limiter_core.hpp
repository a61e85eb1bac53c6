// The waiter core every async rein limiter is built on. Not API.
//
// A limiter = an admission policy (detail/admission_policy.hpp: the rule, and the concept that is the seam)
// + this core, the wait line (lock, FIFO of parked ops, a second line of drain waits, deadline heap, one timer,
// completion batch, statistics, work guard, close and shutdown).
//
// The class declares all that the line holds and does; the bodies are defined by concern, each file with its
// notes: detail/impl/limiter_core.hpp (the line's own: admission, dispatch, revocation, shutdown),
// line_orders.hpp (where a newcomer joins, whom a full line evicts), line_partitions.hpp (guaranteed shares),
// line_events.hpp (observation), line_timer.hpp (the one timer) and line_remote.hpp (a remote policy's driver).
// A public limiter owns its line through core_owner.hpp; rein/impl/line_instantiations.hpp lists what
// REIN_SEPARATE_COMPILATION compiles once.
//
// Locking discipline: under the lock the core only moves pointers, asks the policy, records statistics and
// arms its own timer (Asio timers are not thread-safe, so the lock is what serialises them; the timer's
// handler is ours). User handlers are posted after the lock is released (class completions), or, with
// line_options::direct_handoff, a release's grants are run in place after the unlock when their executor is
// running in the releasing thread (nesting bounded: wait_op.hpp). The
// allocations under the lock are the wait histogram's (global operator new, never a user's allocator): a
// block when a wait falls in an octave for the first time, and its copy when a snapshot is taken; with
// partitions, the snapshot's copy of them; and a remote policy's messages, queued until they are sent, and
// its round-trip histogram's blocks (as the wait histogram's).
//
// Outstanding work: while anyone waits, the core holds a work guard on its executor, so `run()` does not
// return under a parked operation (as with any pending Asio operation); it is dropped after the last
// completion is posted. A handler bound to another execution context does not keep that context running.
//
// Lifetime: the public limiter owns the core through a shared_ptr; a pending timer wait holds another, and so
// does the runner of a granted op (see wait_op.hpp), so completions already queued when the limiter is
// destroyed still find the core alive. Permits hold plain pointers (no reference count on the fast path):
// the core counts the permit objects it handed out (`holders_`, under the lock, plus what went through the
// lock-free word of a thread-safe semaphore, folded in whenever the lock is taken), and a core shut down with
// permits out keeps itself alive (`self_`) until the last one comes back. At shutdown it destroys its timer
// (while the execution context surely exists) and, with nobody waiting, holds no work guard, so a late
// release touches no I/O object; it still holds a copy of the executor (harmless for an io_context's own
// executor, whose copies own nothing). Cancellation handlers look at their op's status before touching it.
//
// Wait histogram: a grant from the queue records its wait; grants made at once are added as zeros at the
// next inspect (every grant ever made, revoked ones included, has exactly one entry: the histogram's count
// catches up with acquired_total plus the revocations), so the fast path does no extra work. inspect hands
// out the statistics themselves, not a copy (a copy of the histogram allocates its blocks).
//
// Failure: an allocation failure while starting an acquire (the op, the cancellation slot, the timer wait,
// the work guard) leaves everything as it was and propagates. Completion never throws: a completion that
// cannot be posted (no memory) is dropped like one whose execution context was destroyed, giving its
// grant back, and a timer wait that cannot be started leaves the next wake-up to the next event.
#pragma once

#include <rein/algo/codel.hpp>
#include <rein/config.hpp>
#include <rein/detail/admission_policy.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/detail/clock_time.hpp>
#include <rein/detail/deadline_heap.hpp>
#include <rein/detail/invalid_option.hpp>
#include <rein/detail/lease_table.hpp>
#include <rein/detail/line_place.hpp>
#include <rein/detail/op_queue.hpp>
#include <rein/detail/fair_schedule.hpp>
#include <rein/detail/partition_table.hpp>
#include <rein/detail/permit_pool.hpp>
#include <rein/detail/permit_source.hpp>
#include <rein/detail/remote_admission.hpp>
#include <rein/detail/wait_op.hpp>
#include <rein/null_mutex.hpp>
#include <rein/observer.hpp>
#include <rein/outcome.hpp>
#include <rein/permit.hpp>
#include <rein/queue_order.hpp>
#include <rein/try_result.hpp>
#include <rein/wait_stats.hpp>

#include REIN_ASIO_HEADER(basic_waitable_timer.hpp)
#include REIN_ASIO_HEADER(executor_work_guard.hpp)
#include REIN_ASIO_HEADER(wait_traits.hpp)

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <ratio>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace rein::detail {

/// What the public limiters pass to their core besides the policy (from rein::line_options: line_setup.hpp).
struct line_options {
  std::size_t max_waiters;    ///< one more waiter completes with errc::queue_full
  bool measure_wait = true;   ///< time waits for wait_total, wait_max and the wait histogram (a timeless
                              ///< policy reads no clock for waits without a deadline when false)
  std::string name{};         ///< the limiter's name, for events, metrics and error messages
  limiter_observer observer{};  ///< called with events outside the lock; empty: none
  queue_order order = queue_order::fifo;  ///< which waiter is served first (remote policies: fifo only)
  queue_full_policy when_full = queue_full_policy::reject_newest;  ///< a full line refuses or evicts
  std::chrono::nanoseconds priority_aging = default_priority_aging;  ///< priority order: a class's handicap, >= 0
  partition_table partitions{};  ///< guaranteed shares (rein/partition.hpp); empty: none
  bool coarse_wait_clock = false;  ///< time waits on coarse_steady_now() (a timeless policy on steady_clock
                                   ///< outside priority order; otherwise ignored)
  std::chrono::nanoseconds wake_jitter{};  ///< the timer wakes the head up to this much after it is ready, >= 0
  std::uint64_t jitter_seed = 0;           ///< of the wake-up jitter's draws
  bool direct_handoff = false;  ///< a release runs a grant in place when the handler's executor is running in the
                                ///< releasing thread (dispatch instead of post; wait_op.hpp), nesting at most
                                ///< direct_handoff_max_depth deep
  algo::codel_options sojourn{};  ///< shedding by queueing time (algo/codel.hpp); target 0: off. Local lines only
};

/// A policy whose limit can be split into partitions: `partition_limit()` is the limit in permits now.
template <class P>
concept partitionable_policy = requires(const P& p) {
  { p.partition_limit() } -> std::same_as<std::size_t>;
};

/// A waiter's key in queue_order::priority (limiter_core::priority_key): 128 bits, as algo/rate_limit.hpp
/// computes token counts.
__extension__ using priority_key_type = __int128;


/// The completion signatures of an acquire on the line: a concurrency limiter hands out a permit, a rate
/// rule (and a remote one, whose errors are its own) completes with an error code only.
template <class Signature>
concept acquire_signature = std::is_same_v<Signature, void(error_code, permit)> || std::is_same_v<Signature, void(error_code)>;

template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
class limiter_core final : public permit_source,
                           public wait_owner,
                           public std::enable_shared_from_this<limiter_core<Policy, Executor, Clock, Mutex, Signature>> {
 public:
  using executor_type = Executor;
  using clock_type = Clock;
  using time_point = typename Clock::time_point;
  using duration = typename Clock::duration;
  using timer_type = net::basic_waitable_timer<Clock, net::wait_traits<Clock>, Executor>;

  static_assert(admission_policy<Policy, time_point>,
                "rein: a limiter's Policy must model rein::detail::admission_policy: a static bool needs_time and "
                "exceeds(n), try_take(n, now), ready_at(n, now), predict(ahead, n, now), on_release(n, stamp, "
                "outcome, now), as detail/admission_policy.hpp documents them");

  /// The completion signature of an acquire: `void(error_code, rein::permit)` or `void(error_code)`.
  using signature = Signature;
  /// Whether grants are permits (counted as holders, given back by release_permit).
  static constexpr bool with_permit = std::is_same_v<Signature, void(error_code, permit)>;

  /// Whether admission may need a round trip (detail/remote_admission.hpp).
  static constexpr bool remote = remote_policy<Policy, time_point>;
  static_assert(!remote || revocable_remote_policy<Policy, time_point>,
                "rein: a remote policy must be revocable (on_revoke(n, granted_at, now))");
  /// What a remote policy sends (an empty type for local policies).
  using outbox_type = typename outbox_of<Policy, remote>::type;
  /// Where a remote policy's outbox goes (transport of the I/O object that owns the line).
  using transport_type = remote_transport<outbox_type>;

  template <class... PolicyArgs>
  limiter_core(const Executor& ex, line_options options, PolicyArgs&&... policy_args)
      : executor_(ex),
        policy_(std::forward<PolicyArgs>(policy_args)...),
        max_waiters_(options.max_waiters),
        order_(options.order),
        evict_oldest_(options.when_full == queue_full_policy::evict_oldest),
        priority_aging_ns_(options.priority_aging.count()),
        measure_wait_(Policy::needs_time || options.measure_wait),
        // A sojourn rule compares arrivals with grants on Clock: waits are timed on it too.
        coarse_wait_(coarse_capable && options.coarse_wait_clock && options.measure_wait &&
                     options.order != queue_order::priority && options.sojourn.target.count() <= 0),
        has_observer_(static_cast<bool>(options.observer)),
        direct_handoff_(options.direct_handoff),
        name_(options.name.empty() ? nullptr : std::make_shared<const std::string>(std::move(options.name))),
        observer_(std::move(options.observer)),
        partitions_(std::move(options.partitions)),
        fair_(options.order == queue_order::fair ? std::make_unique<fair_schedule>() : nullptr),
        wake_jitter_ns_(options.wake_jitter.count()),
        jitter_state_(options.jitter_seed),
        sojourn_(!remote && options.sojourn.target.count() > 0
                     ? std::make_unique<algo::basic_codel<Clock>>(options.sojourn)
                     : nullptr) {
    // A remote line serves in fifo order and refuses the newest (its requests are pipelined in order).
    assert(!remote || (order_ == queue_order::fifo && !evict_oldest_));
    assert(priority_aging_ns_ >= 0);  // the public types check it (line_setup.hpp)
    assert(partitions_.empty() || partitionable);  // only the types whose policy allows it offer the option
    if constexpr (partitionable) {
      if (!partitions_.empty()) {
        sources_ = std::make_unique<partition_source[]>(partitions_.size());
        for (std::size_t i = 0; i < partitions_.size(); ++i) sources_[i].bind(this, static_cast<std::uint8_t>(i));
      }
    }
    if (has_observer_) last_observed_ = observe_now(Clock::now());
  }

  limiter_core(const limiter_core&) = delete;
  limiter_core& operator=(const limiter_core&) = delete;
  ~limiter_core() = default;

  const Executor& get_executor() const noexcept { return executor_; }

  /// The order of the line (options.order).
  queue_order order() const noexcept { return order_; }

  /// The name given in the options (empty if none).
  const std::string& name() const noexcept {
    // Never destroyed: a limiter with static storage may still be named in its destructor's events.
    static const std::string* const none = new std::string();
    return name_ ? *name_ : *none;
  }

  /// The same name, shared (null if none): it outlives the core for whoever keeps it, such as a coroutine
  /// that names its error after a wait the core's destruction ended.
  const std::shared_ptr<const std::string>& shared_name() const noexcept { return name_; }

  /// Takes n at once if nobody waits and the policy allows it. The fast path: no allocation, no scheduler.
  /// On success, `stamp` receives the grant time (nanoseconds since the clock's epoch; zero when the policy
  /// does not need time). When busy and `retry_ns` is given, it receives how long until the same request
  /// would be taken if nothing else changed (-1: unknown; INT64_MAX: never).
  /// `partition` is the acquire's partition (0, the rest, without partitions). `at`, when given, is the
  /// instant the policy decides at instead of a clock read of its own (one read shared by several limiters).
  /// `note`, when given, receives what the policy noted at the grant, for the permit to carry.
  try_status try_acquire(std::size_t n, std::chrono::nanoseconds& stamp, std::int64_t* retry_ns = nullptr,
                         std::uint8_t partition = 0, const time_point* at = nullptr, std::uint64_t* note = nullptr);

  /// Whether anyone waited a moment ago, read without the lock: true means try_acquire would most likely
  /// fail, so a caller about to wait anyway can skip it (and its lock). Either answer may be stale.
  bool waiting_hint() const noexcept { return waiting_.load(std::memory_order_relaxed); }

  /// Starts a waiting acquire of n, completing through `handler` (with `signature`).
  /// `deadline` of time_point::max() means none (deadline_after() computes one without overflow).
  /// `where` says where it waits: its class in priority order (0 the most urgent; ignored in the other
  /// orders), its partition (0, the rest, without partitions), its key and weight in fair order (ignored in
  /// the others).
  /// If this throws (no memory), nothing changed and the handler was destroyed uncalled.
  template <class Handler>
  void async_acquire(Handler&& handler, std::size_t n, time_point deadline, line_place where = {});

  /// Starts a wait for the moment no permit is out (holders() == 0), completing through `handler` with
  /// `void(error_code)`: at once if none is out; errc::timed_out at `deadline` (time_point::max(): none);
  /// operation_aborted when cancelled or at shutdown. close() does not end it: closing and then draining is
  /// how a service stops without cutting calls in flight. If this throws (no memory), nothing changed.
  template <class Handler>
  void async_drain(Handler&& handler, time_point deadline) {
    using op_type = basic_wait_op<std::decay_t<Handler>, Executor, void(error_code), concurrent>;
    op_type* op =
        op_type::create(std::forward<Handler>(handler), 0, deadline != time_point::max() ? op_node::deadline : op_node::none);
    op->drain = true;
    // Written out as in async_acquire: a helper taking the admit step as a lambda cost a contended handoff
    // 34 instructions more with g++ 12 (benchmarks/handoff/instructions.sh).
    completions done(this);
    try {
      line_lock lock(*this);
      op->connect_cancellation(this);
      try {
        admit_drain_locked(op, deadline, done);
      } catch (...) {
        op->disconnect_cancellation();
        throw;
      }
    } catch (...) {
      op->destroy();
      throw;
    }
  }

  /// For a remote policy: where its outbox goes after each locked step. Set once, before the first acquire.
  void set_transport(std::shared_ptr<transport_type> transport) noexcept { transport_ = std::move(transport); }

  /// For a remote policy: a verdict came back. Calls policy.settle(args..., now) under the lock, applies the
  /// fate it returns to the op the verdict was for (if that op is still in line), then moves the line on.
  template <class... Args>
    requires remote
  void settle(Args&&... args) {
    completions done(this);
    line_lock lock(*this);
    const time_point now = Clock::now();
    const remote_settled r = policy_.settle(std::forward<Args>(args)..., now);
    if (r.op != nullptr) {
      auto* op = static_cast<remote_wait_op*>(r.op);
      if (r.step.what != remote_step::kind::keep) {
        op->in_flight = false;
        --in_flight_ops_;
      }
      if (r.step.what == remote_step::kind::wait) {
        policy_.on_denied(first_waiting_locked() == op);
        if (queue_.size() - in_flight_ops_ > max_waiters_) {
          count_rejection_locked(wait_status::queue_full, done);
          unlink_locked(op, wait_status::queue_full, done);
        }
      } else {
        apply_step_locked(op, r.step, now, done);
      }
    }
    dispatch_locked(now, done);
    if (has_observer_) observe_locked(now, done);
  }

  /// Runs f(policy, now) under the lock, then grants whatever became grantable. For releases, rate changes,
  /// added permits: anything that can let waiters through.
  template <class F>
  decltype(auto) update(F&& f) {
    completions done(this);  // posts after the lock below is released, also for a void f
    line_lock lock(*this);
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

  /// As update(f), counting one grant made without the line (acquired_total): a reservation whose units an
  /// admission took (rein::throttle's reserve).
  template <class F>
  decltype(auto) update_granted(F&& f) {
    return update([&](Policy& p, time_point now) -> decltype(auto) {
      ++stats_.acquired_total;
      return std::forward<F>(f)(p, now);
    });
  }

  /// As update(f), with f(policy, now, waiting, closed): whether anyone waits on the line and whether it
  /// was closed, seen under the same lock, for a rule that must not overtake the line (a token bucket's
  /// reservation takes nothing while anyone waits).
  template <class F>
  decltype(auto) update_seeing_line(F&& f) {
    return update([&](Policy& p, time_point now) -> decltype(auto) {
      return std::forward<F>(f)(p, now, first_waiting_locked() != nullptr, closed_);
    });
  }

  /// As update(f), and then every waiter whose request the policy now exceeds (a semaphore's total lowered
  /// below it, or a gate opened to less) completes with errc::exceeds_capacity: it could only wait forever.
  /// O(waiters); an f that returns bool skips the scan when it returns false (nothing can exceed now).
  template <class F>
  void update_and_refuse(F&& f);

  /// Runs f(const policy&, const wait_stats&) under the lock and returns its result (snapshots, queries).
  /// The statistics are the core's own (valid during the call only), brought up to date first.
  template <class F>
  decltype(auto) inspect(F&& f) const {
    line_lock lock(*this);
    stats_.waiting = queue_.size();
    // Grants made at once since the last inspect, as zero waits (see the top of the file).
    if (measure_wait_) {
      const std::uint64_t recorded = stats_.wait.count();
      const std::uint64_t granted = stats_.acquired_total + revoked_grants_;
      if (granted > recorded) stats_.wait.record(std::chrono::nanoseconds{0}, granted - recorded);
    }
    if constexpr (std::is_invocable_v<F&&, const Policy&, const wait_stats&, const partition_table&>)
      return std::forward<F>(f)(policy_, static_cast<const wait_stats&>(stats_), partitions_);
    else
      return std::forward<F>(f)(policy_, static_cast<const wait_stats&>(stats_));
  }

  /// Whether the line has partitions (options.partitions), and the index of the one called `name`.
  bool has_partitions() const noexcept { return !partitions_.empty(); }
  std::optional<std::uint8_t> find_partition(std::string_view name) const noexcept { return partitions_.find(name); }

  /// Completes every waiter with errc::closed; later acquires fail the same way. Idempotent.
  void close() {
    completions done(this);
    line_lock lock(*this);
    fail_all_locked(wait_status::closed, done);
  }

  /// For the limiter's destructor: waiters complete with operation_aborted, grants not yet delivered will
  /// complete with operation_aborted too, the timer stops.
  void shutdown() noexcept;

  /// The deadline `timeout` from now, saturated: a timeout too long to represent means none
  /// (time_point::max()), one too far negative means the earliest representable instant.
  static time_point deadline_after(duration timeout) { return detail::deadline_after<Clock>(timeout); }

  // permit_source
  void release_permit(std::size_t n, std::chrono::nanoseconds stamp, std::uint64_t note,
                      outcome result) noexcept override;
  void release_permit_with_work(std::size_t n, std::chrono::nanoseconds stamp, std::uint64_t note, outcome result,
                                double work) noexcept override;

  // A permit of n comes back, from `partition` if the line has partitions, with its caller's work hint (a
  // double, checked) or none (no_work).
  template <class Work = no_work>
  void release(std::size_t n, std::chrono::nanoseconds stamp, std::uint64_t note, outcome result,
               std::optional<std::uint8_t> partition, Work work = {}) noexcept {
    // The word is open only without partitions, so `partition` has nothing to count there.
    if constexpr (pooled) {
      if (pool_.try_give(n)) return;
    }
    std::shared_ptr<limiter_core> last;  // the core's own reference after shutdown: dropped after the unlock
    line_lock lock(*this);
    // More permits back than were handed out: a permit given back twice (GCC 12 destroys a co_await's result
    // twice inside a conditional expression; see docs/building.md).
    assert(holders_ != 0);
    --holders_;
    if constexpr (partitionable) {
      if (partition) partitions_.released(*partition, n);
    }
    if (holders_ == 0) last = std::move(self_);  // after shutdown, the last permit back ends the line
    // A remote policy tells its server about a release (a message in its outbox): never the quiet path.
    if (!remote && queue_.empty() && !timer_armed_ && (drainers_.empty() || holders_ != inert_locked())) {
      // Nobody to grant and no timer to re-aim (the uncontended case, and every release after shutdown): no
      // dispatch, nothing to post.
      if (has_observer_) return release_observed(lock, n, stamp, note, result, work);
      policy_release(n, stamp, note, result, policy_now(), work);
      return;
    }
    completions done(this);
    done.direct = direct_handoff_;  // only a release hands off directly: an initiation never completes inline
    const time_point now = clock_now_locked();
    policy_release(n, stamp, note, result, now, work);
    dispatch_locked(now, done);
    if (has_observer_) observe_locked(now, done);
    lock.unlock();  // before `done` posts, although it was declared after the lock
  }

  void permit_split(std::uint64_t note) noexcept override {
    (void)note;  // a plain permit's note says nothing about its holders (a leased one reports elsewhere)
    line_lock lock(*this);
    ++holders_;
  }

  /// Leases (detail/line_leases.hpp): whether this line's permits may be leased (a semaphore's), the two
  /// steps of a leased acquire (reserve before it, lease the permit it yields), and where a leased permit
  /// reports back. Leases run on the line's one timer; a line that never leased has none of this.
  static constexpr bool leasable = with_permit && !remote && requires { Policy::leasable; };
  lease_table::reserved reserve_lease();
  permit lease_permit(permit p, lease_table::reserved& r, std::chrono::nanoseconds lease,
                      std::uint8_t partition) noexcept;
  void release_leased(std::size_t n, std::uint64_t id, outcome result) noexcept;
  void split_leased(std::uint64_t id) noexcept;

  void restamp_permit(std::chrono::nanoseconds from, std::chrono::nanoseconds to) noexcept override {
    if constexpr (requires { policy_.on_restamp(from, to); }) {
      line_lock lock(*this);
      policy_.on_restamp(from, to);
    }
  }

  /// A permit for n just taken on the fast path (try_acquire counted its holder) in `partition`, carrying
  /// what the policy noted at the grant (try_acquire's `note`).
  permit make_permit(std::size_t n, std::chrono::nanoseconds stamp, std::uint8_t partition = 0,
                     std::uint64_t note = 0) noexcept {
    return permit(source(partition), n, stamp, note);
  }

  /// Permit objects handed out and not yet given back (for tests and snapshots).
  std::size_t holders() const {
    line_lock lock(*this);
    return holders_;
  }

  // wait_owner
  void cancel_wait(wait_op* op) noexcept override;

  bool deliver(std::size_t n, std::chrono::nanoseconds stamp, std::uint8_t partition) noexcept override;

  void abandon(std::size_t n, std::chrono::nanoseconds stamp, std::uint8_t partition) noexcept override;

  permit_source* source(std::uint8_t partition) noexcept override {
    if constexpr (!with_permit) {
      return (void)partition, nullptr;
    } else {
      if constexpr (partitionable) {
        if (sources_) return &sources_[partition];
      }
      return (void)partition, this;
    }
  }

  static std::chrono::nanoseconds to_ns(time_point t) noexcept {
    return std::chrono::nanoseconds(to_ns_saturated(t));
  }

 private:
  using work_guard = net::executor_work_guard<Executor>;
  using op_base = std::conditional_t<remote, remote_wait_op, wait_op>;
  static constexpr bool concurrent = !std::is_same_v<Mutex, null_mutex>;  // a cancellation may race a runner
  static constexpr bool partitionable = with_permit && !remote && partitionable_policy<Policy>;
  // Whether uncontended acquires and releases go through a lock-free word (detail/permit_pool.hpp): a
  // thread-safe line of permits counted by a plain number. A null_mutex line gains nothing from it.
  static constexpr bool pooled = concurrent && with_permit && !remote && poolable_policy<Policy>;
  // The word grants at the epoch and asks the policy nothing: a timeless rule that never refuses.
  static_assert(!pooled || (!Policy::needs_time && !refusing_policy<Policy, time_point>),
                "rein: a poolable policy must be timeless and never refuse (detail/admission_policy.hpp)");

  // The line's lock. Taking it closes the lock-free word and brings what went through it into the line, so
  // that every locked path sees the whole state; releasing it lends the free permits to the word again when
  // nothing an uncontended call could meet needs the lock (see permit_pool.hpp). Without the word, a plain
  // lock. Const paths (snapshots) reclaim too: the core itself is never const (it lives in a shared_ptr).
  class line_lock {
   public:
    explicit line_lock(const limiter_core& core) : core_(const_cast<limiter_core&>(core)) {
      core_.mutex_.lock();
      core_.pool_reclaim_locked();
    }
    line_lock(const line_lock&) = delete;
    line_lock& operator=(const line_lock&) = delete;
    ~line_lock() {
      if (owns_) unlock();
    }
    void unlock() noexcept {
      core_.pool_lend_locked();
      core_.mutex_.unlock();
      owns_ = false;
    }

   private:
    limiter_core& core_;
    bool owns_ = true;
  };

  void pool_reclaim_locked() noexcept {
    if constexpr (pooled) {
      const permit_pool::taken t = pool_.reclaim();
      // More permits back than were handed out: a permit given back twice (see release()).
      assert(t.holders >= 0 || holders_ >= static_cast<std::size_t>(-t.holders));
      policy_.repay(t.units);
      stats_.acquired_total += t.acquires;
      holders_ += static_cast<std::size_t>(t.holders);  // modulo 2^64: the sum is the true count, never negative
    }
  }

  void pool_lend_locked() noexcept {
    if constexpr (pooled) {
      if (!queue_.empty() || !drainers_.empty() || closed_ || timer_armed_ || has_observer_ || partitioned() ||
          shut_down_.load(std::memory_order_relaxed))
        return;
      if (const std::optional<std::size_t> lent = policy_.lend(permit_pool::max_units)) pool_.open(*lent);
    }
  }

  // What to do once the lock is released: post the completions made ready under it, then drop the work
  // guard if the line emptied (in that order, so that the context cannot run out of work in between).
  // Declared before the lock_guard in every path, so that its destructor runs after the unlock.
  class completions {
   public:
    explicit completions(limiter_core* core) noexcept : core_(core) {}
    completions(const completions&) = delete;
    completions& operator=(const completions&) = delete;
    ~completions();

    // Every op made ready goes through here, under the lock. The ops are posted after the lock is released,
    // when another thread may already have destroyed a limiter that became idle (rein::keyed evicts idle
    // ones): so the core is kept alive until they are posted, by a reference that the runners of granted
    // ops then share (a runner keeps the core alive until its handler has the permit; see wait_op.hpp).
    void push(wait_op* op) noexcept {
      if (!keep_alive_) keep_alive_ = core_->weak_from_this().lock();
      ready.push(op);
    }

    // A remote policy queued messages: send them after the unlock, the core kept alive until then.
    void keep_for_sending() noexcept {
      if (!keep_alive_) keep_alive_ = core_->weak_from_this().lock();
      send = true;
    }

    ready_list ready;
    bool send = false;  // a remote policy queued messages: send them after the unlock
    bool direct = false;  // a release's batch on a line with direct_handoff: grants may run in place
    std::optional<work_guard> idle_work;
    std::optional<event_buffer> events;  // engaged at the first event (only with an observer)

    // Whether the limiter has an observer: read where an event would be recorded (under the lock), never
    // stored, so that a batch without an observer costs nothing more than its posting.
    bool observing() const noexcept { return core_->has_observer_; }

    event_buffer& buffer() noexcept {
      if (!events) events.emplace();
      return *events;
    }

   private:
    // Out of line: the destructor of a batch without events inlines only the test of `events`.
    REIN_NOINLINE void deliver_events() noexcept {
      if (!events->empty()) events->deliver(core_->observer_, core_->name());
    }

    limiter_core* core_;
    std::shared_ptr<wait_owner> keep_alive_;
  };

  // Partitions (line_partitions.hpp): where a permit of one partition reports back, the bookkeeping under
  // the lock, and what serve_starved_locked did: granted a waiter; held the line for one that cannot fit yet
  // but will (the permits that come free are kept for it); or found nobody to serve first (the head is next).
  class partition_source;
  enum class starved_step : std::uint8_t { granted, hold, none };
  void partition_granted_locked(std::uint8_t p, std::size_t n) noexcept;
  void partition_released_locked(std::uint8_t p, std::size_t n) noexcept;
  bool partitioned() const noexcept;
  bool partition_starved_locked(std::uint8_t p) const noexcept;
  starved_step serve_starved_locked(time_point now, completions& done) noexcept;

  static constexpr bool revocable = with_permit || revocable_policy<Policy, time_point> || remote;

  static void give_back(Policy& p, std::size_t n, std::chrono::nanoseconds stamp, time_point now) noexcept {
    if constexpr (remote) {
      // A remote grant is given back whenever it is revoked, and its policy is told when it was made: one that
      // also grants locally while its server is unreachable tells its own grants by their time.
      p.on_revoke(n, time_point(std::chrono::duration_cast<typename Clock::duration>(stamp)), now);
    } else if constexpr (revocable_policy<Policy, time_point>) {
      // Undone only at the instant of the grant: a time-based limit that moved since (a bucket refilled to its
      // cap, a window that slid past the start) has no exact undo, and refunding anyway would let more
      // through than the limit. Later, the units stay spent.
      if (!Policy::needs_time || to_ns(now) == stamp) p.on_revoke(n, now);
    }
    else if constexpr (with_permit) p.on_release(n, stamp, outcome::ignored, now);
    else (void)p, (void)n, (void)stamp, (void)now;
  }

  try_status busy_locked(std::size_t ahead, std::size_t n, time_point now, std::int64_t* retry_ns) const;

  bool revoke_locked(wait_op* op, std::shared_ptr<limiter_core>& last) noexcept;

  time_point policy_now() const {
    if constexpr (Policy::needs_time) return Clock::now();
    else return time_point{};
  }

  // The time for grants and expiries while ops may wait: needed by the policy, the wait statistics, or a
  // deadline. A clock read costs about a tenth of a contended handoff (two per waited acquire).
  time_point clock_now_locked() const {
    // A coarse-timed wait reads its end itself (grant_locked): one cheap read per grant, none here.
    if (!deadlines_.empty() || (measure_wait_ && !coarse_wait_) || sojourn_) return Clock::now();
    return time_point{};
  }

  static constexpr bool coarse_capable =
      !Policy::needs_time && std::is_same_v<Clock, std::chrono::steady_clock> && has_coarse_steady_clock;

  // An instant for the wait statistics alone (line_options::coarse_wait_clock).
  time_point wait_clock_now() const {
    if constexpr (coarse_capable) {
      if (coarse_wait_) return coarse_steady_now();
    }
    return Clock::now();
  }

  // Decides a new op's fate under the lock. Returns true if it was queued. If it throws (no memory for the
  // work guard, the timer wait or a fair line's key table), it changed nothing. The bulk of an acquire that
  // does not depend on its handler: with REIN_SEPARATE_COMPILATION, compiled in one unit only.
  bool admit_locked(wait_op* op, time_point deadline, completions& done);

  // The remote driver (line_remote.hpp).
  bool admit_remote_locked(remote_wait_op* op, time_point deadline, time_point now, completions& done);
  template <bool Remote = remote>
    requires Remote
  void serve_remote_locked(time_point now, completions& done) noexcept;
  bool apply_step_locked(remote_wait_op* op, const remote_step& step, time_point now, completions& done) noexcept;
  template <bool Remote = remote>
    requires Remote
  void send_pending() noexcept;

  // The op the policy is asked about next: the head, or for a remote line the first op not in flight.
  const wait_op* first_waiting_locked() const noexcept {
    const wait_op* w = queue_.front();
    if constexpr (remote) {
      if (queue_.size() == in_flight_ops_) return nullptr;
      while (w != nullptr && static_cast<const remote_wait_op*>(w)->in_flight) w = w->next;
    }
    return w;
  }

  // Whether the policy refuses n outright now (detail/admission_policy.hpp: refuses).
  bool refused_locked(std::size_t n, time_point now) noexcept {
    if constexpr (refusing_policy<Policy, time_point>) return policy_.refuses(n, now);
    else return (void)n, (void)now, false;
  }

  // What the policy noted at the grant it just made (an adaptive policy: the calls in flight), for the permit
  // to carry back: the grant's stamp cannot tell apart grants made at one instant. 0 for the others.
  std::uint64_t note_locked() const noexcept {
    if constexpr (requires { policy_.grant_note(); }) return policy_.grant_note();
    else return 0;
  }

  // A permit comes back to the policy, with its note and its work hint if the policy reads them.
  template <class Work>
  void policy_release(std::size_t n, std::chrono::nanoseconds stamp, std::uint64_t note, outcome result,
                      time_point now, Work work) noexcept {
    if constexpr (requires { policy_.on_release(n, stamp, note, result, now, work); })
      policy_.on_release(n, stamp, note, result, now, work);
    else if constexpr (requires { policy_.on_release(n, stamp, note, result, now); })
      (void)work, policy_.on_release(n, stamp, note, result, now);
    else
      (void)note, (void)work, policy_.on_release(n, stamp, result, now);
  }

  // An op granted on arrival, without waiting.
  void grant_at_once_locked(wait_op* op, time_point now, completions& done) noexcept {
    op->stamp_ns = to_ns(now).count();
    if constexpr (with_permit) op->note = note_locked();  // in `prev`'s place: it never joined the line
    ++stats_.acquired_total;
    if constexpr (with_permit) ++holders_;
    partition_granted_locked(op->partition, op->count);
    finish_locked(op, wait_status::granted, done);
  }

  // The placement orders (line_orders.hpp). Where a newcomer joins a line that is not empty: after `after`
  // (null: at the front, as the new head), with `ahead` units queued before it.
  struct place {
    wait_op* after;
    std::size_t ahead;
  };
  place place_locked(const wait_op* op) const noexcept;
  void tag_fair_locked(wait_op& op, bool first);
  place place_fair_locked(double tag) const noexcept;
  void fair_admitted_locked(wait_op& op) noexcept;
  priority_key_type priority_key(const wait_op& op) const noexcept;
  bool cannot_meet(std::size_t n, time_point deadline, time_point now, std::size_t ahead, bool evicting) const;
  void evict_oldest_locked(completions& done) noexcept;
  // Whether newcomers are placed by a key (priority and fair order), so that the back is served last.
  bool sorted() const noexcept { return order_ == queue_order::priority || order_ == queue_order::fair; }

  static void finish_locked(wait_op* op, wait_status status, completions& done) noexcept {
    op->status.store(status, std::memory_order_release);
    done.push(op);
  }

  // Counts a rejection for its reason (queue_full, timed_out, exceeds_capacity, closed) and reports it.
  void count_rejection_locked(wait_status status, completions& done) noexcept {
    switch (status) {
      case wait_status::queue_full: return count_reason_locked(reject_reason::queue_full, done);
      case wait_status::timed_out: return count_reason_locked(reject_reason::timed_out, done);
      case wait_status::exceeds_capacity: return count_reason_locked(reject_reason::exceeds_capacity, done);
      case wait_status::unavailable: return count_reason_locked(reject_reason::unavailable, done);
      case wait_status::overloaded: return count_reason_locked(reject_reason::overloaded, done);
      default: return count_reason_locked(reject_reason::closed, done);
    }
  }

  // Counts a rejection for `why` (one of the reasons wait_stats counts; others as closed) and reports it.
  void count_reason_locked(reject_reason why, completions& done) noexcept {
    ++stats_.rejected_total;
    switch (why) {
      case reject_reason::queue_full: ++stats_.queue_full_total; break;
      case reject_reason::timed_out: ++stats_.timed_out_total; break;
      case reject_reason::exceeds_capacity: ++stats_.exceeds_capacity_total; break;
      case reject_reason::unavailable: ++stats_.unavailable_total; break;
      case reject_reason::overloaded: ++stats_.overloaded_total; break;
      default: ++stats_.closed_total; break;
    }
    if (done.observing()) done.buffer().reject(why);
  }

  // A new op turned away at once.
  void reject_locked(wait_op* op, wait_status status, completions& done) noexcept {
    count_rejection_locked(status, done);
    finish_locked(op, status, done);
  }

  // Observation (line_events.hpp): whether the policy reports a state (its optional observe), the events of
  // a locked section that completes nothing, and the observed paths.
  template <class P>
  static constexpr bool observable = requires(const P& p, time_point t) {
    { p.observe(t) } -> std::same_as<observed_state>;
  };
  class event_sink;
  observed_state observe_now(time_point now) const noexcept;
  template <class Sink>
  void observe_locked(time_point now, Sink& done) noexcept;
  try_status try_acquire_observed(std::size_t n, std::chrono::nanoseconds& stamp, std::int64_t* retry_ns,
                                  std::uint8_t partition, const time_point* at, std::uint64_t* note);
  template <class Work>
  void release_observed(line_lock& lock, std::size_t n, std::chrono::nanoseconds stamp, std::uint64_t note,
                        outcome result, Work work) noexcept;

  // The rest of a synchronous try under the lock, once closed and capacity are checked: refused (a policy's
  // own reason), behind waiters, or short of units at `now`; or taken, stamping the grant with `now`.
  try_status take_locked(std::size_t n, time_point now, std::chrono::nanoseconds& stamp, std::int64_t* retry_ns,
                         std::uint8_t partition, std::uint64_t* note);

  void dequeue_locked(wait_op* op, completions& done) noexcept;

  // Enters a timed op's deadline in the heap; false if it has none. A deadline beyond what nanoseconds can
  // count (a coarse clock's far future) is none: the heap holds exactly the ops whose deadline_ns() is not
  // no_deadline, which is how dequeue_locked finds them.
  bool push_deadline_locked(wait_op* op, time_point deadline) noexcept {
    if (op->timer == nullptr) return false;
    op->timer->deadline_ns = to_ns_saturated(deadline);
    if (op->timer->deadline_ns == no_deadline) return false;
    op->timer->seq = next_seq_++;
    deadlines_.push(op->timer);
    return true;
  }

  bool admit_drain_locked(wait_op* op, time_point deadline, completions& done);

  // Every permit is back: the drain waits are over (a grant made in the same dispatch counts as out).
  void finish_drains_locked(completions& done) noexcept {
    while (!drainers_.empty()) unlink_locked(drainers_.front(), wait_status::delivered, done);
  }

  void unlink_locked(wait_op* op, wait_status status, completions& done) noexcept {
    dequeue_locked(op, done);
    finish_locked(op, status, done);
  }

  // Grants from the head while the policy allows, expires deadlines, then arms the timer for what is next.
  // A grant and an expiry at the same instant: the grant wins (the deadline was "by then", inclusive).
  void dispatch_locked(time_point now, completions& done) noexcept;

  // A grant that was counted as a holder will never become a permit. Returns the core's own reference if
  // that was the last holder after shutdown (to be dropped after the unlock).
  std::shared_ptr<limiter_core> holder_gone_locked() noexcept {
    assert(holders_ != 0);
    if (--holders_ == 0) return std::move(self_);
    return nullptr;
  }

  void grant_locked(wait_op* op, time_point now, completions& done) noexcept {
    if constexpr (with_permit) ++holders_;
    if (sojourn_) sojourn_->granted(stamp_time(*op), now);
    if (measure_wait_) {
      // A coarse-timed wait ends on the coarse clock too, whatever clock the dispatch read (a deadline's, a
      // timer's, a change of permits).
      // Never negative: a test clock may be set back.
      const time_point end = coarse_wait_ ? wait_clock_now() : now;
      const std::chrono::nanoseconds waited(std::max<std::int64_t>(to_ns(end).count() - op->stamp_ns, 0));
      stats_.wait_total += waited;
      stats_.wait_max = std::max(stats_.wait_max, waited);
      stats_.wait.record(waited);
    }
    ++stats_.acquired_total;
    partition_granted_locked(op->partition, op->count);
    if (op->fair) fair_->advance(op->fair_tag());
    op->stamp_ns = to_ns(now).count();
    dequeue_locked(op, done);
    if constexpr (with_permit) op->note = note_locked();  // in `prev`'s place, free once out of the line
    finish_locked(op, wait_status::granted, done);
  }

  // The sojourn rule (line_sojourn.hpp): sheds the head if the line stands and it queued past the slough
  // time; when the rule needs the line to look again; an op's arrival as an instant of Clock.
  bool shed_head_locked(wait_op* head, time_point now, completions& done) noexcept;
  time_point sojourn_wake_locked(const wait_op& head) const noexcept;
  static time_point stamp_time(const wait_op& op) noexcept {
    return time_point(std::chrono::duration_cast<duration>(std::chrono::nanoseconds(op.stamp_ns)));
  }

  // The timer (line_timer.hpp): armed for the next instant anything can change, run when it fires.
  void arm_timer_locked(time_point now);
  time_point jittered_locked(time_point ready) noexcept;
  void start_timer_locked(time_point wake);
  void cancel_timer_locked() noexcept;
  void stop_timer_locked() noexcept;
  void arm_timer_locked_noexcept(time_point now) noexcept;
  struct timer_handler;
  void on_timer(std::uint64_t generation) noexcept;

  void fail_all_locked(wait_status status, completions& done) noexcept;

  // Leases (line_leases.hpp): their table and the permit_source their permits report to, made at the
  // first leased acquire; takes back the leases ended by `now`; permit objects of expired leases still out
  // (they count as holders for the line's lifetime, not for a drain).
  class lease_source;
  struct lease_state;
  void expire_leases_locked(time_point now, completions& done) noexcept;
  time_point lease_wake_locked() const noexcept;
  std::size_t inert_locked() const noexcept;

  Executor executor_;
  struct no_pool {};
  [[no_unique_address]] std::conditional_t<pooled, permit_pool, no_pool> pool_;  // see line_lock
  mutable Mutex mutex_;
  std::optional<timer_type> timer_;  // made when first armed
  Policy policy_;
  op_queue queue_;
  op_queue drainers_;  // async_drain waits
  deadline_heap deadlines_;
  std::optional<work_guard> work_;  // engaged while anyone waits
  std::size_t max_waiters_;
  queue_order order_;  // where a newcomer joins: the back (fifo), the front (lifo), by key (priority)
  bool evict_oldest_;  // queue_full_policy::evict_oldest
  std::int64_t priority_aging_ns_;  // priority order: the key offset of one class
  bool measure_wait_;
  // Waits are timed on the coarse clock: its instants are only compared with one another and with
  // steady_clock's, never used for a deadline, a priority key or a policy.
  bool coarse_wait_;
  bool has_observer_;
  bool direct_handoff_;  // line_options::direct_handoff: a release's grants may run in place
  std::size_t queued_units_ = 0;
  std::size_t in_flight_ops_ = 0;  // remote policies: queued ops whose request is out
  std::shared_ptr<transport_type> transport_;  // remote policies: where the outbox goes
  [[no_unique_address]] outbox_type pending_out_;  // remote policies: queued under the lock, sent in order
  struct not_sending {};
  // Remote policies: a thread is in send_pending (nothing for the others).
  [[no_unique_address]] std::conditional_t<remote, std::atomic<bool>, not_sending> sending_{};
  std::uint64_t revoked_grants_ = 0;  // grants taken back by a late cancellation (their histogram entry stays)
  std::shared_ptr<const std::string> name_;  // immutable; null when unnamed
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
  partition_table partitions_;  // options.partitions; empty: none
  // queue_order::fair: the keys' finish tags and the virtual time; made only for a fair line, so that the
  // other lines (every key of a keyed registry among them) carry one pointer for it.
  std::unique_ptr<fair_schedule> fair_;
  std::int64_t wake_jitter_ns_;  // guarded by the lock, as the timer (the three below too)
  std::uint64_t jitter_state_;
  std::int64_t jitter_for_ns_ = std::numeric_limits<std::int64_t>::min();  // the ready instant drawn for
  std::int64_t jitter_draw_ns_ = 0;
  std::unique_ptr<partition_source[]> sources_;  // one per partition, made only with partitions
  std::unique_ptr<algo::basic_codel<Clock>> sojourn_;  // line_options::sojourn, made only when it is on
  std::size_t holders_ = 0;               // permit objects out (granted, not yet given back or taken back)
  std::shared_ptr<limiter_core> self_;    // set at shutdown while holders_ != 0
  std::unique_ptr<lease_state> leases_;   // made at the first leased acquire (line_leases.hpp)
};

}  // namespace rein::detail

// Members of the line defined with their concern (declared in the class above).
#include <rein/detail/line_remote.hpp>
#include <rein/detail/line_orders.hpp>
#include <rein/detail/line_partitions.hpp>
#include <rein/detail/line_events.hpp>
#include <rein/detail/line_timer.hpp>
#include <rein/detail/line_sojourn.hpp>
#include <rein/detail/line_leases.hpp>
#include <rein/detail/impl/limiter_core.hpp>
