// What an upstream's response says about its limits: the status as an outcome, Retry-After, and the
// remaining/reset counts of OpenAI- and Anthropic-style rate-limit headers. Pure functions over a header
// lookup, so any HTTP library can feed them (rein/beast.hpp does it for Boost.Beast); no locale, no
// allocation, no exceptions on any input.
#pragma once

#include <rein/outcome.hpp>
#include <rein/retry_after.hpp>

#include <chrono>
#include <concepts>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <type_traits>

namespace rein {

/// What an upstream says about one of its budgets (requests or tokens): how many units it will still admit,
/// and how long until its count resets. Either may be absent (header missing or unreadable).
struct rate_limit_hint {
  std::optional<std::int64_t> remaining{};                ///< units left before the reset, >= 0
  std::optional<std::chrono::nanoseconds> reset_after{};  ///< time from the response until the reset, >= 0

  /// Both parts are known, so the hint can correct a local limit (see rein::limit_remaining).
  bool usable() const noexcept { return remaining.has_value() && reset_after.has_value(); }
};

/// One upstream response, read for what a limiter needs: the outcome for adaptive limits, whether the
/// upstream asked the caller to back off and for how long, and its remaining budgets.
struct upstream_response {
  int status = 0;                                        ///< the HTTP status code
  outcome result = outcome::ignored;                     ///< rein::classify_http_status(status)
  bool too_many_requests = false;                        ///< a 429, or a 503 that carries a valid Retry-After
  std::optional<std::chrono::nanoseconds> retry_after{};  ///< Retry-After (rein::parse_retry_after), >= 0
  rate_limit_hint requests{};                            ///< `x-ratelimit-*-requests`
  rate_limit_hint tokens{};                              ///< `x-ratelimit-*-tokens`
};

namespace detail::rate_limit_headers {

namespace ra = detail::retry_after;

inline constexpr std::int64_t ns_per_second = 1'000'000'000;

// The upstream's instant: whole seconds of UTC plus nanoseconds in [0, 1 s] (1 s when a fraction beyond the
// ninth digit rounded up to the next second; kept apart so that years far from 1970 do not overflow).
struct instant {
  std::chrono::sys_seconds seconds;
  std::int64_t nanoseconds;
};

constexpr bool is_time_separator(char c) noexcept { return c == 'T' || c == 't' || c == ' '; }

// RFC 3339 section 5.6 date-time: "2026-12-01T12:00:00Z", "2026-12-01T12:00:00.250Z",
// "2026-12-01T14:00:00+02:00". The date must exist, hour 00-23, minute 00-59, second 00-60 (a leap second
// reads as the next minute's first), offset hours 00-23 and minutes 00-59.
inline std::optional<instant> rfc3339(std::string_view s) noexcept {
  if (s.size() < 20 || !is_time_separator(s[10])) return std::nullopt;
  ra::date_fields f;
  ra::date_reader date{s.substr(0, 10)};
  if (!(date.number(4, f.year) && date.literal("-") && date.number(2, f.month) && date.literal("-") &&
        date.number(2, f.day) && date.at_end())) {
    return std::nullopt;
  }
  ra::date_reader clock{s.substr(11, 8)};
  if (!(ra::time_of_day(clock, f) && clock.at_end())) return std::nullopt;
  std::string_view rest = s.substr(19);
  std::int64_t nanoseconds = 0;
  if (!rest.empty() && rest.front() == '.') {
    rest.remove_prefix(1);
    const std::string_view fraction = ra::take_digits(rest);
    if (fraction.empty()) return std::nullopt;
    nanoseconds = ra::scaled_ceil({}, fraction, 1, 9);
  }
  // The offset is required: "Z" (UTC) or +hh:mm / -hh:mm east of UTC.
  std::int64_t offset = 0;
  if (rest != "Z" && rest != "z") {
    if (rest.empty() || (rest.front() != '+' && rest.front() != '-')) return std::nullopt;
    const bool east = rest.front() == '+';
    int hours = 0, minutes = 0;
    ra::date_reader zone{rest.substr(1)};
    if (!(zone.number(2, hours) && zone.literal(":") && zone.number(2, minutes) && zone.at_end()) || hours > 23 ||
        minutes > 59) {
      return std::nullopt;
    }
    offset = (east ? 1 : -1) * (hours * 3600 + minutes * 60);
  }
  const std::optional<std::chrono::sys_seconds> local = ra::to_time(f);
  if (!local) return std::nullopt;
  return instant{*local - std::chrono::seconds{offset}, nanoseconds};
}

// Non-negative nanoseconds from `now` until `at`, saturating; zero for an instant not after `now`.
inline std::chrono::nanoseconds until(const instant& at, std::chrono::system_clock::time_point now) noexcept {
  using namespace std::chrono;
  const auto [now_seconds, rest] = ra::split<seconds>(now);
  const std::int64_t whole = at.seconds.time_since_epoch().count() - now_seconds.count();
  const std::int64_t part = at.nanoseconds - duration_cast<nanoseconds>(rest).count();  // (-1 s, 1 s]
  if (whole < 0 || (whole == 0 && part <= 0)) return nanoseconds{0};
  if (whole >= ra::max_ns / ns_per_second - 1) return nanoseconds{ra::max_ns};
  const std::int64_t total = whole * ns_per_second + part;
  return nanoseconds{total > 0 ? total : 0};
}

constexpr bool is_decimal(std::string_view s) noexcept {
  for (const char c : s)
    if (!ra::is_digit(c) && c != '.') return false;
  return !s.empty();
}

// The value of the first of two names that the lookup finds.
template <class Lookup>
std::optional<std::string_view> first_of(Lookup& lookup, std::string_view a, std::string_view b) {
  if (const std::optional<std::string_view> value = lookup(a)) return value;
  return lookup(b);
}

}  // namespace detail::rate_limit_headers

/// Parses a remaining-count header value (`x-ratelimit-remaining-requests: 59`,
/// `x-ratelimit-remaining-tokens: 149984`, Anthropic's `anthropic-ratelimit-tokens-remaining`).
///
/// Grammar: one or more decimal digits, with surrounding whitespace ignored. Values beyond `int64_t`
/// saturate at its maximum. Anything else (empty, a sign, a fraction, a unit, garbage) gives nullopt, never
/// zero, so an unreadable header never reads as "nothing left". Never throws.
/// @returns the count (>= 0), or nullopt.
inline std::optional<std::int64_t> parse_rate_limit_count(std::string_view value) noexcept {
  namespace ra = detail::retry_after;
  std::string_view s = ra::trim(value);
  const std::string_view digits = ra::take_digits(s);
  if (digits.empty() || !s.empty()) return std::nullopt;
  return ra::digits_value(digits);  // saturates at INT64_MAX
}

/// Parses a reset header value into the time from `now` until the upstream's count resets, accepting the
/// three forms providers send:
/// - a Go duration, as OpenAI documents for `x-ratelimit-reset-requests` / `-tokens`: `6m0s`, `1s`, `20ms`,
///   `1h2m3.5s`, `0s`, `250us` (Go's time.ParseDuration grammar; see rein::parse_reset_duration);
/// - delta-seconds, as in Retry-After (RFC 9110 section 10.2.3): `30`, also with a fraction `1.5`;
/// - an RFC 3339 timestamp, as Anthropic documents for `anthropic-ratelimit-*-reset`:
///   `2026-12-01T12:00:00Z`, with fractional seconds (`...:00.250Z`) and numeric offsets (`+02:00`,
///   `-05:30`; `-00:00` is UTC); `T` may be written `t` or a space, `Z` as `z` (RFC 3339 section 5.6).
///
/// Results: the delay, >= 0 (a timestamp at or before `now` gives zero); fractions beyond the nanosecond
/// round up, never down; values beyond the range of `nanoseconds` (about 292 years) saturate at
/// `nanoseconds::max()`; nullopt for anything malformed (an impossible date, a missing unit such as `5m3`,
/// a negative value, garbage). Surrounding whitespace is ignored. Never throws.
///
/// @param value the field value, as received.
/// @param now   the recipient's current time, the origin of a timestamp's delay.
inline std::optional<std::chrono::nanoseconds> parse_rate_limit_reset(std::string_view value,
                                                                      std::chrono::system_clock::time_point now) noexcept {
  namespace d = detail::rate_limit_headers;
  const std::string_view s = detail::retry_after::trim(value);
  if (s.size() >= 20 && s[4] == '-') {
    const auto at = d::rfc3339(s);
    if (!at) return std::nullopt;
    return d::until(*at, now);
  }
  if (d::is_decimal(s)) return detail::retry_after::delta_seconds(s);
  return parse_reset_duration(s);
}

/// Reads a response's status and headers into an upstream_response.
///
/// - `result` is rein::classify_http_status(status); `retry_after` is rein::parse_retry_after of the
///   `retry-after` field (RFC 9110 section 10.2.3); `too_many_requests` is a 429, or a 503 with a valid
///   Retry-After (the server asked to be left alone for a while).
/// - `requests` and `tokens` come from OpenAI's documented headers `x-ratelimit-remaining-requests`,
///   `x-ratelimit-remaining-tokens`, `x-ratelimit-reset-requests`, `x-ratelimit-reset-tokens`, and, where
///   those are absent, Anthropic's `anthropic-ratelimit-requests-remaining`, `-requests-reset`,
///   `-tokens-remaining`, `-tokens-reset`; counts by rein::parse_rate_limit_count, resets by
///   rein::parse_rate_limit_reset (relative to `now`).
///
/// Unreadable values are absent, never zero; nothing here throws unless the lookup does.
///
/// @param status the HTTP status code.
/// @param header any callable `header(std::string_view name)` returning `std::optional<std::string_view>`
///               (the field's value, or nullopt if absent). Names are passed in lower case; the lookup should
///               match them case-insensitively, as HTTP field names are (RFC 9110 section 5.1). The views
///               must stay valid until this function returns (so an owning `std::optional<std::string>`,
///               whose view would dangle, is not accepted).
/// @param now    the recipient's current time (system_clock, as HTTP dates and timestamps are).
template <class Lookup>
  requires std::same_as<std::remove_cvref_t<std::invoke_result_t<Lookup&, std::string_view>>,
                        std::optional<std::string_view>>
upstream_response read_response(int status, Lookup&& header,
                                std::chrono::system_clock::time_point now = std::chrono::system_clock::now()) {
  namespace d = detail::rate_limit_headers;
  auto lookup = [&header](std::string_view name) -> std::optional<std::string_view> { return header(name); };
  upstream_response r;
  r.status = status;
  r.result = classify_http_status(status);
  if (const auto value = lookup("retry-after")) r.retry_after = parse_retry_after(*value, now);
  r.too_many_requests = status == 429 || (status == 503 && r.retry_after.has_value());
  const auto count = [](std::optional<std::string_view> v) { return v ? parse_rate_limit_count(*v) : std::nullopt; };
  const auto reset = [now](std::optional<std::string_view> v) {
    return v ? parse_rate_limit_reset(*v, now) : std::nullopt;
  };
  r.requests.remaining = count(d::first_of(lookup, "x-ratelimit-remaining-requests", "anthropic-ratelimit-requests-remaining"));
  r.requests.reset_after = reset(d::first_of(lookup, "x-ratelimit-reset-requests", "anthropic-ratelimit-requests-reset"));
  r.tokens.remaining = count(d::first_of(lookup, "x-ratelimit-remaining-tokens", "anthropic-ratelimit-tokens-remaining"));
  r.tokens.reset_after = reset(d::first_of(lookup, "x-ratelimit-reset-tokens", "anthropic-ratelimit-tokens-reset"));
  return r;
}

/// Applies a hint to a limiter that takes upstream corrections (rein::basic_rate_limiter over a token
/// bucket, an adaptive rate, a sliding window): `limiter.limit_remaining(*hint.remaining,
/// *hint.reset_after)` when both parts are known, which lowers the limiter so that until the reset it
/// admits at most what the upstream said, and never raises it.
/// @returns true if the limiter was lowered; false if the hint is incomplete or changed nothing.
template <class Limiter>
  requires requires(Limiter& l, std::int64_t n, std::chrono::nanoseconds d) {
    { l.limit_remaining(n, d) } -> std::convertible_to<bool>;
  }
bool limit_remaining(Limiter& limiter, const rate_limit_hint& hint) {
  if (!hint.usable()) return false;
  return limiter.limit_remaining(*hint.remaining, *hint.reset_after);
}

}  // namespace rein
