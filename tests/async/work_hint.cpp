// The work hint given with an outcome (rein::completion_hint): permit::complete(outcome, hint) and
// throttle_guard::complete(outcome, hint) hand it to the adaptive limiters' algorithms with the call's sample,
// exactly as a pure algorithm fed the same samples sees it; a refused hint keeps the permit. Time is
// rein::testing::manual_clock, stepped by hand; nothing sleeps.
#include "support/asio.hpp"
#include "support/catch.hpp"
#include "support/invalid_argument.hpp"
#include "support/scripted_algorithm.hpp"

#include <rein/adaptive_limiter.hpp>
#include <rein/algo/tuned_aimd.hpp>
#include <rein/completion_hint.hpp>
#include <rein/keyed.hpp>
#include <rein/semaphore.hpp>
#include <rein/testing/manual_clock.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

using namespace std::chrono_literals;
namespace net = rein::net;
using rein::outcome;
using rein::testing::manual_clock;

namespace {

using executor = net::any_io_executor;
template <class Algorithm>
using manual_limiter = rein::basic_adaptive_limiter<Algorithm, executor, manual_clock>;
using scripted_limiter = manual_limiter<rein_test::scripted<>>;
using sample = rein_test::scripted<manual_clock>::sample_type;
using rein_test::samples_of;

constexpr double not_a_number = std::numeric_limits<double>::quiet_NaN();
constexpr double infinite = std::numeric_limits<double>::infinity();

/// Rounds of up to four calls granted at one instant, the i-th asking for work (i % 4) + 1 and taking 10 ms
/// per unit (a latency that follows the work, queueing nowhere), on an async tuned_aimd limiter and on the
/// pure algorithm fed the samples the limiter should build (latency from grant, in flight at the grant, the
/// hint). Returns both limits at the end.
struct replayed {
  double async_limit;
  double pure_limit;
};

replayed replay(bool hinted) {
  manual_clock::reset();
  net::io_context io;
  rein::algo::tuned_aimd_options o;
  o.initial_limit = 4;
  rein::adaptive_limiter_options lo;
  lo.idle_restart = 0ns;  // every round starts idle: the restart window would cap its grants, not the pure run's
  manual_limiter<rein::algo::tuned_aimd> limiter{io, o, rein::line_options{}, lo};
  rein::algo::basic_tuned_aimd<manual_clock> pure{o};
  for (int round = 0; round < 40; ++round) {
    std::vector<rein::permit> calls;
    for (int i = 0; i < 4; ++i)
      if (rein::permit p = limiter.try_acquire()) calls.push_back(std::move(p));
    const auto granted = manual_clock::now();
    // Shortest first: call i (work i + 1) ends 10 ms x (i + 1) after the grant.
    for (std::size_t i = 0; i < calls.size(); ++i) {
      const double work = static_cast<double>(i + 1);
      manual_clock::set(granted + 10ms * (i + 1));
      sample s;
      s.latency = 10ms * (i + 1);
      s.result = outcome::success;
      s.in_flight = calls.size();  // every call of the round was granted before any ended
      s.now = manual_clock::now();
      if (hinted) {
        s.work = work;
        calls[i].complete(outcome::success, {.work = work});
      } else {
        calls[i].complete(outcome::success);
      }
      pure.on_sample(s);
    }
    manual_clock::advance(1ms);
  }
  CHECK(limiter.in_flight() == 0);
  return {limiter.limit(), pure.limit()};
}

/// What the stand-in model answers: whether it went well, and how many tokens it wrote.
struct answer {
  bool ok;
  std::size_t tokens;
};

/// A stand-in for an LLM: writes `tokens` tokens at 1 ms a token, on the manual clock.
struct model {
  net::awaitable<answer> ask(std::size_t tokens) {
    net::basic_waitable_timer<manual_clock> writing(co_await net::this_coro::executor, 1ms * tokens);
    co_await writing.async_wait(net::use_awaitable);
    co_return answer{true, tokens};
  }
};

// The pattern docs/adaptive.md shows: the answer's size is known when the call completes, and given with it.
template <class Limiter>
net::awaitable<void> ask(Limiter& limiter, model& llm, std::size_t tokens) {
  rein::permit slot = co_await limiter.acquire();
  const answer a = co_await llm.ask(tokens);
  slot.complete(a.ok ? rein::outcome::success : rein::outcome::congestion, {.work = a.tokens});
}

}  // namespace

TEST_CASE("work hint: an LLM call gives its answer's tokens with its outcome") {
  manual_clock::reset();
  net::io_context io;
  scripted_limiter limiter{io, {4, 1, 64}};
  model llm;
  net::co_spawn(io, ask(limiter, llm, 30), net::detached);
  net::co_spawn(io, ask(limiter, llm, 70), net::detached);
  io.poll();
  CHECK(limiter.in_flight() == 2);
  manual_clock::advance(30ms);
  io.poll();
  manual_clock::advance(40ms);
  io.poll();
  CHECK(limiter.in_flight() == 0);
  const auto s = samples_of(limiter);
  REQUIRE(s.size() == 2);
  CHECK(s[0].latency == 30ms);
  CHECK(s[0].work == 30.0);
  CHECK(s[1].latency == 70ms);
  CHECK(s[1].work == 70.0);
}

TEST_CASE("work hint: the sample carries the hint; no hint, or none given, leaves it unset") {
  manual_clock::reset();
  net::io_context io;
  scripted_limiter limiter{io, {4, 1, 64}};
  limiter.try_acquire().complete(outcome::success, {.work = 3.5});
  limiter.try_acquire().complete(outcome::congestion, {.work = 0.0});
  limiter.try_acquire().complete(outcome::success, {});
  limiter.try_acquire().complete(outcome::success);
  limiter.try_acquire().complete(outcome::ignored, {.work = 2.0});  // no sample: ignored says nothing
  const auto s = samples_of(limiter);
  REQUIRE(s.size() == 4);
  CHECK(s[0].work == 3.5);
  CHECK(s[0].result == outcome::success);
  CHECK(s[1].work == 0.0);
  CHECK(s[1].result == outcome::congestion);
  CHECK_FALSE(s[2].work.has_value());
  CHECK_FALSE(s[3].work.has_value());
  CHECK(limiter.snapshot().ignored_total == 1);
  CHECK(limiter.in_flight() == 0);
}

TEST_CASE("work hint: limiter.complete(permit, status, hint) classifies the status and passes the hint") {
  manual_clock::reset();
  net::io_context io;
  scripted_limiter limiter{io, {4, 1, 64}};
  rein::permit p = limiter.try_acquire();
  CHECK(rein_test::invalid_argument_of([&] { limiter.complete(p, 200, {.work = -4.0}); }) ==
        "rein::completion_hint: work must be >= 0 and finite, got -4");
  CHECK(p);
  CHECK(limiter.in_flight() == 1);
  limiter.complete(p, 503, {.work = 2.0});
  CHECK_FALSE(p);
  limiter.complete(p, 200, {.work = 2.0});  // empty: nothing more
  const auto s = samples_of(limiter);
  REQUIRE(s.size() == 1);
  CHECK(s[0].result == outcome::congestion);
  CHECK(s[0].work == 2.0);
  CHECK(limiter.in_flight() == 0);
}

TEST_CASE("work hint: an async tuned_aimd limiter given hints ends at the pure algorithm's limit exactly") {
  const replayed with = replay(true);
  const replayed without = replay(false);
  CHECK(with.async_limit == with.pure_limit);
  CHECK(with.async_limit == 5.0);  // one over the four calls a round sends: the growth guard holds it there
  CHECK(without.async_limit == without.pure_limit);
  // The hints change what the algorithm learns: latency that follows the work is not read as a queue.
  CHECK(with.async_limit != without.async_limit);
}

TEST_CASE("work hint: a negative, NaN or infinite work is refused and the permit keeps its slots") {
  manual_clock::reset();
  net::io_context io;
  scripted_limiter limiter{io, {4, 1, 64}};
  for (const double bad : {-1.0, -0.5, not_a_number, infinite, -infinite}) {
    INFO("work " << bad);
    rein::permit p = limiter.try_acquire(2);
    REQUIRE(p);
    const std::string what =
        rein_test::invalid_argument_of([&] { p.complete(outcome::success, {.work = bad}); });
    CHECK(what == "rein::completion_hint: work must be >= 0 and finite, got " + rein::detail::show(bad));
    CHECK(p);  // still holds its slots
    CHECK(p.count() == 2);
    CHECK(limiter.in_flight() == 2);
    CHECK(samples_of(limiter).empty());
    manual_clock::advance(5ms);
    p.complete(outcome::success, {.work = 1.0});  // given back once, later, as usual
    CHECK_FALSE(p);
    CHECK(limiter.in_flight() == 0);
    p.complete(outcome::success, {.work = 1.0});  // empty: does nothing more
    p.release();
    CHECK(limiter.in_flight() == 0);
    const auto s = samples_of(limiter);
    REQUIRE(s.size() == 1);
    CHECK(s[0].work == 1.0);
    CHECK(s[0].latency == 5ms);
    limiter.update_algorithm([](auto& a) { a.samples.clear(); });
  }
  CHECK(limiter.snapshot().acquired_total == 5);
  CHECK(limiter.snapshot().success_total == 5);
  CHECK(limiter.snapshot().ignored_total == 0);
  // An empty permit checks the hint all the same: the mistake is the caller's, wherever it is made.
  rein::permit empty;
  CHECK(rein_test::invalid_argument_of([&] { empty.complete(outcome::success, {.work = -2.0}); }) ==
        "rein::completion_hint: work must be >= 0 and finite, got -2");
}

TEST_CASE("work hint: a refused hint's permit released by its destructor goes back once") {
  manual_clock::reset();
  net::io_context io;
  scripted_limiter limiter{io, {4, 1, 64}};
  {
    rein::permit p = limiter.try_acquire();
    CHECK_THROWS_AS(p.complete(outcome::success, {.work = not_a_number}), std::invalid_argument);
    CHECK(limiter.in_flight() == 1);
  }
  CHECK(limiter.in_flight() == 0);
  CHECK(limiter.snapshot().ignored_total == 1);
  CHECK(samples_of(limiter).empty());
}

TEST_CASE("work hint: a partition's permit and a keyed limiter's permit pass it on; a semaphore ignores it") {
  manual_clock::reset();
  net::io_context io;
  scripted_limiter partitioned{io, {4, 1, 64}, {.partitions = {{"live", 0.5}}}};
  partitioned.partition("live").try_acquire().complete(outcome::success, {.work = 7.0});
  const auto ps = samples_of(partitioned);
  REQUIRE(ps.size() == 1);
  CHECK(ps[0].work == 7.0);
  CHECK(partitioned.in_flight() == 0);

  rein::keyed<scripted_limiter> per_key{io.get_executor(), rein_test::scripted_options{4, 1, 64}};
  per_key.get("k")->try_acquire().complete(outcome::success, {.work = 9.0});
  const auto ks = samples_of(*per_key.get("k"));
  REQUIRE(ks.size() == 1);
  CHECK(ks[0].work == 9.0);

  rein::basic_semaphore<executor, manual_clock> sem{io, 2};
  rein::permit p = sem.try_acquire(2);
  CHECK(rein_test::invalid_argument_of([&] { p.complete(outcome::success, {.work = -1.0}); }) ==
        "rein::completion_hint: work must be >= 0 and finite, got -1");
  CHECK(sem.available() == 0);
  p.complete(outcome::success, {.work = 3.0});
  CHECK(sem.available() == 2);
}

TEST_CASE("work hint: a throttle guard passes it to its concurrency stages, not its rate stages") {
  manual_clock::reset();
  net::io_context io;
  rein::keyed<scripted_limiter> per_key{io.get_executor(), rein_test::scripted_options{2, 1, 64}};
  scripted_limiter global{io, {4, 1, 64}};
  rein::basic_token_bucket<executor, manual_clock> rate{io.get_executor(),
                                                         rein::token_bucket_options{.rate = 100, .capacity = 100}};
  rein::throttle<rein::keyed<scripted_limiter>, scripted_limiter, rein::basic_token_bucket<executor, manual_clock>>
      throttle{per_key, global, rate};

  auto g = throttle.try_acquire("k");
  REQUIRE(g);
  manual_clock::advance(20ms);
  for (const double bad : {-3.0, not_a_number, infinite}) {
    INFO("work " << bad);
    CHECK(rein_test::invalid_argument_of([&] { g.complete(outcome::success, {.work = bad}); }) ==
          "rein::completion_hint: work must be >= 0 and finite, got " + rein::detail::show(bad));
    CHECK(rein_test::invalid_argument_of([&] { g.complete_http(200, {.work = bad}); }) ==
          "rein::completion_hint: work must be >= 0 and finite, got " + rein::detail::show(bad));
    CHECK(g);  // still admitted: holds both permits
    CHECK(global.in_flight() == 1);
    CHECK(per_key.get("k")->in_flight() == 1);
  }
  g.complete(outcome::success, {.work = 12.0});
  CHECK_FALSE(g);
  CHECK(global.in_flight() == 0);
  CHECK(per_key.get("k")->in_flight() == 0);
  const auto gs = samples_of(global);
  const auto ks = samples_of(*per_key.get("k"));
  REQUIRE(gs.size() == 1);
  REQUIRE(ks.size() == 1);
  CHECK(gs[0].work == 12.0);
  CHECK(gs[0].latency == 20ms);
  CHECK(ks[0].work == 12.0);

  auto h = throttle.try_acquire("k");
  REQUIRE(h);
  h.complete_http(503, {.work = 0.0});
  const auto gs2 = samples_of(global);
  REQUIRE(gs2.size() == 2);
  CHECK(gs2[1].work == 0.0);
  CHECK(gs2[1].result == outcome::congestion);
  CHECK(throttle.snapshot().admitted_total == 2);
}
