// A window cut into equal slices aligned to the clock's epoch, as the retry budget and the admission
// throttle count it: the slice a time falls in, and the width of a slice. Not API.
#pragma once

#include <rein/detail/invalid_option.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace rein::detail {

/// The index of the slice of width `width` (> 0) that holds `now`: floor(ticks / width), negative times too.
template <class TimePoint>
std::int64_t slice_index(TimePoint now, typename TimePoint::duration width) noexcept {
  const auto ticks = now.time_since_epoch().count();
  const auto q = ticks / width.count();
  return static_cast<std::int64_t>(q - ((ticks % width.count() != 0 && ticks < 0) ? 1 : 0));
}

/// `window` / `slices` in ticks of `Duration`, so that the slices add up to the window exactly.
/// @throws std::invalid_argument "<type>: <field> must be a positive multiple of <slices> clock ticks, got
/// <window> ns" otherwise.
template <class Duration>
Duration slice_width(std::string_view type, std::string_view field, std::chrono::nanoseconds window,
                     std::int64_t slices) {
  const auto ticks = std::chrono::duration_cast<Duration>(window);
  if (window <= window.zero() || std::chrono::duration_cast<std::chrono::nanoseconds>(ticks) != window ||
      ticks.count() % slices != 0)
    throw_invalid(type,
                  std::string(field) + " must be a positive multiple of " + std::to_string(slices) + " clock ticks",
                  show(window));
  return ticks / slices;
}

}  // namespace rein::detail
