// The shared one-line formatting of snapshots (operator<< of every snapshot is built from these). Not API.
#pragma once

#include <rein/algo/log_histogram.hpp>
#include <rein/observer.hpp>
#include <rein/wait_stats.hpp>

#include <charconv>
#include <chrono>
#include <cstdint>
#include <ostream>
#include <string_view>
#include <system_error>

namespace rein::detail {

/// A number as text, whatever flags the caller's stream has: `v` in fixed notation with `decimals` (0 to
/// 40) decimals, as printf's `%.*f` writes it, or an integer in decimal. std::to_chars, which no locale
/// touches, rather than a string stream and <iomanip>, whose <locale> every unit including rein would parse.
class number_text {
 public:
  number_text(double v, int decimals) noexcept
      : end_(done(std::to_chars(buffer_, buffer_ + sizeof buffer_, v, std::chars_format::fixed, decimals))) {}
  explicit number_text(std::int64_t v) noexcept : end_(done(std::to_chars(buffer_, buffer_ + sizeof buffer_, v))) {}
  number_text(const number_text&) = delete;
  number_text& operator=(const number_text&) = delete;

  std::string_view view() const noexcept { return {buffer_, static_cast<std::size_t>(end_ - buffer_)}; }

 private:
  char* done(std::to_chars_result r) noexcept { return r.ec == std::errc{} ? r.ptr : buffer_; }

  char buffer_[352];  // the longest double in fixed notation (309 digits) with a sign, a point and 40 decimals
  char* end_;
};

/// A duration as a person reads it, with three significant digits: 0, 850ns, 12.3us, 4.56ms, 1.23s, 754s.
inline void write_duration(std::ostream& os, std::chrono::nanoseconds d) {
  const auto ns = static_cast<double>(d.count());
  const double magnitude = ns < 0 ? -ns : ns;
  auto out = [&](double v, const char* unit) {
    const int decimals = v >= 100 ? 0 : v >= 10 ? 1 : 2;
    os << number_text(v, decimals).view() << unit;
  };
  if (d.count() == 0) os << '0';
  else if (magnitude < 1e3) os << number_text(static_cast<std::int64_t>(d.count())).view() << "ns";
  else if (magnitude < 1e6) out(ns / 1e3, "us");
  else if (magnitude < 1e9) out(ns / 1e6, "ms");
  else out(ns / 1e9, "s");
}

/// A number with at most `decimals` decimals (0 to 40), trailing zeros dropped: 0.75, 100, 2.5.
inline void write_number(std::ostream& os, double v, int decimals = 2) {
  const number_text text(v, decimals);
  std::string_view s = text.view();
  if (s.find('.') != std::string_view::npos) {
    while (!s.empty() && s.back() == '0') s.remove_suffix(1);
    if (!s.empty() && s.back() == '.') s.remove_suffix(1);
  }
  os << s;
}

/// `rejected=3 (queue_full=1 timed_out=2)`: the total and its non-zero reasons.
template <class Snapshot>
void write_rejected(std::ostream& os, const Snapshot& s) {
  os << "rejected=" << s.rejected_total;
  if (s.rejected_total == 0) return;
  const char* sep = " (";
  s.for_each_rejected([&](reject_reason why, std::uint64_t n) {
    if (n == 0) return;
    os << sep << to_string(why) << '=' << n;
    sep = " ";
  });
  os << ')';
}

/// `n=12 p50=1.20ms p90=4.00ms p99=9.50ms max=10.0ms`
inline void write_histogram(std::ostream& os, const algo::log_histogram& h) {
  os << "n=" << h.count();
  if (h.count() == 0) return;
  os << " p50=";
  write_duration(os, h.p50());
  os << " p90=";
  write_duration(os, h.p90());
  os << " p99=";
  write_duration(os, h.p99());
  os << " max=";
  write_duration(os, h.max());
}

/// The wait-line part every limiter's line ends with.
inline void write_wait_stats(std::ostream& os, const wait_stats& s) {
  os << "waiting=" << s.waiting << " acquired=" << s.acquired_total << ' ';
  write_rejected(os, s);
  if (s.cancelled_total != 0) os << " cancelled=" << s.cancelled_total;
  os << " wait[";
  write_histogram(os, s.wait);
  os << ']';
}

}  // namespace rein::detail

namespace rein {

/// One line: `waiting=0 acquired=10 rejected=2 (queue_full=2) wait[n=10 p50=0 ...]`.
inline std::ostream& operator<<(std::ostream& os, const wait_stats& s) {
  detail::write_wait_stats(os, s);
  return os;
}

}  // namespace rein

namespace rein::algo {

/// One line: `n=12 p50=1.20ms p90=4.00ms p99=9.50ms max=10.0ms`.
inline std::ostream& operator<<(std::ostream& os, const log_histogram& h) {
  rein::detail::write_histogram(os, h);
  return os;
}

}  // namespace rein::algo
