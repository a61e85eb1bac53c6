// The partitions of one line (rein/partition.hpp): their guarantees and what each holds and waits for.
// Not API; the line (limiter_core.hpp) keeps one and updates it under its lock.
#pragma once

#include <rein/detail/invalid_option.hpp>
#include <rein/partition.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rein::detail {

class partition_table {
 public:
  /// Index 0 is the unnamed rest; options' partition i is index i + 1.
  static constexpr std::size_t max_partitions = 254;

  partition_table() = default;

  /// The table of `spec`, checked: throws std::invalid_argument naming `who`, the field and the value.
  /// An empty spec makes an empty table (no partitions: the line pays nothing for them).
  static partition_table make(named who, const std::vector<partition>& spec) {
    partition_table t;
    if (spec.empty()) return t;
    const std::string type = describe(who.type, who.name);
    if (spec.size() > max_partitions)
      throw_invalid(type, "partitions holds at most " + show(max_partitions) + " partitions", show(spec.size()));
    double sum = 0.0;
    t.parts_.reserve(spec.size() + 1);
    t.parts_.push_back(state{});
    for (std::size_t i = 0; i < spec.size(); ++i) {
      const partition& p = spec[i];
      const std::string field = "partitions[" + show(i) + "]";
      if (p.name.empty()) throw_invalid(type, field + ".name must not be empty", "\"\"");
      for (std::size_t j = 0; j < i; ++j)
        if (spec[j].name == p.name)
          throw_invalid(type, field + ".name must differ from partitions[" + show(j) + "].name", '"' + p.name + '"');
      if (!(p.share > 0.0 && p.share <= 1.0)) throw_invalid(type, field + ".share must be in (0, 1]", show(p.share));
      sum += p.share;
      t.parts_.push_back(state{p.name, p.share});
    }
    if (sum > 1.0 + tolerance) throw_invalid(type, "the shares of partitions must sum to <= 1", show(sum));
    t.parts_[0].share = sum >= 1.0 ? 0.0 : 1.0 - sum;
    return t;
  }

  bool empty() const noexcept { return parts_.empty(); }
  /// Partitions, the rest included (0 without partitions).
  std::size_t size() const noexcept { return parts_.size(); }

  /// The index of the partition called `name`, or nullopt.
  std::optional<std::uint8_t> find(std::string_view name) const noexcept {
    for (std::size_t i = 1; i < parts_.size(); ++i)
      if (parts_[i].name == name) return static_cast<std::uint8_t>(i);
    return std::nullopt;
  }

  /// floor(share x limit), a product within `tolerance` of an integer counting as that integer.
  std::size_t guaranteed(std::uint8_t p, std::size_t limit) const noexcept {
    const double units = std::floor(parts_[p].share * static_cast<double>(limit) + tolerance);
    return units >= static_cast<double>(limit) ? limit : static_cast<std::size_t>(units);
  }

  /// Below its guarantee and waiting: the next permit that comes free is its.
  bool starved(std::uint8_t p, std::size_t limit) const noexcept {
    return parts_[p].waiting != 0 && parts_[p].in_flight < guaranteed(p, limit);
  }

  /// How many partitions are starved.
  std::size_t starved_count(std::size_t limit) const noexcept {
    std::size_t count = 0;
    for (std::size_t i = 0; i < parts_.size(); ++i) count += starved(static_cast<std::uint8_t>(i), limit) ? 1 : 0;
    return count;
  }

  void granted(std::uint8_t p, std::size_t n) noexcept {
    parts_[p].in_flight += n;
    ++parts_[p].acquired_total;
  }
  /// A grant taken back before its handler ran: as if it had never been made.
  void revoked(std::uint8_t p, std::size_t n) noexcept {
    parts_[p].in_flight -= n;
    --parts_[p].acquired_total;
  }
  void released(std::uint8_t p, std::size_t n) noexcept { parts_[p].in_flight -= n; }
  void queued(std::uint8_t p) noexcept { ++parts_[p].waiting; }
  void dequeued(std::uint8_t p) noexcept { --parts_[p].waiting; }

  std::vector<partition_snapshot> snapshot(std::size_t limit) const {
    std::vector<partition_snapshot> out;
    out.reserve(parts_.size());
    for (std::size_t i = 0; i < parts_.size(); ++i) {
      const state& s = parts_[i];
      out.push_back({s.name, s.share, guaranteed(static_cast<std::uint8_t>(i), limit), s.in_flight, s.waiting,
                     s.acquired_total});
    }
    return out;
  }

 private:
  static constexpr double tolerance = 1e-9;

  struct state {
    std::string name{};
    double share = 0.0;
    std::size_t in_flight = 0;
    std::size_t waiting = 0;
    std::uint64_t acquired_total = 0;
  };

  std::vector<state> parts_;
};

}  // namespace rein::detail
