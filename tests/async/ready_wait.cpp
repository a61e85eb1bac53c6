// Ready waits on a rate limiter's line (limiter_core::async_ready, try_claim, take_claim, drop_claim): a wait
// granted when the rule could take n, taking nothing, whose grant keeps the room for its waiter until it
// takes it or gives it up. The throttle's step 3 is built on them (tests/async/throttle_order.cpp). Manual
// clock, exact: a token bucket of 100/s with a burst of 1 (one token every 10 ms).
#include "support/async.hpp"
#include "support/catch.hpp"

#include <rein/detail/rate_claim.hpp>
#include <rein/token_bucket.hpp>

#include <chrono>
#include <memory>

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
using rein::error_code;
using rein_test::manual_clock;
using rein_test::poll;

using bucket_type = rein::basic_token_bucket<net::any_io_executor, manual_clock>;
using tp = manual_clock::time_point;
using record = rein_test::completion_record<error_code>;

bucket_type make_bucket(net::io_context& io) {
  return bucket_type(io.get_executor(), rein::token_bucket_options{.rate = 100, .capacity = 1});
}

auto* line_of(const bucket_type& b) { return rein::detail::rate_line_access::line(b); }

std::shared_ptr<record> ready(bucket_type& b, std::size_t n, tp deadline = tp::max()) {
  auto [handler, done] = rein_test::make_checked<error_code>();
  line_of(b)->async_ready(std::move(handler), n, deadline);
  return done;
}

std::shared_ptr<record> acquire(bucket_type& b, std::size_t n) {
  auto [handler, done] = rein_test::make_checked<error_code>();
  b.async_acquire(n, std::move(handler));
  return done;
}

bool ok(const std::shared_ptr<record>& r) { return r->called() && !r->ec(); }

}  // namespace

TEST_CASE("ready wait: the room it keeps is taken by nobody else, and the bucket keeps its tokens",
          "[core][ready]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  bucket_type bucket = make_bucket(io);
  auto* line = line_of(bucket);
  REQUIRE(line->try_claim(1));  // the full bucket's token, kept
  CHECK(line->claimed() == 1);
  CHECK(bucket.tokens() == 1.0);  // nothing taken
  CHECK_FALSE(bucket.try_acquire(1));
  CHECK_FALSE(line->try_claim(1));  // the room is kept for the first claim only
  CHECK(line->take_claim(1) == rein::try_status::acquired);
  CHECK(line->claimed() == 0);
  CHECK(bucket.tokens() == 0.0);
  CHECK(bucket.snapshot().acquired_total == 1);  // the take is the acquisition; the claim was none

  auto w = ready(bucket, 1);
  poll(io);
  CHECK_FALSE(w->called());
  rein_test::advance_and_poll(io, 10ms);
  REQUIRE(ok(w));
  CHECK(line->claimed() == 1);
  CHECK(bucket.tokens() == 1.0);
  line->drop_claim(1);  // given up: the token is anyone's
  CHECK(static_cast<bool>(bucket.try_acquire(1)));
}

TEST_CASE("ready wait: ready waits and acquires share the line's order, and the room kept holds the line",
          "[core][ready]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  bucket_type bucket = make_bucket(io);
  REQUIRE(static_cast<bool>(bucket.try_acquire(1)));  // empty until 10 ms
  auto a0 = acquire(bucket, 1);
  auto r1 = ready(bucket, 1);
  auto a2 = acquire(bucket, 1);
  poll(io);
  rein_test::advance_and_poll(io, 10ms);
  CHECK(ok(a0));
  CHECK_FALSE(r1->called());
  rein_test::advance_and_poll(io, 10ms);
  REQUIRE(ok(r1));
  CHECK_FALSE(a2->called());
  rein_test::advance_and_poll(io, 20ms);  // a token came at 30 ms: kept for r1's waiter, not a2's
  CHECK_FALSE(a2->called());
  CHECK(line_of(bucket)->take_claim(1) == rein::try_status::acquired);  // at 40 ms
  poll(io);
  CHECK_FALSE(a2->called());
  rein_test::advance_and_poll(io, 10ms);
  CHECK(ok(a2));
  CHECK(bucket.snapshot().acquired_total == 4);
}

TEST_CASE("ready wait: a grant revoked by a late cancellation gives its room to the next waiter",
          "[core][ready][cancel]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  bucket_type bucket = make_bucket(io);
  net::cancellation_signal signal;
  auto [handler, cancelled] = rein_test::make_checked<error_code>();
  line_of(bucket)->async_ready(net::bind_cancellation_slot(signal.slot(), std::move(handler)), 1, tp::max());
  CHECK(line_of(bucket)->claimed() == 1);  // granted at once, not yet delivered
  auto next = acquire(bucket, 1);          // behind the room kept
  signal.emit(net::cancellation_type::terminal);
  poll(io);
  CHECK(cancelled->ec() == error_code(net::error::operation_aborted));
  CHECK(ok(next));
  CHECK(line_of(bucket)->claimed() == 0);
  CHECK(bucket.snapshot().acquired_total == 1);
}

TEST_CASE("ready wait: a grant whose handler never runs, or on its way at shutdown, gives its room back",
          "[core][ready][lifetime]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  SECTION("its execution context destroyed with the completion queued") {
    bucket_type bucket = make_bucket(io);
    auto other = std::make_unique<net::io_context>();
    auto [handler, lost] = rein_test::make_checked<error_code>();
    lost->may_be_destroyed_uncalled = true;
    line_of(bucket)->async_ready(net::bind_executor(other->get_executor(), std::move(handler)), 1, tp::max());
    CHECK(line_of(bucket)->claimed() == 1);
    other.reset();
    CHECK(line_of(bucket)->claimed() == 0);
    CHECK(static_cast<bool>(bucket.try_acquire(1)));
  }
  SECTION("the limiter destroyed") {
    auto bucket = std::make_unique<bucket_type>(make_bucket(io));
    auto w = ready(*bucket, 1);
    bucket.reset();
    poll(io);
    CHECK(w->ec() == error_code(net::error::operation_aborted));
  }
}

TEST_CASE("ready wait: errors as an acquire's: exceeds_capacity, timed_out judged at once, closed",
          "[core][ready]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  bucket_type bucket = make_bucket(io);
  REQUIRE(static_cast<bool>(bucket.try_acquire(1)));
  auto too_big = ready(bucket, 2);
  auto hopeless = ready(bucket, 1, tp(9ms));
  auto waiting = ready(bucket, 1);
  poll(io);
  CHECK(too_big->ec() == error_code(rein::errc::exceeds_capacity));
  CHECK(hopeless->ec() == error_code(rein::errc::timed_out));
  CHECK_FALSE(waiting->called());
  bucket.close();
  poll(io);
  CHECK(waiting->ec() == error_code(rein::errc::closed));
  CHECK_FALSE(line_of(bucket)->try_claim(1));
  CHECK(line_of(bucket)->claimed() == 0);
}
