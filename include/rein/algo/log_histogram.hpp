// A fixed log-linear histogram of durations: O(1) record, no allocation, mergeable, percentiles with a
// stated relative error (the layout of HdrHistogram, Gil Tene's High Dynamic Range Histogram).
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace rein::algo {

/// A histogram of durations in fixed log-linear buckets, as HdrHistogram lays them out: each power of two
/// of nanoseconds (an octave) is cut into 32 equal sub-buckets, so a bucket is never wider than 1/32 of the
/// values it holds.
///
/// Layout (values in nanoseconds):
/// - [0, 1024): 64 buckets of 16 ns each;
/// - [2^k, 2^(k+1)) for k = 10 .. 41: 32 buckets of 2^(k-5) ns each;
/// - 2^42 ns (about 73.3 minutes) and above: one overflow bucket (max() stays exact).
/// That is 1,089 buckets of 8 bytes: 8,712 bytes, fixed, whatever is recorded.
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
/// Recording is one count-leading-zeros, a shift and three additions; merging adds bucket by bucket
/// (histograms of several limiters or processes combine exactly, as HdrHistogram's add does).
///
/// @par Thread Safety
/// A plain value: no internal locking (rein's limiters record under their own lock).
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

  /// Records one duration (negative ones count as zero).
  void record(std::chrono::nanoseconds d) noexcept { record(d, 1); }

  /// Records `n` equal durations at once.
  void record(std::chrono::nanoseconds d, std::uint64_t n) noexcept {
    if (n == 0) return;
    const std::uint64_t v = d.count() < 0 ? 0 : static_cast<std::uint64_t>(d.count());
    counts_[index_of(v)] += n;
    count_ += n;
    sum_ += v * n;
    if (v > max_) max_ = v;
    if (v < min_) min_ = v;
  }

  /// Durations recorded.
  std::uint64_t count() const noexcept { return count_; }

  /// Their sum (exact until 2^64 ns).
  std::chrono::nanoseconds sum() const noexcept { return as_ns(sum_); }

  /// The smallest recorded (zero when empty).
  std::chrono::nanoseconds min() const noexcept { return count_ == 0 ? std::chrono::nanoseconds{0} : as_ns(min_); }

  /// The largest recorded (zero when empty).
  std::chrono::nanoseconds max() const noexcept { return as_ns(max_); }

  /// sum() / count(), rounded down (zero when empty).
  std::chrono::nanoseconds mean() const noexcept { return count_ == 0 ? std::chrono::nanoseconds{0} : as_ns(sum_ / count_); }

  /// The value at percentile `p` in [0, 100] (clamped), by the nearest-rank rule above; zero when empty.
  std::chrono::nanoseconds percentile(double p) const noexcept {
    if (count_ == 0) return std::chrono::nanoseconds{0};
    if (!(p > 0.0)) p = 0.0;  // NaN included
    if (p >= 100.0) return max();
    const double exact = std::ceil(p / 100.0 * static_cast<double>(count_));
    const std::uint64_t rank = exact < 1.0 ? 1 : static_cast<std::uint64_t>(exact);
    std::uint64_t seen = 0;
    for (std::size_t i = 0; i < bucket_count; ++i) {
      seen += counts_[i];
      if (seen >= rank) {
        if (i == bucket_count - 1) return max();
        if (i == 0) return min();  // [0, 16 ns): reads as the smallest value (zero waits read as zero)
        const std::uint64_t mid = lower_bound_ns(i) + (upper_bound_ns(i) - lower_bound_ns(i)) / 2;
        return as_ns(std::clamp(mid, min_, max_));
      }
    }
    return max();
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
  std::uint64_t count_below(std::chrono::nanoseconds bound) const noexcept {
    if (bound.count() <= 0) return 0;
    const auto v = static_cast<std::uint64_t>(bound.count());
    if (count_ != 0 && v > max_) return count_;
    const std::size_t end = index_of(v);
    std::uint64_t below = 0;
    for (std::size_t i = 0; i < end; ++i) below += counts_[i];
    return below;
  }

  /// The count in bucket `i` (< bucket_count).
  std::uint64_t bucket(std::size_t i) const noexcept { return counts_[i]; }

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

  /// Adds every count of `other` (the histogram of the union of both recordings).
  log_histogram& operator+=(const log_histogram& other) noexcept {
    for (std::size_t i = 0; i < bucket_count; ++i) counts_[i] += other.counts_[i];
    count_ += other.count_;
    sum_ += other.sum_;
    max_ = std::max(max_, other.max_);
    min_ = std::min(min_, other.min_);
    return *this;
  }

  /// The merge of two histograms (as `a += b`).
  friend log_histogram operator+(log_histogram a, const log_histogram& b) noexcept { return a += b; }

  /// Forgets everything recorded.
  void reset() noexcept { *this = log_histogram{}; }

  /// Equal when every bucket and every summary (count, sum, min, max) is equal.
  friend bool operator==(const log_histogram&, const log_histogram&) = default;

 private:
  static std::chrono::nanoseconds as_ns(std::uint64_t v) noexcept {
    constexpr auto most = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    return std::chrono::nanoseconds(static_cast<std::int64_t>(std::min(v, most)));
  }

  std::array<std::uint64_t, bucket_count> counts_{};
  std::uint64_t count_ = 0;
  std::uint64_t sum_ = 0;
  std::uint64_t max_ = 0;
  std::uint64_t min_ = std::numeric_limits<std::uint64_t>::max();
};

}  // namespace rein::algo
