// Reservations in the pure limits (reserve, cancel_reservation): the token bucket's bound `not_before`, the
// fixed window's and the sliding window's times and give-back rules, and all_of's common time.
#include "support/catch.hpp"

#include <rein/algo/all_of.hpp>
#include <rein/algo/fixed_window.hpp>
#include <rein/algo/sliding_window.hpp>
#include <rein/algo/sliding_window_counter.hpp>
#include <rein/algo/token_bucket.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <vector>

namespace {

using namespace std::chrono_literals;
using rein::algo::take_result;
using time_point = std::chrono::steady_clock::time_point;
using standing = std::vector<rein::algo::standing_reservation<time_point>>;

// Windows are aligned to the epoch: t0 is a window start for every window length used here.
const time_point t0 = time_point{} + 1000h;

static_assert(rein::algo::reservable_rate_limit<rein::algo::token_bucket>);
static_assert(rein::algo::reservable_rate_limit<rein::algo::fixed_window>);
static_assert(rein::algo::reservable_rate_limit<rein::algo::sliding_window>);
static_assert(rein::algo::reservable_rate_limit<rein::algo::all_of<rein::algo::token_bucket, rein::algo::sliding_window>>);
static_assert(!rein::algo::reservable_rate_limit<rein::algo::sliding_window_counter>);

}  // namespace

TEST_CASE("reserve: a token bucket held past its own time takes what would overflow", "[reserve][token_bucket]") {
  rein::algo::token_bucket b({.rate = 1, .capacity = 4, .initial_tokens = 2}, t0);
  // Alone the 3 would be there at 1 s; held until 5 s, the bucket would have filled to 4 at 2 s and lost
  // 3 tokens by 5 s. They are taken now, so that at 5 s it holds 4 - 3 = 1, as if the 3 were taken then.
  CHECK(b.reserve(3, t0, t0 + 5s) == t0 + 5s);
  CHECK(b.tokens(t0) == -4);
  CHECK(b.tokens(t0 + 5s) == 1);
  CHECK(b.reserve(1, t0 + 5s, t0) == t0 + 5s);  // the next is timed behind: the 1 is there
  // A bound before its own time changes nothing.
  rein::algo::token_bucket c({.rate = 1, .capacity = 4, .initial_tokens = 0}, t0);
  CHECK(c.reserve(2, t0, t0 + 1s) == t0 + 2s);
  CHECK(c.tokens(t0) == -2);
}

TEST_CASE("reserve: a token bucket's cancel rule, from the algorithm", "[reserve][token_bucket][cancel]") {
  rein::algo::token_bucket b({.rate = 1, .capacity = 3, .initial_tokens = 0}, t0);
  const time_point r1 = *b.reserve(2, t0), r2 = *b.reserve(1, t0);
  CHECK(r1 == t0 + 2s);
  CHECK(r2 == t0 + 3s);
  const standing later{{1, r2}};
  CHECK(b.cancel_reservation(2, r1, later, t0) == 2);  // the capacity has room for r2's token and two more
  CHECK(b.tokens(t0) == -1);
  CHECK(b.cancel_reservation(1, r2, {}, t0 + 3s + 1ns) == 0);  // past its time: spent
  CHECK_THROWS_AS(b.cancel_reservation(-1, r2, {}, t0), std::invalid_argument);
}

TEST_CASE("reserve: a fixed window reserves in the first window with room, counting the units now",
          "[reserve][fixed_window]") {
  rein::algo::fixed_window w({.limit = 10, .window = 1min}, t0);
  REQUIRE(w.try_take(8, t0 + 10s) == take_result::allowed);
  CHECK(w.reserve(2, t0 + 20s) == t0 + 20s);  // room now: at once
  CHECK(w.count(t0 + 20s) == 10);
  CHECK(w.reserve(5, t0 + 20s) == t0 + 1min);  // the next window
  CHECK(w.reserve(7, t0 + 20s) == t0 + 2min);  // 5 + 7 > 10: the one after
  CHECK(w.count(t0 + 20s) == 27);
  CHECK(w.count(t0 + 1min) == 17);
  CHECK(w.count(t0 + 2min) == 7);
  CHECK(w.ready_at(3, t0 + 20s) == t0 + 2min);  // a newcomer is timed behind them
  CHECK(w.ready_at(4, t0 + 20s) == t0 + 3min);
  CHECK(w.reserve(11, t0 + 20s) == std::nullopt);  // above the limit
  CHECK(w.count(t0 + 20s) == 27);
  CHECK_THROWS_AS(w.reserve(-1, t0), std::invalid_argument);
}

TEST_CASE("reserve: the room a full window's end leaves before the reservation stays counted",
          "[reserve][fixed_window]") {
  rein::algo::fixed_window w({.limit = 10, .window = 1min}, t0);
  REQUIRE(w.try_take(8, t0) == take_result::allowed);
  const time_point at = *w.reserve(5, t0 + 1s);
  CHECK(at == t0 + 1min);
  // The 5 count in the next window; the 2 left here are not lent against it (the next window would then
  // admit 7 beside the 5).
  CHECK(w.count(t0 + 1s) == 15);
  CHECK(w.count(t0 + 1min) == 5);
  CHECK(w.ready_at(1, t0 + 1s) == t0 + 1min);
  CHECK(w.reserve(1, t0 + 1s, t0 + 3min + 5s) == t0 + 3min + 5s);  // held: counted in its own window
  CHECK(w.count(t0 + 3min) == 1);
}

TEST_CASE("reserve: a fixed window's cancel gives back what standing reservations leave free",
          "[reserve][fixed_window][cancel]") {
  rein::algo::fixed_window w({.limit = 10, .window = 1min}, t0);
  REQUIRE(w.try_take(8, t0) == take_result::allowed);
  const time_point a = *w.reserve(5, t0);   // window 1: count 15
  const time_point b = *w.reserve(10, t0);  // window 2: count 30
  CHECK(a == t0 + 1min);
  CHECK(b == t0 + 2min);
  SECTION("the earlier first: b needs window 2's 10, so nothing comes back") {
    CHECK(w.cancel_reservation(5, a, standing{{10, b}}, t0 + 1s) == 0);
    CHECK(w.count(t0 + 2min) == 10);
    CHECK(w.cancel_reservation(10, b, {}, t0 + 2s) == 10);
    CHECK(w.count(t0 + 2s) == 20);
  }
  SECTION("the latest first: each gives all its units back") {
    CHECK(w.cancel_reservation(10, b, standing{{5, a}}, t0 + 1s) == 10);
    CHECK(w.count(t0 + 1min) == 10);  // a's 5, and the 5 that b's window start left unused
    CHECK(w.cancel_reservation(5, a, {}, t0 + 2s) == 5);
    CHECK(w.count(t0 + 2s) == 15);
    CHECK(w.count(t0 + 1min) == 5);
  }
  SECTION("in the window it acts in, at its time, all of it; after its time, nothing") {
    CHECK(w.cancel_reservation(5, a, standing{{10, b}}, t0 + 1min) == 0);  // b stands: window 2 keeps 10
    CHECK(w.cancel_reservation(10, b, {}, t0 + 2min) == 10);
    CHECK(w.count(t0 + 2min) == 0);
    CHECK(w.cancel_reservation(5, a, {}, t0 + 2min) == 0);  // a's time has passed
  }
}

TEST_CASE("reserve: a fixed window's cancel keeps the current window full for a later window's units",
          "[reserve][fixed_window][cancel]") {
  rein::algo::fixed_window w({.limit = 10, .window = 1min}, t0);
  REQUIRE(w.try_take(10, t0) == take_result::allowed);
  const time_point a = *w.reserve(4, t0);
  CHECK(a == t0 + 1min);
  w.refund(10, t0);  // the caller's own refund lowers the count below a full window
  CHECK(w.count(t0) == 4);
  CHECK(w.cancel_reservation(4, a, {}, t0) == 0);  // 4 - 10 < 0: nothing known to spare in this window
  CHECK(w.count(t0) == 4);
}

TEST_CASE("reserve: a sliding window records the starts at the time to act", "[reserve][sliding_window]") {
  rein::algo::sliding_window w({.limit = 3, .window = 10s}, t0);
  REQUIRE(w.try_take(2, t0) == take_result::allowed);
  CHECK(w.reserve(1, t0 + 1s) == t0 + 1s);
  CHECK(w.reserve(2, t0 + 1s) == t0 + 10s);  // when the two of t0 have left
  // The log holds the newest 3 starts: the reserved 2 count from 10 s on, and the two of t0 they replaced
  // count as dropped until they leave.
  CHECK(w.count(t0 + 1s) == 1);
  CHECK(w.dropped(t0 + 1s) == 2);
  CHECK(w.count(t0 + 10s) == 3);
  CHECK(w.ready_at(1, t0 + 2s) == t0 + 11s);  // the 1 of 1 s leaves at 11 s
  CHECK(w.try_take(1, t0 + 10s) == take_result::denied);
  // Nobody overtakes a reservation: with room, a newcomer still waits for the latest reserved start.
  rein::algo::sliding_window v({.limit = 5, .window = 10s}, t0);
  CHECK(v.reserve(1, t0, t0 + 4s) == t0 + 4s);
  CHECK(v.ready_at(1, t0 + 1s) == t0 + 4s);
  CHECK(v.try_take(1, t0 + 1s) == take_result::denied);
  CHECK(v.try_take(1, t0 + 4s) == take_result::allowed);
  v.charge(2, t0 + 4s);
  CHECK(v.count(t0 + 4s) == 4);
  CHECK(v.reserve(6, t0) == std::nullopt);
}

TEST_CASE("reserve: a sliding window's cancel before the time to act gives all back", "[reserve][sliding_window][cancel]") {
  rein::algo::sliding_window w({.limit = 3, .window = 10s}, t0);
  const time_point a = *w.reserve(3, t0);
  const time_point b = *w.reserve(2, t0);
  const time_point c = *w.reserve(1, t0);
  CHECK(a == t0);
  CHECK(b == t0 + 10s);
  CHECK(c == t0 + 10s);
  CHECK(w.cancel_reservation(2, b, standing{{3, a}, {1, c}}, t0 + 5s) == 2);  // c stands: still counted
  CHECK(w.count(t0 + 10s) == 1);
  CHECK(w.ready_at(2, t0 + 5s) == t0 + 10s);  // room for 2 beside c's start at 10 s, not before it
  CHECK(w.ready_at(3, t0 + 5s) == t0 + 20s);
  CHECK(w.cancel_reservation(1, c, {}, t0 + 10s) == 1);  // at its time: back
  CHECK(w.cancel_reservation(3, a, {}, t0 + 10s) == 0);  // past
  CHECK(w.count(t0 + 10s) == 0);
  // The caller's refund forgets started units, never a reservation's.
  const time_point d = *w.reserve(2, t0 + 10s, t0 + 15s);
  w.refund(2, t0 + 11s);
  CHECK(w.count(t0 + 15s) == 2);
  CHECK(w.cancel_reservation(2, d, {}, t0 + 12s) == 2);
}

TEST_CASE("reserve: all_of reserves every part at the latest part's time", "[reserve][all_of]") {
  rein::algo::all_of limits{rein::algo::token_bucket({.rate = 1, .capacity = 2}, t0),
                            rein::algo::sliding_window({.limit = 2, .window = 10s}, t0)};
  CHECK(limits.reserve(2, t0) == t0);
  // The bucket is ready at 1 s, the window at 10 s: both count the 1 at 10 s.
  const time_point at = *limits.reserve(1, t0);
  CHECK(at == t0 + 10s);
  CHECK(limits.get<1>().count(t0 + 10s) == 1);
  // The bucket, ready at 1 s but held until 10 s, takes the 1 and the 8 that would have overflowed its
  // capacity of 2 by then: at 10 s it holds 2 - 1.
  CHECK(limits.get<0>().tokens(t0 + 10s) == 1);
  CHECK(limits.reserve(3, t0) == std::nullopt);  // above the smallest capacity
  CHECK(limits.cancel_reservation(1, at, {}, t0 + 1s) == 1);
  CHECK(limits.get<1>().count(t0 + 10s) == 0);
  CHECK(limits.get<0>().tokens(t0 + 10s) == 2);
}

TEST_CASE("reserve: all_of reserves 0 at its ready time, taking nothing", "[reserve][all_of]") {
  // The bucket in debt answered its own reserve(0) at the debt's end (1 s) while all_of's ready_at(0) said
  // now: the parts disagreed on the time (an assertion in a build with them on).
  rein::algo::all_of limits{rein::algo::token_bucket({.rate = 2, .capacity = 2}, t0),
                            rein::algo::sliding_window({.limit = 2, .window = 1s}, t0)};
  CHECK(limits.reserve(1, t0) == t0);
  // The window is full until 1 s; the bucket, held until then, takes the 2 and the 1 that would overflow.
  CHECK(limits.reserve(2, t0) == t0 + 1s);
  CHECK(limits.get<0>().tokens(t0) == -2);
  CHECK(limits.reserve(0, t0) == t0);
  CHECK(limits.get<0>().tokens(t0) == -2);  // nothing more taken
  CHECK(limits.get<1>().count(t0 + 1s) == 2);
}

TEST_CASE("reserve: all_of gives back the least of its parts' refunds", "[reserve][all_of][cancel]") {
  rein::algo::all_of limits{rein::algo::fixed_window({.limit = 4, .window = 10s}, t0),
                            rein::algo::sliding_window({.limit = 8, .window = 10s}, t0)};
  const time_point a = *limits.reserve(4, t0);
  const time_point b = *limits.reserve(4, t0);
  CHECK(a == t0);
  CHECK(b == t0 + 10s);
  // The fixed window's count carries b's 4 into b's window: lowering it would open that window beside b,
  // so nothing comes back there; the sliding window forgets a's 4 starts.
  CHECK(limits.cancel_reservation(4, a, standing{{4, b}}, t0) == 0);
  CHECK(limits.get<1>().count(t0) == 0);
  CHECK(limits.get<0>().count(t0) == 8);
}

TEST_CASE("reserve: a sliding window's cancel takes back the starts its reservation pushed out of the log",
          "[reserve][sliding_window][cancel]") {
  rein::algo::sliding_window w({.limit = 2, .window = 10s}, t0);
  REQUIRE(w.try_take(2, t0) == take_result::allowed);
  const time_point r = *w.reserve(2, t0 + 1s);
  CHECK(r == t0 + 10s);
  CHECK(w.dropped(t0 + 1s) == 2);  // the log holds the newest 2 starts: the reservation's
  CHECK(w.cancel_reservation(2, r, {}, t0 + 2s) == 2);
  // The two starts of t0 still count until 10 s: they are back in the log, and nothing fits before then.
  CHECK(w.dropped(t0 + 2s) == 0);
  CHECK(w.count(t0 + 2s) == 2);
  CHECK(w.try_take(1, t0 + 2s) == take_result::denied);
  CHECK(w.ready_at(1, t0 + 2s) == t0 + 10s);
}

TEST_CASE("reserve: a fixed window's new limit leaves a reserved window's count as it was", "[reserve][fixed_window]") {
  rein::algo::fixed_window w({.limit = 4, .window = 10s}, t0);
  CHECK(w.try_take(4, t0) == take_result::allowed);
  CHECK(w.reserve(4, t0) == t0 + 10s);
  SECTION("raised: window 1 holds the reservation's 4 of 8") {
    w.set_limit(8, t0);
    CHECK(w.count(t0) == 12);  // window 0 stays full
    CHECK(w.count(t0 + 10s) == 4);
    CHECK(w.ready_at(5, t0) == t0 + 20s);
    CHECK(w.ready_at(4, t0) == t0 + 10s);
  }
  SECTION("lowered: the 4 fill window 1 and 2 more the next") {
    w.set_limit(2, t0);
    CHECK(w.count(t0 + 10s) == 4);
    CHECK(w.count(t0 + 20s) == 2);
    CHECK(w.ready_at(1, t0) == t0 + 30s);
  }
  SECTION("nothing carried: the count stays") {
    rein::algo::fixed_window v({.limit = 4, .window = 10s}, t0);
    CHECK(v.try_take(3, t0) == take_result::allowed);
    v.set_limit(8, t0);
    CHECK(v.count(t0) == 3);
    CHECK(v.try_take(5, t0) == take_result::allowed);
  }
}

TEST_CASE("reserve: all_of's failed reserve takes nothing from any part", "[reserve][all_of]") {
  static_assert(std::is_trivially_copyable_v<rein::algo::fixed_window>);
  static_assert(std::is_trivially_copyable_v<rein::algo::token_bucket>);
  constexpr auto month = 24h * 30;
  const time_point start = time_point{} + month * 1000;  // a window start
  // The sliding window's one start leaves after 30 days; the bucket cannot hold the n that long (what
  // it would lose by then is a debt beyond 1e15 tokens), so the reserve fails after the fixed window's.
  rein::algo::all_of a(rein::algo::fixed_window({.limit = 4, .window = month}, start),
                       rein::algo::sliding_window({.limit = 1, .window = month}, start),
                       rein::algo::token_bucket({.rate = 1e9, .capacity = 10}, start));
  CHECK(a.try_take(1, start) == take_result::allowed);
  CHECK(a.reserve(1, start) == std::nullopt);
  CHECK(a.get<0>().count(start) == 1);
  CHECK(a.get<0>().count(start + month) == 0);
  CHECK(a.get<1>().count(start) == 1);
  CHECK(a.get<2>().tokens_rounded_up(start) == 9);
  CHECK(a.get<0>().try_take(3, start) == take_result::allowed);
}

TEST_CASE("reserve: a fixed window's cancels, earliest first, keep back what later ones need",
          "[reserve][fixed_window][cancel]") {
  rein::algo::fixed_window w({.limit = 3, .window = 10s}, t0);
  CHECK(w.reserve(3, t0) == t0);
  CHECK(w.reserve(3, t0) == t0 + 10s);
  CHECK(w.reserve(3, t0) == t0 + 20s);
  CHECK(w.cancel_reservation(3, t0, standing{{3, t0 + 10s}, {3, t0 + 20s}}, t0) == 0);
  CHECK(w.cancel_reservation(3, t0 + 10s, standing{{3, t0 + 20s}}, t0) == 0);
  CHECK(w.cancel_reservation(3, t0 + 20s, standing{}, t0) == 3);
  CHECK(w.ready_at(1, t0) == t0 + 20s);  // window 1 stays full
}
