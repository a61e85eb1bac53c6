// rein::quota_gate: its acceptance cases 1-3 on the manual clock, pauses that only extend, max_pause,
// the stratified jitter of the release, deadlines, cancellation, max_waiters, close, destruction, completion
// tokens, validation, and concurrent use from several threads.
#include "support/async.hpp"
#include "support/catch.hpp"

#include <rein/error.hpp>
#include <rein/quota_gate.hpp>
#include <rein/testing/manual_clock.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
using rein::errc;
using rein::error_code;
using rein::testing::manual_clock;
using rein_test::poll;
using time_point = manual_clock::time_point;
using gate_t = rein::basic_quota_gate<net::any_io_executor, manual_clock>;

time_point at(std::chrono::nanoseconds d) { return time_point{} + d; }

rein::quota_gate_options no_jitter() {
  rein::quota_gate_options o;
  o.jitter = 0.0;
  return o;
}

rein::quota_gate_options seeded(double jitter, std::uint64_t seed) {
  rein::quota_gate_options o;
  o.jitter = jitter;
  o.seed = seed;
  return o;
}

// One caller: how its wait ended, and when (manual time when the handler ran).
struct caller {
  std::optional<error_code> ec;
  std::chrono::nanoseconds at{-1};
  bool done() const { return ec.has_value(); }
  bool passed() const { return ec.has_value() && !*ec; }
};

// Callers live in a deque so that handlers may keep pointers to them.
struct callers {
  std::deque<caller> list;

  auto arrive(gate_t& gate) {
    caller* c = &list.emplace_back();
    gate.async_acquire(1, [c](error_code ec) {
      c->ec = ec;
      c->at = manual_clock::now().time_since_epoch();
    });
    return c;
  }

  auto arrive_until(gate_t& gate, time_point deadline) {
    caller* c = &list.emplace_back();
    gate.async_acquire_until(1, deadline, [c](error_code ec) {
      c->ec = ec;
      c->at = manual_clock::now().time_since_epoch();
    });
    return c;
  }
};

// The wall-clock instant the HTTP-date tests start from: Mon, 01 Jan 2024 00:00:00 GMT.
std::chrono::system_clock::time_point new_year_2024() {
  return std::chrono::sys_days{std::chrono::year{2024} / std::chrono::January / 1};
}

}  // namespace

TEST_CASE("acceptance 1: Retry-After -5 with a 1 s default: callers at 0.1 and 1.0 both proceed at 1.0",
          "[quota_gate][acceptance]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  gate_t gate(io, no_jitter());
  callers c;

  CHECK(gate.on_retry_after("-5", 1s) == at(1s));  // "absent": the default pause, never zero

  manual_clock::set(at(100ms));
  caller* early = c.arrive(gate);
  rein_test::set_and_poll(io, at(1s - 1ns));
  CHECK_FALSE(early->done());

  manual_clock::set(at(1s));
  caller* late = c.arrive(gate);  // arrives at 1.0, while the early one is still queued
  poll(io);
  REQUIRE(early->passed());
  REQUIRE(late->passed());
  CHECK(early->at == 1s);
  CHECK(late->at == 1s);
  CHECK(gate.try_acquire());  // and anyone else at 1.0 goes at once
}

TEST_CASE("acceptance 2: Retry-After as an HTTP-date, garbage, and zero", "[quota_gate][acceptance]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  gate_t gate(io, no_jitter());
  callers c;

  SECTION("an HTTP-date 30 s ahead pauses until 30") {
    CHECK(gate.on_retry_after("Mon, 01 Jan 2024 00:00:30 GMT", 1s, new_year_2024()) == at(30s));
    caller* waiter = c.arrive(gate);
    rein_test::set_and_poll(io, at(30s - 1ns));
    CHECK_FALSE(waiter->done());
    rein_test::set_and_poll(io, at(30s));
    REQUIRE(waiter->passed());
    CHECK(waiter->at == 30s);
  }
  SECTION("the asctime and RFC 850 forms too") {
    CHECK(gate.on_retry_after("Mon Jan  1 00:00:30 2024", 1s, new_year_2024()) == at(30s));
    CHECK(gate.on_retry_after("Monday, 01-Jan-24 00:00:45 GMT", 1s, new_year_2024()) == at(45s));
  }
  SECTION("\"soon\" pauses for the default") {
    CHECK(gate.on_retry_after("soon", 1500ms, new_year_2024()) == at(1500ms));
    caller* waiter = c.arrive(gate);
    rein_test::set_and_poll(io, at(1500ms));
    REQUIRE(waiter->passed());
    CHECK(waiter->at == 1500ms);
  }
  SECTION("\"0\" lets callers proceed at once") {
    gate.on_retry_after("0", 1s, new_year_2024());
    CHECK_FALSE(gate.is_paused());
    CHECK(gate.try_acquire());
    caller* waiter = c.arrive(gate);
    poll(io);
    REQUIRE(waiter->passed());
    CHECK(waiter->at == 0s);
    CHECK(gate.snapshot().pause_requests == 0);
  }
  SECTION("a date in the past also means now") {
    gate.on_retry_after("Sun, 31 Dec 2023 23:59:00 GMT", 1s, new_year_2024());
    CHECK(gate.try_acquire());
  }
}

TEST_CASE("acceptance 3: Retry-After 90 at 0.00 and 60 at 0.01 resume at 90.00, not 60.01",
          "[quota_gate][acceptance]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  gate_t gate(io, no_jitter());
  callers c;

  CHECK(gate.on_retry_after("90", 1s) == at(90s));
  manual_clock::set(at(10ms));
  CHECK(gate.on_retry_after("60", 1s) == at(90s));
  manual_clock::set(at(20ms));
  caller* waiter = c.arrive(gate);

  rein_test::set_and_poll(io, at(60s + 10ms));
  CHECK_FALSE(waiter->done());
  CHECK_FALSE(gate.try_acquire());
  rein_test::set_and_poll(io, at(90s - 1ns));
  CHECK_FALSE(waiter->done());
  rein_test::set_and_poll(io, at(90s));
  REQUIRE(waiter->passed());
  CHECK(waiter->at == 90s);

  const auto s = gate.snapshot();
  CHECK(s.pause_requests == 2);
  CHECK(s.pauses == 1);
  CHECK(s.paused_until == at(90s));
  CHECK_FALSE(s.paused);
}

TEST_CASE("pauses only extend: the latest end wins, whichever call made it", "[quota_gate]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  gate_t gate(io, no_jitter());

  CHECK(gate.paused_until() == time_point::min());
  CHECK(gate.pause_for(10s) == at(10s));
  CHECK(gate.pause_until(at(5s)) == at(10s));
  CHECK(gate.pause_for(-3s) == at(10s));
  CHECK(gate.pause_for(0s) == at(10s));
  manual_clock::set(at(1s));
  CHECK(gate.pause_for(20s) == at(21s));
  CHECK(gate.pause_until(at(21s)) == at(21s));

  const auto s = gate.snapshot();
  CHECK(s.pause_requests == 4);  // the negative and zero pauses ask for nothing
  CHECK(s.pauses == 2);
  CHECK(s.capped == 0);
  CHECK(s.paused);
}

TEST_CASE("max_pause caps absurd pauses, and the snapshot counts them", "[quota_gate]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::quota_gate_options options = no_jitter();
  options.max_pause = 60s;
  gate_t gate(io, options);

  CHECK(gate.on_retry_after("86400", 1s) == at(60s));
  CHECK(gate.on_retry_after("99999999999999999999999999", 1s) == at(60s));  // saturated by the parser
  CHECK(gate.on_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", 1s, new_year_2024()) == at(60s));
  CHECK(gate.pause_until(time_point::max()) == at(60s));
  CHECK(gate.pause_for(manual_clock::duration::max()) == at(60s));
  CHECK(gate.pause_for(60s) == at(60s));  // exactly the cap is not capped

  manual_clock::set(at(30s));
  CHECK(gate.pause_for(1h) == at(90s));  // the cap counts from now

  const auto s = gate.snapshot();
  CHECK(s.capped == 6);
  CHECK(s.pauses == 2);
  CHECK(s.pause_requests == 7);
}

namespace {

// Ten callers arrive during a 10 s pause (one every 0.9 s); the clock then steps through the release window
// in 1 ms steps. Returns when each was let through (manual time of its handler), in arrival order.
std::vector<std::chrono::nanoseconds> release_times(const rein::quota_gate_options& options) {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  gate_t gate(io, options);
  callers c;
  gate.pause_for(10s);
  for (int i = 0; i < 10; ++i) {
    manual_clock::set(at(i * 900ms));
    c.arrive(gate);
  }
  for (std::chrono::nanoseconds t = 9s; t <= 12s; t += 1ms) rein_test::set_and_poll(io, at(t));
  std::vector<std::chrono::nanoseconds> times;
  for (const caller& one : c.list) {
    REQUIRE(one.passed());
    times.push_back(one.at);
  }
  return times;
}

}  // namespace

TEST_CASE("waiters resume spread over the jitter window, one in each slice, in arrival order", "[quota_gate][jitter]") {
  // jitter 0.1 of a 10 s pause: a 1 s window after 10 s, ten slices of 100 ms.
  const auto times = release_times(seeded(0.1, 42));
  REQUIRE(times.size() == 10);
  for (std::size_t k = 0; k < times.size(); ++k) {
    INFO("waiter " << k << " resumed at " << times[k].count() << " ns");
    const auto slice_start = 10s + static_cast<int>(k) * 100ms;
    CHECK(times[k] >= slice_start);
    CHECK(times[k] <= slice_start + 100ms);  // the clock steps by 1 ms: a release inside the slice shows by its end
    if (k > 0) CHECK(times[k] > times[k - 1]);
  }
}

TEST_CASE("the jitter is reproducible from its seed, and differs between seeds", "[quota_gate][jitter]") {
  const auto first = release_times(seeded(0.1, 7));
  CHECK(release_times(seeded(0.1, 7)) == first);
  CHECK(release_times(seeded(0.1, 8)) != first);
}

TEST_CASE("without jitter every waiter resumes at the pause's end", "[quota_gate][jitter]") {
  const auto times = release_times(seeded(0.0, 42));
  for (const auto t : times) CHECK(t == 10s);
}

TEST_CASE("the jitter window is the fraction of the pause, capped by max_jitter", "[quota_gate][jitter]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::quota_gate_options options = seeded(0.5, 1);
  options.max_jitter = 200ms;
  gate_t gate(io, options);
  callers c;
  gate.pause_for(2s);
  for (int i = 0; i < 4; ++i) c.arrive(gate);
  rein_test::set_and_poll(io, at(2s));
  CHECK(gate.snapshot().jitter_window == 200ms);  // 0.5 x 2 s = 1 s, cut to 200 ms
  rein_test::set_and_poll(io, at(2s + 200ms));
  for (const caller& one : c.list) {
    REQUIRE(one.passed());
    CHECK(one.at >= 2s);
  }
}

TEST_CASE("the window spans the whole pause when it was extended", "[quota_gate][jitter]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  gate_t gate(io, seeded(0.1, 3));
  callers c;
  gate.pause_for(4s);
  c.arrive(gate);
  manual_clock::set(at(2s));
  gate.pause_for(6s);  // closed from 0 to 8 s: the window is 0.8 s
  rein_test::set_and_poll(io, at(8s));
  rein_test::set_and_poll(io, at(8s + 800ms));
  CHECK(gate.snapshot().jitter_window == 800ms);
  REQUIRE(c.list.front().passed());
}

TEST_CASE("a new pause during the release holds the rest until its end", "[quota_gate][jitter]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  gate_t gate(io, seeded(0.1, 5));
  callers c;
  gate.pause_for(10s);
  for (int i = 0; i < 4; ++i) c.arrive(gate);  // released over [10 s, 11 s), 250 ms slices
  for (std::chrono::nanoseconds t = 10s; t <= 10s + 250ms; t += 1ms) rein_test::set_and_poll(io, at(t));
  auto count_passed = [&] {
    std::size_t n = 0;
    for (const caller& one : c.list) n += one.passed() ? 1 : 0;
    return n;
  };
  const std::size_t passed_before = count_passed();
  CHECK(passed_before >= 1);  // the first slice is over
  CHECK(passed_before <= 2);  // the second may have been due at its very start

  CHECK(gate.pause_for(5s) == at(15s + 250ms));  // a new 429: open since 10 s, so a new episode of 5 s
  for (std::chrono::nanoseconds t = 10s + 251ms; t < 15s + 250ms; t += 1ms) rein_test::set_and_poll(io, at(t));
  CHECK(count_passed() == passed_before);

  for (std::chrono::nanoseconds t = 15s + 250ms; t <= 15s + 750ms; t += 1ms) rein_test::set_and_poll(io, at(t));
  CHECK(gate.snapshot().jitter_window == 500ms);  // 0.1 x 5 s
  CHECK(count_passed() == 4);
  for (std::size_t k = passed_before; k < c.list.size(); ++k) {
    CHECK(c.list[k].at >= 15s + 250ms);
    CHECK(c.list[k].at <= 15s + 750ms);
  }
}

TEST_CASE("callers after the pause are not jittered and do not overtake those being released",
          "[quota_gate][jitter]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  gate_t gate(io, seeded(0.1, 11));
  callers c;
  gate.pause_for(10s);
  for (int i = 0; i < 3; ++i) c.arrive(gate);
  rein_test::set_and_poll(io, at(10s));
  CHECK_FALSE(gate.try_acquire());  // waiters are still being released: no overtaking
  caller* newcomer = c.arrive(gate);
  for (std::chrono::nanoseconds t = 10s; t <= 11s; t += 1ms) rein_test::set_and_poll(io, at(t));
  REQUIRE(newcomer->passed());
  CHECK(newcomer->at == c.list[2].at);  // straight after the last of the batch, no jitter of its own
  CHECK(gate.try_acquire());

  caller* later = c.arrive(gate);  // nobody waits: through at once
  poll(io);
  REQUIRE(later->passed());
  CHECK(later->at == 11s);
}

TEST_CASE("a deadline before the pause's end fails at once; one after it is met", "[quota_gate][deadline]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  gate_t gate(io, no_jitter());
  callers c;
  gate.pause_for(1s);
  caller* hopeless = c.arrive_until(gate, at(500ms));
  caller* exact = c.arrive_until(gate, at(1s));
  caller* patient = c.arrive_until(gate, at(2s));
  poll(io);
  REQUIRE(hopeless->done());
  CHECK(*hopeless->ec == errc::timed_out);
  CHECK(hopeless->at == 0s);
  rein_test::set_and_poll(io, at(1s));
  REQUIRE(exact->passed());  // a release at the deadline's instant wins
  REQUIRE(patient->passed());
  const auto s = gate.snapshot();
  CHECK(s.timed_out_total == 1);
  CHECK(s.acquired_total == 2);
}

TEST_CASE("a deadline inside the jitter window expires at the deadline", "[quota_gate][deadline]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  gate_t gate(io, seeded(0.5, 9));
  callers c;
  gate.pause_for(2s);  // window 1 s; ten waiters, slices of 100 ms
  for (int i = 0; i < 9; ++i) c.arrive(gate);
  caller* last = c.arrive_until(gate, at(2s + 850ms));  // its slice is [2.9 s, 3 s)
  rein_test::set_and_poll(io, at(2s + 850ms));
  REQUIRE(last->done());
  CHECK(*last->ec == errc::timed_out);
  CHECK(last->at == 2s + 850ms);
}

TEST_CASE("a cancelled waiter completes with operation_aborted and the others still pass", "[quota_gate][cancel]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  gate_t gate(io, no_jitter());
  gate.pause_for(1s);

  for (auto type : {net::cancellation_type::terminal, net::cancellation_type::partial, net::cancellation_type::total}) {
    net::cancellation_signal signal;
    std::optional<error_code> cancelled_ec;
    gate.async_acquire(1, net::bind_cancellation_slot(signal.slot(), [&](error_code ec) { cancelled_ec = ec; }));
    poll(io);
    CHECK_FALSE(cancelled_ec);
    signal.emit(type);
    poll(io);
    REQUIRE(cancelled_ec);
    CHECK(*cancelled_ec == net::error::operation_aborted);
  }
  callers c;
  caller* other = c.arrive(gate);
  rein_test::set_and_poll(io, at(1s));
  CHECK(other->passed());
  CHECK(gate.snapshot().cancelled_total == 3);
}

TEST_CASE("a cancellation after the release but before the handler runs wins", "[quota_gate][cancel]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  gate_t gate(io, no_jitter());
  gate.pause_for(1s);
  net::cancellation_signal signal;
  std::optional<error_code> result;
  gate.async_acquire(1, net::bind_cancellation_slot(signal.slot(), [&](error_code ec) { result = ec; }));
  manual_clock::set(at(1s));
  io.restart();
  REQUIRE(io.run_one() == 1);  // the timer: the waiter is released, its handler queued
  REQUIRE_FALSE(result);
  signal.emit(net::cancellation_type::terminal);
  poll(io);
  REQUIRE(result);
  CHECK(*result == net::error::operation_aborted);
  const auto s = gate.snapshot();
  CHECK(s.acquired_total == 0);
  CHECK(s.cancelled_total == 1);
}

TEST_CASE("every completion token waits for the pause to end", "[quota_gate][tokens]") {
  for (auto kind : rein_test::poll_tokens) {
    DYNAMIC_SECTION(rein_test::name(kind)) {
      rein_test::manual_clock_at_epoch epoch;
      net::io_context io;
      gate_t gate(io, no_jitter());
      gate.pause_for(1s);
      auto [handler, done] = rein_test::make_checked<error_code>();
      rein_test::launch(kind, io, [&](auto&& token) { return gate.async_acquire(1, std::move(token)); },
                        std::move(handler));
      poll(io);
      CHECK_FALSE(done->called());
      rein_test::set_and_poll(io, at(1s));
      REQUIRE(done->called());
      CHECK(done->ec() == error_code());
    }
  }
}

TEST_CASE("max_waiters bounds the waiting line", "[quota_gate]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  gate_t gate(io, no_jitter(), {.max_waiters = 1});
  callers c;
  gate.pause_for(1s);
  caller* first = c.arrive(gate);
  caller* second = c.arrive(gate);
  poll(io);
  REQUIRE(second->done());
  CHECK(*second->ec == errc::queue_full);
  CHECK_FALSE(first->done());
  CHECK(gate.snapshot().queue_full_total == 1);
}

TEST_CASE("close completes waiters with closed and refuses later callers", "[quota_gate]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  gate_t gate(io, no_jitter());
  callers c;
  gate.pause_for(1s);
  caller* waiting = c.arrive(gate);
  gate.close();
  caller* later = c.arrive(gate);
  poll(io);
  CHECK(*waiting->ec == errc::closed);
  CHECK(*later->ec == errc::closed);
  rein_test::set_and_poll(io, at(2s));
  CHECK_FALSE(gate.try_acquire());
}

TEST_CASE("destroying the gate completes its waiters with operation_aborted", "[quota_gate]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  callers c;
  {
    gate_t gate(io, no_jitter());
    gate.pause_for(1s);
    c.arrive(gate);
  }
  poll(io);
  REQUIRE(c.list.front().done());
  CHECK(*c.list.front().ec == net::error::operation_aborted);
}

TEST_CASE("acquire() passes at once when open and waits out a pause", "[quota_gate][coroutine]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  gate_t gate(io, no_jitter());
  std::vector<std::chrono::nanoseconds> passed;
  std::optional<error_code> timeout_error;

  auto body = [&]() -> net::awaitable<void> {
    co_await gate.acquire();
    passed.push_back(manual_clock::now().time_since_epoch());
    gate.pause_for(1s);
    try {
      co_await gate.acquire_for(1, 500ms);
    } catch (const rein::system_error& e) {
      timeout_error = e.code();
    }
    co_await gate.acquire();
    passed.push_back(manual_clock::now().time_since_epoch());
  };
  net::co_spawn(io, body(), net::detached);
  poll(io);
  REQUIRE(timeout_error);
  CHECK(*timeout_error == errc::timed_out);
  rein_test::set_and_poll(io, at(1s));
  CHECK(passed == std::vector<std::chrono::nanoseconds>{0s, 1s});
}

TEST_CASE("idle() and the snapshot follow the pause", "[quota_gate]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  gate_t gate(io, no_jitter());
  callers c;
  CHECK(gate.idle());
  gate.pause_for(1s);
  CHECK_FALSE(gate.idle());
  c.arrive(gate);
  poll(io);
  auto s = gate.snapshot();
  CHECK(s.waiting == 1);
  CHECK(s.paused);
  rein_test::set_and_poll(io, at(1s));
  CHECK(gate.idle());
  s = gate.snapshot();
  CHECK(s.waiting == 0);
  CHECK(s.acquired_total == 1);
  CHECK(s.wait_total == 1s);
  CHECK(s.wait_max == 1s);
}

TEST_CASE("invalid options are rejected with the field and the value", "[quota_gate][validation]") {
  net::io_context io;
  auto message = [&](rein::quota_gate_options o, rein::line_options line = {}) {
    try {
      gate_t gate(io, o, std::move(line));
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  rein::quota_gate_options o;
  o.max_pause = 0s;
  CHECK(message(o) == "rein::quota_gate: max_pause must be > 0, got 0 ns");
  o = {};
  o.max_pause = -1s;
  CHECK(message(o) == "rein::quota_gate: max_pause must be > 0, got -1000000000 ns");
  o = {};
  o.jitter = -0.5;
  CHECK(message(o) == "rein::quota_gate: jitter must be in [0, 1], got -0.5");
  o.jitter = 1.5;
  CHECK(message(o) == "rein::quota_gate: jitter must be in [0, 1], got 1.5");
  o.jitter = std::nan("");
  CHECK(message(o) == "rein::quota_gate: jitter must be in [0, 1], got nan");
  o = {};
  o.max_jitter = -1ns;
  CHECK(message(o) == "rein::quota_gate: max_jitter must be >= 0, got -1 ns");
  CHECK(message({}, {.order = rein::queue_order::lifo}) ==
        "rein::quota_gate: order must be fifo (its release is spread in arrival order), got lifo");
  o = {};
  o.jitter = 2.0;
  CHECK(message(o, {.name = "llm"}) == "rein::quota_gate \"llm\": jitter must be in [0, 1], got 2");
  o = {};
  o.max_pause = 0s;
  CHECK(message(o, {.name = "llm"}) == "rein::quota_gate \"llm\": max_pause must be > 0, got 0 ns");
}

TEST_CASE("many threads pause, wait and poll the gate at once", "[quota_gate][threads]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  gate_t gate(io, seeded(0.1, 13));
  gate.pause_for(1s);
  auto work = net::make_work_guard(io);
  std::vector<std::thread> runners;
  for (int i = 0; i < 2; ++i) runners.emplace_back([&] { io.run(); });

  constexpr int per_thread = 200;
  std::atomic<int> passed{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> callers_threads;
  for (int t = 0; t < 3; ++t) {
    callers_threads.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) {
        gate.async_acquire(1, [&](error_code ec) { (ec ? failed : passed).fetch_add(1); });
        if (i % 50 == 0) gate.pause_for(std::chrono::milliseconds(500 + 100 * t));
        (void)gate.try_acquire();
        (void)gate.snapshot();
      }
    });
  }
  for (auto& t : callers_threads) t.join();
  manual_clock::set(at(1h));  // past every pause and window: the runners' timer notices within 1 ms
  work.reset();
  for (auto& t : runners) t.join();
  CHECK(failed.load() == 0);
  CHECK(passed.load() == 3 * per_thread);
  CHECK(gate.snapshot().waiting == 0);
}

TEST_CASE("try_acquire_at(n, now) decides at the caller's reading", "[quota_gate][fast_path]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  gate_t gate(io, no_jitter());
  gate.pause_for(1s);
  manual_clock::set(at(1s));
  const rein::try_result early = gate.try_acquire_at(1, at(999ms));  // read while the pause still held
  CHECK_FALSE(early);
  CHECK(early.status() == rein::try_status::busy);
  CHECK(early.retry_after() == 1ms);
  CHECK(gate.try_acquire_at(1, time_point::min()).retry_after() == std::chrono::nanoseconds::max());
  CHECK(gate.try_acquire_at(1, at(1s)));
}
