// Conversions between a clock's time points and the nanosecond counts the wait line stores. Not API.
#pragma once

#include <chrono>
#include <cstdint>
#include <ratio>

#if defined(__linux__)
#include <time.h>
#endif

namespace rein::detail {

#if defined(__linux__) && defined(CLOCK_MONOTONIC_COARSE)
inline constexpr bool has_coarse_steady_clock = true;
#else
inline constexpr bool has_coarse_steady_clock = false;
#endif

/// steady_clock's time at the kernel's last tick: Linux's CLOCK_MONOTONIC_COARSE, the clock steady_clock
/// reads at full resolution (so the two compare), without reading the CPU's counter. About a tenth of
/// steady_clock::now()'s cost, at the tick's resolution (coarse_steady_resolution()). Never later than
/// steady_clock::now() read after it. Elsewhere, steady_clock::now() itself.
inline std::chrono::steady_clock::time_point coarse_steady_now() noexcept {
#if defined(__linux__) && defined(CLOCK_MONOTONIC_COARSE)
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return std::chrono::steady_clock::time_point(
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec)));
#else
  return std::chrono::steady_clock::now();
#endif
}

/// The resolution of coarse_steady_now(), as the kernel reports it (clock_getres); steady_clock's own
/// period where there is no coarse clock.
inline std::chrono::nanoseconds coarse_steady_resolution() noexcept {
#if defined(__linux__) && defined(CLOCK_MONOTONIC_COARSE)
  timespec ts{};
  if (::clock_getres(CLOCK_MONOTONIC_COARSE, &ts) == 0)
    return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
#endif
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::duration(1));
}

/// The deadline `timeout` from now on Clock, saturated: a timeout too long to represent means none
/// (time_point::max()), one too far negative the earliest representable instant. Every door that takes a
/// timeout goes through here, so that `acquire_for(n, duration::max())` means "no deadline" everywhere.
template <class Clock>
typename Clock::time_point deadline_after(typename Clock::duration timeout) {
  using time_point = typename Clock::time_point;
  const time_point now = Clock::now();
  if (timeout > timeout.zero() && now > time_point::max() - timeout) return time_point::max();
  if (timeout < timeout.zero() && now < time_point::min() - timeout) return time_point::min();
  return now + timeout;
}

/// Nanoseconds since the clock's epoch, saturated: a coarser clock can hold instants beyond what
/// nanoseconds can (about 292 years).
template <class TimePoint>
std::int64_t to_ns_saturated(TimePoint t) noexcept {
  using ns = std::chrono::nanoseconds;
  using duration = typename TimePoint::duration;
  const duration d = t.time_since_epoch();
  if constexpr (!std::ratio_less_equal_v<typename duration::period, std::nano>) {
    constexpr duration most = std::chrono::duration_cast<duration>(ns::max());
    constexpr duration least = std::chrono::duration_cast<duration>(ns::min());
    if (d >= most) return ns::max().count();
    if (d <= least) return ns::min().count();
  }
  return std::chrono::duration_cast<ns>(d).count();
}

/// a - b in nanoseconds, saturated at the int64 range (readings as far apart as time_point::min() and now).
inline std::int64_t ns_between(std::int64_t a, std::int64_t b) noexcept {
  if (b < 0 && a > INT64_MAX + b) return INT64_MAX;
  if (b > 0 && a < INT64_MIN + b) return INT64_MIN;
  return a - b;
}

/// t + d in nanoseconds, saturated at the int64 range (an instant plus a pause as long as nanoseconds::max()).
inline std::int64_t ns_after(std::int64_t t, std::int64_t d) noexcept {
  if (d > 0 && t > INT64_MAX - d) return INT64_MAX;
  if (d < 0 && t < INT64_MIN - d) return INT64_MIN;
  return t + d;
}

/// `d` (floating point, e.g. a server's retry-after in microseconds) as a Duration, rounded up and
/// saturated: at most Duration::max(); NaN and values <= 0 give zero.
template <class Duration, class Period>
Duration ceil_duration(std::chrono::duration<double, Period> d) noexcept {
  if (!(d.count() > 0)) return Duration::zero();
  using fractional = std::chrono::duration<double, Period>;
  // A margin of one part in 1e9 below the limit, so that rounding to the next tick cannot overflow.
  if (d.count() >= std::chrono::duration_cast<fractional>(Duration::max()).count() * (1 - 1e-9)) return Duration::max();
  return std::chrono::ceil<Duration>(d);
}

/// t + d, saturated at time_point::max() (d >= 0).
template <class TimePoint>
TimePoint add_saturated(TimePoint t, typename TimePoint::duration d) noexcept {
  return t > TimePoint::max() - d ? TimePoint::max() : t + d;
}

}  // namespace rein::detail
