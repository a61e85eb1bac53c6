// What an upstream's response says about its limits: the status as an outcome, Retry-After, and the
// remaining/reset counts of the rate-limit header dialects providers send (OpenAI, Anthropic, GitHub-style
// windows, the IETF RateLimit fields), each read in its provider's documented meaning. Pure functions over a
// header lookup, so any HTTP library can feed them (rein/beast.hpp does it for Boost.Beast); no locale, no
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

/// How an upstream's budget comes back, which decides what its remaining count promises.
enum class rate_limit_refill : std::uint8_t {
  /// A window: `remaining` more units until the reset, then the whole quota at once (GitHub's
  /// `x-ratelimit-reset`, the IETF RateLimit fields). Until `reset_after` at most `remaining` are admitted.
  window,
  /// A token bucket that refills all the time (OpenAI and Anthropic document theirs so): `remaining` units
  /// now, more arriving at the quota's rate; `reset_after` is the time until the bucket is full again, not
  /// a moment before which nothing comes back. Only `remaining` constrains the next calls.
  continuous,
};

/// What an upstream says about one of its budgets (requests or tokens): how many units it will still admit,
/// how long until its count resets (or, for a continuous refill, until it is full), and in which meaning.
/// Either count may be absent (header missing or unreadable).
struct rate_limit_hint {
  std::optional<std::int64_t> remaining{};                ///< units left now, >= 0
  std::optional<std::chrono::nanoseconds> reset_after{};  ///< time from the response until the reset (window) or until full (continuous), >= 0
  std::optional<std::int64_t> limit{};                    ///< the quota's size, where the provider states it, >= 0
  rate_limit_refill refill = rate_limit_refill::window;   ///< the meaning of `remaining` and `reset_after`

  /// The hint can correct a local limit (see rein::limit_remaining): a window needs both the count and the
  /// reset; a continuous refill only the count.
  bool usable() const noexcept {
    return remaining.has_value() && (refill == rate_limit_refill::continuous || reset_after.has_value());
  }
};

/// Whose rate-limit headers a response carries; each is read in its provider's documented meaning.
///
/// | dialect | fields | remaining | reset | refill |
/// |---|---|---|---|---|
/// | `openai` | `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` | a count | a Go duration (`6m0s`): time until full | continuous |
/// | `anthropic` | `anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}` | a count | an RFC 3339 instant when full | continuous |
/// | `github` | `x-ratelimit-{limit,remaining,reset}` | a count | epoch seconds (values below 10^9 read as delta-seconds) | window |
/// | `ietf` | `RateLimit` / `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers: `"p";r=50;t=30` and `"p";q=100;w=60`; the older `limit=, remaining=, reset=` and `RateLimit-Remaining` / `-Reset` / `-Limit` forms too) | `r` / `remaining` | `t` / `reset`, delta-seconds | window |
///
/// The GitHub and IETF budgets are read as requests (`upstream_response::requests`). Of several IETF
/// policies in one field, the one with the fewest remaining units counts.
enum class rate_limit_dialect : std::uint8_t {
  /// From the fields present, in this order: OpenAI, Anthropic, IETF, GitHub, none.
  detect,
  openai,     ///< OpenAI's `x-ratelimit-*-requests` / `-tokens`
  anthropic,  ///< Anthropic's `anthropic-ratelimit-*`
  github,     ///< a fixed window with an epoch reset: `x-ratelimit-remaining` / `x-ratelimit-reset`
  ietf,       ///< the IETF `RateLimit` and `RateLimit-Policy` fields
  none,       ///< no rate-limit headers read (status and Retry-After only)
};

/// One upstream response, read for what a limiter needs: the outcome for adaptive limits, whether the
/// upstream asked the caller to back off and for how long, and its remaining budgets.
struct upstream_response {
  int status = 0;                                        ///< the HTTP status code
  outcome result = outcome::ignored;                     ///< rein::classify_http_status(status)
  bool too_many_requests = false;                        ///< a 429, or a 503 that carries a valid Retry-After
  std::optional<std::chrono::nanoseconds> retry_after{};  ///< Retry-After (rein::parse_retry_after), >= 0
  rate_limit_dialect dialect = rate_limit_dialect::none;  ///< the dialect read (never `detect`)
  rate_limit_hint requests{};                            ///< the request budget
  rate_limit_hint tokens{};                              ///< the token budget (OpenAI, Anthropic)
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
    offset = (east ? 1 : -1) * (std::int64_t{hours} * 3600 + std::int64_t{minutes} * 60);
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

namespace detail::rate_limit_headers {

template <class Lookup>
bool has(Lookup& lookup, std::string_view name) {
  return lookup(name).has_value();
}

template <class Lookup>
rate_limit_dialect detect(Lookup& lookup) {
  if (has(lookup, "x-ratelimit-remaining-requests") || has(lookup, "x-ratelimit-remaining-tokens")) {
    return rate_limit_dialect::openai;
  }
  if (has(lookup, "anthropic-ratelimit-requests-remaining") || has(lookup, "anthropic-ratelimit-tokens-remaining")) {
    return rate_limit_dialect::anthropic;
  }
  if (has(lookup, "ratelimit") || has(lookup, "ratelimit-remaining")) return rate_limit_dialect::ietf;
  if (has(lookup, "x-ratelimit-remaining")) return rate_limit_dialect::github;
  return rate_limit_dialect::none;
}

inline std::optional<std::int64_t> count_of(std::optional<std::string_view> value) noexcept {
  return value ? parse_rate_limit_count(*value) : std::nullopt;
}

// One budget spelt as three fields (limit, remaining, reset), the reset read by `reset`.
template <class Lookup, class Reset>
rate_limit_hint read_budget(Lookup& lookup, std::string_view limit, std::string_view remaining, std::string_view reset,
                            rate_limit_refill refill, Reset read_reset) {
  rate_limit_hint h;
  h.refill = refill;
  h.limit = count_of(lookup(limit));
  h.remaining = count_of(lookup(remaining));
  if (const auto value = lookup(reset)) h.reset_after = read_reset(*value);
  return h;
}

// GitHub's `x-ratelimit-reset` is the window's end in epoch seconds; others who reuse the name send
// delta-seconds, and some an epoch with a fraction ("1796126460.5"). A whole part of ten digits or more (from
// 2001-09-09 on) can only be an epoch.
inline std::optional<std::chrono::nanoseconds> epoch_or_delta(std::string_view value,
                                                              std::chrono::system_clock::time_point now) noexcept {
  namespace ra = detail::retry_after;
  const std::string_view s = ra::trim(value);
  std::string_view rest = s;
  const std::string_view whole = ra::take_digits(rest);
  std::string_view fraction;
  if (!rest.empty() && rest.front() == '.') {
    rest.remove_prefix(1);
    fraction = ra::take_digits(rest);
    if (fraction.empty()) return std::nullopt;
  }
  if (whole.empty() || !rest.empty() || ra::digits_value(whole) < 1'000'000'000) return parse_rate_limit_reset(s, now);
  const std::chrono::nanoseconds until = ra::until(std::chrono::sys_seconds{std::chrono::seconds{ra::digits_value(whole)}}, now);
  if (until.count() == 0 || fraction.empty()) return until;  // an instant past stays past
  const std::int64_t part = ra::scaled_ceil({}, fraction, 1, 9);
  return std::chrono::nanoseconds{ra::saturating_add(until.count(), part)};
}

// The next part of `s` up to `separator` outside a quoted string (structured fields, RFC 8941); `s` keeps
// what follows the separator.
constexpr std::string_view next_part(std::string_view& s, char separator) noexcept {
  bool quoted = false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (quoted && s[i] == '\\') {
      ++i;
    } else if (s[i] == '"') {
      quoted = !quoted;
    } else if (s[i] == separator && !quoted) {
      const std::string_view part = s.substr(0, i);
      s.remove_prefix(i + 1);
      return detail::retry_after::trim(part);
    }
  }
  const std::string_view part = s;
  s = {};
  return detail::retry_after::trim(part);
}

// `key=value` of a parameter or dictionary member; the key empty if there is no `=` before any quote (a
// quoted item such as `"a=b"` is a name, not a key).
struct key_value {
  std::string_view key, value;
};

constexpr key_value split_key(std::string_view part) noexcept {
  const std::size_t eq = part.find('=');
  if (eq != std::string_view::npos && part.find('"') < eq) return {{}, part};
  if (eq == std::string_view::npos) return {{}, part};
  return {detail::retry_after::trim(part.substr(0, eq)), detail::retry_after::trim(part.substr(eq + 1))};
}

// An IETF RateLimit member: its name (the item, quotes kept) and the parameters rein reads.
struct ietf_member {
  std::string_view name;
  std::optional<std::int64_t> remaining, reset_seconds, quota;
};

// Reads one list member `"name";r=50;t=30` (or a policy `"name";q=100;w=60`). A member that is itself
// `key=value` is a dictionary member of the older draft form (`limit=100, remaining=50, reset=30`): it fills
// `older` instead.
inline ietf_member read_member(std::string_view member, ietf_member& older) noexcept {
  ietf_member m;
  const key_value head = split_key(next_part(member, ';'));
  if (!head.key.empty()) {
    const std::optional<std::int64_t> value = parse_rate_limit_count(head.value);
    if (head.key == "remaining") older.remaining = value;
    else if (head.key == "reset") older.reset_seconds = value;
    else if (head.key == "limit") older.quota = value;
    return m;
  }
  m.name = head.value;
  if (const auto quota = parse_rate_limit_count(head.value)) m.quota = quota;  // the older policy `100;w=60`
  while (!member.empty()) {
    const key_value param = split_key(next_part(member, ';'));
    const std::optional<std::int64_t> value = parse_rate_limit_count(param.value);
    if (param.key == "r") m.remaining = value;
    else if (param.key == "t") m.reset_seconds = value;
    else if (param.key == "q") m.quota = value;
  }
  return m;
}

inline std::optional<std::chrono::nanoseconds> seconds_of(std::optional<std::int64_t> seconds) noexcept {
  if (!seconds) return std::nullopt;
  if (*seconds > ra::max_ns / ns_per_second) return std::chrono::nanoseconds{ra::max_ns};
  return std::chrono::nanoseconds{*seconds * ns_per_second};
}

// The quota of the policy named `name` (or the first policy if the field names none).
inline std::optional<std::int64_t> policy_quota(std::optional<std::string_view> field, std::string_view name) noexcept {
  if (!field) return std::nullopt;
  std::string_view rest = *field;
  std::optional<std::optional<std::int64_t>> first;
  ietf_member unused;
  while (!rest.empty()) {
    const ietf_member policy = read_member(next_part(rest, ','), unused);
    if (policy.name.empty()) continue;  // a `key=value` member is no policy
    if (!name.empty() && policy.name == name) return policy.quota;
    if (!first) first = policy.quota;
  }
  return name.empty() && first ? *first : std::nullopt;
}

// The IETF fields: the `RateLimit` list (the member with the fewest remaining units), the older dictionary
// form, or the separate `RateLimit-Remaining` / `-Reset` / `-Limit` fields of the first drafts.
template <class Lookup>
rate_limit_hint read_ietf(Lookup& lookup) {
  rate_limit_hint h;  // a window
  if (const auto field = lookup("ratelimit")) {
    std::string_view rest = *field;
    ietf_member older, best;
    while (!rest.empty()) {
      const ietf_member m = read_member(next_part(rest, ','), older);
      if (m.remaining && (!best.remaining || *m.remaining < *best.remaining)) best = m;
    }
    if (!best.remaining) best = older;
    h.remaining = best.remaining;
    h.reset_after = seconds_of(best.reset_seconds);
    h.limit = best.quota ? best.quota : policy_quota(lookup("ratelimit-policy"), best.name);
    return h;
  }
  h.remaining = count_of(lookup("ratelimit-remaining"));
  h.reset_after = seconds_of(count_of(lookup("ratelimit-reset")));
  if (const auto limit = lookup("ratelimit-limit")) {
    std::string_view rest = *limit;
    h.limit = parse_rate_limit_count(next_part(rest, ','));  // "100, 100;w=60": the first is the quota
  }
  return h;
}

template <class Lookup>
void read_budgets(upstream_response& r, Lookup& lookup, std::chrono::system_clock::time_point now) {
  using refill = rate_limit_refill;
  const auto reset = [now](std::string_view v) { return parse_rate_limit_reset(v, now); };
  switch (r.dialect) {
    case rate_limit_dialect::openai:
      r.requests = read_budget(lookup, "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
                               "x-ratelimit-reset-requests", refill::continuous, reset);
      r.tokens = read_budget(lookup, "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens",
                             "x-ratelimit-reset-tokens", refill::continuous, reset);
      break;
    case rate_limit_dialect::anthropic:
      r.requests = read_budget(lookup, "anthropic-ratelimit-requests-limit", "anthropic-ratelimit-requests-remaining",
                               "anthropic-ratelimit-requests-reset", refill::continuous, reset);
      r.tokens = read_budget(lookup, "anthropic-ratelimit-tokens-limit", "anthropic-ratelimit-tokens-remaining",
                             "anthropic-ratelimit-tokens-reset", refill::continuous, reset);
      break;
    case rate_limit_dialect::github:
      r.requests = read_budget(lookup, "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", refill::window,
                               [now](std::string_view v) { return epoch_or_delta(v, now); });
      break;
    case rate_limit_dialect::ietf:
      r.requests = read_ietf(lookup);
      break;
    case rate_limit_dialect::detect:
    case rate_limit_dialect::none:
      break;
  }
}

}  // namespace detail::rate_limit_headers

/// A callable `header(std::string_view name)` returning the field's value as `std::optional<std::string_view>`
/// (nullopt if absent); the views must stay valid until the reader returns (so an owning
/// `std::optional<std::string>`, whose view would dangle, is not one).
template <class Lookup>
concept header_lookup =
    std::same_as<std::remove_cvref_t<std::invoke_result_t<Lookup&, std::string_view>>, std::optional<std::string_view>>;

/// Reads a response's status and headers into an upstream_response, in the given header dialect.
///
/// - `result` is rein::classify_http_status(status); `retry_after` is rein::parse_retry_after of the
///   `retry-after` field (RFC 9110 section 10.2.3); `too_many_requests` is a 429, or a 503 with a valid
///   Retry-After (the server asked to be left alone for a while).
/// - `requests` and `tokens` are the budgets of `dialect` (see rein::rate_limit_dialect for each one's
///   fields and meaning), with `refill` set to its provider's documented meaning: OpenAI and Anthropic refill
///   continuously and their reset is the time until full, GitHub-style and IETF counts hold until a
///   window's reset. `detect` picks the dialect from the fields present; `dialect` says which was read.
///   Counts by rein::parse_rate_limit_count, resets by rein::parse_rate_limit_reset (relative to `now`).
///
/// Unreadable values are absent, never zero, and a dialect's fields are never filled from another's;
/// nothing here throws unless the lookup does.
///
/// @param status  the HTTP status code.
/// @param header  any callable `header(std::string_view name)` returning `std::optional<std::string_view>`
///                (the field's value, or nullopt if absent). Names are passed in lower case; the lookup should
///                match them case-insensitively, as HTTP field names are (RFC 9110 section 5.1). The views
///                must stay valid until this function returns (so an owning `std::optional<std::string>`,
///                whose view would dangle, is not accepted).
/// @param dialect whose headers to read; pin it per host when a provider's fields could be mistaken for
///                another's (a GitHub-style server sending `x-ratelimit-remaining` is never read as OpenAI).
/// @param now     the recipient's current time (system_clock, as HTTP dates and timestamps are).
template <header_lookup Lookup>
upstream_response read_response(int status, Lookup&& header, rate_limit_dialect dialect,
                                std::chrono::system_clock::time_point now = std::chrono::system_clock::now()) {
  namespace d = detail::rate_limit_headers;
  auto lookup = [&header](std::string_view name) -> std::optional<std::string_view> { return header(name); };
  upstream_response r;
  r.status = status;
  r.result = classify_http_status(status);
  if (const auto value = lookup("retry-after")) r.retry_after = parse_retry_after(*value, now);
  r.too_many_requests = status == 429 || (status == 503 && r.retry_after.has_value());
  r.dialect = dialect == rate_limit_dialect::detect ? d::detect(lookup) : dialect;
  d::read_budgets(r, lookup, now);
  return r;
}

/// As read_response(status, header, dialect, now) with the dialect detected from the fields present.
template <header_lookup Lookup>
upstream_response read_response(int status, Lookup&& header,
                                std::chrono::system_clock::time_point now = std::chrono::system_clock::now()) {
  return read_response(status, header, rate_limit_dialect::detect, now);
}

/// Applies a hint to a limiter that takes upstream corrections (rein::basic_rate_limiter over a token
/// bucket, an adaptive rate, a sliding or fixed window) in the hint's meaning, never raising the limiter:
/// - a window (`rate_limit_refill::window`): `limiter.limit_remaining(remaining, reset_after)`, so that until
///   the reset it admits at most `remaining` more (a token bucket caps itself until then, and goes on from
///   its own balance at the reset); a reset of 0 (now, or already past) changes nothing;
/// - a continuous refill: `limiter.limit_remaining(remaining, 0)`, so that it holds at most `remaining` now
///   and refills at its own rate from there (a bucket's balance becomes `min(balance, remaining)`). The
///   provider's "time until full" puts no debt on the bucket: reading it as a window's reset would make the
///   client wait for tokens the provider is already refilling. A fixed window takes nothing from such a hint.
/// @returns true if the limiter was lowered; false if the hint is not usable or changed nothing.
template <class Limiter>
  requires requires(Limiter& l, std::int64_t n, std::chrono::nanoseconds d) {
    { l.limit_remaining(n, d) } -> std::convertible_to<bool>;
  }
bool limit_remaining(Limiter& limiter, const rate_limit_hint& hint) {
  if (!hint.usable()) return false;
  if (hint.refill == rate_limit_refill::continuous) return limiter.limit_remaining(*hint.remaining, std::chrono::nanoseconds{0});
  // A window that resets now (or already did, by a clock ahead of the provider's) says nothing of the next.
  if (hint.reset_after->count() == 0) return false;
  return limiter.limit_remaining(*hint.remaining, *hint.reset_after);
}

}  // namespace rein
