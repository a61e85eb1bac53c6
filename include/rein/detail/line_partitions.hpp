// The waiting line's partitions (rein/partition.hpp): the members of limiter_core (detail/limiter_core.hpp)
// that keep each partition's guaranteed share, over the table of detail/partition_table.hpp. Not API.
#pragma once

#include <rein/detail/limiter_core.hpp>
#include <rein/detail/partition_table.hpp>
#include <rein/detail/permit_source.hpp>
#include <rein/detail/wait_op.hpp>
#include <rein/outcome.hpp>

#include <bitset>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace rein::detail {

// Where a permit of one partition reports back: the line, told which partition it was.
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
class limiter_core<Policy, Executor, Clock, Mutex, Signature>::partition_source final : public permit_source {
 public:
  void bind(limiter_core* core, std::uint8_t index) noexcept {
    core_ = core;
    index_ = index;
  }
  void release_permit(std::size_t n, std::chrono::nanoseconds stamp, std::uint64_t note,
                      outcome result) noexcept override {
    core_->release(n, stamp, note, result, index_);
  }
  void release_permit_with_work(std::size_t n, std::chrono::nanoseconds stamp, std::uint64_t note, outcome result,
                                double work) noexcept override {
    core_->release(n, stamp, note, result, index_, work);
  }
  void permit_split(std::uint64_t note) noexcept override { core_->permit_split(note); }
  void restamp_permit(std::chrono::nanoseconds from, std::chrono::nanoseconds to) noexcept override {
    core_->restamp_permit(from, to);
  }

 private:
  limiter_core* core_ = nullptr;
  std::uint8_t index_ = 0;
};

// The partition bookkeeping (rein/partition.hpp), under the lock; nothing without partitions.
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline void limiter_core<Policy, Executor, Clock, Mutex, Signature>::partition_granted_locked(
    std::uint8_t p, std::size_t n) noexcept {
  if constexpr (partitionable) {
    if (sources_) partitions_.granted(p, n);
  }
  (void)p, (void)n;
}

template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline void limiter_core<Policy, Executor, Clock, Mutex, Signature>::partition_released_locked(
    std::uint8_t p, std::size_t n) noexcept {
  if constexpr (partitionable) {
    if (sources_) partitions_.released(p, n);
  }
  (void)p, (void)n;
}

// Whether the line has partitions (a constant false for the policies that cannot have them).
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline bool limiter_core<Policy, Executor, Clock, Mutex, Signature>::partitioned() const noexcept {
  if constexpr (partitionable) return sources_ != nullptr;
  else return false;
}

// Whether partition p is below its guarantee with waiters.
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline bool limiter_core<Policy, Executor, Clock, Mutex, Signature>::partition_starved_locked(
    std::uint8_t p) const noexcept {
  if constexpr (partitionable) {
    if (sources_) return partitions_.starved(p, policy_.partition_limit());
  }
  return (void)p, false;
}

// Partitions (rein/partition.hpp): grants the first waiter, in the line's order, of a partition below its
// guarantee whose request fits. The first waiter of each such partition is a candidate, so one that does
// not fit holds back neither the others nor, being unable to fit at the current limit, anyone.
// O(waiters walked), only while some partition below its guarantee waits; the walk stops once every such
// partition's first waiter was seen.
template <class Policy, class Executor, class Clock, class Mutex, acquire_signature Signature>
inline auto limiter_core<Policy, Executor, Clock, Mutex, Signature>::serve_starved_locked(
    time_point now, completions& done) noexcept -> starved_step {
  if constexpr (partitionable) {
    const std::size_t limit = policy_.partition_limit();
    std::size_t pending = partitions_.starved_count(limit);
    if (pending == 0) return starved_step::none;
    std::bitset<partition_table::max_partitions + 1> seen;
    bool hold = false;
    for (wait_op* w = queue_.front(); w != nullptr && pending != 0; w = w->next) {
      if (seen[w->partition] || !partitions_.starved(w->partition, limit)) continue;
      seen[w->partition] = true;
      --pending;
      if (w->count > limit) continue;  // cannot fit until the limit grows: not a reason to wait
      if (policy_.try_take(w->count, now)) return grant_locked(w, now, done), starved_step::granted;
      hold = true;
    }
    return hold ? starved_step::hold : starved_step::none;
  } else {
    return (void)now, (void)done, starved_step::none;
  }
}

}  // namespace rein::detail
