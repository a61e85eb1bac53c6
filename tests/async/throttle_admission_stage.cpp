// rein::admission_throttle as a stage of rein::throttle: asked first, before anything is pinned or taken, on
// both doors; a refusal fails at once (errc::admission_refused on the waiting doors), holding nothing, and is
// counted as the stage's; the guard's outcome reaches it, and an acquire that ends without admission reports
// nothing. Seeded draws on the manual clock: exact counts.
#include "support/asio.hpp"
#include "support/catch.hpp"
#include "support/manual_time.hpp"

#include <rein/admission_throttle.hpp>
#include <rein/keyed.hpp>
#include <rein/quota_gate.hpp>
#include <rein/rate_limit_headers.hpp>
#include <rein/semaphore.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>

using namespace std::chrono_literals;
namespace net = rein::net;
using rein::outcome;
using rein_test::advance_and_poll;
using rein_test::manual_clock;

namespace {

using admission_type = rein::basic_admission_throttle<manual_clock>;
using gate_type = rein::basic_quota_gate<net::any_io_executor, manual_clock>;
using sem_type = rein::basic_semaphore<net::any_io_executor, manual_clock>;
using bucket_type = rein::basic_token_bucket<net::any_io_executor, manual_clock>;

rein::admission_throttle_options seeded() { return {.window = 10s, .seed = 7}; }

// The backend: of the calls it is sent, it accepts every fourth and refuses the others for overload.
bool backend_accepts(int sent) { return sent % 4 == 0; }

// The admission stage first, then a key's gate, a key's permit, a global permit and a rate.
struct stages {
  net::io_context io;
  admission_type admit{seeded()};
  rein::keyed<gate_type> gates{io.get_executor(), rein::quota_gate_options{.jitter = 0.0}};
  rein::keyed<sem_type> per_key{io.get_executor(), std::size_t{4}};
  sem_type global{io.get_executor(), 1};
  bucket_type rate{io.get_executor(), rein::token_bucket_options{.rate = 1000, .capacity = 1000}};
  rein::throttle<admission_type, rein::keyed<gate_type>, rein::keyed<sem_type>, sem_type, bucket_type> throttle{
      admit, gates, per_key, global, rate};
};

using guard_type = decltype(stages::throttle)::guard;

}  // namespace

TEST_CASE("admission stage: refuses what the standalone throttle refuses, for the same seed and outcomes",
          "[throttle][admission_throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  // The standalone object, asked and told as docs/throttle.md said before it was a stage.
  admission_type alone(seeded());
  int alone_sent = 0;
  for (int i = 0; i < 400; ++i) {
    if (!alone.try_acquire()) continue;
    alone.record(backend_accepts(alone_sent++) ? outcome::success : outcome::congestion);
  }

  // The stage, through both doors in turn, each refusal of the backend reported one of the ways a guard can.
  net::io_context io;
  admission_type admit(seeded());
  sem_type global(io.get_executor(), 1);
  std::uint64_t reported_admission = 0;  // the throttle's observer: one event per refusal, reason admission
  rein::throttle throttle(admit, global, {.observer = [&](const rein::limiter_event& e) {
                            if (e.kind == rein::event_kind::rejected && e.reason == rein::reject_reason::admission)
                              ++reported_admission;
                          }});
  using small_guard = decltype(throttle)::guard;
  int sent = 0;
  std::uint64_t waiting_door_refusals = 0;
  for (int i = 0; i < 400; ++i) {
    std::optional<small_guard> g;
    if (i % 2 == 0) {
      g.emplace(throttle.try_acquire(""));
      if (!*g) {
        CHECK(g->rejected_at() == rein::throttle_stage::admission);
        CHECK(g->rejected_stage() == 0);
        continue;
      }
    } else {
      rein::error_code ec;
      throttle.async_acquire("", [&](rein::error_code e, small_guard r) {
        ec = e;
        g.emplace(std::move(r));
      });
      rein_test::poll(io);
      REQUIRE(g);
      if (ec) {
        CHECK(ec == rein::error_code(rein::errc::admission_refused));
        CHECK(g->rejected_at() == rein::throttle_stage::admission);
        CHECK(g->rejected_stage() == 0);
        ++waiting_door_refusals;
        continue;
      }
    }
    if (backend_accepts(sent++)) {
      if (i % 3 == 0) g->complete(outcome::success);
      else g->complete_http(200);
    } else if (i % 3 == 0) {
      g->complete_http(429);  // a refusal for load: congestion
    } else if (i % 3 == 1) {
      g->reject();
    } else {
      rein::upstream_response r;
      r.status = 429;
      r.result = outcome::congestion;
      r.too_many_requests = true;
      g->complete(r);
    }
  }

  const rein::admission_throttle_snapshot want = alone.snapshot();
  const rein::admission_throttle_snapshot got = admit.snapshot();
  CHECK(want.rejected_total == 337);
  CHECK(want.acquired_total == 63);
  CHECK(got.rejected_total == want.rejected_total);
  CHECK(got.acquired_total == want.acquired_total);
  CHECK(got.requests == want.requests);
  CHECK(got.accepts == want.accepts);
  CHECK(got.accepts == 16);
  CHECK(sent == alone_sent);

  const rein::throttle_snapshot s = throttle.snapshot();
  CHECK(s.rejected_admission == 337);
  CHECK(s.rejected_total == 337);  // every refusal is the admission stage's, counted once
  CHECK(reported_admission == 337);
  CHECK(waiting_door_refusals == 164);
  CHECK(s.failed_total == waiting_door_refusals);  // the waiting door's refusals are failures too
  CHECK(s.timed_out_total + s.queue_full_total + s.unavailable_total + s.cancelled_total == 0);
  CHECK(s.acquired_total == 63);
  CHECK(s.stages[0].kind == rein::throttle_stage::admission);
  CHECK(s.stages[0].admitted == 63);
  CHECK(s.stages[0].abandoned == 0);
  CHECK(s.stages[0].given_back == 0);  // it holds nothing
  // The sum rule: the stage's own count of admissions is the throttle's takes there.
  CHECK(got.acquired_total == s.stages[0].acquired());
  CHECK(global.snapshot().acquired_total == 63);  // only admitted calls reached the semaphore
}

TEST_CASE("admission stage: a refusal takes nothing from the later stages and pins no key",
          "[throttle][admission_throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  stages s;
  // Ten refusals from the backend, told to the stage itself: p = 10 / 11 for the next call.
  for (int i = 0; i < 10; ++i) s.admit.record(outcome::congestion);
  CHECK(s.admit.rejection_probability() == 10.0 / 11);
  const auto global_before = s.global.snapshot();
  const auto rate_before = s.rate.snapshot();
  const rein::throttle_snapshot before = s.throttle.snapshot();
  const std::size_t keys_before = s.gates.size();

  std::uint64_t refused = 0;
  for (int i = 0; i < 20; ++i) {
    const std::string key = "k" + std::to_string(i);  // a key of its own: a refusal must not make it
    auto g = s.throttle.try_acquire(key);
    if (g) {
      g.complete_http(503);
      continue;
    }
    ++refused;
    CHECK(g.rejected_at() == rein::throttle_stage::admission);
    CHECK(g.rejected_stage() == 0);
    CHECK_FALSE(s.gates.contains(key));
    CHECK_FALSE(s.per_key.contains(key));
  }
  CHECK(s.gates.size() == keys_before + (20 - refused));
  CHECK(refused == 19);
  const rein::throttle_snapshot after = s.throttle.snapshot();
  CHECK(after.rejected_admission == before.rejected_admission + refused);
  CHECK(after.rejected_total == refused);
  for (std::size_t i = 1; i < 5; ++i) {
    INFO("stage " << i);
    CHECK(after.stages[i].acquired() == before.stages[i].acquired() + (20 - refused));
    CHECK(after.stages[i].abandoned == 0);
    CHECK(after.stages[i].given_back == 0);
  }
  CHECK(s.global.snapshot().acquired_total == global_before.acquired_total + (20 - refused));
  CHECK(s.rate.snapshot().acquired_total == rate_before.acquired_total + (20 - refused));
  CHECK(s.admit.snapshot().rejected_total == refused);
}

TEST_CASE("admission stage: an acquire that times out or is cancelled at a later stage records nothing",
          "[throttle][admission_throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  stages s;
  auto holder = s.throttle.try_acquire("a");  // the one global permit
  REQUIRE(holder);
  const rein::admission_throttle_snapshot before = s.admit.snapshot();
  CHECK(before.requests == 0);  // an admission counts when its outcome is recorded

  std::optional<rein::error_code> timed_out;
  s.throttle.async_acquire_for("b", 50ms, [&](rein::error_code ec, guard_type) { timed_out = ec; });
  net::cancellation_signal cancel;
  std::optional<rein::error_code> cancelled;
  s.throttle.async_acquire("c", net::bind_cancellation_slot(cancel.slot(), [&](rein::error_code ec, guard_type) {
                             cancelled = ec;
                           }));
  rein_test::poll(s.io);
  cancel.emit(net::cancellation_type::terminal);
  advance_and_poll(s.io, 50ms);
  REQUIRE(timed_out == rein::error_code(rein::errc::timed_out));
  REQUIRE(cancelled == rein::error_code(net::error::operation_aborted));

  const rein::admission_throttle_snapshot mid = s.admit.snapshot();
  CHECK(mid.acquired_total == 3);  // the stage admitted all three
  CHECK(mid.requests == 0);        // and heard of none: two never reached the backend
  CHECK(mid.accepts == 0);
  const rein::throttle_snapshot t = s.throttle.snapshot();
  CHECK(t.stages[0].admitted == 1);
  CHECK(t.stages[0].abandoned == 2);
  CHECK(t.stages[0].acquired() == mid.acquired_total);
  CHECK(t.rejected_admission == 0);
  CHECK(t.timed_out_total == 1);
  CHECK(t.cancelled_total == 1);

  holder.complete_http(200);
  const rein::admission_throttle_snapshot end = s.admit.snapshot();
  CHECK(end.requests == 1);
  CHECK(end.accepts == 1);
}

namespace {

struct reply {
  int status = 0;
};

// The backend of the usage below: refuses every call for overload.
int backend_calls = 0;
net::awaitable<reply> http_get(const std::string&, const char*) {
  ++backend_calls;
  co_return reply{503};
}

}  // namespace

TEST_CASE("admission stage: the usage docs/throttle.md shows, against a backend that refuses every call",
          "[throttle][admission_throttle]") {
  net::io_context io;
  const std::uint64_t replica_id = 3;
  rein::keyed<rein::quota_gate> gates(io.get_executor(), rein::quota_gate_options{});
  rein::keyed<rein::semaphore> per_host(io.get_executor(), std::size_t{4});
  rein::semaphore global(io.get_executor(), 16);
  rein::keyed<rein::token_bucket> rate(io.get_executor(), rein::token_bucket_options{.rate = 1000, .capacity = 100});
  backend_calls = 0;

  rein::admission_throttle admission({.seed = replica_id});          // one per replica, a seed of its own
  rein::throttle upstream(admission, gates, per_host, global, rate);  // asked first: a refusal takes nothing

  auto call = [&](std::string host) -> net::awaitable<void> {
    auto guard = co_await upstream.acquire(host);                     // throws errc::admission_refused: not sent
    auto response = co_await http_get(host, "/v1/items");
    guard.complete_http(response.status);                             // 429, 503: the backend refused it
  };

  int refused = 0;
  for (int i = 0; i < 50; ++i) {
    net::co_spawn(io, call("host" + std::to_string(i % 5)), [&](std::exception_ptr e) {
      if (!e) return;
      try {
        std::rethrow_exception(e);
      } catch (const rein::throttle_error& failure) {
        CHECK(failure.code() == rein::error_code(rein::errc::admission_refused));
        CHECK(failure.kind() == rein::throttle_stage::admission);
        CHECK(failure.stage() == 0);
        CHECK(std::string(failure.what()).find("stage 0 (admission)") != std::string::npos);
        ++refused;
      }
    });
    io.run();
    io.restart();
  }
  CHECK(refused == 47);
  CHECK(backend_calls == 50 - refused);
  const rein::throttle_snapshot s = upstream.snapshot();
  CHECK(s.rejected_admission == 47);
  CHECK(s.failed_total == 47);
  CHECK(s.acquired_total == 3);
  CHECK(admission.snapshot().requests == 50);  // the sent ones recorded, the refused ones counted at once
  CHECK(admission.snapshot().accepts == 0);
  CHECK(global.snapshot().acquired_total == 3);
}
