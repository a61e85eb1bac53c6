// rein::basic_adaptive_limiter's circuit (fail fast at the floor, half-open probes, events, snapshot) and its
// run-time setters (set_options, set_circuit) with their effect on waiters. Time is
// rein::testing::manual_clock, stepped by hand; nothing sleeps.
#include <rein/adaptive_limiter.hpp>
#include <rein/algo/aimd.hpp>
#include <rein/algo/tuned_aimd.hpp>
#include <rein/testing/manual_clock.hpp>

#include "support/catch.hpp"
#include "support/checked_handler.hpp"

#if defined(REIN_STANDALONE_ASIO)
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#else
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#endif

#include <chrono>
#include <cstddef>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

using namespace std::chrono_literals;
namespace net = rein::net;
using rein::circuit_state;
using rein::outcome;
using rein::testing::manual_clock;

namespace {

template <class Algorithm>
using limiter_on_manual_clock = rein::basic_adaptive_limiter<Algorithm, net::any_io_executor, manual_clock>;
using aimd_limiter = limiter_on_manual_clock<rein::algo::aimd>;

using record = std::shared_ptr<rein_test::acquire_record>;

// Starts an acquire of n with a checked handler (called once, never dropped uncalled) and returns its record.
template <class Limiter>
record acquire(Limiter& limiter, std::size_t n = 1) {
  auto [handler, done] = rein_test::checked_acquire();
  limiter.async_acquire(n, std::move(handler));
  return done;
}

// A limit of 1 (the floor), a circuit that opens after 3 congestion outcomes for 1 s, one probe.
rein::algo::aimd_options at_floor() {
  rein::algo::aimd_options o;
  o.initial_limit = 1;
  return o;
}

rein::adaptive_limiter_options with_circuit() {
  rein::adaptive_limiter_options o;
  o.circuit.open_after = 3;
  o.circuit.open_for = 1s;
  return o;
}

// A line whose observer records the circuit's transitions and the rejections into `events`.
rein::line_options recording(std::vector<std::string>* events) {
  rein::line_options line;
  line.observer = [events](const rein::limiter_event& e) {
    if (e.kind == rein::event_kind::circuit_opened || e.kind == rein::event_kind::circuit_half_open ||
        e.kind == rein::event_kind::circuit_closed || e.kind == rein::event_kind::rejected) {
      std::ostringstream text;
      text << e;
      events->push_back(text.str());
    }
  };
  return line;
}

// `n` congestion outcomes at the floor in a row, each from a call granted to the next waiter.
void congestion_in_a_row(aimd_limiter& limiter, net::io_context& io, int n) {
  rein::permit p = limiter.try_acquire();
  REQUIRE(p);
  for (int i = 1; i < n; ++i) {
    const record next = acquire(limiter);
    p.complete(outcome::congestion);
    io.poll();
    REQUIRE(next->called());
    REQUIRE_FALSE(next->ec());
    p = std::move(next->get<1>());
  }
  p.complete(outcome::congestion);
}

// Three in a row: opens a circuit of with_circuit().
void open_circuit(aimd_limiter& limiter, net::io_context& io) { congestion_in_a_row(limiter, io, 3); }

}  // namespace

TEST_CASE("circuit: when it opens, every waiter and every new acquire fails at once with upstream_unavailable") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);
  aimd_limiter limiter{io, at_floor(), {}, with_circuit()};
  rein::permit p = limiter.try_acquire();
  std::vector<record> waiting;
  for (int i = 0; i < 4; ++i) waiting.push_back(acquire(limiter));
  p.complete(outcome::congestion);  // 1
  io.poll();
  REQUIRE(waiting[0]->called());
  waiting[0]->get<1>().complete(outcome::congestion);  // 2
  io.poll();
  REQUIRE(waiting[1]->called());
  CHECK(limiter.circuit() == circuit_state::closed);
  waiting[1]->get<1>().complete(outcome::congestion);  // 3: opens; the two still waiting fail in that release
  io.poll();
  CHECK(limiter.circuit() == circuit_state::open);
  for (std::size_t i : {2u, 3u}) {
    REQUIRE(waiting[i]->called());
    CHECK(waiting[i]->ec() == rein::errc::upstream_unavailable);
    CHECK_FALSE(waiting[i]->get<1>());
  }
  CHECK(rein::error_code(rein::errc::upstream_unavailable).message() ==
        "upstream unavailable: the limiter's circuit is open");
  const rein::try_permit t = limiter.try_acquire();
  CHECK(t.status() == rein::try_status::unavailable);
  const record later = acquire(limiter);
  io.poll();
  REQUIRE(later->called());
  CHECK(later->ec() == rein::errc::upstream_unavailable);
  const auto s = limiter.snapshot();
  CHECK(s.circuit == circuit_state::open);
  CHECK(s.circuit_opens == 1);
  CHECK(s.unavailable_total == 3);  // two waiters and one new acquire; try_acquire counts no rejection
  CHECK(s.rejected_total == 3);
  CHECK(s.waiting == 0);
  CHECK(s.in_flight == 0);
  CHECK(s.congestion_total == 3);
}

TEST_CASE("circuit: after open_for one probe is granted and others fail; its success closes the circuit") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);
  std::vector<std::string> events;
  aimd_limiter limiter{io, at_floor(), recording(&events), with_circuit()};
  open_circuit(limiter, io);
  manual_clock::advance(999ms);
  CHECK(limiter.try_acquire().status() == rein::try_status::unavailable);
  manual_clock::advance(1ms);
  CHECK(limiter.circuit() == circuit_state::half_open);
  rein::try_permit probe = limiter.try_acquire();
  CHECK(probe.status() == rein::try_status::acquired);
  const record second = acquire(limiter);
  io.poll();
  REQUIRE(second->called());
  CHECK(second->ec() == rein::errc::upstream_unavailable);  // the one probe is out
  probe.complete(outcome::success);
  CHECK(limiter.circuit() == circuit_state::closed);
  rein::permit after = limiter.try_acquire();
  CHECK(after);
  CHECK(events == std::vector<std::string>{"circuit_opened pause=1000000000ns", "circuit_half_open",
                                           "rejected reason=unavailable count=1", "circuit_closed"});
}

TEST_CASE("circuit: a probe's congestion opens it again for another open_for") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);
  std::vector<std::string> events;
  aimd_limiter limiter{io, at_floor(), recording(&events), with_circuit()};
  open_circuit(limiter, io);
  manual_clock::advance(1s);
  rein::permit probe = limiter.try_acquire();
  REQUIRE(probe);
  manual_clock::advance(200ms);
  probe.complete(outcome::congestion);
  CHECK(limiter.circuit() == circuit_state::open);
  manual_clock::advance(999ms);
  CHECK(limiter.try_acquire().status() == rein::try_status::unavailable);
  manual_clock::advance(1ms);
  CHECK(limiter.try_acquire().status() == rein::try_status::acquired);  // released at once: ignored
  const auto s = limiter.snapshot();
  CHECK(s.circuit == circuit_state::half_open);  // an ignored probe frees its place
  CHECK(s.circuit_opens == 2);
  CHECK(events == std::vector<std::string>{"circuit_opened pause=1000000000ns", "circuit_half_open",
                                           "circuit_opened pause=1000000000ns", "circuit_half_open"});
}

TEST_CASE("circuit: a call granted before the circuit opened is no probe when it returns") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);
  rein::algo::aimd_options two = at_floor();
  two.max_limit = 64;
  aimd_limiter limiter{io, two, {}, with_circuit()};
  rein::permit old = limiter.try_acquire();  // granted before the circuit opens, still out
  limiter.set_options([] {
    rein::algo::aimd_options o;
    o.initial_limit = 2;
    o.min_limit = 2;
    return o;
  }());
  // Three congestion outcomes at the floor of 2, from the second slot.
  for (int i = 0; i < 3; ++i) limiter.try_acquire().complete(outcome::congestion);
  CHECK(limiter.circuit() == circuit_state::open);
  manual_clock::advance(1s);
  rein::permit probe = limiter.try_acquire();
  REQUIRE(probe);
  CHECK(limiter.try_acquire().status() == rein::try_status::unavailable);
  old.complete(outcome::success);  // granted before the probes: not one of them
  CHECK(limiter.circuit() == circuit_state::half_open);
  probe.complete(outcome::success);
  CHECK(limiter.circuit() == circuit_state::closed);
}

TEST_CASE("circuit: off by default, congestion at the floor keeps queueing") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);
  aimd_limiter limiter{io, at_floor()};
  congestion_in_a_row(limiter, io, 20);  // every call waited for the one before it and was granted
  const auto s = limiter.snapshot();
  CHECK(s.circuit == circuit_state::closed);
  CHECK(s.circuit_opens == 0);
  CHECK(s.rejected_total == 0);
}

TEST_CASE("circuit: set_circuit with open_after 0 closes an open circuit; invalid circuit options throw") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);
  aimd_limiter limiter{io, at_floor(), {}, with_circuit()};
  open_circuit(limiter, io);
  CHECK(limiter.circuit() == circuit_state::open);
  limiter.set_circuit({});
  CHECK(limiter.circuit() == circuit_state::closed);
  CHECK(limiter.try_acquire());
  rein::circuit_options bad;
  bad.open_after = 1;
  bad.probes = 0;
  CHECK_THROWS_WITH(limiter.set_circuit(bad), "rein::adaptive_limiter: circuit.probes must be >= 1, got 0");
  rein::adaptive_limiter_options o;
  o.circuit.open_for = 0s;
  CHECK_THROWS_WITH((aimd_limiter{io, at_floor(), {}, o}),
                    "rein::adaptive_limiter: circuit.open_for must be > 0, got 0 ns");
}

// ---- set_options: the algorithm's options at run time.

TEST_CASE("set_options: a higher floor admits waiters at once, in FIFO order") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);
  limiter_on_manual_clock<rein::algo::tuned_aimd> limiter{io};
  std::vector<rein::permit> held;
  for (int i = 0; i < 4; ++i) held.push_back(limiter.try_acquire());  // the initial limit of 4
  std::vector<int> order;
  std::vector<rein::permit> granted;
  for (int i = 0; i < 3; ++i)
    limiter.async_acquire([&, i](rein::error_code ec, rein::permit p) {
      REQUIRE_FALSE(ec);
      order.push_back(i);
      granted.push_back(std::move(p));
    });
  io.poll();
  CHECK(order.empty());
  rein::algo::tuned_aimd_options o;
  o.min_limit = 6;
  o.initial_limit = 6;
  limiter.set_options(o);
  io.poll();
  CHECK(order == std::vector<int>{0, 1});
  CHECK(limiter.limit() == 6.0);
  CHECK(limiter.get_options().min_limit == 6.0);
  CHECK(limiter.snapshot().waiting == 1);
}

TEST_CASE("set_options: a lower ceiling keeps granted slots, and a waiter above it fails with exceeds_capacity") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);
  limiter_on_manual_clock<rein::algo::tuned_aimd> limiter{io};
  std::vector<rein::permit> held;
  for (int i = 0; i < 4; ++i) held.push_back(limiter.try_acquire());
  const record big = acquire(limiter, 3);
  const record small = acquire(limiter, 1);
  rein::algo::tuned_aimd_options o;
  o.max_limit = 2;
  o.initial_limit = 2;
  limiter.set_options(o);
  io.poll();
  REQUIRE(big->called());
  CHECK(big->ec() == rein::errc::exceeds_capacity);
  CHECK_FALSE(small->called());
  CHECK(limiter.limit() == 2.0);
  CHECK(limiter.in_flight() == 4);  // no slot taken back
  held[0].release();
  held[1].release();
  held[2].release();
  io.poll();
  REQUIRE(small->called());  // 1 in flight, limit 2
  CHECK_FALSE(small->ec());
}

TEST_CASE("set_options: invalid options throw naming type, field and value, and change nothing") {
  manual_clock::reset();
  net::io_context io;
  limiter_on_manual_clock<rein::algo::tuned_aimd> limiter{io};
  rein::algo::tuned_aimd_options o;
  o.backoff = 1.5;
  CHECK_THROWS_WITH(limiter.set_options(o), "rein::adaptive_limiter: tuned_aimd.backoff must be in (0, 1), got 1.5");
  CHECK(limiter.get_options().backoff == 0.5);
  CHECK(limiter.limit() == 4.0);
}
