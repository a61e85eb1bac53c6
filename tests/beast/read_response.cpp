// rein/beast.hpp: rein::read_response over Boost.Beast response objects built here (no network).
#include "support/catch.hpp"

#include <rein/beast.hpp>

#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>

#include <chrono>
#include <cstdint>
#include <optional>

namespace {

using namespace std::chrono_literals;
namespace http = boost::beast::http;
using opt_ns = std::optional<std::chrono::nanoseconds>;
using opt_count = std::optional<std::int64_t>;

// 2026-12-01T12:00:00Z.
const std::chrono::system_clock::time_point now =
    std::chrono::system_clock::time_point{std::chrono::sys_days{std::chrono::year{2026} / 12 / 1}} + 12h;

}  // namespace

TEST_CASE("a Beast 200 with OpenAI's headers reads as success with both budgets", "[beast]") {
  http::response<http::string_body> response{http::status::ok, 11};
  response.set("x-ratelimit-remaining-requests", "59");
  response.set("X-RateLimit-Reset-Requests", "1s");  // field names match case-insensitively
  response.set("x-ratelimit-remaining-tokens", "149984");
  response.set("x-ratelimit-reset-tokens", "6m0s");
  response.body() = "{}";
  const rein::upstream_response r = rein::read_response(response, now);
  CHECK(r.status == 200);
  CHECK(r.result == rein::outcome::success);
  CHECK_FALSE(r.too_many_requests);
  CHECK(r.requests.remaining == opt_count{59});
  CHECK(r.requests.reset_after == opt_ns{1s});
  CHECK(r.tokens.remaining == opt_count{149984});
  CHECK(r.tokens.reset_after == opt_ns{6min});
}

TEST_CASE("a Beast 429 with Retry-After and Anthropic's reset timestamps", "[beast]") {
  http::response<http::empty_body> response{http::status::too_many_requests, 11};
  response.set(http::field::retry_after, "20");
  response.set("anthropic-ratelimit-tokens-remaining", "0");
  response.set("anthropic-ratelimit-tokens-reset", "2026-12-01T13:00:15+01:00");
  const rein::upstream_response r = rein::read_response(response, now);
  CHECK(r.status == 429);
  CHECK(r.result == rein::outcome::congestion);
  CHECK(r.too_many_requests);
  CHECK(r.retry_after == opt_ns{20s});
  CHECK(r.tokens.remaining == opt_count{0});
  CHECK(r.tokens.reset_after == opt_ns{15s});
  CHECK(r.requests.remaining == std::nullopt);
}

TEST_CASE("a Beast 503 is too many requests only with Retry-After; the first of repeated fields counts",
          "[beast]") {
  http::response<http::empty_body> plain{http::status::service_unavailable, 11};
  CHECK_FALSE(rein::read_response(plain, now).too_many_requests);
  CHECK(rein::read_response(plain, now).result == rein::outcome::congestion);
  http::response<http::empty_body> paused{http::status::service_unavailable, 11};
  paused.insert(http::field::retry_after, "Tue, 01 Dec 2026 12:01:00 GMT");
  paused.insert(http::field::retry_after, "5");
  const rein::upstream_response r = rein::read_response(paused, now);
  CHECK(r.too_many_requests);
  CHECK(r.retry_after == opt_ns{60s});
}

TEST_CASE("a Beast response with unreadable values leaves them absent", "[beast]") {
  http::response<http::empty_body> response{http::status::not_found, 11};
  response.set("x-ratelimit-remaining-requests", "-3");
  response.set("x-ratelimit-reset-requests", "later");
  response.set(http::field::retry_after, "");
  const rein::upstream_response r = rein::read_response(response, now);
  CHECK(r.result == rein::outcome::ignored);
  CHECK(r.retry_after == std::nullopt);
  CHECK(r.requests.remaining == std::nullopt);
  CHECK(r.requests.reset_after == std::nullopt);
}

TEST_CASE("a Beast response read in a pinned dialect: the IETF fields, a GitHub-style window", "[beast]") {
  http::response<http::empty_body> response{http::status::ok, 11};
  response.set("RateLimit", "\"default\";r=50;t=30");
  response.set("RateLimit-Policy", "\"default\";q=100;w=60");
  response.set("X-RateLimit-Remaining", "7");
  response.set("X-RateLimit-Reset", "1796126460");  // 2026-12-01T12:01:00Z
  const rein::upstream_response ietf = rein::read_response(response, now);  // detected: IETF before GitHub
  CHECK(ietf.dialect == rein::rate_limit_dialect::ietf);
  CHECK(ietf.requests.remaining == opt_count{50});
  CHECK(ietf.requests.reset_after == opt_ns{30s});
  CHECK(ietf.requests.limit == opt_count{100});
  const rein::upstream_response github = rein::read_response(response, rein::rate_limit_dialect::github, now);
  CHECK(github.dialect == rein::rate_limit_dialect::github);
  CHECK(github.requests.remaining == opt_count{7});
  CHECK(github.requests.reset_after == opt_ns{60s});
  CHECK(github.requests.refill == rein::rate_limit_refill::window);
}
