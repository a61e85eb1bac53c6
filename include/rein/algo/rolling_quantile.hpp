// One exact quantile of a sliding window of integers, in O(log n) per value. Not API.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <utility>
#include <vector>

namespace rein::algo::detail {

/// The nearest-rank `q` quantile of the last `capacity` values pushed, exact.
///
/// Rule, with n values in the window (n <= capacity): the value of rank `max(ceil(q x n), 1)` in ascending
/// order (1-based, at most n), i.e. the smallest value with at least `q x n` values at or below it. `q == 0.5`
/// is the median instead: the middle value for an odd n, the mean of the two middle values for an even n.
///
/// How: a ring buffer of the values in arrival order, and two 8-ary heaps of ring slots that split the window
/// at that rank: `low` (a max-heap) holds the ranks 1..k, `high` (a min-heap) the rest, every value in `low`
/// at or below every value in `high`, so the quantile is the top of `low` (the median of an even n: the mean
/// of both tops). Each slot knows where its value sits in a heap, so the value that leaves the window is
/// erased where it is (no lazy deletion, nothing stale kept). Both heaps share one array: `low` grows from the
/// front, `high` from the back.
///
/// Cost: push O(log n) (one erase, one insert, at most one top moved across for each change of k; a sift
/// compares at most 8 children on each of log8(n) levels); quantile() O(1). Memory: 16 bytes per value of
/// capacity (8 for the ring, 4 for the heaps, 4 for where each slot sits), allocated at construction and by
/// resize() only.
class rolling_quantile {
 public:
  /// @param capacity values kept, in [1, 2^32 - 1]; @param q in (0, 1] (not checked: the caller validates).
  /// @throws std::length_error if `capacity` is out of range.
  rolling_quantile(std::size_t capacity, double q)
      : ring_(checked(capacity)), heap_(capacity), where_(capacity), q_{q}, median_{q == 0.5} {}

  /// Values in the window.
  std::size_t size() const noexcept { return size_; }

  /// The window's capacity.
  std::size_t capacity() const noexcept { return ring_.size(); }

  /// Adds `v`, dropping the oldest value if the window is full. Allocates nothing.
  void push(std::int64_t v) noexcept {
    const auto slot = static_cast<std::uint32_t>(next_);
    if (size_ == ring_.size()) {
      erase(slot);  // compares by ring_[slot], the old value: overwrite it only after
    } else {
      rank_ = rank(++size_);  // fixed once the window is full
    }
    ring_[slot] = v;
    next_ = next_ + 1 == ring_.size() ? 0 : next_ + 1;
    if (low_ > 0 && v <= ring_[top<false>()]) {
      insert<false>(slot);
    } else {
      insert<true>(slot);
    }
    balance();
  }

  /// The quantile (see the class). Precondition: size() > 0.
  double quantile() const noexcept {
    const auto low = static_cast<double>(ring_[top<false>()]);
    if (median_ && size_ % 2 == 0) return (low + static_cast<double>(ring_[top<true>()])) / 2.0;
    return low;
  }

  /// Switches to the `q` quantile of the same values (q in (0, 1], 0.5 the median). Allocates nothing.
  void set_quantile(double q) noexcept {
    q_ = q;
    median_ = q == 0.5;
    rank_ = rank(size_);
    balance();
  }

  /// Keeps the newest `capacity` values (all of them if fewer) and holds `capacity` from now on. On a throw,
  /// nothing changed. @throws std::length_error as the constructor; std::bad_alloc.
  void resize(std::size_t capacity) {
    rolling_quantile next{capacity, q_};
    const std::size_t keep = size_ < capacity ? size_ : capacity;
    const std::size_t oldest = size_ == ring_.size() ? next_ : 0;
    for (std::size_t i = size_ - keep; i < size_; ++i) next.push(ring_[(oldest + i) % ring_.size()]);
    *this = std::move(next);
  }

 private:
  static std::size_t checked(std::size_t capacity) {
    if (capacity < 1 || capacity > std::numeric_limits<std::uint32_t>::max())
      throw std::length_error("rolling_quantile: capacity out of [1, 2^32 - 1]");
    return capacity;
  }

  // How many of the smallest values `low` holds for n values: the quantile's rank (both middle ranks' lower
  // one for the median of an even n).
  std::size_t rank(std::size_t n) const noexcept {
    if (n == 0) return 0;
    if (median_) return (n + 1) / 2;
    const double r = std::ceil(q_ * static_cast<double>(n));
    const std::size_t k = r < 1.0 ? 1 : static_cast<std::size_t>(r);
    return k < n ? k : n;
  }

  void balance() noexcept {
    while (low_ > rank_) insert<true>(pop<false>());
    while (low_ < rank_) insert<false>(pop<true>());
  }

  // Heap position `i` of `low` (High false) or `high` (High true) in the shared array.
  template <bool High>
  std::size_t at(std::size_t i) const noexcept {
    return High ? heap_.size() - 1 - i : i;
  }
  // True if value a belongs above value b in the heap: the larger in `low`, the smaller in `high`.
  template <bool High>
  static bool above(std::int64_t a, std::int64_t b) noexcept {
    return High ? a < b : a > b;
  }
  template <bool High>
  std::uint32_t top() const noexcept {
    return heap_[at<High>(0)];
  }
  template <bool High>
  std::size_t& count() noexcept {
    return High ? high_ : low_;
  }
  template <bool High>
  void place(std::size_t i, std::uint32_t slot) noexcept {
    heap_[at<High>(i)] = slot;
    where_[slot] = static_cast<std::uint32_t>(at<High>(i));
  }

  template <bool High>
  void sift_up(std::size_t i, std::uint32_t slot) noexcept {
    const std::int64_t v = ring_[slot];
    while (i > 0) {
      const std::size_t parent = (i - 1) / arity;
      const std::uint32_t p = heap_[at<High>(parent)];
      if (!above<High>(v, ring_[p])) break;
      place<High>(i, p);
      i = parent;
    }
    place<High>(i, slot);
  }

  template <bool High>
  void sift_down(std::size_t i, std::uint32_t slot) noexcept {
    const std::int64_t v = ring_[slot];
    const std::size_t n = count<High>();
    for (;;) {
      const std::size_t first = arity * i + 1;
      if (first >= n) break;
      const std::size_t last = first + arity < n ? first + arity : n;
      std::size_t child = first;
      std::int64_t best = ring_[heap_[at<High>(first)]];
      for (std::size_t j = first + 1; j < last; ++j) {
        const std::int64_t w = ring_[heap_[at<High>(j)]];
        const bool better = above<High>(w, best);
        child = better ? j : child;
        best = better ? w : best;
      }
      const std::uint32_t c = heap_[at<High>(child)];
      if (!above<High>(best, v)) break;
      place<High>(i, c);
      i = child;
    }
    place<High>(i, slot);
  }

  template <bool High>
  void insert(std::uint32_t slot) noexcept {
    sift_up<High>(count<High>()++, slot);
  }

  // Removes heap position `i`: the last entry fills the hole and moves up or down from there.
  template <bool High>
  void remove(std::size_t i) noexcept {
    const std::size_t last = --count<High>();
    if (i == last) return;
    const std::uint32_t moved = heap_[at<High>(last)];
    if (i > 0 && above<High>(ring_[moved], ring_[heap_[at<High>((i - 1) / arity)]])) {
      sift_up<High>(i, moved);
    } else {
      sift_down<High>(i, moved);
    }
  }

  template <bool High>
  std::uint32_t pop() noexcept {
    const std::uint32_t slot = top<High>();
    remove<High>(0);
    return slot;
  }

  // Removes the value in `slot` from its heap. `low` fills the array's front [0, low_), `high` its back:
  // low_ + high_ never exceeds the capacity, so a position tells the heap.
  void erase(std::uint32_t slot) noexcept {
    const std::size_t p = where_[slot];
    if (p < low_) {
      remove<false>(p);
    } else {
      remove<true>(heap_.size() - 1 - p);
    }
  }

  // Children per heap node. A sift down follows the first of the children at each level, a coin toss on
  // random values: with 2 children, a mispredicted branch at nearly every one of log2(n) levels. 8 children,
  // compared without branches, take a third of the levels: `update/tuned_aimd` (benchmarks/adaptive.cpp, four
  // pushes per sample) went from 165 to 130 ns of CPU on a loaded machine.
  static constexpr std::size_t arity = 8;
  std::vector<std::int64_t> ring_;    // the values, oldest at next_ once full
  std::vector<std::uint32_t> heap_;   // slots: low_'s heap at the front, high_'s reversed at the back
  std::vector<std::uint32_t> where_;  // each slot's position in heap_
  std::size_t size_ = 0;
  std::size_t next_ = 0;  // the slot the next value goes to
  std::size_t low_ = 0;   // entries in `low`
  std::size_t high_ = 0;  // entries in `high`
  std::size_t rank_ = 0;  // rank(size_): the entries `low` holds once balanced
  double q_;
  bool median_;
};

}  // namespace rein::algo::detail
