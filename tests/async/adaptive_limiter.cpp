// rein::basic_adaptive_limiter: admission against a moving limit, the samples it feeds its algorithm
// (latency from grant, in-flight at grant, outcomes), and the waiter behaviour it shares with the semaphore.
// Time is rein::testing::manual_clock, stepped by hand; nothing sleeps.
#include <rein/adaptive_limiter.hpp>
#include <rein/testing/manual_clock.hpp>

#include "support/catch.hpp"
#include "support/scripted_algorithm.hpp"

#if defined(REIN_STANDALONE_ASIO)
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/redirect_error.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#else
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#endif

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
namespace net = rein::net;
using rein::outcome;
using rein::testing::manual_clock;

namespace {

using rein_test::scripted;
using rein_test::scripted_options;

template <class Algorithm, class Mutex = std::mutex>
using limiter_on_manual_clock = rein::basic_adaptive_limiter<Algorithm, net::any_io_executor, manual_clock, Mutex>;
using scripted_limiter = limiter_on_manual_clock<scripted<>>;
using sample = scripted<manual_clock>::sample_type;

/// Where a callback-token acquire lands.
struct result {
  bool done = false;
  rein::error_code ec;
  rein::permit p;
};

auto into(result& r) {
  return [&r](rein::error_code ec, rein::permit p) {
    REQUIRE_FALSE(r.done);  // a handler runs once
    r.done = true;
    r.ec = ec;
    r.p = std::move(p);
  };
}

using rein_test::samples_of;

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no exception)";
}

}  // namespace

TEST_CASE("adaptive_limiter: admits while in_flight < floor(limit); the next call waits") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);  // poll() stops an io_context that runs out of work
  scripted_limiter limiter{io, {2.9, 1, 64}};
  rein::permit a = limiter.try_acquire();
  rein::permit b = limiter.try_acquire();
  CHECK(a);
  CHECK(b);
  CHECK_FALSE(limiter.try_acquire());  // floor(2.9) = 2
  result r;
  limiter.async_acquire(into(r));
  io.poll();
  CHECK_FALSE(r.done);
  const auto s = limiter.snapshot();
  CHECK(s.limit == 2.9);
  CHECK(s.admitted == 2);
  CHECK(s.in_flight == 2);
  CHECK(s.waiting == 1);
  a.complete(outcome::success);
  io.poll();
  CHECK(r.done);
  CHECK_FALSE(r.ec);
  CHECK(r.p);
  CHECK(limiter.in_flight() == 2);
}

TEST_CASE("adaptive_limiter: a limit that rises admits waiters at once, in FIFO order") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);  // poll() stops an io_context that runs out of work
  scripted_limiter limiter{io, {1, 1, 64}};
  rein::permit held = limiter.try_acquire();
  std::vector<int> order;
  std::vector<rein::permit> granted;
  for (int i = 0; i < 4; ++i)
    limiter.async_acquire([&, i](rein::error_code ec, rein::permit p) {
      REQUIRE_FALSE(ec);
      order.push_back(i);
      granted.push_back(std::move(p));
    });
  io.poll();
  CHECK(order.empty());
  limiter.update_algorithm([](auto& a) { a.set(3.5); });  // room for 2 more, no release needed
  io.poll();
  CHECK(order == std::vector<int>{0, 1});
  CHECK(limiter.snapshot().waiting == 2);
  limiter.update_algorithm([](auto& a) { a.set(5.0); });
  io.poll();
  CHECK(order == std::vector<int>{0, 1, 2, 3});
  CHECK(limiter.in_flight() == 5);
}

TEST_CASE("adaptive_limiter: a cut keeps granted slots and admits nobody until in_flight is below it") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);  // poll() stops an io_context that runs out of work
  scripted_limiter limiter{io, {4, 1, 64}};
  std::vector<rein::permit> held;
  for (int i = 0; i < 4; ++i) held.push_back(limiter.try_acquire());
  result r;
  limiter.async_acquire(into(r));
  limiter.update_algorithm([](auto& a) { a.set(2.0); });
  CHECK(limiter.in_flight() == 4);
  held[0].release();
  held[1].release();
  io.poll();
  CHECK_FALSE(r.done);  // 2 in flight, limit 2
  held[2].release();
  io.poll();
  CHECK(r.done);
  CHECK(limiter.in_flight() == 2);
}

TEST_CASE("adaptive_limiter: latency runs from the grant to the report, never including queue time") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);  // poll() stops an io_context that runs out of work
  scripted_limiter limiter{io, {1, 1, 64}};
  rein::permit first = limiter.try_acquire();
  result r;
  limiter.async_acquire(into(r));
  manual_clock::advance(30ms);
  first.complete(outcome::success);  // granted at 0, reported at 30 ms
  io.poll();
  REQUIRE(r.p);
  manual_clock::advance(5ms);
  r.p.complete(outcome::success);  // waited 30 ms, held 5 ms
  const auto s = samples_of(limiter);
  REQUIRE(s.size() == 2);
  CHECK(s[0].latency == 30ms);
  CHECK(s[0].now.time_since_epoch() == 30ms);
  CHECK(s[1].latency == 5ms);
  CHECK(s[1].now.time_since_epoch() == 35ms);
  CHECK(limiter.snapshot().wait_total == 30ms);
}

TEST_CASE("adaptive_limiter: a sample's in_flight is the count right after its own grant") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);  // poll() stops an io_context that runs out of work
  scripted_limiter limiter{io, {3, 1, 64}};
  rein::permit a = limiter.try_acquire();  // in flight: 1
  manual_clock::advance(1ms);
  rein::permit b = limiter.try_acquire();  // 2
  manual_clock::advance(1ms);
  rein::permit c = limiter.try_acquire();  // 3
  manual_clock::advance(1ms);
  c.complete(outcome::success);
  a.complete(outcome::congestion);
  rein::permit d = limiter.try_acquire();  // 2 again
  b.complete(outcome::success);
  d.complete(outcome::success);
  const auto s = samples_of(limiter);
  REQUIRE(s.size() == 4);
  CHECK(s[0].in_flight == 3);
  CHECK(s[0].latency == 1ms);
  CHECK(s[1].in_flight == 1);
  CHECK(s[1].result == outcome::congestion);
  CHECK(s[1].latency == 3ms);
  CHECK(s[2].in_flight == 2);
  CHECK(s[3].in_flight == 2);
  CHECK(s[3].latency == 0ms);
}

TEST_CASE("adaptive_limiter: calls granted at the same instant each report their own in-flight count") {
  // Their stamps are equal; the count rides with each permit, so the order they report in does not matter
  // (a lookup by stamp handed the first report the first grant's count: here, 1 to b and 2 to a).
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);  // poll() stops an io_context that runs out of work
  scripted_limiter limiter{io, {3, 1, 64}};
  rein::permit a = limiter.try_acquire();  // in flight 1
  rein::permit b = limiter.try_acquire();  // in flight 2, same stamp as a
  rein::permit c = limiter.try_acquire();  // in flight 3
  b.complete(outcome::success);
  a.complete(outcome::success);
  c.complete(outcome::success);
  const auto s = samples_of(limiter);
  REQUIRE(s.size() == 3);
  CHECK(s[0].in_flight == 2);
  CHECK(s[1].in_flight == 1);
  CHECK(s[2].in_flight == 3);
}

TEST_CASE("adaptive_limiter: waiters granted at one instant each report their own in-flight count") {
  // A limit raised from 1 to 3 grants two waiters at once, at the instant the held call was granted; the
  // three then finish in the reverse order of their grants.
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);  // poll() stops an io_context that runs out of work
  scripted_limiter limiter{io, {1, 1, 64}};
  rein::permit first = limiter.try_acquire();  // in flight 1
  std::vector<rein::permit> granted;
  for (int i = 0; i < 2; ++i)
    limiter.async_acquire([&](rein::error_code ec, rein::permit p) {
      REQUIRE_FALSE(ec);
      granted.push_back(std::move(p));
    });
  io.poll();
  limiter.update_algorithm([](auto& a) { a.set(3.0); });  // in flight 2, then 3, both at 0 ms
  io.poll();
  REQUIRE(granted.size() == 2);
  manual_clock::advance(1ms);
  granted[1].complete(outcome::success);
  granted[0].complete(outcome::success);
  first.complete(outcome::success);
  const auto s = samples_of(limiter);
  REQUIRE(s.size() == 3);
  CHECK(s[0].in_flight == 3);
  CHECK(s[1].in_flight == 2);
  CHECK(s[2].in_flight == 1);
}

TEST_CASE("adaptive_limiter: ignored outcomes and permits dropped without one feed no sample") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);  // poll() stops an io_context that runs out of work
  scripted_limiter limiter{io, {4, 1, 64}};
  {
    rein::permit dropped = limiter.try_acquire();
  }
  limiter.try_acquire().complete(outcome::ignored);
  limiter.try_acquire().release();
  limiter.try_acquire().complete(outcome::congestion);
  limiter.try_acquire().complete(outcome::success);
  limiter.try_acquire().complete(outcome::success);
  CHECK(samples_of(limiter).size() == 3);
  const auto s = limiter.snapshot();
  CHECK(s.ignored_total == 3);
  CHECK(s.congestion_total == 1);
  CHECK(s.success_total == 2);
  CHECK(s.acquired_total == 6);
  CHECK(s.in_flight == 0);
}

TEST_CASE("aimd_limiter: ignored leaves the limit; one congestion multiplies it by the backoff") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);  // poll() stops an io_context that runs out of work
  rein::algo::aimd_options o;
  o.initial_limit = 20;
  o.backoff = 0.9;
  o.learn_failure_rate = false;  // one congestion outcome is congestion
  limiter_on_manual_clock<rein::algo::aimd> limiter{io, o};
  for (int i = 0; i < 5; ++i) limiter.try_acquire().complete(outcome::ignored);
  CHECK(limiter.limit() == 20.0);
  limiter.try_acquire().complete(outcome::congestion);
  CHECK(limiter.limit() == 20.0 * 0.9);
  CHECK(limiter.snapshot().decreases == 1);
}

TEST_CASE("aimd_limiter: a success that lifts floor(limit) admits the head waiter without a free slot") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);  // poll() stops an io_context that runs out of work
  rein::algo::aimd_options o;
  o.initial_limit = 2.5;
  o.increase = 2.0;        // 2.5 + 2 / 2.5 = 3.3
  o.min_utilisation = 0;   // no growth guard: `a` was granted with one call out, which tests only 2
  limiter_on_manual_clock<rein::algo::aimd> limiter{io, o};
  rein::permit a = limiter.try_acquire();
  rein::permit b = limiter.try_acquire();
  result w1, w2, w3;
  limiter.async_acquire(into(w1));
  limiter.async_acquire(into(w2));
  limiter.async_acquire(into(w3));
  a.complete(outcome::success);
  io.poll();
  CHECK(limiter.limit() == 2.5 + 2.0 / 2.5);
  CHECK(w1.done);
  CHECK(w2.done);  // one slot freed and one more allowed
  CHECK_FALSE(w3.done);
  CHECK(limiter.in_flight() == 3);
}

TEST_CASE("tuned_aimd_limiter: five congestion reports inside one round trip cut once") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);  // poll() stops an io_context that runs out of work
  rein::algo::tuned_aimd_options o;
  o.initial_limit = 11;
  o.backoff = 0.9;
  o.learn_failure_rate = false;  // every report counts: the case is about one cut per round trip
  limiter_on_manual_clock<rein::algo::tuned_aimd> limiter{io, o};
  std::vector<rein::permit> calls;
  for (int i = 0; i < 5; ++i) calls.push_back(limiter.try_acquire());
  manual_clock::advance(10ms);
  for (auto& p : calls) p.complete(outcome::congestion);  // all started before the first cut
  CHECK(limiter.limit() == 11.0 * 0.9);
  CHECK(limiter.snapshot().decreases == 1);
  CHECK(limiter.inspect_algorithm([](const auto& a) { return a.held(); }) == 4);
}

TEST_CASE("adaptive_limiter: classify maps status codes; a custom classifier replaces it") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);  // poll() stops an io_context that runs out of work
  scripted_limiter limiter{io, {4, 1, 64}};
  CHECK(limiter.classify(200) == outcome::success);
  CHECK(limiter.classify(503) == outcome::congestion);
  CHECK(limiter.classify(404) == outcome::ignored);
  rein::permit p = limiter.try_acquire();
  limiter.complete(p, 429);
  CHECK_FALSE(p);
  rein::permit q = limiter.try_acquire();
  limiter.complete(q, 500);
  CHECK(limiter.snapshot().congestion_total == 1);
  CHECK(limiter.snapshot().ignored_total == 1);

  rein::adaptive_limiter_options custom;
  custom.classify = [](int status) { return status >= 500 ? outcome::congestion : rein::classify_http_status(status); };
  scripted_limiter strict{io, {4, 1, 64}, {}, custom};
  rein::permit r = strict.try_acquire();
  strict.complete(r, 500);
  CHECK(strict.snapshot().congestion_total == 1);
  CHECK(samples_of(strict).at(0).result == outcome::congestion);
}

TEST_CASE("adaptive_limiter: invalid options throw std::invalid_argument naming the field and value") {
  net::io_context io;
  rein::algo::aimd_options bad_backoff;
  bad_backoff.backoff = 1.5;
  CHECK(what_of([&] { rein::aimd_limiter l(io, bad_backoff); }) ==
        "rein::adaptive_limiter: aimd.backoff must be in (0, 1), got 1.5");
  rein::algo::tuned_aimd_options bad_floor;
  bad_floor.min_limit = 0;
  CHECK(what_of([&] { rein::tuned_aimd_limiter l(io, bad_floor); }) ==
        "rein::adaptive_limiter: tuned_aimd.min_limit must be a whole number >= 1, got 0");
  rein::algo::gradient_options bad_initial;
  bad_initial.initial_limit = 100;
  CHECK(what_of([&] { rein::gradient_limiter l(io, bad_initial); }) ==
        "rein::adaptive_limiter: gradient.initial_limit must be in [min_limit, max_limit] = [1, 64], got 100");
  rein::adaptive_limiter_options no_classifier;
  no_classifier.classify = nullptr;
  CHECK(what_of([&] { rein::aimd_limiter l(io, {}, {}, no_classifier); }) ==
        "rein::adaptive_limiter: classify must be a callable, got an empty std::function");
  rein::adaptive_limiter_options negative_restart;
  negative_restart.idle_restart = -1ns;
  CHECK(what_of([&] { rein::aimd_limiter l(io, {}, {}, negative_restart); }) ==
        "rein::adaptive_limiter: idle_restart must be >= 0 ns, got -1 ns");
  // A named limiter's errors name it, the fourth argument's as the line's and the algorithm's.
  CHECK(what_of([&] { rein::aimd_limiter l(io, {}, {.name = "llm"}, negative_restart); }) ==
        "rein::adaptive_limiter \"llm\": idle_restart must be >= 0 ns, got -1 ns");
  CHECK(what_of([&] { rein::aimd_limiter l(io, {}, {.name = "llm"}, no_classifier); }) ==
        "rein::adaptive_limiter \"llm\": classify must be a callable, got an empty std::function");
  CHECK(what_of([&] { rein::tuned_aimd_limiter l(io, bad_floor, {.name = "llm"}); }) ==
        "rein::adaptive_limiter \"llm\": tuned_aimd.min_limit must be a whole number >= 1, got 0");
}

TEST_CASE("adaptive_limiter: a deadline expires on the manual clock with timed_out") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);  // poll() stops an io_context that runs out of work
  scripted_limiter limiter{io, {1, 1, 64}};
  rein::permit held = limiter.try_acquire();
  result late, now;
  limiter.async_acquire_for(10ms, into(late));
  limiter.async_acquire_until(manual_clock::now(), into(now));  // already due, no room: at once
  io.poll();
  CHECK(now.done);
  CHECK(now.ec == rein::errc::timed_out);
  CHECK_FALSE(late.done);
  manual_clock::advance(9ms);
  io.poll();
  CHECK_FALSE(late.done);
  manual_clock::advance(1ms);
  io.poll();
  CHECK(late.done);
  CHECK(late.ec == rein::errc::timed_out);
  CHECK_FALSE(late.p);
  const auto s = limiter.snapshot();
  CHECK(s.timed_out_total == 2);
  CHECK(s.rejected_total == 2);
  CHECK(s.waiting == 0);
}

TEST_CASE("adaptive_limiter: a cancelled head waiter lets the next one through and loses no slot") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);  // poll() stops an io_context that runs out of work
  scripted_limiter limiter{io, {1, 1, 64}};
  rein::permit held = limiter.try_acquire();
  net::cancellation_signal signal;
  result first, second;
  limiter.async_acquire(net::bind_cancellation_slot(signal.slot(), into(first)));
  limiter.async_acquire(into(second));
  io.poll();
  signal.emit(net::cancellation_type::terminal);
  io.poll();
  CHECK(first.done);
  CHECK(first.ec == net::error::operation_aborted);
  CHECK_FALSE(second.done);
  held.complete(outcome::success);
  io.poll();
  CHECK(second.done);
  CHECK(second.p);
  CHECK(limiter.in_flight() == 1);
  CHECK(limiter.snapshot().cancelled_total == 1);
}

TEST_CASE("adaptive_limiter: a grant cancelled before its handler runs gives the slot back without a sample") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);  // poll() stops an io_context that runs out of work
  scripted_limiter limiter{io, {1, 1, 64}};
  rein::permit held = limiter.try_acquire();
  net::cancellation_signal signal;
  result late;
  limiter.async_acquire(net::bind_cancellation_slot(signal.slot(), into(late)));
  io.poll();
  manual_clock::advance(1ms);
  held.complete(outcome::success);  // grants the waiter; its handler is queued, not run
  CHECK(limiter.in_flight() == 1);
  signal.emit(net::cancellation_type::terminal);
  io.poll();
  CHECK(late.done);
  CHECK(late.ec == net::error::operation_aborted);
  CHECK_FALSE(late.p);
  CHECK(limiter.in_flight() == 0);
  CHECK(samples_of(limiter).size() == 1);  // the held call's success only
  const auto s = limiter.snapshot();
  CHECK(s.success_total == 1);
  CHECK(s.ignored_total == 1);
  rein::permit again = limiter.try_acquire();
  CHECK(again);
  manual_clock::advance(2ms);
  again.complete(outcome::success);
  const auto samples = samples_of(limiter);
  REQUIRE(samples.size() == 2);
  CHECK(samples[1].in_flight == 1);
  CHECK(samples[1].latency == 2ms);
}

TEST_CASE("adaptive_limiter: max_waiters bounds the line with queue_full") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);  // poll() stops an io_context that runs out of work
  scripted_limiter limiter{io, {1, 1, 64}, {.max_waiters = 1}};
  rein::permit held = limiter.try_acquire();
  result queued, refused;
  limiter.async_acquire(into(queued));
  limiter.async_acquire(into(refused));
  io.poll();
  CHECK_FALSE(queued.done);
  CHECK(refused.done);
  CHECK(refused.ec == rein::errc::queue_full);
  CHECK(limiter.snapshot().queue_full_total == 1);
}

TEST_CASE("adaptive_limiter: close fails waiters and later acquires; held permits still report") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);  // poll() stops an io_context that runs out of work
  scripted_limiter limiter{io, {1, 1, 64}};
  rein::permit held = limiter.try_acquire();
  result waiting, later;
  limiter.async_acquire(into(waiting));
  limiter.close();
  limiter.async_acquire(into(later));
  io.poll();
  CHECK(waiting.ec == rein::errc::closed);
  CHECK(later.ec == rein::errc::closed);
  held.complete(outcome::success);
  CHECK_FALSE(limiter.try_acquire());
  CHECK(samples_of(limiter).size() == 1);
  CHECK(limiter.in_flight() == 0);
}

TEST_CASE("adaptive_limiter: destroying it completes its waiters with operation_aborted") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);  // poll() stops an io_context that runs out of work
  result waiting;
  {
    scripted_limiter limiter{io, {0.5, 1, 64}};  // a limit below one admits nobody
    CHECK_FALSE(limiter.try_acquire());
    limiter.async_acquire(into(waiting));
    io.poll();
    CHECK_FALSE(waiting.done);
  }
  io.poll();
  CHECK(waiting.done);
  CHECK(waiting.ec == net::error::operation_aborted);
  CHECK_FALSE(waiting.p);
}

TEST_CASE("adaptive_limiter: snapshot reports floor, ceiling, utilisation and decreases") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);  // poll() stops an io_context that runs out of work
  rein::algo::aimd_options o;
  o.min_limit = 2;
  o.max_limit = 4;
  o.initial_limit = 4;
  o.backoff = 0.5;
  limiter_on_manual_clock<rein::algo::aimd> limiter{io, o};
  rein::permit a = limiter.try_acquire();
  auto s = limiter.snapshot();
  CHECK(s.at_ceiling);
  CHECK_FALSE(s.at_floor);
  CHECK(s.utilisation == 0.25);
  CHECK(s.min_limit == 2.0);
  CHECK(s.max_limit == 4.0);
  a.complete(outcome::congestion);
  limiter.try_acquire().complete(outcome::congestion);  // 4 -> 2 -> 1, clamped at 2
  s = limiter.snapshot();
  CHECK(s.limit == 2.0);
  CHECK(s.at_floor);
  CHECK_FALSE(s.at_ceiling);
  CHECK(s.decreases == 1);
  CHECK(s.congestion_total == 2);
  CHECK(s.utilisation == 0.0);
}

// The restart window (RFC 2861): each whole idle_restart (1 s) with nothing in flight halves the calls admitted
// at once, down to the algorithm's start (scripted has none: its floor 1); each success adds one back.
TEST_CASE("adaptive_limiter: after an idle spell the limit is granted back through a restart window") {
  manual_clock::reset();
  net::io_context io;
  scripted_limiter limiter{io, {2, 1, 64}};
  limiter.update_algorithm([](auto& a) { a.set(16.0); });
  std::vector<rein::permit> held;
  for (int i = 0; i < 16; ++i) held.push_back(limiter.try_acquire());
  CHECK_FALSE(limiter.try_acquire());  // a new limiter is not idle: its whole limit at once
  for (auto& p : held) p.complete(outcome::success);
  held.clear();
  manual_clock::advance(2500ms);  // two whole periods: 16 -> 8 -> 4
  for (int i = 0; i < 4; ++i) held.push_back(limiter.try_acquire());
  CHECK_FALSE(limiter.try_acquire());
  auto s = limiter.snapshot();
  CHECK(s.limit == 16.0);  // the learned limit is kept
  CHECK(s.admitted == 4);
  held[0].complete(outcome::success);  // window 5, in flight 3
  CHECK(held.emplace_back(limiter.try_acquire(2)));
  CHECK_FALSE(limiter.try_acquire());
  held[1].complete(outcome::ignored);  // says nothing: the window stays 5
  CHECK(limiter.snapshot().admitted == 5);
  for (int i = 0; i < 11; ++i) limiter.try_acquire().complete(outcome::success);  // 5 + 11 = 16: closed
  CHECK(limiter.snapshot().admitted == 16);
}

TEST_CASE("adaptive_limiter: a spell shorter than idle_restart, or idle_restart 0, keeps the whole limit") {
  manual_clock::reset();
  net::io_context io;
  SECTION("999 ms") {
    scripted_limiter limiter{io, {16, 1, 64}};
    limiter.try_acquire().complete(outcome::success);
    manual_clock::advance(999ms);
    std::vector<rein::permit> held;
    for (int i = 0; i < 16; ++i) CHECK(held.emplace_back(limiter.try_acquire()));
  }
  SECTION("off") {
    rein::adaptive_limiter_options o;
    o.idle_restart = 0ns;
    scripted_limiter limiter{io, {16, 1, 64}, {}, o};
    limiter.try_acquire().complete(outcome::success);
    manual_clock::advance(1h);
    std::vector<rein::permit> held;
    for (int i = 0; i < 16; ++i) CHECK(held.emplace_back(limiter.try_acquire()));
  }
}

TEST_CASE("adaptive_limiter: an empty limiter admits a request larger than its restart window") {
  manual_clock::reset();
  net::io_context io;
  scripted_limiter limiter{io, {16, 1, 64}};
  limiter.try_acquire().complete(outcome::success);
  manual_clock::advance(10s);  // 16 halved down to the floor, 1
  rein::permit big = limiter.try_acquire(6);
  CHECK(big);  // nothing in flight would ever widen the window
  CHECK_FALSE(limiter.try_acquire());
  CHECK(limiter.snapshot().admitted == 1);
}

TEST_CASE("tuned_aimd_limiter: a restart window stops halving at the algorithm's initial_limit") {
  manual_clock::reset();
  net::io_context io;
  rein::algo::tuned_aimd_options o;
  o.initial_limit = 12;  // the start; the halving from 12 would reach 6, 3, 1 but stops at 12 at once
  limiter_on_manual_clock<rein::algo::tuned_aimd> limiter{io, o};
  limiter.try_acquire().complete(outcome::success);
  manual_clock::advance(5s);
  std::vector<rein::permit> held;
  for (int i = 0; i < 12; ++i) CHECK(held.emplace_back(limiter.try_acquire()));
  CHECK(limiter.snapshot().admitted == 12);
}

TEST_CASE("adaptive_limiter: co_await acquire takes the fast path or waits; acquire_for throws timed_out") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);  // poll() stops an io_context that runs out of work
  scripted_limiter limiter{io, {1, 1, 64}};
  std::vector<std::string> log;
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        rein::permit p = co_await limiter.acquire();
        log.push_back("first");
        try {
          (void)co_await limiter.acquire_for(5ms);
        } catch (const rein::system_error& e) {
          log.push_back(e.code() == rein::errc::timed_out ? "timed out" : "other error");
        }
        p.complete(outcome::success);
        rein::permit again = co_await limiter.acquire();
        log.push_back("again");
      },
      net::detached);
  io.poll();
  CHECK(log == std::vector<std::string>{"first"});
  manual_clock::advance(5ms);
  io.poll();
  CHECK(log == std::vector<std::string>{"first", "timed out", "again"});
  CHECK(samples_of(limiter).size() == 1);
  CHECK(limiter.in_flight() == 0);
}

TEST_CASE("adaptive_limiter: completion tokens: deferred, use_future and redirect_error") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);  // poll() stops an io_context that runs out of work
  scripted_limiter limiter{io, {2, 1, 64}};
  auto op = limiter.async_acquire();  // deferred: nothing happens until it is launched
  CHECK(limiter.in_flight() == 0);
  result r;
  std::move(op)(into(r));
  io.poll();
  CHECK(r.p);
  std::future<rein::permit> f = limiter.async_acquire(net::use_future);
  io.poll();
  const rein::permit second = f.get();
  CHECK(second);
  rein::error_code redirected;
  bool redirected_done = false;
  limiter.async_acquire(net::redirect_error(
      [&](rein::permit p) {
        redirected_done = true;
        CHECK_FALSE(p);
      },
      redirected));
  limiter.close();
  io.poll();
  CHECK(redirected_done);
  CHECK(redirected == rein::errc::closed);
}

TEST_CASE("single_thread adaptive limiter (null_mutex) behaves the same on one thread") {
  manual_clock::reset();
  net::io_context io;
  const auto work = net::make_work_guard(io);  // poll() stops an io_context that runs out of work
  limiter_on_manual_clock<scripted<>, rein::null_mutex> limiter{io, {1, 1, 64}};
  rein::permit a = limiter.try_acquire();
  result w;
  limiter.async_acquire(into(w));
  manual_clock::advance(2ms);
  a.complete(outcome::success);
  io.poll();
  CHECK(w.p);
  CHECK(samples_of(limiter).at(0).latency == 2ms);
}

TEST_CASE("adaptive_limiter: many threads never exceed floor(limit) and lose no slot") {
  net::io_context io{2};
  rein::aimd_limiter limiter{io, rein::algo::aimd_options{4, 1, 8, 0.5, 1, {}}};
  std::atomic<std::size_t> inside{0}, peak{0}, done{0};
  constexpr std::size_t calls = 400;
  for (std::size_t i = 0; i < calls; ++i)
    net::co_spawn(
        io,
        [&, i]() -> net::awaitable<void> {
          rein::permit p = co_await limiter.acquire();
          const std::size_t now = ++inside;
          std::size_t seen = peak.load();
          while (now > seen && !peak.compare_exchange_weak(seen, now)) {
          }
          --inside;
          p.complete(i % 7 == 0 ? outcome::congestion : outcome::success);
          ++done;
        },
        net::detached);
  std::thread other([&] { io.run(); });
  io.run();
  other.join();
  const auto s = limiter.snapshot();
  CHECK(done == calls);
  CHECK(peak <= 8);
  CHECK(s.in_flight == 0);
  CHECK(s.waiting == 0);
  CHECK(s.success_total + s.congestion_total == calls);
  CHECK(s.limit >= 1.0);
  CHECK(s.limit <= 8.0);
}
