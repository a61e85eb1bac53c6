// A log-linear histogram of durations: O(1) record, mergeable, percentiles with a stated relative error (the
// layout of HdrHistogram, Gil Tene's High Dynamic Range Histogram), paying memory only for octaves in use.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <utility>

namespace rein::algo {

/// A histogram of durations in fixed log-linear buckets, as HdrHistogram lays them out: each power of two
/// of nanoseconds (an octave) is cut into 32 equal sub-buckets, so a bucket is never wider than 1/32 of the
/// values it holds.
///
/// Layout (values in nanoseconds):
/// - [0, 1024): 64 buckets of 16 ns each;
/// - [2^k, 2^(k+1)) for k = 10 .. 41: 32 buckets of 2^(k-5) ns each;
/// - 2^42 ns (about 73.3 minutes) and above: one overflow bucket (max() stays exact).
/// That is 1,089 buckets: the overflow bucket and 34 blocks of 32 (two for [0, 1024), one per octave above).
///
/// Memory: a block of 32 counters (256 bytes) exists only once a value fell in it; the blocks in use live in
/// one heap array (ordered, found through a 64-bit mask of the blocks present), and the object itself is
/// 104 bytes. An empty histogram holds no heap memory; one whose values span k blocks holds k * 256 bytes
/// (allocated_bytes()); at most 34 blocks, 8,704 bytes, whatever is recorded (while the array grows, the old
/// one and the new one are held together for a moment). (The fixed layout this replaced
/// held all 1,089 counters inline, 8,712 bytes in every limiter; rein's limiters record their waits, so a
/// keyed registry of idle or fast keys paid that per key.) Values in an octave recorded for the first time
/// grow the array by one block (operator new, at most 34 times between resets while memory lasts; a record
/// into a block that could not be made asks again).
///
/// Out of memory: record() and operator+= never throw. A value whose block cannot be allocated is counted in
/// count(), sum(), min(), max() and mean() (those stay exact) but in no bucket; lost() tells how many were.
/// Percentiles and count_below() are then read from the bucketed values only. A copy that cannot allocate
/// its blocks keeps every summary and counts all its bucketed values as lost.
///
/// Error: a percentile reads as the midpoint of the bucket its rank falls in, clamped to [min(), max()], so
/// it is within `relative_error` (1/64, about 1.6%) of a value actually recorded at that rank for every value
/// from 512 ns to 73 minutes, within 8 ns from 16 ns to 512 ns, and within 16 ns below (the first bucket,
/// [0, 16 ns), reads as min(), so that zero waits read as zero). count(), sum(), min() and max() are exact
/// (sum() wraps after 2^64 ns, 584 years in total).
///
/// Percentile rule: percentile(p) is the value at rank ceil(p / 100 * count()) (at least 1) in ascending
/// order, the "nearest rank" definition HdrHistogram uses; percentile(100) is max().
///
/// Recording is one count-leading-zeros, a shift, a table look-up and three additions (plus a block's
/// allocation the first time its octave is seen); merging adds bucket by bucket (histograms of several
/// limiters or processes combine exactly, as HdrHistogram's add does).
///
/// @par Thread Safety
/// A value type: no internal locking (rein's limiters record under their own lock). Copies allocate their
/// own blocks (one operator new call for all of them).
class log_histogram {
 public:
  /// log2 of the sub-buckets per octave.
  static constexpr unsigned sub_bucket_bits = 5;
  /// Sub-buckets per octave: 32.
  static constexpr std::size_t sub_buckets = std::size_t{1} << sub_bucket_bits;
  /// log2 of the width in nanoseconds of the finest buckets (16 ns, in [0, 1024 ns)).
  static constexpr unsigned unit_bits = 4;
  /// Values from 2^top_bits ns on (about 73.3 minutes) share the last bucket, the overflow bucket.
  static constexpr unsigned top_bits = 42;
  /// Buckets: 1,089 (1,088 regular ones and the overflow bucket).
  static constexpr std::size_t bucket_count = (top_bits - unit_bits - sub_bucket_bits + 1) * sub_buckets + 1;
  /// Bound on the relative error of a percentile read from 512 ns to 2^42 ns: half the widest bucket width
  /// relative to the values it holds, 1 / 64.
  static constexpr double relative_error = 1.0 / (2.0 * static_cast<double>(sub_buckets));

  /// Blocks of `sub_buckets` counters: every bucket but the overflow one lives in one.
  static constexpr std::size_t block_count = (bucket_count - 1) / sub_buckets;
  static_assert(block_count <= 64, "the presence mask is 64 bits");

  /// Bytes of one block of counters.
  static constexpr std::size_t block_bytes = sub_buckets * sizeof(std::uint64_t);

  /// An empty histogram: no heap memory.
  log_histogram() noexcept = default;

  /// A copy, with its own blocks (one allocation; if it fails, see "Out of memory" above).
  log_histogram(const log_histogram& other) noexcept
      : count_(other.count_), sum_(other.sum_), max_(other.max_), min_(other.min_), overflow_(other.overflow_),
        lost_(other.lost_) {
    const std::size_t n = blocks_in_use(other.mask_);
    if (n == 0) return;
    blocks_.reset(new (std::nothrow) block[n]);
    if (!blocks_) {
      lost_ = count_ - overflow_;
      return;
    }
    std::copy(other.blocks_.get(), other.blocks_.get() + n, blocks_.get());
    mask_ = other.mask_;
    at_ = other.at_;
  }

  /// Takes `other`'s blocks; `other` is left empty.
  log_histogram(log_histogram&& other) noexcept
      : blocks_(std::move(other.blocks_)), mask_(std::exchange(other.mask_, 0)), at_(std::exchange(other.at_, {})),
        count_(std::exchange(other.count_, 0)),
        sum_(std::exchange(other.sum_, 0)), max_(std::exchange(other.max_, 0)),
        min_(std::exchange(other.min_, std::numeric_limits<std::uint64_t>::max())),
        overflow_(std::exchange(other.overflow_, 0)), lost_(std::exchange(other.lost_, 0)) {}

  /// Becomes a copy of `other` (as the copy constructor: out of memory, its bucketed values count as lost).
  log_histogram& operator=(const log_histogram& other) noexcept {
    if (this != &other) *this = log_histogram(other);
    return *this;
  }

  /// Takes `other`'s blocks, freeing its own; `other` is left empty.
  log_histogram& operator=(log_histogram&& other) noexcept {
    if (this == &other) return *this;
    blocks_ = std::move(other.blocks_);
    mask_ = std::exchange(other.mask_, 0);
    at_ = std::exchange(other.at_, {});
    count_ = std::exchange(other.count_, 0);
    sum_ = std::exchange(other.sum_, 0);
    max_ = std::exchange(other.max_, 0);
    min_ = std::exchange(other.min_, std::numeric_limits<std::uint64_t>::max());
    overflow_ = std::exchange(other.overflow_, 0);
    lost_ = std::exchange(other.lost_, 0);
    return *this;
  }

  ~log_histogram() = default;

  /// Records one duration (negative ones count as zero).
  void record(std::chrono::nanoseconds d) noexcept { record(d, 1); }

  /// Records `n` equal durations at once.
  void record(std::chrono::nanoseconds d, std::uint64_t n) noexcept {
    if (n == 0) return;
    const std::uint64_t v = d.count() < 0 ? 0 : static_cast<std::uint64_t>(d.count());
    count_ += n;
    sum_ += v * n;
    if (v > max_) max_ = v;
    if (v < min_) min_ = v;
    const std::size_t i = index_of(v);
    if (i == bucket_count - 1) {
      overflow_ += n;
      return;
    }
    const std::size_t b = i / sub_buckets;
    std::size_t at = at_[b];
    if (at == 0 && (at = insert_block(b)) == 0) {
      lost_ += n;
      return;
    }
    blocks_[at - 1][i % sub_buckets] += n;
  }

  /// Durations recorded (bucketed or lost).
  std::uint64_t count() const noexcept { return count_; }

  /// Recorded durations that are in no bucket because their block could not be allocated (zero unless
  /// operator new failed).
  std::uint64_t lost() const noexcept { return lost_; }

  /// Their sum (exact until 2^64 ns).
  std::chrono::nanoseconds sum() const noexcept { return as_ns(sum_); }

  /// The smallest recorded (zero when empty).
  std::chrono::nanoseconds min() const noexcept { return count_ == 0 ? std::chrono::nanoseconds{0} : as_ns(min_); }

  /// The largest recorded (zero when empty).
  std::chrono::nanoseconds max() const noexcept { return as_ns(max_); }

  /// sum() / count(), rounded down (zero when empty).
  std::chrono::nanoseconds mean() const noexcept { return count_ == 0 ? std::chrono::nanoseconds{0} : as_ns(sum_ / count_); }

  /// The value at percentile `p` in [0, 100] (clamped), by the nearest-rank rule above over the bucketed
  /// values; zero when empty (max() when every value was lost).
  std::chrono::nanoseconds percentile(double p) const noexcept {
    if (count_ == 0) return std::chrono::nanoseconds{0};
    const std::uint64_t bucketed = count_ - lost_;
    if (bucketed == 0) return max();
    if (!(p > 0.0)) p = 0.0;  // NaN included
    if (p >= 100.0) return max();
    const double exact = std::ceil(p / 100.0 * static_cast<double>(bucketed));
    const std::uint64_t rank = exact < 1.0 ? 1 : static_cast<std::uint64_t>(exact);
    std::uint64_t seen = 0;
    std::size_t at = 0;
    for (std::uint64_t m = mask_; m != 0; m &= m - 1, ++at) {
      const auto b = static_cast<std::size_t>(std::countr_zero(m));
      for (std::size_t s = 0; s < sub_buckets; ++s) {
        seen += blocks_[at][s];
        if (seen < rank) continue;
        const std::size_t i = b * sub_buckets + s;
        if (i == 0) return min();  // [0, 16 ns): reads as the smallest value (zero waits read as zero)
        const std::uint64_t mid = lower_bound_ns(i) + (upper_bound_ns(i) - lower_bound_ns(i)) / 2;
        return as_ns(std::clamp(mid, min_, max_));
      }
    }
    return max();  // the overflow bucket
  }

  /// percentile(50): the median.
  std::chrono::nanoseconds p50() const noexcept { return percentile(50.0); }
  /// percentile(90).
  std::chrono::nanoseconds p90() const noexcept { return percentile(90.0); }
  /// percentile(99).
  std::chrono::nanoseconds p99() const noexcept { return percentile(99.0); }

  /// How many recorded values are below `bound`: exact when `bound` is a bucket boundary (every multiple of
  /// 16 ns up to 1,024 ns, every power of two from 1,024 ns to 2^42 ns: the `le` bounds rein's Prometheus
  /// export uses) or above max(); otherwise the count below the boundary of the bucket holding `bound`.
  /// (Lost values are counted only above max().)
  std::uint64_t count_below(std::chrono::nanoseconds bound) const noexcept {
    if (bound.count() <= 0) return 0;
    const auto v = static_cast<std::uint64_t>(bound.count());
    if (count_ != 0 && v > max_) return count_;
    const std::size_t end = index_of(v);
    std::uint64_t below = 0;
    std::size_t at = 0;
    for (std::uint64_t m = mask_; m != 0; m &= m - 1, ++at) {
      const std::size_t first = static_cast<std::size_t>(std::countr_zero(m)) * sub_buckets;
      if (first >= end) break;
      const std::size_t n = std::min(sub_buckets, end - first);
      for (std::size_t s = 0; s < n; ++s) below += blocks_[at][s];
    }
    return below;
  }

  /// The count in bucket `i` (< bucket_count).
  std::uint64_t bucket(std::size_t i) const noexcept {
    if (i == bucket_count - 1) return overflow_;
    const std::size_t at = at_[i / sub_buckets];
    return at == 0 ? 0 : blocks_[at - 1][i % sub_buckets];
  }

  /// Heap bytes held for counters: block_bytes for each block in use (the array's own malloc overhead
  /// aside).
  std::size_t allocated_bytes() const noexcept { return blocks_in_use(mask_) * block_bytes; }

  /// The bucket a duration of `ns` nanoseconds falls in.
  static constexpr std::size_t index_of(std::uint64_t ns) noexcept {
    const std::uint64_t u = ns >> unit_bits;
    if (u < 2 * sub_buckets) return static_cast<std::size_t>(u);
    const unsigned msb = 63U - static_cast<unsigned>(std::countl_zero(u));
    const unsigned group = msb - sub_bucket_bits;
    const std::size_t i = group * sub_buckets + static_cast<std::size_t>(u >> group);
    return std::min(i, bucket_count - 1);
  }

  /// The smallest duration in nanoseconds bucket `i` holds.
  static constexpr std::uint64_t lower_bound_ns(std::size_t i) noexcept {
    if (i < 2 * sub_buckets) return std::uint64_t{i} << unit_bits;
    const std::size_t group = i / sub_buckets - 1;
    const std::uint64_t sub = i % sub_buckets + sub_buckets;
    return (sub << group) << unit_bits;
  }

  /// One past the largest duration in nanoseconds bucket `i` holds (2^64 - 1 for the overflow bucket).
  static constexpr std::uint64_t upper_bound_ns(std::size_t i) noexcept {
    if (i == bucket_count - 1) return std::numeric_limits<std::uint64_t>::max();
    if (i < 2 * sub_buckets) return std::uint64_t{i + 1} << unit_bits;
    const std::size_t group = i / sub_buckets - 1;
    return lower_bound_ns(i) + (std::uint64_t{1} << (group + unit_bits));
  }

  /// Adds every count of `other` (the histogram of the union of both recordings). Allocates once when
  /// `other` has blocks this one lacks; if that fails, other's bucketed values are counted as lost here.
  log_histogram& operator+=(const log_histogram& other) noexcept {
    const std::uint64_t both = mask_ | other.mask_;
    if (both != mask_) {
      std::unique_ptr<block[]> merged(new (std::nothrow) block[blocks_in_use(both)]);
      if (merged) {
        std::size_t from = 0, to = 0;
        for (std::uint64_t m = both; m != 0; m &= m - 1, ++to) {
          const std::uint64_t bit = m & (~m + 1);
          if ((mask_ & bit) != 0) merged[to] = blocks_[from++];
          else merged[to] = block{};
        }
        blocks_ = std::move(merged);
        mask_ = both;
        number_blocks();
      }
    }
    if (both == mask_) {
      std::size_t at = 0, from = 0;
      for (std::uint64_t m = mask_; m != 0; m &= m - 1, ++at) {
        const std::uint64_t bit = m & (~m + 1);
        if ((other.mask_ & bit) == 0) continue;
        for (std::size_t s = 0; s < sub_buckets; ++s) blocks_[at][s] += other.blocks_[from][s];
        ++from;
      }
    } else {
      lost_ += other.count_ - other.lost_ - other.overflow_;
    }
    count_ += other.count_;
    sum_ += other.sum_;
    max_ = std::max(max_, other.max_);
    min_ = std::min(min_, other.min_);
    overflow_ += other.overflow_;
    lost_ += other.lost_;
    return *this;
  }

  /// The merge of two histograms (as `a += b`).
  friend log_histogram operator+(log_histogram a, const log_histogram& b) noexcept {
    a += b;
    return a;  // moved out, not copied (`return a += b` would copy the lvalue it returns)
  }

  /// Forgets everything recorded, and frees the blocks.
  void reset() noexcept { *this = log_histogram{}; }

  /// Equal when every bucket and every summary (count, sum, min, max, lost) is equal (however the blocks
  /// are held: a block of zeros equals a missing one).
  friend bool operator==(const log_histogram& a, const log_histogram& b) noexcept {
    if (a.count_ != b.count_ || a.sum_ != b.sum_ || a.max_ != b.max_ || a.min_ != b.min_ || a.lost_ != b.lost_)
      return false;
    for (std::size_t i = 0; i < bucket_count; ++i)
      if (a.bucket(i) != b.bucket(i)) return false;
    return true;
  }

 private:
  using block = std::array<std::uint64_t, sub_buckets>;

  static std::size_t blocks_in_use(std::uint64_t mask) noexcept { return static_cast<std::size_t>(std::popcount(mask)); }

  static std::chrono::nanoseconds as_ns(std::uint64_t v) noexcept {
    constexpr auto most = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    return std::chrono::nanoseconds(static_cast<std::int64_t>(std::min(v, most)));
  }

  // Grows the array by a zeroed block `b`; returns at_[b], or 0 when out of memory (nothing changed).
  std::size_t insert_block(std::size_t b) noexcept {
    const std::size_t n = blocks_in_use(mask_);
    const std::uint64_t bit = std::uint64_t{1} << b;
    const std::size_t at = blocks_in_use(mask_ & (bit - 1));
    std::unique_ptr<block[]> grown(new (std::nothrow) block[n + 1]);
    if (!grown) return 0;
    std::copy(blocks_.get(), blocks_.get() + at, grown.get());
    grown[at] = block{};
    std::copy(blocks_.get() + at, blocks_.get() + n, grown.get() + at + 1);
    blocks_ = std::move(grown);
    mask_ |= bit;
    number_blocks();
    return at_[b];
  }

  // at_ from mask_.
  void number_blocks() noexcept {
    at_.fill(0);
    std::uint8_t k = 0;
    for (std::uint64_t m = mask_; m != 0; m &= m - 1) at_[static_cast<std::size_t>(std::countr_zero(m))] = ++k;
  }

  // Invariant: blocks_ holds popcount(mask_) blocks, block b (buckets [32b, 32b + 32)) at position
  // popcount(mask_ & ((1 << b) - 1)), which at_[b] holds plus one (0: absent; a table, so that recording
  // needs no population count, a library call without -mpopcnt); a block not in mask_ is all zeros;
  // count_ = sum of every bucket + overflow_ + lost_.
  std::unique_ptr<block[]> blocks_;
  std::uint64_t mask_ = 0;
  std::array<std::uint8_t, block_count> at_{};
  std::uint64_t count_ = 0;
  std::uint64_t sum_ = 0;
  std::uint64_t max_ = 0;
  std::uint64_t min_ = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t overflow_ = 0;
  std::uint64_t lost_ = 0;
};

}  // namespace rein::algo
