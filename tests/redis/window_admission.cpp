// The shared sliding window's admission rule on rein's wait line, without Redis (see scripted_fixture.hpp):
// hand-made verdicts of the sliding-log script, exact times on rein::testing::manual_clock.
#include "redis/scripted_fixture.hpp"

#include <rein/redis/detail/window_admission.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using namespace rein_test::scripted;
using rein::redis::failure_policy;
using rein::redis::shared_sliding_window_options;
using rein_test::advance_and_poll;
using rein_test::manual_clock;
using rein_test::poll;

using window = scripted_fixture<rein::redis::detail::window_admission<manual_clock>>;

shared_sliding_window_options per_second(std::int64_t limit, std::size_t max_in_flight = 64) {
  return {.key = "api", .limit = limit, .window = 1s, .max_in_flight = max_in_flight};
}

}  // namespace

TEST_CASE("window admission: as many requests fly as places are free; a denial holds until the oldest leaves",
          "[redis][window]") {
  window w(per_second(2));
  result r[3];
  for (auto& x : r) w.acquire(x, 1);
  // Before any reply the window is believed empty: 2 requests fly, the third waits for a reply.
  // Each says how many units this process waits for: the second counts the first, on the wire.
  CHECK(w.sent() == messages{{admission, 0, 1, 0, 1}, {admission, 1, 1, 0, 2}});
  w.settle(0, allowed(1));
  w.settle(1, allowed(0));
  poll(w.io);
  CHECK(r[0].ec == error_code{});
  CHECK(r[1].ec == error_code{});
  // No place is free, but only a denial says when one frees: one request asks.
  CHECK(w.sent() == messages{{admission, 0, 1, 0, 1}, {admission, 1, 1, 0, 2}, {admission, 2, 1, 0, 1}});
  w.settle(2, denied(400000, 0));  // the oldest admission leaves in 400 ms
  poll(w.io);
  CHECK_FALSE(r[2].done);
  CHECK(w.snapshot().free == 0);
  CHECK(w.snapshot().retry_after_last == 400000us);
  advance_and_poll(w.io, 399ms);
  CHECK(w.sent().size() == 3);
  advance_and_poll(w.io, 1ms);
  CHECK(w.sent().back() == message{admission, 3, 1, 0, 1});
  w.settle(3, allowed(0));
  poll(w.io);
  CHECK(r[2].ec == error_code{});
  const auto s = w.snapshot();
  CHECK(s.acquired_total == 3);
  CHECK(s.remote_allowed == 3);
  CHECK(s.remote_denied == 1);
  CHECK(s.round_trips == 4);
  CHECK(s.wait_total == 400ms);
}

TEST_CASE("window admission: a deadline before the denial's hold fails at once; a later one waits",
          "[redis][window]") {
  window w(per_second(1, 1));
  result soon, late;
  w.acquire(soon, 1, manual_clock::now() + 100ms);
  w.settle(0, denied(250000, 0));
  poll(w.io);
  CHECK(soon.ec == rein::errc::timed_out);
  w.acquire(late, 1, manual_clock::now() + 300ms);
  advance_and_poll(w.io, 250ms);
  // Each admission says how long its caller will still wait (microseconds), so that Redis queues in the
  // fleet queue only a caller still waiting at its turn (and how many units its process waits for: 1).
  CHECK(w.sent() == messages{{admission, 0, 1, 100000, 1}, {admission, 1, 1, 50000, 1}});
  w.settle(1, allowed(0));
  poll(w.io);
  CHECK(late.ec == error_code{});
}

TEST_CASE("window admission: n above the limit is refused at once; n = 0 needs no round trip", "[redis][window]") {
  window w(per_second(3));
  result big, zero, three;
  w.acquire(big, 4);
  w.acquire(zero, 0);
  w.acquire(three, 3);
  poll(w.io);
  CHECK(big.ec == rein::errc::exceeds_capacity);
  CHECK(zero.ec == error_code{});
  CHECK(w.sent() == messages{{admission, 0, 3, 0, 3}});
}

TEST_CASE("window admission: late and revoked grants are refunded, at most the limit", "[redis][window]") {
  window w(per_second(2));
  net::cancellation_signal on_wire_signal, granted_signal;
  result on_wire, granted;
  w.acquire(on_wire, 1, on_wire_signal);
  on_wire_signal.emit(net::cancellation_type::terminal);
  poll(w.io);
  CHECK(on_wire.ec == net::error::operation_aborted);
  w.settle(0, allowed(1));  // Redis recorded an admission for nobody
  CHECK(w.sent() == messages{{admission, 0, 1, 0, 1}, {refund, 0, 1}});

  w.acquire(granted, 2, granted_signal);
  w.settle(1, allowed(0));  // granted: the completion is posted, not run
  granted_signal.emit(net::cancellation_type::terminal);
  poll(w.io);
  CHECK(granted.ec == net::error::operation_aborted);
  CHECK(w.sent().back() == message{refund, 0, 2});

  w.line->update([](window::policy_type& p, tp) { p.refund(5); });  // the public refund clamps to the limit
  CHECK(w.sent().back() == message{refund, 0, 2});
  CHECK(w.snapshot().refunds == 3);
}

TEST_CASE("window admission: fail_closed fails waiting and new ops while Redis cannot be asked", "[redis][window]") {
  auto o = per_second(2, 1);
  o.recheck_interval = 100ms;
  window w(o);
  result first, second, during, after;
  w.acquire(first, 1);
  w.acquire(second, 1);
  w.settle(0, unavailable());
  poll(w.io);
  CHECK(first.ec == rein::redis::errc::unavailable);
  CHECK(second.ec == rein::redis::errc::unavailable);
  w.acquire(during, 1);
  poll(w.io);
  CHECK(during.ec == rein::redis::errc::unavailable);
  CHECK(w.snapshot().degraded);
  advance_and_poll(w.io, 100ms);
  w.acquire(after, 1);
  CHECK(w.sent() == messages{{admission, 0, 1, 0, 1}, {admission, 1, 1, 0, 1}});
  w.settle(1, allowed(1));
  poll(w.io);
  CHECK(after.ec == error_code{});
  CHECK(w.snapshot().unavailable_total == 3);
}

TEST_CASE("window admission: fail_open admits from a local sliding window of its share", "[redis][window]") {
  auto o = per_second(10, 1);
  o.on_failure = failure_policy::fail_open;
  o.fail_open_share = 0.25;  // a local window of 2 per second
  o.recheck_interval = 10s;
  window w(o);
  result r[4];
  w.acquire(r[0], 1);
  w.settle(0, unavailable());
  for (std::size_t i = 1; i < 4; ++i) w.acquire(r[i], 1);
  poll(w.io);
  CHECK(r[0].ec == error_code{});
  CHECK(r[1].ec == error_code{});
  CHECK_FALSE(r[2].done);
  advance_and_poll(w.io, 999ms);
  CHECK_FALSE(r[2].done);
  advance_and_poll(w.io, 1ms);  // the first local admission left the local window
  CHECK(r[2].ec == error_code{});
  CHECK(r[3].ec == error_code{});
  CHECK(w.sent().size() == 1);  // Redis is not asked during the recheck interval
  CHECK(w.snapshot().local_admitted == 4);
}

TEST_CASE("window admission: close completes waiting and in-flight ops with closed", "[redis][window]") {
  window w(per_second(5, 1));
  result on_wire, waiting;
  w.acquire(on_wire, 1);
  w.acquire(waiting, 1);
  w.line->close();
  poll(w.io);
  CHECK(on_wire.ec == rein::errc::closed);
  CHECK(waiting.ec == rein::errc::closed);
  w.settle(0, allowed(4));
  CHECK(w.sent() == messages{{admission, 0, 1, 0, 1}, {refund, 0, 1}});
}

TEST_CASE("window admission: invalid options name the type, the field and the value", "[redis][window]") {
  const auto message_of = [](shared_sliding_window_options o) {
    try {
      window w(std::move(o));
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  CHECK(message_of({.key = "api", .limit = 0, .window = 1s}) ==
        "rein::redis::shared_sliding_window: limit must be in [1, 2^27] admissions, got 0");
  CHECK(message_of({.key = "api", .limit = 1, .window = 0ms}) ==
        "rein::redis::shared_sliding_window: window must be in [1 ms, 1e9 s], got 0ms");
  CHECK(message_of({.key = "a{b}", .limit = 1, .window = 1s}) ==
        "rein::redis::shared_sliding_window: key must not contain '{' or '}' (it becomes the hash tag), got \"a{b}\"");
  CHECK(message_of({.key = "api", .limit = 1, .window = 1s, .fail_open_share = 0}) ==
        "rein::redis::shared_sliding_window: fail_open_share must be in (0, 1], got 0");
  CHECK(message_of({.key = "api", .limit = 1, .window = 1s, .queue_grace = 0ms}) ==
        "rein::redis::shared_sliding_window: queue_grace must be in [1 ms, 1 h], got 0ms");
  CHECK(message_of({.key = "api", .limit = 1, .window = 1s, .queue_grace = 1h + 1ms}) ==
        "rein::redis::shared_sliding_window: queue_grace must be in [1 ms, 1 h], got 3600001ms");
}

TEST_CASE("window admission: a refund ends a denial's hold; the head asks again right after it", "[redis][window]") {
  window w(per_second(1, 1));
  result first, second;
  w.acquire(first, 1);
  w.settle(0, allowed(0));
  w.acquire(second, 1);
  w.settle(1, denied(900000, 0));
  poll(w.io);
  CHECK_FALSE(second.done);
  w.line->update([](window::policy_type& p, tp) { p.refund(1); });  // what shared_sliding_window::refund does
  CHECK(w.sent() ==
        messages{{admission, 0, 1, 0, 1}, {admission, 1, 1, 0, 1}, {refund, 0, 1}, {admission, 2, 1, 0, 1}});
  w.settle(2, allowed(0));
  poll(w.io);
  CHECK(second.ec == error_code{});
  CHECK(w.snapshot().wait_total == 0ms);
}

TEST_CASE("window admission: each admission says how many units this process waits for from it on",
          "[redis][window]") {
  window w(per_second(5, 1));  // one request on the wire at a time
  result r[3];
  w.acquire(r[0], 1);  // sent at once, alone in the line
  w.acquire(r[1], 2);
  w.acquire(r[2], 1);
  w.settle(0, denied(1000, 0));
  advance_and_poll(w.io, 1ms);
  // The fleet queue holds places for everything waiting here: 1 + 2 + 1 from the head on, then what follows.
  CHECK(w.sent() == messages{{admission, 0, 1, 0, 1}, {admission, 1, 1, 0, 4}});
  w.settle(1, allowed(4));
  poll(w.io);
  CHECK(w.sent().back() == message{admission, 2, 2, 0, 3});
  w.settle(2, allowed(2));
  poll(w.io);
  CHECK(w.sent().back() == message{admission, 3, 1, 0, 1});
  w.settle(3, allowed(1));
  poll(w.io);
  CHECK(r[2].ec == error_code{});
}
