// Parsers for what an upstream says about when to come back: Retry-After (RFC 9110 section 10.2.3) and the
// reset-duration hints of LLM providers (x-ratelimit-reset-requests: 6m0s). Pure functions: no locale, no
// strptime, no allocation, no exceptions; every input, however hostile, yields a value or "absent".
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <ratio>
#include <string_view>
#include <utility>

namespace rein {

namespace detail::retry_after {

inline constexpr std::int64_t max_ns = std::numeric_limits<std::int64_t>::max();

constexpr bool is_digit(char c) noexcept { return c >= '0' && c <= '9'; }
constexpr int digit_value(char c) noexcept { return c - '0'; }

// OWS of RFC 9110 (SP, HTAB) plus a stray CR/LF left by a hand-rolled header splitter.
constexpr bool is_space(char c) noexcept { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

constexpr std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

constexpr std::int64_t saturating_add(std::int64_t a, std::int64_t b) noexcept {  // a, b >= 0
  return a > max_ns - b ? max_ns : a + b;
}

constexpr std::int64_t saturating_mul(std::int64_t a, std::int64_t b) noexcept {  // a >= 0, b > 0
  return a > max_ns / b ? max_ns : a * b;
}

// The leading run of digits of `s`, removed from `s`.
constexpr std::string_view take_digits(std::string_view& s) noexcept {
  std::size_t n = 0;
  while (n < s.size() && is_digit(s[n])) ++n;
  const std::string_view digits = s.substr(0, n);
  s.remove_prefix(n);
  return digits;
}

// A run of decimal digits as an integer, saturating at max_ns.
constexpr std::int64_t digits_value(std::string_view digits) noexcept {
  std::int64_t value = 0;
  for (const char c : digits) value = saturating_add(saturating_mul(value, 10), digit_value(c));
  return value;
}

// ceil(multiplier * 0.digits) by long multiplication from the last digit: exact for any number of digits,
// where a floating-point or fixed-width product would round (and could round down).
constexpr std::int64_t ceil_fraction_times(std::string_view digits, std::int64_t multiplier) noexcept {
  std::int64_t carry = 0;
  bool remainder = false;
  for (std::size_t i = digits.size(); i-- > 0;) {
    const std::int64_t t = multiplier * digit_value(digits[i]) + carry;
    remainder = remainder || t % 10 != 0;
    carry = t / 10;
  }
  return carry + (remainder ? 1 : 0);
}

// whole.fraction x (multiplier x 10^exponent) nanoseconds, rounded up to a whole nanosecond, saturating.
// Splitting the unit as multiplier x 10^exponent (an hour is 36 x 10^11 ns) lets the first `exponent`
// fraction digits shift into the integer part exactly, so only a multiply by at most 36 remains.
constexpr std::int64_t scaled_ceil(std::string_view whole, std::string_view fraction, std::int64_t multiplier,
                                   std::size_t exponent) noexcept {
  std::int64_t unit = multiplier;
  for (std::size_t i = 0; i < exponent; ++i) unit *= 10;
  std::int64_t shifted = 0;  // the first `exponent` fraction digits, zero-padded: < 10^exponent
  for (std::size_t i = 0; i < exponent; ++i)
    shifted = shifted * 10 + (i < fraction.size() ? digit_value(fraction[i]) : 0);
  const std::string_view rest = fraction.size() > exponent ? fraction.substr(exponent) : std::string_view{};
  const std::int64_t head = saturating_mul(digits_value(whole), unit);
  return saturating_add(head, saturating_add(multiplier * shifted, ceil_fraction_times(rest, multiplier)));
}

// A left-to-right reader for the fixed layouts of HTTP-date. Every step checks bounds and fails softly.
class date_reader {
 public:
  constexpr explicit date_reader(std::string_view s) noexcept : rest_(s) {}

  constexpr bool literal(std::string_view token) noexcept {
    if (rest_.substr(0, token.size()) != token) return false;
    rest_.remove_prefix(token.size());
    return true;
  }

  // Exactly `count` digits.
  constexpr bool number(std::size_t count, int& out) noexcept {
    if (rest_.size() < count) return false;
    int value = 0;
    for (std::size_t i = 0; i < count; ++i) {
      if (!is_digit(rest_[i])) return false;
      value = value * 10 + digit_value(rest_[i]);
    }
    rest_.remove_prefix(count);
    out = value;
    return true;
  }

  // One of `names`; `out` is its index. Names in one list never prefix each other.
  template <std::size_t N>
  constexpr bool one_of(const std::array<std::string_view, N>& names, int& out) noexcept {
    for (std::size_t i = 0; i < N; ++i) {
      if (literal(names[i])) {
        out = static_cast<int>(i);
        return true;
      }
    }
    return false;
  }

  constexpr bool at_end() const noexcept { return rest_.empty(); }

 private:
  std::string_view rest_;
};

inline constexpr std::array<std::string_view, 7> day_names{"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"};
inline constexpr std::array<std::string_view, 7> long_day_names{"Monday", "Tuesday",  "Wednesday", "Thursday",
                                                                 "Friday", "Saturday", "Sunday"};
inline constexpr std::array<std::string_view, 12> month_names{"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                                               "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

struct date_fields {
  int year = 0;
  int month = 0;  // 1..12
  int day = 0;
  int hour = 0;
  int minute = 0;
  int second = 0;
};

constexpr bool time_of_day(date_reader& r, date_fields& f) noexcept {
  return r.number(2, f.hour) && r.literal(":") && r.number(2, f.minute) && r.literal(":") && r.number(2, f.second);
}

constexpr bool read_month(date_reader& r, date_fields& f) noexcept {
  int index = 0;
  if (!r.one_of(month_names, index)) return false;
  f.month = index + 1;
  return true;
}

// IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT".
constexpr bool imf_fixdate(std::string_view s, date_fields& f) noexcept {
  date_reader r{s};
  int weekday = 0;
  return r.one_of(day_names, weekday) && r.literal(", ") && r.number(2, f.day) && r.literal(" ") && read_month(r, f) &&
         r.literal(" ") && r.number(4, f.year) && r.literal(" ") && time_of_day(r, f) && r.literal(" GMT") &&
         r.at_end();
}

// Obsolete RFC 850 date: "Sunday, 06-Nov-94 08:49:37 GMT"; f.year receives the two digits only.
constexpr bool rfc850_date(std::string_view s, date_fields& f) noexcept {
  date_reader r{s};
  int weekday = 0;
  return r.one_of(long_day_names, weekday) && r.literal(", ") && r.number(2, f.day) && r.literal("-") &&
         read_month(r, f) && r.literal("-") && r.number(2, f.year) && r.literal(" ") && time_of_day(r, f) &&
         r.literal(" GMT") && r.at_end();
}

// asctime date: "Sun Nov  6 08:49:37 1994" (a one-digit day is padded with a space, "Nov 16" has none).
constexpr bool asctime_date(std::string_view s, date_fields& f) noexcept {
  date_reader r{s};
  int weekday = 0;
  const bool head = r.one_of(day_names, weekday) && r.literal(" ") && read_month(r, f) && r.literal(" ");
  const bool day = head && (r.literal(" ") ? r.number(1, f.day) : r.number(2, f.day));
  return day && r.literal(" ") && time_of_day(r, f) && r.literal(" ") && r.number(4, f.year) && r.at_end();
}

constexpr int floor_mod(int a, int m) noexcept { return ((a % m) + m) % m; }

// `now` as whole `Unit`s since the epoch (floored) and the remainder in [0, 1 Unit). Truncating first and then
// stepping back keeps every intermediate within range, where std::chrono::floor followed by `now - floor`
// overflows near time_point::min().
template <class Unit>
constexpr auto split(std::chrono::system_clock::time_point now) noexcept {
  const auto since = now.time_since_epoch();
  auto whole = std::chrono::duration_cast<Unit>(since);
  auto rest = since - whole;
  if (rest < rest.zero()) {
    whole -= Unit{1};
    rest += Unit{1};
  }
  return std::pair{whole, rest};
}

// RFC 9110 section 5.6.7: a two-digit year that "appears to be more than 50 years in the future" is the most
// recent past year with those digits. Read as: the latest year Y ending in `yy` whose timestamp is at most
// 50 calendar years after `now`.
inline int full_year(int yy, const date_fields& f, std::chrono::system_clock::time_point now) noexcept {
  using namespace std::chrono;
  const auto [today, time_of_day] = split<days>(now);
  const year_month_day ymd{sys_days{today}};
  const int limit_year = static_cast<int>(ymd.year()) + 50;
  int y = limit_year - floor_mod(limit_year - yy, 100);
  if (y == limit_year) {
    const auto now_seconds = duration_cast<seconds>(time_of_day).count();
    const auto date_seconds = static_cast<std::int64_t>(f.hour) * 3600 + std::int64_t{f.minute} * 60 + f.second;
    const unsigned now_month = static_cast<unsigned>(ymd.month());
    const unsigned now_day = static_cast<unsigned>(ymd.day());
    const auto date_month = static_cast<unsigned>(f.month);
    const auto date_day = static_cast<unsigned>(f.day);
    const bool later = date_month != now_month ? date_month > now_month
                       : date_day != now_day   ? date_day > now_day
                                               : date_seconds > now_seconds;
    if (later) y -= 100;
  }
  return y;
}

inline std::optional<std::chrono::sys_seconds> to_time(const date_fields& f) noexcept {
  using namespace std::chrono;
  const year_month_day ymd{year{f.year}, month{static_cast<unsigned>(f.month)}, day{static_cast<unsigned>(f.day)}};
  // RFC 9110's time-of-day allows second 60 (a leap second); it reads as the first second of the next minute.
  if (!ymd.ok() || f.hour > 23 || f.minute > 59 || f.second > 60) return std::nullopt;
  return sys_days{ymd} + hours{f.hour} + minutes{f.minute} + seconds{f.second};
}

// Non-negative nanoseconds from `now` until `date`, saturating; zero for a date not after `now`.
inline std::chrono::nanoseconds until(std::chrono::sys_seconds date,
                                      std::chrono::system_clock::time_point now) noexcept {
  using namespace std::chrono;
  const auto [now_seconds, rest] = split<seconds>(now);
  const std::int64_t whole = date.time_since_epoch().count() - now_seconds.count();
  const std::int64_t part = duration_cast<nanoseconds>(rest).count();  // [0, 1 s)
  if (whole <= 0) return nanoseconds{0};
  if (whole > max_ns / 1'000'000'000) return nanoseconds{max_ns};
  return nanoseconds{whole * 1'000'000'000 - part};
}

// delta-seconds = 1*DIGIT, extended with an optional fraction ("1.5"): both parts need a digit.
inline std::optional<std::chrono::nanoseconds> delta_seconds(std::string_view s) noexcept {
  const std::string_view whole = take_digits(s);
  std::string_view fraction;
  if (!s.empty() && s.front() == '.') {
    s.remove_prefix(1);
    fraction = take_digits(s);
    if (fraction.empty()) return std::nullopt;
  }
  if (whole.empty() || !s.empty()) return std::nullopt;
  return std::chrono::nanoseconds{scaled_ceil(whole, fraction, 1, 9)};
}

struct duration_unit {
  std::string_view name;
  std::int64_t multiplier;
  std::size_t exponent;  // the unit is multiplier x 10^exponent ns
};

// Go's time.ParseDuration units, both spellings of micro included ("µs" U+00B5, "μs" U+03BC).
inline constexpr std::array<duration_unit, 8> duration_units{{{"ns", 1, 0},
                                                              {"us", 1, 3},
                                                              {"\xC2\xB5s", 1, 3},
                                                              {"\xCE\xBCs", 1, 3},
                                                              {"ms", 1, 6},
                                                              {"s", 1, 9},
                                                              {"m", 6, 10},
                                                              {"h", 36, 11}}};

constexpr const duration_unit* find_unit(std::string_view name) noexcept {
  for (const auto& unit : duration_units)
    if (unit.name == name) return &unit;
  return nullptr;
}

// One "1.5h" component of a Go duration, removed from `s`; nullopt if malformed.
inline std::optional<std::int64_t> duration_component(std::string_view& s) noexcept {
  const std::string_view whole = take_digits(s);
  std::string_view fraction;
  const bool dot = !s.empty() && s.front() == '.';
  if (dot) {
    s.remove_prefix(1);
    fraction = take_digits(s);
  }
  if (whole.empty() && fraction.empty()) return std::nullopt;
  std::size_t n = 0;
  while (n < s.size() && !is_digit(s[n]) && s[n] != '.') ++n;
  const duration_unit* unit = find_unit(s.substr(0, n));
  if (unit == nullptr) return std::nullopt;
  s.remove_prefix(n);
  return scaled_ceil(whole, fraction, unit->multiplier, unit->exponent);
}

}  // namespace detail::retry_after

/// Parses an HTTP-date in any of the three forms of RFC 9110 section 5.6.7, to the second.
///
/// - IMF-fixdate: `Sun, 06 Nov 1994 08:49:37 GMT` (the form senders must use);
/// - obsolete RFC 850: `Sunday, 06-Nov-94 08:49:37 GMT`; the two-digit year is resolved against `now` by the
///   rule of RFC 9110: it is the latest year with those two digits whose timestamp is at most 50 calendar years
///   after `now` (read at one-second resolution), so a date that would lie further ahead is the century before;
/// - asctime: `Sun Nov  6 08:49:37 1994` (a one-digit day is padded with a space or written `06`).
///
/// Decisions, all from the RFC's grammar: names and `GMT` are case-sensitive; the weekday must be a valid name
/// of the right form (`Sun` / `Sunday`) but need not agree with the date, as in Go's time.Parse, because the
/// date fields carry the meaning; the date must exist (no 30 February, 29 February only in leap years);
/// hour 00-23, minute 00-59, second 00-60, where 60 (a leap second) reads as the next minute's first second.
/// Leading and trailing whitespace (SP, HTAB, CR, LF) is ignored; nothing else may surround the date.
///
/// @param value a field value, e.g. of Retry-After, Date or Expires.
/// @param now   the recipient's current time; used only for the two-digit year of the RFC 850 form.
/// @returns the instant, or nullopt when `value` is not a valid HTTP-date. Never throws.
inline std::optional<std::chrono::sys_seconds> parse_http_date(std::string_view value,
                                                               std::chrono::system_clock::time_point now) noexcept {
  namespace d = detail::retry_after;
  const std::string_view s = d::trim(value);
  d::date_fields f;
  if (d::imf_fixdate(s, f) || d::asctime_date(s, f)) return d::to_time(f);
  if (d::rfc850_date(s, f)) {
    f.year = d::full_year(f.year, f, now);
    return d::to_time(f);
  }
  return std::nullopt;
}

/// Parses a Retry-After field value (RFC 9110 section 10.2.3) into how long to wait from `now`.
///
/// Accepted: delta-seconds (`120`), and an HTTP-date in any of the three forms that `parse_http_date`
/// accepts. Extension: a decimal fraction (`1.5`), which some servers send, is honoured to the nanosecond,
/// and digits beyond the ninth round the result up, never down (`0.0000000001` waits 1 ns), so a positive
/// value never yields zero. Leading and trailing whitespace is ignored.
///
/// Results:
/// - the wait, >= 0: a date in the past (or equal to `now`) and `0` both give zero: the caller may go at once;
/// - huge values saturate at `nanoseconds::max()` (about 292 years) instead of overflowing; callers must cap
///   the result (`quota_gate`'s `max_pause` does) before adding it to a time point;
/// - nullopt ("absent") for an empty, negative (`-5`), signed (`+5`), exponent (`1e3`), half-written (`1.`,
///   `.5`) or otherwise unparseable value (`soon`): the caller applies its default pause. Garbage never reads
///   as zero, which would make every client retry at once.
///
/// No locale, no strptime, no allocation, no exceptions: safe on any bytes (fuzzed in tests/fuzz).
///
/// @param value the field value, as received.
/// @param now   the recipient's current time, the origin of an HTTP-date's delay.
inline std::optional<std::chrono::nanoseconds> parse_retry_after(std::string_view value,
                                                                 std::chrono::system_clock::time_point now) noexcept {
  namespace d = detail::retry_after;
  const std::string_view s = d::trim(value);
  if (s.empty()) return std::nullopt;
  if (d::is_digit(s.front())) return d::delta_seconds(s);
  const auto date = parse_http_date(s, now);
  if (!date) return std::nullopt;
  return d::until(*date, now);
}

namespace detail {

/// The pause a Retry-After field value asks for, as a Duration of the pausing clock (what every gate's
/// `on_retry_after` pauses for): the parsed wait rounded up, so that a coarser clock never resumes before
/// the upstream asked, and saturated at Duration::max() (the gate's max_pause then cuts it); zero for `0` or
/// a date already past (no pause); `default_pause` when the value is absent or does not parse.
template <class Duration>
Duration retry_after_pause(std::string_view value, Duration default_pause,
                           std::chrono::system_clock::time_point wall_now) noexcept {
  const std::optional<std::chrono::nanoseconds> wait = parse_retry_after(value, wall_now);
  if (!wait) return default_pause;
  if constexpr (std::ratio_less_v<typename Duration::period, std::nano>) {
    // A finer tick than a nanosecond: the longest wait may not fit.
    if (*wait >= std::chrono::duration_cast<std::chrono::nanoseconds>(Duration::max())) return Duration::max();
  }
  return std::chrono::ceil<Duration>(*wait);
}

}  // namespace detail

/// Parses a reset hint in Go's time.Duration syntax, as OpenAI-compatible providers send it in
/// `x-ratelimit-reset-requests` / `x-ratelimit-reset-tokens`: `6m0s`, `1s`, `20ms`, `1h2m3.5s`, `0.5s`.
///
/// Grammar (Go's time.ParseDuration): an optional `+`, then one or more components `<decimal><unit>` with units
/// `ns`, `us` (also `µs`, `μs`), `ms`, `s`, `m`, `h`; a decimal needs a digit on at least one side of its point
/// (`.5s` and `1.s` are accepted, as Go does); the bare string `0` is zero; units are case-sensitive and
/// required otherwise. Leading and trailing whitespace is ignored.
///
/// Differences from Go, for a delay: any `-` sign gives nullopt (a negative wait is not a hint); each
/// component rounds up to a whole nanosecond (Go truncates), so the result is never below the exact value;
/// huge values saturate at `nanoseconds::max()` instead of failing. Anything else malformed, including an
/// empty value or a number without a unit (`30`), gives nullopt: the caller applies its default.
/// Never throws, on any bytes.
///
/// @returns the duration (>= 0), or nullopt.
inline std::optional<std::chrono::nanoseconds> parse_reset_duration(std::string_view value) noexcept {
  namespace d = detail::retry_after;
  std::string_view s = d::trim(value);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  if (s == "0") return std::chrono::nanoseconds{0};
  if (s.empty()) return std::nullopt;
  std::int64_t total = 0;
  while (!s.empty()) {
    const auto component = d::duration_component(s);
    if (!component) return std::nullopt;
    total = d::saturating_add(total, *component);
  }
  return std::chrono::nanoseconds{total};
}

}  // namespace rein
