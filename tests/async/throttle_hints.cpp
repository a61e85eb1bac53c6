// An upstream's remaining count, applied through guard.complete(response), counts off the units the rate
// stage admitted after the call it answers and still in flight: the upstream had not counted them when it
// answered, and they are on their way. With k calls in flight admitted after a call, its response's
// `remaining` r leaves r - k takeable. A call admitted later but answered first is taken as counted.
// Manual clock: the buckets refill nothing unless a test advances it.
#include "support/asio.hpp"
#include "support/catch.hpp"
#include "support/manual_time.hpp"

#include <rein/keyed.hpp>
#include <rein/rate_limit_headers.hpp>
#include <rein/semaphore.hpp>
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
using rein_test::advance_and_poll;
using rein_test::manual_clock;

namespace {

using bucket_type = rein::basic_token_bucket<net::any_io_executor, manual_clock>;
using sem_type = rein::basic_semaphore<net::any_io_executor, manual_clock>;

// A 200 whose request budget is a window: `remaining` more until the reset in `reset_after`.
rein::upstream_response window_hint(std::int64_t remaining, std::chrono::nanoseconds reset_after) {
  rein::upstream_response r;
  r.status = 200;
  r.result = rein::outcome::success;
  r.dialect = rein::rate_limit_dialect::ietf;
  r.requests = {.remaining = remaining, .reset_after = reset_after, .limit = {}, .refill = rein::rate_limit_refill::window};
  return r;
}

// A 200 whose token budget refills all the time (OpenAI's, Anthropic's): `remaining` now.
rein::upstream_response continuous_tokens(std::int64_t remaining) {
  rein::upstream_response r;
  r.status = 200;
  r.result = rein::outcome::success;
  r.dialect = rein::rate_limit_dialect::openai;
  r.tokens = {.remaining = remaining, .reset_after = 1s, .limit = {}, .refill = rein::rate_limit_refill::continuous};
  return r;
}

// Keys live for the whole test: an evicted key's limiter would take its cap with it.
rein::keyed_options kept_keys() {
  rein::keyed_options o;
  o.idle_ttl = 1h;
  return o;
}

// How many calls of `key` the throttle admits now, one after another (at most `most`), each kept admitted.
template <class Throttle>
int admitted_now(Throttle& t, std::vector<typename Throttle::guard>& kept, const std::string& key, int most = 200) {
  int n = 0;
  while (n < most) {
    auto g = t.try_acquire(key);
    if (!g) break;
    kept.push_back(std::move(g));
    ++n;
  }
  return n;
}

}  // namespace

TEST_CASE("a response's remaining leaves r - k takeable when k calls were admitted after its call",
          "[throttle][hints]") {
  for (int k = 0; k <= 4; ++k) {
    CAPTURE(k);
    rein_test::manual_clock_at_epoch epoch;
    net::io_context io;
    bucket_type rate(io.get_executor(), rein::token_bucket_options{.rate = 1, .capacity = 100});
    rein::throttle t(rate);
    std::vector<decltype(t)::guard> kept;
    auto g = t.try_acquire("server");
    REQUIRE(g);
    REQUIRE(admitted_now(t, kept, "server", k) == k);  // sent after g: the server's count had none of them
    g.complete(window_hint(10, 5s));
    CHECK(admitted_now(t, kept, "server") == 10 - k);
    CHECK(t.try_acquire("server").rejected_at() == rein::throttle_stage::rate);
    CHECK(rate.tokens() == 89.0);  // 100 - 1 - k - (10 - k): the cap, not the balance, stopped them
  }
}

TEST_CASE("a response's remaining counts off nothing the stage admitted before its call", "[throttle][hints]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  bucket_type rate(io.get_executor(), rein::token_bucket_options{.rate = 1, .capacity = 100});
  rein::throttle t(rate);
  std::vector<decltype(t)::guard> kept;
  REQUIRE(admitted_now(t, kept, "server", 5) == 5);  // before g: the server counted them in its answer
  auto g = t.try_acquire("server");
  REQUIRE(g);
  g.complete(window_hint(3, 5s));
  CHECK(admitted_now(t, kept, "server") == 3);
}

TEST_CASE("the cap counted off the calls in flight ends at the upstream's reset", "[throttle][hints]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  bucket_type rate(io.get_executor(), rein::token_bucket_options{.rate = 1, .capacity = 100});
  rein::throttle t(rate);
  std::vector<decltype(t)::guard> kept;
  auto g = t.try_acquire("server");
  REQUIRE(g);
  REQUIRE(admitted_now(t, kept, "server", 3) == 3);
  g.complete(window_hint(3, 2s));
  CHECK(admitted_now(t, kept, "server") == 0);  // 3 left, and the 3 sent after g take them
  advance_and_poll(io, 1999ms);
  CHECK(admitted_now(t, kept, "server") == 0);
  advance_and_poll(io, 1ms);
  CHECK(admitted_now(t, kept, "server") == 98);  // the bucket's own balance again: 96 + 2 refilled
}

TEST_CASE("a call admitted after waiting counts off the response of a call admitted before it",
          "[throttle][hints]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  sem_type global(io.get_executor(), 2);
  bucket_type tpm(io.get_executor(), rein::token_bucket_options{.rate = 1, .capacity = 1000});
  rein::throttle t(global, rein::by_tokens(tpm));
  auto g = t.try_acquire("m", {.requests = 1, .tokens = 100});
  REQUIRE(g);
  auto h = t.try_acquire("m", {.requests = 1, .tokens = 250});
  REQUIRE(h);
  auto e = t.try_acquire("m", {.requests = 1, .tokens = 0});  // no global slot left: refused, not counted
  REQUIRE_FALSE(e);
  std::optional<decltype(t)::guard> waited;
  t.async_acquire("m", {.requests = 1, .tokens = 50}, [&](rein::error_code ec, decltype(t)::guard admitted) {
    REQUIRE_FALSE(ec);
    waited = std::move(admitted);
  });
  rein_test::poll(io);
  REQUIRE_FALSE(waited.has_value());  // no global slot until h completes
  h.complete(rein::outcome::success);
  rein_test::poll(io);
  REQUIRE(waited.has_value());
  CHECK(tpm.tokens() == 600.0);  // 1000 - 100 - 250 - 50
  g.complete(continuous_tokens(500));
  CHECK(tpm.tokens() == 450.0);  // 500 less the 50 in flight; h, answered before g, was counted by then
}

TEST_CASE("a call admitted later but answered first is taken as counted by the upstream", "[throttle][hints]") {
  // The upstream answered `second` first, so it most likely counted it first: `first`'s count includes it.
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  bucket_type rate(io.get_executor(), rein::token_bucket_options{.rate = 1, .capacity = 100});
  rein::throttle t(rate);
  std::vector<decltype(t)::guard> kept;
  auto first = t.try_acquire("server");
  auto second = t.try_acquire("server");
  REQUIRE((first && second));
  second.complete(window_hint(10, 5s));  // counted both: 10 more
  first.complete(window_hint(9, 5s));    // counted second before first: 9 more, nothing in flight after first
  CHECK(admitted_now(t, kept, "server") == 9);
}

TEST_CASE("calls in flight on both sides of the answered one: the smaller of the two counts is taken off",
          "[throttle][hints]") {
  // Which calls are both admitted after the answered one and still in flight is not kept (that would take a
  // list); the smaller of "admitted since" and "others in flight" bounds it, from above.
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  bucket_type rate(io.get_executor(), rein::token_bucket_options{.rate = 1, .capacity = 100});
  rein::throttle t(rate);
  std::vector<decltype(t)::guard> before, after, kept;
  REQUIRE(admitted_now(t, before, "server", 3) == 3);  // in flight before g: counted
  auto g = t.try_acquire("server");
  REQUIRE(g);
  REQUIRE(admitted_now(t, after, "server", 2) == 2);  // in flight after g: not counted
  auto answered = t.try_acquire("server");            // after g, answered first: counted
  REQUIRE(answered);
  answered.complete(rein::outcome::success);
  g.complete(window_hint(20, 5s));
  CHECK(admitted_now(t, kept, "server") == 17);  // 20 - min(3 admitted since, 5 others in flight)
}

TEST_CASE("once the calls before it have ended, exactly those after it and in flight are taken off",
          "[throttle][hints]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  bucket_type rate(io.get_executor(), rein::token_bucket_options{.rate = 1, .capacity = 100});
  rein::throttle t(rate);
  std::vector<decltype(t)::guard> before, after, kept;
  REQUIRE(admitted_now(t, before, "server", 3) == 3);
  auto g = t.try_acquire("server");
  REQUIRE(g);
  REQUIRE(admitted_now(t, after, "server", 2) == 2);
  auto answered = t.try_acquire("server");
  REQUIRE(answered);
  answered.complete(rein::outcome::success);
  before.clear();  // ended (destroyed without an outcome: they end all the same)
  g.complete(window_hint(20, 5s));
  CHECK(admitted_now(t, kept, "server") == 18);  // 20 - min(3 admitted since, 2 others in flight)
}

TEST_CASE("a keyed rate stage counts off only its own key's admissions", "[throttle][hints]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::keyed<bucket_type> rate(io.get_executor(), rein::token_bucket_options{.rate = 1, .capacity = 100}, {},
                                kept_keys());
  rein::throttle t(rate);
  std::vector<decltype(t)::guard> kept;
  auto g = t.try_acquire("a");
  REQUIRE(g);
  REQUIRE(admitted_now(t, kept, "a", 2) == 2);
  REQUIRE(admitted_now(t, kept, "b", 5) == 5);  // another upstream's calls: not on a's way
  g.complete(window_hint(10, 5s));
  CHECK(admitted_now(t, kept, "a") == 8);
  CHECK(admitted_now(t, kept, "b") == 95);  // b has no cap: its own balance
  CHECK(rate.get("a").admissions().admitted.load() == 11);
  CHECK(rate.get("a").admissions().ended.load() == 1);  // g's
  CHECK(rate.get("b").admissions().admitted.load() == 100);
  kept.clear();
  CHECK(rate.get("a").admissions().ended.load() == 11);
  CHECK(rate.get("b").admissions().ended.load() == 100);
}

TEST_CASE("the count of admitted units wraps around without miscounting", "[throttle][hints]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::keyed<bucket_type> rate(io.get_executor(), rein::token_bucket_options{.rate = 1, .capacity = 100}, {},
                                kept_keys());
  rein::throttle t(rate);
  rate.get("a").admissions().admitted.store(std::numeric_limits<std::uint64_t>::max() - 1);
  rate.get("a").admissions().ended.store(std::numeric_limits<std::uint64_t>::max() - 1);
  std::vector<decltype(t)::guard> kept;
  auto g = t.try_acquire("a");  // the count reaches its largest value
  REQUIRE(g);
  REQUIRE(admitted_now(t, kept, "a", 3) == 3);  // and goes past it
  CHECK(rate.get("a").admissions().admitted.load() == 2);
  g.complete(window_hint(10, 5s));
  CHECK(admitted_now(t, kept, "a") == 7);
}

TEST_CASE("more calls admitted since than the upstream has left leave nothing, never a negative count",
          "[throttle][hints]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  bucket_type rate(io.get_executor(), rein::token_bucket_options{.rate = 1, .capacity = 100});
  rein::throttle t(rate);
  std::vector<decltype(t)::guard> kept;
  auto g = t.try_acquire("server");
  REQUIRE(g);
  REQUIRE(admitted_now(t, kept, "server", 6) == 6);
  g.complete(window_hint(4, 5s));
  CHECK(admitted_now(t, kept, "server") == 0);
  advance_and_poll(io, 5s);
  CHECK(admitted_now(t, kept, "server") == 98);  // the cap was 0, not a debt: 93 + 5 refilled
}
