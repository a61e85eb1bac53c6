// The order in which a limiter serves its waiters, and what a full line does with one more.
#pragma once

#include <cstdint>

namespace rein {

/// The order in which a limiter's waiting line serves its waiters (every limiter's options: `order`).
///
/// Weighted requests keep head-of-line semantics in either order: the waiter at the head (the oldest in
/// fifo, the newest in lifo) is served first, and waiters behind it wait even when their smaller request
/// would fit. In fifo order a large request is therefore never starved by small ones; in lifo order a
/// newcomer that fits is served at once, ahead of a large waiter, which can then wait as long as small
/// requests keep coming. The quota gate accepts fifo only (its jittered release follows arrival order).
enum class queue_order : std::uint8_t {
  /// Oldest first (the default): every waiter is served in its turn.
  fifo,
  /// Newest first. Under overload the oldest callers are the likeliest to have given up already (their own
  /// caller timed out), so serving the newest keeps the served calls useful (Netflix concurrency-limits'
  /// LifoBlockingLimiter). An older waiter can wait as long as newer ones keep arriving: pair it with a
  /// deadline. A new acquire is granted at once when it fits, even if others wait (it is the newest);
  /// try_acquire still grants only when nobody waits.
  lifo,
};

/// What a full line (`max_waiters` waiting) does with one more waiter (every limiter's options:
/// `when_full`).
enum class queue_full_policy : std::uint8_t {
  /// The new waiter completes at once with errc::queue_full (the default: backpressure on the newcomer).
  reject_newest,
  /// The waiter that has waited longest completes with errc::queue_full and the new one joins the line
  /// (.NET's QueueProcessingOrder.NewestFirst): the line keeps the callers most likely still to care. With
  /// `max_waiters` 0 there is nobody to evict and the new waiter is refused.
  evict_oldest,
};

/// "fifo", "lifo".
constexpr const char* to_string(queue_order o) noexcept { return o == queue_order::lifo ? "lifo" : "fifo"; }

/// "reject_newest", "evict_oldest".
constexpr const char* to_string(queue_full_policy p) noexcept {
  return p == queue_full_policy::evict_oldest ? "evict_oldest" : "reject_newest";
}

}  // namespace rein
