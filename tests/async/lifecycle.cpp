// What a service relies on across every primitive, on the manual clock: permits that outlive their limiter,
// limiters that move, timeouts too long to represent, grants revoked by a late cancellation (tokens come
// back), waits that can never be granted, and the counted acquire of the adaptive limiter.
#include "support/async.hpp"
#include "support/catch.hpp"

#include <rein/adaptive_limiter.hpp>
#include <rein/adaptive_rate_limiter.hpp>
#include <rein/algo/aimd.hpp>
#include <rein/error.hpp>
#include <rein/permit.hpp>
#include <rein/quota_gate.hpp>
#include <rein/semaphore.hpp>
#include <rein/sliding_window.hpp>
#include <rein/token_bucket.hpp>

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
using rein::errc;
using rein::error_code;
using rein::permit;
using rein_test::manual_clock;
using rein_test::poll;

using time_point = manual_clock::time_point;
using duration = manual_clock::duration;
using semaphore = rein::basic_semaphore<net::any_io_executor, manual_clock>;
using bucket = rein::basic_token_bucket<net::any_io_executor, manual_clock>;
using window = rein::basic_sliding_window<net::any_io_executor, manual_clock>;
using gate = rein::basic_quota_gate<net::any_io_executor, manual_clock>;
using adaptive_rate = rein::basic_adaptive_rate_limiter<net::any_io_executor, manual_clock>;
using aimd = rein::basic_adaptive_limiter<rein::algo::aimd, net::any_io_executor, manual_clock>;

const error_code aborted = net::error::operation_aborted;

using rate_record = rein_test::completion_record<error_code>;

// A waited acquire of a rate limiter (`void(error_code)`), optionally bound to a cancellation signal.
template <class Limiter>
std::shared_ptr<rate_record> start_rate(Limiter& l, std::size_t n, duration timeout,
                                        net::cancellation_signal* signal = nullptr) {
  auto [handler, done] = rein_test::make_checked<error_code>();
  if (signal != nullptr)
    l.async_acquire_for(n, timeout, net::bind_cancellation_slot(signal->slot(), std::move(handler)));
  else
    l.async_acquire_for(n, timeout, std::move(handler));
  return done;
}

template <class Limiter>
std::shared_ptr<rein_test::acquire_record> start_permit(Limiter& l, std::size_t n, duration timeout) {
  auto [handler, done] = rein_test::checked_acquire();
  l.async_acquire_for(n, timeout, std::move(handler));
  return done;
}

// Moves the manual clock off its epoch, so that `now + duration::max()` would overflow.
void start_late() {
  manual_clock::reset();
  manual_clock::advance(10s);
}

}  // namespace

// ---- Permits that outlive their limiter ------------------------------------------------------------------
// Under AddressSanitizer these are the proof: the release touches only state the permit keeps alive.

TEST_CASE("a semaphore permit given back after the semaphore was destroyed is safe", "[lifecycle][permit]") {
  net::io_context io;
  permit held;
  permit part;
  {
    semaphore sem(io, 3);
    held = sem.try_acquire(3);
    REQUIRE(held);
    part = held.split(1);  // two permit objects now report back to one limiter
    auto waiter = start_permit(sem, 1, duration::max());
    poll(io);
    CHECK_FALSE(waiter->called());
  }  // the waiter completes with operation_aborted; the permits stay
  poll(io);
  CHECK(held.count() == 2);
  held.release();
  part.complete(rein::outcome::success);
  CHECK_FALSE(held);
  CHECK_FALSE(part);
}

TEST_CASE("an adaptive limiter's permit may outlive it and report an outcome", "[lifecycle][permit]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  std::optional<aimd> limiter(std::in_place, io, rein::algo::aimd_options{.initial_limit = 2, .max_limit = 4});
  permit p = limiter->try_acquire();
  REQUIRE(p);
  limiter.reset();
  p.complete(rein::outcome::congestion);
  CHECK_FALSE(p);
}

TEST_CASE("a grant delivered after its semaphore was destroyed gives nothing and leaks nothing",
          "[lifecycle][permit]") {
  net::io_context io;
  auto sem = std::make_unique<semaphore>(io, 1);
  permit first = sem->try_acquire();
  auto second = start_permit(*sem, 1, duration::max());
  first.release();  // granted to the waiter; its handler is queued
  sem.reset();
  poll(io);
  REQUIRE(second->called());
  CHECK(second->ec() == aborted);
  CHECK_FALSE(second->get<1>());
}

// ---- Limiters that move ------------------------------------------------------------------------------------

TEST_CASE("a moved semaphore keeps its permits and waiters", "[lifecycle][move]") {
  net::io_context io;
  semaphore a(io, 1);
  permit p = a.try_acquire();
  auto waiter = start_permit(a, 1, duration::max());
  semaphore b(std::move(a));
  CHECK(b.available() == 0);
  p.release();  // the permit reports to the state b now owns
  poll(io);
  REQUIRE(waiter->called());
  CHECK_FALSE(waiter->ec());
  CHECK(b.snapshot().in_flight == 1);
  waiter->get<1>().release();
  CHECK(b.available() == 1);
}

TEST_CASE("move-assigning a semaphore shuts the old state down first", "[lifecycle][move]") {
  net::io_context io;
  semaphore a(io, 1);
  semaphore b(io, 5);
  permit pa = a.try_acquire();
  auto waiting_on_b = start_permit(b, 6, duration::max());  // exceeds the total: fails at once
  permit pb = b.try_acquire(5);
  auto parked_on_b = start_permit(b, 1, duration::max());
  b = std::move(a);
  poll(io);
  CHECK(waiting_on_b->ec() == errc::exceeds_capacity);
  CHECK(parked_on_b->ec() == aborted);  // b's old waiters end as at destruction
  pb.release();                         // b's old permit: safe, changes nothing
  CHECK(b.available() == 0);
  pa.release();
  CHECK(b.available() == 1);
}

TEST_CASE("token buckets and adaptive limiters move too", "[lifecycle][move]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  bucket a(io, {.rate = 10, .capacity = 2});
  CHECK(a.try_acquire());
  bucket b(std::move(a));
  CHECK(b.try_acquire());
  CHECK_FALSE(b.try_acquire());
  aimd l1(io, rein::algo::aimd_options{.initial_limit = 1, .max_limit = 4});
  permit p = l1.try_acquire();
  aimd l2(std::move(l1));
  CHECK_FALSE(l2.try_acquire());
  p.release();
  CHECK(l2.try_acquire());
}

TEST_CASE("a moved quota gate keeps its pause, its waiters and its counters", "[lifecycle][move]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  gate a(io, {.jitter = 0});
  a.pause_for(1s);
  auto first = start_rate(a, 1, duration::max());
  gate b(std::move(a));
  auto second = start_rate(b, 1, 2s);  // arrives after the move, behind the first
  CHECK(b.paused_until() == time_point{} + 1s);
  CHECK(b.is_paused());
  CHECK_FALSE(b.try_acquire());
  rein_test::advance_and_poll(io, 999ms);
  CHECK_FALSE(first->called());
  CHECK_FALSE(second->called());
  rein_test::advance_and_poll(io, 1ms);  // the pause ends at exactly 1 s, for both, in order
  REQUIRE(first->called());
  CHECK_FALSE(std::get<0>(*first->args));
  REQUIRE(second->called());
  CHECK_FALSE(std::get<0>(*second->args));
  const auto s = b.snapshot();
  CHECK(s.pauses == 1);
  CHECK(s.pause_requests == 1);
  CHECK(s.acquired_total == 2);
  CHECK(s.waiting == 0);
  CHECK(b.try_acquire());
}

TEST_CASE("move-assigning a quota gate shuts the old state down first", "[lifecycle][move]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  gate a(io, {.jitter = 0});
  gate b(io, {.jitter = 0});
  a.pause_for(2s);
  b.pause_for(1s);
  auto on_a = start_rate(a, 1, duration::max());
  auto on_b = start_rate(b, 1, duration::max());
  b = std::move(a);
  poll(io);
  REQUIRE(on_b->called());
  CHECK(std::get<0>(*on_b->args) == aborted);  // b's old waiters end as at destruction
  CHECK_FALSE(on_a->called());
  CHECK(b.paused_until() == time_point{} + 2s);  // a's pause came along
  rein_test::advance_and_poll(io, 2s);
  REQUIRE(on_a->called());
  CHECK_FALSE(std::get<0>(*on_a->args));
  CHECK(b.snapshot().pauses == 1);
}

// ---- Timeouts too long to represent mean "no deadline", for every primitive -------------------------------

TEST_CASE("acquire_for(n, duration::max()) waits without a deadline on every primitive", "[lifecycle][deadline]") {
  start_late();
  net::io_context io;

  semaphore sem(io, 1);
  permit held = sem.try_acquire();
  auto on_sem = start_permit(sem, 1, duration::max());

  aimd limiter(io, rein::algo::aimd_options{.initial_limit = 1, .max_limit = 4});
  permit slot = limiter.try_acquire();
  auto on_aimd = start_permit(limiter, 1, duration::max());

  bucket b(io, {.rate = 10, .capacity = 1, .initial_tokens = 0});
  auto on_bucket = start_rate(b, 1, duration::max());

  window w(io, {.limit = 1, .window = 1s});
  REQUIRE(w.try_acquire());
  auto on_window = start_rate(w, 1, duration::max());

  gate g(io, {.jitter = 0});
  g.pause_for(1s);
  auto on_gate = start_rate(g, 1, duration::max());

  adaptive_rate r(io, {.initial_rate = 10, .burst = 1, .initial_tokens = 0});
  auto on_rate = start_rate(r, 1, duration::max());

  poll(io);  // none of them timed out at once (an overflowed deadline would be in the past)
  CHECK_FALSE(on_sem->called());
  CHECK_FALSE(on_aimd->called());
  CHECK_FALSE(on_bucket->called());
  CHECK_FALSE(on_window->called());
  CHECK_FALSE(on_gate->called());
  CHECK_FALSE(on_rate->called());

  held.release();
  slot.release();
  rein_test::advance_and_poll(io, 1s);
  for (const auto* r2 : {on_bucket.get(), on_window.get(), on_gate.get(), on_rate.get()}) {
    REQUIRE(r2->called());
    CHECK_FALSE(std::get<0>(*r2->args));
  }
  REQUIRE(on_sem->called());
  CHECK_FALSE(on_sem->ec());
  REQUIRE(on_aimd->called());
  CHECK_FALSE(on_aimd->ec());
}

TEST_CASE("acquire_for(duration::max()) from a coroutine waits without a deadline", "[lifecycle][deadline]") {
  start_late();
  net::io_context io;
  aimd limiter(io, rein::algo::aimd_options{.initial_limit = 1, .max_limit = 4});
  permit held = limiter.try_acquire();
  bool granted = false;
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        permit p = co_await limiter.acquire_for(duration::max());
        granted = static_cast<bool>(p);
      },
      [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  poll(io);
  CHECK_FALSE(granted);
  held.release();
  poll(io);
  CHECK(granted);
}

// ---- Grants taken back by a late cancellation give their units back ---------------------------------------

TEST_CASE("a bucket grant cancelled before its handler ran gives the tokens back, exactly", "[lifecycle][revoke]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  bucket b(io, {.rate = 10, .capacity = 5, .initial_tokens = 5});
  net::cancellation_signal signal;
  auto w = start_rate(b, 3, duration::max(), &signal);  // granted at once: its handler is queued
  CHECK(b.tokens() == 2.0);
  signal.emit(net::cancellation_type::total);
  poll(io);
  CHECK(w->ec() == aborted);
  CHECK(b.tokens() == 5.0);
  const auto s = b.snapshot();
  CHECK(s.acquired_total == 0);
  CHECK(s.cancelled_total == 1);
}

TEST_CASE("a window grant cancelled before its handler ran forgets its start", "[lifecycle][revoke]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  window w(io, {.limit = 2, .window = 1s});
  net::cancellation_signal signal;
  auto first = start_rate(w, 2, duration::max(), &signal);
  CHECK_FALSE(w.try_acquire());
  signal.emit(net::cancellation_type::terminal);
  poll(io);
  CHECK(first->ec() == aborted);
  CHECK(w.try_acquire());
  CHECK(w.try_acquire());
  CHECK_FALSE(w.try_acquire());
}

TEST_CASE("an adaptive rate grant cancelled before its handler ran gives the token back", "[lifecycle][revoke]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  adaptive_rate r(io, {.initial_rate = 10, .burst = 1});
  net::cancellation_signal signal;
  auto w = start_rate(r, 1, duration::max(), &signal);
  CHECK_FALSE(r.try_acquire());
  signal.emit(net::cancellation_type::partial);
  poll(io);
  CHECK(w->ec() == aborted);
  CHECK(r.try_acquire());
}

// ---- A wait that can never be granted fails at once when it has a deadline --------------------------------

TEST_CASE("a deadline-bounded wait on a bucket of 1e-10 per second fails at once", "[lifecycle][deadline]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  bucket b(io, {.rate = 1e-10, .capacity = 1, .initial_tokens = 0});
  auto w = start_rate(b, 1, 1h);
  poll(io);  // no time passes
  REQUIRE(w->called());
  CHECK(w->ec() == errc::timed_out);
  CHECK(rein_test::since_epoch() == 0s);
  CHECK(b.snapshot().timed_out_total == 1);
  auto without_deadline = start_rate(b, 1, duration::max());  // no deadline: it waits
  poll(io);
  CHECK_FALSE(without_deadline->called());
  b.close();
  poll(io);
  CHECK(without_deadline->ec() == errc::closed);
}

TEST_CASE("a deadline-bounded wait behind a pause that never ends fails at once", "[lifecycle][deadline]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  gate g(io, {.max_pause = std::chrono::nanoseconds::max(), .jitter = 0});
  g.pause_for(duration::max());
  auto w = start_rate(g, 1, 1h);
  poll(io);
  REQUIRE(w->called());
  CHECK(w->ec() == errc::timed_out);
}

// ---- The adaptive limiter takes a count ---------------------------------------------------------------------

TEST_CASE("an adaptive limiter grants weighted acquires in FIFO order", "[lifecycle][adaptive]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  aimd limiter(io, rein::algo::aimd_options{.initial_limit = 4, .max_limit = 8});
  permit three = limiter.try_acquire(3);
  REQUIRE(three.count() == 3);
  CHECK_FALSE(limiter.try_acquire(2));
  auto two = start_permit(limiter, 2, duration::max());
  auto one = start_permit(limiter, 1, duration::max());  // fits, but waits behind the head
  poll(io);
  CHECK_FALSE(two->called());
  CHECK_FALSE(one->called());
  three.release();
  poll(io);
  REQUIRE(two->called());
  CHECK(two->get<1>().count() == 2);
  REQUIRE(one->called());
  CHECK(one->get<1>().count() == 1);
  auto too_big = start_permit(limiter, 9, duration::max());
  poll(io);
  CHECK(too_big->ec() == errc::exceeds_capacity);
}

// ---- The semaphore can shrink -------------------------------------------------------------------------------

TEST_CASE("forget lowers the total: holders keep their permits, new grants wait for the new total",
          "[lifecycle][shrink]") {
  net::io_context io;
  semaphore sem(io, 4);
  permit three = sem.try_acquire(3);
  auto two = start_permit(sem, 2, duration::max());   // 1 free: waits
  auto four = start_permit(sem, 4, duration::max());  // fits the total of 4, for now
  poll(io);
  CHECK_FALSE(two->called());

  sem.forget(2);  // total 2: the free permit goes at once, 1 more is owed by the holder
  poll(io);
  REQUIRE(four->called());
  CHECK(four->ec() == errc::exceeds_capacity);  // more than the new total: it could only wait forever
  auto s = sem.snapshot();
  CHECK(s.permits == 2);
  CHECK(s.available == 0);
  CHECK(s.in_flight == 3);
  CHECK(s.waiting == 1);

  permit one = three.split(1);
  one.release();  // pays what is owed: still nothing free
  poll(io);
  CHECK_FALSE(two->called());
  CHECK(sem.snapshot().in_flight == 2);
  three.release();  // 2 back, total 2: the waiter for 2 is granted
  poll(io);
  REQUIRE(two->called());
  CHECK_FALSE(two->ec());
  CHECK(sem.snapshot().in_flight == 2);

  CHECK_THROWS_WITH(sem.forget(3), "rein::basic_semaphore: forget(n) needs n <= the total of 2 permits, got n = 3");
  CHECK(sem.permits() == 2);
  sem.set_permits(3);
  CHECK(sem.available() == 1);
  sem.set_permits(1);  // 2 held, total 1: 1 owed
  CHECK(sem.available() == 0);
  CHECK(sem.snapshot().in_flight == 2);
  sem.add_permits(1);  // forgives the debt first
  CHECK(sem.available() == 0);
  two->get<1>().release();
  CHECK(sem.available() == 2);
  CHECK(sem.snapshot().in_flight == 0);
}

// ---- Drain: wait until every permit is back -------------------------------------------------------------------

TEST_CASE("close then drain completes when the last permit comes back", "[lifecycle][drain]") {
  net::io_context io;
  semaphore sem(io, 2);
  permit a = sem.try_acquire();
  permit b = sem.try_acquire();
  auto waiter = start_permit(sem, 1, duration::max());
  sem.close();
  auto [handler, drained] = rein_test::make_checked<error_code>();
  sem.async_drain(std::move(handler));
  poll(io);
  CHECK(waiter->ec() == errc::closed);
  CHECK_FALSE(drained->called());
  a.release();
  poll(io);
  CHECK_FALSE(drained->called());
  b.release();
  CHECK_FALSE(drained->called());  // posted, never run inside the release
  poll(io);
  REQUIRE(drained->called());
  CHECK_FALSE(drained->ec());
}

TEST_CASE("drain with nothing out completes at once; with a deadline it times out; cancellation aborts it",
          "[lifecycle][drain]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  aimd limiter(io, rein::algo::aimd_options{.initial_limit = 2, .max_limit = 4});
  auto [h0, at_once] = rein_test::make_checked<error_code>();
  limiter.async_drain(std::move(h0));
  poll(io);
  CHECK(at_once->called());
  CHECK_FALSE(at_once->ec());

  permit p = limiter.try_acquire();
  auto [h1, timed] = rein_test::make_checked<error_code>();
  limiter.async_drain_for(5s, std::move(h1));
  net::cancellation_signal signal;
  auto [h2, cancelled] = rein_test::make_checked<error_code>();
  limiter.async_drain(net::bind_cancellation_slot(signal.slot(), std::move(h2)));
  rein_test::advance_and_poll(io, 4999ms);
  CHECK_FALSE(timed->called());
  rein_test::advance_and_poll(io, 1ms);
  REQUIRE(timed->called());
  CHECK(timed->ec() == errc::timed_out);
  signal.emit(net::cancellation_type::terminal);
  poll(io);
  REQUIRE(cancelled->called());
  CHECK(cancelled->ec() == aborted);
  CHECK(io.stopped());  // nothing waits any more: no work guard, no timer left behind
  CHECK(limiter.snapshot().timed_out_total == 0);  // a drain is not a rejected acquire
  p.release();
}

TEST_CASE("destroying a limiter ends its drain waits with operation_aborted", "[lifecycle][drain]") {
  net::io_context io;
  auto sem = std::make_unique<semaphore>(io, 1);
  permit p = sem->try_acquire();
  auto [handler, drained] = rein_test::make_checked<error_code>();
  sem->async_drain(std::move(handler));
  sem.reset();
  poll(io);
  REQUIRE(drained->called());
  CHECK(drained->ec() == aborted);
  p.release();
}

TEST_CASE("drain from a coroutine, after close", "[lifecycle][drain]") {
  net::io_context io;
  semaphore sem(io, 1);
  permit p = sem.try_acquire();
  bool drained = false;
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        sem.close();
        co_await sem.async_drain(net::use_awaitable);
        drained = true;
      },
      [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  poll(io);
  CHECK_FALSE(drained);
  p.release();
  poll(io);
  CHECK(drained);
}

// ---- try_acquire says why, and rate limits say when ----------------------------------------------------------

TEST_CASE("a concurrency limiter's try_acquire says why it is empty", "[lifecycle][try]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  semaphore sem(io, 4);
  CHECK(sem.try_acquire(5).status() == rein::try_status::exceeds_capacity);
  rein::try_permit all = sem.try_acquire(4);
  CHECK(all.status() == rein::try_status::acquired);
  CHECK(all.count() == 4);
  CHECK(sem.try_acquire().status() == rein::try_status::busy);
  sem.close();
  CHECK(sem.try_acquire().status() == rein::try_status::closed);
  permit plain = std::move(all);  // a try_permit is a permit
  CHECK(plain.count() == 4);

  aimd limiter(io, rein::algo::aimd_options{.initial_limit = 1, .max_limit = 2});
  CHECK(limiter.try_acquire(3).status() == rein::try_status::exceeds_capacity);
  permit one = limiter.try_acquire();
  CHECK(limiter.try_acquire().status() == rein::try_status::busy);
}

TEST_CASE("a rate limiter's try_acquire says when the same request would succeed", "[lifecycle][try]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  bucket b(io, {.rate = 10, .capacity = 2, .initial_tokens = 0});
  rein::try_result r = b.try_acquire();
  CHECK_FALSE(r);
  CHECK(r.status() == rein::try_status::busy);
  CHECK(r.retry_after() == 100ms);
  CHECK(b.try_acquire(2).retry_after() == 200ms);
  CHECK(b.try_acquire(3).status() == rein::try_status::exceeds_capacity);
  CHECK_FALSE(b.try_acquire(3).retry_after());
  auto waiter = start_rate(b, 2, duration::max());
  CHECK(b.try_acquire().retry_after() == 300ms);  // behind the waiter's 2 tokens
  rein_test::advance_and_poll(io, 200ms);
  REQUIRE(waiter->called());
  CHECK(b.try_acquire().retry_after() == 100ms);
  rein_test::advance_and_poll(io, 100ms);
  rein::try_result ok = b.try_acquire();
  CHECK(ok);
  CHECK(ok.status() == rein::try_status::acquired);
  CHECK_FALSE(ok.retry_after());

  bucket slow(io, {.rate = 1e-10, .capacity = 1, .initial_tokens = 0});
  CHECK(slow.try_acquire().retry_after() == std::chrono::nanoseconds::max());

  window w(io, {.limit = 1, .window = 1s});
  CHECK(w.try_acquire());
  rein_test::advance_and_poll(io, 250ms);
  CHECK(w.try_acquire().retry_after() == 750ms);
  w.close();
  CHECK(w.try_acquire().status() == rein::try_status::closed);

  gate g(io, {.jitter = 0});
  g.pause_for(2s);
  CHECK(g.try_acquire().retry_after() == 2s);
  rein_test::advance_and_poll(io, 2s);
  CHECK(g.try_acquire());
}
