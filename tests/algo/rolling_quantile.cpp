// rein::algo::detail::rolling_quantile: the same value, after every push, as the sorted-window implementation it
// replaced in tuned_aimd (kept below as the reference), over long random sequences.
#include <rein/algo/rolling_quantile.hpp>

#include "support/catch.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <stdexcept>
#include <vector>

using rein::algo::detail::rolling_quantile;

namespace {

// tuned_aimd's rolling median before rolling_quantile: a ring buffer plus a sorted copy, O(capacity) per push.
class sorted_window {
 public:
  explicit sorted_window(std::size_t capacity) : ring_(capacity) { sorted_.reserve(capacity); }

  std::size_t size() const noexcept { return sorted_.size(); }

  void resize(std::size_t capacity) {
    std::vector<std::int64_t> ring(capacity);
    std::vector<std::int64_t> sorted;
    sorted.reserve(capacity);
    const std::size_t n = sorted_.size();
    const std::size_t keep = n < capacity ? n : capacity;
    const std::size_t oldest = n == ring_.size() ? next_ : 0;
    for (std::size_t i = n - keep; i < n; ++i) {
      const std::int64_t v = ring_[(oldest + i) % ring_.size()];
      ring[i - (n - keep)] = v;
      sorted.insert(std::upper_bound(sorted.begin(), sorted.end(), v), v);
    }
    ring_ = std::move(ring);
    sorted_ = std::move(sorted);
    next_ = keep == capacity ? 0 : keep;
  }

  void push(std::int64_t v) {
    if (sorted_.size() == ring_.size()) {
      sorted_.erase(std::lower_bound(sorted_.begin(), sorted_.end(), ring_[next_]));
    }
    ring_[next_] = v;
    next_ = next_ + 1 == ring_.size() ? 0 : next_ + 1;
    sorted_.insert(std::upper_bound(sorted_.begin(), sorted_.end(), v), v);
  }

  double quantile(double q) const noexcept {
    if (q == 0.5) return median();
    const double rank = std::ceil(q * static_cast<double>(sorted_.size()));
    const std::size_t i = rank < 1.0 ? 0 : static_cast<std::size_t>(rank) - 1;
    return static_cast<double>(sorted_[i < sorted_.size() ? i : sorted_.size() - 1]);
  }

  double median() const noexcept {
    const std::size_t n = sorted_.size();
    const auto upper = static_cast<double>(sorted_[n / 2]);
    if (n % 2 == 1) return upper;
    return (static_cast<double>(sorted_[n / 2 - 1]) + upper) / 2.0;
  }

 private:
  std::vector<std::int64_t> ring_;
  std::vector<std::int64_t> sorted_;
  std::size_t next_ = 0;
};

// Pushes `pushes` random values into both, comparing the quantile after each; now and then resizes both (to a
// random capacity, smaller or larger) or switches the quantile. Values come from [0, spread): a small spread
// makes long runs of duplicates. Returns the number of comparisons.
std::size_t differ(std::uint64_t seed, std::size_t capacity, double q, std::int64_t spread, std::size_t pushes,
                   bool reshape) {
  std::mt19937_64 rng{seed};
  std::uniform_int_distribution<std::int64_t> value{0, spread - 1};
  const std::vector<double> qs{0.5, 0.1, 0.9, 1.0, 0.01, 0.25, 1.0 / 3.0, 0.75, 0.999};
  rolling_quantile fast{capacity, q};
  sorted_window slow{capacity};
  std::size_t compared = 0;
  for (std::size_t i = 0; i < pushes; ++i) {
    const std::int64_t v = value(rng);
    fast.push(v);
    slow.push(v);
    REQUIRE(fast.size() == slow.size());
    const double expected = slow.quantile(q);
    if (fast.quantile() != expected) {
      INFO("seed " << seed << ", capacity " << capacity << ", q " << q << ", push " << i);
      REQUIRE(fast.quantile() == expected);
    }
    ++compared;
    if (reshape && rng() % 997 == 0) {
      const std::size_t to = 1 + rng() % (2 * capacity + 2);
      fast.resize(to);
      slow.resize(to);
      capacity = to;
      REQUIRE(fast.size() == slow.size());
      if (fast.size() > 0) REQUIRE(fast.quantile() == slow.quantile(q));
    }
    if (reshape && rng() % 499 == 0) {
      q = qs[rng() % qs.size()];
      fast.set_quantile(q);
      REQUIRE(fast.quantile() == slow.quantile(q));
    }
  }
  return compared;
}

}  // namespace

TEST_CASE("rolling_quantile: equals the sorted window after every push, duplicates and wrap-around included") {
  std::size_t compared = 0;
  std::uint64_t seed = 1;
  for (const std::size_t capacity : std::initializer_list<std::size_t>{1, 2, 3, 4, 5, 8, 9, 24, 200, 1000}) {
    for (const double q : {0.5, 0.1, 0.9, 1.0, 0.01, 0.3}) {
      for (const std::int64_t spread : {1, 3, 50, 1000000}) {
        compared += differ(seed++, capacity, q, spread, 5 * capacity + 300, false);
      }
    }
  }
  CHECK(compared == 10 * 6 * 4 * 300 + 6 * 4 * 5 * (1 + 2 + 3 + 4 + 5 + 8 + 9 + 24 + 200 + 1000));
}

TEST_CASE("rolling_quantile: equals the sorted window across resizes and quantile switches") {
  std::size_t compared = 0;
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    const std::size_t capacity = 1 + seed * 7 % 250;
    const std::int64_t spread = seed % 4 == 0 ? 2 : seed % 4 == 1 ? 20 : seed % 4 == 2 ? 400 : 1000000000;
    compared += differ(1000 + seed, capacity, seed % 2 == 0 ? 0.5 : 0.1, spread, 20000, true);
  }
  CHECK(compared == 40 * 20000);
}

TEST_CASE("rolling_quantile: nearest rank, the median's mean of two, and the window") {
  rolling_quantile median{4, 0.5};
  median.push(10);
  CHECK(median.quantile() == 10.0);
  median.push(1);
  CHECK(median.quantile() == 5.5);  // (1 + 10) / 2
  median.push(7);
  CHECK(median.quantile() == 7.0);
  median.push(4);
  CHECK(median.quantile() == 5.5);  // (4 + 7) / 2
  median.push(100);                 // 10 leaves: 1 4 7 100
  CHECK(median.quantile() == 5.5);
  median.push(100);  // 1 leaves: 4 7 100 100
  CHECK(median.quantile() == 53.5);

  rolling_quantile low{10, 0.1};  // rank max(ceil(0.1 n), 1): the smallest up to 10 values
  for (const std::int64_t v : {50, 40, 30, 20, 10, 60, 70, 80, 90, 100}) low.push(v);
  CHECK(low.quantile() == 10.0);
  low.push(5);  // 50 leaves; 11 > 10 values never kept
  CHECK(low.size() == 10);
  CHECK(low.quantile() == 5.0);
  low.set_quantile(0.9);  // rank 9 of 40 30 20 10 60 70 80 90 100 5
  CHECK(low.quantile() == 90.0);
  low.resize(3);  // the newest three: 90 100 5; rank ceil(2.7) = 3
  CHECK(low.size() == 3);
  CHECK(low.quantile() == 100.0);

  CHECK_THROWS_AS(rolling_quantile(0, 0.5), std::length_error);
}
