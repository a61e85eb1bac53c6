// A reservation of a token bucket's tokens: reserve now, learn the delay, then wait, go elsewhere or cancel
// (Go's x/time/rate Reservation) on Asio.
#pragma once

#include <rein/algo/token_bucket.hpp>
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
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

namespace rein {

template <class Executor, class Clock, class Mutex>
class basic_token_bucket;

/// Tokens reserved from a rein::basic_token_bucket by its `reserve(n)`: taken at once, usable from
/// `time_to_act()` on. Reserve now, learn the `delay()`, then `co_await r.wait()`, or go to another host or
/// model and `cancel()` to give the tokens back. The peer is Go's `golang.org/x/time/rate.Reservation`
/// (`ReserveN`, `OK`, `Delay`, `CancelAt`); `wait()` is what Go leaves to the caller's `time.Sleep`.
///
/// ```
/// auto r = bucket.reserve(3);
/// if (r && r.delay() < 200ms) co_await r.wait();  // at time_to_act(), on the bucket's executor
/// else r.cancel();                                 // tokens back; try elsewhere
/// ```
/// (From tests/async/token_bucket_reserve.cpp, which compiles and runs it.)
///
/// @par Units
/// Times are the bucket's clock (`time_to_act()`, `delay()`); counts are whole tokens.
///
/// @par Errors
/// A reservation that is not ok took nothing: `status()` says why, `delay()` is `duration::max()`
/// (Go's `InfDuration`) and `wait()` fails at once with errc::exceeds_capacity (n above the bucket's
/// capacity: a negative count converted to std::size_t lands here too), errc::closed (the bucket was
/// closed), or `net::error::would_block` (status busy: someone waits on the bucket's line, or the debt
/// would pass 1e15 tokens).
///
/// @par Cancellation
/// `cancel()` gives the tokens back as Go's `CancelAt` does, right where Go's refund was reported wrong (see
/// `cancel()`). A wait cancelled through its completion token's cancellation slot (terminal, partial or
/// total) completes with `net::error::operation_aborted` and cancels the reservation the same way; so does
/// every wait pending or started after `cancel()`.
///
/// @par Destruction
/// Destroying a reservation gives nothing back (as in Go, its tokens are spent: the caller may act at
/// `time_to_act()` without waiting through it); a wait already started still completes at its time.
///
/// @par Thread Safety
/// As an Asio timer: distinct reservations are independent, one must not be used from two threads at once
/// (its waits' completions included, unless on one strand). The bucket may be used concurrently with it.
///
/// @par Lifetime
/// Move-only; a moved-from reservation may only be destroyed or assigned to. It refers to the bucket's
/// shared state, not to the bucket object: a moved bucket keeps its reservations, and a reservation that
/// outlives its bucket cancels into nothing.
template <class Executor = net::any_io_executor, class Clock = std::chrono::steady_clock, class Mutex = std::mutex>
class basic_token_reservation {
  using limit_type = algo::basic_token_bucket<Clock>;
  using policy_type = detail::rate_limit_policy<limit_type>;
  using core_type = detail::limiter_core<policy_type, Executor, Clock, Mutex, void(error_code)>;
  using book_type = detail::reservation_book<typename Clock::time_point>;
  using timer_type = typename core_type::timer_type;

 public:
  /// The executor of the bucket; waits complete on it unless their handler has an executor of its own.
  using executor_type = Executor;
  /// The bucket's clock.
  using clock_type = Clock;
  /// A point in time of `clock_type`.
  using time_point = typename Clock::time_point;
  /// A duration of `clock_type`.
  using duration = typename Clock::duration;

  /// Moves the reservation: its tokens, time and waits go with it.
  basic_token_reservation(basic_token_reservation&&) noexcept = default;
  /// Drops this reservation as the destructor does (nothing given back), then takes `other`'s.
  basic_token_reservation& operator=(basic_token_reservation&& other) noexcept = default;
  basic_token_reservation(const basic_token_reservation&) = delete;
  basic_token_reservation& operator=(const basic_token_reservation&) = delete;
  /// Gives nothing back (see the class).
  ~basic_token_reservation() = default;

  /// Whether the tokens were reserved (Go's `OK`).
  bool ok() const noexcept { return s_->status == try_status::acquired; }
  /// As ok().
  explicit operator bool() const noexcept { return ok(); }
  /// acquired when ok(); otherwise busy, closed or exceeds_capacity (see the class).
  try_status status() const noexcept { return s_->status; }
  /// The tokens asked for.
  std::size_t tokens() const noexcept { return s_->n; }

  /// When the tokens are the caller's: the instant the bucket's debt including them is repaid, rounded up
  /// to the clock's tick; `time_point::max()` when not ok.
  time_point time_to_act() const noexcept { return s_->at; }

  /// How long from now until time_to_act(): 0 once it is reached, `duration::max()` when not ok.
  duration delay() const { return delay_from(Clock::now()); }

  /// How long from `now` until time_to_act() (Go's `DelayFrom`).
  duration delay_from(time_point now) const noexcept {
    if (!ok()) return duration::max();
    return s_->at > now ? s_->at - now : duration::zero();
  }

  /// Gives the tokens back, as many as the reservations made after this one leave free (Go's
  /// `CancelAt`, at the clock's now), and grants the bucket's waiters that now fit. Pending waits complete
  /// with operation_aborted.
  ///
  /// The rule: the refund is the largest that never lets anyone act in the tokens of a reservation that
  /// still stands (the bucket's capacity bounds how many act at any instant); whatever else this one took
  /// comes back. It gives back nothing once time_to_act() has passed (the tokens are spent), nothing the
  /// second time, and at most the bucket's room (never above capacity). Unlike Go's, whose refund is
  /// reported wrong (golang/go#56924, #69419): it counts what later reservations need rather than the time
  /// between them (Go keeps back too much when the capacity has room for both, and too little after a
  /// rate increase), and a second cancel gives nothing. As in Go, tokens kept back for a later reservation
  /// stay spent even if that one is cancelled afterwards: cancel the latest first to get all back.
  ///
  /// @returns the tokens given back.
  std::size_t cancel() {
    const std::size_t back = s_->give_back();
    if (s_->timer) s_->timer->expires_at(time_point::min());  // pending waits end now, aborted
    return back;
  }

  /// Completes at time_to_act() (at once if passed), through the bucket's timer clock and executor.
  /// Signature `void(error_code)`: success; the not-ok errors listed for the class, at once;
  /// `net::error::operation_aborted` after cancel() or when cancelled through the token's cancellation
  /// slot, which gives the tokens back as cancel() does. The handler is never invoked from inside this
  /// function. Several waits may be pending; the wait outlives the reservation object.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code)) Token = default_token_t>
  auto async_wait(Token&& token = Token{}) {
    return net::async_compose<Token, void(error_code)>(wait_op{s_}, token, s_->executor);
  }

  /// Waits inside a coroutine, as async_wait; throws rein::system_error with its errors.
  net::awaitable<void> wait() { return async_wait(net::use_awaitable); }

  /// The bucket's executor.
  executor_type get_executor() const noexcept { return s_->executor; }

 private:
  friend class basic_token_bucket<Executor, Clock, Mutex>;

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
        const std::int64_t back = book->give_back(id, p.limit(), now);
        p.limit().refund(back, now);
        return static_cast<std::size_t>(back);
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
  // arrives gives the tokens back.
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

  // Reserves n on `core` (the bucket's line), recording it in `book`; nothing taken when not ok.
  static basic_token_reservation reserve(core_type& core, std::shared_ptr<book_type>& book, std::size_t n) {
    auto s = std::make_shared<state>(core.weak_from_this(), core.get_executor(), n);
    core.update_seeing_line([&](policy_type& p, time_point now, bool waiting, bool closed) {
      s->status = closed ? try_status::closed : p.exceeds(n) ? try_status::exceeds_capacity : try_status::busy;
      if (s->status != try_status::busy || waiting) return;  // a waiter is never overtaken
      if (!book) book = std::make_shared<book_type>();
      book->make_room();
      const auto count = static_cast<std::int64_t>(n);
      const std::optional<time_point> at = p.limit().reserve(count, now);
      if (!at) return;  // a debt beyond 1e15 tokens or the clock's range: busy
      s->book = book;
      s->at = *at;
      if (count != 0) s->id = book->add(count, *at, now);
      s->status = try_status::acquired;
    });
    return basic_token_reservation(std::move(s));
  }

  explicit basic_token_reservation(std::shared_ptr<state> s) noexcept : s_(std::move(s)) {}

  std::shared_ptr<state> s_;
};

}  // namespace rein
