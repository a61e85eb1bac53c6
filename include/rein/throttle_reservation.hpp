// A reservation through a throttle (rein/throttle.hpp): the binding rate stages' units reserved now, for
// the latest time any rate stage is ready; the wait then admits the call and hands out the throttle's guard.
#pragma once

#include <rein/config.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/error.hpp>
#include <rein/throttle_charge.hpp>
#include <rein/throttle_guard.hpp>
#include <rein/throttle_snapshot.hpp>
#include <rein/try_result.hpp>

#include REIN_ASIO_HEADER(async_result.hpp)
#include REIN_ASIO_HEADER(awaitable.hpp)
#include REIN_ASIO_HEADER(basic_waitable_timer.hpp)
#include REIN_ASIO_HEADER(error.hpp)
#include REIN_ASIO_HEADER(redirect_error.hpp)
#include REIN_ASIO_HEADER(use_awaitable.hpp)
#include REIN_ASIO_HEADER(wait_traits.hpp)

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace rein {

/// What `throttle.reserve(key, c)` returns: when every rate stage of the throttle (global and the key's)
/// can take the charge, the latest time any of them needs, with the units of the stages that need that
/// time reserved now. Reserve now, learn the `delay()`, then `co_await r.wait()` for the throttle's guard,
/// or go to another host or model and `cancel()` to give the units back: rein::basic_reservation (Go's
/// `Reservation`) for a whole throttle.
///
/// ```
/// auto r = throttle.reserve(host, {.requests = 1, .tokens = 800});
/// if (r && r.delay() < 200ms) {
///   auto guard = co_await r.wait();  // at time_to_act(), then the other stages, as an acquire
///   guard.complete(rein::outcome::success);
/// } else {
///   r.cancel();  // the reserved units back, by each stage's rule; try elsewhere
/// }
/// ```
/// (From tests/async/reserve.cpp, which compiles and runs it.)
///
/// At reserve, at one instant: every admission stage decides the call (a refusal: not ok, and the stage has
/// counted the request, as on any door), each keyed stage's limiter is pinned for the key (and stays pinned
/// while the reservation or its wait lives), a paused gate refuses, and every rate stage charged more than 0
/// is looked at, taking nothing: one that has callers waiting on its line or cannot hold the charge makes
/// the reservation not ok, with nothing reserved (a closed stage refuses at its reserve when it binds, and
/// otherwise fails the wait with errc::closed, as it fails an acquire). time_to_act() is the latest time a rate stage
/// is ready; only the stages ready then (the binding ones) reserve, each with its own `reserve(n)` (first
/// come, first served behind its earlier reservations, never ahead of its own time). The rate stages ready
/// earlier are not reserved, and the concurrency stages are not asked: no stage counts the call before it
/// can be sent, and a slow key's reservation never holds a stage that other keys share.
///
/// The wait, at time_to_act(), admits the call as the throttle's async_acquire does (gates, permits, the
/// rate stages not reserved), the reserved units held as long as that goes on without waiting. Before a
/// wait of any kind (a paused gate, a busy permit, a rate stage emptied by others meanwhile) the reserved
/// units go back, each by its stage's cancel rule at that moment (all of them at time_to_act(); a refund of
/// them once it has passed), and the call goes on as an acquire, its rates taken when it can be sent: a
/// reopening gate or a freed permit lets reserved calls through at their rates, not in one burst. So
/// time_to_act() is exact when the binding stages' units are the only thing the call waits for; stages
/// ready earlier, gates and permits are taken at the wait, which may pass time_to_act() if others took
/// them meanwhile. The admitted guard holds the units as an acquire's guard does (its refund and reconcile
/// treat them alike), and each stage counts them as one acquisition (its `acquired_total`, the throttle's
/// stages[i].admitted: the sum rule of rein::throttle_snapshot holds).
///
/// Every rate stage must reserve (a rein::basic_rate_limiter of a token bucket, a fixed or sliding window,
/// or rein::rate_limits of those): `reserve` does not compile for a throttle that lists another rate stage
/// (an adaptive rate, the Redis bucket).
///
/// @par Units
/// Times are the throttle's clock; each rate stage reserves its share of the charge (its units_of).
///
/// @par Errors
/// A reservation that is not ok holds nothing: `status()` is busy (a gate is paused, an admission stage
/// refused, someone waits on a rate stage's line, too many keys, a limit that cannot count that far, or
/// other callers kept moving a binding stage's time during the reserve),
/// closed (a rate stage was closed) or exceeds_capacity (the charge exceeds a rate stage's capacity);
/// `rejected_at()` and `rejected_stage()` say where, `delay()` is `duration::max()`, and `wait()` fails at
/// once with `error()`: errc::admission_refused, errc::queue_full (too many keys), errc::closed,
/// errc::exceeds_capacity, or `net::error::would_block` (a paused gate, a busy rate stage).
/// A wait fails as the throttle's async_acquire does (errc::closed, errc::queue_full,
/// errc::upstream_unavailable, errc::exceeds_capacity, operation_aborted), and then gives back what it
/// holds: the reserved units by the rules above. A binding stage closed after the reserve keeps the
/// reservation's units as rein::basic_reservation does (its close() leaves standing reservations), so the
/// wait still admits with them; another stage closed meanwhile fails the wait with errc::closed.
///
/// @par Cancellation
/// `cancel()` gives the reserved units back by each stage's own rule (basic_reservation::cancel: all of
/// them before time_to_act() unless a later reservation there needs them; nothing once time_to_act() has
/// passed), ends a wait still before time_to_act() with operation_aborted, and makes later waits fail so.
/// Once the clock has reached time_to_act() with a wait started (whether or not its coroutine has resumed)
/// the units are that wait's, and cancel() gives nothing and does not end it: cancel the wait through its
/// token's cancellation slot. A wait cancelled so (terminal, partial or total), before or after
/// time_to_act(), completes with operation_aborted and gives back what it holds.
///
/// @par Destruction
/// Destroying a reservation gives nothing back (its units are spent, as in Go) and unpins its keys; a wait
/// already started goes on to its guard.
///
/// @par Thread Safety
/// One reservation is used by one caller at a time (its wait's completion included, unless on one strand).
/// The throttle and its stages may be used concurrently with it.
///
/// @par Lifetime
/// Move-only; a moved-from reservation may only be destroyed or assigned to. It must not be used after
/// its throttle is destroyed, except to be destroyed; a wait started before fails with operation_aborted.
///
/// @tparam Throttle the rein::throttle that made it.
template <class Throttle>
class throttle_reservation {
 public:
  /// What wait() gives: the throttle's guard.
  using guard = throttle_guard<Throttle>;
  /// The throttle's clock.
  using clock_type = typename Throttle::clock_type;
  /// A point in time of `clock_type`.
  using time_point = typename Throttle::time_point;
  /// A duration of `clock_type`.
  using duration = typename Throttle::duration;
  /// rejected_stage() of a reservation that is ok.
  static constexpr std::size_t npos = guard::npos;

  /// Moves the reservation: its units, time, pins and wait go with it.
  throttle_reservation(throttle_reservation&&) noexcept = default;
  /// Drops this reservation as the destructor does (nothing given back), then takes `other`'s.
  throttle_reservation& operator=(throttle_reservation&&) noexcept = default;
  throttle_reservation(const throttle_reservation&) = delete;
  throttle_reservation& operator=(const throttle_reservation&) = delete;
  /// Gives nothing back (see the class).
  ~throttle_reservation() = default;

  /// Whether the reservation was made (every rate stage could take the charge, the binding ones reserved).
  bool ok() const noexcept { return s_->status == try_status::acquired; }
  /// As ok().
  explicit operator bool() const noexcept { return ok(); }
  /// acquired when ok(); otherwise busy, closed or exceeds_capacity (see the class).
  try_status status() const noexcept { return s_->status; }
  /// Why a wait fails at once (see the class); empty when ok().
  error_code error() const noexcept { return s_->error; }
  /// The kind of stage that refused, or throttle_stage::none.
  throttle_stage rejected_at() const noexcept { return s_->rejected_at; }
  /// The position of the stage that refused in the throttle's list, or npos.
  std::size_t rejected_stage() const noexcept { return s_->rejected_stage; }
  /// The charge reserved.
  const rein::charge& charged() const noexcept { return s_->charge; }
  /// The key reserved for.
  const std::string& key() const noexcept { return s_->key; }

  /// The latest time any rate stage is ready for the charge (the binding stages' units are reserved for
  /// it); `time_point::max()` when not ok. The reserve time itself when no rate stage is charged.
  time_point time_to_act() const noexcept { return s_->at; }
  /// How long from now until time_to_act(): 0 once it is reached, `duration::max()` when not ok.
  duration delay() const { return delay_from(clock_type::now()); }
  /// How long from `now` until time_to_act().
  duration delay_from(time_point now) const noexcept {
    if (!ok()) return duration::max();
    return s_->at > now ? s_->at - now : duration::zero();
  }

  /// Gives the reserved units back by each stage's rule, unless the clock has reached time_to_act() with a
  /// wait started (see the class's Cancellation), unpins the keys, and ends a wait still before
  /// time_to_act() with operation_aborted. A second cancel gives nothing. Each rate stage's snapshot counts
  /// what it gave back (reserved_returned_total).
  void cancel() {
    // A wait that reached time_to_act() (on the clock: its coroutine may not have resumed yet) owns them.
    if (s_->handed || (s_->waited && ok() && clock_type::now() >= s_->at)) return;
    s_->cancelled = true;
    Throttle::stage_ops::cancel_reserved(s_->rates);
    if (s_->timer) s_->timer->cancel();  // a wait before time_to_act() ends now, aborted
    if (!s_->waited) s_->g = guard();
  }

  /// Waits until time_to_act(), then admits the call as async_acquire does (see the class: the reserved
  /// units held while it goes on without waiting) and completes with the admitted guard. Signature
  /// `void(error_code, guard)`; on failure the guard is empty and rejected_stage(), rejected_at() and
  /// error() say where and why. Fails at once with error() when not ok, with operation_aborted after
  /// cancel(), with `net::error::already_started` for a second wait, and with the errors and cancellation
  /// of the class. The handler is never invoked from inside this function.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, guard)) Token = default_token_t>
  auto async_wait(Token&& token = Token{}) {
    return net::async_initiate<Token, void(error_code, guard)>(typename Throttle::initiate_reserved{s_}, token);
  }

  /// Waits inside a coroutine, as async_wait; throws rein::throttle_error (naming the stage and the key).
  net::awaitable<guard> wait() { return wait_on(s_); }

 private:
  friend Throttle;
  using stage_ops = typename Throttle::stage_ops;

  // Shared with the wait, which may outlive the reservation object.
  struct state {
    Throttle* owner;
    typename Throttle::executor_type executor;
    std::string name;  // the throttle's, for the wait's errors
    std::string key;
    rein::charge charge;
    guard g;  // the pins and the admission stages' decisions, handed to the wait
    typename stage_ops::rate_reservations rates{};
    time_point at = time_point::max();
    try_status status = try_status::busy;
    error_code error{};
    throttle_stage rejected_at = throttle_stage::none;
    std::size_t rejected_stage = npos;
    bool waited = false;
    bool cancelled = false;
    bool handed = false;  // the wait reached time_to_act(): the units are its admission's (a claim, then spent)
    // The wait's timer until time_to_act() (made by the wait): its own, not a stage reservation's wait,
    // so that a cancelled wait gives the units back by the claim's rule (a refund once time_to_act() has
    // passed), which a stage reservation's cancel would not (it gives nothing then).
    std::unique_ptr<net::basic_waitable_timer<clock_type, net::wait_traits<clock_type>,
                                              typename Throttle::executor_type>>
        timer;

    state(Throttle* t, typename Throttle::executor_type ex, std::string n, std::string_view k, const rein::charge& c)
        : owner(t), executor(std::move(ex)), name(std::move(n)), key(k), charge(c) {}
  };

  explicit throttle_reservation(std::shared_ptr<state> s) noexcept : s_(std::move(s)) {}

  // wait()'s frame holds the state, not the reservation object (which may be moved or gone meanwhile).
  static net::awaitable<guard> wait_on(std::shared_ptr<state> s) {
    error_code ec;
    auto token = net::redirect_error(net::use_awaitable, ec);
    // Made in a statement of its own: with the initiation a temporary of the co_await's full-expression,
    // g++ 12 left the state one reference short (ASan: a use after free once the reservation was dropped).
    auto waiting = net::async_initiate<decltype(token), void(error_code, guard)>(
        typename Throttle::initiate_reserved{s}, token);
    guard g = co_await std::move(waiting);
    if (ec) throw detail::throttle_failure(ec, s->name, g.rejected_stage(), g.rejected_at(), s->key);
    co_return std::move(g);
  }

  std::shared_ptr<state> s_;
};

}  // namespace rein
