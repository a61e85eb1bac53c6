// rein/beast/server.hpp: admission of Beast requests on the manual clock, the exact values of the refusals'
// Retry-After and IETF RateLimit fields, and rein's own client reading them back.
#include "support/catch.hpp"
#include "support/manual_time.hpp"

#include <rein/adaptive_limiter.hpp>
#include <rein/algo/aimd.hpp>
#include <rein/beast.hpp>
#include <rein/beast/server.hpp>
#include <rein/beast/trusted_proxies.hpp>

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
#include <vector>

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
  // Admits `req` under `key` (a client address the session found), without the key function.
  outcome admit_as(std::string_view key, const http::request<http::empty_body>& req = get()) {
    outcome o;
    a.async_admit(req, key, [&o](rein::error_code ec, admission_result r) { o = {true, ec, std::move(r)}; });
    rein_test::poll(io);
    REQUIRE(o.done);
    return o;
  }
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

TEST_CASE("admission: a key function that throws is a counted 500, with nothing taken", "[beast][server]") {
  fixture f({.rate = 1, .burst = 1, .concurrency = 1, .key = [](const http::request_header<>& h) -> std::string {
               if (h["X-API-Key"] == "bad") throw std::runtime_error("no key");
               return std::string(h["X-API-Key"]);
             }});
  outcome o = f.admit(get("bad"));  // the handler is posted, not run inside async_admit (admit_now checks)
  CHECK_FALSE(o.ec);
  REQUIRE_FALSE(o.result);
  CHECK(o.result.why() == refusal::key_error);
  CHECK_FALSE(o.result.permit());
  CHECK_FALSE(o.result.state());
  http::response<http::string_body>& r = o.result.response();
  CHECK(r.result() == http::status::internal_server_error);
  CHECK(field(r, "Retry-After") == "<absent>");
  CHECK(field(r, "RateLimit") == "<absent>");
  CHECK(r.body() == "Internal Server Error\n");
  CHECK(f.a.key_errors() == 1);
  CHECK(f.a.slots().available() == 1);
  CHECK(f.a.buckets().size() == 0);
  CHECK(f.admit(get("bad")).result.why() == refusal::key_error);
  CHECK(f.a.key_errors() == 2);
  CHECK(f.admit(get("good")).result);  // the slot and the buckets are as before
}

TEST_CASE("admission: a spraying client is held by the keyed cap and the global stage", "[beast][server]") {
  fixture f({.rate = 1,
             .burst = 1,
             .concurrency = 2,
             .key = [](const http::request_header<>& h) { return std::string(h["X-API-Key"]); },
             .max_keys = 3});
  std::vector<outcome> admitted;
  int shed = 0;
  for (int i = 0; i < 10; ++i) {  // a new API key per request, all at one instant, none answered yet
    outcome o = f.admit(get("k" + std::to_string(i)));
    if (o.result) {
      admitted.push_back(std::move(o));
      continue;
    }
    // The third key on: no slot. Its token went back, so its bucket is full (idle) and evictable.
    CHECK(o.result.why() == refusal::concurrency);
    CHECK(field(o.result.response(), "RateLimit") == "\"default\";r=1;t=0");
    ++shed;
  }
  CHECK(admitted.size() == 2);  // the global stage holds the total
  CHECK(shed == 8);
  CHECK(f.a.buckets().size() == 3);  // the keyed cap holds the memory
  CHECK(f.a.buckets().snapshot().evicted_total == 7);

  admitted[0].result.permit().release();  // a slot comes back: one more key is admitted, evicting k9's
  CHECK(f.admit(get("k10")).result);
  // k0, k1 and k10 each spent their token (not idle): a new key is refused, never stored.
  outcome full = f.admit(get("k11"));
  CHECK(full.result.why() == refusal::keys);
  CHECK(full.result.response().result() == http::status::service_unavailable);
  CHECK(f.a.buckets().size() == 3);
}

TEST_CASE("admission keyed by client address behind a trusted proxy: a forged X-Forwarded-For changes nothing",
          "[beast][server]") {
  fixture f({.rate = 1, .burst = 2, .concurrency = 8});
  rein::beast::trusted_proxies proxies({.addresses = {"10.0.0.1"}});
  const auto proxy = boost::asio::ip::make_address("10.0.0.1");
  int served = 0, limited = 0;
  for (int i = 0; i < 10; ++i) {
    // The client writes a new address each time; the proxy appends the one it saw.
    auto req = get();
    req.set("X-Forwarded-For", "198.51.100." + std::to_string(i) + ", 203.0.113.7");
    const rein::beast::client_address client = proxies.client(req, proxy);
    CHECK(client.key() == "203.0.113.7");
    outcome o = f.admit_as(client.key(), req);
    ++(o.result ? served : limited);
  }
  CHECK(served == 2);  // the burst of one client's bucket
  CHECK(limited == 8);
  CHECK(f.a.buckets().size() == 1);
  CHECK(proxies.malformed() == 0);

  // Sent straight to the server (its peer is no trusted proxy) the field is not read at all.
  auto direct = get();
  direct.set("X-Forwarded-For", "203.0.113.7");
  const auto client = proxies.client(direct, boost::asio::ip::make_address("192.0.2.99"));
  CHECK(client.key() == "192.0.2.99");
  CHECK(client.source == rein::beast::client_source::peer);
  CHECK(f.admit_as(client.key(), direct).result);
}

TEST_CASE("admission in fair order: a tenant flooding the global stage waits behind its own backlog",
          "[beast][server]") {
  const auto order = GENERATE(rein::queue_order::fifo, rein::queue_order::fair);
  fixture f({.rate = 1000,
             .burst = 1000,
             .concurrency = 1,
             .order = order,
             .max_wait = 10s,
             .key = [](const http::request_header<>& h) { return std::string(h["X-API-Key"]); }});
  outcome held = f.admit(get("a"));
  REQUIRE(held.result);
  std::vector<std::string> served;
  std::vector<outcome> waiting(4);
  const std::vector<std::string> keys{"a", "a", "a", "b"};  // tenant a floods, b comes after
  for (std::size_t i = 0; i < keys.size(); ++i) {
    f.a.async_admit(get(keys[i]), [&, i](rein::error_code ec, admission_result r) {
      CHECK_FALSE(ec);
      served.push_back(keys[i] + std::to_string(i));
      waiting[i] = {true, ec, std::move(r)};
    });
  }
  rein_test::poll(f.io);
  CHECK(served.empty());
  held.result.permit().release();
  for (std::size_t n = 1; n <= keys.size(); ++n) {
    rein_test::poll(f.io);
    REQUIRE(served.size() == n);
    for (outcome& w : waiting)
      if (w.done && w.result.permit()) w.result.permit().release();
  }
  if (order == rein::queue_order::fair) CHECK(served == std::vector<std::string>{"a0", "b3", "a1", "a2"});
  else CHECK(served == std::vector<std::string>{"a0", "a1", "a2", "b3"});
}

TEST_CASE("admission with an adaptive global stage: the limit follows the outcomes the session reports",
          "[beast][server]") {
  using limiter = rein::basic_adaptive_limiter<rein::algo::aimd, net::any_io_executor, manual_clock>;
  using adaptive = rein::beast::adaptive_admission<rein::algo::aimd, manual_clock>;
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  adaptive a(io, {.rate = 1, .burst = 100, .max_wait = 1s},
             limiter(io, {.initial_limit = 2, .min_limit = 1, .max_limit = 8, .learn_failure_rate = false}, {},
                     {.idle_restart = 0ns}));
  const auto admit = [&](const http::request<http::empty_body>& req = get()) {
    outcome o;
    a.async_admit(req, [&o](rein::error_code ec, admission_result r) { o = {true, ec, std::move(r)}; });
    rein_test::poll(io);
    return o;
  };
  outcome first = admit(), second = admit();
  REQUIRE(first.result);
  REQUIRE(second.result);
  outcome third = admit();  // no room under floor(2): it waits, up to max_wait
  CHECK_FALSE(third.done);

  first.result.permit().complete(rein::outcome::congestion);  // the limit is cut to 1.6: room for one
  rein_test::poll(io);
  CHECK(a.slots().snapshot().limit == 2 * 0.8);
  CHECK_FALSE(third.done);  // one still in flight, under a limit of floor(1.6) = 1

  second.result.permit().complete(rein::outcome::success);  // 1.6 + 1 / 1.6: room for two
  rein_test::poll(io);
  REQUIRE(third.done);  // the slot went to the waiter
  CHECK(third.result);
  outcome fourth = admit();
  REQUIRE(fourth.done);
  CHECK(fourth.result);
  outcome fifth = admit();
  CHECK_FALSE(fifth.done);
  rein_test::advance_and_poll(io, 1s);  // no room within max_wait: shed, its token back
  REQUIRE(fifth.done);
  CHECK(fifth.result.why() == refusal::concurrency);
  CHECK(field(fifth.result.response(), "Retry-After") == "1");
  CHECK(a.state("").remaining == 97);  // 100 - 4 admitted + 1 s of refill at 1 per second
  CHECK(a.slots().snapshot().in_flight == 2);
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
  CHECK(message({.rate = 1, .burst = 1, .concurrency = 1, .order = rein::queue_order::priority}) ==
        "rein::beast::admission: order must be fifo, lifo or fair (a request names no class), got priority");
  CHECK(message({.rate = 1, .burst = 1, .concurrency = 1}) == "accepted");
}

TEST_CASE("admission with a global stage given: concurrency and order are that stage's, not the options'",
          "[beast][server]") {
  using limiter = rein::basic_adaptive_limiter<rein::algo::aimd, net::any_io_executor, manual_clock>;
  using adaptive = rein::beast::adaptive_admission<rein::algo::aimd, manual_clock>;
  net::io_context io;
  const auto message = [&](rein::beast::admission_options o) {
    try {
      adaptive a(io, std::move(o), limiter(io));
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(message({.rate = 1, .burst = 1, .concurrency = 4}) ==
        "rein::beast::admission: concurrency must be 0 with a global stage given (it has its own limit), got 4");
  CHECK(message({.rate = 1, .burst = 1, .order = rein::queue_order::fair}) ==
        "rein::beast::admission: order must be fifo with a global stage given (its options choose its order), got "
        "fair");
  CHECK(message({.rate = 1, .burst = 1}) == "accepted");
}
