// The leases of a semaphore's permits (rein::basic_semaphore::with_lease): which leases are live, when
// each ends, and how many permit objects still refer to each. Not API.
//
// A lease is an id (never 0, never reused) carried in its permits' note word. It stays in the table while a
// permit object of it is out, live or expired, so that a permit given back late still finds it and gives
// nothing: the units of a lease go back exactly once, either piece by piece as its permits come back in
// time, or all that is left at its expiry. Whichever comes first under the line's lock wins.
//
// Nothing allocates under the lock: a leased acquire reserves the two nodes of its lease before it starts
// (reserve(), which may throw), and start() only links them (std::map and std::set node handles).
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace rein::detail {

class lease_table {
 public:
  /// One lease: its units not given back yet, its permit objects out, its end, its partition.
  struct entry {
    std::size_t units = 0;
    std::size_t holders = 0;
    std::int64_t expiry_ns = 0;
    std::uint8_t partition = 0;
    bool expired = false;
  };
  using entries = std::map<std::uint64_t, entry>;
  using order = std::set<std::pair<std::int64_t, std::uint64_t>>;  // (expiry, id) of the live leases

  /// The nodes of one lease, allocated before the lock is taken.
  struct reserved {
    entries::node_type entry;
    order::node_type expiry;
  };

  /// What a permit of a lease finds when it comes back: the units to give back (0 when the lease has
  /// expired: the permit is inert) and the lease's partition.
  struct returned {
    std::size_t units = 0;
    std::uint8_t partition = 0;
    bool inert = false;
  };

  /// What an expiry takes back.
  struct expired {
    std::size_t units = 0;
    std::size_t holders = 0;
    std::uint8_t partition = 0;
  };

  /// Allocates the nodes of one lease. Throws std::bad_alloc.
  static reserved reserve() {
    entries e;
    order o;
    e.emplace(0, entry{});
    o.emplace(0, 0);
    return {e.extract(e.begin()), o.extract(o.begin())};
  }

  /// Starts a lease of `units` held by one permit in `partition`, ending at `expiry_ns` (INT64_MAX: never),
  /// with the nodes `r` (consumed). Returns its id. Never allocates.
  std::uint64_t start(reserved& r, std::size_t units, std::uint8_t partition, std::int64_t expiry_ns) noexcept {
    assert(!r.entry.empty() && !r.expiry.empty());
    const std::uint64_t id = ++last_id_;
    r.entry.key() = id;
    r.entry.mapped() = entry{units, 1, expiry_ns, partition, false};
    entries_.insert(std::move(r.entry));
    if (expiry_ns != std::numeric_limits<std::int64_t>::max()) {
      r.expiry.value() = {expiry_ns, id};
      order_.insert(std::move(r.expiry));
    }
    return id;
  }

  /// The end of the earliest live lease (INT64_MAX: none).
  std::int64_t next_expiry() const noexcept {
    return order_.empty() ? std::numeric_limits<std::int64_t>::max() : order_.begin()->first;
  }

  /// Whether a live lease ends at or before `now_ns`.
  bool due(std::int64_t now_ns) const noexcept { return !order_.empty() && order_.begin()->first <= now_ns; }

  /// Ends the earliest live lease (due(now) must hold): its units not given back go to the caller, its
  /// permits become inert.
  expired expire_first() noexcept {
    assert(!order_.empty());
    const std::uint64_t id = order_.begin()->second;
    order_.erase(order_.begin());
    entry& e = entries_.find(id)->second;
    e.expired = true;
    const expired out{std::exchange(e.units, 0), e.holders, e.partition};
    inert_ += e.holders;
    return out;
  }

  /// A permit of lease `id` gives back `n` units: they count if the lease is live (and when it was its
  /// last permit, the lease ends without expiring), not if it expired.
  returned give_back(std::uint64_t id, std::size_t n) noexcept {
    const auto it = entries_.find(id);
    assert(it != entries_.end() && it->second.holders != 0);
    entry& e = it->second;
    returned out{0, e.partition, e.expired};
    if (e.expired) {
      --inert_;
    } else {
      assert(n <= e.units);
      out.units = n;
      e.units -= n;
    }
    if (--e.holders == 0) {
      if (!e.expired && e.expiry_ns != std::numeric_limits<std::int64_t>::max()) order_.erase({e.expiry_ns, id});
      entries_.erase(it);
    }
    return out;
  }

  /// A permit of lease `id` was split in two: one more permit object refers to it.
  void split(std::uint64_t id) noexcept {
    entry& e = entries_.find(id)->second;
    ++e.holders;
    if (e.expired) ++inert_;
  }

  /// Permit objects of expired leases still out.
  std::size_t inert() const noexcept { return inert_; }

 private:
  entries entries_;
  order order_;
  std::uint64_t last_id_ = 0;
  std::size_t inert_ = 0;
};

}  // namespace rein::detail
