// What a try_acquire that never waits says: taken, or why not, and for rate limits when to try again.
#pragma once

#include <rein/permit.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <utility>

namespace rein {

/// Why a try_acquire took nothing (or that it took what it asked for).
enum class try_status : std::uint8_t {
  acquired,          ///< taken
  busy,              ///< not now: no room, or others wait (a waiter is never overtaken)
  closed,            ///< the limiter was closed
  exceeds_capacity,  ///< more than the limiter can ever grant at once
  unavailable,       ///< refused: the dependency is treated as down (an adaptive limiter's open circuit)
};

/// A readable name for a try_status ("acquired", "busy", "closed", "exceeds_capacity", "unavailable").
constexpr const char* to_string(try_status s) noexcept {
  switch (s) {
    case try_status::acquired: return "acquired";
    case try_status::busy: return "busy";
    case try_status::closed: return "closed";
    case try_status::exceeds_capacity: return "exceeds_capacity";
    case try_status::unavailable: return "unavailable";
  }
  return "unknown";
}

/// The result of a rate limiter's or a gate's try_acquire: true if the units were taken; otherwise why not
/// and, for a rate limit, when the same request would succeed, so that a server can put it in its own
/// Retry-After (Go's `Reservation.Delay`, governor's `NotUntil`, .NET's `RetryAfter` lease metadata).
class try_result {
 public:
  /// A refusal (busy) with no retry hint.
  constexpr try_result() noexcept = default;

  /// `retry_after_ns` < 0 means unknown.
  constexpr explicit try_result(try_status status, std::int64_t retry_after_ns = -1) noexcept
      : retry_ns_(retry_after_ns), status_(status) {}

  /// True if the units were taken.
  constexpr explicit operator bool() const noexcept { return status_ == try_status::acquired; }

  /// acquired, or why nothing was taken.
  constexpr try_status status() const noexcept { return status_; }

  /// For `busy` from a rate limit or a paused gate: how long from the call until the same request would
  /// be taken if nothing else changed (when others wait, a lower bound: they go first), in nanoseconds;
  /// `nanoseconds::max()` when never at the current rate, or when the wait is too long to count in
  /// nanoseconds (as from a `try_acquire_at` reading of time_point::min()). nullopt for other statuses, and where only an event
  /// can help (a concurrency limiter waits for releases).
  constexpr std::optional<std::chrono::nanoseconds> retry_after() const noexcept {
    if (status_ != try_status::busy || retry_ns_ < 0) return std::nullopt;
    return std::chrono::nanoseconds(retry_ns_);
  }

 private:
  std::int64_t retry_ns_ = -1;
  try_status status_ = try_status::busy;
};

/// The result of a concurrency limiter's try_acquire: a rein::permit (true if it holds its slots) that also
/// says why it is empty. It converts to a plain permit: `rein::permit p = sem.try_acquire();`.
class try_permit : public permit {
 public:
  /// An empty permit, busy.
  try_permit() noexcept = default;
  /// An empty permit refused for `status`.
  explicit try_permit(try_status status) noexcept : status_(status) {}
  /// A granted permit.
  explicit try_permit(permit p) noexcept : permit(std::move(p)), status_(try_status::acquired) {}

  /// acquired while it holds its slots as granted; otherwise why it is empty (a released permit still says
  /// acquired).
  try_status status() const noexcept { return status_; }

 private:
  try_status status_ = try_status::busy;
};

}  // namespace rein
