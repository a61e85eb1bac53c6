// The seam between the wait line (limiter_core.hpp) and an admission rule. Not API.
//
// A limiter is a policy (the admission rule: counts, tokens, a limit, a pause) on the wait line (lock, FIFO
// of parked ops, deadline heap, one timer, completion batch, statistics). The line asks the policy about the
// head of the line only, so admission is strictly FIFO with head-of-line blocking: a big request is not
// starved by small ones. Every member is called under the line's lock and must neither block nor call user
// code.
//
//   static constexpr bool needs_time    false: `now` arguments are never read (no clock on the fast path)
//   bool exceeds(n) const               n can never be granted: complete with errc::exceeds_capacity at once
//   bool try_take(n, now)               take n and return true, or change nothing and return false
//   time_point ready_at(n, now) const   the earliest instant try_take(n) succeeds if nothing else changes;
//                                       time_point::max() if only an event (a release) can make it succeed
//   optional<time_point> predict(ahead, n, now) const
//                                       a lower bound on when a waiter for n queued behind `ahead` units
//                                       would be granted; time_point::max() if never as things stand (a rate
//                                       so low that the wait is beyond the clock's range, a pause without
//                                       end); nullopt when unknown (it depends on releases). A deadline that
//                                       cannot be met fails at once.
//   void on_release(n, stamp, outcome, now)
//                                       a permit came back (concurrency limiters; `stamp` is its grant time)
// Optional:
//   void on_revoke(n, now) noexcept     a grant of n was taken back before its handler ran (a cancellation
//                                       that arrived after the grant): undo the try_take (refund tokens).
//                                       Without it, a concurrency limiter's revoked grant goes back through
//                                       on_release(n, stamp, outcome::ignored, now), and any other grant is
//                                       not revocable (the handler gets it: the grant wins).
//   static constexpr bool poolable = true, optional<size_t> lend(max) noexcept, void repay(n) noexcept
//                                       the policy is a plain count of free permits, which a thread-safe
//                                       line lends to a lock-free word between its locked calls
//                                       (detail/permit_pool.hpp): lend moves up to `max` free permits out
//                                       (nullopt: none may go through the word now), repay brings them back.
//                                       Such a policy is timeless, never refuses, and its on_release adds
//                                       the units back whenever lend would lend (the word does just that).
//   bool refuses(n, now) noexcept       true: the request fails at once with errc::upstream_unavailable (an
//                                       adaptive limiter's open circuit). Asked before try_take for every new
//                                       acquire (try_acquire says try_status::unavailable) and for the head
//                                       waiter at every dispatch, so waiters fail as soon as it turns true.
#pragma once

#include <rein/outcome.hpp>

#include <chrono>
#include <concepts>
#include <cstddef>
#include <optional>

namespace rein::detail {

template <class P, class TimePoint>
concept admission_policy = requires(P& p, const P& view, std::size_t n, TimePoint now, std::chrono::nanoseconds stamp,
                                    outcome result) {
  { P::needs_time } -> std::convertible_to<bool>;
  { view.exceeds(n) } -> std::same_as<bool>;
  { p.try_take(n, now) } -> std::same_as<bool>;
  { view.ready_at(n, now) } -> std::same_as<TimePoint>;
  { view.predict(n, n, now) } -> std::same_as<std::optional<TimePoint>>;
  p.on_release(n, stamp, result, now);
};

/// Whether the policy can undo a grant (see on_revoke above).
template <class P, class TimePoint>
concept revocable_policy = requires(P& p, std::size_t n, TimePoint now) {
  { p.on_revoke(n, now) } noexcept;
};

/// Whether a remote policy can undo a grant: `on_revoke(n, granted_at, now)`, told when the grant was made
/// (remote_admission.hpp).
template <class P, class TimePoint>
concept revocable_remote_policy = requires(P& p, std::size_t n, TimePoint now) {
  { p.on_revoke(n, now, now) } noexcept;
};

/// Whether the policy's free permits can be lent to a lock-free word (see poolable above).
template <class P>
concept poolable_policy = P::poolable && requires(P& p, std::size_t n) {
  { p.lend(n) } noexcept -> std::same_as<std::optional<std::size_t>>;
  { p.repay(n) } noexcept;
};

/// Whether the policy can refuse requests outright (see refuses above).
template <class P, class TimePoint>
concept refusing_policy = requires(P& p, std::size_t n, TimePoint now) {
  { p.refuses(n, now) } noexcept -> std::same_as<bool>;
};

}  // namespace rein::detail
