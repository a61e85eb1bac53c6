// The order in which a limiter serves its waiters, and what a full line does with one more.
#pragma once

#include <chrono>
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
  /// Priority classes with aging: each acquire names a class (`limiter.at_priority(c)`, 0 the most urgent,
  /// plain acquires class 0) and waiters are served by the key `arrival + c * priority_aging` (the options'
  /// field), smallest first, the earlier arrival first on equal keys. A lower class therefore yields to the
  /// classes above it, but only for a bounded time: a class-c waiter that arrives at t is served before
  /// every waiter of class 0 that arrives after t + c * priority_aging (of class k: after
  /// t + (c - k) * priority_aging), however many keep coming. This is strict priority with aging, as in
  /// the schedulers of operating systems; priority_aging = nanoseconds::max() gives strict priority (a
  /// lower class may then starve), 0 gives arrival order (as fifo, but a full line with evict_oldest refuses
  /// the newcomer: it is the one served last). A newcomer placed at the head is granted at once when it
  /// fits, as in lifo order; waiters behind the head wait (head-of-line semantics hold by key). Cost: a
  /// newcomer is placed by a walk from the back, under the lock, past the waiters keyed after it: none
  /// while callers arrive in key order (one class, or aging 0), one per passed waiter otherwise (an urgent
  /// call behind thousands of batch waiters passes thousands): bound the line with `max_waiters`.
  priority,
};

/// The default `priority_aging` of every limiter's options: a waiter of class c is served no later than
/// the class-0 waiters arriving c seconds after it.
inline constexpr std::chrono::nanoseconds default_priority_aging = std::chrono::seconds(1);

/// What a full line (`max_waiters` waiting) does with one more waiter (every limiter's options:
/// `when_full`).
enum class queue_full_policy : std::uint8_t {
  /// The new waiter completes at once with errc::queue_full (the default: backpressure on the newcomer).
  reject_newest,
  /// The waiter that has waited longest completes with errc::queue_full and the new one joins the line
  /// (.NET's QueueProcessingOrder.NewestFirst): the line keeps the callers most likely still to care. With
  /// `max_waiters` 0 there is nobody to evict and the new waiter is refused. In priority order the waiter
  /// with the largest key (the one that would be served last) leaves instead, so that an urgent newcomer
  /// displaces the least urgent waiter; a newcomer that would itself be served last is refused.
  evict_oldest,
};

/// "fifo", "lifo", "priority".
constexpr const char* to_string(queue_order o) noexcept {
  switch (o) {
    case queue_order::lifo: return "lifo";
    case queue_order::priority: return "priority";
    case queue_order::fifo: break;
  }
  return "fifo";
}

/// "reject_newest", "evict_oldest".
constexpr const char* to_string(queue_full_policy p) noexcept {
  return p == queue_full_policy::evict_oldest ? "evict_oldest" : "reject_newest";
}

}  // namespace rein
