// The throttle's honest counts: admissions, re-admissions (re-takes) and give-backs told apart per stage,
// and the sum rule that ties them to each stage's own acquired_total (throttle_snapshot's docs).
#include "support/asio.hpp"
#include "support/catch.hpp"
#include "support/manual_time.hpp"

#include <rein/keyed.hpp>
#include <rein/quota_gate.hpp>
#include <rein/semaphore.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

using namespace std::chrono_literals;
namespace net = rein::net;
using rein_test::advance_and_poll;
using rein_test::manual_clock;

namespace {

using sem_type = rein::basic_semaphore<net::any_io_executor, manual_clock>;
using bucket_type = rein::basic_token_bucket<net::any_io_executor, manual_clock>;

// Keys live for the whole test: an evicted key's limiter would take its counters with it.
rein::keyed_options kept_keys() {
  rein::keyed_options o;
  o.idle_ttl = 1h;
  return o;
}

// Gates per key, 4 in flight per key, 2 in flight overall, and each key's rate 10/s with a burst of 1.
struct stages {
  using gate_type = rein::basic_quota_gate<net::any_io_executor, manual_clock>;

  net::io_context io;
  rein::keyed<gate_type> gates{io.get_executor(), rein::quota_gate_options{.jitter = 0.0}, {}, kept_keys()};
  rein::keyed<sem_type> per_key{io.get_executor(), std::size_t{4}, {}, kept_keys()};
  sem_type global{io.get_executor(), 2};
  rein::keyed<bucket_type> rate{
      io.get_executor(), rein::token_bucket_options{.rate = 10, .capacity = 1}, {}, kept_keys()};
  rein::throttle<rein::keyed<gate_type>, rein::keyed<sem_type>, sem_type, rein::keyed<bucket_type>> throttle{
      gates, per_key, global, rate};
};

using guard_type = decltype(stages::throttle)::guard;

// A rate stage that cannot go into debt (no charge(n)), counting its takes as a limiter's acquired_total.
struct counting_rate {
  using clock_type = manual_clock;
  std::size_t room;
  std::uint64_t acquired = 0;

  bool try_acquire(std::size_t n) {
    if (n > room) return false;
    room -= n;
    ++acquired;
    return true;
  }
  void refund(std::size_t n) { room += n; }
};

// A keyed stage's own acquired_total: the sum over its keys' limiters.
template <class Keyed>
std::uint64_t acquired_by_keys(Keyed& registry) {
  std::uint64_t n = 0;
  registry.for_each_snapshot([&](const auto&, const auto& s) { n += s.acquired_total; });
  return n;
}

struct expected {
  std::uint64_t admitted, readmitted, abandoned, given_back;
};

void check_stage(const rein::throttle_snapshot& s, std::size_t i, rein::throttle_stage kind, expected want) {
  INFO("stage " << i);
  REQUIRE(s.stages.size() == 4);
  const rein::throttle_stage_counts& c = s.stages[i];
  CHECK(c.position == i);
  CHECK(c.kind == kind);
  CHECK(c.admitted == want.admitted);
  CHECK(c.readmitted == want.readmitted);
  CHECK(c.abandoned == want.abandoned);
  CHECK(c.reconciled == 0);
  CHECK(c.given_back == want.given_back);
}

}  // namespace

TEST_CASE("counts: a key's rate refuses, others admit; every take is an admission, a re-take or abandoned",
          "[throttle][observability]") {
  rein_test::manual_clock_at_epoch epoch;
  stages s;

  // At 0: "slow" is admitted and spends its key's one token; a second try of "slow" takes the gate, its key's
  // permit and a global slot, then finds no token: all given back, each stage's take abandoned.
  auto a = s.throttle.try_acquire("slow");
  REQUIRE(a);
  auto refused = s.throttle.try_acquire("slow");
  REQUIRE_FALSE(refused);
  CHECK(refused.rejected_at() == rein::throttle_stage::rate);
  auto f = s.throttle.try_acquire("fast");  // another key: its own token, the second global slot
  REQUIRE(f);

  // Three more of "slow" while the global stage is full: each first try takes the gate and its key's permit
  // and finds no global slot; its waiting path keeps both (it would take them again at once: no re-take, no
  // give-back) and waits for its key's token, due at 100 ms. The third's deadline (50 ms) is before that: it
  // fails at once, abandoning both.
  std::optional<guard_type> w1, w2;
  std::optional<rein::error_code> t_ec;
  s.throttle.async_acquire("slow", [&](rein::error_code ec, guard_type g) {
    CHECK_FALSE(ec);
    w1 = std::move(g);
  });
  s.throttle.async_acquire("slow", [&](rein::error_code ec, guard_type g) {
    CHECK_FALSE(ec);
    w2 = std::move(g);
  });
  s.throttle.async_acquire_for("slow", 50ms, [&](rein::error_code ec, guard_type) { t_ec = ec; });
  rein_test::poll(s.io);
  REQUIRE(t_ec == rein::error_code(rein::errc::timed_out));

  // Under way, two acquires have each taken the gate and their key's permit once, not counted yet: their
  // first takes count when they end (admitted or abandoned). Given back: the refused try's permit and the
  // timed-out one's.
  {
    const rein::throttle_snapshot mid = s.throttle.snapshot();
    CHECK(mid.waiting == 2);
    CHECK(mid.admitted_total == 2);
    check_stage(mid, 0, rein::throttle_stage::gate, {.admitted = 2, .readmitted = 0, .abandoned = 2, .given_back = 0});
    check_stage(mid, 1, rein::throttle_stage::per_key,
                {.admitted = 2, .readmitted = 0, .abandoned = 2, .given_back = 2});
    CHECK(acquired_by_keys(s.gates) == mid.stages[0].acquired() + 2);
    CHECK(acquired_by_keys(s.per_key) == mid.stages[1].acquired() + 2);
  }

  // At 100 ms the key's line grants the first waiter the token; the global stage is full, so it refunds the
  // token (its claim is never held across a wait) and waits on the global line; the refund grants the second
  // waiter the token, which does the same. The two calls complete and the global line grants both. The first
  // to resume takes the token and is admitted; the other finds none, goes back to wait in its key's line for
  // the next token (200 ms), and gives its global slot back only then, as it must wait (not the gate: it is
  // checked again before admission, not passed again).
  advance_and_poll(s.io, 100ms);
  CHECK(s.global.snapshot().waiting == 2);
  a.complete(rein::outcome::success);
  f.complete(rein::outcome::success);
  rein_test::poll(s.io);
  CHECK((w1.has_value() != w2.has_value()));
  CHECK(s.global.snapshot().in_flight == 1);
  advance_and_poll(s.io, 100ms);
  REQUIRE(w1);
  REQUIRE(w2);
  CHECK(static_cast<bool>(*w1));
  CHECK(static_cast<bool>(*w2));
  w1->complete(rein::outcome::success);
  w2->complete(rein::outcome::success);

  const rein::throttle_snapshot snap = s.throttle.snapshot();
  CHECK(snap.waiting == 0);
  CHECK(snap.in_flight == 0);
  CHECK(snap.acquired_total == 4);  // a, f and the two waiters
  CHECK(snap.admitted_total == 4);
  CHECK(snap.rejected_rate == 1);
  CHECK(snap.timed_out_total == 1);
  CHECK(snap.failed_total == 1);
  CHECK(snap.rejected_total == 2);
  CHECK(snap.rejected_gate == 0);
  CHECK(snap.rejected_per_key == 0);
  CHECK(snap.rejected_global == 0);
  CHECK(snap.queue_full_total == 0);
  CHECK(snap.closed_total == 0);
  CHECK(snap.exceeds_capacity_total == 0);
  CHECK(snap.unavailable_total == 0);
  CHECK(snap.cancelled_total == 0);
  CHECK(snap.rejections_reported == 0);
  CHECK(snap.wait.count() == 4);
  // The gate: once per acquire (a, refused, f, the two waiters, the timed-out one); the waiting path goes on
  // from the first try's pass.
  check_stage(snap, 0, rein::throttle_stage::gate, {.admitted = 4, .readmitted = 0, .abandoned = 2, .given_back = 0});
  // Each key's permit: as the gate (kept from the first try, and while the key's rate is awaited); given back
  // by the two acquires that ended without admission.
  check_stage(snap, 1, rein::throttle_stage::per_key,
              {.admitted = 4, .readmitted = 0, .abandoned = 2, .given_back = 2});
  // The global slot: a, refused, f, each waiter's grant on the line, and the re-take of the one sent back.
  check_stage(snap, 2, rein::throttle_stage::global, {.admitted = 4, .readmitted = 1, .abandoned = 1, .given_back = 2});
  // The rate: taken once per admission, and by each waiter's grant on its key's line at 100 ms, refunded
  // before its wait for a global slot (a re-take when taken again at admission); the refusal took nothing.
  check_stage(snap, 3, rein::throttle_stage::rate, {.admitted = 4, .readmitted = 2, .abandoned = 0, .given_back = 2});
  // The global slot of the caller that had to wait for its key's rate with it (given back, since another key
  // may need it), and the two tokens of the key's line given back before the global wait. Before the waiting
  // path kept what the first try took, this schedule counted 8 re-takes and 7 give-backs: the gate asked 10
  // times and the permits taken 9.
  CHECK(snap.readmitted_total == 3);
  CHECK(snap.given_back_total == 6);

  // The sum rule: each stage's own count is the throttle's admissions, re-takes and abandoned first takes.
  CHECK(acquired_by_keys(s.gates) == 6);
  CHECK(acquired_by_keys(s.per_key) == 6);
  CHECK(s.global.snapshot().acquired_total == 6);
  CHECK(acquired_by_keys(s.rate) == 6);
  CHECK(acquired_by_keys(s.gates) == snap.stages[0].acquired());
  CHECK(acquired_by_keys(s.per_key) == snap.stages[1].acquired());
  CHECK(s.global.snapshot().acquired_total == snap.stages[2].acquired());
  CHECK(acquired_by_keys(s.rate) == snap.stages[3].acquired());
  for (const rein::throttle_stage_counts& c : snap.stages) {
    CHECK(c.admitted == snap.admitted_total);  // every call charged every stage
    if (c.kind != rein::throttle_stage::gate) CHECK(c.given_back == c.readmitted + c.abandoned);
  }
}

TEST_CASE("counts: a stage charged 0 is not taken, and reconcile's extra take counts apart",
          "[throttle][observability]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  sem_type global(io.get_executor(), 2);
  bucket_type tokens(io.get_executor(), rein::token_bucket_options{.rate = 100, .capacity = 100});
  counting_rate budget{100};
  rein::throttle t(global, rein::by_tokens(tokens), rein::by_tokens(budget));

  auto none = t.try_acquire("k", {.requests = 1, .tokens = 0});  // the token stages are passed, not asked
  REQUIRE(none);
  auto some = t.try_acquire("k", {.requests = 1, .tokens = 10});
  REQUIRE(some);
  // 5 more tokens: the bucket goes into debt (charged, not taken); the budget, which cannot, is asked.
  some.reconcile({.requests = 1, .tokens = 15});
  none.complete(rein::outcome::success);
  some.complete(rein::outcome::success);

  const rein::throttle_snapshot s = t.snapshot();
  CHECK(s.admitted_total == 2);
  REQUIRE(s.stages.size() == 3);
  CHECK(s.stages[0].admitted == 2);
  CHECK(s.stages[1].admitted == 1);
  CHECK(s.stages[1].reconciled == 0);
  CHECK(s.stages[2].admitted == 1);
  CHECK(s.stages[2].reconciled == 1);
  CHECK(s.readmitted_total == 0);
  CHECK(s.given_back_total == 0);
  CHECK(tokens.tokens() == 85.0);
  CHECK(budget.room == 85);
  // The sum rule, with reconcile's take.
  CHECK(global.snapshot().acquired_total == s.stages[0].acquired());
  CHECK(tokens.snapshot().acquired_total == s.stages[1].acquired());
  CHECK(budget.acquired == 2);
  CHECK(budget.acquired == s.stages[2].acquired());
}

TEST_CASE("counts: a refusal at a global rate keeps the global slot; nothing is given back and taken again",
          "[throttle][observability]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  sem_type global(io.get_executor(), 2);
  bucket_type rate(io.get_executor(), rein::token_bucket_options{.rate = 10, .capacity = 1});
  rein::throttle t(global, rate);
  using guard = decltype(t)::guard;

  auto a = t.try_acquire("k");  // the one token
  REQUIRE(a);
  std::optional<guard> w;
  t.async_acquire("k", [&](rein::error_code ec, guard g) {
    CHECK_FALSE(ec);
    w = std::move(g);
  });
  rein_test::poll(io);
  // The first try took a global slot and found no token: the waiting path keeps the slot (every key needs
  // this rate, so holding it delays nobody behind another key) and waits on the rate's line.
  CHECK(global.snapshot().in_flight == 2);
  CHECK(rate.snapshot().waiting == 1);
  advance_and_poll(io, 100ms);
  REQUIRE(w);
  REQUIRE(static_cast<bool>(*w));
  w->complete(rein::outcome::success);
  a.complete(rein::outcome::success);

  const rein::throttle_snapshot s = t.snapshot();
  CHECK(s.admitted_total == 2);
  REQUIRE(s.stages.size() == 2);
  CHECK(s.stages[0].admitted == 2);
  CHECK(s.stages[0].readmitted == 0);  // given back and taken again before
  CHECK(s.stages[0].given_back == 0);
  CHECK(s.stages[1].admitted == 2);
  CHECK(s.readmitted_total == 0);
  CHECK(s.given_back_total == 0);
  CHECK(global.snapshot().acquired_total == 2);  // one take per admission
  CHECK(global.snapshot().acquired_total == s.stages[0].acquired());
  CHECK(rate.snapshot().acquired_total == s.stages[1].acquired());
}

TEST_CASE("a stage's sojourn rule sheds a waiting admission: errc::overloaded, counted as such",
          "[throttle][counts][sojourn]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  sem_type global{io.get_executor(), 1, {.sojourn = {.target = 10ms, .interval = 100ms}}};
  rein::throttle<sem_type> throttle{global};
  rein::permit held = global.try_acquire();  // nothing drains the line
  std::optional<rein::error_code> result;
  throttle.async_acquire("k", [&](rein::error_code ec, auto) { result = ec; });
  rein_test::poll(io);
  advance_and_poll(io, 100ms);  // the line's timer judges [0, 100): it began empty, so it does not stand
  advance_and_poll(io, 99ms);
  CHECK_FALSE(result);
  advance_and_poll(io, 1ms);  // [100, 200) stood: the waiter, 200 ms old, is past 2 x 10 ms
  REQUIRE(result);
  CHECK(*result == rein::errc::overloaded);
  const auto s = throttle.snapshot();
  CHECK(s.overloaded_total == 1);
  CHECK(s.rejected_total == 1);
  CHECK(s.failed_total == 1);
  CHECK(global.snapshot().overloaded_total == 1);
}
