// The throttle's step 3 on the line: callers waiting for their key's rate wait in that rate limiter's own
// line (a ready wait), in its order, and its grant keeps the room for the caller until the caller takes it,
// so that a key's callers are admitted in arrival order, one spacing of the rate apart (manual clock, exact).
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
#include <vector>

using namespace std::chrono_literals;
namespace net = rein::net;
using rein_test::advance_and_poll;
using rein_test::manual_clock;

namespace {

using gate_type = rein::basic_quota_gate<net::any_io_executor, manual_clock>;
using sem_type = rein::basic_semaphore<net::any_io_executor, manual_clock>;
using bucket_type = rein::basic_token_bucket<net::any_io_executor, manual_clock>;

constexpr int callers = 40;

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(rein_test::since_epoch()).count();
}

// The four stages of the admission order, every one but the key's rate (100/s, burst 1) far from full.
struct stages {
  explicit stages(rein::queue_order order)
      : rate(io.get_executor(), rein::keyed_options{},
             rein::token_bucket_options{.rate = 100, .capacity = 1, .order = order}) {}

  net::io_context io;
  rein::keyed<gate_type> gates{io.get_executor(), rein::keyed_options{}, rein::quota_gate_options{.jitter = 0.0}};
  rein::keyed<sem_type> per_key{io.get_executor(), rein::keyed_options{}, std::size_t{1000}};
  sem_type global{io.get_executor(), 1000};
  rein::keyed<bucket_type> rate;
  rein::throttle<rein::keyed<gate_type>, rein::keyed<sem_type>, sem_type, rein::keyed<bucket_type>> throttle{
      gates, per_key, global, rate};
};

using guard_type = decltype(stages::throttle)::guard;

struct admission {
  int who;
  std::int64_t at_ms;
};

// Starts the callers of "k" in order 0..39 (half through each door), then lets time pass 10 ms at a time:
// who was admitted when.
std::vector<admission> run_callers(stages& s) {
  std::vector<admission> order;
  std::vector<guard_type> guards;
  for (int i = 0; i < callers; ++i) {
    if (i % 2 == 0) {
      s.throttle.async_acquire("k", [&, i](rein::error_code ec, guard_type g) {
        CHECK_FALSE(ec);
        order.push_back({i, now_ms()});
        guards.push_back(std::move(g));
      });
    } else {
      net::co_spawn(
          s.io,
          [&, i]() -> net::awaitable<void> {
            guard_type g = co_await s.throttle.acquire("k");
            order.push_back({i, now_ms()});
            guards.push_back(std::move(g));
          },
          net::detached);
    }
  }
  rein_test::poll(s.io);
  for (int step = 0; step < callers && static_cast<int>(order.size()) < callers; ++step) advance_and_poll(s.io, 10ms);
  for (guard_type& g : guards) g.complete(rein::outcome::success);
  return order;
}

void check_arrival_order(const std::vector<admission>& order) {
  REQUIRE(order.size() == static_cast<std::size_t>(callers));
  for (int i = 0; i < callers; ++i) {
    INFO("admission " << i);
    CHECK(order[static_cast<std::size_t>(i)].who == i);
    CHECK(order[static_cast<std::size_t>(i)].at_ms == 10 * i);
  }
}

}  // namespace

TEST_CASE("throttle: 40 callers of one key are admitted in arrival order, exactly one rate spacing apart",
          "[throttle][order]") {
  rein_test::manual_clock_at_epoch epoch;
  stages s(rein::queue_order::fifo);
  check_arrival_order(run_callers(s));
  // Nothing is left kept or waiting on the key's line, and each admission took the rate once.
  const auto rate = s.rate.snapshot("k");
  REQUIRE(rate);
  CHECK(rate->waiting == 0);
  CHECK(rate->acquired_total == static_cast<std::uint64_t>(callers));
  // The one give-back and re-take per waiter: its first try's global slot, which it must not hold while it
  // waits for its own key's rate (another key may need it).
  const rein::throttle_snapshot t = s.throttle.snapshot();
  REQUIRE(t.stages.size() == 4);
  for (const std::size_t i : {0u, 1u, 3u}) {
    INFO("stage " << i);
    CHECK(t.stages[i].readmitted == 0);
    CHECK(t.stages[i].given_back == 0);
  }
  CHECK(t.stages[2].readmitted == static_cast<std::uint64_t>(callers - 1));
  CHECK(t.stages[2].given_back == static_cast<std::uint64_t>(callers - 1));
}

TEST_CASE("throttle: the key's line in priority or fair order admits one key's callers in arrival order too",
          "[throttle][order]") {
  // The throttle waits in class 0 and as the key "" there: every caller of the key alike, so both orders
  // serve them by arrival.
  for (const rein::queue_order order : {rein::queue_order::priority, rein::queue_order::fair}) {
    DYNAMIC_SECTION("order " << static_cast<int>(order)) {
      rein_test::manual_clock_at_epoch epoch;
      stages s(order);
      check_arrival_order(run_callers(s));
    }
  }
}

TEST_CASE("throttle: a caller granted its key's room keeps it while it waits for a global slot",
          "[throttle][order]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  sem_type global(io.get_executor(), 1);
  rein::keyed<bucket_type> rate(io.get_executor(), rein::keyed_options{},
                                rein::token_bucket_options{.rate = 100, .capacity = 1});
  rein::throttle t(global, rate);
  using guard = decltype(t)::guard;

  guard other = t.try_acquire("x");  // holds the one global slot
  REQUIRE(other);
  guard first = t.try_acquire("k");  // refused at the slot: nothing taken
  REQUIRE_FALSE(first);
  std::vector<int> admitted;
  std::vector<guard> guards;
  for (int i = 0; i < 2; ++i)
    t.async_acquire("k", [&, i](rein::error_code ec, guard g) {
      CHECK_FALSE(ec);
      admitted.push_back(i);
      guards.push_back(std::move(g));
    });
  rein_test::poll(io);
  // Caller 0 found the key's token: its line keeps the room for it (a try of the key is refused, caller 1
  // waits behind it) while it waits for the slot, taking nothing from the bucket.
  CHECK(global.snapshot().waiting == 1);
  CHECK(rate.snapshot("k")->waiting == 1);
  CHECK(rate.snapshot("k")->tokens == 1.0);
  CHECK_FALSE(t.try_acquire("k"));
  advance_and_poll(io, 50ms);  // the bucket is full, and the room still kept for caller 0
  CHECK(admitted.empty());
  other.complete(rein::outcome::success);
  rein_test::poll(io);
  REQUIRE(admitted == std::vector<int>{0});
  guards.back().complete(rein::outcome::success);
  advance_and_poll(io, 10ms);
  CHECK(admitted == std::vector<int>{0, 1});
}

TEST_CASE("throttle: a cancelled caller leaves its key's line, one whose deadline its turn misses fails at once",
          "[throttle][order]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::keyed<bucket_type> rate(io.get_executor(), rein::keyed_options{},
                                rein::token_bucket_options{.rate = 100, .capacity = 1});
  rein::throttle t(rate);
  using guard = decltype(t)::guard;

  guard first = t.try_acquire("k");
  REQUIRE(first);
  std::vector<int> admitted;
  std::vector<rein::error_code> errors(4);
  std::vector<guard> guards;
  std::vector<net::cancellation_signal> signals(4);
  for (int i = 0; i < 4; ++i) {
    auto handler = [&, i](rein::error_code ec, guard g) {
      errors[static_cast<std::size_t>(i)] = ec;
      if (!ec) admitted.push_back(i), guards.push_back(std::move(g));
    };
    if (i == 2)
      t.async_acquire_for("k", 25ms, net::bind_cancellation_slot(signals[2].slot(), handler));
    else
      t.async_acquire("k", net::bind_cancellation_slot(signals[static_cast<std::size_t>(i)].slot(), handler));
  }
  rein_test::poll(io);
  // Caller 2's turn, behind two others, comes at 30 ms: past its deadline (25 ms), judged when it queues.
  CHECK(errors[2] == rein::error_code(rein::errc::timed_out));
  CHECK(rate.snapshot("k")->waiting == 3);
  signals[1].emit(net::cancellation_type::terminal);
  rein_test::poll(io);
  CHECK(errors[1] == rein::error_code(net::error::operation_aborted));
  CHECK(rate.snapshot("k")->waiting == 2);
  advance_and_poll(io, 10ms);  // caller 0
  CHECK(admitted == std::vector<int>{0});
  advance_and_poll(io, 10ms);  // caller 3, in caller 1's place
  CHECK(admitted == std::vector<int>{0, 3});
  CHECK(rate.snapshot("k")->waiting == 0);
  const rein::throttle_snapshot s = t.snapshot();
  CHECK(s.cancelled_total == 1);
  CHECK(s.timed_out_total == 1);
  CHECK(s.given_back_total == 0);
}
