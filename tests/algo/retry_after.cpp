// Retry-After (RFC 9110 section 10.2.3), HTTP-date (section 5.6.7) and Go-duration reset hints.
#include <rein/retry_after.hpp>

#include <chrono>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "support/catch.hpp"

namespace {

using namespace std::chrono;
using namespace std::chrono_literals;
using std::nullopt;
using opt_ns = std::optional<nanoseconds>;
using views = std::initializer_list<std::string_view>;

// 1994-11-06 08:49:07 UTC: the RFC's example date is 30 s after it.
const system_clock::time_point example_now = sys_days{1994y / November / 6} + 8h + 49min + 7s;
constexpr auto max_ns = nanoseconds::max();

opt_ns retry_after(std::string_view value, system_clock::time_point now = example_now) {
  return rein::parse_retry_after(value, now);
}

std::optional<sys_seconds> http_date(std::string_view value, system_clock::time_point now = example_now) {
  return rein::parse_http_date(value, now);
}

}  // namespace

TEST_CASE("delta-seconds give that many seconds", "[retry_after]") {
  CHECK(retry_after("30") == opt_ns{30s});
  CHECK(retry_after("120") == opt_ns{120s});
  CHECK(retry_after("007") == opt_ns{7s});
}

TEST_CASE("zero means the caller may proceed at once", "[retry_after]") {
  CHECK(retry_after("0") == opt_ns{0ns});
  CHECK(retry_after("0.000") == opt_ns{0ns});
}

TEST_CASE("negative, empty and garbage values are absent, never zero", "[retry_after]") {
  for (const std::string_view value :
       views{"-5", "-0", "", "   ", "\t", "soon", "+5", "1e3", "1.", ".5", "1,5", "1.5.2", "30s", "5 s", "0x10",
        "30;foo", "thirty", "NaN", "inf", "-inf", "1.5e2", "\xff\xfe", std::string_view("3\0", 2)}) {
    INFO("value: \"" << std::string(value) << '"');
    CHECK(retry_after(value) == nullopt);
  }
}

TEST_CASE("surrounding whitespace is ignored", "[retry_after]") {
  CHECK(retry_after("  30") == opt_ns{30s});
  CHECK(retry_after("30  ") == opt_ns{30s});
  CHECK(retry_after(" \t30\r\n") == opt_ns{30s});
  CHECK(retry_after("  Sun, 06 Nov 1994 08:49:37 GMT\t") == opt_ns{30s});
  CHECK(retry_after("3 0") == nullopt);
}

TEST_CASE("a fractional delta is kept to the nanosecond and rounded up beyond it", "[retry_after]") {
  CHECK(retry_after("1.5") == opt_ns{1500ms});
  CHECK(retry_after("0.25") == opt_ns{250ms});
  CHECK(retry_after("2.000000001") == opt_ns{2s + 1ns});
  CHECK(retry_after("1.0000000000000") == opt_ns{1s});       // trailing zeros past the ninth digit: exact
  CHECK(retry_after("0.0000000001") == opt_ns{1ns});         // a positive value never reads as zero
  CHECK(retry_after("0.1234567891") == opt_ns{123'456'790ns});
  CHECK(retry_after("0.9999999999999999999999") == opt_ns{1s});
}

TEST_CASE("huge deltas saturate instead of overflowing", "[retry_after]") {
  CHECK(retry_after("9223372036") == opt_ns{9'223'372'036s});
  CHECK(retry_after("9223372036.854775807") == opt_ns{max_ns});  // exactly nanoseconds::max()
  CHECK(retry_after("9223372036.8547758071") == opt_ns{max_ns});
  CHECK(retry_after("9223372037") == opt_ns{max_ns});
  CHECK(retry_after("99999999999999999999999999999999999999") == opt_ns{max_ns});
}

TEST_CASE("an IMF-fixdate 30 s ahead of now gives 30 s", "[retry_after]") {
  CHECK(retry_after("Sun, 06 Nov 1994 08:49:37 GMT") == opt_ns{30s});
  // Sub-second `now`: the wait ends exactly at the date's second.
  CHECK(retry_after("Sun, 06 Nov 1994 08:49:37 GMT", example_now + 250ms) == opt_ns{29750ms});
}

TEST_CASE("the RFC 9110 example date is 784111777 s after the epoch in all three forms", "[retry_after]") {
  const sys_seconds expected{784'111'777s};
  CHECK(http_date("Sun, 06 Nov 1994 08:49:37 GMT") == expected);
  CHECK(http_date("Sunday, 06-Nov-94 08:49:37 GMT") == expected);
  CHECK(http_date("Sun Nov  6 08:49:37 1994") == expected);
  CHECK(http_date("Sun Nov 06 08:49:37 1994") == expected);
}

TEST_CASE("RFC 850 and asctime dates work as Retry-After", "[retry_after]") {
  CHECK(retry_after("Sunday, 06-Nov-94 08:49:37 GMT") == opt_ns{30s});
  CHECK(retry_after("Sun Nov  6 08:49:37 1994") == opt_ns{30s});
  CHECK(retry_after("Wed Nov 16 08:49:37 1994") == opt_ns{days{10} + 30s});
}

TEST_CASE("a date at or before now gives zero", "[retry_after]") {
  CHECK(retry_after("Sun, 06 Nov 1994 08:49:07 GMT") == opt_ns{0ns});
  CHECK(retry_after("Sun, 06 Nov 1994 08:49:07 GMT", example_now + 999ms) == opt_ns{0ns});
  CHECK(retry_after("Thu, 01 Jan 1970 00:00:00 GMT") == opt_ns{0ns});
  CHECK(retry_after("Sat, 01 Jan 0000 00:00:00 GMT") == opt_ns{0ns});
}

TEST_CASE("a date too far ahead saturates", "[retry_after]") {
  CHECK(retry_after("Fri, 31 Dec 9999 23:59:59 GMT") == opt_ns{max_ns});
  // 300 years ahead does not fit in int64 nanoseconds (about 292 years).
  CHECK(retry_after("Wed, 06 Nov 2294 08:49:37 GMT") == opt_ns{max_ns});
  // 250 years fits: 1994-11-06 to 2244-11-06 is 250 * 365 days plus 61 leap days (2100 and 2200 are not leap).
  CHECK(retry_after("Wed, 06 Nov 2244 08:49:07 GMT") == opt_ns{days{250 * 365 + 61}});
}

TEST_CASE("extreme nows neither overflow nor wrap", "[retry_after]") {
  CHECK(retry_after("Sun, 06 Nov 1994 08:49:37 GMT", system_clock::time_point::max()) == opt_ns{0ns});
  CHECK(retry_after("Sun, 06 Nov 1994 08:49:37 GMT", system_clock::time_point::min()) == opt_ns{max_ns});
  // In 2262 (the end of int64 nanoseconds) "94" is 2294, 32 years ahead; measured from 2200 to stay in range.
  const sys_days y2200{2200y / January / 1};
  const auto ahead = (sys_days{2294y / November / 6} + 8h + 49min + 37s - y2200) - (system_clock::time_point::max() - y2200);
  CHECK(retry_after("Sunday, 06-Nov-94 08:49:37 GMT", system_clock::time_point::max()) == opt_ns{ahead});
  CHECK(retry_after("Sunday, 06-Nov-94 08:49:37 GMT", system_clock::time_point::min()) ==
        opt_ns{sys_days{1694y / November / 6} + 8h + 49min + 37s - system_clock::time_point::min()});
}

TEST_CASE("impossible dates and times are absent", "[retry_after]") {
  for (const std::string_view value : views{
           "Thu, 30 Feb 2023 00:00:00 GMT",  // no 30 February
           "Wed, 29 Feb 2023 00:00:00 GMT",  // 2023 is not a leap year
           "Mon, 29 Feb 2100 00:00:00 GMT",  // nor is 2100
           "Sun, 31 Apr 1994 00:00:00 GMT",  // April has 30 days
           "Sun, 00 Nov 1994 08:49:37 GMT",  // day 0
           "Sun, 06 Nov 1994 24:00:00 GMT",  // hour 24
           "Sun, 06 Nov 1994 08:60:00 GMT",  // minute 60
           "Sun, 06 Nov 1994 08:49:61 GMT",  // second 61
           "Sunday, 30-Feb-94 08:49:37 GMT",
           "Sun Feb 30 08:49:37 1994",
       }) {
    INFO(std::string(value));
    CHECK(retry_after(value) == nullopt);
  }
}

TEST_CASE("29 February exists in leap years and a leap second reads as the next minute", "[retry_after]") {
  CHECK(http_date("Thu, 29 Feb 2024 00:00:00 GMT") == sys_seconds{sys_days{2024y / February / 29}});
  CHECK(http_date("Tue, 29 Feb 2000 00:00:00 GMT") == sys_seconds{sys_days{2000y / February / 29}});
  CHECK(http_date("Sat, 31 Dec 2016 23:59:60 GMT") == sys_seconds{sys_days{2017y / January / 1}});
}

TEST_CASE("a wrong weekday is tolerated, an unknown one is not", "[retry_after]") {
  // 6 November 1994 was a Sunday; the date fields carry the meaning (as in Go's time.Parse).
  CHECK(retry_after("Mon, 06 Nov 1994 08:49:37 GMT") == opt_ns{30s});
  CHECK(retry_after("Friday, 06-Nov-94 08:49:37 GMT") == opt_ns{30s});
  CHECK(retry_after("Fou, 06 Nov 1994 08:49:37 GMT") == nullopt);
  CHECK(retry_after("Sunday, 06 Nov 1994 08:49:37 GMT") == nullopt);  // long name in the IMF form
  CHECK(retry_after("Sun, 06-Nov-94 08:49:37 GMT") == nullopt);       // short name in the RFC 850 form
}

TEST_CASE("HTTP-date syntax is strict: case, zone, padding, separators", "[retry_after]") {
  for (const std::string_view value : views{
           "sun, 06 nov 1994 08:49:37 gmt",   // case-sensitive (RFC 9110)
           "Sun, 06 Nov 1994 08:49:37 UTC",   // GMT only
           "Sun, 06 Nov 1994 08:49:37 +0000",
           "Sun, 6 Nov 1994 08:49:37 GMT",    // IMF day has two digits
           "Sun, 06 Nov 94 08:49:37 GMT",     // IMF year has four
           "Sun,06 Nov 1994 08:49:37 GMT",
           "Sun, 06 Nov 1994 8:49:37 GMT",
           "Sun, 06 Nov 1994 08:49:37 GMTx",  // trailing garbage
           "Sun, 06 Nov 1994 08:49:37",
           "Sun Nov 6 08:49:37 1994",         // asctime pads a one-digit day with a space
           "Sun Nov  6 08:49:37 94",
           "1994-11-06T08:49:37Z",            // RFC 3339 is not an HTTP-date
       }) {
    INFO(std::string(value));
    CHECK(retry_after(value) == nullopt);
  }
}

TEST_CASE("every proper prefix of a valid date is absent", "[retry_after]") {
  for (const std::string_view date :
       views{"Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994"}) {
    for (std::size_t n = 1; n < date.size(); ++n) {
      INFO(std::string(date.substr(0, n)));
      CHECK(retry_after(date.substr(0, n)) == nullopt);
    }
  }
}

TEST_CASE("an RFC 850 year more than 50 years ahead is the previous century", "[retry_after]") {
  const system_clock::time_point now = sys_days{2024y / June / 1} + 12h;
  const auto year_of = [&](std::string_view value) {
    const auto date = http_date(value, now);
    REQUIRE(date);
    return static_cast<int>(year_month_day{floor<days>(*date)}.year());
  };
  CHECK(year_of("Monday, 01-Jun-74 12:00:00 GMT") == 2074);  // exactly 50 years ahead: not more
  CHECK(year_of("Monday, 01-Jun-74 12:00:01 GMT") == 1974);  // one second more
  CHECK(year_of("Monday, 31-May-74 23:59:59 GMT") == 2074);
  CHECK(year_of("Monday, 02-Jun-74 00:00:00 GMT") == 1974);
  CHECK(year_of("Monday, 01-Jan-73 00:00:00 GMT") == 2073);
  CHECK(year_of("Monday, 01-Jan-75 00:00:00 GMT") == 1975);
  CHECK(year_of("Monday, 01-Jan-25 00:00:00 GMT") == 2025);
  CHECK(year_of("Monday, 01-Jan-24 00:00:00 GMT") == 2024);
  CHECK(year_of("Monday, 31-Dec-99 00:00:00 GMT") == 1999);
  CHECK(year_of("Monday, 01-Jan-00 00:00:00 GMT") == 2000);
  CHECK(year_of("Monday, 29-Feb-00 00:00:00 GMT") == 2000);
  // The resolved year decides whether 29 February exists: 2073 is not a leap year.
  CHECK(http_date("Monday, 29-Feb-73 00:00:00 GMT", now) == nullopt);
}

TEST_CASE("reset hints in Go duration syntax", "[reset_duration]") {
  using rein::parse_reset_duration;
  CHECK(parse_reset_duration("6m0s") == opt_ns{6min});
  CHECK(parse_reset_duration("1s") == opt_ns{1s});
  CHECK(parse_reset_duration("20ms") == opt_ns{20ms});
  CHECK(parse_reset_duration("1h2m3.5s") == opt_ns{1h + 2min + 3500ms});
  CHECK(parse_reset_duration("0.5s") == opt_ns{500ms});
  CHECK(parse_reset_duration("17ms") == opt_ns{17ms});
  CHECK(parse_reset_duration("250us") == opt_ns{250us});
  CHECK(parse_reset_duration("250\xC2\xB5s") == opt_ns{250us});  // U+00B5 micro sign
  CHECK(parse_reset_duration("250\xCE\xBCs") == opt_ns{250us});  // U+03BC Greek mu
  CHECK(parse_reset_duration("42ns") == opt_ns{42ns});
  CHECK(parse_reset_duration("1.5h") == opt_ns{90min});
  CHECK(parse_reset_duration("0.1h") == opt_ns{6min});
  CHECK(parse_reset_duration("1h1h") == opt_ns{2h});  // Go accepts repeated units
}

TEST_CASE("reset hints: zero, signs and Go's decimal forms", "[reset_duration]") {
  using rein::parse_reset_duration;
  CHECK(parse_reset_duration("0") == opt_ns{0ns});
  CHECK(parse_reset_duration("+0") == opt_ns{0ns});
  CHECK(parse_reset_duration("0s") == opt_ns{0ns});
  CHECK(parse_reset_duration("+1s") == opt_ns{1s});
  CHECK(parse_reset_duration(".5s") == opt_ns{500ms});
  CHECK(parse_reset_duration("1.s") == opt_ns{1s});
  CHECK(parse_reset_duration(" 20ms\t") == opt_ns{20ms});
}

TEST_CASE("reset hints round a fractional nanosecond up", "[reset_duration]") {
  using rein::parse_reset_duration;
  CHECK(parse_reset_duration("1.5ns") == opt_ns{2ns});
  CHECK(parse_reset_duration("0.1ns") == opt_ns{1ns});
  CHECK(parse_reset_duration("1.0000000001s") == opt_ns{1s + 1ns});
  CHECK(parse_reset_duration("0.000000000000000000001h") == opt_ns{1ns});
  // 0.333333333333 h = 1199999999998.8 ns
  CHECK(parse_reset_duration("0.333333333333h") == opt_ns{1'199'999'999'999ns});
  CHECK(parse_reset_duration("1.000us") == opt_ns{1000ns});
}

TEST_CASE("reset hints that are negative or malformed are absent", "[reset_duration]") {
  for (const std::string_view value : views{"-1s", "-0", "-0s", "", "  ", "30", "1.5", "00", "1S", "1sec", "s", ".s",
                                       "1.5.2s", "20 ms", "1s ms", "1s-", "++1s", "+", "1d", "\xC2\xB5s", "1\xC2s"}) {
    INFO("value: \"" << std::string(value) << '"');
    CHECK(rein::parse_reset_duration(value) == nullopt);
  }
}

TEST_CASE("huge reset hints saturate", "[reset_duration]") {
  using rein::parse_reset_duration;
  CHECK(parse_reset_duration("2562047h") == opt_ns{2'562'047h});
  CHECK(parse_reset_duration("2562048h") == opt_ns{max_ns});
  CHECK(parse_reset_duration("9999999999999999999999999h") == opt_ns{max_ns});
  CHECK(parse_reset_duration("2562047h2562047h") == opt_ns{max_ns});
  CHECK(parse_reset_duration("9223372036854775807ns") == opt_ns{max_ns});
  CHECK(parse_reset_duration("9223372036854775806ns") == opt_ns{max_ns - 1ns});
}
