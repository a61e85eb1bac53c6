// The admission rule of rein::basic_semaphore (a count of free permits), as the wait line asks it. Not API.
#pragma once

#include <rein/observer.hpp>
#include <rein/outcome.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <optional>

namespace rein::detail {

// The admission rule of a counting semaphore: n permits are free or they are not. Time plays no part.
struct semaphore_policy {
  static constexpr bool needs_time = false;

  std::size_t permits;    // the total
  std::size_t available;  // free now
  std::size_t owed = 0;   // removed from the total while held: the next releases pay this off first

  // Its permits may be leased (basic_semaphore::with_lease, detail/line_leases.hpp): the line counts here the
  // leases it took back, for the snapshot.
  static constexpr bool leasable = true;
  std::uint64_t leases_expired = 0;

  explicit semaphore_policy(std::size_t n) noexcept : permits(n), available(n) {}

  std::size_t in_flight() const noexcept { return permits + owed - available; }

  // A thread-safe line lends free permits to a lock-free word (detail/permit_pool.hpp) between its locked
  // calls. Lends up to `max` of them, or nothing while holders owe permits: their releases must pay that off
  // first, which only the locked path does.
  static constexpr bool poolable = true;
  std::optional<std::size_t> lend(std::size_t max) noexcept {
    if (owed != 0) return std::nullopt;
    const std::size_t lent = std::min(max, available);
    available -= lent;
    return lent;
  }
  // The lent permits come back (the word was reclaimed), as free ones.
  void repay(std::size_t n) noexcept { available += n; }

  // What partitions divide (rein/partition.hpp): the total.
  std::size_t partition_limit() const noexcept { return permits; }

  // Raises the total by n: what holders owe is forgiven first, the rest is free.
  void add(std::size_t n) noexcept {
    permits += n;
    const std::size_t forgiven = std::min(n, owed);
    owed -= forgiven;
    available += n - forgiven;
  }

  // Lowers the total by n: free permits go first, the rest is owed by the holders' next releases.
  void forget(std::size_t n) noexcept {
    permits -= n;
    const std::size_t from_free = std::min(n, available);
    available -= from_free;
    owed += n - from_free;
  }

  // A semaphore made with no permits is a gate that add_permits opens: its waiters wait for that.
  // Otherwise a request above the total could only wait forever, so it fails at once.
  bool exceeds(std::size_t n) const noexcept { return permits != 0 && n > permits; }

  template <class TimePoint>
  bool try_take(std::size_t n, TimePoint) noexcept {
    if (n > available) return false;
    available -= n;
    return true;
  }

  template <class TimePoint>
  TimePoint ready_at(std::size_t, TimePoint) const noexcept {
    return TimePoint::max();  // only a release frees permits
  }

  template <class TimePoint>
  std::optional<TimePoint> predict(std::size_t, std::size_t, TimePoint) const noexcept {
    return std::nullopt;  // unknowable: depends on when holders release
  }

  template <class TimePoint>
  void on_release(std::size_t n, std::chrono::nanoseconds, outcome, TimePoint) noexcept {
    const std::size_t paid = std::min(n, owed);
    owed -= paid;
    available += n - paid;
  }

  template <class TimePoint>
  observed_state observe(TimePoint) const noexcept {
    observed_state s;
    s.limit = s.level = static_cast<double>(permits);
    return s;
  }
};

}  // namespace rein::detail
