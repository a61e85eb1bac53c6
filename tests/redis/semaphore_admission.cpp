// The shared semaphore's admission rule on rein's wait line, without Redis (see scripted_fixture.hpp):
// hand-made verdicts of the lease script, permits, releases, renewals and lost leases, exact times on
// rein::testing::manual_clock. A message's last number is its tag: 2 * lease, plus 1 for the first
// request of a lease (the script creates the lease only for those).
#include "redis/scripted_fixture.hpp"

#include <rein/error.hpp>
#include <rein/observer.hpp>
#include <rein/redis/detail/semaphore_admission.hpp>
#include <rein/redis/shared_semaphore.hpp>
#include <rein/redis/error.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using namespace rein_test::scripted;
using rein::redis::failure_policy;
using rein::redis::shared_semaphore_options;
using rein_test::advance_and_poll;
using rein_test::manual_clock;
using rein_test::poll;

using policy = rein::redis::detail::semaphore_admission<manual_clock>;
using semaphore = scripted_fixture<policy, void(error_code, rein::permit)>;

constexpr auto renew = message::kind::renew;

shared_semaphore_options limit_of(std::int64_t limit) { return {.key = "db", .limit = limit}; }

verdict lost() { return {verdict::kind::lost, 0, 0, {}, 0}; }

void renew_now(semaphore& s) {
  s.line->update([](policy& p, tp) { p.renew(); });
}

// The answer to a renewal sent at `sent` (default: now, answered at once).
void renewal_answer(semaphore& s, std::int64_t tag, const verdict& v, std::optional<tp> sent = std::nullopt) {
  s.line->update([&](policy& p, tp now) { p.on_renewed(tag, v, sent.value_or(now), now); });
}

bool lease_held(semaphore& s) {
  return s.line->inspect(
      [](const policy& p, const rein::wait_stats&) { return p.model().lease_held(manual_clock::now()); });
}

}  // namespace

TEST_CASE("semaphore admission: Redis's verdicts grant permits; a release goes back under the lease and ends a "
          "denial's wait",
          "[redis][semaphore]") {
  semaphore s(limit_of(2));
  result r[3];
  for (auto& x : r) s.acquire(x, 1);
  // Before any reply both permits are believed free: two requests fly, both the first of lease 1.
  CHECK(s.sent() == messages{{admission, 0, 1, 3}, {admission, 1, 1, 3}});
  s.settle(0, allowed(1));
  s.settle(1, allowed(0));
  poll(s.io);
  REQUIRE(r[0].ec == error_code{});
  REQUIRE(r[1].ec == error_code{});
  CHECK(r[0].permit.count() == 1);
  CHECK(r[1].permit.count() == 1);
  // Lease 1 exists now: later messages carry tag 2.
  CHECK(s.sent().back() == message{admission, 2, 1, 2});
  s.settle(2, denied(10000, 0));
  poll(s.io);
  CHECK_FALSE(r[2].done);
  CHECK(s.snapshot().held == 2);
  CHECK(s.snapshot().free == 0);
  // A permit of this process comes back: the release, then at once the waiting caller asks again.
  r[0].permit.release();
  CHECK(s.sent() == messages{{admission, 0, 1, 3}, {admission, 1, 1, 3}, {admission, 2, 1, 2}, {refund, 0, 1, 2},
                             {admission, 3, 1, 2}});
  s.settle(3, allowed(0));
  poll(s.io);
  CHECK(r[2].ec == error_code{});
  const auto snap = s.snapshot();
  CHECK(snap.held == 2);
  CHECK(snap.remote_allowed == 3);
  CHECK(snap.remote_denied == 1);
  CHECK(snap.refunds == 1);
  CHECK(s.line->holders() == 2);
}

TEST_CASE("semaphore admission: without a release here, the first waiting caller asks again after the poll "
          "interval Redis returned",
          "[redis][semaphore]") {
  semaphore s(limit_of(1));
  result held, waiting;
  s.acquire(held, 1);
  s.settle(0, allowed(0));
  poll(s.io);
  s.acquire(waiting, 1);
  s.settle(1, denied(10000, 0));  // another process holds the rest; poll in 10 ms
  advance_and_poll(s.io, 9ms);
  CHECK(s.sent().size() == 2);
  advance_and_poll(s.io, 1ms);
  CHECK(s.sent().back() == message{admission, 2, 1, 2});
  s.settle(2, allowed(0));
  poll(s.io);
  CHECK(waiting.ec == error_code{});
  CHECK(s.snapshot().wait_total == 10ms);
}

TEST_CASE("semaphore admission: a renewal carries the lease and the most it may hold; none before Redis made "
          "the lease",
          "[redis][semaphore]") {
  semaphore s(limit_of(4));
  result a, b;
  s.acquire(a, 2);
  s.acquire(b, 1);
  CHECK(s.sent() == messages{{admission, 0, 2, 3}, {admission, 1, 1, 3}});
  renew_now(s);  // no reply yet: Redis may not have made lease 1, and a renewal cannot make it
  CHECK(s.sent().size() == 2);
  s.settle(0, allowed(2));
  poll(s.io);
  renew_now(s);  // 2 held (the least), 1 more asked for on the wire (the most: 3)
  CHECK(s.sent().back() == message{renew, 2, 3, 2});
  s.settle(1, allowed(1));
  poll(s.io);
  a.permit.release();
  renew_now(s);  // 1 held
  CHECK(s.sent() == messages{{admission, 0, 2, 3}, {admission, 1, 1, 3}, {renew, 2, 3, 2}, {refund, 0, 2, 2}, {renew, 1, 1, 2}});
  CHECK(s.snapshot().renewals == 2);
}

TEST_CASE("semaphore admission: after a lost lease the old permits send nothing back and the next request starts "
          "a new lease",
          "[redis][semaphore]") {
  semaphore s(limit_of(4));
  result old_one, new_one;
  s.acquire(old_one, 1);
  s.settle(0, allowed(3));
  poll(s.io);
  advance_and_poll(s.io, 1ms);
  renewal_answer(s, 2, lost());  // Redis had expired lease 1 (say, the process was stopped for a while)
  auto snap = s.snapshot();
  CHECK(snap.leases_lost == 1);
  CHECK(snap.lease == 2);
  CHECK(snap.held == 0);
  renew_now(s);  // lease 2 does not exist yet: nothing to renew
  old_one.permit.release();  // Redis took it back already: no release is sent (it would count against lease 2)
  CHECK(s.sent() == messages{{admission, 0, 1, 3}});
  advance_and_poll(s.io, 1ms);
  s.acquire(new_one, 1);
  CHECK(s.sent().back() == message{admission, 1, 1, 5});
  s.settle(1, allowed(3));
  poll(s.io);
  REQUIRE(new_one.ec == error_code{});
  renewal_answer(s, 2, lost());  // a late answer about lease 1 changes nothing
  CHECK(s.snapshot().leases_lost == 1);
  renew_now(s);
  CHECK(s.sent().back() == message{renew, 1, 1, 4});
  new_one.permit.release();
  CHECK(s.sent().back() == message{refund, 0, 1, 4});
}

TEST_CASE("semaphore admission: a named semaphore's observer hears each lost lease once, when a reply says so",
          "[redis][semaphore][observability]") {
  std::vector<std::string> events;
  rein::line_options line{.name = "db"};
  line.observer = [&events](const rein::limiter_event& e) {
    std::ostringstream text;
    text << e;
    events.push_back(text.str());
  };
  semaphore s(limit_of(4), std::move(line));
  result held;
  s.acquire(held, 1);
  s.settle(0, allowed(3));
  poll(s.io);
  CHECK(events.empty());
  advance_and_poll(s.io, 1ms);
  renewal_answer(s, 2, lost());  // Redis had expired lease 1
  CHECK(events == std::vector<std::string>{"lease_lost count=1 name=db"});
  renewal_answer(s, 2, lost());  // a late answer about lease 1: nothing new
  CHECK(events.size() == 1);
}

TEST_CASE("semaphore admission: an acquire Redis answers with \"lost\" is asked again under the next lease",
          "[redis][semaphore]") {
  semaphore s(limit_of(4));
  result first, second;
  s.acquire(first, 1);
  s.settle(0, allowed(3));
  poll(s.io);
  s.acquire(second, 1);
  CHECK(s.sent().back() == message{admission, 1, 1, 2});
  s.settle(1, lost());
  poll(s.io);
  CHECK_FALSE(second.done);
  CHECK(s.sent().back() == message{admission, 2, 1, 5});
  advance_and_poll(s.io, 1ms);
  s.settle(2, allowed(3));
  poll(s.io);
  CHECK(second.ec == error_code{});
  CHECK(s.snapshot().leases_lost == 1);
  CHECK(s.snapshot().held == 1);
}

TEST_CASE("semaphore admission: a grant read a lease or more after its request left is given back and asked "
          "again; one read a nanosecond sooner is honoured",
          "[redis][semaphore]") {
  auto o = limit_of(2);
  o.lease = 300ms;
  semaphore s(o);
  result in_time, stalled;
  s.acquire(in_time, 1);
  advance_and_poll(s.io, 300ms - 1ns);  // the reply sat in the socket while the process stalled
  s.settle(0, allowed(1));
  poll(s.io);
  REQUIRE(in_time.ec == error_code{});
  s.acquire(stalled, 1);
  CHECK(s.sent().back() == message{admission, 1, 1, 2});
  advance_and_poll(s.io, 300ms);  // a lease: Redis may have expired the lease and given its permits away
  s.settle(1, allowed(0));
  poll(s.io);
  CHECK_FALSE(stalled.done);
  // Given back under the lease it was granted to, then asked again (Redis says whether the lease lives).
  CHECK(s.sent() == messages{{admission, 0, 1, 3}, {admission, 1, 1, 2}, {refund, 0, 1, 2}, {admission, 2, 1, 2}});
  auto snap = s.snapshot();
  CHECK(snap.stale_grants == 1);
  CHECK(snap.held == 1);
  CHECK(snap.refunds == 1);
  s.settle(2, lost());  // it had expired: the next lease starts
  poll(s.io);
  CHECK(s.sent().back() == message{admission, 3, 1, 5});
  advance_and_poll(s.io, 10ms);
  s.settle(3, allowed(1));
  poll(s.io);
  CHECK(stalled.ec == error_code{});
  CHECK(stalled.permit.count() == 1);
  snap = s.snapshot();
  CHECK(snap.stale_grants == 1);
  CHECK(snap.held == 1);  // only the new lease's: in_time's permit no longer counts anywhere
  CHECK(snap.leases_lost == 1);
  CHECK(s.line->holders() == 2);
}

// A slow but live server: replies take longer than a lease, yet a renewal confirmed since the request left
// holds the lease past the grant's reading, so the grant still counts (as lease_held() says) and is honoured;
// before, every such grant was given back and asked again until the caller's deadline.
TEST_CASE("semaphore admission: a grant read a lease after its request left is honoured while a later "
          "confirmation holds the lease",
          "[redis][semaphore]") {
  auto o = limit_of(2);
  o.lease = 300ms;
  semaphore s(o);
  result first, slow;
  s.acquire(first, 1);
  s.settle(0, allowed(1));  // at 0: the lease is held until 300 ms
  poll(s.io);
  REQUIRE(first.ec == error_code{});
  advance_and_poll(s.io, 10ms);
  s.acquire(slow, 1);  // sent at 10 ms
  advance_and_poll(s.io, 240ms);
  renewal_answer(s, 2, allowed(1), manual_clock::now() - 50ms);  // a renewal sent at 200 ms: held until 500 ms
  advance_and_poll(s.io, 150ms);  // 400 ms: read 390 ms after the request left
  s.settle(1, allowed(0));
  poll(s.io);
  CHECK(slow.ec == error_code{});
  CHECK(slow.permit.count() == 1);
  CHECK(s.snapshot().stale_grants == 0);
  CHECK(s.snapshot().held == 2);
}

TEST_CASE("semaphore admission: a grant made under a lease lost since is given back under that lease and asked "
          "again under the new one",
          "[redis][semaphore]") {
  semaphore s(limit_of(4));
  result first, late;
  s.acquire(first, 1);
  s.settle(0, allowed(3));
  poll(s.io);
  s.acquire(late, 1);
  CHECK(s.sent().back() == message{admission, 1, 1, 2});
  renewal_answer(s, 2, lost());  // e.g. by another route, before the acquire's answer
  s.settle(1, allowed(2));
  poll(s.io);
  CHECK_FALSE(late.done);
  CHECK(s.sent() == messages{{admission, 0, 1, 3}, {admission, 1, 1, 2}, {refund, 0, 1, 2}, {admission, 2, 1, 5}});
  s.settle(2, allowed(2));
  poll(s.io);
  CHECK(late.ec == error_code{});
  const auto snap = s.snapshot();
  CHECK(snap.stale_grants == 1);
  CHECK(snap.held == 1);
  CHECK(snap.lease == 2);
}

TEST_CASE("semaphore admission: the lease is held from a reply until a lease after its request left, renewals "
          "extend it, a loss ends it",
          "[redis][semaphore]") {
  auto o = limit_of(2);
  o.lease = 300ms;
  semaphore s(o);
  CHECK_FALSE(lease_held(s));  // nothing confirmed yet
  result r;
  s.acquire(r, 1);
  const tp sent = manual_clock::now();
  advance_and_poll(s.io, 20ms);
  CHECK_FALSE(lease_held(s));
  s.settle(0, allowed(1));
  poll(s.io);
  CHECK(lease_held(s));
  advance_and_poll(s.io, 280ms - 1ns);
  CHECK(lease_held(s));  // sent + 300 ms - 1 ns
  advance_and_poll(s.io, 1ns);
  CHECK_FALSE(lease_held(s));  // sent + 300 ms: Redis may have expired it
  renewal_answer(s, 2, allowed(1), sent + 100ms);  // a renewal sent at sent + 100 ms, answered now
  CHECK(lease_held(s));
  advance_and_poll(s.io, 100ms - 1ns);
  CHECK(lease_held(s));
  advance_and_poll(s.io, 1ns);
  CHECK_FALSE(lease_held(s));
  renewal_answer(s, 2, allowed(1));
  CHECK(lease_held(s));
  renewal_answer(s, 2, lost());
  CHECK_FALSE(lease_held(s));
  CHECK(r.permit.count() == 1);  // the holder still has it: lease_held() is how it learns it no longer counts
}

TEST_CASE("semaphore admission: a grant Redis makes to a cancelled request goes back under the lease it was "
          "asked for",
          "[redis][semaphore]") {
  semaphore s(limit_of(2));
  result r;
  net::cancellation_signal signal;
  s.acquire(r, 1, signal);
  signal.emit(net::cancellation_type::terminal);
  poll(s.io);
  CHECK(r.ec == net::error::operation_aborted);
  s.settle(0, allowed(1));
  CHECK(s.sent() == messages{{admission, 0, 1, 3}, {refund, 0, 1, 3}});
  CHECK(s.snapshot().held == 0);
}

TEST_CASE("semaphore admission: fail_open grants from a local semaphore whose permits go back to it",
          "[redis][semaphore]") {
  auto o = limit_of(4);
  o.on_failure = failure_policy::fail_open;
  o.fail_open_share = 0.5;  // 2 permits here while Redis is unreachable
  semaphore s(o);
  s.link_up = false;
  result r[3];
  s.acquire(r[0], 1);
  s.settle(0, unavailable());
  s.acquire(r[1], 1);
  s.acquire(r[2], 1);
  poll(s.io);
  CHECK(r[0].ec == error_code{});
  CHECK(r[1].ec == error_code{});
  CHECK_FALSE(r[2].done);
  r[0].permit.release();
  poll(s.io);
  CHECK(r[2].ec == error_code{});
  CHECK(s.sent() == messages{{admission, 0, 1, 3}});  // nothing went to Redis for the local permits
  CHECK(s.snapshot().local_admitted == 3);
}

TEST_CASE("semaphore admission: a permit given back after the semaphore is gone still sends its release",
          "[redis][semaphore]") {
  semaphore s(limit_of(2));
  result r;
  s.acquire(r, 1);
  s.settle(0, allowed(1));
  poll(s.io);
  REQUIRE(r.ec == error_code{});
  s.line->shutdown();
  r.permit.release();
  CHECK(s.sent().back() == message{refund, 0, 1, 2});
  CHECK(s.line->holders() == 0);
}

TEST_CASE("semaphore admission: requests beyond the limit fail at once; options out of range name the field",
          "[redis][semaphore]") {
  semaphore s(limit_of(2));
  result r;
  s.acquire(r, 3);
  poll(s.io);
  CHECK(r.ec == rein::errc::exceeds_capacity);
  const auto message_of = [](shared_semaphore_options o) {
    try {
      (void)policy::model_type::validated(std::move(o));
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto o = limit_of(0);
  CHECK(message_of(o) == "rein::redis::shared_semaphore: limit must be in [1, 2^31) permits, got 0");
  o = limit_of(2);
  o.lease = 20ms;
  CHECK(message_of(o) == "rein::redis::shared_semaphore: lease must be in [30 ms, 1 day], got 20ms");
  o = limit_of(2);
  o.poll_interval = 0ms;
  CHECK(message_of(o) == "rein::redis::shared_semaphore: poll_interval must be in [1 ms, lease], got 0ms");
  o.poll_interval = 11s;
  CHECK(message_of(o) == "rein::redis::shared_semaphore: poll_interval must be in [1 ms, lease], got 11000ms");
}

TEST_CASE("semaphore admission: a denial's retry-after is a polling hint, not a bound: a deadline before it "
          "still waits, and a release here is taken at once",
          "[redis][semaphore]") {
  semaphore s(limit_of(1));
  result held, waiting;
  s.acquire(held, 1);
  s.settle(0, allowed(0));
  poll(s.io);
  s.acquire(waiting, 1, manual_clock::now() + 200ms);
  s.settle(1, denied(1'000'000, 0));  // poll again in 1 s
  poll(s.io);
  CHECK_FALSE(waiting.done);  // a rate rule would fail it now; a permit may come back before 200 ms
  advance_and_poll(s.io, 50ms);
  held.permit.release();
  CHECK(s.sent().back() == message{admission, 2, 1, 2});
  s.settle(2, allowed(0));
  poll(s.io);
  CHECK(waiting.ec == error_code{});
}

TEST_CASE("semaphore admission: a renewal answered NOSCRIPT loads the script for the next one",
          "[redis][semaphore]") {
  semaphore s(limit_of(2));
  result r;
  s.acquire(r, 1);
  s.settle(0, allowed(1));
  poll(s.io);
  renewal_answer(s, 2, no_script());
  CHECK(s.sent().back() == message{script_load, 0, 0, 0});
  CHECK(s.snapshot().script_loads == 1);
  CHECK(s.snapshot().leases_lost == 0);
}

namespace {

// A mutex that, once asked, stops the unlocking thread right after its unlock until the test lets it go:
// between a locked step and its sending, another thread's step gets in.
struct gated_mutex {
  static inline std::atomic<int> stage{0};    // 1: a thread waits after its unlock; 2: it may go on
  static inline thread_local bool pause_me = false;
  std::mutex m;
  void lock() { m.lock(); }
  bool try_lock() { return m.try_lock(); }
  void unlock() {
    m.unlock();
    if (!pause_me) return;
    pause_me = false;
    stage = 1;
    while (stage.load() != 2) std::this_thread::yield();
  }
};

}  // namespace

TEST_CASE("semaphore admission: messages leave in the order of the steps that made them, whichever thread "
          "sends first",
          "[redis][semaphore]") {
  scripted_fixture<policy, void(error_code, rein::permit), gated_mutex> s(limit_of(2));
  result r;
  s.acquire(r, 2);
  s.settle(0, allowed(0));
  poll(s.io);
  REQUIRE(r.ec == error_code{});
  rein::permit one = r.permit.split(1);
  // A releases one permit and stops between its unlock and its sending; B renews (held: 1) meanwhile. Sent
  // in B's order, the renewal would lower Redis's count to 1 before the release lowers it again, to 0.
  std::thread a([&] {
    gated_mutex::pause_me = true;
    one.release();
  });
  while (gated_mutex::stage.load() != 1) std::this_thread::yield();
  s.line->update([](policy& p, tp) { p.renew(); });
  gated_mutex::stage = 2;
  a.join();
  CHECK(s.sent() == messages{{admission, 0, 2, 3}, {refund, 0, 1, 2}, {renew, 1, 1, 2}});
}

TEST_CASE("semaphore admission: the snapshot speaks every limiter's vocabulary: in_flight is the permits callers "
          "hold, held those the lease counts, free as last seen, and round trips in a histogram",
          "[redis][semaphore][observability]") {
  semaphore s(limit_of(3));
  result r[3];
  s.acquire(r[0], 1);
  s.acquire(r[1], 1);
  s.acquire(r[2], 2);
  // Three permits believed free: all three requests fly; nobody holds anything yet.
  auto snap = s.snapshot();
  CHECK(snap.limit == 3);
  CHECK(snap.free == 3);
  CHECK(snap.requests_in_flight == 3);
  CHECK(snap.waiting == 3);
  CHECK(snap.in_flight == 0);
  CHECK(snap.held == 0);
  advance_and_poll(s.io, 2ms);
  s.settle(0, allowed(2));
  s.settle(1, allowed(1));
  advance_and_poll(s.io, 3ms);
  s.settle(2, denied(2500, 1));  // 2 wanted, 1 free: another process holds the third permit
  poll(s.io);
  snap = s.snapshot();
  CHECK(snap.in_flight == 2);
  CHECK(snap.held == 2);
  CHECK(snap.free == 1);
  CHECK(snap.waiting == 1);
  CHECK(snap.requests_in_flight == 0);
  CHECK(snap.round_trips == 3);
  CHECK(snap.round_trip.count() == 3);
  CHECK(snap.round_trip.sum() == 9ms);  // 2 + 2 + 5 ms, on the manual clock
  CHECK(snap.round_trip.max() == 5ms);
  // The lease is lost (answer to the next request): held drops to nothing, while the caller still holding a
  // permit keeps it, so in_flight still counts it.
  r[0].permit.release();  // one release, and the waiting caller asks again at once
  CHECK(s.sent().back() == message{admission, 3, 2, 2});
  s.settle(3, lost());
  poll(s.io);
  snap = s.snapshot();
  CHECK(snap.leases_lost == 1);
  CHECK(snap.held == 0);
  CHECK(snap.in_flight == 1);
  CHECK(snap.acquired_total == 2);
  CHECK(snap.local_admitted == 0);
  r[1].permit.release();  // granted under the lost lease: nothing goes back
  CHECK(s.snapshot().in_flight == 0);
}

TEST_CASE("semaphore admission: fail_open's local permits are callers' in_flight and counted apart, not held",
          "[redis][semaphore][observability]") {
  auto o = limit_of(4);
  o.on_failure = failure_policy::fail_open;
  o.fail_open_share = 0.5;
  semaphore s(o);
  s.link_up = false;
  result r[2];
  s.acquire(r[0], 1);
  s.settle(0, unavailable());
  s.acquire(r[1], 1);
  poll(s.io);
  REQUIRE(r[0].ec == error_code{});
  REQUIRE(r[1].ec == error_code{});
  const auto snap = s.snapshot();
  CHECK(snap.acquired_total == 2);
  CHECK(snap.local_admitted == 2);
  CHECK(snap.in_flight == 2);
  CHECK(snap.held == 0);
  CHECK(snap.round_trips == 0);  // a request never answered is no round trip
  CHECK(snap.round_trip.count() == 0);
  CHECK(rein::redis::server_time(r[0].permit) == std::chrono::system_clock::time_point{});  // not Redis's
}

TEST_CASE("semaphore admission: a permit carries the server's time of Redis's grant, its parts too",
          "[redis][semaphore][observability]") {
  semaphore s(limit_of(4));
  result r[2];
  s.acquire(r[0], 2);
  s.acquire(r[1], 1);
  verdict first = allowed(2);
  first.server_time_us = 1764979200123456;
  verdict second = allowed(1);
  second.server_time_us = 1764979200123999;
  s.settle(1, second);  // replies settle in any order: each permit has its own grant's time
  s.settle(0, first);
  poll(s.io);
  REQUIRE(r[0].ec == error_code{});
  REQUIRE(r[1].ec == error_code{});
  const auto us = [](std::chrono::system_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  };
  CHECK(us(rein::redis::server_time(r[0].permit)) == 1764979200123456);
  CHECK(us(rein::redis::server_time(r[1].permit)) == 1764979200123999);
  const rein::permit part = r[0].permit.split(1);
  CHECK(us(rein::redis::server_time(part)) == 1764979200123456);
  CHECK(us(s.snapshot().server_time_last) == 1764979200123456);  // the last grant Redis's replies said
  CHECK(rein::redis::server_time(rein::permit()) == std::chrono::system_clock::time_point{});
  result none;
  s.acquire(none, 0);  // granted without asking Redis: no server time, not the last grant's
  poll(s.io);
  REQUIRE(none.ec == error_code{});
  CHECK(rein::redis::server_time(none.permit) == std::chrono::system_clock::time_point{});
}

TEST_CASE("semaphore admission: a named semaphore's observer hears its rejections by reason, unavailable included",
          "[redis][semaphore][observability]") {
  std::vector<std::string> events;
  rein::line_options line{.name = "db", .max_waiters = 1};
  line.observer = [&events](const rein::limiter_event& e) {
    std::ostringstream text;
    text << e;
    events.push_back(text.str());
  };
  semaphore s(limit_of(1), std::move(line));
  result held, waiting, full, late;
  s.acquire(held, 1);
  s.settle(0, allowed(0));
  poll(s.io);
  s.acquire(waiting, 1, manual_clock::now() + 5ms);
  s.settle(1, denied(10000, 0));
  s.acquire(full, 1);  // a second waiter where one may wait
  poll(s.io);
  CHECK(full.ec == rein::errc::queue_full);
  advance_and_poll(s.io, 5ms);
  CHECK(waiting.ec == rein::errc::timed_out);
  advance_and_poll(s.io, 5ms);  // the denial's hold is over
  // Redis becomes unreachable: under fail_closed the next caller is refused with errc::unavailable.
  s.link_up = false;
  s.acquire(late, 1);
  s.settle(2, unavailable());
  poll(s.io);
  CHECK(late.ec == rein::redis::errc::unavailable);
  CHECK(events == std::vector<std::string>{"rejected reason=queue_full count=1 name=db",
                                           "rejected reason=timed_out count=1 name=db",
                                           "rejected reason=unavailable count=1 name=db"});
  const auto snap = s.snapshot();
  CHECK(snap.rejected_total == 3);
  CHECK(snap.queue_full_total == 1);
  CHECK(snap.timed_out_total == 1);
  CHECK(snap.unavailable_total == 1);
}

TEST_CASE("side requests: a release answered NOSCRIPT is not sent again; the lease renewal makes up for it",
          "[redis][semaphore]") {
  semaphore s(limit_of(2));
  const message release{refund, 0, 1, 7};
  s.line->update([&](policy& p, manual_clock::time_point) { p.on_side_error(release, true); });
  poll(s.io);
  CHECK(s.sent().empty());
  CHECK(s.snapshot().script_loads == 0);
  CHECK(s.snapshot().server_errors == 1);
}
