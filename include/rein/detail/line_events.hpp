// The waiting line's observation events: the members of limiter_core (detail/limiter_core.hpp) that find
// what changed in the policy's observed state and deliver events to the observer (rein/observer.hpp).
// Not API.
//
// Observation: with an observer set, every locked path that can change what the policy reports (its
// optional `observed_state observe(time_point now) const`) compares it with the state last seen, and the
// events found, with rejections, are delivered after the lock is released (class completions). Without one,
// the cost is a test of a bool on each locked path, and of an empty event buffer in each completion batch.
#pragma once

#include <rein/detail/limiter_core.hpp>
#include <rein/observer.hpp>
#include <rein/try_result.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace rein::detail {

// Events of a locked section that completes nothing (the observed fast paths), delivered after the lock
// (declared before it): lighter than a completions batch.
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
class limiter_core<Policy, Executor, Clock, Mutex, Signature>::event_sink {
 public:
  explicit event_sink(limiter_core* core) noexcept : core_(core) {}
  event_sink(const event_sink&) = delete;
  event_sink& operator=(const event_sink&) = delete;
  ~event_sink() {
    if (events && !events->empty()) events->deliver(core_->observer_, core_->name());
  }
  static constexpr bool observing() noexcept { return true; }
  event_buffer& buffer() noexcept {
    if (!events) events.emplace();
    return *events;
  }
  std::optional<event_buffer> events;

 private:
  limiter_core* core_;
};

template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline auto limiter_core<Policy, Executor, Clock, Mutex, Signature>::observe_now(
    time_point now) const noexcept -> observed_state {
  if constexpr (observable<Policy>) return policy_.observe(now);
  else return (void)now, observed_state{};
}

// Finds what changed since the last observation (see the top of the file).
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
template <class Sink>
inline void limiter_core<Policy, Executor, Clock, Mutex, Signature>::observe_locked(
    time_point now, Sink& done) noexcept {
  if constexpr (observable<Policy>) {
    const observed_state current = policy_.observe(now);
    if (done.observing() && !(current == last_observed_)) current.diff(last_observed_, done.buffer());
    last_observed_ = current;
  } else {
    (void)now, (void)done;
  }
}

// try_acquire with an observer: the same, and what it found is delivered after the lock.
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
REIN_NOINLINE inline try_status limiter_core<Policy, Executor, Clock, Mutex, Signature>::try_acquire_observed(
    std::size_t n, std::chrono::nanoseconds& stamp, std::int64_t* retry_ns, std::uint8_t partition,
    const time_point* at, std::uint64_t* note) {
  event_sink done(this);
  line_lock lock(*this);
  // Observed at the lock's own reading: a caller's older one would replay events the observer has seen.
  const time_point seen = policy_now();
  const time_point now = at != nullptr ? *at : seen;
  observe_locked(seen, done);
  if (closed_) return try_status::closed;
  if (policy_.exceeds(n)) return try_status::exceeds_capacity;
  const try_status status = take_locked(n, now, stamp, retry_ns, partition, note);
  if (status == try_status::acquired) observe_locked(seen, done);
  return status;
}

// The uncontended release with an observer: the limit may have moved (an adaptive limiter's sample).
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
template <class Work>
REIN_NOINLINE inline void limiter_core<Policy, Executor, Clock, Mutex, Signature>::release_observed(
    line_lock& lock, std::size_t n, std::chrono::nanoseconds stamp, std::uint64_t note, outcome result,
    Work work) noexcept {
  event_sink done(this);
  const time_point now = policy_now();
  policy_release(n, stamp, note, result, now, work);
  observe_locked(now, done);
  lock.unlock();  // before `done` delivers, although it was declared after the lock
}

}  // namespace rein::detail
