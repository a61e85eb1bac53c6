// A clock that moves only when a test says so, and the wait traits that let Asio timers use it.
#pragma once

#include <rein/config.hpp>
#include <rein/detail/asio_header.hpp>

#include REIN_ASIO_HEADER(wait_traits.hpp)

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace rein::testing {

/// A settable process-wide clock for deterministic tests of time-based behaviour.
///
/// Use it as any limiter's Clock parameter (and for your own `basic_waitable_timer<manual_clock>`), then
/// drive time by hand: `manual_clock::advance(100ms); io.poll();` runs every handler whose timer expiry the
/// manual time has reached, in expiry order, and nothing else. Tests never sleep.
///
/// @par Reactor requirement
/// Asio's epoll reactor on Linux arms a timerfd from *real* time, so it would not notice that the manual time
/// moved. Compile test binaries that use manual_clock with `BOOST_ASIO_DISABLE_EPOLL` (standalone:
/// `ASIO_DISABLE_EPOLL`) in every translation unit: the select reactor then checks timers on each `poll()`.
/// rein's own tests do this in tests/CMakeLists.txt.
///
/// @par Thread Safety
/// now(), advance() and set() are atomic; the time is shared by the whole process (Asio's timer traits call a
/// static now()), so tests that use it must not run concurrently with one another.
class manual_clock {
 public:
  /// Ticks are nanoseconds, counted in 64 bits.
  using rep = std::int64_t;
  /// One tick is a nanosecond.
  using period = std::nano;
  /// Nanoseconds.
  using duration = std::chrono::nanoseconds;
  /// A point in manual time.
  using time_point = std::chrono::time_point<manual_clock, duration>;
  /// false: set() may move the time anywhere, backwards too.
  static constexpr bool is_steady = false;  // set() may move it anywhere

  /// The current manual time.
  static time_point now() noexcept { return time_point(duration(ticks().load(std::memory_order_acquire))); }

  /// Moves the time forward by d (d < 0 is treated as 0: time never runs backwards through advance()).
  static void advance(duration d) noexcept {
    ticks().fetch_add(std::max(d.count(), rep{0}), std::memory_order_acq_rel);
  }

  /// Sets the time to t.
  static void set(time_point t) noexcept { ticks().store(t.time_since_epoch().count(), std::memory_order_release); }

  /// Back to the epoch (time zero); call at the start of each test.
  static void reset() noexcept { set(time_point{}); }

 private:
  static std::atomic<rep>& ticks() noexcept {
    static std::atomic<rep> value{0};
    return value;
  }
};

}  // namespace rein::testing

/// @cond
/// Asio waits on a manual_clock timer for at most 1 ms of real time before looking at the manual time again,
/// so a blocking `run()` on another thread also notices `advance()`; `poll()` never waits.
template <>
struct REIN_ASIO_NAMESPACE::wait_traits<rein::testing::manual_clock> {
  using clock = rein::testing::manual_clock;
  static clock::duration to_wait_duration(const clock::duration& d) {
    return std::clamp(d, clock::duration::zero(), clock::duration(std::chrono::milliseconds(1)));
  }
  static clock::duration to_wait_duration(const clock::time_point& t) { return to_wait_duration(t - clock::now()); }
};
/// @endcond
