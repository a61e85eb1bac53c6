// libFuzzer target: rein::parse_retry_after, rein::parse_http_date, rein::parse_reset_duration and
// rein::parse_rate_limit_reset / parse_rate_limit_count (rate_limit_headers.hpp) on arbitrary bytes. Beyond
// "no crash, no sanitizer report", it checks invariants that hold for every input, some against an
// independent oracle (std::from_chars), so a wrong answer is a finding too, not only a crash.
#include <rein/rate_limit_headers.hpp>
#include <rein/retry_after.hpp>

#include <array>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

namespace {

using std::chrono::nanoseconds;
using std::chrono::system_clock;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant violated: %s\n", what);
    std::abort();
  }
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (const char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// Up to 9 digits: exactly that many seconds (from_chars is the oracle).
std::optional<std::int64_t> small_integer(std::string_view s) {
  if (!all_digits(s) || s.size() > 9) return std::nullopt;
  std::int64_t value = 0;
  std::from_chars(s.data(), s.data() + s.size(), value);
  return value;
}

void check_retry_after(std::string_view value, system_clock::time_point now) {
  const auto result = rein::parse_retry_after(value, now);
  check(!result || *result >= nanoseconds::zero(), "Retry-After is never negative");

  const std::string padded = " \t" + std::string(value) + "\r\n";
  check(rein::parse_retry_after(padded, now) == result, "surrounding whitespace changes nothing");

  const std::string_view core = trimmed(value);
  check(core.empty() == false || !result, "an empty value is absent");
  check(core.empty() || core.front() != '-' || !result, "a negative value is absent");
  if (const auto seconds = small_integer(core))
    check(result == std::optional{nanoseconds{std::chrono::seconds{*seconds}}}, "delta-seconds are exact");

  const auto date = rein::parse_http_date(value, now);
  if (date) {
    check(result.has_value(), "a valid HTTP-date is a valid Retry-After");
    // date > now exactly when its second is after now's (floored) second; compared in seconds, no overflow.
    const auto now_second = std::chrono::floor<std::chrono::seconds>(now.time_since_epoch());
    const bool ahead = date->time_since_epoch() > now_second;
    check(ahead == (*result > nanoseconds::zero()), "a date waits iff it lies ahead of now");
  } else if (!core.empty() && !(core.front() >= '0' && core.front() <= '9')) {
    check(!result, "a value that is neither a number nor a date is absent");
  }
}

void check_reset_duration(std::string_view value) {
  const auto result = rein::parse_reset_duration(value);
  check(!result || *result >= nanoseconds::zero(), "a reset duration is never negative");
  check(value.find('-') == std::string_view::npos || !result, "a '-' anywhere makes it absent");

  const std::string_view core = trimmed(value);
  if (core.size() >= 2 && core.back() == 's' && core[core.size() - 2] >= '0' && core[core.size() - 2] <= '9') {
    if (const auto seconds = small_integer(core.substr(0, core.size() - 1)))
      check(result == std::optional{nanoseconds{std::chrono::seconds{*seconds}}}, "\"<n>s\" is n seconds");
  }
  if (result && !core.empty()) {
    // One more nanosecond component adds exactly 1 ns (or stays saturated).
    const auto longer = rein::parse_reset_duration(std::string(core) + "1ns");
    const auto expected = *result == nanoseconds::max() ? *result : *result + nanoseconds{1};
    check(longer == std::optional{expected}, "appending 1ns adds 1 ns");
  }
}

void check_rate_limit_reset(std::string_view value, system_clock::time_point now) {
  const auto result = rein::parse_rate_limit_reset(value, now);
  check(!result || *result >= nanoseconds::zero(), "a rate-limit reset is never negative");
  const std::string padded = " \t" + std::string(value) + "\r\n";
  check(rein::parse_rate_limit_reset(padded, now) == result, "surrounding whitespace changes nothing (reset)");
  const std::string_view core = trimmed(value);
  if (const auto seconds = small_integer(core))
    check(result == std::optional{nanoseconds{std::chrono::seconds{*seconds}}}, "a plain reset is delta-seconds");
  const bool timestamp = core.size() >= 20 && core[4] == '-';
  bool decimal = !core.empty();
  for (const char c : core) decimal = decimal && ((c >= '0' && c <= '9') || c == '.');
  if (!timestamp && !decimal) check(result == rein::parse_reset_duration(value), "other resets are Go durations");

  const auto count = rein::parse_rate_limit_count(value);
  check(!count || (*count >= 0 && all_digits(core)), "a count is digits only");
  if (const auto small = small_integer(core)) check(count == small, "a count is exact");
}

std::array<system_clock::time_point, 5> nows(std::string_view data) {
  std::uint64_t hash = 14695981039346656037u;  // FNV-1a: a data-dependent but arbitrary `now`
  for (const char c : data) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211u;
  const auto fixed = std::chrono::sys_days{std::chrono::year{2024} / 6 / 1} + std::chrono::hours{12} +
                     std::chrono::milliseconds{500};
  return {system_clock::time_point{fixed}, system_clock::time_point{}, system_clock::time_point::min(),
          system_clock::time_point::max(),
          system_clock::time_point{system_clock::duration{static_cast<system_clock::rep>(hash)}}};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view value(reinterpret_cast<const char*>(data), size);
  for (const auto now : nows(value)) {
    check_retry_after(value, now);
    check_rate_limit_reset(value, now);
  }
  check_reset_duration(value);
  return 0;
}
