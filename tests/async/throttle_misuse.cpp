// Misuse of the throttle said in one sentence: a charge's tokens with no stage that charges tokens (a run-time
// check: a charge's tokens are a value), and the throttle's type named for a class member (rein::throttle_for;
// the compile-time cases are in tests/headers/diagnostics/).
#include "support/asio.hpp"
#include "support/catch.hpp"
#include "support/manual_time.hpp"

#include <rein/semaphore.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace net = rein::net;
using rein_test::manual_clock;

namespace {

// The snippet of rein::throttle_for's doc comment, verbatim.
struct upstream {
  // clang-format off: the lines of the throttle_for example in throttle.hpp and docs/throttle.md
  explicit upstream(net::io_context& io) : global(io, 4), rpm(io, {.rate = 10, .capacity = 10}),
                                           tpm(io, {.rate = 1'000, .capacity = 10'000}) {}

  rein::semaphore global;
  rein::token_bucket rpm;
  rein::token_bucket tpm;
  rein::throttle_for<decltype(global), decltype(rpm), decltype(rein::by_tokens(tpm))> throttle{
      global, rpm, rein::by_tokens(tpm)};
  // clang-format on
};

using timed_bucket = rein::basic_token_bucket<net::any_io_executor, manual_clock>;
using timed_semaphore = rein::basic_semaphore<net::any_io_executor, manual_clock>;

// A weight of the charge's tokens, as rein::weighted takes it.
struct bytes_of_tokens {
  std::size_t operator()(const rein::charge& c) const noexcept { return c.tokens * 4; }
};

const std::string no_token_stage =
    "rein::throttle: a charge of 5 tokens needs a stage that charges tokens: wrap the stage that counts them in "
    "rein::by_tokens (or rein::weighted), or leave charge::tokens 0";

}  // namespace

TEST_CASE("throttle_for names the type the constructor deduces, for a class member", "[throttle]") {
  net::io_context io;
  upstream u(io);
  STATIC_REQUIRE(
      std::is_same_v<decltype(u.throttle), decltype(rein::throttle(u.global, u.rpm, rein::by_tokens(u.tpm)))>);
  auto g = u.throttle.try_acquire("model", {.requests = 1, .tokens = 1'200});
  REQUIRE(g);
  CHECK(u.global.snapshot().in_flight == 1);
  CHECK(u.rpm.snapshot().acquired_total == 1);
  CHECK(u.tpm.snapshot().acquired_total == 1);
  // The third stage counts tokens: more than its capacity is refused there, whatever the requests.
  auto too_many = u.throttle.try_acquire("model", {.requests = 1, .tokens = 10'001});
  CHECK_FALSE(too_many);
  CHECK(too_many.rejected_stage() == 2);
  g.complete(rein::outcome::success);
  // References and const are dropped, as the deduction guides drop them.
  STATIC_REQUIRE(std::is_same_v<rein::throttle_for<const rein::semaphore&, rein::token_bucket&>,
                                rein::throttle<rein::semaphore, rein::token_bucket>>);
}

TEST_CASE("a charge's tokens with no stage that charges tokens: every door says so and takes nothing", "[throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  const rein::charge tokens{.requests = 1, .tokens = 5};
  net::io_context io;
  timed_semaphore global(io, 4);
  timed_bucket rpm(io, {.rate = 10, .capacity = 10});
  rein::throttle t(global, rpm);  // counts requests only

  CHECK_THROWS_MATCHES(t.try_acquire("k", tokens), std::invalid_argument, Catch::Message(no_token_stage));
  CHECK_THROWS_MATCHES(t.async_acquire("k", tokens, [](rein::error_code, auto) { FAIL("started"); }),
                       std::invalid_argument, Catch::Message(no_token_stage));
  std::string thrown;
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        try {
          co_await t.acquire("k", tokens);
        } catch (const std::invalid_argument& e) {
          thrown = e.what();
        }
      },
      net::detached);
  io.run();
  CHECK(thrown == no_token_stage);
  CHECK(global.snapshot().acquired_total == 0);
  CHECK(rpm.snapshot().acquired_total == 0);
  CHECK(t.snapshot().acquired_total == 0);

  // A charge of requests only is what this throttle counts; reconcile checks the same.
  auto g = t.try_acquire("k", {.requests = 2});
  REQUIRE(g);
  CHECK(rpm.tokens() == 8.0);
  CHECK_THROWS_MATCHES(g.reconcile(tokens), std::invalid_argument, Catch::Message(no_token_stage));
  CHECK(g.charged().requests == 2);

  // A stage of rein::weighted may read the tokens: the check does not apply.
  timed_bucket bytes(io, {.rate = 100, .capacity = 100});
  rein::throttle weighted(global, rein::weighted(bytes, bytes_of_tokens{}));
  auto w = weighted.try_acquire("k", tokens);
  REQUIRE(w);
  CHECK(bytes.tokens() == 80.0);
}
