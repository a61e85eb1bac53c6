// The shared quota gate's admission rule on rein's wait line, without Redis (see scripted_fixture.hpp):
// hand-made verdicts of the gate's script, exact times on rein::testing::manual_clock.
#include "redis/scripted_fixture.hpp"

#include <rein/observer.hpp>
#include <rein/redis/detail/gate_admission.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using namespace rein_test::scripted;
using rein::redis::failure_policy;
using rein::redis::shared_quota_gate_options;
using rein_test::advance_and_poll;
using rein_test::manual_clock;
using rein_test::poll;

using gate = scripted_fixture<rein::redis::detail::gate_admission<manual_clock>>;
constexpr auto pause_message = message::kind::pause;

shared_quota_gate_options no_jitter(std::size_t max_in_flight = 64) {
  return {.key = "api.example.com", .jitter = 0, .max_in_flight = max_in_flight};
}

// What pause_for does under the line's lock.
manual_clock::time_point pause_for(gate& g, manual_clock::duration d) {
  return g.line->update([&](gate::policy_type& p, tp now) {
    p.send(p.model().pause(d, now));
    return p.model().local_release();
  });
}

}  // namespace

TEST_CASE("gate admission: an open gate admits every acquire, pipelined", "[redis][gate]") {
  gate g(no_jitter(2));
  result r[3];
  for (auto& x : r) g.acquire(x, 1);
  CHECK(g.sent() == messages{{admission, 0, 1}, {admission, 1, 1}});
  g.settle(0, allowed(0));
  poll(g.io);
  CHECK(r[0].ec == error_code{});
  CHECK(g.sent().back() == message{admission, 2, 1});
  g.settle(1, allowed(0));
  g.settle(2, allowed(0));
  poll(g.io);
  CHECK(r[1].ec == error_code{});
  CHECK(r[2].ec == error_code{});
  CHECK(g.snapshot().remote_allowed == 3);
}

TEST_CASE("gate admission: a pause stored by another process holds the line until its release",
          "[redis][gate]") {
  gate g(no_jitter());
  result first, second, hurried;
  g.acquire(first, 1);
  g.acquire(second, 1);
  // Redis: paused, the release is 300 ms away (at server time 1,700,000,000,300,000 us).
  g.settle(0, denied(300000, 1700000000300000));
  g.settle(1, denied(300000, 1700000000300000));
  poll(g.io);
  CHECK_FALSE(first.done);
  CHECK_FALSE(second.done);
  CHECK(g.snapshot().release == std::chrono::system_clock::time_point(1700000000300000us));
  g.line->async_acquire([&hurried](error_code ec) { hurried = {true, ec, {}}; }, 1, manual_clock::now() + 100ms);
  advance_and_poll(g.io, 100ms);
  CHECK(hurried.ec == rein::errc::timed_out);  // behind the waiting head: at its deadline
  advance_and_poll(g.io, 199ms);
  CHECK(g.sent().size() == 2);  // no polling during the pause
  advance_and_poll(g.io, 1ms);
  CHECK(g.sent() == messages{{admission, 0, 1}, {admission, 1, 1}, {admission, 2, 1}, {admission, 3, 1}});
  g.settle(2, allowed(1700000000300000));
  g.settle(3, allowed(1700000000300000));
  poll(g.io);
  CHECK(first.ec == error_code{});
  CHECK(second.ec == error_code{});
  CHECK(g.snapshot().wait_total == 600ms);
}

TEST_CASE("gate admission: a pause this process writes is sent and holds its callers at once",
          "[redis][gate]") {
  gate g(no_jitter());
  const tp release = pause_for(g, 2s);
  CHECK(release == manual_clock::now() + 2s);
  poll(g.io);
  CHECK(g.sent() == messages{{pause_message, 0, 2000000, 0}});
  result soon, later;
  g.acquire(soon, 1, manual_clock::now() + 1s);
  poll(g.io);
  CHECK(soon.ec == rein::errc::timed_out);  // the pause ends after its deadline: at once
  g.acquire(later, 1);
  advance_and_poll(g.io, 1999ms);
  CHECK(g.sent().size() == 1);
  advance_and_poll(g.io, 1ms);
  CHECK(g.sent().back() == message{admission, 0, 1});
  g.settle(0, allowed(0));
  poll(g.io);
  CHECK(later.ec == error_code{});
  CHECK(g.snapshot().pauses == 1);
}

TEST_CASE("gate admission: the writer draws the jitter once, within jitter x pause and max_jitter; long pauses are cut",
          "[redis][gate]") {
  shared_quota_gate_options o{.key = "h", .max_pause = 60s, .jitter = 0.5, .max_jitter = 3s, .seed = 7};
  gate a(o), b(o);
  pause_for(a, 4s);
  pause_for(b, 4s);
  poll(a.io);
  poll(b.io);
  REQUIRE(a.sent().size() == 1);
  const message m = a.sent()[0];
  CHECK(m.what == pause_message);
  CHECK(m.n == 4000000);
  CHECK(m.extra >= 0);
  CHECK(m.extra <= 2000000);  // half of 4 s
  CHECK(b.sent() == a.sent());  // the same seed, the same draw
  pause_for(a, 10s);
  poll(a.io);
  CHECK(a.sent().back().extra <= 3000000);  // max_jitter
  pause_for(a, 2h);
  poll(a.io);
  CHECK(a.sent().back().n == 60000000);
  CHECK(a.snapshot().capped == 1);
  CHECK(a.snapshot().pauses == 3);
}

TEST_CASE("gate admission: fail_closed fails while Redis cannot be asked; fail_open admits unless paused here",
          "[redis][gate]") {
  SECTION("fail_closed") {
    gate g(no_jitter());
    result r;
    g.acquire(r, 1);
    g.settle(0, unavailable());
    poll(g.io);
    CHECK(r.ec == rein::redis::errc::unavailable);
  }
  SECTION("fail_open") {
    auto o = no_jitter();
    o.on_failure = failure_policy::fail_open;
    o.recheck_interval = 10s;
    gate g(o);
    result open, paused;
    g.acquire(open, 1);
    g.settle(0, unavailable());
    poll(g.io);
    CHECK(open.ec == error_code{});
    pause_for(g, 1s);  // the pause cannot reach Redis, but this process honours it
    g.acquire(paused, 1);
    advance_and_poll(g.io, 999ms);
    CHECK_FALSE(paused.done);
    advance_and_poll(g.io, 1ms);
    CHECK(paused.ec == error_code{});
    CHECK(g.snapshot().local_admitted == 2);
  }
}

TEST_CASE("gate admission: invalid options name the type, the field and the value", "[redis][gate]") {
  const auto message_of = [](shared_quota_gate_options o) {
    try {
      gate g(std::move(o));
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  CHECK(message_of({.key = "h", .jitter = 1.5}) == "rein::redis::shared_quota_gate: jitter must be in [0, 1], got 1.5");
  CHECK(message_of({.key = "h", .max_pause = 0ms}) == "rein::redis::shared_quota_gate: max_pause must be > 0, got 0ms");
  CHECK(message_of({.key = "h", .prefix = "{x}"}) ==
        "rein::redis::shared_quota_gate: prefix must not contain '{' or '}', got \"{x}\"");
}

TEST_CASE("gate admission: a named gate's observer hears a pause Redis reports start and end, by the time the "
          "reply says is left",
          "[redis][gate][observability]") {
  std::vector<std::string> events;
  rein::line_options line{.name = "api"};
  line.observer = [&events](const rein::limiter_event& e) {
    std::ostringstream text;
    text << e;
    events.push_back(text.str());
  };
  gate g(no_jitter(), std::move(line));
  result r;
  g.acquire(r, 1);
  verdict paused = denied(300000, 1700000000300000);
  paused.server_time_us = 1700000000000000;  // the release is 300 ms after the script ran
  g.settle(0, paused);
  poll(g.io);
  CHECK(events == std::vector<std::string>{"pause_started pause=300000000ns name=api"});
  CHECK(g.snapshot().paused);
  advance_and_poll(g.io, 300ms);  // the hold ends: the waiter asks again, and the pause is found over
  CHECK(events.back() == "pause_ended name=api");
  CHECK_FALSE(g.snapshot().paused);
  verdict open = allowed(1700000000300000);
  open.server_time_us = 1700000000300100;
  g.settle(1, open);
  poll(g.io);
  CHECK(r.ec == error_code{});
  CHECK(events.size() == 2);
}
