// Stepping time by hand: rein::testing::manual_clock plus a polled io_context.
#pragma once

#include "support/asio.hpp"

#include <rein/testing/manual_clock.hpp>

#include <chrono>
#include <cstddef>

namespace rein_test {

using rein::testing::manual_clock;

/// Moves the manual time forward by d (rounded up to whole nanoseconds), then polls `io`: every handler
/// whose timer the new time has reached runs, in expiry order, and so does whatever they post.
/// Returns the number of handlers run.
template <class Rep, class Period>
std::size_t advance_and_poll(net::io_context& io, std::chrono::duration<Rep, Period> d) {
  manual_clock::advance(std::chrono::ceil<manual_clock::duration>(d));
  return poll(io);
}

/// Sets the manual time to `t`, then polls `io`.
inline std::size_t set_and_poll(net::io_context& io, manual_clock::time_point t) {
  manual_clock::set(t);
  return poll(io);
}

/// The manual time as a duration since its epoch: handy in exact assertions (`CHECK(since_epoch() == 50ms)`).
inline manual_clock::duration since_epoch() noexcept { return manual_clock::now().time_since_epoch(); }

/// Resets the manual clock to its epoch when constructed; declare one first thing in each test case.
struct manual_clock_at_epoch {
  manual_clock_at_epoch() noexcept { manual_clock::reset(); }
};

}  // namespace rein_test
