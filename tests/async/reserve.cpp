// reserve() on the rate limiters (Go's ReserveN / Reservation): exact delays and wait completions on the
// manual clock, cancel's refunds (the token bucket's against Go's CancelAt, where Go gives back too little,
// too much, or twice; the windows' and rate_limits' by their own rules), the line's rule (a reservation never
// overtakes a waiter), bad input, closing, and cancellation through a slot, for the token bucket, the fixed
// and sliding windows and rate_limits; and throttle.reserve (rein::throttle_reservation): one time to act
// for every rate stage, the wait's permits, cancel's refunds, gates, closing and cancellation.
#include "support/asio.hpp"
#include "support/catch.hpp"
#include "support/manual_time.hpp"

#include <rein/admission_throttle.hpp>
#include <rein/algo/all_of.hpp>
#include <rein/algo/sliding_window_counter.hpp>
#include <rein/error.hpp>
#include <rein/fixed_window.hpp>
#include <rein/keyed.hpp>
#include <rein/quota_gate.hpp>
#include <rein/rate_limiter.hpp>
#include <rein/semaphore.hpp>
#include <rein/sliding_window.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
using rein_test::manual_clock;
using rein_test::since_epoch;
using bucket_type = rein::basic_token_bucket<net::any_io_executor, manual_clock>;
using fixed_type = rein::basic_fixed_window<net::any_io_executor, manual_clock>;
using sliding_type = rein::basic_sliding_window<net::any_io_executor, manual_clock>;
using both_type = rein::basic_rate_limiter<
    rein::algo::all_of<rein::algo::basic_token_bucket<manual_clock>, rein::algo::basic_sliding_window<manual_clock>>,
    net::any_io_executor>;
using rein::error_code;
using rein::try_status;

manual_clock::time_point at(manual_clock::duration d) { return manual_clock::time_point{} + d; }

// Each case starts at the manual clock's epoch with an io_context of its own.
struct on_manual_clock {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
};

// Where and how a wait completed.
struct waited {
  std::optional<error_code> ec;
  manual_clock::duration when{};
  auto handler() {
    return [this](error_code e) {
      ec = e;
      when = since_epoch();
    };
  }
};

// The example of rein::basic_token_reservation's documentation.
net::awaitable<void> reserve_or_go_elsewhere(bucket_type& bucket) {
  auto r = bucket.reserve(3);
  if (r && r.delay() < 200ms) co_await r.wait();  // at time_to_act(), on the bucket's executor
  else r.cancel();                                // tokens back; try elsewhere
}

}  // namespace

TEST_CASE_METHOD(on_manual_clock, "reserve: the delay is the debt's repayment, and the wait completes exactly then",
                 "[token_bucket][reserve]") {
  bucket_type b(io, {.rate = 10, .capacity = 10});
  bucket_type::reservation first = b.reserve(10);
  bucket_type::reservation second = b.reserve(5);
  CHECK(first.ok());
  CHECK(first.delay() == 0ns);
  CHECK(second.ok());
  CHECK(second.tokens() == 5);
  CHECK(second.time_to_act() == at(500ms));
  CHECK(second.delay() == 500ms);
  CHECK(second.delay_from(at(200ms)) == 300ms);
  CHECK(b.tokens() == -5);
  waited w1, w2;
  first.async_wait(w1.handler());
  second.async_wait(w2.handler());
  CHECK(!w1.ec);  // never from inside async_wait
  rein_test::poll(io);
  CHECK(w1.ec == error_code());
  CHECK(w1.when == 0ms);
  rein_test::advance_and_poll(io, 500ms - 1ns);
  CHECK(!w2.ec);
  rein_test::advance_and_poll(io, 1ns);
  CHECK(w2.ec == error_code());
  CHECK(w2.when == 500ms);
  CHECK(second.delay() == 0ns);
}

TEST_CASE_METHOD(on_manual_clock, "reserve: co_await r.wait() resumes at the time to act", "[token_bucket][reserve]") {
  bucket_type b(io, {.rate = 4, .capacity = 1, .initial_tokens = 0});
  std::optional<manual_clock::duration> resumed;
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        bucket_type::reservation r = b.reserve();
        co_await r.wait();
        resumed = since_epoch();
      },
      net::detached);
  rein_test::advance_and_poll(io, 250ms - 1ns);
  CHECK(!resumed);
  rein_test::advance_and_poll(io, 1ns);
  CHECK(resumed == 250ms);
}

TEST_CASE_METHOD(on_manual_clock,
                 "reserve: cancel gives back what later reservations leave free, more than Go's CancelAt",
                 "[token_bucket][reserve][cancel]") {
  bucket_type b(io, {.rate = 1, .capacity = 3, .initial_tokens = 0});
  bucket_type::reservation r1 = b.reserve(2);
  bucket_type::reservation r2 = b.reserve(1);
  CHECK(r1.time_to_act() == at(2s));
  CHECK(r2.time_to_act() == at(3s));
  // Go keeps back (3 s - 2 s) x 1/s = 1 token for r2 and gives back 1. The capacity of 3 has room for
  // r2's token and two more at 3 s, so both come back here.
  CHECK(r1.cancel() == 2);
  CHECK(b.tokens() == -1);
  CHECK(r1.cancel() == 0);  // once only (Go's CancelAt gives back again)
  CHECK(b.tokens() == -1);
  bucket_type::reservation r3 = b.reserve(2);
  CHECK(r3.time_to_act() == at(3s));  // with r2 at 3 s: 3 tokens at one instant, the capacity
  CHECK(r2.time_to_act() == at(3s));
  // r2 is cancelled with r3 standing after it at the same instant: its token comes back, and a new
  // reservation of 1 lands at 3 s again, never 4 tokens at once.
  CHECK(r2.cancel() == 1);
  CHECK(b.reserve(1).time_to_act() == at(3s));
  CHECK(b.reserve(1).time_to_act() == at(4s));
}

TEST_CASE_METHOD(on_manual_clock, "reserve: an earlier cancel keeps back what the latest reservation needs",
                 "[token_bucket][reserve][cancel]") {
  bucket_type b(io, {.rate = 1, .capacity = 3, .initial_tokens = 0});
  SECTION("cancelled from the middle") {
    bucket_type::reservation r1 = b.reserve(3), r2 = b.reserve(3), r3 = b.reserve(1);
    CHECK(r3.time_to_act() == at(7s));
    // r3 takes its token at 7 s: the bucket may hold at most 2 others then, so 2 of r2's 3 come back.
    CHECK(r2.cancel() == 2);
    CHECK(b.tokens() == -5);
    CHECK(r1.cancel() == 0);  // r3 needs the bucket no fuller than -5 now (2 at 7 s)
    CHECK(b.tokens() == -5);
    CHECK(r3.cancel() == 1);
    CHECK(b.tokens() == -4);
  }
  SECTION("cancelled latest first: everything comes back") {
    bucket_type::reservation r1 = b.reserve(3), r2 = b.reserve(3), r3 = b.reserve(1);
    CHECK(r3.cancel() == 1);
    CHECK(r2.cancel() == 3);
    CHECK(r1.cancel() == 3);
    CHECK(b.tokens() == 0);
  }
}

TEST_CASE_METHOD(on_manual_clock, "reserve: after a rate increase, cancel gives back nothing a later reservation needs",
                 "[token_bucket][reserve][cancel]") {
  bucket_type b(io, {.rate = 1, .capacity = 2, .initial_tokens = 0});
  bucket_type::reservation r1 = b.reserve(2);
  CHECK(r1.time_to_act() == at(2s));
  b.set_rate(2);
  bucket_type::reservation r2 = b.reserve(2);
  CHECK(r2.time_to_act() == at(2s));
  // Go counts the gap (2 s - 2 s) at r1's rate: nothing reserved after, all 2 back, and a newcomer would
  // act at 2 s beside r2: 4 tokens at one instant with a capacity of 2. Here nothing comes back.
  CHECK(r1.cancel() == 0);
  CHECK(b.tokens() == -4);
  CHECK(b.reserve(1).time_to_act() == at(2500ms));
}

TEST_CASE_METHOD(on_manual_clock,
                 "reserve: past its time to act a reservation is spent; destroying one gives nothing back",
                 "[token_bucket][reserve][cancel]") {
  bucket_type b(io, {.rate = 10, .capacity = 10, .initial_tokens = 0});
  SECTION("cancelled at its time to act: all back (as Go's CancelAt)") {
    bucket_type::reservation r = b.reserve(5);
    rein_test::advance_and_poll(io, 500ms);
    CHECK(r.cancel() == 5);
    CHECK(b.tokens() == 5);
  }
  SECTION("cancelled after it: nothing") {
    bucket_type::reservation r = b.reserve(5);
    rein_test::advance_and_poll(io, 600ms);
    CHECK(r.cancel() == 0);
    CHECK(b.tokens() == 1);
  }
  SECTION("destroyed unused: spent") {
    { bucket_type::reservation r = b.reserve(4); }
    CHECK(b.tokens() == -4);
    CHECK(b.reserve(1).time_to_act() == at(500ms));
  }
}

TEST_CASE_METHOD(on_manual_clock, "reserve: a reservation never overtakes a waiter, and acquires queue behind it",
                 "[token_bucket][reserve][line]") {
  bucket_type b(io, {.rate = 10, .capacity = 1});
  std::vector<manual_clock::duration> granted;
  auto record = [&](error_code ec) {
    CHECK(!ec);
    granted.push_back(since_epoch());
  };
  b.async_acquire(1, record);  // takes the token
  b.async_acquire(1, record);  // waits until 100 ms
  rein_test::poll(io);
  bucket_type::reservation refused = b.reserve(1);
  CHECK(!refused.ok());
  CHECK(refused.status() == try_status::busy);
  CHECK(refused.delay() == manual_clock::duration::max());
  CHECK(refused.time_to_act() == manual_clock::time_point::max());
  waited w;
  refused.async_wait(w.handler());
  rein_test::poll(io);
  CHECK(w.ec == error_code(net::error::would_block));
  CHECK(b.tokens() == 0);  // took nothing
  rein_test::advance_and_poll(io, 100ms);
  CHECK(granted == std::vector<manual_clock::duration>{0ms, 100ms});
  bucket_type::reservation r = b.reserve(1);  // the line is empty again
  CHECK(r.time_to_act() == at(200ms));
  b.async_acquire(1, record);  // behind the reservation's debt
  rein_test::advance_and_poll(io, 200ms - 1ns);
  CHECK(granted.size() == 2);
  rein_test::advance_and_poll(io, 1ns);
  CHECK(granted == std::vector<manual_clock::duration>{0ms, 100ms, 300ms});
}

TEST_CASE_METHOD(on_manual_clock, "reserve: cancel grants the waiters that now fit, at once or re-timed",
                 "[token_bucket][reserve][cancel]") {
  bucket_type b(io, {.rate = 1, .capacity = 5, .initial_tokens = 0});
  bucket_type::reservation r = b.reserve(3);
  waited w;
  b.async_acquire(2, w.handler());  // behind the debt: at 5 s
  rein_test::advance_and_poll(io, 1s);
  CHECK(r.cancel() == 3);  // at 1 s the bucket holds -2 + 3 = 1: the waiter needs 1 s more
  rein_test::advance_and_poll(io, 1s - 1ns);
  CHECK(!w.ec);
  rein_test::advance_and_poll(io, 1ns);
  CHECK(w.ec == error_code());
  CHECK(w.when == 2s);
}

TEST_CASE_METHOD(on_manual_clock, "reserve: bad input is refused and takes nothing",
                 "[token_bucket][reserve][errors]") {
  bucket_type b(io, {.rate = 1, .capacity = 2});
  waited over, negative, closed;
  bucket_type::reservation too_many = b.reserve(3);
  CHECK(too_many.status() == try_status::exceeds_capacity);
  CHECK(!too_many);
  CHECK(too_many.cancel() == 0);
  too_many.async_wait(over.handler());
  const int minus_one = -1;  // a negative count converts to the largest std::size_t
  bucket_type::reservation below_zero = b.reserve(static_cast<std::size_t>(minus_one));
  CHECK(below_zero.status() == try_status::exceeds_capacity);
  below_zero.async_wait(negative.handler());
  b.close();
  bucket_type::reservation after_close = b.reserve(1);
  CHECK(after_close.status() == try_status::closed);
  after_close.async_wait(closed.handler());
  rein_test::poll(io);
  CHECK(over.ec == error_code(rein::errc::exceeds_capacity));
  CHECK(negative.ec == error_code(rein::errc::exceeds_capacity));
  CHECK(closed.ec == error_code(rein::errc::closed));
  CHECK(b.tokens() == 2);
}

TEST_CASE_METHOD(on_manual_clock,
                 "reserve: a wait cancelled through its slot completes aborted and gives the tokens back",
                 "[token_bucket][reserve][cancel]") {
  const auto type =
      GENERATE(net::cancellation_type::terminal, net::cancellation_type::partial, net::cancellation_type::total);
  bucket_type b(io, {.rate = 10, .capacity = 10});
  bucket_type::reservation all = b.reserve(10);
  bucket_type::reservation r = b.reserve(5);
  net::cancellation_signal signal;
  waited w;
  r.async_wait(net::bind_cancellation_slot(signal.slot(), w.handler()));
  rein_test::advance_and_poll(io, 100ms);
  CHECK(!w.ec);
  signal.emit(type);
  rein_test::poll(io);
  CHECK(w.ec == error_code(net::error::operation_aborted));
  CHECK(w.when == 100ms);
  CHECK(b.tokens() == 1);  // -4 at 100 ms, and the 5 back
  CHECK(r.cancel() == 0);  // already given back
  CHECK(b.reserve(1).time_to_act() == at(100ms));
}

TEST_CASE_METHOD(on_manual_clock, "reserve: cancel() ends pending waits and later ones with operation_aborted",
                 "[token_bucket][reserve][cancel]") {
  bucket_type b(io, {.rate = 1, .capacity = 1, .initial_tokens = 0});
  bucket_type::reservation r = b.reserve(1);
  waited before, after;
  r.async_wait(before.handler());
  CHECK(r.cancel() == 1);
  r.async_wait(after.handler());
  rein_test::poll(io);
  CHECK(before.ec == error_code(net::error::operation_aborted));
  CHECK(after.ec == error_code(net::error::operation_aborted));
  CHECK(before.when == 0ms);
  CHECK(b.tokens() == 0);
}

TEST_CASE_METHOD(on_manual_clock, "reserve: the documentation's example waits when the delay is short, else cancels",
                 "[token_bucket][reserve]") {
  const auto initial = GENERATE(std::int64_t{1}, std::int64_t{2});
  bucket_type b(io, {.rate = 10, .capacity = 3, .initial_tokens = initial});
  std::optional<manual_clock::duration> done;
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        co_await reserve_or_go_elsewhere(b);
        done = since_epoch();
      },
      net::detached);
  rein_test::poll(io);
  rein_test::advance_and_poll(io, 100ms);
  if (initial == 1) {  // 200 ms away: cancelled at once, the token back
    CHECK(done == 0ms);
    CHECK(b.tokens() == 2);
  } else {  // 100 ms away: waited
    CHECK(done == 100ms);
    CHECK(b.tokens() == 0);
  }
}

TEST_CASE_METHOD(on_manual_clock, "reserve: a wait outlives its reservation, and a reservation its bucket",
                 "[token_bucket][reserve][lifetime]") {
  std::optional<bucket_type> b(std::in_place, io,
                               bucket_type::rule_type{.rate = 10, .capacity = 1, .initial_tokens = 0});
  waited w;
  { b->reserve(1).async_wait(w.handler()); }
  bucket_type::reservation orphan = b->reserve(1);
  CHECK(orphan.time_to_act() == at(200ms));
  b.reset();
  CHECK(orphan.cancel() == 0);  // no bucket to give back to
  rein_test::advance_and_poll(io, 100ms - 1ns);
  CHECK(!w.ec);
  rein_test::advance_and_poll(io, 1ns);
  CHECK(w.ec == error_code());
  CHECK(w.when == 100ms);
}

TEST_CASE("reserve: the algorithm's whole-token reading rounds up, in debt too", "[token_bucket][reserve][algo]") {
  rein::algo::basic_token_bucket<manual_clock> a({.rate = 10, .capacity = 10, .initial_tokens = 0}, at(0ms));
  a.charge(1, at(0ms));
  CHECK(a.tokens_rounded_up(at(0ms)) == -1);
  CHECK(a.tokens_rounded_up(at(50ms)) == 0);  // -0.5
  CHECK(a.tokens_rounded_up(at(100ms)) == 0);
  CHECK(a.tokens_rounded_up(at(100ms + 1ns)) == 1);
  CHECK(a.tokens_rounded_up(at(5s)) == 10);  // full
}

TEST_CASE_METHOD(on_manual_clock, "reserve: the snapshot counts reservations, cancellations and tokens returned",
                 "[token_bucket][reserve][snapshot]") {
  bucket_type b(io, {.rate = 1, .capacity = 3, .initial_tokens = 0});
  CHECK(b.snapshot().reserved_total == 0);
  bucket_type::reservation r1 = b.reserve(2), r2 = b.reserve(1);
  CHECK(b.reserve(0).ok());  // takes nothing: not counted
  CHECK(r1.cancel() == 2);
  CHECK(r1.cancel() == 0);  // not cancelled twice
  rein_test::advance_and_poll(io, 4s);
  CHECK(r2.cancel() == 0);  // past its time: spent, not a cancellation
  const rein::token_bucket_snapshot s = b.snapshot();
  CHECK(s.reserved_total == 2);
  CHECK(s.reservations_cancelled_total == 1);
  CHECK(s.reserved_returned_total == 2);
  std::ostringstream line;
  line << s;
  CHECK(line.str().find(" reserved=2 (cancelled=1 returned=2) ") != std::string::npos);
}

TEST_CASE_METHOD(on_manual_clock, "reserve: threads reserving and cancelling at once lose no token",
                 "[token_bucket][reserve][threads]") {
  // The clock stands still, so nothing refills: what the bucket holds at the end is exactly its capacity,
  // less every reservation, plus every refund, whatever the interleaving.
  bucket_type b(io, {.rate = 1, .capacity = 10});
  constexpr int threads = 4, rounds = 500;
  std::atomic<std::size_t> given_back{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::vector<bucket_type::reservation> kept;
      for (int i = 0; i < rounds; ++i) {
        bucket_type::reservation r = b.reserve(1);
        if ((i + t) % 2 == 0) given_back += r.cancel();
        else kept.push_back(std::move(r));
      }
      for (std::size_t i = 0; i < kept.size(); i += 3) given_back += kept[i].cancel();
    });
  }
  for (std::thread& w : workers) w.join();
  const rein::token_bucket_snapshot s = b.snapshot();
  CHECK(s.reserved_total == threads * rounds);
  CHECK(s.reservations_cancelled_total == threads * (rounds / 2 + (rounds / 2 + 2) / 3));
  CHECK(s.reserved_returned_total == given_back.load());
  CHECK(b.tokens() == 10.0 - threads * rounds + static_cast<double>(given_back.load()));
  CHECK(given_back.load() > 0);
}

// ---- The windows and rate_limits ------------------------------------------------------------------------

namespace {

// Each limiter with a limit of 2 per call (a window's limit, a bucket's capacity), for the common contract.
fixed_type make(net::io_context& io, std::type_identity<fixed_type>) { return fixed_type(io, {.limit = 2, .window = 1s}); }
sliding_type make(net::io_context& io, std::type_identity<sliding_type>) {
  return sliding_type(io, {.limit = 2, .window = 1s});
}
both_type make(net::io_context& io, std::type_identity<both_type>) {
  const auto now = manual_clock::now();
  return both_type(io, rein::algo::all_of{rein::algo::basic_token_bucket<manual_clock>({.rate = 2, .capacity = 2}, now),
                                          rein::algo::basic_sliding_window<manual_clock>({.limit = 2, .window = 1s}, now)});
}

static_assert(std::is_same_v<bucket_type::reservation, rein::basic_token_reservation<net::any_io_executor, manual_clock>>);
static_assert(std::is_same_v<fixed_type::reservation, rein::basic_reservation<rein::algo::basic_fixed_window<manual_clock>,
                                                                              net::any_io_executor>>);
static_assert(std::is_void_v<rein::basic_rate_limiter<rein::algo::basic_sliding_window_counter<manual_clock>>::reservation>);

}  // namespace

TEST_CASE_METHOD(on_manual_clock, "reserve: a fixed window's reservation acts at the first window with room",
                 "[fixed_window][reserve]") {
  fixed_type w(io, {.limit = 3, .window = 1s});
  fixed_type::reservation r1 = w.reserve(3), r2 = w.reserve(2), r3 = w.reserve(2);
  CHECK(r1.delay() == 0ns);
  CHECK(r2.time_to_act() == at(1s));
  CHECK(r2.delay() == 1s);
  CHECK(r3.time_to_act() == at(2s));  // window 1 holds r2's 2: no room for 2 more
  CHECK(w.snapshot().in_window == 8);  // 3 here, and 3 + 2 carried into the next windows
  waited w2;
  r2.async_wait(w2.handler());
  rein_test::advance_and_poll(io, 1s - 1ns);
  CHECK(!w2.ec);
  rein_test::advance_and_poll(io, 1ns);
  CHECK(w2.ec == error_code());
  CHECK(w2.when == 1s);
}

TEST_CASE_METHOD(on_manual_clock, "reserve: a fixed window's cancel gives back unless a later window needs the count",
                 "[fixed_window][reserve][cancel]") {
  fixed_type w(io, {.limit = 3, .window = 1s});
  fixed_type::reservation r1 = w.reserve(3), r2 = w.reserve(2), r3 = w.reserve(2);
  rein_test::advance_and_poll(io, 500ms);
  SECTION("the earlier first: r3 stands in window 2, so r2's units stay counted") {
    CHECK(r2.cancel() == 0);
    CHECK(r3.cancel() == 2);
    CHECK(w.reserve(1).time_to_act() == at(2s));
  }
  SECTION("the latest first: both give all back") {
    CHECK(r3.cancel() == 2);
    CHECK(r2.cancel() == 2);
    // Window 1 keeps the 1 that r3's window start left unused there.
    CHECK(w.reserve(2).time_to_act() == at(1s));
    CHECK(w.reserve(1).time_to_act() == at(2s));
    const auto s = w.snapshot();
    CHECK(s.reserved_total == 5);
    CHECK(s.reservations_cancelled_total == 2);
    CHECK(s.reserved_returned_total == 4);
    std::ostringstream line;
    line << s;
    CHECK(line.str().find(" available=0 reserved=5 (cancelled=2 returned=4) ") != std::string::npos);
  }
}

TEST_CASE_METHOD(on_manual_clock, "reserve: refund() gives back no unit a standing reservation counts on",
                 "[reserve][refund]") {
  SECTION("fixed window: a reservation in the next window keeps its count there") {
    fixed_type w(io, {.limit = 4, .window = 10ms});
    CHECK(w.try_acquire(1));
    fixed_type::reservation r = w.reserve(4);
    CHECK(r.time_to_act() == at(10ms));
    w.refund(1);  // the 1 was never sent; window 1 still holds r's 4
    rein_test::advance_and_poll(io, 10ms);
    CHECK(!w.try_acquire(1));
    CHECK(w.snapshot().in_window == 4);
  }
  SECTION("fixed window: what no reservation counts on comes back") {
    fixed_type w(io, {.limit = 4, .window = 10ms});
    CHECK(w.try_acquire(1));
    fixed_type::reservation r = w.reserve(2);
    CHECK(r.delay() == 0ns);
    w.refund(2);  // 1 of the 3 counted is not r's
    CHECK(w.try_acquire(2));
    CHECK(!w.try_acquire(1));
  }
  SECTION("fixed window: once the reservation's time passed, a plain refund") {
    fixed_type w(io, {.limit = 4, .window = 10ms});
    CHECK(w.try_acquire(1));
    fixed_type::reservation r = w.reserve(4);
    rein_test::advance_and_poll(io, 15ms);
    w.refund(1);
    CHECK(w.try_acquire(1));
    CHECK(!w.try_acquire(1));
  }
  SECTION("token bucket: the tokens a later reservation needs stay in debt") {
    bucket_type b(io, {.rate = 1, .capacity = 4});
    CHECK(b.try_acquire(1));
    bucket_type::reservation r1 = b.reserve(4);
    CHECK(r1.time_to_act() == at(1s));
    b.refund(1);  // would let r2 act with r1: 5 tokens at 1 s, capacity 4
    CHECK(b.tokens() == -1);
    bucket_type::reservation r2 = b.reserve(1);
    CHECK(r2.time_to_act() == at(2s));
  }
  SECTION("token bucket: without a reservation standing, all back") {
    bucket_type b(io, {.rate = 1, .capacity = 4});
    bucket_type::reservation r1 = b.reserve(4);
    CHECK(r1.cancel() == 4);
    CHECK(b.try_acquire(3));
    b.refund(2);
    CHECK(b.tokens() == 3);
  }
}

TEST_CASE_METHOD(on_manual_clock, "reserve: a fixed window's raised limit leaves a later window's reservation counted",
                 "[fixed_window][reserve]") {
  fixed_type w(io, {.limit = 4, .window = 10ms});
  CHECK(w.try_acquire(4));
  fixed_type::reservation r = w.reserve(4);
  CHECK(r.time_to_act() == at(10ms));
  w.set_limit(8);
  CHECK(!w.try_acquire(1));  // the room r left unused in window 0 stays counted
  rein_test::advance_and_poll(io, 10ms);
  CHECK(w.try_acquire(4));  // r's 4 and these 4: window 1 holds 8
  CHECK(!w.try_acquire(1));
  rein_test::advance_and_poll(io, 10ms);
  CHECK(w.try_acquire(8));
}

TEST_CASE_METHOD(on_manual_clock, "reserve: a sliding window's reservation gives all back before its time",
                 "[sliding_window][reserve][cancel]") {
  sliding_type w(io, {.limit = 2, .window = 1s});
  sliding_type::reservation a = w.reserve(2), b = w.reserve(1), c = w.reserve(1);
  CHECK(a.delay() == 0ns);
  CHECK(b.time_to_act() == at(1s));  // when a's starts leave the window
  CHECK(c.time_to_act() == at(1s));
  waited wc;
  c.async_wait(wc.handler());
  rein_test::advance_and_poll(io, 500ms);
  CHECK(b.cancel() == 1);  // c still stands beside it: nothing it needs goes
  CHECK(b.cancel() == 0);
  CHECK(w.reserve(1).time_to_act() == at(1s));
  CHECK(w.reserve(1).time_to_act() == at(2s));
  rein_test::advance_and_poll(io, 500ms - 1ns);
  CHECK(!wc.ec);
  rein_test::advance_and_poll(io, 1ns);
  CHECK(wc.ec == error_code());
  CHECK(wc.when == 1s);
  CHECK(c.cancel() == 1);  // at its time to act: still back
  CHECK(a.cancel() == 0);  // past its time
  const auto s = w.snapshot();
  CHECK(s.reserved_total == 5);
  CHECK(s.reservations_cancelled_total == 2);
  CHECK(s.reserved_returned_total == 2);
}

TEST_CASE_METHOD(on_manual_clock, "reserve: a sliding window's snapshot counts what a reservation holds",
                 "[sliding_window][reserve][snapshot]") {
  SECTION("the full log's pushed-out starts count, and the starts ahead leave no room") {
    sliding_type w(io, {.limit = 2, .window = 10ms});
    CHECK(w.try_acquire(2));
    sliding_type::reservation r = w.reserve(2);
    CHECK(r.time_to_act() == at(10ms));
    const auto s = w.snapshot();
    CHECK(s.in_window == 2);
    CHECK(s.available == 0);
    CHECK(s.utilisation == 1.0);
    CHECK(!w.try_acquire(1));
  }
  SECTION("what fits now is what try_acquire takes, the starts ahead counted") {
    sliding_type w(io, {.limit = 4, .window = 10ms});
    CHECK(w.try_acquire(3));
    rein_test::advance_and_poll(io, 1ms);
    sliding_type::reservation r = w.reserve(2);
    CHECK(r.time_to_act() == at(10ms));
    const auto s = w.snapshot();
    CHECK(s.in_window == 3);
    CHECK(s.available == 0);  // a start now would share the window ending at 10 ms with r's 2
    CHECK(!w.try_acquire(1));
    rein_test::advance_and_poll(io, 9ms);
    CHECK(w.snapshot().in_window == 2);
    CHECK(w.snapshot().available == 2);
    CHECK(w.try_acquire(2));
  }
}

TEST_CASE_METHOD(on_manual_clock, "reserve: rate_limits reserve every limit at the latest one's time",
                 "[rate_limits][reserve]") {
  both_type both = make(io, std::type_identity<both_type>{});
  both_type::reservation first = both.reserve(2), second = both.reserve(1);
  CHECK(first.delay() == 0ns);
  // The bucket (2 per second) has the token at 500 ms; the window has room at 1 s.
  CHECK(second.time_to_act() == at(1s));
  waited w;
  second.async_wait(w.handler());
  rein_test::advance_and_poll(io, 1s - 1ns);
  CHECK(!w.ec);
  rein_test::advance_and_poll(io, 1ns);
  CHECK(w.ec == error_code());
  CHECK(w.when == 1s);
  both_type::reservation third = both.reserve(2);
  CHECK(third.time_to_act() == at(2s));  // the window: second's start leaves at 2 s
  rein_test::advance_and_poll(io, 100ms);
  CHECK(third.cancel() == 2);  // on both limits
  CHECK(both.snapshot().reserved_returned_total == 2);
  // The bucket, ready at 1.5 s but held until 2 s, had also taken the token that would have overflowed
  // it meanwhile; that one stays taken: it holds 0.2 at 1.1 s, and the 1 at 1.5 s. The window has room
  // for the 1 beside second's start.
  CHECK(!both.try_acquire(1));
  rein_test::advance_and_poll(io, 400ms);
  CHECK(both.try_acquire(1));
  CHECK(!both.try_acquire(1));
}

TEMPLATE_TEST_CASE("reserve: the contract holds for the windows and rate_limits", "[reserve][contract]", fixed_type,
                   sliding_type, both_type) {
  on_manual_clock clock;
  net::io_context& io = clock.io;
  TestType limiter = make(io, std::type_identity<TestType>{});
  SECTION("a reservation never overtakes a waiter") {
    std::vector<manual_clock::duration> granted;
    auto record = [&](error_code ec) {
      CHECK(!ec);
      granted.push_back(since_epoch());
    };
    limiter.async_acquire(2, record);  // takes the limit
    limiter.async_acquire(1, record);  // waits until 1 s (the bucket of rate_limits: 500 ms, its window: 1 s)
    rein_test::poll(io);
    typename TestType::reservation refused = limiter.reserve(1);
    CHECK(refused.status() == try_status::busy);
    waited w;
    refused.async_wait(w.handler());
    rein_test::advance_and_poll(io, 1s);
    CHECK(w.ec == error_code(net::error::would_block));
    CHECK(granted == std::vector<manual_clock::duration>{0ms, 1s});
  }
  SECTION("bad input and a closed limiter take nothing") {
    typename TestType::reservation too_many = limiter.reserve(3);
    CHECK(too_many.status() == try_status::exceeds_capacity);
    CHECK(too_many.delay() == manual_clock::duration::max());
    waited over, closed;
    too_many.async_wait(over.handler());
    limiter.close();
    typename TestType::reservation after_close = limiter.reserve(1);
    CHECK(after_close.status() == try_status::closed);
    after_close.async_wait(closed.handler());
    rein_test::poll(io);
    CHECK(over.ec == error_code(rein::errc::exceeds_capacity));
    CHECK(closed.ec == error_code(rein::errc::closed));
    CHECK(limiter.snapshot().reserved_total == 0);
  }
  SECTION("close() leaves standing reservations: their waits stay pending, a cancel still gives back") {
    typename TestType::reservation all = limiter.reserve(2), r = limiter.reserve(2), q = limiter.reserve(2);
    CHECK(r.time_to_act() == at(1s));
    waited on_r, on_q;
    r.async_wait(on_r.handler());
    q.async_wait(on_q.handler());
    limiter.close();
    rein_test::poll(io);
    CHECK(!on_r.ec);
    CHECK(!on_q.ec);
    CHECK(q.cancel() == 2);  // the latest: all back
    rein_test::poll(io);
    CHECK(on_q.ec == error_code(net::error::operation_aborted));
    rein_test::advance_and_poll(io, 1s);
    CHECK(on_r.ec == error_code());
    CHECK(on_r.when == 1s);
  }
  SECTION("a wait cancelled through its slot gives the units back") {
    const auto type =
        GENERATE(net::cancellation_type::terminal, net::cancellation_type::partial, net::cancellation_type::total);
    typename TestType::reservation all = limiter.reserve(2), r = limiter.reserve(2);
    CHECK(r.time_to_act() == at(1s));
    net::cancellation_signal signal;
    waited w;
    r.async_wait(net::bind_cancellation_slot(signal.slot(), w.handler()));
    rein_test::advance_and_poll(io, 100ms);
    signal.emit(type);
    rein_test::poll(io);
    CHECK(w.ec == error_code(net::error::operation_aborted));
    CHECK(w.when == 100ms);
    CHECK(r.cancel() == 0);  // already given back
    CHECK(limiter.snapshot().reserved_returned_total == 2);
    CHECK(limiter.reserve(2).time_to_act() == at(1s));  // the 2 are free again
  }
}

// --- throttle.reserve ---

namespace {

using gate_type = rein::basic_quota_gate<net::any_io_executor, manual_clock>;
using sem_type = rein::basic_semaphore<net::any_io_executor, manual_clock>;

rein::quota_gate_options no_jitter() {
  rein::quota_gate_options o;
  o.jitter = 0.0;
  return o;
}

// A gate per key, one call in flight overall, 10 requests/s per key (burst 1), 1000 tokens/s overall.
struct throttled : on_manual_clock {
  rein::keyed<gate_type> gates{io.get_executor(), no_jitter()};
  sem_type global{io.get_executor(), 1};
  rein::keyed<bucket_type> per_key{io.get_executor(), rein::token_bucket_options{.rate = 10, .capacity = 1}};
  bucket_type tokens{io.get_executor(), rein::token_bucket_options{.rate = 1000, .capacity = 1000}};
  rein::throttle<rein::keyed<gate_type>, sem_type, rein::keyed<bucket_type>, decltype(rein::by_tokens(tokens))>
      throttle{gates, global, per_key, rein::by_tokens(tokens)};

  using reservation = decltype(throttle)::reservation;
  using guard = decltype(throttle)::guard;

  auto key_rate(const std::string& key) { return per_key.get(key)->snapshot(); }
};

// Where and how a throttle reservation's wait completed.
struct waited_guard {
  std::optional<error_code> ec;
  throttled::guard guard;
  manual_clock::duration when{};
  auto handler() {
    return [this](error_code e, throttled::guard g) {
      ec = e;
      guard = std::move(g);
      when = since_epoch();
    };
  }
};

// The example of rein::throttle_reservation's documentation.
template <class Throttle>
net::awaitable<void> reserve_or_go_elsewhere(Throttle& throttle, std::string host) {
  auto r = throttle.reserve(host, {.requests = 1, .tokens = 800});
  if (r && r.delay() < 200ms) {
    auto guard = co_await r.wait();  // at time_to_act(), then the other stages, as an acquire
    guard.complete(rein::outcome::success);
  } else {
    r.cancel();  // the reserved units back, by each stage's rule; try elsewhere
  }
}

}  // namespace

TEST_CASE_METHOD(throttled, "throttle reserve: the time to act is the latest stage's, and only that stage reserves",
                 "[throttle][reserve]") {
  reservation first = throttle.reserve("a", {.requests = 1, .tokens = 1000});
  REQUIRE(first.ok());
  CHECK(first.delay() == 0ns);  // both ready now: both reserved
  // The key's rate is ready at 100 ms, the global tokens at 500 ms: the tokens bind, and only they reserve.
  reservation second = throttle.reserve("a", {.requests = 1, .tokens = 500});
  REQUIRE(second.ok());
  CHECK(second.time_to_act() == at(500ms));
  CHECK(second.delay() == 500ms);
  // The key's bucket was not charged by the second: its next request is ready at 100 ms.
  reservation third = throttle.reserve("a");
  CHECK(third.time_to_act() == at(100ms));
  // Another key: its own rate is ready now, the global tokens are owed until 500 ms, and 100 more at 600 ms.
  reservation other = throttle.reserve("b", {.requests = 1, .tokens = 100});
  CHECK(other.time_to_act() == at(600ms));
  CHECK(key_rate("a").reserved_total == 2);
  CHECK(key_rate("b").reserved_total == 0);
  CHECK(tokens.snapshot().reserved_total == 3);
}

TEST_CASE_METHOD(throttled, "throttle reserve: the wait takes the permit at the time to act, or when it frees",
                 "[throttle][reserve]") {
  reservation first = throttle.reserve("a", {.requests = 1, .tokens = 10});
  reservation second = throttle.reserve("a", {.requests = 1, .tokens = 10});
  CHECK(second.delay() == 100ms);
  waited_guard w1;
  waited_guard w2;
  first.async_wait(w1.handler());
  second.async_wait(w2.handler());
  rein_test::poll(io);
  REQUIRE(w1.ec == error_code());
  CHECK(w1.guard);
  CHECK(w1.when == 0ms);
  CHECK(global.available() == 0);
  CHECK(w1.guard.charged().tokens == 10);
  rein_test::advance_and_poll(io, 100ms);
  CHECK_FALSE(w2.ec);  // its time, but the permit is the first's
  rein_test::advance_and_poll(io, 50ms);
  w1.guard.complete(rein::outcome::success);
  rein_test::poll(io);
  REQUIRE(w2.ec == error_code());
  CHECK(w2.guard);
  CHECK(w2.when == 150ms);
  CHECK(global.available() == 0);
  // The first's units were its reservations' (spent at its admission, counted as the stages' grants). The
  // second reserved the key's rate only (its binding stage); at 100 ms it had to wait for the permit, so
  // its key unit went back then, and its admission at 150 ms took both rates as an acquire does.
  CHECK(key_rate("a").reserved_total == 2);
  CHECK(key_rate("a").reservations_cancelled_total == 1);
  CHECK(key_rate("a").acquired_total == 2);
  CHECK(tokens.snapshot().reserved_total == 1);
  CHECK(tokens.snapshot().acquired_total == 2);
  const rein::throttle_snapshot s = throttle.snapshot();
  CHECK(s.admitted_total == 2);
  CHECK(s.stages[2].admitted == 2);
  CHECK(s.stages[3].admitted == 2);
  // The sum rule holds at the rate stages (finding 5 of the first version's review).
  CHECK(key_rate("a").acquired_total == s.stages[2].acquired());
  CHECK(tokens.snapshot().acquired_total == s.stages[3].acquired());
  // After the grant, cancel gives nothing.
  second.cancel();
  CHECK(key_rate("a").reservations_cancelled_total == 1);
  waited_guard again;
  second.async_wait(again.handler());
  rein_test::poll(io);
  CHECK(again.ec == error_code(net::error::already_started));
}

TEST_CASE_METHOD(throttled, "throttle reserve: cancel gives the reserved units back, as the next delay shows",
                 "[throttle][reserve]") {
  reservation first = throttle.reserve("a", {.requests = 1, .tokens = 1000});
  reservation second = throttle.reserve("a", {.requests = 1, .tokens = 500});
  CHECK(second.time_to_act() == at(500ms));
  second.cancel();
  CHECK(key_rate("a").reserved_total == 1);  // the key's rate was ready earlier: never reserved by the second
  CHECK(tokens.snapshot().reserved_returned_total == 500);
  reservation third = throttle.reserve("a", {.requests = 1, .tokens = 500});
  CHECK(third.time_to_act() == at(500ms));
  second.cancel();  // a second cancel gives nothing
  CHECK(tokens.snapshot().reservations_cancelled_total == 1);
  waited_guard w;
  second.async_wait(w.handler());
  rein_test::poll(io);
  CHECK(w.ec == error_code(net::error::operation_aborted));
  CHECK_FALSE(w.guard);
}

TEST_CASE_METHOD(throttled, "throttle reserve: a paused gate refuses and nothing is reserved", "[throttle][reserve]") {
  gates.get("a")->pause_for(1s);
  reservation r = throttle.reserve("a", {.requests = 1, .tokens = 100});
  CHECK_FALSE(r);
  CHECK(r.status() == try_status::busy);
  CHECK(r.rejected_at() == rein::throttle_stage::gate);
  CHECK(r.rejected_stage() == 0);
  CHECK(r.delay() == manual_clock::duration::max());
  CHECK(key_rate("a").reserved_total == 0);
  CHECK(tokens.snapshot().reserved_total == 0);
  waited_guard w;
  r.async_wait(w.handler());
  rein_test::poll(io);
  CHECK(w.ec == error_code(net::error::would_block));
  CHECK(w.guard.rejected_at() == rein::throttle_stage::gate);
  CHECK(throttle.reserve("b", {.requests = 1, .tokens = 1000}).delay() == 0ns);  // other keys go on
}

TEST_CASE_METHOD(throttled, "throttle reserve: a wait cancelled through its slot gives the units back",
                 "[throttle][reserve]") {
  reservation first = throttle.reserve("a", {.requests = 1, .tokens = 1000});
  reservation second = throttle.reserve("a", {.requests = 1, .tokens = 500});
  net::cancellation_signal before;
  waited_guard w;
  second.async_wait(net::bind_cancellation_slot(before.slot(), w.handler()));
  rein_test::advance_and_poll(io, 100ms);
  before.emit(net::cancellation_type::terminal);
  rein_test::poll(io);
  CHECK(w.ec == error_code(net::error::operation_aborted));
  CHECK(w.when == 100ms);
  CHECK(tokens.snapshot().reserved_returned_total == 500);
  CHECK(key_rate("a").reserved_total == 1);  // the first's only

  // At its time the permit is held: the units go back then (the call waits as an acquire), and the wait
  // ends aborted.
  waited_guard holder;
  first.async_wait(holder.handler());
  reservation third = throttle.reserve("a", {.requests = 1, .tokens = 500});
  CHECK(third.time_to_act() == at(500ms));
  net::cancellation_signal after;
  waited_guard w3;
  third.async_wait(net::bind_cancellation_slot(after.slot(), w3.handler()));
  rein_test::advance_and_poll(io, 400ms);
  CHECK(tokens.snapshot().reserved_returned_total == 1000);  // the third's 500 back at 500 ms, to wait
  rein_test::advance_and_poll(io, 200ms);
  CHECK(holder.guard);
  CHECK_FALSE(w3.ec);
  after.emit(net::cancellation_type::terminal);
  rein_test::poll(io);
  CHECK(w3.ec == error_code(net::error::operation_aborted));
  CHECK(w3.when == 700ms);
  CHECK(tokens.snapshot().reserved_returned_total == 1000);  // nothing more
  CHECK(throttle.snapshot().cancelled_total == 2);
}

TEST_CASE_METHOD(throttled, "throttle reserve: a closed rate stage refuses; a closed permit stage fails the wait",
                 "[throttle][reserve]") {
  tokens.close();
  reservation r = throttle.reserve("a", {.requests = 1, .tokens = 10});
  CHECK(r.status() == try_status::closed);
  CHECK(r.rejected_at() == rein::throttle_stage::rate);
  CHECK(r.rejected_stage() == 3);
  CHECK(r.error() == rein::errc::closed);
  // The closed stage refuses at its reserve, after the key's rate reserved: that reservation is cancelled
  // with every unit back (the first version's review found the key's bucket drained here), and the unit is
  // there for the next.
  CHECK(key_rate("a").reserved_total == 1);
  CHECK(key_rate("a").reservations_cancelled_total == 1);
  CHECK(key_rate("a").reserved_returned_total == 1);
  CHECK(key_rate("a").tokens == 1);
  CHECK(throttle.reserve("a").delay() == 0ns);  // no tokens charged: the closed stage is not asked

  reservation later = throttle.reserve("b");
  global.close();
  waited_guard w;
  later.async_wait(w.handler());
  rein_test::poll(io);
  CHECK(w.ec == rein::errc::closed);
  CHECK(w.guard.rejected_at() == rein::throttle_stage::global);
  CHECK(key_rate("b").reserved_returned_total == 1);  // failed at its time to act: given back by the rule
}

TEST_CASE_METHOD(throttled, "throttle reserve: co_await r.wait() hands out the guard; the example goes elsewhere",
                 "[throttle][reserve]") {
  net::co_spawn(io, reserve_or_go_elsewhere(throttle, "a"), net::detached);
  rein_test::poll(io);
  CHECK(throttle.snapshot().admitted_total == 1);
  CHECK(global.available() == 1);  // completed
  // Another key holds the tokens until 600 ms: "a"'s 800 are 1400 ms away (its key rate, ready at 100 ms,
  // is not reserved): it cancels, giving the tokens back.
  reservation hold = throttle.reserve("b", {.requests = 1, .tokens = 800});
  CHECK(hold.time_to_act() == at(600ms));
  net::co_spawn(io, reserve_or_go_elsewhere(throttle, "a"), net::detached);
  rein_test::poll(io);
  CHECK(throttle.snapshot().admitted_total == 1);
  CHECK(key_rate("a").reserved_total == 1);
  CHECK(tokens.snapshot().reservations_cancelled_total == 1);
  CHECK(tokens.snapshot().reserved_returned_total == 800);

  // A failed wait throws the throttle's error, naming the key.
  reservation refused = throttle.reserve("a", {.requests = 1, .tokens = 5000});
  CHECK(refused.status() == try_status::exceeds_capacity);
  std::optional<std::string> thrown;
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        try {
          co_await refused.wait();
        } catch (const rein::throttle_error& e) {
          thrown = e.key();
        }
      },
      net::detached);
  rein_test::poll(io);
  CHECK(thrown == "a");

  // The awaitable holds the reservation's state, not the reservation object.
  std::optional<reservation> moved(throttle.reserve("c"));
  net::awaitable<guard> later = moved->wait();
  moved.reset();
  bool granted = false;
  net::co_spawn(io, std::move(later), [&](std::exception_ptr e, guard g) { granted = !e && static_cast<bool>(g); });
  rein_test::poll(io);
  CHECK(granted);
}

TEST_CASE_METHOD(throttled, "throttle reserve: a gate paused after the reserve: the units go back, then as an acquire",
                 "[throttle][reserve]") {
  reservation r = throttle.reserve("a", {.requests = 1, .tokens = 100});
  REQUIRE(r.time_to_act() == at(0ms));
  gates.get("a")->pause_for(1s);
  waited_guard w;
  r.async_wait(w.handler());
  rein_test::poll(io);
  rein_test::advance_and_poll(io, 999ms);
  CHECK_FALSE(w.ec);
  rein_test::advance_and_poll(io, 1ms);
  REQUIRE(w.ec == error_code());
  CHECK(w.guard);
  CHECK(w.when == 1s);
  // Given back at 0 ms, before the wait at the gate; taken again at 1 s, when the call could send.
  CHECK(key_rate("a").reservations_cancelled_total == 1);
  CHECK(tokens.snapshot().reservations_cancelled_total == 1);
  CHECK(tokens.snapshot().reserved_returned_total == 100);
  CHECK(key_rate("a").acquired_total == 1);
  CHECK(tokens.snapshot().acquired_total == 1);
  CHECK(tokens.snapshot().tokens == 900);
  CHECK(throttle.snapshot().wait.count() == 1);
}

TEST_CASE_METHOD(on_manual_clock, "throttle reserve: an admission stage decides at reserve, and only there",
                 "[throttle][reserve][admission_throttle]") {
  rein::basic_admission_throttle<manual_clock> admit({.window = 10s, .seed = 7});
  bucket_type rate(io, {.rate = 1000, .capacity = 1000});
  rein::throttle throttle(admit, rate);
  // An upstream that refused every call: the stage now refuses most.
  for (int i = 0; i < 100; ++i) {
    if (admit.try_acquire()) admit.record(rein::outcome::congestion);
  }
  const auto asked = [&admit] { return admit.snapshot().acquired_total + admit.snapshot().rejected_total; };
  std::optional<decltype(throttle)::reservation> refused;
  std::optional<decltype(throttle)::reservation> admitted;
  std::uint64_t ok = 0;
  std::uint64_t tries = 0;
  const std::uint64_t asked_before = asked();
  for (; tries < 100 && !(refused && admitted); ++tries) {
    auto r = throttle.reserve("a");
    if (r) {
      ++ok;
      admitted.emplace(std::move(r));
    } else if (!refused) {
      refused.emplace(std::move(r));
    }
  }
  REQUIRE(refused);
  REQUIRE(admitted);
  CHECK(refused->status() == try_status::busy);
  CHECK(refused->rejected_at() == rein::throttle_stage::admission);
  CHECK(refused->rejected_stage() == 0);
  CHECK(refused->error() == rein::errc::admission_refused);
  CHECK(rate.snapshot().reserved_total == ok);  // the refused took nothing
  CHECK(asked() == asked_before + tries);        // each reserve asked once
  waited w;
  std::optional<decltype(throttle)::guard> g;
  admitted->async_wait([&](error_code ec, decltype(throttle)::guard granted) {
    w.ec = ec;
    g.emplace(std::move(granted));
  });
  rein_test::poll(io);
  REQUIRE(w.ec == error_code());
  CHECK(asked() == asked_before + tries);  // not asked again by the wait
  g->complete(rein::outcome::success);
  CHECK(admit.snapshot().accepts == 1);
}

TEST_CASE_METHOD(throttled, "throttle reserve: once the wait reached its time, cancel gives nothing and the wait goes on",
                 "[throttle][reserve]") {
  reservation first = throttle.reserve("a", {.requests = 1, .tokens = 10});
  reservation second = throttle.reserve("a", {.requests = 1, .tokens = 10});
  waited_guard holder;
  first.async_wait(holder.handler());
  waited_guard w;
  second.async_wait(w.handler());
  rein_test::advance_and_poll(io, 100ms);  // its time: waiting for the permit the first holds
  REQUIRE(holder.guard);
  CHECK_FALSE(w.ec);
  CHECK(key_rate("a").reservations_cancelled_total == 1);  // let go by the wait, to wait for the permit
  second.cancel();  // past its time, with a wait: gives nothing, ends nothing
  CHECK(key_rate("a").reservations_cancelled_total == 1);
  CHECK(tokens.snapshot().reservations_cancelled_total == 0);
  holder.guard.complete(rein::outcome::success);
  rein_test::poll(io);
  REQUIRE(w.ec == error_code());
  CHECK(w.guard);
  CHECK(w.when == 100ms);
  CHECK(throttle.reserve("a").time_to_act() == at(200ms));  // the key's second unit was spent at 100 ms
}

// One test per finding of the first version's review (which reserved every rate stage at the latest
// stage's time), each on the rule that replaced it; findings 2 and 5 are also checked above (a closed
// stage, the sum rule). Each of the next five tests failed when this file was built against the first
// version.

TEST_CASE_METHOD(on_manual_clock, "throttle reserve: a slow key's reservation never holds a global rate for others",
                 "[throttle][reserve]") {
  rein::keyed<bucket_type> per_key{io.get_executor(), rein::token_bucket_options{.rate = 0.1, .capacity = 1}};
  bucket_type global(io, {.rate = 10, .capacity = 10});
  rein::throttle throttle(per_key, global);
  auto first = throttle.reserve("slow");
  auto second = throttle.reserve("slow");
  CHECK(first.time_to_act() == at(0ms));
  CHECK(second.time_to_act() == at(10s));
  // Only the key's rate binds the second: the global unit is taken by its wait, at 10 s.
  CHECK(global.snapshot().reserved_total == 1);
  CHECK(global.snapshot().tokens == 9);
  for (int i = 0; i < 9; ++i) CHECK(throttle.reserve("k" + std::to_string(i)).delay() == 0ns);
  CHECK(throttle.reserve("k9").time_to_act() == at(100ms));
  waited w;
  second.async_wait([&](error_code ec, decltype(throttle)::guard) { w.ec = ec; });
  rein_test::poll(io);
  rein_test::advance_and_poll(io, 10s);
  CHECK(w.ec == error_code());
  CHECK(global.snapshot().acquired_total == 1);  // the second's, taken at 10 s (the others were not waited)
  CHECK(global.snapshot().reserved_total == 11);
}

TEST_CASE_METHOD(on_manual_clock, "throttle reserve: cancel leaves a stage ready earlier as it was",
                 "[throttle][reserve]") {
  rein::keyed<fixed_type> per_key{io.get_executor(), rein::basic_fixed_window_options<manual_clock::duration>{
                                                         .limit = 1, .window = 1s}};
  bucket_type global(io, {.rate = 10, .capacity = 10});
  rein::throttle throttle(per_key, global);
  auto first = throttle.reserve("a");
  CHECK(global.snapshot().tokens == 9);
  auto second = throttle.reserve("a");  // the key's next window binds; the global bucket is ready now
  CHECK(second.time_to_act() == at(1s));
  CHECK(global.snapshot().tokens == 9);
  second.cancel();
  CHECK(global.snapshot().tokens == 9);
  CHECK(per_key.get("a")->snapshot().reserved_returned_total == 1);
  CHECK(throttle.reserve("b").delay() == 0ns);
}

TEST_CASE_METHOD(on_manual_clock, "throttle reserve: calls held at a paused gate are paced at its reopening",
                 "[throttle][reserve]") {
  rein::keyed<gate_type> gates{io.get_executor(), no_jitter()};
  rein::keyed<bucket_type> per_key{io.get_executor(), rein::token_bucket_options{.rate = 10, .capacity = 1}};
  rein::throttle throttle(gates, per_key);
  std::vector<decltype(throttle)::reservation> rs;
  for (int i = 0; i < 3; ++i) rs.push_back(throttle.reserve("a"));
  CHECK(rs[2].time_to_act() == at(200ms));
  gates.get("a")->pause_for(1s);
  std::vector<manual_clock::duration> admitted;
  for (auto& r : rs)
    r.async_wait([&](error_code ec, decltype(throttle)::guard g) {
      if (!ec && g) admitted.push_back(since_epoch());
    });
  rein_test::poll(io);
  for (int i = 0; i < 12; ++i) rein_test::advance_and_poll(io, 100ms);
  // As acquires paced: the reserved units went back when each wait met the pause.
  CHECK(admitted == std::vector<manual_clock::duration>{1s, 1100ms, 1200ms});
  CHECK(per_key.get("a")->snapshot().reservations_cancelled_total == 3);
}

TEST_CASE_METHOD(on_manual_clock, "throttle reserve: reconcile down gives back as an acquire's guard does",
                 "[throttle][reserve]") {
  bucket_type tokens(io, {.rate = 1000, .capacity = 1000});
  rein::throttle throttle(rein::by_tokens(tokens));
  auto r = throttle.reserve("k", {.requests = 1, .tokens = 800});
  std::optional<decltype(throttle)::guard> g;
  r.async_wait([&](error_code ec, decltype(throttle)::guard x) {
    if (!ec) g.emplace(std::move(x));
  });
  rein_test::poll(io);  // admitted at its time to act, 0 ms
  REQUIRE(g);
  CHECK(tokens.snapshot().tokens == 200);
  g->reconcile({.requests = 1, .tokens = 100});
  CHECK(tokens.snapshot().tokens == 900);
  g->complete(rein::outcome::success);
  // The sum rule: the stage counts the reservation's grant, as the throttle does.
  CHECK(tokens.snapshot().acquired_total == 1);
  CHECK(throttle.snapshot().stages[0].acquired() == 1);
  CHECK(throttle.snapshot().stages[0].admitted == 1);
}

TEST_CASE_METHOD(throttled, "throttle reserve: cancel once the clock passed the time to act leaves the wait alone",
                 "[throttle][reserve]") {
  throttle.reserve("a");  // spent at once (dropped)
  reservation r = throttle.reserve("a");
  REQUIRE(r.time_to_act() == at(100ms));
  waited_guard w;
  r.async_wait(w.handler());
  rein_test::poll(io);
  manual_clock::advance(100ms);  // its time, before the wait's coroutine resumed
  r.cancel();
  CHECK(key_rate("a").reservations_cancelled_total == 0);
  rein_test::poll(io);
  REQUIRE(w.ec == error_code());
  CHECK(w.guard);
  CHECK(w.when == 100ms);
}

TEST_CASE("throttle reserve: on a running clock, stages ready now reserve at the clock's time", "[throttle][reserve]") {
  // Between the look at the stages and their reserve the steady clock moves on: a stage ready at the look
  // answers the later instant, which binds all the same (not a race to retry, which would end busy).
  net::io_context io;
  rein::keyed<rein::token_bucket> per_key{io.get_executor(), rein::token_bucket_options{.rate = 1e6, .capacity = 1000000}};
  rein::token_bucket global(io, {.rate = 1e6, .capacity = 1000000});
  rein::throttle throttle(per_key, global);
  for (int i = 0; i < 100; ++i) {
    auto r = throttle.reserve("a");
    REQUIRE(r.ok());
    CHECK(r.delay() == 0ns);
  }
}

// A wait that fails after its time to act but before the admission's first step (its slot cancelled, or
// the throttle gone, while the wait's coroutine had not resumed) gives the reserved units back as a claim
// is let go: a refund once the time has passed. (A stage reservation's cancel, used before, gives nothing
// then: the unit was lost, and on a running clock the wait always resumes after the time.)
TEST_CASE_METHOD(on_manual_clock, "throttle reserve: a wait failing past its time gives the units back",
                 "[throttle][reserve]") {
  bucket_type global{io.get_executor(), rein::token_bucket_options{.rate = 10, .capacity = 5}};
  REQUIRE(global.try_acquire(5));
  SECTION("its slot cancelled") {
    rein::throttle throttle(global);
    auto r = throttle.reserve("a");
    REQUIRE(r.time_to_act() == at(100ms));
    net::cancellation_signal signal;
    std::optional<error_code> ec;
    r.async_wait(net::bind_cancellation_slot(signal.slot(), [&](error_code e, auto) { ec = e; }));
    rein_test::poll(io);
    manual_clock::advance(150ms);
    signal.emit(net::cancellation_type::terminal);
    rein_test::poll(io);
    CHECK(ec == error_code(net::error::operation_aborted));
  }
  SECTION("the throttle gone") {
    std::optional<error_code> ec;
    {
      rein::throttle throttle(global);
      auto r = throttle.reserve("a");
      REQUIRE(r.time_to_act() == at(100ms));
      r.async_wait([&](error_code e, auto) { ec = e; });
      rein_test::poll(io);
    }
    manual_clock::advance(150ms);
    rein_test::poll(io);
    CHECK(ec == error_code(net::error::operation_aborted));
  }
  // -1 at 0, +1.5 by 150 ms, and the reserved 1 refunded.
  CHECK(global.snapshot().tokens == 1.5);
  CHECK(global.snapshot().acquired_total == 1);  // the try_acquire(5); nothing admitted
}

// A rate_limits stage (all_of) reserves through a throttle exactly as alone: the throttle looks at its
// stages without reserving anything (a reserve(0) on an all_of whose parts hold a reservation asserted).
TEST_CASE_METHOD(on_manual_clock, "throttle reserve: a rate_limits stage reserves as it does alone",
                 "[throttle][reserve]") {
  auto make = [&] {
    const auto now = manual_clock::now();
    return both_type(io, rein::algo::all_of{
                             rein::algo::basic_token_bucket<manual_clock>({.rate = 2, .capacity = 2}, now),
                             rein::algo::basic_sliding_window<manual_clock>({.limit = 2, .window = 1s}, now)});
  };
  both_type alone = make();
  both_type staged = make();
  rein::throttle throttle(rein::by_tokens(staged));
  std::vector<both_type::reservation> kept_alone;
  std::vector<decltype(throttle)::reservation> kept_staged;
  std::vector<manual_clock::duration> times_alone, times_staged;
  for (int i = 0; i < 6; ++i) {
    if (i == 3) rein_test::advance_and_poll(io, 300ms);
    const std::size_t n = 1 + static_cast<std::size_t>(i % 2);
    kept_alone.push_back(alone.reserve(n));
    kept_staged.push_back(throttle.reserve("a", {.requests = 1, .tokens = n}));
    times_alone.push_back(kept_alone.back().time_to_act() - at(0ms));
    times_staged.push_back(kept_staged.back().time_to_act() - at(0ms));
  }
  CHECK(times_staged == times_alone);
  CHECK(times_staged == std::vector<manual_clock::duration>{0ms, 1s, 2s, 3s, 4s, 5s});
  CHECK(staged.snapshot().reserved_total == 6);
}
