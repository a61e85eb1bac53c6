// The throttle guard: stage order, give-back on failure, try mode, 429 pauses, and two composition cases
// (try mode, and a key's backlog that holds no global slot).
#include "support/asio.hpp"
#include "support/catch.hpp"
#include "support/checked_handler.hpp"
#include "support/manual_time.hpp"
#include "support/token_matrix.hpp"

#include <rein/adaptive_limiter.hpp>
#include <rein/adaptive_rate_limiter.hpp>
#include <rein/keyed.hpp>
#include <rein/quota_gate.hpp>
#include <rein/rate_limit_headers.hpp>
#include <rein/rate_limiter.hpp>
#include <rein/semaphore.hpp>
#include <rein/sliding_window.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
namespace net = rein::net;
using rein_test::advance_and_poll;
using rein_test::manual_clock;
using rein_test::since_epoch;

namespace {

using executor = net::any_io_executor;
using gate_type = rein::basic_quota_gate<executor, manual_clock>;
using bucket_type = rein::basic_token_bucket<executor, manual_clock>;
using sem_type = rein::basic_semaphore<executor, manual_clock>;

rein::quota_gate_options no_jitter() {
  rein::quota_gate_options o;
  o.jitter = 0.0;
  return o;
}

// The stages of those cases: rate 100/s burst 100, global 10, per-key 1, gates without jitter.
struct stages {
  net::io_context io;
  rein::keyed<gate_type> gates{io.get_executor(), no_jitter()};
  bucket_type rate{io.get_executor(), rein::token_bucket_options{.rate = 100, .capacity = 100}};
  sem_type global{io.get_executor(), 10};
  rein::keyed<sem_type> per_key{io.get_executor(), std::size_t{1}};
  rein::throttle<rein::keyed<gate_type>, rein::keyed<sem_type>, sem_type, bucket_type> throttle{gates, per_key, global,
                                                                                                 rate};
};

using guard_type = rein::throttle_guard<decltype(stages::throttle)>;
using guard_record = rein_test::completion_record<rein::error_code, guard_type>;
using guard_handler = rein_test::checked_handler<rein::error_code, guard_type>;

std::pair<guard_handler, std::shared_ptr<guard_record>> checked_guard() {
  return rein_test::make_checked<rein::error_code, guard_type>();
}

bool admitted(const std::shared_ptr<guard_record>& r) {
  return r->called() && !r->ec() && static_cast<bool>(r->get<1>());
}

bool failed_with(const std::shared_ptr<guard_record>& r, const rein::error_code& ec) {
  return r->called() && r->ec() == ec && !r->get<1>();
}

constexpr std::array<net::cancellation_type, 3> cancellation_types{
    net::cancellation_type::terminal, net::cancellation_type::partial, net::cancellation_type::total};

const char* type_name(net::cancellation_type t) {
  if (t == net::cancellation_type::terminal) return "terminal";
  if (t == net::cancellation_type::partial) return "partial";
  return "total";
}

double seconds_since_epoch() { return std::chrono::duration<double>(since_epoch()).count(); }

}  // namespace

TEST_CASE("try mode: requests refused at the key stage consume nothing", "[throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  stages s;
  std::vector<rein::throttle_guard<decltype(s.throttle)>> admitted;
  int refused_at_key = 0;
  for (int i = 0; i < 20; ++i) {
    auto g = s.throttle.try_acquire("K");
    if (g) admitted.push_back(std::move(g));
    else if (g.rejected_at() == rein::throttle_stage::per_key) ++refused_at_key;
  }
  CHECK(admitted.size() == 1);
  CHECK(refused_at_key == 19);
  CHECK(s.global.snapshot().in_flight == 1);
  CHECK(s.rate.tokens() == 99.0);  // the 19 refused requests had their tokens refunded

  manual_clock::advance(10ms);
  auto l = s.throttle.try_acquire("L");
  CHECK(static_cast<bool>(l));
  CHECK(s.global.snapshot().in_flight == 2);
  const auto snap = s.throttle.snapshot();
  CHECK(snap.admitted_total == 2);
  CHECK(snap.rejected_per_key == 19);
}

TEST_CASE("waiting mode: one key's backlog holds no global slot", "[throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  stages s;
  std::vector<double> k_admitted_at;
  std::optional<double> l_admitted_at;
  auto hold = [&](std::string key, bool is_l) -> net::awaitable<void> {
    auto g = co_await s.throttle.acquire(key);
    const double t = std::chrono::duration<double>(since_epoch()).count();
    if (is_l) l_admitted_at = t;
    else k_admitted_at.push_back(t);
    net::basic_waitable_timer<manual_clock> timer(s.io, 1s);
    co_await timer.async_wait(net::use_awaitable);
    g.complete(rein::outcome::success);
  };
  for (int i = 0; i < 20; ++i) net::co_spawn(s.io, hold("K", false), net::detached);
  rein_test::poll(s.io);
  CHECK(k_admitted_at.size() == 1);
  CHECK(s.global.snapshot().in_flight == 1);  // 19 wait for K's permit, holding no global slot

  advance_and_poll(s.io, 100ms);
  net::co_spawn(s.io, hold("L", true), net::detached);
  rein_test::poll(s.io);
  REQUIRE(l_admitted_at.has_value());
  CHECK(*l_admitted_at == 0.1);
  CHECK(s.global.snapshot().in_flight == 2);

  // K's callers go one per second, each as the previous one completes.
  for (int i = 1; i <= 25; ++i) rein_test::set_and_poll(s.io, manual_clock::time_point(i * 1s));
  REQUIRE(k_admitted_at.size() == 20);
  CHECK(k_admitted_at[1] == 1.0);
  CHECK(k_admitted_at[19] == 19.0);
  CHECK(s.global.snapshot().in_flight == 0);
}

TEST_CASE("a timeout at the per-key stage holds nothing: the rate is taken last, at the send", "[throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  stages s;
  auto first = s.throttle.try_acquire("K");
  REQUIRE(first);
  CHECK(s.rate.tokens() == 99.0);
  std::optional<rein::error_code> result;
  s.throttle.async_acquire_until("K", manual_clock::now() + 50ms,
                                 [&](rein::error_code ec, rein::throttle_guard<decltype(s.throttle)> g) {
                                   result = ec;
                                   CHECK_FALSE(g);
                                 });
  rein_test::poll(s.io);
  CHECK_FALSE(result.has_value());
  CHECK(s.rate.tokens() == 99.0);  // a caller waiting for K's permit holds no token
  advance_and_poll(s.io, 50ms);
  REQUIRE(result.has_value());
  CHECK(*result == rein::errc::timed_out);
  CHECK(s.rate.tokens() == 100.0);  // 99 + 5 refilled in 50 ms, capped
  CHECK(s.global.snapshot().in_flight == 1);
  CHECK(s.throttle.snapshot().failed_total == 1);
}

TEST_CASE("cancelling the waiting coroutine gives back what earlier stages took", "[throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  stages s;
  auto first = s.throttle.try_acquire("K");
  REQUIRE(first);
  net::cancellation_signal signal;
  std::optional<rein::error_code> result;
  s.throttle.async_acquire("K", net::bind_cancellation_slot(signal.slot(), [&](rein::error_code ec, auto g) {
                             result = ec;
                             CHECK_FALSE(g);
                           }));
  rein_test::poll(s.io);
  CHECK(s.per_key.snapshot("K")->waiting == 1);
  CHECK(s.rate.tokens() == 99.0);
  signal.emit(net::cancellation_type::partial);
  rein_test::poll(s.io);
  REQUIRE(result.has_value());
  CHECK(*result == net::error::operation_aborted);
  CHECK(s.rate.tokens() == 99.0);
  CHECK(s.per_key.snapshot("K")->waiting == 0);
}

TEST_CASE("a coroutine cancelled as its wait completes fails before the next stage", "[throttle][cancel]") {
  // As at any co_await. The key's rate stage waits on a timer; the cancellation reaches the coroutine after
  // the timer fired (co_spawn delivers it through the executor, and the expired timer's completion is
  // already queued, so the timer has nothing left to cancel). The coroutine resumes from that wait with its
  // state cancelled, and fails before it tries the global stage, holding nothing afterwards.
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::keyed<sem_type> per_key(io.get_executor(), std::size_t{1});
  sem_type global(io.get_executor(), 10);
  rein::keyed<bucket_type> rate(io.get_executor(), rein::token_bucket_options{.rate = 1, .capacity = 1});
  rein::throttle t(per_key, global, rate);
  REQUIRE(t.try_acquire("K"));  // takes K's one token, and gives the slots back
  net::cancellation_signal signal;
  std::optional<rein::error_code> failed;
  std::optional<std::size_t> failed_at;
  bool admitted = false;
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        try {
          auto g = co_await t.acquire("K");
          admitted = static_cast<bool>(g);
        } catch (const rein::throttle_error& e) {
          failed = e.code();
          failed_at = e.stage();
        }
      },
      net::bind_cancellation_slot(signal.slot(), net::detached));
  rein_test::poll(io);
  REQUIRE(per_key.snapshot("K")->in_flight == 1);  // K's slot, held while K's rate is waited for
  signal.emit(net::cancellation_type::terminal);
  advance_and_poll(io, 1s);
  CHECK_FALSE(admitted);
  REQUIRE(failed.has_value());
  CHECK(*failed == net::error::operation_aborted);
  CHECK(failed_at == std::size_t{2});  // the rate stage, the last one the coroutine waited on
  CHECK(per_key.snapshot("K")->in_flight == 0);
  CHECK(global.snapshot().in_flight == 0);
  CHECK(rate.get("K")->tokens() == 1.0);  // the token that came back was not taken
}

TEST_CASE("reject pauses the key for every caller until Retry-After passes", "[throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  stages s;
  {
    auto g = s.throttle.try_acquire("K");
    REQUIRE(g);
    g.reject(std::optional<manual_clock::duration>(2s));
    CHECK_FALSE(g);
  }
  CHECK(s.throttle.try_acquire("K").rejected_at() == rein::throttle_stage::gate);
  CHECK(static_cast<bool>(s.throttle.try_acquire("L")));  // other keys are not paused

  std::optional<double> admitted_at;
  net::co_spawn(
      s.io,
      [&]() -> net::awaitable<void> {
        auto g = co_await s.throttle.acquire("K");
        admitted_at = std::chrono::duration<double>(since_epoch()).count();
      },
      net::detached);
  advance_and_poll(s.io, 1999ms);
  CHECK_FALSE(admitted_at.has_value());
  advance_and_poll(s.io, 1ms);
  REQUIRE(admitted_at.has_value());
  CHECK(*admitted_at == 2.0);
  CHECK(s.throttle.snapshot().rejections_reported == 1);
}

TEST_CASE("reject with a Retry-After field value pauses for that many seconds", "[throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  stages s;
  s.throttle.try_acquire("K").reject(std::string_view("3"));
  CHECK(s.gates.get("K")->paused_until() == manual_clock::time_point(3s));
  s.throttle.try_acquire("L").reject(std::string_view("soon"));  // unusable: the default pause, 1 s
  CHECK(s.gates.get("L")->paused_until() == manual_clock::time_point(1s));
}

TEST_CASE("a guard dropped without an outcome releases everything", "[throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  stages s;
  { auto g = s.throttle.try_acquire("K"); }
  CHECK(s.global.snapshot().in_flight == 0);
  CHECK(s.per_key.snapshot("K")->in_flight == 0);
  CHECK(s.rate.tokens() == 99.0);  // an admitted request's token is spent, not refunded
}

TEST_CASE("stages may be unlimited; an adaptive global limiter learns from guards", "[throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::basic_adaptive_limiter<rein::algo::basic_aimd<manual_clock>, executor, manual_clock> global(
      io.get_executor(), rein::algo::aimd_options{.initial_limit = 4, .min_limit = 1, .max_limit = 10, .backoff = 0.5, .learn_failure_rate = false});
  rein::throttle t(rein::unlimited, global);
  auto g = t.try_acquire("any");
  REQUIRE(g);
  g.complete(rein::outcome::congestion);
  CHECK(global.snapshot().limit == 2.0);
  CHECK(global.snapshot().in_flight == 0);
}

TEST_CASE("throttle rejects a default_pause that is not positive", "[throttle]") {
  stages s;
  rein::throttle_options bad;
  bad.default_pause = 0s;
  CHECK_THROWS_WITH((rein::throttle(s.gates, s.per_key, s.global, s.rate, bad)),
                    "rein::throttle: default_pause must be > 0, got 0 ns");
}

TEST_CASE("a moved-from guard is empty and gives nothing back twice", "[throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  stages s;
  auto g = s.throttle.try_acquire("K");
  REQUIRE(g);
  guard_type moved(std::move(g));
  CHECK_FALSE(g);  // NOLINT(bugprone-use-after-move): the moved-from state is what is tested
  CHECK(static_cast<bool>(moved));
  g.reject(std::optional<manual_clock::duration>(5s));  // an empty guard does nothing, pauses nothing
  CHECK(s.throttle.snapshot().rejections_reported == 0);
  CHECK_FALSE(s.gates.get("K")->is_paused());
  CHECK(s.global.snapshot().in_flight == 1);
  guard_type assigned;
  assigned = std::move(moved);
  CHECK_FALSE(moved);  // NOLINT(bugprone-use-after-move)
  CHECK(s.global.snapshot().in_flight == 1);
  assigned.complete(rein::outcome::success);
  CHECK_FALSE(assigned);
  CHECK(s.global.snapshot().in_flight == 0);
  CHECK(s.per_key.snapshot("K")->in_flight == 0);
  CHECK(s.rate.tokens() == 99.0);
}

TEST_CASE("a 429 sends the callers already queued for that key back to the gate", "[throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  stages s;
  auto first = s.throttle.try_acquire("K");
  REQUIRE(first);
  std::vector<double> admitted_at;
  std::vector<guard_type> held;
  for (int i = 0; i < 3; ++i)
    s.throttle.async_acquire("K", [&](rein::error_code ec, guard_type g) {
      REQUIRE_FALSE(ec);
      admitted_at.push_back(seconds_since_epoch());
      held.push_back(std::move(g));
    });
  rein_test::poll(s.io);
  CHECK(s.per_key.snapshot("K")->waiting == 3);
  CHECK(s.rate.tokens() == 99.0);  // the three waiters hold no token

  advance_and_poll(s.io, 500ms);
  first.reject(std::optional<manual_clock::duration>(2s));  // K paused until 2.5 s
  rein_test::poll(s.io);
  // The caller next in line got K's permit, the global one and a token, saw the pause, gave back the global
  // slot and the token, and waits at K's gate holding K's permit (nobody else needs it); the other two
  // still wait for K's permit.
  CHECK(admitted_at.empty());
  CHECK(s.per_key.snapshot("K")->in_flight == 1);
  CHECK(s.per_key.snapshot("K")->waiting == 2);
  CHECK(s.global.snapshot().in_flight == 0);
  CHECK(s.gates.get("K")->snapshot().waiting == 1);
  CHECK(s.rate.tokens() == 100.0);  // refilled, and the token refunded

  advance_and_poll(s.io, 1999ms);
  CHECK(admitted_at.empty());
  advance_and_poll(s.io, 1ms);
  REQUIRE(admitted_at.size() == 1);
  CHECK(admitted_at[0] == 2.5);
  CHECK(s.throttle.snapshot().admitted_total == 2);
  held.clear();
  rein_test::poll(s.io);
  CHECK(admitted_at.size() == 2);
  held.clear();
  rein_test::poll(s.io);
  CHECK(admitted_at.size() == 3);
  held.clear();
  CHECK(s.global.snapshot().in_flight == 0);
  CHECK(s.rate.tokens() == 97.0);  // the three took theirs at 2.5 s, when they were sent
}

TEST_CASE("a cancellation that arrives before the operation's coroutine starts", "[throttle][cancel]") {
  for (auto type : cancellation_types) {
    DYNAMIC_SECTION(type_name(type)) {
      rein_test::manual_clock_at_epoch epoch;
      stages s;
      auto first = s.throttle.try_acquire("K");
      REQUIRE(first);
      net::cancellation_signal signal;
      auto [handler, done] = checked_guard();
      // Initiated from outside the io_context, the spawned coroutine starts on the next poll.
      s.throttle.async_acquire("K", net::bind_cancellation_slot(signal.slot(), std::move(handler)));
      signal.emit(type);
      CHECK_NOTHROW(rein_test::poll(s.io));
      CHECK(failed_with(done, net::error::operation_aborted));
      CHECK(s.rate.tokens() == 99.0);
      CHECK(s.per_key.snapshot("K")->waiting == 0);
      CHECK(s.global.snapshot().in_flight == 1);
      CHECK(s.throttle.snapshot().admitted_total == 1);
    }
  }
}

TEST_CASE("acquire_for with duration::max() means no deadline", "[throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  manual_clock::advance(1s);  // now + duration::max() would overflow
  stages s;
  auto first = s.throttle.try_acquire("K");
  std::optional<double> admitted_at;
  net::co_spawn(
      s.io,
      [&]() -> net::awaitable<void> {
        auto g = co_await s.throttle.acquire_for("K", manual_clock::duration::max());
        admitted_at = seconds_since_epoch();
      },
      net::detached);
  advance_and_poll(s.io, 10s);
  CHECK_FALSE(admitted_at.has_value());
  first.complete(rein::outcome::success);
  rein_test::poll(s.io);
  REQUIRE(admitted_at.has_value());
  CHECK(*admitted_at == 11.0);
}

TEST_CASE("every completion token gets an admitted guard", "[throttle][tokens]") {
  for (auto kind : rein_test::poll_tokens) {
    DYNAMIC_SECTION(rein_test::name(kind)) {
      rein_test::manual_clock_at_epoch epoch;
      stages s;
      auto [handler, done] = checked_guard();
      rein_test::launch(
          kind, s.io, [&s](auto token) { return s.throttle.async_acquire("K", std::move(token)); }, std::move(handler));
      CHECK_FALSE(done->called());  // never inside the initiating function
      rein_test::poll(s.io);
      REQUIRE(admitted(done));
      CHECK(s.global.snapshot().in_flight == 1);
      done->get<1>().complete(rein::outcome::success);
      CHECK(s.global.snapshot().in_flight == 0);
      CHECK(s.per_key.snapshot("K")->in_flight == 0);
    }
  }
}

TEST_CASE("every completion token gets a timeout as an error code or exception, having taken no token",
          "[throttle][tokens]") {
  for (auto kind : rein_test::poll_tokens) {
    DYNAMIC_SECTION(rein_test::name(kind)) {
      rein_test::manual_clock_at_epoch epoch;
      stages s;
      auto first = s.throttle.try_acquire("K");
      auto [handler, done] = checked_guard();
      const auto deadline = manual_clock::now() + 20ms;
      rein_test::launch(
          kind, s.io, [&s, deadline](auto token) { return s.throttle.async_acquire_until("K", deadline, std::move(token)); },
          std::move(handler));
      rein_test::poll(s.io);
      CHECK(s.per_key.snapshot("K")->waiting == 1);
      CHECK(s.rate.tokens() == 99.0);
      advance_and_poll(s.io, 20ms);
      CHECK(failed_with(done, rein::errc::timed_out));
      CHECK(s.rate.tokens() == 100.0);  // 99 + 2 refilled in 20 ms, capped
      CHECK(s.per_key.snapshot("K")->waiting == 0);
      CHECK(s.global.snapshot().in_flight == 1);
    }
  }
}

TEST_CASE("every completion token honours every cancellation type at every waiting stage", "[throttle][tokens][cancel]") {
  enum class stage { gate, rate, per_key, global };
  for (auto kind : rein_test::poll_tokens) {
    for (auto type : cancellation_types) {
      for (auto where : {stage::gate, stage::rate, stage::per_key, stage::global}) {
        DYNAMIC_SECTION(rein_test::name(kind) << ' ' << type_name(type) << " stage " << static_cast<int>(where)) {
          rein_test::manual_clock_at_epoch epoch;
          stages s;
          std::vector<guard_type> blockers;
          if (where == stage::gate) s.gates.get("K")->pause_for(10s);
          if (where == stage::rate) {
            s.rate.set_rate(0.001);
            s.rate.set_capacity(1);
            blockers.push_back(s.throttle.try_acquire("A"));
          }
          if (where == stage::per_key) blockers.push_back(s.throttle.try_acquire("K"));
          if (where == stage::global)
            for (int i = 0; i < 10; ++i) blockers.push_back(s.throttle.try_acquire("B" + std::to_string(i)));
          for (auto& b : blockers) REQUIRE(b);
          const double tokens_before = s.rate.tokens();
          net::cancellation_signal signal;
          auto [handler, done] = checked_guard();
          rein_test::launch(
              kind, s.io, [&s](auto token) { return s.throttle.async_acquire("K", std::move(token)); },
              std::move(handler), signal.slot());
          rein_test::poll(s.io);
          CHECK_FALSE(done->called());
          signal.emit(type);
          rein_test::poll(s.io);
          CHECK(failed_with(done, net::error::operation_aborted));
          CHECK(s.rate.tokens() == tokens_before);  // refunded if taken
          CHECK(s.global.snapshot().in_flight == blockers.size());
          CHECK(s.global.snapshot().waiting == 0);
          CHECK(s.per_key.snapshot("K")->waiting == 0);
          CHECK(s.per_key.snapshot("K")->in_flight == (where == stage::per_key ? 1U : 0U));
          CHECK(s.rate.snapshot().waiting == 0);
          CHECK(s.gates.get("K")->snapshot().waiting == 0);
          CHECK(s.throttle.snapshot().failed_total == 1);
        }
      }
    }
  }
}

TEST_CASE("use_future: the future gets the guard, or the error as an exception", "[throttle][tokens]") {
  net::io_context io;
  rein::keyed<rein::quota_gate> gates(io.get_executor(), {});
  rein::token_bucket rate(io, {.rate = 1000, .capacity = 10});
  rein::semaphore global(io, 2);
  rein::keyed<rein::semaphore> per_key(io.get_executor(), std::size_t{1});
  rein::throttle t(gates, per_key, global, rate);
  auto work = net::make_work_guard(io);
  std::thread runner([&io] { io.run(); });

  auto g = t.async_acquire("K", net::use_future).get();
  CHECK(static_cast<bool>(g));
  auto too_late = t.async_acquire_for("K", std::chrono::milliseconds(0), net::use_future);
  bool threw = false;
  try {
    too_late.get();
  } catch (const rein::system_error& e) {
    threw = true;
#if !REIN_TEST_TSAN  // see support/asio.hpp
    CHECK(e.code() == rein::errc::timed_out);
#endif
  }
  CHECK(threw);
  auto later = t.async_acquire("K", net::use_future);
  g.complete(rein::outcome::success);  // from this thread, while the io_context runs on the other
  auto g2 = later.get();
  CHECK(static_cast<bool>(g2));
  g2.complete(rein::outcome::success);
  work.reset();
  runner.join();
  CHECK(global.available() == 2);
  CHECK(t.snapshot().admitted_total == 2);
  CHECK(t.snapshot().failed_total == 1);
}

TEST_CASE("an adaptive global limiter: waiters are admitted as its limit moves", "[throttle][adaptive]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  using aimd_type = rein::basic_adaptive_limiter<rein::algo::basic_aimd<manual_clock>, executor, manual_clock>;
  aimd_type global(io.get_executor(),
                   rein::algo::aimd_options{.initial_limit = 2, .min_limit = 1, .max_limit = 10, .backoff = 0.5, .learn_failure_rate = false});
  rein::keyed<sem_type> per_key(io.get_executor(), std::size_t{1});
  rein::throttle t(per_key, global);
  std::vector<std::string> order;
  std::vector<rein::throttle_guard<decltype(t)>> held;
  for (std::string key : {"A", "B", "C", "D"})
    t.async_acquire(key, [&, key](rein::error_code ec, auto g) {
      REQUIRE_FALSE(ec);
      order.push_back(key);
      held.push_back(std::move(g));
    });
  rein_test::poll(io);
  REQUIRE(order == std::vector<std::string>{"A", "B"});
  CHECK(global.snapshot().waiting == 2);  // C and D hold their keys' permits, not a global slot
  advance_and_poll(io, 100ms);
  held[0].complete(rein::outcome::congestion);  // limit 2 -> 1: B still holds the only slot
  rein_test::poll(io);
  CHECK(global.snapshot().limit == 1.0);
  CHECK(order.size() == 2);
  held[1].complete(rein::outcome::ignored);  // no sample: the limit stays 1
  rein_test::poll(io);
  REQUIRE(order == std::vector<std::string>{"A", "B", "C"});
  CHECK(global.snapshot().in_flight == 1);
  CHECK(per_key.snapshot("D")->in_flight == 1);  // D waits for the global slot with its key's permit
  held[2].complete(rein::outcome::success);      // limit 1 -> 2
  rein_test::poll(io);
  CHECK(order.size() == 4);
  CHECK(global.snapshot().limit == 2.0);
  held.clear();
  CHECK(global.snapshot().in_flight == 0);
}

TEST_CASE("an adaptive per-key limiter learns per key from guards", "[throttle][adaptive]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  using aimd_type = rein::basic_adaptive_limiter<rein::algo::basic_aimd<manual_clock>, executor, manual_clock>;
  rein::keyed<aimd_type> per_key(
      io.get_executor(), rein::algo::aimd_options{.initial_limit = 4, .min_limit = 1, .max_limit = 8, .backoff = 0.5, .learn_failure_rate = false});
  sem_type global(io.get_executor(), 100);
  rein::throttle t(per_key, global);
  {
    auto g = t.try_acquire("slow");
    REQUIRE(g);
    g.reject();  // no gates: counts as congestion only
  }
  CHECK(per_key.snapshot("slow")->limit == 2.0);
  CHECK(t.snapshot().rejections_reported == 1);
  std::vector<rein::throttle_guard<decltype(t)>> held;
  for (int i = 0; i < 3; ++i) held.push_back(t.try_acquire("slow"));
  CHECK(static_cast<bool>(held[0]));
  CHECK(static_cast<bool>(held[1]));
  CHECK(held[2].rejected_at() == rein::throttle_stage::per_key);
  CHECK(static_cast<bool>(t.try_acquire("fast")));  // another key keeps its own limit of 4
  CHECK(global.snapshot().in_flight == 2);
}

TEST_CASE("a sliding window as the rate stage: starts are taken at the send, refused requests take none",
          "[throttle][window]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  using window_type = rein::basic_sliding_window<executor, manual_clock>;
  window_type window(io.get_executor(), {.limit = 2, .window = 1s});
  sem_type global(io.get_executor(), 10);
  rein::keyed<sem_type> per_key(io.get_executor(), std::size_t{1});
  rein::throttle t(per_key, global, window);

  auto a = t.try_acquire("A");
  REQUIRE(a);
  CHECK(t.try_acquire("A").rejected_at() == rein::throttle_stage::per_key);
  CHECK(window.snapshot().in_window == 1);  // the refused request never took a start
  auto b = t.try_acquire("B");
  REQUIRE(b);
  CHECK(t.try_acquire("C").rejected_at() == rein::throttle_stage::rate);
  CHECK(global.snapshot().in_flight == 2);  // C's permits went back

  std::vector<double> admitted_at;
  std::vector<rein::throttle_guard<decltype(t)>> held;
  for (std::string key : {"C", "D"})
    t.async_acquire(key, [&](rein::error_code ec, auto g) {
      REQUIRE_FALSE(ec);
      admitted_at.push_back(seconds_since_epoch());
      held.push_back(std::move(g));
    });
  rein_test::poll(io);
  CHECK(window.snapshot().waiting == 2);
  CHECK(global.snapshot().in_flight == 4);  // waiting for the shared window, each keeps its global slot
  advance_and_poll(io, 999ms);
  CHECK(admitted_at.empty());
  advance_and_poll(io, 1ms);
  CHECK(admitted_at == std::vector<double>{1.0, 1.0});

  // A waiter that times out at the per-key stage never took a start.
  advance_and_poll(io, 1s);  // C's and D's starts leave the window
  std::optional<rein::error_code> result;
  t.async_acquire_until("A", manual_clock::now() + 100ms, [&](rein::error_code ec, auto) { result = ec; });
  rein_test::poll(io);
  CHECK(window.snapshot().in_window == 0);  // A's second caller queued for A's permit, holding no start
  CHECK(per_key.snapshot("A")->waiting == 1);
  advance_and_poll(io, 100ms);
  REQUIRE(result.has_value());
  CHECK(*result == rein::errc::timed_out);
  CHECK(window.snapshot().in_window == 0);
}

TEST_CASE("per-key rates: each host gets its own rate, and one host's backlog does not slow the other",
          "[throttle][budget]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::keyed<bucket_type> rate(io.get_executor(), rein::token_bucket_options{.rate = 2, .capacity = 1});
  rate.set_override("fast", rein::token_bucket_options{.rate = 10, .capacity = 1});
  sem_type global(io.get_executor(), 100);
  rein::throttle t(global, rate);
  std::map<std::string, std::vector<double>> admitted_at;
  std::vector<rein::throttle_guard<decltype(t)>> held;
  for (int i = 0; i < 10; ++i)
    for (std::string key : {"slow", "fast"})
      t.async_acquire(key, [&, key](rein::error_code ec, auto g) {
        REQUIRE_FALSE(ec);
        admitted_at[key].push_back(seconds_since_epoch());
        held.push_back(std::move(g));
      });
  rein_test::poll(io);
  for (int step = 0; step < 100; ++step) advance_and_poll(io, 50ms);
  REQUIRE(admitted_at["fast"].size() == 10);
  REQUIRE(admitted_at["slow"].size() == 10);
  for (std::size_t i = 0; i < 10; ++i) {
    CHECK(admitted_at["fast"][i] == Approx(0.1 * static_cast<double>(i)).margin(1e-9));  // 10/s, unhindered
    CHECK(admitted_at["slow"][i] == Approx(0.5 * static_cast<double>(i)).margin(1e-9));  // 2/s
  }
  CHECK(global.snapshot().in_flight == 20);  // admitted calls only: nobody waiting held a slot
}

TEST_CASE("weighted charges: requests and tokens are taken together or not at all", "[throttle][budget]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  bucket_type rpm(io.get_executor(), rein::token_bucket_options{.rate = 10, .capacity = 10});
  bucket_type tpm(io.get_executor(), rein::token_bucket_options{.rate = 100, .capacity = 100});
  rein::throttle t(rpm, rein::by_tokens(tpm));

  auto too_big = t.try_acquire("m", {.requests = 1, .tokens = 150});
  CHECK(too_big.rejected_at() == rein::throttle_stage::rate);
  CHECK(too_big.rejected_stage() == 1);
  CHECK(rpm.tokens() == 10.0);  // the request was not charged alone

  auto first = t.try_acquire("m", {.requests = 1, .tokens = 60});
  REQUIRE(first);
  CHECK(rpm.tokens() == 9.0);
  CHECK(tpm.tokens() == 40.0);
  CHECK_FALSE(t.try_acquire("m", {.requests = 1, .tokens = 50}));
  CHECK(rpm.tokens() == 9.0);

  std::optional<double> admitted_at;
  rein::throttle_guard<decltype(t)> second;
  t.async_acquire("m", {.requests = 1, .tokens = 50}, [&](rein::error_code ec, auto g) {
    REQUIRE_FALSE(ec);
    admitted_at = seconds_since_epoch();
    second = std::move(g);
  });
  rein_test::poll(io);
  CHECK(rpm.tokens() == 9.0);  // waiting for tokens holds no request
  advance_and_poll(io, 99ms);
  CHECK_FALSE(admitted_at.has_value());
  advance_and_poll(io, 1ms);
  REQUIRE(admitted_at.has_value());
  CHECK(*admitted_at == Approx(0.1).margin(1e-9));
  CHECK(rpm.tokens() == 9.0);  // 9 + 1 refilled - 1
  CHECK(tpm.tokens() == 0.0);  // 40 + 10 refilled - 50
  CHECK(second.charged().tokens == 50);
}

TEST_CASE("reconcile refunds an over-estimate and charges an under-estimate as debt", "[throttle][budget]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  bucket_type tpm(io.get_executor(), rein::token_bucket_options{.rate = 100, .capacity = 100});
  rein::throttle t(rein::by_tokens(tpm));
  auto g = t.try_acquire("m", {.requests = 1, .tokens = 80});
  REQUIRE(g);
  CHECK(tpm.tokens() == 20.0);
  g.reconcile({.requests = 1, .tokens = 30});
  CHECK(tpm.tokens() == 70.0);  // the 50 not used went back at once
  g.reconcile({.requests = 1, .tokens = 150});
  CHECK(tpm.tokens() == -50.0);  // 120 more than charged: debt, never a silent overrun
  CHECK(g.charged().tokens == 150);
  g.complete(rein::outcome::success);
  g.reconcile({.requests = 1, .tokens = 0});  // a completed guard settles nothing
  CHECK(tpm.tokens() == -50.0);

  std::optional<double> admitted_at;
  t.async_acquire("m", {.requests = 1, .tokens = 10}, [&](rein::error_code ec, auto) {
    REQUIRE_FALSE(ec);
    admitted_at = seconds_since_epoch();
  });
  rein_test::poll(io);
  advance_and_poll(io, 599ms);
  CHECK_FALSE(admitted_at.has_value());  // the debt delays the next caller: 60 tokens at 100/s
  advance_and_poll(io, 1ms);
  REQUIRE(admitted_at.has_value());
  CHECK(*admitted_at == Approx(0.6).margin(1e-9));
}

TEST_CASE("complete(response): provider headers lower the budget, a 429 pauses the key", "[throttle][budget]") {
  rein_test::manual_clock_at_epoch epoch;
  stages s;
  bucket_type tpm(s.io.get_executor(), rein::token_bucket_options{.rate = 100, .capacity = 1000});
  rein::throttle t(s.gates, s.rate, rein::by_tokens(tpm));
  const auto now = std::chrono::system_clock::now();
  std::map<std::string, std::string> headers{{"x-ratelimit-remaining-tokens", "300"},
                                             {"x-ratelimit-reset-tokens", "2s"}};
  auto lookup = [&headers](std::string_view name) -> std::optional<std::string_view> {
    const auto it = headers.find(std::string(name));
    if (it == headers.end()) return std::nullopt;
    return std::string_view(it->second);
  };
  {
    auto g = t.try_acquire("K", {.requests = 1, .tokens = 100});
    REQUIRE(g);
    CHECK(tpm.tokens() == 900.0);
    g.complete(rein::read_response(200, lookup, now));
  }
  CHECK(tpm.tokens() == 300.0);  // OpenAI's bucket refills all the time: 300 now, "2s" is until full
  CHECK(s.rate.tokens() == 99.0);  // the request stage had no hint: unchanged
  CHECK(t.snapshot().in_flight == 0);

  headers = {{"retry-after", "3"}};
  {
    auto g = t.try_acquire("K", {.requests = 1, .tokens = 10});
    REQUIRE(g);
    g.complete(rein::read_response(429, lookup, now));
  }
  CHECK(s.gates.get("K")->paused_until() == manual_clock::time_point(3s));
  CHECK(t.snapshot().rejections_reported == 1);
  CHECK(t.try_acquire("K").rejected_at() == rein::throttle_stage::gate);
}

TEST_CASE("a 429 widens the pacing margin of the key's bucket only", "[throttle][budget][margin]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::keyed<bucket_type> rate(io.get_executor(), rein::token_bucket_options{.rate = 33, .capacity = 10});
  rein::throttle t(rate);
  {
    auto g = t.try_acquire("A");
    REQUIRE(g);
    g.reject(std::optional<manual_clock::duration>(1s));
  }
  {
    auto g = t.try_acquire("B");
    REQUIRE(g);
    g.complete(rein::outcome::success);
  }
  CHECK(rate.get("A")->rate() == 32.0);  // 33 / (1 + 1/32)
  CHECK(rate.get("A")->snapshot().refusals == 1);
  CHECK(rate.get("B")->rate() == 33.0);
  CHECK(rate.get("B")->snapshot().refusals == 0);
  {
    auto g = t.try_acquire("B");
    REQUIRE(g);
    g.complete(rein::read_response(503, [](std::string_view) -> std::optional<std::string_view> { return std::nullopt; }));
  }
  CHECK(rate.get("B")->rate() == 33.0);  // a 503 without Retry-After is congestion, not an early arrival
}

TEST_CASE("the guard feeds an adaptive rate stage: a 429 cuts the rate", "[throttle][budget]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  using adaptive_rate_type = rein::basic_adaptive_rate_limiter<executor, manual_clock>;
  adaptive_rate_type rate(io.get_executor(), rein::algo::adaptive_rate_options{.initial_rate = 200, .burst = 20});
  rein::throttle t(rate);
  for (int i = 0; i < 13; ++i) {
    manual_clock::advance(10ms);
    auto g = t.try_acquire("host");
    REQUIRE(g);
    g.reject(std::optional<manual_clock::duration>(0s));
  }
  CHECK(rate.snapshot().decreases >= 1);
  CHECK(rate.rate() < 200.0);
}

TEST_CASE("a failure names its stage and key, in both doors", "[throttle][errors]") {
  rein_test::manual_clock_at_epoch epoch;
  stages s;
  rein::throttle_options named;
  named.name = "out";
  rein::throttle t(s.gates, s.per_key, s.global, s.rate, named);
  auto holder = t.try_acquire("api.a");
  REQUIRE(holder);

  std::optional<std::string> what;
  std::optional<std::size_t> stage;
  net::co_spawn(
      s.io,
      [&]() -> net::awaitable<void> {
        try {
          co_await t.acquire_for("api.a", 50ms);
        } catch (const rein::throttle_error& e) {
          what = e.what();
          stage = e.stage();
          CHECK(e.kind() == rein::throttle_stage::per_key);
          CHECK(e.key() == "api.a");
          CHECK(e.code() == rein::errc::timed_out);
        }
      },
      net::detached);
  rein::throttle_guard<decltype(t)> failed;
  t.async_acquire_for("api.a", 50ms, [&](rein::error_code, auto g) { failed = std::move(g); });
  rein_test::poll(s.io);
  advance_and_poll(s.io, 50ms);
  REQUIRE(what.has_value());
  CHECK(*stage == 1);
  CHECK(what->find("rein::throttle \"out\"::acquire: stage 1 (per_key), key \"api.a\"") == 0);
  CHECK_FALSE(failed);
  CHECK(failed.rejected_stage() == 1);
  CHECK(failed.rejected_at() == rein::throttle_stage::per_key);
  CHECK(failed.error() == rein::errc::timed_out);
  CHECK(t.snapshot().timed_out_total == 2);
}

TEST_CASE("an adaptive global stage measures a call from its send, not from its permit", "[throttle][budget]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::basic_adaptive_limiter<rein::algo::basic_aimd<manual_clock>, executor, manual_clock> global(
      io.get_executor(), rein::algo::aimd_options{.initial_limit = 4, .min_limit = 1, .max_limit = 10, .backoff = 0.5, .learn_failure_rate = false});
  bucket_type rate(io.get_executor(), rein::token_bucket_options{.rate = 1, .capacity = 1});
  rein::throttle t(global, rate);
  auto first = t.try_acquire("k");
  REQUIRE(first);
  rein::throttle_guard<decltype(t)> second;
  t.async_acquire("k", [&](rein::error_code ec, auto g) {
    REQUIRE_FALSE(ec);
    second = std::move(g);
  });
  rein_test::poll(io);
  CHECK(global.snapshot().in_flight == 2);  // the second waits at the shared rate, holding its global slot
  advance_and_poll(io, 1s);
  REQUIRE(second);
  advance_and_poll(io, 200ms);
  second.complete(rein::outcome::success);
  CHECK(global.snapshot().service.max() == 200ms);  // sent at 1 s, answered at 1.2 s: not 1.2 s
}

TEST_CASE("keyed rate_limits and keyed adaptive rates are stages", "[throttle][budget]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  using pair_type = rein::basic_rate_limiter<
      rein::algo::all_of<rein::algo::basic_token_bucket<manual_clock>, rein::algo::basic_token_bucket<manual_clock>>,
      executor>;
  const auto t0 = manual_clock::now();
  rein::keyed<pair_type> limits(
      io.get_executor(),
      rein::algo::all_of{rein::algo::basic_token_bucket<manual_clock>({.rate = 1, .capacity = 2}, t0),
                         rein::algo::basic_token_bucket<manual_clock>({.rate = 5, .capacity = 5}, t0)});
  using adaptive_rate_type = rein::basic_adaptive_rate_limiter<executor, manual_clock>;
  rein::keyed<adaptive_rate_type> adaptive(io.get_executor(),
                                           rein::algo::adaptive_rate_options{.initial_rate = 10, .burst = 1});
  rein::throttle t(limits, adaptive);
  auto a = t.try_acquire("x");
  REQUIRE(a);
  CHECK(t.try_acquire("x").rejected_stage() == 1);  // the adaptive rate's burst of 1 is spent
  CHECK(static_cast<bool>(t.try_acquire("y")));     // another key, its own limits
  a.complete(rein::outcome::success);
}

TEST_CASE("a closed key rate ends a waiting acquire with errc::closed, no busy loop", "[throttle][errors]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  sem_type global(io.get_executor(), 4);
  rein::keyed<bucket_type> rate(io.get_executor(), rein::token_bucket_options{.rate = 1, .capacity = 1});
  rein::throttle t(global, rate);
  auto pin = rate.get("a");
  pin->close();
  std::optional<rein::error_code> result;
  rein::throttle_guard<decltype(t)> failed;
  t.async_acquire("a", [&](rein::error_code ec, auto g) {
    result = ec;
    failed = std::move(g);
  });
  rein_test::poll(io);
  REQUIRE(result.has_value());
  CHECK(*result == rein::errc::closed);
  CHECK(failed.rejected_stage() == 1);
  CHECK(global.snapshot().in_flight == 0);
}

TEST_CASE("reconcile gives a window back only in the instant of the admission", "[throttle][budget][window]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  using window_type = rein::basic_sliding_window<executor, manual_clock>;
  window_type window(io.get_executor(), {.limit = 4, .window = 1s});
  rein::throttle t(rein::by_tokens(window));
  auto a = t.try_acquire("k", {.requests = 1, .tokens = 3});
  REQUIRE(a);
  a.reconcile({.requests = 1, .tokens = 1});  // same instant: exact, two starts back
  CHECK(window.snapshot().in_window == 1);
  manual_clock::advance(500ms);
  auto b = t.try_acquire("k", {.requests = 1, .tokens = 3});
  REQUIRE(b);
  manual_clock::advance(100ms);
  b.reconcile({.requests = 1, .tokens = 0});  // later: a refund would free room other calls hold
  CHECK(window.snapshot().in_window == 4);
  CHECK_FALSE(t.try_acquire("k", {.requests = 1, .tokens = 1}));
}

TEST_CASE("a gate's own waiters go first when its pause ends", "[throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  stages s;
  s.gates.get("K")->pause_for(1s);
  std::optional<double> waiter_at;
  s.throttle.async_acquire("K", [&](rein::error_code ec, auto) {
    REQUIRE_FALSE(ec);
    waiter_at = seconds_since_epoch();
  });
  rein_test::poll(s.io);
  CHECK(s.gates.get("K")->snapshot().waiting == 1);
  manual_clock::advance(1s);  // the pause is over, but the gate has not released its waiter yet
  CHECK(s.throttle.try_acquire("K").rejected_at() == rein::throttle_stage::gate);  // no overtaking
  rein_test::poll(s.io);
  REQUIRE(waiter_at.has_value());
  CHECK(*waiter_at == 1.0);
}

TEST_CASE("a global stage in fair order shares itself between keys by weight, A flooding it with 10x the callers",
          "[throttle][fair]") {
  // Fair sharing between keys as the throttle's global stage: weights 1, 1, 2 (key_weight), 8 slots; each
  // caller takes a guard, holds it until the driver ends the oldest one, and asks again at once.
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  sem_type global(io.get_executor(), 8, {.order = rein::queue_order::fair});
  rein::throttle_options options;
  options.key_weight = [](std::string_view key) -> std::uint32_t { return key == "C" ? 2 : 1; };
  rein::throttle t(rein::unlimited, global, std::move(options));
  using guard = rein::throttle_guard<decltype(t)>;
  std::deque<std::pair<std::string, guard>> held;  // oldest admission first
  std::string admitted;                            // one letter per admission, in order
  std::function<void(std::string)> ask = [&](std::string key) {
    t.async_acquire(key, [&, key](rein::error_code ec, guard g) {
      REQUIRE_FALSE(ec);
      admitted += key;
      held.emplace_back(key, std::move(g));
    });
  };
  for (const auto& [key, callers] : {std::pair{"A", 60}, std::pair{"B", 6}, std::pair{"C", 6}})
    for (int i = 0; i < callers; ++i) ask(key);
  rein_test::poll(io);
  REQUIRE(admitted == "AAAAAAAA");  // nobody waited yet: A's first 8 took the slots at once
  for (int i = 0; i < 4'000; ++i) {
    std::string key = held.front().first;
    held.pop_front();  // the guard's destructor gives its slot back
    ask(key);
    rein_test::poll(io);
  }
  // Every window of 1,000 admissions holds 250 of A, 250 of B and 500 of C: rounds of A, B, C, C.
  for (std::size_t from = 8; from + 1000 <= admitted.size(); ++from) {
    const std::string_view w = std::string_view(admitted).substr(from, 1000);
    REQUIRE(std::count(w.begin(), w.end(), 'A') == 250);
    REQUIRE(std::count(w.begin(), w.end(), 'B') == 250);
  }
  CHECK(global.snapshot().in_flight == 8);
}

TEST_CASE("the coroutine door waits at a fair global stage as its key too", "[throttle][fair]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  sem_type global(io.get_executor(), 1, {.order = rein::queue_order::fair});
  rein::throttle t(rein::unlimited, global);
  auto first = t.try_acquire("flood");
  REQUIRE(first);
  std::string served;
  auto call = [&](std::string key) -> net::awaitable<void> {
    auto g = co_await t.acquire(key);
    served += key + " ";
  };
  for (int i = 0; i < 3; ++i) net::co_spawn(io, call("flood"), net::detached);
  net::co_spawn(io, call("quiet"), net::detached);
  rein_test::poll(io);
  first = {};  // each guard ends as its caller resumes, so the slot passes down the line
  rein_test::poll(io);
  CHECK(served == "flood quiet flood flood ");
}

TEST_CASE("one host's 429 teaches its own stages, not a global limit that has per-host peers; the option "
          "restores the old rule",
          "[throttle][adaptive]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  using aimd_type = rein::basic_adaptive_limiter<rein::algo::basic_aimd<manual_clock>, executor, manual_clock>;
  const rein::algo::aimd_options learn{
      .initial_limit = 8, .min_limit = 1, .max_limit = 10, .backoff = 0.5, .learn_failure_rate = false};
  rein::keyed<gate_type> gates(io.get_executor(), {});
  rein::keyed<aimd_type> per_host(io.get_executor(), learn);
  aimd_type global(io.get_executor(), learn);
  const auto reject_once = [&](auto& t) {
    auto g = t.try_acquire("a.example");
    REQUIRE(g);
    advance_and_poll(io, 10ms);
    g.reject(std::optional<manual_clock::duration>(1s));
  };
  {
    rein::throttle t(gates, per_host, global);  // automatic: a per-host concurrency stage exists
    reject_once(t);
    CHECK(per_host.snapshot("a.example")->limit == 4.0);  // the host's own limit is cut
    CHECK(global.snapshot().limit == 8.0);                // everyone's is not
    CHECK(global.snapshot().decreases == 0);
    CHECK(gates.find("a.example")->is_paused());
    CHECK(t.snapshot().rejections_reported == 1);
  }
  {
    rein::throttle_options old_rule;
    old_rule.rejections = rein::rejection_feedback::everywhere;
    rein::throttle t(gates, per_host, global, old_rule);
    advance_and_poll(io, 2s);  // past the pause
    reject_once(t);
    CHECK(global.snapshot().limit == 4.0);
  }
  {
    rein::throttle_options never;
    never.rejections = rein::rejection_feedback::per_key;
    aimd_type alone(io.get_executor(), learn);
    rein::throttle single(alone, never);  // no keyed stage: automatic would teach it (see below)
    reject_once(single);
    CHECK(alone.snapshot().limit == 8.0);
    rein::throttle automatic(alone);
    reject_once(automatic);
    CHECK(alone.snapshot().limit == 4.0);
  }
}

TEST_CASE("a global rate stage in fair order serves keys by weight; key_weight is clamped and its throw is 1",
          "[throttle][fair]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  bucket_type rate(io.get_executor(), rein::token_bucket_options{.rate = 10, .capacity = 1},
                   rein::line_options{.order = rein::queue_order::fair});
  rein::throttle_options options;
  options.key_weight = [](std::string_view key) -> std::uint32_t {
    if (key == "throws") throw std::runtime_error("no weight");
    return key == "huge" ? 4'000'000'000u : 1u;
  };
  rein::throttle t(rate, std::move(options));
  REQUIRE(t.try_acquire("first"));  // the one token
  std::string order;
  for (const char* key : {"flood", "flood", "flood", "throws", "huge", "huge"})
    t.async_acquire(key, [&order, key](rein::error_code ec, auto g) {
      REQUIRE_FALSE(ec);
      order += std::string(key) + " ";
      g.complete(rein::outcome::success);
    });
  rein_test::poll(io);
  for (int i = 0; i < 6; ++i) advance_and_poll(io, 100ms);
  // Tags: flood 0, 1, 2; throws 0 (weight 1); huge 0 and 1e-6 (weight clamped to 1,000,000).
  CHECK(order == "flood throws huge huge flood flood ");
}

TEST_CASE("rejection feedback on rate stages: a keyed adaptive rate learns a 429, the global one does not",
          "[throttle][adaptive]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  using adaptive_rate_type = rein::basic_adaptive_rate_limiter<executor, manual_clock>;
  const rein::algo::adaptive_rate_options opts{.initial_rate = 200, .burst = 20};
  rein::keyed<adaptive_rate_type> per_host(io.get_executor(), opts);
  adaptive_rate_type global(io.get_executor(), opts);
  rein::throttle t(per_host, global);
  for (int i = 0; i < 13; ++i) {
    manual_clock::advance(10ms);
    auto g = t.try_acquire("a.example");
    REQUIRE(g);
    g.complete_http(429);  // learned as a rejection: the host's rate, not the global one
  }
  CHECK(per_host.snapshot("a.example")->decreases >= 1);
  CHECK(global.snapshot().decreases == 0);
  CHECK(global.rate() == 200.0);
}

TEST_CASE("a key_weight with no global stage in fair order is refused when the throttle is built", "[throttle][fair]") {
  net::io_context io;
  sem_type fifo(io.get_executor(), 4);
  rein::throttle_options options;
  options.key_weight = [](std::string_view) -> std::uint32_t { return 2; };
  CHECK_THROWS_MATCHES((rein::throttle(fifo, options)), std::invalid_argument,
                       Catch::Message("rein::throttle: key_weight needs a global stage whose order is "
                                      "queue_order::fair, got none"));
  sem_type fair(io.get_executor(), 4, {.order = rein::queue_order::fair});
  CHECK_NOTHROW(rein::throttle(fair, options));
}

namespace {

// The manual clock, counting its reads: how many times an admission looks at the time.
struct counting_clock : manual_clock {
  static inline int reads = 0;
  static time_point now() noexcept {
    ++reads;
    return manual_clock::now();
  }
};

}  // namespace

template <>
struct REIN_ASIO_NAMESPACE::wait_traits<counting_clock> : REIN_ASIO_NAMESPACE::wait_traits<manual_clock> {};

TEST_CASE("an admission reads the clock once: the gate, the rate and the send share one reading",
          "[throttle][fast_path]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  using counted_gate = rein::basic_quota_gate<executor, counting_clock>;
  using counted_bucket = rein::basic_token_bucket<executor, counting_clock>;
  using counted_sem = rein::basic_semaphore<executor, counting_clock>;
  rein::keyed<counted_gate> gates(io.get_executor(), no_jitter());
  rein::keyed<counted_sem> per_key(io.get_executor(), std::size_t{4});
  counted_sem global(io.get_executor(), 10);
  counted_bucket rate(io.get_executor(), rein::token_bucket_options{.rate = 100, .capacity = 100});
  rein::throttle<rein::keyed<counted_gate>, rein::keyed<counted_sem>, counted_sem, counted_bucket> throttle(gates, per_key, global, rate);

  auto first = throttle.try_acquire("K");  // makes K's gate and semaphore
  REQUIRE(first);
  manual_clock::advance(5ms);
  counting_clock::reads = 0;
  auto g = throttle.try_acquire("K");
  REQUIRE(g);
  CHECK(counting_clock::reads == 1);
  CHECK(g.admitted_at() == counting_clock::time_point(5ms));

  counting_clock::reads = 0;
  std::optional<decltype(g)> awaited;
  net::co_spawn(io, [&]() -> net::awaitable<void> { awaited.emplace(co_await throttle.acquire("K")); }, net::detached);
  io.run();
  REQUIRE(awaited);
  REQUIRE(*awaited);
  CHECK(counting_clock::reads == 1);  // the coroutine door's fast path too
  CHECK(rate.tokens() == 97.5);       // 3 taken, 0.5 refilled over the 5 ms

  counting_clock::reads = 0;
  std::optional<decltype(g)> handed;
  throttle.async_acquire("K", [&](rein::error_code, decltype(g) h) { handed.emplace(std::move(h)); });
  io.restart();
  io.run();
  REQUIRE(handed);
  REQUIRE(*handed);
  CHECK(counting_clock::reads == 2);  // async_acquire's call reads it once more, to time a wait from there
}

namespace {

// A permit source that records the stamps it is told of.
struct stamp_log final : rein::detail::permit_source {
  std::vector<std::pair<std::int64_t, std::int64_t>> restamps;
  std::int64_t released_stamp = -1;
  void release_permit(std::size_t, std::chrono::nanoseconds stamp, std::uint64_t, rein::outcome) noexcept override {
    released_stamp = stamp.count();
  }
  void permit_split(std::uint64_t) noexcept override {}
  void restamp_permit(std::chrono::nanoseconds from, std::chrono::nanoseconds to) noexcept override {
    restamps.emplace_back(from.count(), to.count());
  }
};

}  // namespace

TEST_CASE("a permit's stamp moves only forward: an admission reading older than the grant keeps the grant's",
          "[throttle][fast_path]") {
  // The throttle's one reading precedes the concurrency stages' own grants; a stamp moved back before its
  // grant would show an adaptive limiter a grant it had not made yet (a half-open circuit loses its probe).
  stamp_log source;
  {
    rein::permit p(&source, 1, 100ns);
    rein::detail::permit_access::restamp(p, 50ns);
    rein::detail::permit_access::restamp(p, 100ns);
    CHECK(source.restamps.empty());
    rein::detail::permit_access::restamp(p, 250ns);
    CHECK(source.restamps == std::vector<std::pair<std::int64_t, std::int64_t>>{{100, 250}});
  }
  CHECK(source.released_stamp == 250);
}

// ---- Shutdown -------------------------------------------------------------------------------------------
// A service's usual declaration order: the io_context first, then the stages, then the throttle; so the
// throttle goes first, then the stages, and the io_context last, destroying the coroutine frames still
// suspended in it, with the guards and the half-taken admissions they hold. Each of those must then be safe
// (it does nothing harmful and leaks nothing, checked under ASan), as a permit that outlives its limiter is.
// Callers at every step: two admitted and in their call (one after waiting for the rate), two waiting for
// their key's permit (through acquire() and through the initiating function), one waiting at its key's
// paused gate, and one waiting for a global slot. (A caller waiting for the rate when the throttle goes is
// the next test's.)

namespace {

// Small stages, so that every step has a waiter: rate 1/s burst 1, global 2, per-key 1. Each object on the
// heap, as a service's members usually are in effect, so that ASan sees a use of any of them once destroyed.
struct shutdown_stages {
  using throttle_type = rein::throttle<rein::keyed<gate_type>, rein::keyed<sem_type>, sem_type, bucket_type>;
  std::unique_ptr<net::io_context> io_owner = std::make_unique<net::io_context>();
  net::io_context& io = *io_owner;
  std::unique_ptr<rein::keyed<gate_type>> gates_owner =
      std::make_unique<rein::keyed<gate_type>>(io.get_executor(), no_jitter());
  std::unique_ptr<rein::keyed<sem_type>> per_key_owner =
      std::make_unique<rein::keyed<sem_type>>(io.get_executor(), std::size_t{1});
  std::unique_ptr<sem_type> global_owner = std::make_unique<sem_type>(io.get_executor(), 2);
  std::unique_ptr<bucket_type> rate_owner =
      std::make_unique<bucket_type>(io.get_executor(), rein::token_bucket_options{.rate = 1, .capacity = 1});
  rein::keyed<gate_type>& gates = *gates_owner;
  rein::keyed<sem_type>& per_key = *per_key_owner;
  sem_type& global = *global_owner;
  std::unique_ptr<throttle_type> throttle_owner =
      std::make_unique<throttle_type>(gates, per_key, global, *rate_owner);
  throttle_type& throttle = *throttle_owner;
};

// Acquires for `key`, then stays in its call for an hour (it never ends within the test).
net::awaitable<void> call_for_an_hour(shutdown_stages& s, std::string key, int& admitted) {
  auto guard = co_await s.throttle.acquire(key);
  ++admitted;
  net::basic_waitable_timer<manual_clock> call(s.io, 1h);
  co_await call.async_wait(net::use_awaitable);
  guard.complete(rein::outcome::success);
}

}  // namespace

TEST_CASE("shutdown in declaration order with callers at every step is safe", "[throttle][shutdown]") {
  rein_test::manual_clock_at_epoch epoch;
  int admitted = 0;
  {
    shutdown_stages s;
    s.gates.get("paused")->pause_for(1h);
    net::co_spawn(s.io, call_for_an_hour(s, "A", admitted), net::detached);       // admitted, in its call
    net::co_spawn(s.io, call_for_an_hour(s, "A", admitted), net::detached);       // waits for A's permit
    net::co_spawn(s.io, call_for_an_hour(s, "paused", admitted), net::detached);  // waits at its gate
    net::co_spawn(s.io, call_for_an_hour(s, "B", admitted), net::detached);       // waits for the rate, then in
    s.throttle.async_acquire("A", [&](rein::error_code, auto) { ++admitted; });  // the initiating function
    rein_test::poll(s.io);
    CHECK(admitted == 1);
    CHECK(s.per_key.get("A")->snapshot().waiting == 2);
    CHECK(s.gates.get("paused")->snapshot().waiting == 1);
    advance_and_poll(s.io, 1s);  // B takes the second token: both global slots are now held
    CHECK(admitted == 2);
    net::co_spawn(s.io, call_for_an_hour(s, "C", admitted), net::detached);  // waits for a global slot
    rein_test::poll(s.io);
    CHECK(s.global.snapshot().waiting == 1);
  }  // the throttle, the stages, then the io_context with the six callers' frames
  CHECK(admitted == 2);
}

namespace {

// As call_for_an_hour, recording how a waiting acquire ended.
net::awaitable<void> call_or_record(shutdown_stages& s, std::string key, std::vector<rein::error_code>& ended) {
  try {
    auto guard = co_await s.throttle.acquire(key);
    net::basic_waitable_timer<manual_clock> call(s.io, 1h);
    co_await call.async_wait(net::use_awaitable);
  } catch (const rein::throttle_error& e) {
    ended.push_back(e.code());
  }
}

}  // namespace

TEST_CASE("a throttle destroyed while the io_context runs on ends its waiting callers", "[throttle][shutdown]") {
  rein_test::manual_clock_at_epoch epoch;
  std::vector<rein::error_code> ended;
  std::optional<rein::error_code> callback_ended;
  shutdown_stages s;
  net::co_spawn(s.io, call_or_record(s, "A", ended), net::detached);  // admitted, in its call
  net::co_spawn(s.io, call_or_record(s, "A", ended), net::detached);  // waits for A's permit
  net::co_spawn(s.io, call_or_record(s, "B", ended), net::detached);  // waits for the rate, on a timer
  s.throttle.async_acquire("A", [&](rein::error_code ec, auto) { callback_ended = ec; });
  rein_test::poll(s.io);
  REQUIRE(s.per_key.get("A")->snapshot().waiting == 2);

  s.throttle_owner.reset();      // the stages live on
  advance_and_poll(s.io, 1s);    // B's rate is ready: its waiter wakes to a throttle that is gone
  REQUIRE(ended.size() == 1);
  CHECK(ended[0] == rein::error_code(net::error::operation_aborted));
  s.per_key_owner.reset();       // A's waiters are aborted by their stage
  rein_test::poll(s.io);
  REQUIRE(ended.size() == 2);
  CHECK(ended[1] == rein::error_code(net::error::operation_aborted));
  REQUIRE(callback_ended.has_value());
  CHECK(*callback_ended == rein::error_code(net::error::operation_aborted));
  CHECK(s.global.snapshot().in_flight == 1);  // the caller in its call still holds its slot
}

namespace {
// A weight with state: reading it after the throttle is gone reads freed memory (under ASan, an error).
struct weight_of {
  std::size_t n;
  std::size_t operator()(const rein::charge&) const noexcept { return n; }
};
}  // namespace

TEST_CASE("a throttle destroyed while a caller sleeps on its key's rate ends it without touching the throttle",
          "[throttle][shutdown]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::keyed<bucket_type> rate{io.get_executor(), rein::token_bucket_options{.rate = 1, .capacity = 1}};
  using throttle_type = rein::throttle<decltype(rein::weighted(rate, weight_of{1}))>;
  auto owner = std::make_unique<throttle_type>(rein::weighted(rate, weight_of{1}));
  auto first = owner->try_acquire("k");  // spends k's token
  REQUIRE(first);
  first.complete(rein::outcome::success);
  std::optional<rein::error_code> ended;
  owner->async_acquire("k", [&](rein::error_code ec, auto) { ended = ec; });
  rein_test::poll(io);  // refused at k's rate: asleep until the rate is ready, at 1 s
  owner.reset();        // the stages live on
  advance_and_poll(io, 1s);
  REQUIRE(ended.has_value());
  CHECK(*ended == rein::error_code(net::error::operation_aborted));
  CHECK(rate.get("k")->snapshot().tokens == 1.0);  // nothing taken for a caller whose throttle is gone
}

// Step 3 waits in the key rate's own line: its order, its one timer, its deadlines, cancellation and close.
namespace {

using order_guard = rein::throttle_guard<rein::throttle<sem_type, rein::keyed<bucket_type>>>;

// Who was admitted, in order, and when.
struct admissions {
  std::vector<int> who;
  std::vector<manual_clock::duration> at;
  void add(int i) {
    who.push_back(i);
    at.push_back(since_epoch());
  }
};

std::vector<int> iota_of(int from, int n) {
  std::vector<int> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = from + i;
  return v;
}

}  // namespace

TEST_CASE("40 callers of one key on its rate (100/s, burst 1) are admitted in arrival order, 10 ms apart",
          "[throttle][order]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  sem_type global(io.get_executor(), 100);
  admissions got;
  std::vector<order_guard> held;
  auto check_order = [&] {
    REQUIRE(got.who.size() == 40);
    CHECK(got.who == iota_of(0, 40));
    for (std::size_t i = 0; i < got.at.size(); ++i) {
      INFO("caller " << i);
      CHECK(got.at[i] == static_cast<int>(i) * 10ms);
    }
    CHECK(global.snapshot().in_flight == 40);  // nobody waiting at its key's rate held a global slot meanwhile
  };
  SECTION("the completion-token door, fifo") {
    rein::keyed<bucket_type> rate(io.get_executor(), rein::token_bucket_options{.rate = 100, .capacity = 1});
    rein::throttle t(global, rate);
    for (int i = 0; i < 40; ++i)
      t.async_acquire("k", [&, i](rein::error_code ec, order_guard g) {
        REQUIRE_FALSE(ec);
        got.add(i);
        held.push_back(std::move(g));
      });
    rein_test::poll(io);
    CHECK(rate.get("k")->snapshot().waiting == 39);  // in its key's line, not on timers of their own
    for (int step = 0; step < 400; ++step) advance_and_poll(io, 1ms);
    check_order();
    CHECK(t.snapshot().stages[1].readmitted == 0);  // each token taken once, at its grant, kept to admission
  }
  SECTION("the coroutine door, priority order (one class: arrival order)") {
    rein::keyed<bucket_type> rate(io.get_executor(), rein::token_bucket_options{.rate = 100, .capacity = 1},
                                  rein::line_options{.order = rein::queue_order::priority});
    rein::throttle t(global, rate);
    for (int i = 0; i < 40; ++i)
      net::co_spawn(
          io,
          [&, i]() -> net::awaitable<void> {
            auto g = co_await t.acquire("k");
            got.add(i);
            held.push_back(std::move(g));
          },
          net::detached);
    rein_test::poll(io);
    for (int step = 0; step < 400; ++step) advance_and_poll(io, 1ms);
    check_order();
  }
}

TEST_CASE("callers of one key take the order of its rate's line: lifo serves the newest first",
          "[throttle][order]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  sem_type global(io.get_executor(), 100);
  rein::keyed<bucket_type> rate(io.get_executor(), rein::token_bucket_options{.rate = 100, .capacity = 1},
                                rein::line_options{.order = rein::queue_order::lifo});
  rein::throttle t(global, rate);
  admissions got;
  std::vector<order_guard> held;
  for (int i = 0; i < 5; ++i)
    t.async_acquire("k", [&, i](rein::error_code ec, order_guard g) {
      REQUIRE_FALSE(ec);
      got.add(i);
      held.push_back(std::move(g));
    });
  rein_test::poll(io);
  for (int step = 0; step < 50; ++step) advance_and_poll(io, 1ms);
  CHECK(got.who == std::vector<int>{0, 4, 3, 2, 1});
  CHECK(got.at == std::vector<manual_clock::duration>{0ms, 10ms, 20ms, 30ms, 40ms});
}

TEST_CASE("two keyed rates (requests and tokens per key), a charge on both and a debt: every caller admitted, "
          "exactly when both allow",
          "[throttle][order]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  sem_type global(io.get_executor(), 100);
  rein::keyed<bucket_type> requests(io.get_executor(), rein::token_bucket_options{.rate = 100, .capacity = 1});
  rein::keyed<bucket_type> tokens(io.get_executor(), rein::token_bucket_options{.rate = 1000, .capacity = 100});
  rein::throttle t(global, requests, rein::by_tokens(tokens));
  using two_rates_guard = rein::throttle_guard<decltype(t)>;
  admissions got;
  std::vector<two_rates_guard> held;
  for (int i = 0; i < 5; ++i)
    t.async_acquire("k", {.requests = 1, .tokens = 100}, [&, i](rein::error_code ec, two_rates_guard g) {
      REQUIRE_FALSE(ec);
      got.add(i);
      held.push_back(std::move(g));
    });
  rein_test::poll(io);
  REQUIRE(got.who.size() == 1);
  // At 10 ms each waiter in turn is granted the key's request, finds its tokens short (10 of 100), gives the
  // request back and waits in the tokens' line, in arrival order. At 50 ms the first call owes 100 tokens
  // more: the key's tokens stand at -50, and reach 100 at 200 ms.
  for (int step = 0; step < 45; ++step) advance_and_poll(io, 1ms);
  CHECK(tokens.get("k")->snapshot().waiting == 4);
  CHECK(requests.get("k")->snapshot().waiting == 0);
  CHECK(requests.get("k")->snapshot().tokens == 1.0);  // no waiter holds the request it was granted
  for (int step = 0; step < 5; ++step) advance_and_poll(io, 1ms);
  held[0].reconcile({.requests = 1, .tokens = 200});
  for (int step = 0; step < 600; ++step) advance_and_poll(io, 1ms);
  CHECK(got.who == iota_of(0, 5));
  CHECK(got.at == std::vector<manual_clock::duration>{0ms, 200ms, 300ms, 400ms, 500ms});
}

TEST_CASE("two throttles listing the same keyed rates in opposite orders both admit, exactly when both allow",
          "[throttle][order]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  sem_type global(io.get_executor(), 100);
  rein::keyed<bucket_type> requests(io.get_executor(), rein::token_bucket_options{.rate = 100, .capacity = 1});
  rein::keyed<bucket_type> tokens(io.get_executor(), rein::token_bucket_options{.rate = 1000, .capacity = 100});
  rein::throttle requests_first(global, requests, rein::by_tokens(tokens));
  rein::throttle tokens_first(global, rein::by_tokens(tokens), requests);
  admissions got;
  std::vector<rein::throttle_guard<decltype(requests_first)>> held_r;
  std::vector<rein::throttle_guard<decltype(tokens_first)>> held_t;
  const rein::charge c{.requests = 1, .tokens = 100};
  for (int i = 0; i < 6; ++i) {
    if (i % 2 == 0)
      requests_first.async_acquire("k", c, [&, i](rein::error_code ec, auto g) {
        REQUIRE_FALSE(ec);
        got.add(i);
        held_r.push_back(std::move(g));
      });
    else
      tokens_first.async_acquire("k", c, [&, i](rein::error_code ec, auto g) {
        REQUIRE_FALSE(ec);
        got.add(i);
        held_t.push_back(std::move(g));
      });
  }
  rein_test::poll(io);
  for (int step = 0; step < 600; ++step) advance_and_poll(io, 1ms);
  // Caller 0 spends both at 0. The tokens-first callers (1, 3, 5) wait in the tokens' line at once; the
  // requests-first ones (2, 4) in the requests' line, whose grants at 10 ms find the tokens' line taken and
  // give the request back to join it: a place in one line is not kept while waiting in another.
  CHECK(got.who == std::vector<int>{0, 1, 3, 5, 2, 4});
  CHECK(got.at == std::vector<manual_clock::duration>{0ms, 100ms, 200ms, 300ms, 400ms, 500ms});
  CHECK(requests.get("k")->snapshot().waiting == 0);
  CHECK(tokens.get("k")->snapshot().waiting == 0);
}

// A rate limiter that does not say its rule (no reachable limit_type or inspect), as a user's own may not:
// the throttle cannot ask whether it could take a charge without taking it.
struct opaque_rate : private bucket_type {
  using bucket_type::clock_type;
  using bucket_type::duration;
  using bucket_type::executor_type;
  using bucket_type::time_point;
  using rule_type = rein::token_bucket_options;
  opaque_rate(const executor_type& ex, const rule_type& r, rein::line_options line = {})
      : bucket_type(ex, r, std::move(line)) {}
  using bucket_type::async_acquire_until;
  using bucket_type::close;
  using bucket_type::get_executor;
  using bucket_type::refund;
  using bucket_type::snapshot;
  using bucket_type::try_acquire;
};

TEST_CASE("two keyed rates that cannot be asked: the one found short is waited on in its line, no loop",
          "[throttle][order]") {
  // Each looks ready at step 3; the one step 5 finds short is waited on. Asking it again instead looped at
  // one instant: its line granted at once, the other was found short, its claim refunded, and so on.
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  sem_type global(io.get_executor(), 100);
  rein::keyed<opaque_rate> a(io.get_executor(), rein::token_bucket_options{.rate = 100, .capacity = 1});
  rein::keyed<opaque_rate> b(io.get_executor(), rein::token_bucket_options{.rate = 100, .capacity = 1});
  rein::throttle t(global, a, b);
  auto first = t.try_acquire("k");
  REQUIRE(first);
  std::optional<manual_clock::duration> admitted_at;
  t.async_acquire("k", [&](rein::error_code ec, auto g) {
    REQUIRE_FALSE(ec);
    REQUIRE(g);
    admitted_at = since_epoch();
  });
  for (int step = 0; step < 30 && !admitted_at; ++step) {
    manual_clock::advance(1ms);
    io.restart();
    std::size_t ran = 0;
    while (ran < 10000 && io.poll_one() != 0) ++ran;
    REQUIRE(ran < 10000);  // no loop at one instant
  }
  CHECK(admitted_at == 10ms);
  CHECK(a.get("k")->snapshot().acquired_total == 2);  // the first call's, and the line's grant at 10 ms
  CHECK(b.get("k")->snapshot().acquired_total == 2);
}

TEST_CASE("a caller that times out or is cancelled in its key's line gives its place up: the next is admitted "
          "at the exact instant",
          "[throttle][order][cancel]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  sem_type global(io.get_executor(), 100);
  rein::keyed<bucket_type> rate(io.get_executor(), rein::token_bucket_options{.rate = 100, .capacity = 1});
  rein::throttle t(global, rate);
  admissions got;
  std::vector<order_guard> held;
  auto admit = [&](int i) {
    return [&, i](rein::error_code ec, order_guard g) {
      REQUIRE_FALSE(ec);
      got.add(i);
      held.push_back(std::move(g));
    };
  };
  std::optional<rein::error_code> lost;
  std::optional<manual_clock::duration> lost_at;
  auto record_loss = [&](rein::error_code ec, order_guard g) {
    CHECK_FALSE(g);
    lost = ec;
    lost_at = since_epoch();
  };
  net::cancellation_signal signal;
  t.async_acquire("k", admit(0));
  t.async_acquire("k", admit(1));  // 10 ms
  SECTION("timed out") {
    t.async_acquire_until("k", manual_clock::now() + 15ms, record_loss);  // its turn would be at 20 ms
    t.async_acquire("k", admit(3));
    rein_test::poll(io);
    for (int step = 0; step < 40; ++step) advance_and_poll(io, 1ms);
    REQUIRE(lost.has_value());
    CHECK(*lost == rein::errc::timed_out);
  }
  SECTION("cancelled") {
    t.async_acquire("k", net::bind_cancellation_slot(signal.slot(), record_loss));
    t.async_acquire("k", admit(3));
    rein_test::poll(io);
    advance_and_poll(io, 5ms);
    signal.emit(net::cancellation_type::terminal);
    rein_test::poll(io);
    REQUIRE(lost.has_value());
    CHECK(*lost == net::error::operation_aborted);
    CHECK(*lost_at == 5ms);
    for (int step = 0; step < 35; ++step) advance_and_poll(io, 1ms);
  }
  CHECK(got.who == std::vector<int>{0, 1, 3});
  CHECK(got.at == std::vector<manual_clock::duration>{0ms, 10ms, 20ms});
  CHECK(rate.get("k")->snapshot().waiting == 0);
  CHECK(global.snapshot().in_flight == 3);
  CHECK(t.snapshot().waiting == 0);
}

TEST_CASE("closing a key's rate ends every caller waiting in its line with errc::closed, holding nothing",
          "[throttle][order][errors]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  sem_type global(io.get_executor(), 100);
  rein::keyed<bucket_type> rate(io.get_executor(), rein::token_bucket_options{.rate = 100, .capacity = 1});
  rein::throttle t(global, rate);
  auto first = t.try_acquire("k");
  REQUIRE(first);
  std::vector<rein::error_code> ended;
  std::vector<std::size_t> stage;
  for (int i = 0; i < 3; ++i)
    t.async_acquire("k", [&](rein::error_code ec, order_guard g) {
      CHECK_FALSE(g);
      ended.push_back(ec);
      stage.push_back(g.rejected_stage());
    });
  rein_test::poll(io);
  advance_and_poll(io, 5ms);
  CHECK(rate.get("k")->snapshot().waiting == 3);
  rate.get("k")->close();
  rein_test::poll(io);
  CHECK(ended == std::vector<rein::error_code>(3, rein::errc::closed));
  CHECK(stage == std::vector<std::size_t>(3, 1));
  CHECK(global.snapshot().in_flight == 1);  // the first call's only
  CHECK(t.snapshot().closed_total == 3);
  CHECK(since_epoch() == 5ms);
}

TEST_CASE("randomized: two throttles with opposite orders of two keyed rates, deadlines and cancellations: "
          "every caller ends, and each key's rates keep their bound at the send",
          "[throttle][order]") {
  for (std::uint32_t seed = 1; seed <= 10; ++seed) {
    DYNAMIC_SECTION("seed " << seed) {
      rein_test::manual_clock_at_epoch epoch;
      net::io_context io;
      sem_type global(io.get_executor(), 1000);
      rein::keyed<bucket_type> requests(io.get_executor(), rein::token_bucket_options{.rate = 100, .capacity = 1});
      rein::keyed<bucket_type> tokens(io.get_executor(), rein::token_bucket_options{.rate = 1000, .capacity = 100});
      rein::throttle requests_first(global, requests, rein::by_tokens(tokens));
      rein::throttle tokens_first(global, rein::by_tokens(tokens), requests);
      std::mt19937 rng(seed);
      struct sent {
        std::int64_t ms;
        std::size_t tokens;
      };
      std::map<std::string, std::vector<sent>> sends;  // per key, in admission order
      std::size_t ended = 0;
      std::size_t admitted = 0;
      std::vector<std::unique_ptr<net::cancellation_signal>> signals;
      std::vector<std::function<void()>> held;  // completes an admitted call
      auto on_end = [&](std::string key, std::size_t n) {
        return [&, key, n](rein::error_code ec, auto g) {
          ++ended;
          if (ec) {
            CHECK((ec == rein::errc::timed_out || ec == net::error::operation_aborted));
            return;
          }
          ++admitted;
          sends[key].push_back({std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch()).count(), n});
          auto shared = std::make_shared<decltype(g)>(std::move(g));
          held.push_back([shared] { shared->complete(rein::outcome::success); });
        };
      };
      const std::size_t callers = 60;
      for (int step = 0; step < 3000; ++step) {
        if (step < 600 && signals.size() < callers && rng() % 10 == 0) {
          const std::string key(1, static_cast<char>('a' + rng() % 3));
          const std::size_t n = 10 + rng() % 91;
          const rein::charge c{.requests = 1, .tokens = n};
          const auto deadline = manual_clock::now() + std::chrono::milliseconds(50 + rng() % 500);
          signals.push_back(std::make_unique<net::cancellation_signal>());
          auto slot = signals.back()->slot();
          const bool timed = rng() % 3 == 0;
          if (rng() % 2 == 0) {
            if (timed) requests_first.async_acquire_until(key, c, deadline, net::bind_cancellation_slot(slot, on_end(key, n)));
            else requests_first.async_acquire(key, c, net::bind_cancellation_slot(slot, on_end(key, n)));
          } else {
            if (timed) tokens_first.async_acquire_until(key, c, deadline, net::bind_cancellation_slot(slot, on_end(key, n)));
            else tokens_first.async_acquire(key, c, net::bind_cancellation_slot(slot, on_end(key, n)));
          }
        }
        if (!signals.empty() && rng() % 200 == 0) signals[rng() % signals.size()]->emit(net::cancellation_type::terminal);
        advance_and_poll(io, 1ms);
      }
      for (int step = 0; step < 20000 && ended < signals.size(); ++step) advance_and_poll(io, 1ms);
      CHECK(ended == signals.size());  // nobody left waiting: no deadlock
      CHECK(admitted > 20);
      CHECK(global.snapshot().in_flight == admitted);
      CHECK(requests_first.snapshot().waiting == 0);
      CHECK(tokens_first.snapshot().waiting == 0);
      // The bound, at each send: requests at most 1 + 100/s x window, tokens at most 100 + 1000/s x window.
      for (const auto& [key, at] : sends) {
        for (std::size_t i = 0; i < at.size(); ++i) {
          std::size_t sum = 0;
          for (std::size_t j = i; j < at.size(); ++j) {
            sum += at[j].tokens;
            const std::int64_t window = at[j].ms - at[i].ms;
            INFO("key " << key << ", sends " << i << " to " << j);
            CHECK(static_cast<std::int64_t>(j - i + 1) * 10 <= 10 + window);
            CHECK(static_cast<std::int64_t>(sum) <= 100 + window);
          }
        }
      }
      for (auto& complete : held) complete();
    }
  }
}
