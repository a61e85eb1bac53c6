// rein/beast/server.hpp: admission of Beast requests on the manual clock, the exact values of the refusals'
// Retry-After and IETF RateLimit fields, and rein's own client reading them back.
#include "support/catch.hpp"
#include "support/manual_time.hpp"

#include <rein/beast.hpp>
#include <rein/beast/server.hpp>

#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace {

using namespace std::chrono_literals;
namespace http = boost::beast::http;
namespace net = rein::net;
using rein_test::manual_clock;
using admission = rein::beast::basic_admission<manual_clock>;
using rein::beast::admission_result;
using rein::beast::refusal;
using opt_ns = std::optional<std::chrono::nanoseconds>;
using opt_count = std::optional<std::int64_t>;

http::request<http::empty_body> get(std::string api_key = {}) {
  http::request<http::empty_body> r{http::verb::get, "/", 11};
  if (!api_key.empty()) r.set("X-API-Key", api_key);
  return r;
}

// One admit() whose completion is kept: `done` once the handler ran.
struct outcome {
  bool done = false;
  rein::error_code ec{};
  admission_result result{};
};

outcome& start(admission& a, const http::request<http::empty_body>& req, outcome& o) {
  a.async_admit(req, [&o](rein::error_code ec, admission_result r) { o = {true, ec, std::move(r)}; });
  return o;
}

// Admits `req` and runs what is ready now (the handler is never called inside async_admit).
outcome admit_now(net::io_context& io, admission& a, const http::request<http::empty_body>& req = get()) {
  outcome o;
  start(a, req, o);
  CHECK_FALSE(o.done);
  rein_test::poll(io);
  REQUIRE(o.done);
  return o;
}

std::string field(const http::response<http::string_body>& r, std::string_view name) {
  const auto it = r.find(name);
  return it == r.end() ? std::string("<absent>") : std::string(it->value());
}

// A test's admission on the manual clock, which starts at zero.
struct fixture {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  admission a;

  explicit fixture(rein::beast::admission_options o) : a(io.get_executor(), std::move(o)) {}
  outcome admit(const http::request<http::empty_body>& req = get()) { return admit_now(io, a, req); }
  void advance(std::chrono::nanoseconds d) { rein_test::advance_and_poll(io, d); }

  // An admit that completes exactly `d` after it starts: not 1 ms before.
  outcome completing_after(std::chrono::nanoseconds d) {
    outcome o;
    start(a, get(), o);
    advance(d - 1ms);
    CHECK_FALSE(o.done);
    advance(1ms);
    REQUIRE(o.done);
    return o;
  }
};

}  // namespace

TEST_CASE("delay-seconds round up, never below zero", "[beast][server]") {
  using rein::beast::delay_seconds;
  CHECK(delay_seconds(-5s) == 0);
  CHECK(delay_seconds(0ns) == 0);
  CHECK(delay_seconds(1ns) == 1);
  CHECK(delay_seconds(1s) == 1);
  CHECK(delay_seconds(1s + 1ns) == 2);
  CHECK(delay_seconds(std::chrono::nanoseconds::max()) == 9'223'372'037);
}

TEST_CASE("a token bucket's window quota: w refills it from empty, q is what w refills", "[beast][server]") {
  using rein::beast::bucket_state;
  using state = rein::beast::rate_limit_state;
  CHECK(bucket_state(20, 10, 10, 0ns) == state{.quota = 20, .window_seconds = 1, .remaining = 10, .reset_seconds = 0});
  CHECK(bucket_state(3, 10, 2.9, 34ms) == state{.quota = 12, .window_seconds = 4, .remaining = 2, .reset_seconds = 1});
  CHECK(bucket_state(0.25, 2, 0.5, 2s) == state{.quota = 2, .window_seconds = 8, .remaining = 0, .reset_seconds = 2});
  CHECK(bucket_state(0.25, 2, -3, 14s) == state{.quota = 2, .window_seconds = 8, .remaining = 0, .reset_seconds = 14});
  // floor(rate x w) rounds below the burst here (0.7 x 90 = 62.99...): q is the burst.
  CHECK(bucket_state(0.7, 63, 0, 1s).quota == 63);
  CHECK(bucket_state(0.009, 27, 0, 1s) == state{.quota = 27, .window_seconds = 3000, .remaining = 0, .reset_seconds = 1});
  // A rate so low that burst / rate leaves the range of int64: the window is written as 1e12 s, no overflow.
  CHECK(bucket_state(1e-5, 1'000'000'000'000'000, 0, 1s) ==
        state{.quota = 1'000'000'000'000'000, .window_seconds = 1'000'000'000'000, .remaining = 0, .reset_seconds = 1});
  CHECK(bucket_state(1e-300, 1, 0, std::chrono::nanoseconds::max()) ==
        state{.quota = 1, .window_seconds = 1'000'000'000'000, .remaining = 0, .reset_seconds = 9'223'372'037});
  const state s = bucket_state(0.25, 2, 1, 4s);
  CHECK(s.policy_field("api") == "\"api\";q=2;w=8");
  CHECK(s.limit_field("api") == "\"api\";r=1;t=4");
}

TEST_CASE("admission: the burst, then a 429 whose fields are the bucket's, read back by rein's client",
          "[beast][server]") {
  fixture f({.rate = 0.25, .burst = 2, .concurrency = 8});

  outcome first = f.admit();
  CHECK(first.result);
  CHECK(first.result.why() == refusal::none);
  CHECK(first.result.permit());
  CHECK(first.result.state()->limit_field("default") == "\"default\";r=1;t=4");
  CHECK(f.admit().result.state()->limit_field("default") == "\"default\";r=0;t=4");

  f.advance(1500ms);  // the next token comes at 4 s: 2.5 s from now
  outcome refused = f.admit();
  REQUIRE_FALSE(refused.result);
  CHECK(refused.result.why() == refusal::rate);
  CHECK_FALSE(refused.result.permit());
  http::response<http::string_body>& r = refused.result.response();
  CHECK(r.result() == http::status::too_many_requests);
  CHECK(field(r, "Retry-After") == "3");
  CHECK(field(r, "RateLimit") == "\"default\";r=0;t=3");
  CHECK(field(r, "RateLimit-Policy") == "\"default\";q=2;w=8");
  CHECK(field(r, "Content-Length") == "18");
  CHECK(r.keep_alive());
  CHECK(r.version() == 11);

  const rein::upstream_response read = rein::read_response(r);
  CHECK(read.too_many_requests);
  CHECK(read.dialect == rein::rate_limit_dialect::ietf);
  CHECK(read.retry_after == opt_ns{3s});
  CHECK(read.requests.remaining == opt_count{0});
  CHECK(read.requests.reset_after == opt_ns{3s});
  CHECK(read.requests.limit == opt_count{2});

  f.advance(2500ms);  // 4 s: one token
  CHECK(f.admit().result);
}

TEST_CASE("admission: no slot is a 503 with the shedding Retry-After, and the token goes back", "[beast][server]") {
  fixture f({.rate = 1, .burst = 3, .concurrency = 1, .shed_retry_after = 2500ms});
  outcome held = f.admit();
  REQUIRE(held.result);
  CHECK(f.a.state("").remaining == 2);

  http::request<http::empty_body> old = get();
  old.version(10);  // HTTP/1.0 without keep-alive: the refusal closes
  outcome shed = f.admit(old);
  REQUIRE_FALSE(shed.result);
  CHECK(shed.result.why() == refusal::concurrency);
  http::response<http::string_body>& r = shed.result.response();
  CHECK(r.result() == http::status::service_unavailable);
  CHECK(field(r, "Retry-After") == "3");
  CHECK(field(r, "RateLimit") == "\"default\";r=2;t=1");
  CHECK_FALSE(r.keep_alive());
  CHECK(r.version() == 10);
  CHECK(f.a.state("").remaining == 2);  // refunded

  held.result.permit().release();
  CHECK(f.admit().result);
}

TEST_CASE("admission: a wait within max_wait is served at the token's instant; a longer one refused at once",
          "[beast][server]") {
  fixture f({.rate = 2, .burst = 1, .concurrency = 4, .max_wait = 500ms});
  CHECK(f.admit().result);

  outcome waiting;
  start(f.a, get(), waiting);
  f.advance(499ms);
  CHECK_FALSE(waiting.done);
  // Behind the waiter its token would come at 1 s, past its deadline at 999 ms: refused without waiting.
  outcome too_late = f.admit();
  CHECK(too_late.result.why() == refusal::rate);
  CHECK(too_late.result.waited() == 0ns);
  f.advance(1ms);
  REQUIRE(waiting.done);
  CHECK_FALSE(waiting.ec);
  CHECK(waiting.result);
  CHECK(waiting.result.waited() == 500ms);
  CHECK(waiting.result.state()->limit_field("default") == "\"default\";r=0;t=1");
}

TEST_CASE("admission: a max_wait too long to represent is no bound", "[beast][server]") {
  fixture f({.rate = 0.5, .burst = 1, .concurrency = 1, .max_wait = std::chrono::nanoseconds::max()});
  f.advance(1h);  // a deadline of now + max_wait would overflow the clock here
  CHECK(f.admit().result);
  outcome waiting = f.completing_after(2s);
  CHECK(waiting.result);
  CHECK(waiting.result.waited() == 2s);
}

TEST_CASE("admission: a slot wait shares the deadline; timing out refunds the token", "[beast][server]") {
  fixture f({.rate = 1, .burst = 5, .concurrency = 1, .max_wait = 300ms});
  outcome held = f.admit();
  REQUIRE(held.result);
  outcome waiting = f.completing_after(300ms);
  CHECK(waiting.result.why() == refusal::concurrency);
  CHECK(waiting.result.waited() == 300ms);
  CHECK(f.a.state("").remaining == 4);  // 3 after both took one, 3.3 at 300 ms, 4.3 with the waiter's refund
}

TEST_CASE("admission: cancelling a waiting admit completes it with operation_aborted, nothing held",
          "[beast][server]") {
  const auto type =
      GENERATE(net::cancellation_type::terminal, net::cancellation_type::partial, net::cancellation_type::total);
  fixture f({.rate = 10, .burst = 2, .concurrency = 1, .max_wait = 1s});
  outcome held = f.admit();
  net::cancellation_signal signal;
  outcome cancelled;
  f.a.async_admit(get(), net::bind_cancellation_slot(signal.slot(), [&](rein::error_code ec, admission_result r) {
                    cancelled = {true, ec, std::move(r)};
                  }));
  rein_test::poll(f.io);
  CHECK_FALSE(cancelled.done);
  signal.emit(type);
  rein_test::poll(f.io);
  REQUIRE(cancelled.done);
  CHECK(cancelled.ec == net::error::operation_aborted);
  CHECK_FALSE(cancelled.result);  // a handler that reads only the result must not serve the request
  CHECK(cancelled.result.why() == rein::beast::refusal::aborted);
  CHECK_FALSE(cancelled.result.permit());
  CHECK(f.a.state("").remaining == 1);  // the waiter's token went back
}

TEST_CASE("admission: keys from the request have their own buckets; a spray past max_keys is shed", "[beast][server]") {
  fixture f({.rate = 1,
             .burst = 1,
             .concurrency = 8,
             .key = [](const http::request_header<>& h) { return std::string(h["X-API-Key"]); },
             .max_keys = 2});
  CHECK(f.admit(get("alice")).result);
  CHECK(f.admit(get("alice")).result.why() == refusal::rate);
  CHECK(f.admit(get("bob")).result);
  outcome sprayed = f.admit(get("mallory-1"));
  CHECK(sprayed.result.why() == refusal::keys);
  CHECK(sprayed.result.response().result() == http::status::service_unavailable);
  CHECK(field(sprayed.result.response(), "RateLimit") == "<absent>");
  CHECK(f.a.buckets().size() == 2);
  outcome named;
  f.a.async_admit(get("mallory-2"), "alice", [&](rein::error_code ec, admission_result r) {
    named = {true, ec, std::move(r)};
  });
  rein_test::poll(f.io);
  CHECK(named.result.why() == refusal::rate);  // the key given wins over the key function
}

TEST_CASE("admission: a key function that throws takes nothing and the exception reaches the caller",
          "[beast][server]") {
  fixture f({.rate = 1, .burst = 1, .concurrency = 1, .key = [](const http::request_header<>&) -> std::string {
               throw std::runtime_error("no key");
             }});
  outcome o;
  CHECK_THROWS_WITH(start(f.a, get(), o), "no key");
  CHECK(rein_test::poll(f.io) == 0);
  CHECK_FALSE(o.done);
  CHECK(f.a.slots().available() == 1);
  CHECK(f.a.buckets().size() == 0);
}

TEST_CASE("admission: a closed admission sheds with 503", "[beast][server]") {
  fixture f({.rate = 1, .burst = 2, .concurrency = 1});
  f.a.close();
  outcome o = f.admit();
  CHECK(o.result.why() == refusal::closed);
  CHECK(field(o.result.response(), "Retry-After") == "1");
  CHECK(f.a.state("").remaining == 2);
}

TEST_CASE("admission: made on an io_context as on its executor", "[beast][server]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  admission a(io, {.rate = 1, .burst = 2, .concurrency = 1});
  CHECK(a.state("").remaining == 2);
  CHECK(a.slots().available() == 1);
}

TEST_CASE("admission options are checked, naming the type, the field and the value", "[beast][server]") {
  net::io_context io;
  const auto message = [&](rein::beast::admission_options o) {
    try {
      admission a(io.get_executor(), std::move(o));
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(message({.rate = -1, .burst = 1, .concurrency = 1}) ==
        "rein::beast::admission: rate must be in (0, 1e9] per second, got -1");
  CHECK(message({.rate = 1, .burst = 0, .concurrency = 1, .name = "api"}) ==
        "rein::beast::admission \"api\": burst must be in [1, 1e15], got 0");
  CHECK(message({.rate = 1, .burst = 1, .concurrency = 0}) ==
        "rein::beast::admission: concurrency must be >= 1, got 0");
  CHECK(message({.rate = 1, .burst = 1, .concurrency = 1, .max_wait = -1ms}) ==
        "rein::beast::admission: max_wait must be >= 0, got -1000000 ns");
  CHECK(message({.rate = 1, .burst = 1, .concurrency = 1, .shed_retry_after = 0s}) ==
        "rein::beast::admission: shed_retry_after must be >= 1 s, got 0 ns");
  CHECK(message({.rate = 1, .burst = 1, .concurrency = 1, .policy = "a\"b"}) ==
        "rein::beast::admission: policy must be printable ASCII without '\"' or '\\', not empty, got \"a\"b\"");
  CHECK(message({.rate = 1, .burst = 1, .concurrency = 1, .max_keys = 0}) ==
        "rein::beast::admission: max_keys must be >= 1, got 0");
  CHECK(message({.rate = 1, .burst = 1, .concurrency = 1}) == "accepted");
}
