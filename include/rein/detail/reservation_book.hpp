// The reservations of a token bucket that have not acted yet, and how much a cancelled one gives back
// (rein::basic_token_reservation). Not API.
//
// A reservation takes its n tokens at once, leaving the bucket in debt, and acts at the instant the debt
// that includes it is repaid. Others reserved later are timed behind it: a refund of all n would let a
// newcomer act in the place of tokens they already count on. Go's `Reservation.CancelAt` keeps back the
// tokens "reserved after" this one, counted as time (lastEvent - timeToAct) x the limit at the reservation;
// this counts them as what a token bucket allows instead:
//
// The rule. Let B(t) be the bucket's balance projected at its current refill rate (its debt repaid as time
// passes) and P(t) the tokens of the reservations still standing that act at t or later. While they stand,
// a real bucket holds B(t) + P(t): their tokens are in it until they act. So the refund x is the largest in
// [0, n] with B(t) + x + P(t) <= capacity at now and at every standing reservation's time (between two such
// times B rises and P stays, so those are the worst instants). Then no one can ever act in a standing
// reservation's tokens, at any rate of later calls, and everything that does not stand in their way comes
// back. B(t) is read rounded up to a whole token (the bucket's exact units), so a fraction of a token is
// kept rather than lent. The projection holds at the rate of the moment: a rate changed later moves B for
// everyone, while reservations keep their times (as Go's SetLimit says of its reservations).
//
// Go's refunds were reported wrong (golang/go#56924, "CancelAt returns less than expected tokens"; #69419).
// This differs from Go's in three ways:
// - headroom: Go keeps back every token reserved after, even when the bucket's capacity leaves room for
//   them (capacity 3, rate 1/s, empty: reserve 2 then 1; cancelling the 2 gives back 1 in Go, 2 here);
// - a rate raised in between: Go converts the time gap at the old rate and can give back tokens a later
//   reservation still needs (so two act in the same instant, above the burst); here it cannot;
// - a second CancelAt gives the tokens back again in Go; here a reservation gives back once.
// What stays as in Go: a reservation whose time to act has passed gives nothing back (its tokens are
// spent), and a reservation cancelled while later ones stand keeps back what they need, and those tokens
// are lost even after the later ones are cancelled too (cancel in reverse order to get everything back).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace rein::detail {

template <class TimePoint>
class reservation_book {
 public:
  /// Makes room for one more entry, so that add() after a reservation was taken cannot fail.
  void make_room() { live_.reserve(live_.size() + 1); }

  /// Records a reservation of n tokens acting at `at`, forgetting those that acted before `now`; returns
  /// its id. Call make_room() first.
  std::uint64_t add(std::int64_t n, TimePoint at, TimePoint now) noexcept {
    forget_spent(now);
    const auto place =
        std::upper_bound(live_.begin(), live_.end(), at, [](TimePoint t, const entry& e) { return t < e.at; });
    live_.insert(place, entry{++last_id_, n, at});  // within the capacity make_room() reserved: no throw
    ++counts_.reserved;
    return last_id_;
  }

  /// Removes reservation `id` and returns how many of its tokens may go back into `bucket` at `now` (the
  /// rule above): 0 if it acted before `now` or was already removed.
  template <class Bucket>
  std::int64_t give_back(std::uint64_t id, const Bucket& bucket, TimePoint now) {
    forget_spent(now);
    const auto mine = std::find_if(live_.begin(), live_.end(), [id](const entry& e) { return e.id == id; });
    if (mine == live_.end()) return 0;
    std::int64_t back = mine->n;
    live_.erase(mine);
    std::int64_t standing = 0;  // P(t): the later entries' tokens, walking back from the latest
    for (auto e = live_.rbegin(); e != live_.rend(); ++e) {
      standing += e->n;
      back = std::min(back, room(bucket, standing, e->at));
    }
    back = std::max<std::int64_t>(0, std::min(back, room(bucket, standing, now)));
    ++counts_.cancelled;
    counts_.returned += static_cast<std::uint64_t>(back);
    return back;
  }

  /// Reservations recorded, those cancelled before their time, and the tokens those gave back.
  struct counts {
    std::uint64_t reserved = 0;
    std::uint64_t cancelled = 0;
    std::uint64_t returned = 0;
  };
  const counts& totals() const noexcept { return counts_; }

 private:
  struct entry {
    std::uint64_t id;
    std::int64_t n;
    TimePoint at;
  };

  // What a refund may add at t: capacity - P(t) - ceil(B(t)). The sums stay far from overflow: the
  // standing tokens sit in the bucket's debt, which is at most 1e15 tokens, plus one capacity.
  template <class Bucket>
  static std::int64_t room(const Bucket& bucket, std::int64_t standing, TimePoint t) {
    return bucket.capacity() - standing - bucket.tokens_rounded_up(t);
  }

  void forget_spent(TimePoint now) noexcept {
    const auto spent =
        std::lower_bound(live_.begin(), live_.end(), now, [](const entry& e, TimePoint t) { return e.at < t; });
    live_.erase(live_.begin(), spent);
  }

  std::vector<entry> live_;  // sorted by `at`
  std::uint64_t last_id_ = 0;
  counts counts_;
};

}  // namespace rein::detail
