// The order in which a limiter serves its waiters, and what a full line does with one more.
#pragma once

#include <chrono>
#include <cstdint>

namespace rein {

/// The order in which a limiter's waiting line serves its waiters (rein::line_options::order).
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
  /// Fair sharing between keys: each acquire names a key and a weight (`limiter.for_key(key, w)`, w from 1
  /// to 1,000,000; plain acquires are the key "" at weight 1), and while keys wait, each is served its
  /// weight's share of the units the line grants, whatever its arrival rate: a tenant flooding the line
  /// waits behind its own backlog, not in front of the others. The rule is start-time fair queueing (Goyal,
  /// Vin and Cheng, 1996), a weighted round robin whose rounds are as fine as one request: a waiter of key k
  /// asking n gets the start tag max(V, F_k) and moves the key's finish tag F_k past it by n / w; waiters
  /// are served by start tag, smallest first, the earlier arrival first on equal tags; V is the start tag of
  /// the last waiter served, or of the first waiter if that is larger. The bound: between two keys that
  /// wait throughout an interval, the units / weight granted to each in it differ by at most
  /// n_i / w_i + n_j / w_j (one request of each); with partitions, a partition below its guarantee is served
  /// out of tag order, and the bound holds between keys of one partition only. A key with no waiter gives
  /// its share to the others and comes back with no credit saved up, joining the round being served: a
  /// newcomer is never placed ahead of the first waiter, so keys arriving one after another cannot keep
  /// passing a weighted first waiter that waits to fit. Only waiters are scheduled: while nobody waits, an
  /// acquire that fits is granted at once, as in every order, and when the line empties all keys start again
  /// level. A waiter that leaves without a grant (cancelled, timed out, evicted) still counts against its
  /// key until the line empties: giving up costs its own key's turn, never another's. Tags are doubles:
  /// within one busy period of more than about 2^32 units granted at weight 1, the smallest shares (n / w
  /// near 1e-6) may tie and be served in arrival order.
  /// Keys are told apart by std::hash of the key (64 bits on a 64-bit target; two keys that collide share one
  /// turn). The hash is not keyed: where tenants choose their own keys, one could pick a key that collides
  /// with another's on purpose; map such keys to names you choose before for_key.
  /// Cost: each waiter carries a 72-byte node (its tag, key and weight, and room for a deadline); a
  /// newcomer is placed by a walk from both ends of the line at once, under the lock, which passes the fewer
  /// of the waiters tagged before and after it (few for a key that was idle and for a flooding key's own
  /// next waiter; up to half the line for a key in between): bound the line with `max_waiters`. The line
  /// keeps a table of the keys that waited since it was last empty (24-byte slots, 2 to 8 per key; grown
  /// under the lock; freed when the line empties after a busy period that used under a sixteenth of it, so
  /// up to 16 slots per key of the busiest recent period). The quota gate and the Redis limiters' lines stay
  /// fifo.
  fair,
};

/// The default of rein::line_options::priority_aging: a waiter of class c is served no later than
/// the class-0 waiters arriving c seconds after it.
inline constexpr std::chrono::nanoseconds default_priority_aging = std::chrono::seconds(1);

/// What a full line (`max_waiters` waiting) does with one more waiter (rein::line_options::when_full).
enum class queue_full_policy : std::uint8_t {
  /// The new waiter completes at once with errc::queue_full (the default: backpressure on the newcomer).
  reject_newest,
  /// The waiter that has waited longest completes with errc::queue_full and the new one joins the line
  /// (.NET's QueueProcessingOrder.NewestFirst): the line keeps the callers most likely still to care. With
  /// `max_waiters` 0 there is nobody to evict and the new waiter is refused. In priority order the waiter
  /// with the largest key (the one that would be served last) leaves instead, so that an urgent newcomer
  /// displaces the least urgent waiter (in fair order: the waiter with the latest start tag, most likely
  /// of the key with the longest backlog); a newcomer that would itself be served last is refused.
  evict_oldest,
};

/// "fifo", "lifo", "priority", "fair".
constexpr const char* to_string(queue_order o) noexcept {
  switch (o) {
    case queue_order::lifo: return "lifo";
    case queue_order::priority: return "priority";
    case queue_order::fair: return "fair";
    case queue_order::fifo: break;
  }
  return "fifo";
}

/// "reject_newest", "evict_oldest".
constexpr const char* to_string(queue_full_policy p) noexcept {
  return p == queue_full_policy::evict_oldest ? "evict_oldest" : "reject_newest";
}

}  // namespace rein
