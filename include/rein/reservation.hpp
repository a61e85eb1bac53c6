// A reservation of a rate limiter's units: reserve now, learn the delay, then wait, go elsewhere or cancel
// (Go's x/time/rate Reservation) on Asio, for every limit that reserves (token bucket, windows, all_of).
#pragma once

#include <rein/algo/rate_limit.hpp>
#include <rein/config.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/detail/limiter_core.hpp>
#include <rein/detail/rate_limit_policy.hpp>
#include <rein/detail/reservation_book.hpp>
#include <rein/error.hpp>
#include <rein/try_result.hpp>

#include REIN_ASIO_HEADER(any_io_executor.hpp)
#include REIN_ASIO_HEADER(async_result.hpp)
#include REIN_ASIO_HEADER(awaitable.hpp)
#include REIN_ASIO_HEADER(basic_waitable_timer.hpp)
#include REIN_ASIO_HEADER(cancellation_state.hpp)
#include REIN_ASIO_HEADER(cancellation_type.hpp)
#include REIN_ASIO_HEADER(compose.hpp)
#include REIN_ASIO_HEADER(error.hpp)
#include REIN_ASIO_HEADER(use_awaitable.hpp)

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <utility>

namespace rein {

template <algo::rate_limit Limit, class Executor, class Mutex>
class basic_rate_limiter;

/// The reservation counters of a limiter that reserves, in its snapshot.
struct reservation_stats {
  std::uint64_t reserved_total = 0;  ///< reservations taken by reserve() (ok ones; of any count but 0)
  std::uint64_t reservations_cancelled_total = 0;  ///< of those, cancelled before their time to act
  std::uint64_t reserved_returned_total = 0;  ///< units those cancellations gave back (see reserve())
};

namespace detail {

// ` reserved=2 (cancelled=1 returned=2)` once anything was reserved; nothing before.
inline void write_reservations(std::ostream& os, const reservation_stats& s) {
  if (s.reserved_total == 0) return;
  os << " reserved=" << s.reserved_total << " (cancelled=" << s.reservations_cancelled_total
     << " returned=" << s.reserved_returned_total << ')';
}

// Copies a book's counts into a snapshot's (under the limiter's lock); zeros before the first reserve.
template <class Book, class Snapshot>
void copy_reservations(const Book* book, Snapshot& s) noexcept {
  if (!book) return;
  s.reserved_total = book->totals().reserved;
  s.reservations_cancelled_total = book->totals().cancelled;
  s.reserved_returned_total = book->totals().returned;
}

// What rein::throttle's reservation does with its rate stages' reservations beyond cancel(): `spend(r)`
// when its wait is admitted (the units are the admission's: out of the book, counted as a grant of the
// limiter), `let_go(r)` when the wait must wait elsewhere first (the limit's cancel rule while the
// reservation stands, a refund once its time passed). Not API.
struct reservation_access {
  template <class Reservation>
  static void spend(Reservation& r) noexcept {
    r.s_->spend();
  }
  template <class Reservation>
  static std::size_t let_go(Reservation& r) {
    return r.s_->let_go();
  }
};

}  // namespace detail

/// Units reserved from a rate limiter by its `reserve(n)`: counted at once, usable from `time_to_act()` on.
/// Reserve now, learn the `delay()`, then `co_await r.wait()`, or go to another host or model and
/// `cancel()` to give the units back. The peer is Go's `golang.org/x/time/rate.Reservation` (`ReserveN`,
/// `OK`, `Delay`, `CancelAt`); `wait()` is what Go leaves to the caller's `time.Sleep`.
///
/// Every rein::basic_rate_limiter whose limit is an algo::reservable_rate_limit reserves:
/// rein::basic_token_bucket (tokens; `rein::basic_token_reservation` names its reservation),
/// rein::basic_fixed_window, rein::basic_sliding_window (starts) and `rein::rate_limits<...>` of those
/// (algo::all_of: every limit reserves the n, all acting at the latest limit's time). Each limit's
/// `reserve` and `cancel_reservation` state when its units are the caller's and what a cancel gives back.
///
/// ```
/// auto r = bucket.reserve(3);
/// if (r && r.delay() < 200ms) co_await r.wait();  // at time_to_act(), on the bucket's executor
/// else r.cancel();                                 // tokens back; try elsewhere
/// ```
/// (From tests/async/reserve.cpp, which compiles and runs it.)
///
/// @par Units
/// Times are the limiter's clock (`time_to_act()`, `delay()`); counts are whole units (tokens, starts).
///
/// @par Errors
/// A reservation that is not ok took nothing: `status()` says why, `delay()` is `duration::max()`
/// (Go's `InfDuration`) and `wait()` fails at once with errc::exceeds_capacity (n above the limiter's
/// capacity: a negative count converted to std::size_t lands here too), errc::closed (the limiter was
/// closed), or `net::error::would_block` (status busy: someone waits on the limiter's line, or the limit
/// cannot count that far ahead: a token bucket's debt beyond 1e15 tokens, a fixed window's count beyond
/// 2^62, a time beyond the clock's range).
///
/// @par Cancellation
/// `cancel()` gives the units back by the limit's rule (for a token bucket, Go's `CancelAt` made right
/// where its refund was reported wrong; see `cancel()`). A wait cancelled through its completion token's
/// cancellation slot (terminal, partial or total) completes with `net::error::operation_aborted` and
/// cancels the reservation the same way; so does every wait pending or started after `cancel()`.
///
/// @par Closing
/// The limiter's `close()` leaves standing reservations as they are: their units stay counted, a wait
/// pending at close stays pending and completes at time_to_act() as before, and `cancel()` after close
/// still gives the units back by the limit's rule and ends pending waits with operation_aborted. A
/// `reserve` after close is not ok (status closed).
///
/// @par Destruction
/// Destroying a reservation gives nothing back (as in Go, its units are spent: the caller may act at
/// `time_to_act()` without waiting through it); a wait already started still completes at its time.
///
/// @par Thread Safety
/// As an Asio timer: distinct reservations are independent, one must not be used from two threads at once
/// (its waits' completions included, unless on one strand). The limiter may be used concurrently with it.
///
/// @par Lifetime
/// Move-only; a moved-from reservation may only be destroyed or assigned to. It refers to the limiter's
/// shared state, not to the limiter object: a moved limiter keeps its reservations, and a reservation that
/// outlives its limiter cancels into nothing.
///
/// @tparam Limit    the limiter's limit, an algo::reservable_rate_limit (its clock is the reservation's).
/// @tparam Executor the limiter's executor.
/// @tparam Mutex    the limiter's mutex.
template <algo::reservable_rate_limit Limit, class Executor = net::any_io_executor, class Mutex = std::mutex>
class basic_reservation {
  using Clock = typename Limit::clock;
  using limit_type = Limit;
  using policy_type = detail::rate_limit_policy<limit_type>;
  using core_type = detail::limiter_core<policy_type, Executor, Clock, Mutex, void(error_code)>;
  using book_type = detail::reservation_book<typename Clock::time_point>;
  using timer_type = typename core_type::timer_type;

 public:
  /// The executor of the limiter; waits complete on it unless their handler has an executor of its own.
  using executor_type = Executor;
  /// The limiter's clock.
  using clock_type = Clock;
  /// A point in time of `clock_type`.
  using time_point = typename Clock::time_point;
  /// A duration of `clock_type`.
  using duration = typename Clock::duration;

  /// Moves the reservation: its units, time and waits go with it.
  basic_reservation(basic_reservation&&) noexcept = default;
  /// Drops this reservation as the destructor does (nothing given back), then takes `other`'s.
  basic_reservation& operator=(basic_reservation&& other) noexcept = default;
  basic_reservation(const basic_reservation&) = delete;
  basic_reservation& operator=(const basic_reservation&) = delete;
  /// Gives nothing back (see the class).
  ~basic_reservation() = default;

  /// Whether the units were reserved (Go's `OK`).
  bool ok() const noexcept { return s_->status == try_status::acquired; }
  /// As ok().
  explicit operator bool() const noexcept { return ok(); }
  /// acquired when ok(); otherwise busy, closed or exceeds_capacity (see the class).
  try_status status() const noexcept { return s_->status; }
  /// The units asked for (a token bucket's tokens, a window's starts).
  std::size_t tokens() const noexcept { return s_->n; }

  /// When the units are the caller's, rounded up to the clock's tick: for a token bucket the instant its
  /// debt including them is repaid, for a window the instant they fit (see the limit's `reserve`);
  /// `time_point::max()` when not ok.
  time_point time_to_act() const noexcept { return s_->at; }

  /// How long from now until time_to_act(): 0 once it is reached, `duration::max()` when not ok. A cancelled
  /// reservation keeps its time (its delay says when it would have acted).
  duration delay() const { return delay_from(Clock::now()); }

  /// How long from `now` until time_to_act() (Go's `DelayFrom`).
  duration delay_from(time_point now) const noexcept {
    if (!ok()) return duration::max();
    return s_->at > now ? s_->at - now : duration::zero();
  }

  /// Gives the units back, as many as the limit's rule allows while the reservations made after this one
  /// stand (the limit's `cancel_reservation`, at the clock's now), and grants the limiter's waiters that now
  /// fit. Pending waits complete with operation_aborted. It gives back nothing once time_to_act() has
  /// passed (the units are spent) and nothing the second time.
  ///
  /// The rule is the most that never lets anyone act in the units of a reservation that still stands:
  /// - token bucket: capacity bounds how many act at any instant, so the refund keeps back what later
  ///   reservations need; unlike Go's, whose refund is reported wrong (golang/go#56924, #69419), it counts
  ///   what they need rather than the time between them (Go keeps back too much when the capacity has room
  ///   for both, and too little after a rate increase), and a second cancel gives nothing. As in Go, tokens
  ///   kept back for a later reservation stay spent even if that one is cancelled afterwards: cancel the
  ///   latest first to get all back;
  /// - sliding window: the reservation's starts are logged at its time to act and removing them only lowers
  ///   counts, so a cancel before that time gives back all of them the log still holds. The log keeps the
  ///   newest `limit` starts: those a later reservation (or a charge) pushed out of a full log are no
  ///   longer there and come back as nothing, and the older starts pushed out while still in the window
  ///   take the freed slots back stamped at the newest pushed-out start's time, so the window may stay
  ///   blocked later than they would have. Cancel the latest first: each then gives all back;
  /// - fixed window: its units leave the count unless a standing reservation's window needs the count as
  ///   it is (and the current window stays full when the reservation was for a later one). As with the
  ///   bucket, units kept back for a later reservation stay counted even if that one is cancelled
  ///   afterwards: cancel the latest first to get all back;
  /// - `rate_limits` (all_of): each limit by its own rule; the count returned is the least of them.
  ///
  /// @returns the units given back.
  std::size_t cancel() {
    const std::size_t back = s_->give_back();
    if (s_->timer) s_->timer->expires_at(time_point::min());  // pending waits end now, aborted
    return back;
  }

  /// Completes at time_to_act() (at once if passed), through the limiter's timer clock and executor.
  /// Signature `void(error_code)`: success; the not-ok errors listed for the class, at once;
  /// `net::error::operation_aborted` after cancel() or when cancelled through the token's cancellation
  /// slot, which gives the units back as cancel() does. The handler is never invoked from inside this
  /// function. Several waits may be pending; the wait outlives the reservation object.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code)) Token = default_token_t>
  auto async_wait(Token&& token = Token{}) {
    return net::async_compose<Token, void(error_code)>(wait_op{s_}, token, s_->executor);
  }

  /// Waits inside a coroutine, as async_wait; throws rein::system_error with its errors.
  net::awaitable<void> wait() { return async_wait(net::use_awaitable); }

  /// The limiter's executor.
  executor_type get_executor() const noexcept { return s_->executor; }

 private:
  friend class basic_rate_limiter<Limit, Executor, Mutex>;
  friend struct detail::reservation_access;

  // Shared with the waits, which may outlive the reservation object.
  struct state {
    std::weak_ptr<core_type> core;
    std::shared_ptr<book_type> book;
    executor_type executor;
    std::size_t n;
    std::uint64_t id = 0;
    time_point at = time_point::max();
    try_status status = try_status::busy;
    std::atomic<bool> cancelled{false};
    std::unique_ptr<timer_type> timer;  // made by the first wait

    state(std::weak_ptr<core_type> c, executor_type ex, std::size_t count)
        : core(std::move(c)), executor(std::move(ex)), n(count) {}

    std::size_t give_back() {
      if (cancelled.exchange(true) || status != try_status::acquired || n == 0) return 0;
      const std::shared_ptr<core_type> line = core.lock();
      if (!line) return 0;
      return line->update([this](policy_type& p, time_point now) {
        return static_cast<std::size_t>(book->give_back(id, p.limit(), now));
      });
    }

    // The units are an admission's (detail::reservation_access): out of the book, one grant of the limiter.
    void spend() noexcept {
      if (cancelled.exchange(true) || status != try_status::acquired) return;
      const std::shared_ptr<core_type> line = core.lock();
      if (!line) return;
      line->update_granted([this](policy_type&, time_point now) noexcept {
        if (n != 0) book->spend(id, now);
      });
    }

    // Let go before acting (detail::reservation_access): the limit's cancel rule while the reservation
    // stands (until its time to act, included), a refund of its units (that frees no standing one's) after.
    std::size_t let_go() {
      if (cancelled.exchange(true) || status != try_status::acquired || n == 0) return 0;
      const std::shared_ptr<core_type> line = core.lock();
      if (!line) return 0;
      return line->update([this](policy_type& p, time_point now) {
        if (now <= at) return static_cast<std::size_t>(book->give_back(id, p.limit(), now));
        book->spend(id, now);
        return static_cast<std::size_t>(book->refund(p.limit(), static_cast<std::int64_t>(n), now));
      });
    }

    timer_type& timer_for_wait() {
      const bool waits = status == try_status::acquired && !cancelled;
      if (!timer) timer = std::make_unique<timer_type>(executor, waits ? at : time_point::min());
      return *timer;
    }

    error_code outcome() const {
      switch (status) {
        case try_status::acquired: return cancelled ? error_code(net::error::operation_aborted) : error_code();
        case try_status::closed: return errc::closed;
        case try_status::exceeds_capacity: return errc::exceeds_capacity;
        default: return net::error::would_block;
      }
    }
  };

  // The wait, composed on the reservation's timer: every cancellation type is honoured, and one that
  // arrives gives the units back.
  struct wait_op {
    std::shared_ptr<state> s;
    bool started = false;

    template <class Self>
    void operator()(Self& self, error_code = {}) {
      if (!started) {
        started = true;
        self.reset_cancellation_state(net::enable_total_cancellation());
        return s->timer_for_wait().async_wait(std::move(self));
      }
      if (self.get_cancellation_state().cancelled() != net::cancellation_type::none) {
        s->give_back();
        return self.complete(net::error::operation_aborted);
      }
      self.complete(s->outcome());
    }
  };

  // Reserves n on `core` (the limiter's line), recording it in `book`; nothing taken when not ok.
  static basic_reservation reserve(core_type& core, std::shared_ptr<book_type>& book, std::size_t n) {
    auto s = std::make_shared<state>(core.weak_from_this(), core.get_executor(), n);
    core.update_seeing_line([&](policy_type& p, time_point now, bool waiting, bool closed) {
      s->status = closed ? try_status::closed : p.exceeds(n) ? try_status::exceeds_capacity : try_status::busy;
      if (s->status != try_status::busy || waiting) return;  // a waiter is never overtaken
      if (!book) book = std::make_shared<book_type>();
      book->make_room();
      const auto count = static_cast<std::int64_t>(n);
      const std::optional<time_point> at = p.limit().reserve(count, now);
      if (!at) return;  // beyond the limit's range (a debt, a count, the clock's): busy
      s->book = book;
      s->at = *at;
      if (count != 0) s->id = book->add(count, *at, now);
      s->status = try_status::acquired;
    });
    return basic_reservation(std::move(s));
  }

  explicit basic_reservation(std::shared_ptr<state> s) noexcept : s_(std::move(s)) {}

  std::shared_ptr<state> s_;
};

}  // namespace rein
