// The test bed of emulated providers: the pure quota arithmetic with exact values, then the emulator over
// real loopback sockets in each header dialect (the raw values, and what rein::read_response reads of them),
// its 429s, burst 0, random 503s, latency and capacity, and the delay proxy. Real time, generous margins.
#include "support/catch.hpp"

#if !defined(REIN_STANDALONE_ASIO)  // Beast needs Boost.Asio

#include "support/delay_proxy.hpp"
#include "support/provider_emulator.hpp"

#include <rein/beast.hpp>
#include <rein/rate_limit_headers.hpp>

#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/empty_body.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <map>
#include <numeric>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using steady = std::chrono::steady_clock;
using rein_test::provider_emulator;
using rein_test::quota_dialect;
using response = http::response<http::string_body>;
using opt_ns = std::optional<std::chrono::nanoseconds>;
using opt_count = std::optional<std::int64_t>;

const steady::time_point t0 = steady::time_point{} + 1h;

// A blocking keep-alive HTTP/1.1 client on the calling thread.
class client {
 public:
  explicit client(unsigned short port) : stream_(io_) {
    stream_.connect(tcp::endpoint{net::ip::address_v4::loopback(), port});
    stream_.socket().set_option(tcp::no_delay(true));
  }

  /// GET /v1/items, with `x-tokens: <tokens>` if given.
  response get(std::optional<std::int64_t> tokens = std::nullopt) {
    http::request<http::empty_body> request{http::verb::get, "/v1/items", 11};
    request.set(http::field::host, "127.0.0.1");
    if (tokens) request.set("x-tokens", std::to_string(*tokens));
    http::write(stream_, request);
    response r;
    http::read(stream_, buffer_, r);
    return r;
  }

 private:
  net::io_context io_;
  boost::beast::tcp_stream stream_;
  boost::beast::flat_buffer buffer_;
};

// A field's value, "" when absent.
std::string field(const response& r, std::string_view name) {
  const auto value = r[boost::beast::string_view(name.data(), name.size())];
  return std::string(value.data(), value.size());
}

bool has(const response& r, std::string_view name) {
  return r.find(boost::beast::string_view(name.data(), name.size())) != r.end();
}

std::int64_t number(const std::string& text) { return std::stoll(text); }

}  // namespace

// ---- the quota, pure -----------------------------------------------------------------------------------

TEST_CASE("provider_quota: a bucket of 10 per second admits 10 at once, then one each 100 ms",
          "[provider_quota]") {
  rein_test::provider_quota q({.period = 1s, .requests = {.per_period = 10}}, t0);
  for (int i = 0; i < 10; ++i) CHECK(q.admit(1, t0).accepted);
  const rein_test::budget_state full = q.requests().state(t0);
  CHECK(full.limit == 10);
  CHECK(full.remaining == 0);
  CHECK(full.used == 10);
  CHECK(full.reset_after == 1s);
  CHECK(full.reset_at == t0 + 1s);
  const rein_test::quota_decision refused = q.admit(1, t0);
  CHECK_FALSE(refused.accepted);
  CHECK(refused.retry_after == opt_ns{100ms});
  CHECK(q.admit(1, t0 + 99ms).retry_after == opt_ns{1ms});
  CHECK(q.admit(1, t0 + 100ms).accepted);
  CHECK(q.requests().state(t0 + 100ms).reset_after == 1s);
  // 250 ms later 2.5 requests have drained: 2 fit, and the bucket is full 750 ms on.
  CHECK(q.requests().state(t0 + 350ms).remaining == 2);
  CHECK(q.requests().state(t0 + 350ms).reset_after == 750ms);
  CHECK(q.requests().state(t0 + 1100ms).remaining == 10);
  CHECK(q.requests().state(t0 + 5s).reset_after == 0s);
  CHECK(q.requests().state(t0 + 5s).used == 0);
}

TEST_CASE("provider_quota: burst 0 refuses an arrival sooner than 1/rate after the previous accepted one",
          "[provider_quota]") {
  rein_test::provider_quota q({.period = 1s, .requests = {.per_period = 4, .burst = 0}}, t0);
  CHECK(q.requests().capacity() == 1);
  CHECK(q.admit(1, t0).accepted);
  CHECK(q.requests().state(t0).remaining == 0);
  CHECK(q.requests().state(t0).reset_after == 250ms);
  CHECK(q.admit(1, t0).retry_after == opt_ns{250ms});
  CHECK(q.admit(1, t0 + 249ms).retry_after == opt_ns{1ms});
  CHECK(q.admit(1, t0 + 250ms).accepted);
  CHECK(q.admit(1, t0 + 600ms).accepted);  // a late arrival earns nothing: the next is due 250 ms later
  CHECK(q.admit(1, t0 + 849ms).retry_after == opt_ns{1ms});
  CHECK(q.admit(1, t0 + 850ms).accepted);

  rein_test::provider_quota burst_2({.period = 1s, .requests = {.per_period = 4, .burst = 2}}, t0);
  for (int i = 0; i < 3; ++i) CHECK(burst_2.admit(1, t0).accepted);
  CHECK(burst_2.admit(1, t0).retry_after == opt_ns{250ms});
}

TEST_CASE("provider_quota: a request needs room in both budgets, and a refused one charges neither",
          "[provider_quota]") {
  rein_test::provider_quota q({.period = 1s, .requests = {.per_period = 10}, .tokens = {.per_period = 100}}, t0);
  CHECK(q.admit(60, t0).accepted);
  const rein_test::quota_decision short_of_tokens = q.admit(60, t0);
  CHECK_FALSE(short_of_tokens.accepted);
  CHECK(short_of_tokens.retry_after == opt_ns{200ms});  // 20 tokens lacking at 100/s
  CHECK(q.requests().state(t0).remaining == 9);
  CHECK(q.tokens().state(t0).remaining == 40);
  CHECK(q.tokens().state(t0).reset_after == 600ms);
  const rein_test::quota_decision never = q.admit(101, t0);  // more than the bucket holds
  CHECK_FALSE(never.accepted);
  CHECK(never.retry_after == std::nullopt);
  CHECK(q.admit(0, t0).accepted);  // a request of no tokens costs only a request
  CHECK(q.requests().state(t0).remaining == 8);
  CHECK(q.tokens().state(t0).remaining == 40);
  CHECK(q.admit(60, t0 + 200ms).accepted);
  CHECK(q.tokens().state(t0 + 200ms).remaining == 0);
}

TEST_CASE("provider_quota: a fixed window of 3 per 2 s counts from its start and resets at its end",
          "[provider_quota]") {
  rein_test::provider_quota q(
      {.model = rein_test::quota_model::fixed_window, .period = 2s, .requests = {.per_period = 3}}, t0);
  for (int i = 0; i < 3; ++i) CHECK(q.admit(1, t0 + 500ms).accepted);
  const rein_test::budget_state spent = q.requests().state(t0 + 500ms);
  CHECK(spent.used == 3);
  CHECK(spent.remaining == 0);
  CHECK(spent.reset_after == 1500ms);
  CHECK(spent.reset_at == t0 + 2s);
  CHECK(q.admit(1, t0 + 500ms).retry_after == opt_ns{1500ms});
  CHECK(q.admit(1, t0 + 1999ms).retry_after == opt_ns{1ms});
  CHECK(q.admit(1, t0 + 2s).accepted);
  const rein_test::budget_state next = q.requests().state(t0 + 2s);
  CHECK(next.used == 1);
  CHECK(next.remaining == 2);
  CHECK(next.reset_after == 2s);
  // Windows before the origin are whole windows too, and a count beyond the limit never fits.
  CHECK(q.requests().state(t0 - 500ms).reset_at == t0);
  rein_test::provider_quota tokens(
      {.model = rein_test::quota_model::fixed_window, .period = 2s, .tokens = {.per_period = 50}}, t0);
  CHECK(tokens.admit(51, t0).retry_after == std::nullopt);
  CHECK(tokens.admit(50, t0).accepted);
  CHECK(tokens.admit(1, t0 + 1s).retry_after == opt_ns{1s});
}

TEST_CASE("go_duration, rfc3339_milliseconds and ceil_seconds write what the providers send",
          "[provider_quota]") {
  using rein_test::go_duration;
  CHECK(go_duration(0s) == "0s");
  CHECK(go_duration(-5s) == "0s");
  CHECK(go_duration(7ns) == "7ns");
  CHECK(go_duration(250us) == "250\xC2\xB5s");
  CHECK(go_duration(1500us) == "1.5ms");
  CHECK(go_duration(20ms) == "20ms");
  CHECK(go_duration(1s) == "1s");
  CHECK(go_duration(1500ms) == "1.5s");
  CHECK(go_duration(6min) == "6m0s");
  CHECK(go_duration(1h + 2min + 3500ms) == "1h2m3.5s");
  CHECK(go_duration(1s + 1ns) == "1.000000001s");
  const std::chrono::nanoseconds samples[] = {7ns, 250us, 1500us, 20ms, 1500ms, 6min + 36523ms, 1h + 2min + 3500ms};
  for (const std::chrono::nanoseconds d : samples)
    CHECK(rein::parse_reset_duration(go_duration(d)) == opt_ns{d});

  const std::chrono::system_clock::time_point at =
      std::chrono::sys_days{std::chrono::year{2026} / 12 / 6} + 1h + 2min + 3s + 250ms;
  CHECK(rein_test::rfc3339_milliseconds(at) == "2026-12-06T01:02:03.250Z");
  CHECK(rein_test::rfc3339_milliseconds(at + 1ns) == "2026-12-06T01:02:03.251Z");
  CHECK(rein::parse_rate_limit_reset(rein_test::rfc3339_milliseconds(at), at - 1s) == opt_ns{1s});

  CHECK(rein_test::ceil_seconds(0s) == 0);
  CHECK(rein_test::ceil_seconds(1ns) == 1);
  CHECK(rein_test::ceil_seconds(1s) == 1);
  CHECK(rein_test::ceil_seconds(1001ms) == 2);
}

// ---- the emulator over sockets -------------------------------------------------------------------------

TEST_CASE("emulator, openai: x-ratelimit-* read by rein::read_response", "[integration][provider]") {
  provider_emulator server({.dialect = quota_dialect::openai,
                            .period = 60s,
                            .requests = {.per_period = 60},
                            .tokens = {.per_period = 1000}});
  client c(server.port());
  const response first = c.get(100);
  CHECK(first.result_int() == 200);
  CHECK(field(first, "x-usage-tokens") == "100");
  CHECK(field(first, "x-ratelimit-limit-requests") == "60");
  CHECK(field(first, "x-ratelimit-remaining-requests") == "59");
  CHECK(field(first, "x-ratelimit-reset-requests") == "1s");  // a fresh bucket: exactly one request to refill
  CHECK(field(first, "x-ratelimit-limit-tokens") == "1000");
  CHECK(field(first, "x-ratelimit-remaining-tokens") == "900");
  CHECK(field(first, "x-ratelimit-reset-tokens") == "6s");
  const rein::upstream_response r = rein::read_response(first);
  CHECK(r.result == rein::outcome::success);
  CHECK(r.dialect == rein::rate_limit_dialect::openai);
  CHECK(r.requests.refill == rein::rate_limit_refill::continuous);
  CHECK(r.requests.limit == opt_count{60});
  CHECK(r.tokens.limit == opt_count{1000});
  CHECK(r.requests.remaining == opt_count{59});
  CHECK(r.requests.reset_after == opt_ns{1s});
  CHECK(r.tokens.remaining == opt_count{900});
  CHECK(r.tokens.reset_after == opt_ns{6s});

  // A moment later: the reset counts down from the sum of both charges (Go's fractional seconds).
  const rein::upstream_response second = rein::read_response(c.get());
  CHECK(second.requests.remaining == opt_count{58});
  REQUIRE(second.requests.reset_after);
  CHECK(*second.requests.reset_after > 1s);
  CHECK(*second.requests.reset_after <= 2s);
  REQUIRE(second.tokens.remaining);
  CHECK(*second.tokens.remaining >= 899);
  CHECK(*second.tokens.remaining <= 910);
  CHECK(server.accepted() == 2);
  CHECK(server.tokens_accepted() == 101);
}

TEST_CASE("emulator, anthropic: anthropic-ratelimit-* with RFC 3339 resets read by rein::read_response",
          "[integration][provider]") {
  provider_emulator server({.dialect = quota_dialect::anthropic,
                            .period = 60s,
                            .requests = {.per_period = 60},
                            .tokens = {.per_period = 6000}});
  client c(server.port());
  const response first = c.get(600);
  const auto now = std::chrono::system_clock::now();
  CHECK(first.result_int() == 200);
  CHECK(field(first, "anthropic-ratelimit-requests-limit") == "60");
  CHECK(field(first, "anthropic-ratelimit-tokens-limit") == "6000");
  const std::regex rfc3339_ms(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)");
  CHECK(std::regex_match(field(first, "anthropic-ratelimit-requests-reset"), rfc3339_ms));
  CHECK(std::regex_match(field(first, "anthropic-ratelimit-tokens-reset"), rfc3339_ms));
  const rein::upstream_response r = rein::read_response(first, now);
  CHECK(r.dialect == rein::rate_limit_dialect::anthropic);
  CHECK(r.tokens.refill == rein::rate_limit_refill::continuous);
  CHECK(r.requests.limit == opt_count{60});
  CHECK(r.requests.remaining == opt_count{59});
  CHECK(r.tokens.remaining == opt_count{5400});
  // Full again 1 s (one request) and 6 s (600 tokens at 100/s) after the decision, rounded up to the ms.
  REQUIRE(r.requests.reset_after);
  REQUIRE(r.tokens.reset_after);
  CHECK(*r.requests.reset_after > 500ms);
  CHECK(*r.requests.reset_after <= 1001ms);
  CHECK(*r.tokens.reset_after > 5500ms);
  CHECK(*r.tokens.reset_after <= 6001ms);
}

TEST_CASE("emulator, github: x-ratelimit-{limit,remaining,used,reset} of a fixed window",
          "[integration][provider]") {
  provider_emulator server({.dialect = quota_dialect::github, .period = 2s, .requests = {.per_period = 5}});
  client c(server.port());
  const auto before = std::chrono::system_clock::now();
  std::vector<response> answers;
  for (int i = 0; i < 14; ++i) answers.push_back(c.get());
  const auto after = std::chrono::system_clock::now();

  CHECK(answers.front().result_int() == 200);
  CHECK(field(answers.front(), "x-ratelimit-limit") == "5");
  CHECK(field(answers.front(), "x-ratelimit-remaining") == "4");
  CHECK(field(answers.front(), "x-ratelimit-used") == "1");
  const rein::upstream_response read = rein::read_response(answers.front(), before);
  CHECK(read.dialect == rein::rate_limit_dialect::github);
  CHECK(read.requests.refill == rein::rate_limit_refill::window);
  CHECK(read.requests.limit == opt_count{5});
  CHECK(read.requests.remaining == opt_count{4});
  REQUIRE(read.requests.reset_after);
  CHECK(*read.requests.reset_after > 0s);
  CHECK(*read.requests.reset_after <= 2s + (after - before));
  std::map<std::int64_t, int> accepted_per_window;
  int refused = 0;
  for (const response& a : answers) {
    INFO("status " << a.result_int() << ", remaining " << field(a, "x-ratelimit-remaining"));
    REQUIRE(std::regex_match(field(a, "x-ratelimit-reset"), std::regex(R"(\d+)")));
    const std::int64_t reset = number(field(a, "x-ratelimit-reset"));
    const std::chrono::system_clock::time_point reset_at{std::chrono::seconds{reset}};
    CHECK(reset % 2 == 0);  // windows start at multiples of 2 s since the epoch
    CHECK(reset_at > before);
    CHECK(reset_at <= after + 2s);
    CHECK(number(field(a, "x-ratelimit-used")) + number(field(a, "x-ratelimit-remaining")) == 5);
    if (a.result_int() == 200) {
      ++accepted_per_window[reset];
    } else {
      CHECK(a.result_int() == 429);
      CHECK(field(a, "x-ratelimit-remaining") == "0");
      const std::int64_t retry = number(field(a, "retry-after"));
      CHECK(retry >= 1);
      CHECK(retry <= 2);
      ++refused;
    }
  }
  for (const auto& [reset, accepted] : accepted_per_window) CHECK(accepted <= 5);
  CHECK(refused > 0);
}

TEST_CASE("emulator, ietf: RateLimit-Policy and RateLimit as structured fields", "[integration][provider]") {
  provider_emulator server({.dialect = quota_dialect::ietf,
                            .period = 2s,
                            .requests = {.per_period = 5},
                            .tokens = {.per_period = 100}});
  client c(server.port());
  std::vector<response> answers;
  for (int i = 0; i < 12; ++i) answers.push_back(c.get(10));

  CHECK(field(answers.front(), "RateLimit-Policy") == R"("default";q=5;w=2, "tokens";q=100;w=2)");
  const std::regex limits(R"x("default";r=(\d+);t=(\d+), "tokens";r=(\d+);t=(\d+))x");
  std::smatch m;
  const std::string first = field(answers.front(), "RateLimit");
  REQUIRE(std::regex_match(first, m, limits));
  CHECK(m[1] == "4");
  CHECK(m[3] == "90");
  const rein::upstream_response read = rein::read_response(answers.front());
  CHECK(read.dialect == rein::rate_limit_dialect::ietf);
  CHECK(read.requests.remaining == opt_count{4});  // of the two policies, the one with fewer left
  CHECK(read.requests.limit == opt_count{5});
  CHECK(read.requests.reset_after == opt_ns{std::chrono::seconds{number(m[2])}});
  int refused = 0;
  for (const response& a : answers) {
    const std::string text = field(a, "ratelimit");  // field names are case-insensitive
    INFO(text);
    REQUIRE(std::regex_match(text, m, limits));
    for (const int t : {2, 4}) {
      CHECK(number(m[static_cast<std::size_t>(t)]) >= 1);  // whole seconds until the window ends, rounded up
      CHECK(number(m[static_cast<std::size_t>(t)]) <= 2);
    }
    if (a.result_int() == 429) {
      CHECK(m[1] == "0");
      ++refused;
    }
  }
  CHECK(refused > 0);
}

TEST_CASE("emulator, none: no rate-limit headers, the quota still refuses", "[integration][provider]") {
  provider_emulator server({.dialect = quota_dialect::none, .requests = {.per_period = 2}});
  client c(server.port());
  std::vector<response> answers;
  for (int i = 0; i < 3; ++i) answers.push_back(c.get());
  CHECK(answers[0].result_int() == 200);
  CHECK(answers[1].result_int() == 200);
  CHECK(answers[2].result_int() == 429);
  CHECK(field(answers[2], "retry-after") == "1");
  for (const response& a : answers) {
    for (const auto& f : a) {
      std::string name(f.name_string().data(), f.name_string().size());
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
      CHECK(name.find("ratelimit") == std::string::npos);
    }
    const rein::upstream_response r = rein::read_response(a);
    CHECK(r.dialect == rein::rate_limit_dialect::none);
    CHECK_FALSE(r.requests.remaining.has_value());
    CHECK_FALSE(r.tokens.reset_after.has_value());
  }
}

TEST_CASE("emulator: over-rate traffic is refused with 429 and Retry-After", "[integration][provider]") {
  provider_emulator server({.requests = {.per_period = 10}});
  client c(server.port());
  std::vector<response> answers;
  const steady::time_point start = steady::now();
  for (int i = 0; i < 30; ++i) answers.push_back(c.get());
  const auto elapsed = steady::now() - start;

  for (int i = 0; i < 10; ++i) CHECK(answers[static_cast<std::size_t>(i)].result_int() == 200);  // a full bucket
  const auto within = static_cast<std::uint64_t>(10 + 10 * std::chrono::duration<double>(elapsed).count() + 1);
  CHECK(server.accepted() <= within);
  CHECK(server.refused() > 0);
  CHECK(server.accepted() + server.refused() == 30);
  CHECK(server.failed() == 0);
  for (const response& a : answers) {
    if (a.result_int() != 429) continue;
    const rein::upstream_response r = rein::read_response(a);
    CHECK(r.too_many_requests);
    CHECK(r.retry_after == opt_ns{1s});  // 100 ms until the next request fits, in whole seconds
    CHECK(r.requests.remaining == opt_count{0});
  }
}

TEST_CASE("emulator: 429 without Retry-After when configured, and a token cost that never fits",
          "[integration][provider]") {
  SECTION("retry_after off") {
    provider_emulator server({.requests = {.per_period = 1}, .retry_after = false});
    client c(server.port());
    CHECK(c.get().result_int() == 200);
    const response refused = c.get();
    CHECK(refused.result_int() == 429);
    CHECK_FALSE(has(refused, "retry-after"));
    CHECK(rein::read_response(refused).too_many_requests);
  }
  SECTION("tokens") {
    provider_emulator server({.tokens = {.per_period = 100}});
    client c(server.port());
    const response first = c.get(60);
    CHECK(first.result_int() == 200);
    CHECK(field(first, "x-usage-tokens") == "60");
    const response second = c.get(60);
    CHECK(second.result_int() == 429);
    CHECK(field(second, "retry-after") == "1");
    CHECK_FALSE(has(second, "x-usage-tokens"));
    const response never = c.get(101);  // waiting would not help: no Retry-After
    CHECK(never.result_int() == 429);
    CHECK_FALSE(has(never, "retry-after"));
    CHECK(c.get(-1).result_int() == 400);
    CHECK(server.tokens_accepted() == 60);
    CHECK(server.bad_requests() == 1);
  }
}

TEST_CASE("emulator: burst 0 refuses an arrival closer than 1/rate to the previous accepted one",
          "[integration][provider]") {
  provider_emulator server({.requests = {.per_period = 5, .burst = 0}});  // one per 200 ms
  client c(server.port());
  CHECK(c.get().result_int() == 200);
  CHECK(c.get().result_int() == 429);
  const steady::time_point end = steady::now() + 1100ms;
  while (steady::now() < end) c.get();
  const std::vector<steady::time_point> times = server.accepted_times();
  REQUIRE(times.size() >= 3);
  CHECK(times.size() <= 7);  // 1 + 1.1 s / 200 ms
  for (std::size_t i = 1; i < times.size(); ++i) {
    CHECK(times[i] - times[i - 1] >= 200ms);  // exact: the emulator's own decision times
    CHECK(times[i] - times[i - 1] < 200ms + 150ms);
  }
  CHECK(server.refused() > 1);
  CHECK(server.accepted_between(times.front(), times.back()) == times.size() - 1);  // [from, to)
}

TEST_CASE("emulator: random 503s come in roughly the configured share", "[integration][provider]") {
  provider_emulator server({.failure_share = 0.25, .seed = 7});
  client c(server.port());
  int failed = 0;
  for (int i = 0; i < 400; ++i) {
    const response a = c.get();
    if (a.result_int() != 503) continue;
    ++failed;
    const rein::upstream_response r = rein::read_response(a);
    CHECK(r.result == rein::outcome::congestion);
    CHECK_FALSE(r.too_many_requests);
  }
  CHECK(server.failed() == static_cast<std::uint64_t>(failed));
  CHECK(server.accepted() + server.failed() == 400);
  CHECK(failed >= 68);   // 17 %
  CHECK(failed <= 132);  // 33 %
}

TEST_CASE("emulator: the service latency is a timer, not a sleeping thread", "[integration][provider]") {
  SECTION("fixed, five callers at once") {
    provider_emulator server({.latency = {300ms, 300ms}});
    std::array<steady::duration, 5> round_trips{};
    const steady::time_point start = steady::now();
    std::vector<std::thread> callers;
    for (auto& round_trip : round_trips) {
      callers.emplace_back([&server, &round_trip] {
        client c(server.port());
        const steady::time_point sent = steady::now();
        c.get();
        round_trip = steady::now() - sent;
      });
    }
    for (std::thread& t : callers) t.join();
    const auto elapsed = steady::now() - start;
    for (const auto round_trip : round_trips) CHECK(round_trip >= 300ms);
    CHECK(elapsed < 1000ms);  // one after the other would take 1.5 s
    CHECK(server.accepted() == 5);
  }
  SECTION("uniform in [50 ms, 150 ms]") {
    provider_emulator server({.latency = {50ms, 150ms}, .seed = 5});
    client c(server.port());
    steady::duration longest{};
    for (int i = 0; i < 8; ++i) {
      const steady::time_point sent = steady::now();
      c.get();
      const auto round_trip = steady::now() - sent;
      CHECK(round_trip >= 50ms);
      CHECK(round_trip < 150ms + 300ms);
      longest = std::max(longest, round_trip);
    }
    CHECK(longest >= 100ms);  // drawn, not always the low end
  }
}

TEST_CASE("emulator: past its capacity requests wait for a worker; past its hard cap they get a 503",
          "[integration][provider]") {
  // Capacity 2, 200 ms each: four callers at once are served two by two, the second pair after 400 ms; a
  // hard cap of 3 then sends one of them a 503 (after its latency, without a worker).
  const auto serve_four = [](provider_emulator& server) {
    std::array<steady::duration, 4> round_trips{};
    std::array<unsigned, 4> statuses{};
    std::vector<std::thread> callers;
    for (std::size_t i = 0; i < round_trips.size(); ++i) {
      callers.emplace_back([&server, &round_trips, &statuses, i] {
        client c(server.port());
        const steady::time_point sent = steady::now();
        statuses[i] = c.get().result_int();
        round_trips[i] = steady::now() - sent;
      });
    }
    for (std::thread& t : callers) t.join();
    std::sort(round_trips.begin(), round_trips.end());
    std::sort(statuses.begin(), statuses.end());
    return std::pair{round_trips, statuses};
  };
  SECTION("capacity 2") {
    provider_emulator server({.latency = {200ms, 200ms}, .capacity = 2});
    const auto [round_trips, statuses] = serve_four(server);
    CHECK(round_trips[1] < 200ms + 150ms);  // a thread that starts late only shortens its own wait
    CHECK(round_trips[3] >= 400ms);
    CHECK(round_trips[3] < 400ms + 300ms);
    CHECK(statuses == std::array<unsigned, 4>{200, 200, 200, 200});
    CHECK(server.peak_in_server() == 4);
    CHECK(server.in_server() == 0);
  }
  SECTION("capacity 2, hard cap 3") {
    provider_emulator server({.latency = {200ms, 200ms}, .capacity = 2, .hard_cap = 3});
    const auto [round_trips, statuses] = serve_four(server);
    CHECK(statuses == std::array<unsigned, 4>{200, 200, 200, 503});
    CHECK(server.overloaded() == 1);
    CHECK(server.failed() == 0);
    CHECK(round_trips[3] >= 400ms);  // the third 200 waited for a worker
  }
}

// ---- the delay proxy -----------------------------------------------------------------------------------

TEST_CASE("delay_proxy: each request reaches the upstream within [0, spread] later, plus a margin",
          "[integration][proxy]") {
  provider_emulator server;
  const std::chrono::nanoseconds spread = 40ms;
  rein_test::delay_proxy proxy(server.port(), {.spread = spread, .seed = 3});
  client c(proxy.port());
  std::vector<steady::duration> delays;
  for (std::size_t i = 0; i < 20; ++i) {
    const steady::time_point sent = steady::now();
    CHECK(c.get().result_int() == 200);
    const std::vector<steady::time_point> times = server.accepted_times();
    REQUIRE(times.size() == i + 1);
    delays.push_back(times.back() - sent);
  }
  for (const auto d : delays) {
    CHECK(d >= 0s);
    CHECK(d <= spread + 250ms);
  }
  const auto mean = std::accumulate(delays.begin(), delays.end(), steady::duration{}) / static_cast<std::int64_t>(delays.size());
  CHECK(mean >= spread / 4);  // uniform in [0, 40 ms] averages 20 ms
  CHECK(proxy.connections() == 1);
  for (const rein_test::relayed_chunk& chunk : proxy.chunks()) {
    CHECK(chunk.drawn <= spread);
    CHECK(chunk.forwarded - chunk.received >= chunk.drawn);
  }
}

TEST_CASE("delay_proxy: the chunks of a connection keep their order", "[integration][proxy]") {
  // The upstream: reads one connection to its end.
  net::io_context sink_io;
  tcp::acceptor sink(sink_io, tcp::endpoint{net::ip::address_v4::loopback(), 0});
  std::string received;
  std::thread reader([&] {
    tcp::socket s(sink_io);
    sink.accept(s);
    boost::system::error_code end;
    net::read(s, net::dynamic_buffer(received), end);
  });

  const std::chrono::nanoseconds spread = 20ms;
  rein_test::delay_proxy proxy(sink.local_endpoint().port(), {.spread = spread, .seed = 11});
  std::string sent;
  {
    net::io_context io;
    tcp::socket s(io);
    s.connect(tcp::endpoint{net::ip::address_v4::loopback(), proxy.port()});
    s.set_option(tcp::no_delay(true));
    for (int i = 0; i < 50; ++i) {
      const std::string chunk = std::to_string(i) + ';';
      net::write(s, net::buffer(chunk));
      sent += chunk;
      std::this_thread::sleep_for(1ms);  // separate reads at the proxy, so that delays differ
    }
    s.shutdown(tcp::socket::shutdown_send);
    reader.join();  // the proxy passed the end of stream on after the last chunk
  }
  CHECK(received == sent);
  const std::vector<rein_test::relayed_chunk> chunks = proxy.chunks();
  CHECK(chunks.size() > 1);
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    bytes += chunks[i].bytes;
    CHECK(chunks[i].forwarded - chunks[i].received >= chunks[i].drawn);
    CHECK(chunks[i].forwarded - chunks[i].received <= spread + 150ms);
    if (i > 0) CHECK(chunks[i].forwarded >= chunks[i - 1].forwarded);
  }
  CHECK(bytes == sent.size());
}

#endif
