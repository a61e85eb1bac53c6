// The shared one-line formatting of snapshots (operator<< of every snapshot is built from these). Not API.
#pragma once

#include <rein/algo/log_histogram.hpp>
#include <rein/observer.hpp>
#include <rein/wait_stats.hpp>

#include <chrono>
#include <cstdint>
#include <iomanip>
#include <ios>
#include <ostream>
#include <sstream>
#include <string>

namespace rein::detail {

/// A duration as a person reads it, with three significant digits: 0, 850ns, 12.3us, 4.56ms, 1.23s, 754s.
inline void write_duration(std::ostream& os, std::chrono::nanoseconds d) {
  const auto ns = static_cast<double>(d.count());
  const double magnitude = ns < 0 ? -ns : ns;
  std::ostringstream text;  // the caller's stream keeps its own flags
  auto out = [&](double v, const char* unit) {
    const int decimals = v >= 100 ? 0 : v >= 10 ? 1 : 2;
    text << std::fixed << std::setprecision(decimals) << v << unit;
  };
  if (d.count() == 0) text << '0';
  else if (magnitude < 1e3) text << d.count() << "ns";
  else if (magnitude < 1e6) out(ns / 1e3, "us");
  else if (magnitude < 1e9) out(ns / 1e6, "ms");
  else out(ns / 1e9, "s");
  os << text.str();
}

/// A number with at most `decimals` decimals, trailing zeros dropped: 0.75, 100, 2.5.
inline void write_number(std::ostream& os, double v, int decimals = 2) {
  std::ostringstream text;
  text << std::fixed << std::setprecision(decimals) << v;
  std::string s = text.str();
  if (s.find('.') != std::string::npos) {
    while (!s.empty() && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
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
