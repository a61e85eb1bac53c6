// The shared bucket's admission rule on rein's wait line, without Redis: the messages it would send are
// recorded, and the verdicts are made by hand (what the Lua script and the connection would report). Time is
// rein::testing::manual_clock, so every wait and deadline is exact.
#include "redis/scripted_fixture.hpp"
#include "support/invalid_argument.hpp"

#include <rein/line_options.hpp>
#include <rein/redis/connection.hpp>
#include <rein/redis/detail/bucket_admission.hpp>
#include <rein/redis/detail/gate_admission.hpp>
#include <rein/redis/detail/semaphore_admission.hpp>
#include <rein/redis/detail/window_admission.hpp>
#include <rein/redis/shared_quota_gate.hpp>
#include <rein/redis/shared_semaphore.hpp>
#include <rein/redis/shared_sliding_window.hpp>
#include <rein/redis/shared_token_bucket.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using namespace rein_test::scripted;
using rein::redis::failure_policy;
using rein::redis::shared_token_bucket_options;
using rein_test::advance_and_poll;
using rein_test::manual_clock;
using rein_test::poll;

using policy_type = rein::redis::detail::bucket_admission<manual_clock>;
using bucket = scripted_fixture<policy_type>;

shared_token_bucket_options ten_per_second(std::int64_t capacity, std::size_t max_in_flight = 64) {
  return {.key = "quota", .rate = 10, .capacity = capacity, .max_in_flight = max_in_flight};
}

// Capacity 4, one request in flight, fail_open with half the quota locally (capacity 2, 5 tokens per second),
// Redis asked again 300 ms after it could not be.
shared_token_bucket_options fail_open_half() {
  auto o = ten_per_second(4, 1);
  o.on_failure = failure_policy::fail_open;
  o.fail_open_share = 0.5;
  o.recheck_interval = 300ms;
  return o;
}

}  // namespace

TEST_CASE("admission: the first waiting op is sent; a denial holds the line for its retry-after, in order",
          "[redis][admission]") {
  bucket b(ten_per_second(2, 1));  // a token every 100 ms = 100000 us
  result first, second;
  b.acquire(first, 2);
  b.acquire(second, 1);
  CHECK(b.sent() == messages{{admission, 0, 2}});  // one at a time (max_in_flight 1); second waits behind
  CHECK(b.snapshot().waiting == 2);
  CHECK(b.snapshot().requests_in_flight == 1);

  // Redis: no, 1 token there; the head may ask again in 50 ms, but 2 tokens take 100 ms to be there.
  b.settle(0, denied(50000, 100000));
  poll(b.io);
  CHECK_FALSE(first.done);
  CHECK(b.sent().size() == 1);  // second is not sent past the waiting head
  CHECK(b.snapshot().remote_denied == 1);
  CHECK(b.snapshot().retry_after_last == 50000us);

  advance_and_poll(b.io, 99ms);
  CHECK(b.sent().size() == 1);
  advance_and_poll(b.io, 1ms);
  CHECK(b.sent() == messages{{admission, 0, 2}, {admission, 1, 2}});

  b.settle(1, allowed(0));
  poll(b.io);
  CHECK(first.done);
  CHECK(first.ec == error_code{});
  CHECK_FALSE(second.done);
  CHECK(b.sent().size() == 2);  // the bucket is empty: second waits for one token's refill, not for a denial

  advance_and_poll(b.io, 99ms);
  CHECK(b.sent().size() == 2);
  advance_and_poll(b.io, 1ms);
  CHECK(b.sent().back() == message{admission, 2, 1});
  b.settle(2, allowed(0));
  poll(b.io);
  CHECK(second.done);
  CHECK(second.ec == error_code{});
  const auto s = b.snapshot();
  CHECK(s.acquired_total == 2);
  CHECK(s.remote_allowed == 2);
  CHECK(s.round_trips == 3);
  CHECK(s.wait_total == 100ms + 200ms);  // both asked at 0: first granted at 100 ms, second at 200 ms
  CHECK(s.waiting == 0);
}

TEST_CASE("admission: requests are pipelined up to the tokens believed there; replies may come in any order",
          "[redis][admission]") {
  bucket b(ten_per_second(3));
  result r[4];
  for (auto& x : r) b.acquire(x, 1);
  // Before any reply the bucket is believed full: 3 requests fly, the fourth waits for a place.
  CHECK(b.sent() == messages{{admission, 0, 1}, {admission, 1, 1}, {admission, 2, 1}});
  b.settle(2, allowed(0));
  b.settle(0, allowed(100000));
  poll(b.io);
  CHECK(r[0].done);
  CHECK_FALSE(r[1].done);
  CHECK(r[2].done);
  CHECK_FALSE(r[3].done);
  // The last verdict said one token is left, and one request (ticket 1) is out for it: the fourth waits.
  CHECK(b.sent().size() == 3);
  b.settle(1, allowed(0));
  poll(b.io);
  CHECK(r[1].done);
  CHECK(b.sent().size() == 3);  // empty now: the fourth waits for the refill
  advance_and_poll(b.io, 100ms);
  CHECK(b.sent().back() == message{admission, 3, 1});
}

TEST_CASE("admission: 0 is granted and a request above the capacity refused at once, with nothing sent",
          "[redis][admission]") {
  bucket b(ten_per_second(5));
  result zero, big;
  b.acquire(zero, 0);
  b.acquire(big, 6);
  poll(b.io);
  CHECK(zero.done);
  CHECK(zero.ec == error_code{});
  CHECK(big.ec == rein::errc::exceeds_capacity);
  CHECK(b.sent().empty());
}

TEST_CASE("admission: deadlines end waiting and in-flight ops with timed_out; a late grant is refunded",
          "[redis][admission]") {
  bucket b(ten_per_second(2, 1));
  result past, on_wire, behind;
  b.acquire(past, 1, manual_clock::now());
  poll(b.io);
  CHECK(past.ec == rein::errc::timed_out);  // a deadline already reached fails at once
  CHECK(b.sent().empty());

  b.acquire(on_wire, 1, manual_clock::now() + 10ms);
  b.acquire(behind, 1, manual_clock::now() + 20ms);
  CHECK(b.sent() == messages{{admission, 0, 1}});
  advance_and_poll(b.io, 10ms);
  CHECK(on_wire.ec == rein::errc::timed_out);  // Redis has not answered: it times out on the wire
  CHECK_FALSE(behind.done);
  CHECK(b.snapshot().requests_in_flight == 1);  // the ticket is still out
  CHECK(b.sent().size() == 1);         // the window is full until it comes back

  b.settle(0, allowed(100000));  // Redis took a token for nobody
  poll(b.io);
  CHECK(b.sent() == messages{{admission, 0, 1}, {refund, 0, 1}, {admission, 1, 1}});
  CHECK(b.snapshot().refunds == 1);
  advance_and_poll(b.io, 10ms);
  CHECK(behind.ec == rein::errc::timed_out);
  const auto s = b.snapshot();
  CHECK(s.timed_out_total == 3);
  CHECK(s.rejected_total == 3);
  CHECK(s.acquired_total == 0);
  b.settle(1, denied(100000, 0));  // a late denial for nobody gives nothing back
  CHECK(b.sent().size() == 3);
}

TEST_CASE("admission: a grant cancelled before its handler ran gives its tokens back to Redis",
          "[redis][admission]") {
  bucket b(ten_per_second(2));
  net::cancellation_signal signal;
  result r;
  b.acquire(r, 2, signal);
  b.settle(0, allowed(0));  // granted: the completion is posted, not run
  manual_clock::advance(5ms);  // later than the grant: unlike a local bucket's, a remote grant is still undone
  signal.emit(net::cancellation_type::terminal);
  poll(b.io);
  CHECK(r.ec == net::error::operation_aborted);
  CHECK(b.sent() == messages{{admission, 0, 2}, {refund, 0, 2}});
  const auto s = b.snapshot();
  CHECK(s.acquired_total == 0);
  CHECK(s.cancelled_total == 1);
  CHECK(s.refunds == 1);
}

TEST_CASE("admission: an op cancelled on the wire completes at once; its late grant is refunded",
          "[redis][admission]") {
  bucket b(ten_per_second(2));
  net::cancellation_signal signal;
  result r;
  b.acquire(r, 1, signal);
  signal.emit(net::cancellation_type::partial);
  poll(b.io);
  CHECK(r.ec == net::error::operation_aborted);
  CHECK(b.snapshot().cancelled_total == 1);
  b.settle(0, allowed(100000));
  CHECK(b.sent() == messages{{admission, 0, 1}, {refund, 0, 1}});
}

TEST_CASE("admission: fail_closed fails every waiting op in line order while Redis cannot be asked",
          "[redis][admission]") {
  auto o = ten_per_second(5, 1);
  o.recheck_interval = 100ms;
  bucket b(o);
  result a, c;
  b.acquire(a, 1);
  b.acquire(c, 1);
  b.settle(0, unavailable());
  poll(b.io);
  CHECK(a.ec == rein::redis::errc::unavailable);
  CHECK(c.ec == rein::redis::errc::unavailable);
  CHECK(b.snapshot().degraded);
  CHECK(b.snapshot().unavailable_total == 2);

  result during;
  b.acquire(during, 1);
  poll(b.io);
  CHECK(during.ec == rein::redis::errc::unavailable);  // at once, nothing sent
  CHECK(b.sent().size() == 1);

  manual_clock::advance(100ms);
  b.link_up = false;  // the recheck interval passed, but the connection is still down
  result still;
  b.acquire(still, 1);
  poll(b.io);
  CHECK(still.ec == rein::redis::errc::unavailable);
  CHECK(b.sent().size() == 1);

  b.link_up = true;
  result back;
  b.acquire(back, 1);
  CHECK(b.sent().back() == message{admission, 1, 1});
  b.settle(1, allowed(0));
  poll(b.io);
  CHECK(back.ec == error_code{});
  CHECK_FALSE(b.snapshot().degraded);
}

TEST_CASE("admission: fail_open admits from a local bucket of its share, then asks Redis again",
          "[redis][admission]") {
  bucket b(fail_open_half());
  result a, c, d, too_big;
  b.acquire(a, 1);
  b.acquire(c, 1);
  b.acquire(d, 1);
  b.settle(0, unavailable());
  poll(b.io);
  CHECK(a.ec == error_code{});  // the local bucket's two tokens
  CHECK(c.ec == error_code{});
  CHECK_FALSE(d.done);  // waits for the local refill: 200 ms
  b.acquire(too_big, 3);  // above the local capacity: cannot be admitted locally
  CHECK(b.snapshot().local_admitted == 2);

  advance_and_poll(b.io, 199ms);
  CHECK_FALSE(d.done);
  advance_and_poll(b.io, 1ms);
  CHECK(d.ec == error_code{});
  CHECK(too_big.ec == rein::redis::errc::unavailable);
  CHECK(b.snapshot().local_admitted == 3);
  CHECK(b.sent().size() == 1);

  result later;
  b.acquire(later, 2);  // the local bucket is empty: it waits, and at 300 ms Redis is asked again
  advance_and_poll(b.io, 99ms);
  CHECK(b.sent().size() == 1);
  advance_and_poll(b.io, 1ms);
  CHECK(b.sent().back() == message{admission, 1, 2});
  b.settle(1, allowed(0));
  poll(b.io);
  CHECK(later.ec == error_code{});
  CHECK(b.snapshot().local_admitted == 3);
  CHECK(b.snapshot().remote_allowed == 1);
}

TEST_CASE("admission: a local grant revoked after Redis answered again is not refunded to Redis",
          "[redis][admission]") {
  bucket b(fail_open_half());
  // The local grant's handler runs on another context, left unpolled: its grant stays revocable.
  net::io_context elsewhere;
  net::cancellation_signal signal;
  result local;
  b.line->async_acquire(net::bind_cancellation_slot(signal.slot(), net::bind_executor(elsewhere, [&local](error_code ec) {
                          local = {true, ec, {}};
                        })),
                        2, tp::max());
  b.settle(0, unavailable());  // degraded: the local bucket grants both its tokens
  poll(b.io);
  CHECK(b.snapshot().local_admitted == 1);

  result remote;
  b.acquire(remote, 2);  // the local bucket refills 2 in 400 ms: at 300 ms Redis is asked again first
  advance_and_poll(b.io, 300ms);
  CHECK(b.sent().back() == message{admission, 1, 2});
  b.settle(1, allowed(0));  // Redis answers: the degraded spell is over
  poll(b.io);
  CHECK(remote.ec == error_code{});

  signal.emit(net::cancellation_type::terminal);  // the local grant, revoked now
  poll(elsewhere);
  CHECK(local.ec == net::error::operation_aborted);
  CHECK(b.sent() == messages{{admission, 0, 2}, {admission, 1, 2}});  // no refund of units Redis never gave
  const auto s = b.snapshot();
  CHECK(s.refunds == 0);
  CHECK(s.cancelled_total == 1);
}

TEST_CASE("side requests: a refund answered NOSCRIPT is sent again after a script load, once",
          "[redis][admission]") {
  bucket b(ten_per_second(2));
  const message give_back{refund, 0, 1};
  b.line->update([&](policy_type& p, manual_clock::time_point) { p.on_side_error(give_back, true); });
  poll(b.io);
  message again = give_back;
  again.resent = 1;
  CHECK(b.sent() == messages{{script_load, 0, 0}, again});
  CHECK(b.snapshot().script_loads == 1);
  CHECK(b.snapshot().server_errors == 0);

  // The resent one fails the same way: counted, not sent a third time (the load itself must have failed).
  b.line->update([&](policy_type& p, manual_clock::time_point) { p.on_side_error(again, true); });
  // A failed script load, and any other error reply, are counted only.
  b.line->update([&](policy_type& p, manual_clock::time_point) { p.on_side_error({script_load, 0, 0}, true); });
  b.line->update([&](policy_type& p, manual_clock::time_point) { p.on_side_error(give_back, false); });
  poll(b.io);
  CHECK(b.sent().size() == 2);
  CHECK(b.snapshot().script_loads == 1);
  CHECK(b.snapshot().server_errors == 3);
}

TEST_CASE("admission: NOSCRIPT loads the script and asks again, twice at most; other errors fail the op",
          "[redis][admission]") {
  bucket b(ten_per_second(5));
  result r;
  b.acquire(r, 1);
  b.settle(0, no_script());
  CHECK(b.sent() == messages{{admission, 0, 1}, {script_load, 0, 0}, {admission, 0, 1}});
  b.settle(0, no_script());
  b.settle(0, no_script());  // the third time: a server error
  poll(b.io);
  CHECK(r.ec == rein::redis::errc::server_error);
  CHECK(b.snapshot().script_loads == 2);

  result wrong;
  b.acquire(wrong, 1);
  b.settle(1, server_error());
  poll(b.io);
  CHECK(wrong.ec == rein::redis::errc::server_error);
  const auto s = b.snapshot();
  CHECK(s.server_errors == 2);
  CHECK(s.acquired_total == 0);
}

TEST_CASE("admission: max_waiters counts the ops waiting their turn, not those on the wire",
          "[redis][admission]") {
  bucket b(ten_per_second(5, 1), {.max_waiters = 1});
  result on_wire, waiting, one_more;
  b.acquire(on_wire, 1);
  b.acquire(waiting, 1);
  b.acquire(one_more, 1);
  poll(b.io);
  CHECK_FALSE(on_wire.done);
  CHECK_FALSE(waiting.done);
  CHECK(one_more.ec == rein::errc::queue_full);
  CHECK(b.snapshot().queue_full_total == 1);
  CHECK(b.sent().size() == 1);
}

TEST_CASE("admission: close completes waiting and in-flight ops with closed; a late grant is refunded",
          "[redis][admission]") {
  bucket b(ten_per_second(5, 1));
  result on_wire, waiting, after;
  b.acquire(on_wire, 1);
  b.acquire(waiting, 1);
  b.line->close();
  b.acquire(after, 1);
  poll(b.io);
  CHECK(on_wire.ec == rein::errc::closed);
  CHECK(waiting.ec == rein::errc::closed);
  CHECK(after.ec == rein::errc::closed);
  b.settle(0, allowed(0));
  CHECK(b.sent() == messages{{admission, 0, 1}, {refund, 0, 1}});
}

TEST_CASE("admission: while an op waits, run() does not return; a cancelled far deadline leaves nothing pending",
          "[redis][admission]") {
  bucket b(ten_per_second(5, 1));
  net::cancellation_signal signal;
  result on_wire, waiting;
  b.acquire(on_wire, 1);  // in flight: no timer needed, only the verdict can end it
  poll(b.io);
  CHECK_FALSE(b.io.stopped());  // the line's work guard: a pending operation keeps the context running
  b.line->async_acquire(net::bind_cancellation_slot(signal.slot(), [&waiting](error_code ec) { waiting = {true, ec, {}}; }),
                        1, manual_clock::now() + 1h);
  signal.emit(net::cancellation_type::terminal);
  b.settle(0, allowed(400000));
  poll(b.io);
  CHECK(on_wire.ec == error_code{});
  CHECK(waiting.ec == net::error::operation_aborted);
  CHECK(b.io.stopped());  // no work guard and no timer armed for the cancelled op's deadline an hour away
}

TEST_CASE("admission: only a denial of the first waiting op holds the line", "[redis][admission]") {
  bucket b(ten_per_second(3, 2));
  result a, big;
  b.acquire(a, 1);
  b.acquire(big, 2);
  CHECK(b.sent() == messages{{admission, 0, 1}, {admission, 1, 2}});
  b.settle(0, denied(100000, 0));  // a, now the first waiting: ask again in 100 ms
  b.settle(1, denied(900000, 0));  // big waits behind a: its longer retry-after does not hold a
  advance_and_poll(b.io, 99ms);
  CHECK(b.sent().size() == 2);
  advance_and_poll(b.io, 1ms);
  CHECK(b.sent().back() == message{admission, 2, 1});
  CHECK(b.snapshot().remote_denied == 2);
}

TEST_CASE("admission: a retry-after too long for the clock saturates: the op's deadline fails at once",
          "[redis][admission]") {
  bucket b(ten_per_second(1, 1));
  result r;
  b.acquire(r, 1, manual_clock::now() + 1s);
  b.settle(0, denied(1e30, 0));
  poll(b.io);
  CHECK(b.sent().size() == 1);  // not asked again: "never" did not wrap round to the past
  CHECK(b.snapshot().retry_after_last == std::chrono::microseconds::max());
  CHECK(r.ec == rein::errc::timed_out);  // Redis said "not before never": the 1 s deadline cannot be met
}

TEST_CASE("admission: a denial fails at once a first waiting op whose deadline comes before its hold",
          "[redis][admission]") {
  bucket b(ten_per_second(1, 1));
  result soon, late;
  b.acquire(soon, 1, manual_clock::now() + 200ms);
  b.settle(0, denied(300000, 0));  // ask again in 300 ms: after the deadline
  poll(b.io);
  CHECK(soon.ec == rein::errc::timed_out);  // at once, not at 200 ms
  b.acquire(late, 1, manual_clock::now() + 1s);
  poll(b.io);
  CHECK_FALSE(late.done);  // the hold ends before its deadline: it waits
  advance_and_poll(b.io, 299ms);
  CHECK(b.sent().size() == 1);
  advance_and_poll(b.io, 1ms);
  CHECK(b.sent() == messages{{admission, 0, 1}, {admission, 1, 1}});
  b.settle(1, allowed(0));
  poll(b.io);
  CHECK(late.ec == error_code{});
}

TEST_CASE("bucket admission: a batch takes up to `batch` tokens in one round trip and spends the rest on the "
          "callers behind it",
          "[redis][bucket][batch]") {
  auto o = ten_per_second(10);
  o.batch = 4;
  bucket b(o);
  result r[6];
  for (int i = 0; i < 3; ++i) b.acquire(r[i], 1);
  // One request at a time, asking for 1 to 4 tokens.
  CHECK(b.sent() == messages{{admission, 0, 1, 4}});
  b.settle(0, allowed_units(600000, 4));  // 4 taken, 6 tokens left
  poll(b.io);
  for (int i = 0; i < 3; ++i) CHECK(r[i].ec == error_code{});
  CHECK(b.snapshot().batch_stock == 1);
  b.acquire(r[3], 1);  // the last token of the batch: no round trip
  poll(b.io);
  CHECK(r[3].ec == error_code{});
  CHECK(b.sent().size() == 1);
  b.acquire(r[4], 2);  // the batch is spent: ask again, for 2 to 4
  CHECK(b.sent().back() == message{admission, 1, 2, 4});
  b.settle(1, allowed_units(400000, 2));  // the bucket held only 2 more whole tokens than asked... of 2: 2 taken
  poll(b.io);
  CHECK(r[4].ec == error_code{});
  const auto s = b.snapshot();
  CHECK(s.batch_stock == 0);
  CHECK(s.batch_admitted == 3);
  CHECK(s.remote_allowed == 2);
  CHECK(s.acquired_total == 5);
  // A caller wanting more than a batch asks for exactly what it wants, once the bucket is believed to
  // hold it (4 tokens at the last reply: 100 ms of refill).
  b.acquire(r[5], 5);
  advance_and_poll(b.io, 100ms);
  CHECK(b.sent().back() == message{admission, 2, 5, 0});
}

TEST_CASE("bucket admission: a batch granted to a cancelled caller, and what is unspent at the end, go back",
          "[redis][bucket][batch]") {
  auto o = ten_per_second(10);
  o.batch = 4;
  bucket b(o);
  result gone, kept;
  net::cancellation_signal signal;
  b.acquire(gone, 1, signal);
  signal.emit(net::cancellation_type::terminal);
  poll(b.io);
  b.settle(0, allowed_units(600000, 4));
  CHECK(b.sent().back() == message{refund, 0, 4, 0});  // all 4 back: nobody was waiting for them
  b.acquire(kept, 1);
  b.settle(1, allowed_units(300000, 3));
  poll(b.io);
  CHECK(kept.ec == error_code{});
  b.line->update([](policy_type& p, tp) { p.release_unspent(); });
  CHECK(b.sent().back() == message{refund, 0, 2, 0});
  CHECK(b.snapshot().batch_stock == 0);
}

TEST_CASE("bucket admission: a batch larger than the capacity is refused, naming the field",
          "[redis][bucket][batch]") {
  auto o = ten_per_second(3);
  o.batch = 4;
  try {
    (void)policy_type::model_type::validated(o);
    FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()) == "rein::redis::shared_token_bucket: batch must be in [1, capacity] tokens, got 4 with capacity 3");
  }
}

TEST_CASE("bucket admission: a reply that says a rate is stored for the fleet moves the estimate to it",
          "[redis][bucket]") {
  bucket b(ten_per_second(4, 1));
  CHECK(b.snapshot().limit == 10.0);  // the rate, as every rate limiter's limit
  CHECK(b.snapshot().capacity == 4);
  result r[2];
  b.acquire(r[0], 1);
  verdict v = allowed(0);  // the bucket is empty after it, and the fleet's rate is 100 per second
  v.stored_interval_ns = 10'000'000;
  v.stored_capacity = 3;
  b.settle(0, v);
  poll(b.io);
  REQUIRE(r[0].ec == error_code{});
  CHECK(b.snapshot().limit == 100.0);  // the rate in force is the fleet's
  CHECK(b.snapshot().capacity == 3);
  b.acquire(r[1], 1);
  advance_and_poll(b.io, 9ms);
  CHECK(b.sent().size() == 1);  // one token takes 10 ms at 100 per second (100 ms by this process's options)
  advance_and_poll(b.io, 1ms);
  CHECK(b.sent().size() == 2);
}

// ---- one options shape: every Redis limiter is T(connection, rule, rein::line_options) -----------------

namespace {

// A line of `Policy` named "x" with max_waiters 8 and one request on the wire at a time: 8 ops wait their
// turn behind the one on the wire, and a 9th waiter is refused at once with queue_full.
template <class Policy, class Signature = void(rein::error_code)>
void check_ninth_waiter_refused(typename Policy::options_type rule) {
  rule.max_in_flight = 1;
  // Before the fixture, so that they outlive it: its destructor completes the waiters into them.
  result on_wire, one_more;
  std::vector<result> waiting(8);
  scripted_fixture<Policy, Signature> f(std::move(rule), {.name = "x", .max_waiters = 8});
  CHECK(f.line->name() == "x");
  f.acquire(on_wire, 1);
  for (auto& w : waiting) f.acquire(w, 1);
  f.acquire(one_more, 1);
  poll(f.io);
  CHECK_FALSE(on_wire.done);
  for (const auto& w : waiting) CHECK_FALSE(w.done);
  CHECK(one_more.ec == rein::errc::queue_full);
  CHECK(f.snapshot().queue_full_total == 1);
  CHECK(f.sent().size() == 1);
}

// The public type constructs with line options on a shared connection (nothing is sent until it is used),
// keeps the name, and refuses what a pipelined line cannot do, naming the type, the name, the field and the
// value.
template <class Limiter>
void check_public_type(const std::string& type, typename Limiter::rule_type rule) {
  rein::net::io_context io;
  rein::redis::connection c(io);
  Limiter named(c, rule, {.name = "x", .max_waiters = 8});
  CHECK(named.name() == "x");
  const auto make = [&](rein::line_options line) { Limiter(c, rule, std::move(line)); };
  const auto refused = [&](rein::line_options l) {
    return rein_test::invalid_argument_of([&] { make(std::move(l)); });
  };
  const std::string why = "its requests are pipelined to Redis in order";
  CHECK(refused({.name = "x", .order = rein::queue_order::lifo}) ==
        type + " \"x\": order must be fifo (" + why + "), got lifo");
  CHECK(refused({.name = "x", .when_full = rein::queue_full_policy::evict_oldest}) ==
        type + " \"x\": when_full must be reject_newest (" + why + "), got evict_oldest");
  CHECK(refused({.name = "x", .priority_aging = -1ns}) == type + " \"x\": priority_aging must be >= 0, got -1 ns");
  CHECK(refused({.name = "x", .sojourn = {.target = 10ms}}) ==
        type + " \"x\": sojourn.target must be 0 (Redis decides the waits), got 10000000 ns");
  CHECK(refused({.name = "x", .partitions = {{"a", 0.5}}}) ==
        type +
            " \"x\": partitions must be empty (only rein::semaphore and rein::adaptive_limiter have "
            "partitions), got 1 partitions");
}

}  // namespace

TEST_CASE("one options shape: shared_token_bucket(connection, rule, line_options)", "[redis][options]") {
  check_ninth_waiter_refused<policy_type>(ten_per_second(5));
  check_public_type<rein::redis::shared_token_bucket>("rein::redis::shared_token_bucket", ten_per_second(5));
}

TEST_CASE("one options shape: shared_semaphore(connection, rule, line_options)", "[redis][options]") {
  const rein::redis::shared_semaphore_options rule{.key = "db", .limit = 4};
  check_ninth_waiter_refused<rein::redis::detail::semaphore_admission<manual_clock>,
                             void(rein::error_code, rein::permit)>(rule);
  check_public_type<rein::redis::shared_semaphore>("rein::redis::shared_semaphore", rule);
}

TEST_CASE("one options shape: shared_sliding_window(connection, rule, line_options)", "[redis][options]") {
  const rein::redis::shared_sliding_window_options rule{.key = "api", .limit = 4, .window = 1000ms};
  check_ninth_waiter_refused<rein::redis::detail::window_admission<manual_clock>>(rule);
  check_public_type<rein::redis::shared_sliding_window>("rein::redis::shared_sliding_window", rule);
}

TEST_CASE("one options shape: shared_quota_gate(connection, rule, line_options)", "[redis][options]") {
  const rein::redis::shared_quota_gate_options rule{.key = "api", .jitter = 0};
  check_ninth_waiter_refused<rein::redis::detail::gate_admission<manual_clock>>(rule);
  check_public_type<rein::redis::shared_quota_gate>("rein::redis::shared_quota_gate", rule);
}
