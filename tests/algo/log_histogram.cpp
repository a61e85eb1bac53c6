// rein::algo::log_histogram: layout, exact counts, nearest-rank percentiles and their error bound, merging.
#include <rein/algo/log_histogram.hpp>
#include <rein/detail/format.hpp>

#include "support/catch.hpp"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <ios>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using rein::algo::log_histogram;

TEST_CASE("log_histogram: the finest buckets are 16 ns wide below 1024 ns", "[log_histogram]") {
  CHECK(log_histogram::index_of(0) == 0);
  CHECK(log_histogram::index_of(15) == 0);
  CHECK(log_histogram::index_of(16) == 1);
  CHECK(log_histogram::index_of(1023) == 63);
  CHECK(log_histogram::lower_bound_ns(63) == 1008);
  CHECK(log_histogram::upper_bound_ns(63) == 1024);
}

TEST_CASE("log_histogram: each octave from 1024 ns has 32 buckets of 1/32 of its start", "[log_histogram]") {
  CHECK(log_histogram::index_of(1024) == 64);
  CHECK(log_histogram::index_of(1055) == 64);
  CHECK(log_histogram::index_of(1056) == 65);
  CHECK(log_histogram::index_of(2047) == 95);
  CHECK(log_histogram::index_of(2048) == 96);
  CHECK(log_histogram::lower_bound_ns(96) == 2048);
  CHECK(log_histogram::upper_bound_ns(96) == 2112);
  // 1 ms = 1,000,000 ns: octave [2^19, 2^20), buckets of 2^14 ns.
  const std::size_t i = log_histogram::index_of(1'000'000);
  CHECK(log_histogram::lower_bound_ns(i) == 999'424);
  CHECK(log_histogram::upper_bound_ns(i) == 1'015'808);
  // Every bucket is contiguous with the next, and no wider than 1/32 of its start from 512 ns on.
  for (std::size_t b = 0; b + 2 < log_histogram::bucket_count; ++b) {
    REQUIRE(log_histogram::upper_bound_ns(b) == log_histogram::lower_bound_ns(b + 1));
    REQUIRE(log_histogram::index_of(log_histogram::lower_bound_ns(b)) == b);
    REQUIRE(log_histogram::index_of(log_histogram::upper_bound_ns(b) - 1) == b);
    if (log_histogram::lower_bound_ns(b) >= 512)
      REQUIRE((log_histogram::upper_bound_ns(b) - log_histogram::lower_bound_ns(b)) * 32 <=
              log_histogram::lower_bound_ns(b));
  }
}

TEST_CASE("log_histogram: 2^42 ns and above go to the overflow bucket", "[log_histogram]") {
  CHECK(log_histogram::bucket_count == 1089);
  CHECK(sizeof(log_histogram) <= 1089 * 8 + 4 * 8);
  CHECK(log_histogram::index_of((std::uint64_t{1} << 42) - 1) == 1087);
  CHECK(log_histogram::index_of(std::uint64_t{1} << 42) == 1088);
  CHECK(log_histogram::index_of(~std::uint64_t{0}) == 1088);
  log_histogram h;
  h.record(2h);
  CHECK(h.bucket(1088) == 1);
  CHECK(h.p50() == 2h);  // the overflow bucket reads as max()
}

TEST_CASE("log_histogram: count, sum, min, max and mean are exact", "[log_histogram]") {
  log_histogram h;
  CHECK(h.count() == 0);
  CHECK(h.p99() == 0ns);
  CHECK(h.min() == 0ns);
  h.record(3ms);
  h.record(1ms);
  h.record(-5ns);  // counts as zero
  h.record(10us, 2);
  CHECK(h.count() == 5);
  CHECK(h.sum() == 4'020'000ns);
  CHECK(h.min() == 0ns);
  CHECK(h.max() == 3ms);
  CHECK(h.mean() == 804'000ns);
  CHECK(h.bucket(0) == 1);
  CHECK(h.bucket(log_histogram::index_of(10'000)) == 2);
}

TEST_CASE("log_histogram: percentiles follow the nearest rank and read bucket midpoints", "[log_histogram]") {
  log_histogram h;
  for (int i = 1; i <= 100; ++i) h.record(std::chrono::milliseconds(i));
  // Rank 50 is 50 ms = 50,000,000 ns: octave [2^25, 2^26), buckets of 2^20 ns; 50,000,000 lies in
  // [49,283,072, 50,331,648), midpoint 49,807,360.
  CHECK(h.p50() == 49'807'360ns);
  // Rank 90 is 90 ms: octave [2^26, 2^27), buckets of 2^21 ns: [88,080,384, 90,177,536), midpoint 89,128,960.
  CHECK(h.p90() == 89'128'960ns);
  // Rank 99 is 99 ms: [98,566,144, 100,663,296), midpoint 99,614,720.
  CHECK(h.p99() == 99'614'720ns);
  CHECK(h.percentile(100) == 100ms);
  // Rank 1 (p = 0 and p = 0.5 alike) is 1 ms: bucket [999,424, 1,015,808), midpoint 1,007,616.
  CHECK(h.percentile(0) == 1'007'616ns);
  CHECK(h.percentile(0.5) == 1'007'616ns);
}

TEST_CASE("log_histogram: a percentile is clamped to the recorded range", "[log_histogram]") {
  log_histogram h;
  h.record(1'000'000ns);  // bucket [999,424, 1,015,808), midpoint 1,007,616
  CHECK(h.p50() == 1'000'000ns);  // clamped to max = min = the one value
  h.record(1'010'000ns);
  CHECK(h.p50() == 1'007'616ns);
  CHECK(h.p99() == 1'007'616ns);
  CHECK(h.percentile(100) == 1'010'000ns);
}

TEST_CASE("log_histogram: every percentile is within 1/64 of the value at its rank", "[log_histogram]") {
  // Values spread over 1 us .. 1 h by a fixed multiplicative step: each one is the value at its own rank.
  log_histogram h;
  std::vector<std::uint64_t> values;
  for (double v = 1000.0; v < 3.6e12; v *= 1.37) values.push_back(static_cast<std::uint64_t>(v));
  for (std::uint64_t v : values) h.record(std::chrono::nanoseconds(static_cast<std::int64_t>(v)));
  const auto n = static_cast<double>(values.size());
  for (std::size_t rank = 1; rank <= values.size(); ++rank) {
    const double p = (static_cast<double>(rank) - 0.5) / n * 100.0;  // ceil(p/100 * n) == rank
    const double read = static_cast<double>(h.percentile(p).count());
    const double truth = static_cast<double>(values[rank - 1]);
    REQUIRE(std::abs(read - truth) <= truth * log_histogram::relative_error);
  }
}

TEST_CASE("log_histogram: count_below is exact at octave bounds", "[log_histogram]") {
  log_histogram h;
  h.record(1023ns);
  h.record(1024ns);
  h.record(4095ns);
  h.record(4096ns);
  CHECK(h.count_below(1024ns) == 1);
  CHECK(h.count_below(2048ns) == 2);
  CHECK(h.count_below(4096ns) == 3);
  CHECK(h.count_below(8192ns) == 4);
  CHECK(h.count_below(0ns) == 0);
  CHECK(h.count_below(1h) == 4);
}

TEST_CASE("log_histogram: merging equals recording everything in one", "[log_histogram]") {
  log_histogram a, b, all;
  for (int i = 0; i < 50; ++i) {
    a.record(std::chrono::microseconds(i * 7));
    all.record(std::chrono::microseconds(i * 7));
    b.record(std::chrono::milliseconds(i * 3 + 1));
    all.record(std::chrono::milliseconds(i * 3 + 1));
  }
  CHECK(a + b == all);
  a += b;
  CHECK(a == all);
  CHECK(a.count() == 100);
  CHECK(a.min() == 0ns);
  CHECK(a.max() == 148ms);
  a.reset();
  CHECK(a == log_histogram{});
}

TEST_CASE("log_histogram: an empty histogram holds no heap memory and reads zero", "[log_histogram]") {
  const log_histogram h;
  if constexpr (sizeof(void*) == 8) CHECK(sizeof(log_histogram) == 104);  // on a 64-bit target
  CHECK(h.allocated_bytes() == 0);
  CHECK(h.count() == 0);
  CHECK(h.lost() == 0);
  CHECK(h.p99() == 0ns);
  CHECK(h.count_below(1h) == 0);
  for (std::size_t i = 0; i < log_histogram::bucket_count; ++i) REQUIRE(h.bucket(i) == 0);
  const log_histogram copy = h;
  CHECK(copy.allocated_bytes() == 0);
  CHECK(copy == h);
}

TEST_CASE("log_histogram: a block of 32 counters is allocated per octave on first use", "[log_histogram]") {
  log_histogram h;
  h.record(0ns);  // block 0: [0, 512 ns)
  CHECK(h.allocated_bytes() == 256);
  h.record(511ns);
  CHECK(h.allocated_bytes() == 256);
  h.record(1s);  // 2^29 <= 1e9 < 2^30 ns: one more block
  CHECK(h.allocated_bytes() == 512);
  h.record(600ns);  // block 1, [512, 1024): inserted between the two
  CHECK(h.allocated_bytes() == 768);
  h.record(2h);  // the overflow bucket is inline
  CHECK(h.allocated_bytes() == 768);
  CHECK(h.bucket(0) == 1);
  CHECK(h.bucket(log_histogram::index_of(511)) == 1);
  CHECK(h.bucket(log_histogram::index_of(600)) == 1);
  CHECK(h.bucket(log_histogram::index_of(1'000'000'000)) == 1);
  CHECK(h.bucket(log_histogram::bucket_count - 1) == 1);
  CHECK(h.count() == 5);
  CHECK(h.lost() == 0);
  CHECK(h.p50() == 600ns);  // rank 3: [592, 608) reads 600
  CHECK(h.percentile(20) == 0ns);
  CHECK(h.percentile(80) == 998'244'352ns);  // rank 4, 1 s: [989,855,744, 1,006,632,960) reads its midpoint
}

TEST_CASE("log_histogram: values across every block, one each, are exact", "[log_histogram]") {
  log_histogram h;
  std::vector<std::uint64_t> values;
  for (std::size_t b = 0; b < log_histogram::block_count; ++b)
    values.push_back(log_histogram::lower_bound_ns(b * log_histogram::sub_buckets));
  for (auto it = values.rbegin(); it != values.rend(); ++it) h.record(std::chrono::nanoseconds(*it));  // descending
  CHECK(h.allocated_bytes() == log_histogram::block_count * 256);
  CHECK(h.allocated_bytes() == 8704);
  for (std::size_t b = 0; b < log_histogram::block_count; ++b) {
    CHECK(h.bucket(b * log_histogram::sub_buckets) == 1);
    CHECK(h.bucket(b * log_histogram::sub_buckets + 1) == 0);
  }
  CHECK(h.count_below(std::chrono::nanoseconds(std::int64_t{1} << 20)) == 12);  // 0, 512, then 2^10 .. 2^19
  CHECK(h.min() == 0ns);
  CHECK(h.max() == std::chrono::nanoseconds(std::int64_t{1} << 41));
  h.record(std::chrono::nanoseconds(std::numeric_limits<std::int64_t>::max()));
  CHECK(h.bucket(log_histogram::bucket_count - 1) == 1);
  CHECK(h.max() == std::chrono::nanoseconds(std::numeric_limits<std::int64_t>::max()));
  CHECK(h.p99() == h.max());
  h.record(-5ns);
  CHECK(h.bucket(0) == 2);
  CHECK(h.allocated_bytes() == 8704);
}

TEST_CASE("log_histogram: copies and moves carry every bucket", "[log_histogram]") {
  log_histogram h;
  h.record(3us, 4);
  h.record(40ms, 2);
  log_histogram copy = h;
  CHECK(copy == h);
  CHECK(copy.allocated_bytes() == 512);
  copy.record(3us);
  CHECK_FALSE(copy == h);
  CHECK(h.bucket(log_histogram::index_of(3000)) == 4);  // the original kept its own blocks
  CHECK(copy.bucket(log_histogram::index_of(3000)) == 5);
  log_histogram moved = std::move(copy);
  CHECK(moved.count() == 7);
  CHECK(moved.allocated_bytes() == 512);
  CHECK(copy.count() == 0);  // NOLINT: a moved-from histogram is empty
  CHECK(copy.allocated_bytes() == 0);
  copy = moved;
  CHECK(copy == moved);
  moved = log_histogram{};
  CHECK(moved.allocated_bytes() == 0);
  h.reset();
  CHECK(h.allocated_bytes() == 0);
  CHECK(h == log_histogram{});
}

TEST_CASE("log_histogram: merging adds blocks the other has, and equal buckets compare equal", "[log_histogram]") {
  log_histogram a, b;
  a.record(100ns);
  b.record(1ms, 3);
  b.record(100ns);
  const log_histogram empty;
  a += empty;
  CHECK(a.allocated_bytes() == 256);
  a += b;
  CHECK(a.allocated_bytes() == 512);
  CHECK(a.count() == 5);
  CHECK(a.bucket(log_histogram::index_of(100)) == 2);
  CHECK(a.bucket(log_histogram::index_of(1'000'000)) == 3);
  CHECK(a.p50() == 1'000'000ns);  // [999,424, 1,015,808): midpoint 1,007,616, clamped to max 1 ms
  a += a;
  CHECK(a.count() == 10);
  CHECK(a.bucket(log_histogram::index_of(100)) == 4);
  log_histogram zero_block;  // a block of zeros equals no block
  zero_block.record(1ms);
  log_histogram same;
  same.record(1ms);
  same.record(5ns);
  zero_block.record(5ns);
  CHECK(same == zero_block);
}

TEST_CASE("snapshot lines write durations with three significant digits, whatever the stream's flags",
          "[log_histogram][format]") {
  // The stream's own flags (hex, showpos) must not reach the numbers: each is written by std::to_chars.
  auto duration = [](std::chrono::nanoseconds d) {
    std::ostringstream os;
    os << std::hex << std::showpos;
    rein::detail::write_duration(os, d);
    return os.str();
  };
  CHECK(duration(0ns) == "0");
  CHECK(duration(850ns) == "850ns");
  CHECK(duration(-850ns) == "-850ns");
  CHECK(duration(12'345ns) == "12.3us");
  CHECK(duration(4'556'000ns) == "4.56ms");
  CHECK(duration(1'234'000'000ns) == "1.23s");
  CHECK(duration(754s) == "754s");
  auto number = [](double v, int decimals) {
    std::ostringstream os;
    os << std::hex << std::showpos;
    rein::detail::write_number(os, v, decimals);
    return os.str();
  };
  CHECK(number(0.75, 2) == "0.75");
  CHECK(number(100.0, 2) == "100");
  CHECK(number(2.5, 2) == "2.5");
  CHECK(number(1.0 / 3.0, 4) == "0.3333");
  CHECK(number(0.0, 2) == "0");
  CHECK(number(0.996, 2) == "1");
}
