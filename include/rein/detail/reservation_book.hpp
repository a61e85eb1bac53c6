// The reservations of a rate limiter that have not acted yet (rein::basic_reservation): what a cancelled one
// hands to its limit's `cancel_reservation`, which gives back by the limit's own rule. Not API.
//
// A reservation counts its n units at once and acts later; others reserved after it are timed behind it,
// so a refund of all n could let a newcomer act in the place of units they count on. Each limit states what
// it may give back (algo::reservable_rate_limit); this book only keeps the standing reservations, sorted by
// time to act, forgets those whose time passed, makes sure a reservation is cancelled once, and counts.
#pragma once

#include <rein/algo/rate_limit.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace rein::detail {

template <class TimePoint>
class reservation_book {
 public:
  /// Makes room for one more entry, so that add() after a reservation was taken cannot fail.
  void make_room() {
    live_.reserve(live_.size() + 1);
    ids_.reserve(ids_.size() + 1);
  }

  /// Records a reservation of n units acting at `at`, forgetting those that acted before `now`; returns its
  /// id. Call make_room() first.
  std::uint64_t add(std::int64_t n, TimePoint at, TimePoint now) noexcept {
    forget_spent(now);
    const auto place = std::upper_bound(live_.begin(), live_.end(), at,
                                        [](TimePoint t, const standing& e) { return t < e.at; });
    const auto i = place - live_.begin();
    live_.insert(place, standing{n, at});  // within the capacity make_room() reserved: no throw
    ids_.insert(ids_.begin() + i, ++last_id_);
    ++counts_.reserved;
    return last_id_;
  }

  /// Removes reservation `id` and gives back into `limit` at `now` what its rule allows while the others
  /// stand (`limit.cancel_reservation`); returns the units given back: 0 if it acted before `now` or was
  /// already removed.
  template <class Limit>
  std::int64_t give_back(std::uint64_t id, Limit& limit, TimePoint now) {
    forget_spent(now);
    const auto mine = std::find(ids_.begin(), ids_.end(), id);
    if (mine == ids_.end()) return 0;
    const auto i = mine - ids_.begin();
    const standing cancelled = live_[static_cast<std::size_t>(i)];
    live_.erase(live_.begin() + i);
    ids_.erase(mine);
    const std::int64_t back = limit.cancel_reservation(cancelled.n, cancelled.at, std::span<const standing>(live_), now);
    ++counts_.cancelled;
    counts_.returned += static_cast<std::uint64_t>(back);
    return back;
  }

  /// Removes reservation `id` giving nothing back: its units are spent (an admission's, which may refund
  /// them as any take's, under the rule for the others still standing).
  void spend(std::uint64_t id, TimePoint now) noexcept {
    forget_spent(now);
    const auto mine = std::find(ids_.begin(), ids_.end(), id);
    if (mine == ids_.end()) return;
    live_.erase(live_.begin() + (mine - ids_.begin()));
    ids_.erase(mine);
  }

  /// Gives n units back into `limit` at `now` (a refund, not a cancel) without freeing any standing
  /// reservation's units (the limit's `refund(n, standing, now)`); returns the units given back.
  template <class Limit>
  std::int64_t refund(Limit& limit, std::int64_t n, TimePoint now) {
    forget_spent(now);
    return limit.refund(n, std::span<const standing>(live_), now);
  }

  /// Reservations recorded, those cancelled before their time, and the units those gave back.
  struct counts {
    std::uint64_t reserved = 0;
    std::uint64_t cancelled = 0;
    std::uint64_t returned = 0;
  };
  const counts& totals() const noexcept { return counts_; }

 private:
  using standing = algo::standing_reservation<TimePoint>;

  void forget_spent(TimePoint now) noexcept {
    const auto spent =
        std::lower_bound(live_.begin(), live_.end(), now, [](const standing& e, TimePoint t) { return e.at < t; });
    ids_.erase(ids_.begin(), ids_.begin() + (spent - live_.begin()));
    live_.erase(live_.begin(), spent);
  }

  std::vector<standing> live_;     // sorted by `at`
  std::vector<std::uint64_t> ids_;  // live_[i]'s id
  std::uint64_t last_id_ = 0;
  counts counts_;
};

}  // namespace rein::detail
