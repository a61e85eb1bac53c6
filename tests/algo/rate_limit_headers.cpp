// rein/rate_limit_headers.hpp: remaining counts, reset values in their three forms (Go durations,
// delta-seconds, RFC 3339 timestamps), and read_response over a header lookup. Exact values throughout.
#include "support/catch.hpp"

#include <rein/rate_limit_headers.hpp>

#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <string_view>

namespace {

using namespace std::chrono_literals;
using std::chrono::nanoseconds;
using std::chrono::system_clock;
using opt_ns = std::optional<nanoseconds>;
using opt_count = std::optional<std::int64_t>;

// 2026-12-01T12:00:00Z and a quarter second.
const system_clock::time_point now =
    system_clock::time_point{std::chrono::sys_days{std::chrono::year{2026} / 12 / 1}} + 12h + 250ms;

opt_ns reset(std::string_view value) { return rein::parse_rate_limit_reset(value, now); }

// Go's time.Duration.String(): "0s", "42ns", "1.5µs", "20ms", "1.5s", "6m0s", "1h2m3.5s".
std::string go_string(std::int64_t d) {
  if (d == 0) return "0s";
  const auto fraction = [](std::int64_t whole, std::int64_t rest, int digits) {
    std::string s = std::to_string(whole);
    if (rest == 0) return s;
    std::string f = std::to_string(rest);
    f.insert(0, static_cast<std::size_t>(digits) - f.size(), '0');
    while (f.back() == '0') f.pop_back();
    return s + "." + f;
  };
  if (d < 1'000) return std::to_string(d) + "ns";
  if (d < 1'000'000) return fraction(d / 1'000, d % 1'000, 3) + "\xC2\xB5s";
  if (d < 1'000'000'000) return fraction(d / 1'000'000, d % 1'000'000, 6) + "ms";
  const std::int64_t hours = d / 3'600'000'000'000, minutes = d / 60'000'000'000 % 60;
  const std::string seconds = fraction(d / 1'000'000'000 % 60, d % 1'000'000'000, 9) + "s";
  if (hours > 0) return std::to_string(hours) + "h" + std::to_string(minutes) + "m" + seconds;
  if (minutes > 0) return std::to_string(minutes) + "m" + seconds;
  return seconds;
}

}  // namespace

TEST_CASE("remaining counts are plain decimal integers", "[rate_limit_headers]") {
  using rein::parse_rate_limit_count;
  CHECK(parse_rate_limit_count("59") == opt_count{59});
  CHECK(parse_rate_limit_count("0") == opt_count{0});
  CHECK(parse_rate_limit_count(" 149984\t") == opt_count{149984});
  CHECK(parse_rate_limit_count("99999999999999999999999") == opt_count{std::numeric_limits<std::int64_t>::max()});
  for (const std::string_view garbage : {"", " ", "-1", "+1", "1.5", "1e3", "12k", "ten", "1 2"}) {
    INFO(garbage);
    CHECK(parse_rate_limit_count(garbage) == std::nullopt);
  }
}

TEST_CASE("reset values in Go's duration format", "[rate_limit_headers]") {
  CHECK(reset("6m0s") == opt_ns{6min});
  CHECK(reset("1s") == opt_ns{1s});
  CHECK(reset("20ms") == opt_ns{20ms});
  CHECK(reset("1h2m3.5s") == opt_ns{1h + 2min + 3500ms});
  CHECK(reset("0s") == opt_ns{0ns});
  CHECK(reset("250us") == opt_ns{250us});
  CHECK(reset("3m") == opt_ns{3min});
  CHECK(reset("5m3") == std::nullopt);
  CHECK(reset("-1s") == std::nullopt);
  CHECK(reset("9999999h") == opt_ns{nanoseconds::max()});
}

TEST_CASE("reset values as delta-seconds", "[rate_limit_headers]") {
  CHECK(reset("30") == opt_ns{30s});
  CHECK(reset("0") == opt_ns{0s});
  CHECK(reset("1.5") == opt_ns{1500ms});
  CHECK(reset("0.0000000001") == opt_ns{1ns});
  CHECK(reset("1.") == std::nullopt);
  CHECK(reset("99999999999999999999") == opt_ns{nanoseconds::max()});
}

TEST_CASE("reset values as RFC 3339 timestamps, relative to now", "[rate_limit_headers]") {
  CHECK(reset("2026-12-01T12:00:30Z") == opt_ns{30s - 250ms});
  CHECK(reset("2026-12-01T12:00:30.75Z") == opt_ns{30s + 500ms});
  CHECK(reset("2026-12-01T12:00:00.250000001Z") == opt_ns{1ns});
  CHECK(reset("2026-12-01T12:00:00.2500000001Z") == opt_ns{1ns});  // beyond the nanosecond: rounds up
  CHECK(reset("2026-12-01T14:00:01+02:00") == opt_ns{750ms});
  CHECK(reset("2026-12-01T06:30:01-05:30") == opt_ns{750ms});
  CHECK(reset("2026-12-01T12:00:01-00:00") == opt_ns{750ms});
  CHECK(reset("2026-12-01t12:00:01z") == opt_ns{750ms});
  CHECK(reset("2026-12-01 12:00:01Z") == opt_ns{750ms});
  CHECK(reset("2026-12-02T12:00:00.250Z") == opt_ns{24h});
  CHECK(reset("2026-12-01T11:59:59.999999999+00:00") == opt_ns{0ns});  // in the past
  CHECK(reset("2026-12-01T12:00:00.25Z") == opt_ns{0ns});              // exactly now
  CHECK(reset("2026-12-31T23:59:60Z") == opt_ns{std::chrono::sys_days{std::chrono::year{2027} / 1 / 1} -
                                                 (now - 0ns)});          // a leap second: the next minute
  CHECK(reset("9999-12-31T23:59:59Z") == opt_ns{nanoseconds::max()});
  CHECK(reset("1970-01-01T00:00:00Z") == opt_ns{0ns});
}

TEST_CASE("malformed RFC 3339 timestamps are absent", "[rate_limit_headers]") {
  for (const std::string_view bad : {
           "2026-02-30T12:00:00Z",       // no such day
           "2027-02-29T12:00:00Z",       // not a leap year
           "2026-12-01T24:00:00Z",       // hour 24
           "2026-12-01T12:60:00Z",       // minute 60
           "2026-12-01T12:00:61Z",       // second 61
           "2026-12-01T12:00:00",        // no offset
           "2026-12-01T12:00:00+2:00",   // one-digit offset hour
           "2026-12-01T12:00:00+24:00",  // offset hour 24
           "2026-12-01T12:00:00+02:60",  // offset minute 60
           "2026-12-01T12:00:00+0200",   // offset without colon
           "2026-12-01T12:00:00.Z",      // empty fraction
           "2026-12-01T12:00:00ZZ",      // trailing garbage
           "2026-12-01X12:00:00Z",       // bad separator
           "2026-1-01T12:00:00Z",        // one-digit month
           "2026-13-01T12:00:00Z",       // month 13
           "+2026-12-01T12:00:00Z",      // signed year
       }) {
    INFO(bad);
    CHECK(reset(bad) == std::nullopt);
  }
}

TEST_CASE("every prefix of a valid timestamp is absent or a shorter valid form", "[rate_limit_headers]") {
  const std::string full = "2026-12-01T12:00:30.5-01:00";
  REQUIRE(reset(full) == opt_ns{1h + 30s + 250ms});
  for (std::size_t n = 0; n < full.size(); ++n) {
    const std::string prefix = full.substr(0, n);
    INFO(prefix);
    // Prefixes of 1 to 4 digits read as delta-seconds; every other prefix is malformed.
    if (n >= 1 && n <= 4) {
      CHECK(reset(prefix).has_value());
    } else {
      CHECK(reset(prefix) == std::nullopt);
    }
  }
}

TEST_CASE("Go's duration strings round-trip through the reset parser, randomized", "[rate_limit_headers]") {
  std::mt19937_64 random(2026);
  for (int i = 0; i < 20000; ++i) {
    // Magnitudes from nanoseconds to centuries, evenly in the number of digits.
    const int digits = static_cast<int>(random() % 19);
    std::int64_t bound = 1;
    for (int k = 0; k < digits; ++k) bound *= 10;
    const auto d = static_cast<std::int64_t>(random() % static_cast<std::uint64_t>(bound));
    const std::string text = go_string(d);
    INFO(text);
    REQUIRE(reset(text) == opt_ns{nanoseconds{d}});
    REQUIRE(rein::parse_reset_duration(text) == opt_ns{nanoseconds{d}});
  }
  CHECK(go_string(6 * 60'000'000'000) == "6m0s");
  CHECK(go_string(3'723'500'000'000) == "1h2m3.5s");
  CHECK(go_string(250'000) == "250\xC2\xB5s");
}

namespace {
// A header lookup as a user would write one over a map of lower-case names.
struct map_lookup {
  std::map<std::string, std::string> fields;
  std::optional<std::string_view> operator()(std::string_view name) const {
    const auto it = fields.find(std::string(name));
    if (it == fields.end()) return std::nullopt;
    return std::string_view(it->second);
  }
};
}  // namespace

// A lookup returning owned strings would hand out views of temporaries: it is refused at compile time.
template <class Lookup>
concept accepted_lookup = requires(Lookup l) { rein::read_response(200, l); };
static_assert(accepted_lookup<map_lookup>);
static_assert(!accepted_lookup<std::optional<std::string> (*)(std::string_view)>);
static_assert(!accepted_lookup<int (*)(std::string_view)>);

TEST_CASE("read_response reads OpenAI's headers", "[rate_limit_headers]") {
  const map_lookup headers{{{"x-ratelimit-limit-requests", "60"},
                            {"x-ratelimit-remaining-requests", "59"},
                            {"x-ratelimit-reset-requests", "1s"},
                            {"x-ratelimit-limit-tokens", "150000"},
                            {"x-ratelimit-remaining-tokens", "149984"},
                            {"x-ratelimit-reset-tokens", "6m0s"}}};
  const rein::upstream_response r = rein::read_response(200, headers, now);
  CHECK(r.status == 200);
  CHECK(r.result == rein::outcome::success);
  CHECK_FALSE(r.too_many_requests);
  CHECK(r.retry_after == std::nullopt);
  CHECK(r.requests.remaining == opt_count{59});
  CHECK(r.requests.reset_after == opt_ns{1s});
  CHECK(r.tokens.remaining == opt_count{149984});
  CHECK(r.tokens.reset_after == opt_ns{6min});
  CHECK(r.requests.usable());
  CHECK(r.dialect == rein::rate_limit_dialect::openai);
  CHECK(r.requests.refill == rein::rate_limit_refill::continuous);  // OpenAI: reset = time until full
  CHECK(r.tokens.refill == rein::rate_limit_refill::continuous);
  CHECK(r.requests.limit == opt_count{60});
  CHECK(r.tokens.limit == opt_count{150000});
}

TEST_CASE("read_response reads Anthropic's headers and a 429's Retry-After", "[rate_limit_headers]") {
  const map_lookup headers{{{"retry-after", "7"},
                            {"anthropic-ratelimit-requests-remaining", "0"},
                            {"anthropic-ratelimit-requests-reset", "2026-12-01T12:00:07.25Z"},
                            {"anthropic-ratelimit-tokens-remaining", "8000"},
                            {"anthropic-ratelimit-tokens-reset", "2026-12-01T12:01:00Z"}}};
  const rein::upstream_response r = rein::read_response(429, headers, now);
  CHECK(r.result == rein::outcome::congestion);
  CHECK(r.too_many_requests);
  CHECK(r.retry_after == opt_ns{7s});
  CHECK(r.requests.remaining == opt_count{0});
  CHECK(r.requests.reset_after == opt_ns{7s});
  CHECK(r.tokens.remaining == opt_count{8000});
  CHECK(r.tokens.reset_after == opt_ns{59750ms});
  CHECK(r.dialect == rein::rate_limit_dialect::anthropic);
  CHECK(r.requests.refill == rein::rate_limit_refill::continuous);
  CHECK(r.requests.limit == std::nullopt);
}

TEST_CASE("read_response: a 503 is too many requests only with a valid Retry-After", "[rate_limit_headers]") {
  CHECK(rein::read_response(503, map_lookup{{{"retry-after", "120"}}}, now).too_many_requests);
  CHECK_FALSE(rein::read_response(503, map_lookup{{{"retry-after", "soon"}}}, now).too_many_requests);
  CHECK_FALSE(rein::read_response(503, map_lookup{}, now).too_many_requests);
  const rein::upstream_response date = rein::read_response(503, map_lookup{{{"retry-after", "Tue, 01 Dec 2026 12:00:10 GMT"}}}, now);
  CHECK(date.retry_after == opt_ns{9750ms});
  CHECK(rein::read_response(429, map_lookup{}, now).too_many_requests);
  CHECK(rein::read_response(404, map_lookup{}, now).result == rein::outcome::ignored);
}

TEST_CASE("read_response: garbage values are absent, never zero, and the OpenAI names win", "[rate_limit_headers]") {
  const map_lookup headers{{{"x-ratelimit-remaining-requests", "lots"},
                            {"x-ratelimit-reset-requests", "2026-13-01T00:00:00Z"},
                            {"x-ratelimit-remaining-tokens", "10"},
                            {"anthropic-ratelimit-tokens-remaining", "20"},
                            {"anthropic-ratelimit-requests-remaining", "5"}}};
  const rein::upstream_response r = rein::read_response(200, headers, now);
  CHECK(r.requests.remaining == std::nullopt);  // the OpenAI field is there, unreadable: no fallback guess
  CHECK(r.requests.reset_after == std::nullopt);
  CHECK(r.tokens.remaining == opt_count{10});
  CHECK(r.tokens.usable());  // a continuous refill needs only the count
  CHECK_FALSE((rein::rate_limit_hint{.remaining = 10}.usable()));  // a window needs its reset too
}

namespace {
// Stands for a limiter that takes upstream corrections; records the call.
struct recording_limiter {
  std::optional<std::pair<std::int64_t, nanoseconds>> called;
  bool limit_remaining(std::int64_t remaining, nanoseconds reset_after) {
    called = {remaining, reset_after};
    return true;
  }
};
}  // namespace

TEST_CASE("limit_remaining applies a window's hint only when both parts are known", "[rate_limit_headers]") {
  recording_limiter l;
  CHECK_FALSE(rein::limit_remaining(l, rein::rate_limit_hint{.remaining = 5}));
  CHECK_FALSE(l.called.has_value());
  CHECK(rein::limit_remaining(l, rein::rate_limit_hint{.remaining = 5, .reset_after = 2s}));
  REQUIRE(l.called.has_value());
  CHECK(l.called->first == 5);
  CHECK(l.called->second == 2s);
}

TEST_CASE("limit_remaining applies a continuous refill as the count now, with no reset", "[rate_limit_headers]") {
  recording_limiter l;
  const rein::rate_limit_hint hint{.remaining = 5, .reset_after = 6min, .refill = rein::rate_limit_refill::continuous};
  CHECK(rein::limit_remaining(l, hint));
  REQUIRE(l.called.has_value());
  CHECK(l.called->first == 5);
  CHECK(l.called->second == 0s);  // "6 minutes until full" is no window: no debt for it
  l.called.reset();
  CHECK(rein::limit_remaining(l, rein::rate_limit_hint{.remaining = 7, .refill = rein::rate_limit_refill::continuous}));
  CHECK(l.called == std::optional<std::pair<std::int64_t, nanoseconds>>{{7, 0s}});
}

TEST_CASE("limit_remaining: a window that resets now changes nothing", "[rate_limit_headers]") {
  recording_limiter l;
  CHECK_FALSE(rein::limit_remaining(l, rein::rate_limit_hint{.remaining = 0, .reset_after = 0s}));
  CHECK_FALSE(l.called.has_value());
}

TEST_CASE("detect picks the dialect from the fields present, in a fixed order", "[rate_limit_headers][dialect]") {
  using rein::rate_limit_dialect;
  const auto dialect = [](map_lookup headers) { return rein::read_response(200, headers, now).dialect; };
  CHECK(dialect({}) == rate_limit_dialect::none);
  CHECK(dialect({{{"x-ratelimit-remaining-tokens", "1"}}}) == rate_limit_dialect::openai);
  CHECK(dialect({{{"anthropic-ratelimit-requests-remaining", "1"}}}) == rate_limit_dialect::anthropic);
  CHECK(dialect({{{"ratelimit", "\"d\";r=1;t=2"}}}) == rate_limit_dialect::ietf);
  CHECK(dialect({{{"ratelimit-remaining", "1"}}}) == rate_limit_dialect::ietf);
  CHECK(dialect({{{"x-ratelimit-remaining", "1"}}}) == rate_limit_dialect::github);
  CHECK(dialect({{{"x-ratelimit-remaining", "1"}, {"ratelimit", "\"d\";r=1;t=2"}}}) == rate_limit_dialect::ietf);
  CHECK(dialect({{{"x-ratelimit-remaining-requests", "1"}, {"anthropic-ratelimit-requests-remaining", "1"}}}) ==
        rate_limit_dialect::openai);
}

TEST_CASE("a pinned dialect reads only its own fields", "[rate_limit_headers][dialect]") {
  const map_lookup headers{{{"x-ratelimit-remaining", "4"},
                            {"x-ratelimit-reset", "30"},
                            {"x-ratelimit-remaining-requests", "9"},
                            {"x-ratelimit-reset-requests", "1s"}}};
  const rein::upstream_response github = rein::read_response(200, headers, rein::rate_limit_dialect::github, now);
  CHECK(github.dialect == rein::rate_limit_dialect::github);
  CHECK(github.requests.remaining == opt_count{4});
  CHECK(github.requests.reset_after == opt_ns{30s});
  const rein::upstream_response none = rein::read_response(429, headers, rein::rate_limit_dialect::none, now);
  CHECK(none.too_many_requests);
  CHECK(none.requests.remaining == std::nullopt);
  CHECK(none.tokens.remaining == std::nullopt);
}

TEST_CASE("GitHub-style: a window with the reset in epoch seconds", "[rate_limit_headers][dialect]") {
  // now is 2026-12-01T12:00:00.25Z = 1796126400 s + 250 ms after the epoch.
  const map_lookup headers{{{"x-ratelimit-limit", "5000"},
                            {"x-ratelimit-remaining", "4987"},
                            {"x-ratelimit-used", "13"},
                            {"x-ratelimit-reset", "1796126460"}}};
  const rein::upstream_response r = rein::read_response(200, headers, now);
  CHECK(r.dialect == rein::rate_limit_dialect::github);
  CHECK(r.requests.refill == rein::rate_limit_refill::window);
  CHECK(r.requests.limit == opt_count{5000});
  CHECK(r.requests.remaining == opt_count{4987});
  CHECK(r.requests.reset_after == opt_ns{59750ms});
  CHECK(r.tokens.remaining == std::nullopt);
  // An epoch already past resets now; a small integer is delta-seconds; garbage is absent.
  const auto reset_of = [](std::string value) {
    return rein::read_response(200, map_lookup{{{"x-ratelimit-remaining", "1"}, {"x-ratelimit-reset", value}}}, now)
        .requests.reset_after;
  };
  CHECK(reset_of("1796126399") == opt_ns{0s});
  CHECK(reset_of("1000000000") == opt_ns{0s});
  CHECK(reset_of("999999999") == opt_ns{999999999s});
  CHECK(reset_of(" 45 ") == opt_ns{45s});
  CHECK(reset_of("1.5") == opt_ns{1500ms});
  CHECK(reset_of("1796126460.5") == opt_ns{60250ms});  // an epoch with a fraction
  CHECK(reset_of("1796126460.") == std::nullopt);
  CHECK(reset_of("-3") == std::nullopt);
  CHECK(reset_of("soon") == std::nullopt);
}

TEST_CASE("IETF RateLimit fields: the list form, the fewest remaining counts", "[rate_limit_headers][dialect]") {
  const map_lookup headers{{{"ratelimit", "\"day\";r=900;t=40000, \"burst\";r=3;t=7;pk=:YWJj:"},
                            {"ratelimit-policy", "\"burst\";q=10;w=60, \"day\";q=1000;w=86400"}}};
  const rein::upstream_response r = rein::read_response(200, headers, now);
  CHECK(r.dialect == rein::rate_limit_dialect::ietf);
  CHECK(r.requests.refill == rein::rate_limit_refill::window);
  CHECK(r.requests.remaining == opt_count{3});
  CHECK(r.requests.reset_after == opt_ns{7s});
  CHECK(r.requests.limit == opt_count{10});  // the policy of the same name
  CHECK(r.tokens.remaining == std::nullopt);
  // A comma or semicolon inside a quoted name does not split it.
  const rein::upstream_response quoted =
      rein::read_response(200, map_lookup{{{"ratelimit", "\"a,b;c\";r=5;t=1"}}}, now);
  CHECK(quoted.requests.remaining == opt_count{5});
  CHECK(quoted.requests.reset_after == opt_ns{1s});
  CHECK(quoted.requests.limit == std::nullopt);
  // Nor does an `=` inside a quoted name make it a dictionary member.
  const rein::upstream_response equals =
      rein::read_response(200, map_lookup{{{"ratelimit", "\"a=b\";r=4;t=2"}, {"ratelimit-policy", "\"a=b\";q=8;w=2"}}}, now);
  CHECK(equals.requests.remaining == opt_count{4});
  CHECK(equals.requests.reset_after == opt_ns{2s});
  CHECK(equals.requests.limit == opt_count{8});
}

TEST_CASE("IETF RateLimit fields: the older dictionary and separate-field forms", "[rate_limit_headers][dialect]") {
  const rein::upstream_response dictionary = rein::read_response(
      200, map_lookup{{{"ratelimit", "limit=100, remaining=50, reset=30"}, {"ratelimit-policy", "100;w=60"}}}, now);
  CHECK(dictionary.requests.remaining == opt_count{50});
  CHECK(dictionary.requests.reset_after == opt_ns{30s});
  CHECK(dictionary.requests.limit == opt_count{100});
  // A nameless count takes the first policy's quota, even when that policy states none.
  const rein::upstream_response first_policy = rein::read_response(
      200, map_lookup{{{"ratelimit", "limit=100, remaining=50, reset=30"}, {"ratelimit-policy", "w=60, 100;w=60"}}}, now);
  CHECK(first_policy.requests.limit == opt_count{100});  // the dictionary's own limit
  const rein::upstream_response behind_a_key = rein::read_response(
      200, map_lookup{{{"ratelimit", "remaining=50, reset=30"}, {"ratelimit-policy", "w=60, 100;w=60"}}}, now);
  CHECK(behind_a_key.requests.limit == opt_count{100});  // `w=60` alone is no policy
  const rein::upstream_response no_limit = rein::read_response(
      200, map_lookup{{{"ratelimit", "remaining=50, reset=30"}, {"ratelimit-policy", "\"x\";w=60, 100;w=60"}}}, now);
  CHECK(no_limit.requests.remaining == opt_count{50});
  CHECK(no_limit.requests.limit == std::nullopt);  // the first policy states no quota
  const rein::upstream_response separate = rein::read_response(
      200,
      map_lookup{{{"ratelimit-limit", "10, 10;w=1, 1000;w=3600"}, {"ratelimit-remaining", "0"}, {"ratelimit-reset", "2"}}},
      now);
  CHECK(separate.dialect == rein::rate_limit_dialect::ietf);
  CHECK(separate.requests.remaining == opt_count{0});
  CHECK(separate.requests.reset_after == opt_ns{2s});
  CHECK(separate.requests.limit == opt_count{10});
  CHECK(separate.requests.usable());
  // Malformed parameters are absent, never zero.
  const rein::upstream_response bad =
      rein::read_response(200, map_lookup{{{"ratelimit", "\"d\";r=-1;t=x, \"e\";t=5"}}}, now);
  CHECK(bad.requests.remaining == std::nullopt);
  CHECK_FALSE(bad.requests.usable());
}
