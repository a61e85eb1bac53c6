// The seam for an admission rule that lives elsewhere (a server): asynchronous admission on the wait line.
// Not API.
//
// A remote policy is an admission_policy (admission_policy.hpp) whose answer for a waiter may need a round
// trip. It does no I/O itself: it says what to send (messages gathered in its outbox), and the line's owner
// hands the verdicts back (sans-I/O, as boostorg/redis keeps its protocol state machines apart from the
// socket), so the whole admission logic runs in a test with hand-made verdicts and no server.
//
// What the line does for such a policy (line_remote.hpp and limiter_core.hpp, `if constexpr (remote)`):
// - Every waiter joins the queue first; there is no synchronous grant in async_acquire.
// - "In flight" is a state of a queued op (remote_wait_op::in_flight): its request is out and it stays in its
//   place in the line (it counts as waiting, its deadline and cancellation still apply). The line walks the
//   queue from the front and asks `admit` for each op that is not in flight, in order, until one must wait:
//   FIFO with head-of-line blocking among the waiting ones, while up to the policy's window of requests
//   are pipelined ahead of them.
// - An op that leaves the line while in flight (cancelled, timed out, closed) is `forget`-ten: the policy
//   keeps the ticket and decides what its late verdict does (a Redis bucket refunds a late "allowed").
// - Grants are revocable at any time (the tokens are given back to the server), not only at the instant of
//   the grant as for a local time-based policy: `on_revoke(n, granted_at, now)`, told when the grant was
//   made, so that a policy that also grants locally (fail-open) gives a local grant back locally.
// - The outbox is taken under the lock after every step and handed to the line's transport after the
//   unlock, never under the lock.
// - `max_waiters` counts the ops that wait their turn, not those in flight.
//
// The members (all under the line's lock, neither blocking nor calling user code):
//   using outbox = ...                       what to send; default-constructible, `empty()`, movable
//   remote_step admit(op, n, now)            the first not-in-flight op wants n: grant, wait, sent (with
//                                            its ticket; the policy keeps `op` as an opaque handle for the
//                                            verdict) or fail (with the error the handler gets; `refuse`
//                                            also names the reject_reason the line counts it under)
//   remote_settled settle(args..., now)      a verdict came back (args are the policy's own: a ticket and
//                                            what the server said): which op it was for (null: forgotten)
//                                            and its fate: grant, wait (back in line), keep (still in
//                                            flight, e.g. asked again) or fail
//   void on_denied(bool first_waiting)       after a settle that sent an op back to wait: whether no other
//                                            waiting op is ahead of it (a denial then holds the line)
//   void forget(ticket)                      the op of `ticket` left the line while in flight
//   void take_outbox(outbox&)                move what is to be sent into the argument
//   ready_at(n, now)                         as for any policy, for the first not-in-flight op;
//                                            time_point::max() while only a verdict can move it
#pragma once

#include <rein/config.hpp>
#include <rein/observer.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>

namespace rein::detail {

struct wait_op;

/// A remote policy's answer for one waiter.
struct remote_step {
  enum class kind : std::uint8_t {
    grant,  ///< admitted (locally, or by the verdict just settled)
    wait,   ///< not now: the op waits its turn (ready_at says until when)
    sent,   ///< its request went to the outbox under `ticket`: the op is in flight
    keep,   ///< (settle only) the verdict asked for another round trip: still in flight
    fail,   ///< refused with `error`: the op completes with it
  };
  kind what = kind::wait;
  std::uint64_t ticket = 0;
  error_code error{};
  /// fail: whether the line counts it as a rejection for `reason` (rejected_total, the observer's events);
  /// false for an error that refuses nothing (a server's error reply).
  bool rejects = false;
  reject_reason reason = reject_reason::closed;

  static remote_step grant() noexcept { return {kind::grant, 0, {}}; }
  static remote_step wait() noexcept { return {kind::wait, 0, {}}; }
  static remote_step sent(std::uint64_t ticket) noexcept { return {kind::sent, ticket, {}}; }
  static remote_step keep() noexcept { return {kind::keep, 0, {}}; }
  static remote_step fail(error_code ec) noexcept { return {kind::fail, 0, ec}; }
  /// A failure that turns the caller away for `why` (counted and reported as such by the line).
  static remote_step refuse(error_code ec, reject_reason why) noexcept { return {kind::fail, 0, ec, true, why}; }
};

/// What a verdict settled: the op it was for (null if that op already left the line) and its fate.
struct remote_settled {
  wait_op* op = nullptr;
  remote_step step{};
};

/// Where a remote line's outbox goes once the lock is released (the I/O side: a connection).
template <class Outbox>
class remote_transport {
 public:
  /// Sends what is in `sends` (called outside the line's lock, possibly from several threads at once).
  /// A request that cannot be sent must be settled back into the line as a failure by the transport.
  virtual void transmit(Outbox& sends) noexcept = 0;

 protected:
  ~remote_transport() = default;
};

template <class P, class TimePoint>
concept remote_policy = requires(P& p, wait_op* op, std::size_t n, TimePoint now, std::uint64_t ticket, typename P::outbox& out) {
  { p.admit(op, n, now) } -> std::same_as<remote_step>;
  p.forget(ticket);
  p.on_denied(true);
  p.take_outbox(out);
  { out.empty() } -> std::convertible_to<bool>;
};

/// The outbox of a policy whose admission is asynchronous; an empty one otherwise.
struct no_outbox {
  static constexpr bool empty() noexcept { return true; }
};
template <class Policy, bool Remote>
struct outbox_of {
  using type = no_outbox;
};
template <class Policy>
struct outbox_of<Policy, true> {
  using type = typename Policy::outbox;
};

}  // namespace rein::detail
