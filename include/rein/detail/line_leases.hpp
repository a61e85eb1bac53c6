// The waiting line's leases: the members of limiter_core (detail/limiter_core.hpp) behind
// rein::basic_semaphore::with_lease. A leased permit reports back to the line's lease_source with its lease's
// id as its note; the line's one timer also wakes for the earliest lease's end, and its wake-up first takes
// back the leases ended by then (their units go back as a release's would, and waiters are granted at that
// very instant), as does a leased permit's release. The table (lease_table.hpp) keeps a lease while any permit of it is out, so that a permit
// of an expired lease finds it and gives nothing back: the units of a lease go back exactly once. Not API.
//
// Cost for a line that never leased: a test of a null pointer in each arming of the timer and each timer
// wake-up, and in the drain checks; nothing on the lock-free word's paths (a leased permit never goes
// through it) nor in the grants of a dispatch.
#pragma once

#include <rein/detail/lease_table.hpp>
#include <rein/detail/limiter_core.hpp>
#include <rein/detail/permit_source.hpp>
#include <rein/observer.hpp>
#include <rein/outcome.hpp>
#include <rein/permit.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>

namespace rein::detail {

// Where a leased permit reports back: the line, with the lease's id (the permit's note).
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
class limiter_core<Policy, Executor, Clock, Mutex, Signature>::lease_source final : public permit_source {
 public:
  explicit lease_source(limiter_core* core) noexcept : core_(core) {}
  void release_permit(std::size_t n, std::chrono::nanoseconds, std::uint64_t note,
                      outcome result) noexcept override {
    core_->release_leased(n, note, result);
  }
  void permit_split(std::uint64_t note) noexcept override { core_->split_leased(note); }

 private:
  limiter_core* core_;
};

template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
struct limiter_core<Policy, Executor, Clock, Mutex, Signature>::lease_state {
  explicit lease_state(limiter_core* core) noexcept : source(core) {}
  lease_table table;
  lease_source source;
};

// Before a leased acquire: makes the line's lease state if it has none, and the nodes of this lease, so
// that leasing the permit it yields allocates nothing. Throws std::bad_alloc, having changed nothing that
// matters (an empty lease state stays).
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline lease_table::reserved limiter_core<Policy, Executor, Clock, Mutex, Signature>::reserve_lease() {
  if constexpr (leasable) {  // (explicit instantiations make every member, for every policy)
    line_lock lock(*this);
    if (!leases_) leases_ = std::make_unique<lease_state>(this);
  }
  return lease_table::reserve();
}

// Puts `p`, a permit this line just granted in `partition`, under a lease of `lease` (> 0) from now. An
// empty permit stays empty (the line may be gone: it is not touched).
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline permit limiter_core<Policy, Executor, Clock, Mutex, Signature>::lease_permit(
    permit p, lease_table::reserved& r, std::chrono::nanoseconds lease, std::uint8_t partition) noexcept {
  if constexpr (!leasable) {
    (void)r, (void)lease, (void)partition;
    return p;
  } else {
    if (!p) return p;
    line_lock lock(*this);
    const time_point now = Clock::now();
    const std::int64_t now_ns = to_ns(now).count();
    constexpr std::int64_t never = std::numeric_limits<std::int64_t>::max();
    const std::int64_t end = now_ns > 0 && lease.count() > never - now_ns ? never : now_ns + lease.count();
    permit_access::lease(p, &leases_->source, leases_->table.start(r, p.count(), partition, end));
    arm_timer_locked_noexcept(now);  // if it cannot be armed, the lease ends at the next event after its end
    return p;
  }
}

// A leased permit comes back: its units count if its lease is still live by the clock (a lease whose end has
// come is taken back first, whether or not the timer has run yet), nothing if it expired.
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline void limiter_core<Policy, Executor, Clock, Mutex, Signature>::release_leased(std::size_t n, std::uint64_t id,
                                                                                  outcome result) noexcept {
  if constexpr (!leasable) {
    (void)n, (void)id, (void)result;
  } else {
    std::shared_ptr<limiter_core> last;  // the core's own reference after shutdown: dropped after the unlock
    completions done(this);
    line_lock lock(*this);
    const time_point now = Clock::now();
    // After shutdown nothing expires any more (nobody is left to grant): the permit just comes back.
    if (!shut_down_.load(std::memory_order_relaxed)) expire_leases_locked(now, done);
    const lease_table::returned back = leases_->table.give_back(id, n);
    assert(holders_ != 0);
    if (--holders_ == 0) last = std::move(self_);
    if (!back.inert) {
      partition_released_locked(back.partition, back.units);
      policy_release(back.units, std::chrono::nanoseconds{0}, 0, result, now, no_work{});
    }
    dispatch_locked(now, done);
    if (has_observer_) observe_locked(now, done);
    lock.unlock();  // before `done` posts, although it was declared after the lock
  }
}

template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline void limiter_core<Policy, Executor, Clock, Mutex, Signature>::split_leased(std::uint64_t id) noexcept {
  if constexpr (!leasable) {
    (void)id;
  } else {
    line_lock lock(*this);
    ++holders_;
    leases_->table.split(id);
  }
}

// Takes back every lease ended by `now`: its units not given back go back as a release's would (the caller
// dispatches), its permits become inert; counted, and reported as one event.
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
REIN_NOINLINE inline void limiter_core<Policy, Executor, Clock, Mutex, Signature>::expire_leases_locked(
    time_point now, completions& done) noexcept {
  if constexpr (!leasable) {
    (void)now, (void)done;
  } else {
    const std::int64_t now_ns = to_ns(now).count();
    if (!leases_ || !leases_->table.due(now_ns)) return;
    std::uint64_t expired = 0;
    do {
      const lease_table::expired e = leases_->table.expire_first();
      partition_released_locked(e.partition, e.units);
      policy_release(e.units, std::chrono::nanoseconds{0}, 0, outcome::ignored, now, no_work{});
      ++expired;
    } while (leases_->table.due(now_ns));
    policy_.leases_expired += expired;
    if (done.observing()) {
      limiter_event e;
      e.kind = event_kind::lease_expired;
      e.count = expired;
      done.buffer().push(e);
    }
  }
}

// The end of the earliest live lease, as an instant of Clock (time_point::max(): none).
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline auto limiter_core<Policy, Executor, Clock, Mutex, Signature>::lease_wake_locked() const noexcept
    -> time_point {
  const std::int64_t end = leases_->table.next_expiry();
  if (end == std::numeric_limits<std::int64_t>::max()) return time_point::max();
  return time_point(std::chrono::duration_cast<duration>(std::chrono::nanoseconds(end)));
}

template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline std::size_t limiter_core<Policy, Executor, Clock, Mutex, Signature>::inert_locked() const noexcept {
  if constexpr (leasable) return leases_ ? leases_->table.inert() : 0;
  else return 0;
}

}  // namespace rein::detail
