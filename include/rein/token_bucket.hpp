// An awaitable token bucket: bounds how many calls start per second, with bursts.
#pragma once

#include <rein/algo/pacing_margin.hpp>
#include <rein/algo/token_bucket.hpp>
#include <rein/config.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/detail/format.hpp>
#include <rein/impl/line_instantiations.hpp>
#include <rein/line_options.hpp>
#include <rein/null_mutex.hpp>
#include <rein/outcome.hpp>
#include <rein/observer.hpp>
#include <rein/queue_order.hpp>
#include <rein/rate_limiter.hpp>
#include <rein/token_reservation.hpp>
#include <rein/wait_stats.hpp>

#include REIN_ASIO_HEADER(any_io_executor.hpp)
#include REIN_ASIO_HEADER(execution_context.hpp)

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace rein {

/// The rule of a token bucket. Write it with designated initializers: `{.rate = 10, .capacity = 3}`; the
/// waiting line's options (name, max_waiters, ...) are rein::line_options, the constructor's next argument.
struct token_bucket_options {
  double rate = 0;                               ///< tokens per second, in (0, 1e9]
  std::int64_t capacity = 0;                     ///< the burst: most tokens the bucket holds, in [1, 1e15]
  std::optional<std::int64_t> initial_tokens{};  ///< tokens at construction, in [0, capacity]; default full
                                                 ///< (start lower to avoid a burst at every deploy)
  /// A cold bucket refills at rate / warmup.cold_factor, speeding up to the rate over warmup.period of use
  /// and cooling back when idle (Guava's SmoothWarmingUp; see rein::algo::token_bucket_warmup). Default: off.
  algo::token_bucket_warmup warmup{};
  /// The pacing margin learned from the upstream's refusals (`refused()`, which rein::throttle calls for a
  /// 429 or a 503 with Retry-After): each widens the gap between tokens, and the widening is forgotten
  /// slowly (see rein::algo::basic_pacing_margin). A bucket that is never told of a refusal keeps its rate.
  algo::pacing_margin_options margin{};
};

/// A token bucket's state, copied out under its lock.
struct token_bucket_snapshot : wait_stats, reservation_stats {
  double tokens = 0;          ///< in the bucket now (fractional, negative while a charge is in debt;
                              ///< decisions are exact, this reading is rounded)
  double rate = 0;            ///< tokens per second
  double current_rate = 0;    ///< the refill rate now: with `warmup`, between rate / cold_factor and rate
                              ///< as the bucket warms (as of its last change); otherwise `rate`
  std::int64_t capacity = 0;  ///< the burst
  double limit = 0.0;         ///< the rate, as every limiter's `limit` (tokens per second)
  double utilisation = 0.0;   ///< share of the burst used: 1 - tokens / capacity (above 1 while in debt)
  double quota = 0;           ///< the rate as set, before the margin: rate = quota / (1 + margin)
  double margin = 0;          ///< the pacing margin now, a share of the interval 1 / quota
  std::uint64_t refusals = 0; ///< refusals that widened the margin
};

/// One line: `tokens=2.5 limit=10/s capacity=20 utilisation=0.88 waiting=0 acquired=10 rejected=0 wait[...]`.
inline std::ostream& operator<<(std::ostream& os, const token_bucket_snapshot& s) {
  os << "tokens=";
  detail::write_number(os, s.tokens);
  os << " limit=";
  detail::write_number(os, s.rate);
  os << "/s capacity=" << s.capacity << " utilisation=";
  detail::write_number(os, s.utilisation);
  if (s.refusals > 0) {
    os << " margin=";
    detail::write_number(os, s.margin);
    os << " refusals=" << s.refusals;
  }
  detail::write_reservations(os, s);
  os << ' ';
  detail::write_wait_stats(os, s);
  return os;
}

/// An awaitable token bucket: tokens flow in at `rate` per second up to `capacity`, and a call that needs n
/// tokens waits until n are there and takes them. It bounds how many calls start per second (a published
/// quota: "100 requests per second, bursts of 20"), not how many are in flight (that is rein::semaphore).
///
/// ```
/// rein::token_bucket bucket(io, {.rate = 100, .capacity = 20});
/// co_await bucket.acquire();          // one token; returns at once while the burst lasts
/// co_await bucket.acquire(estimate);  // weighted: e.g. tokens of an LLM prompt
/// bucket.refund(estimate - actual);   // give back what the call did not use
/// ```
/// (From tests/async/doc_snippets.cpp, which compiles and runs it.)
///
/// The rule is `rein::algo::basic_token_bucket` (exact integer refill, lazily on each call, never a
/// background tick), the peer of Go's `golang.org/x/time/rate.Limiter`. Unlike Go's `WaitN`, which reserves
/// tokens up front (so a cancelled wait must hand them back), a waiter here takes its tokens only when granted:
/// waiting costs nothing, and a cancellation that arrives after the grant but before the handler ran gives the
/// tokens back. Waiters are served in FIFO order (or the order the options choose: rein::queue_order), each at
/// the exact instant its tokens are there, by one timer per bucket; `set_rate` and `set_capacity` move the
/// grant times of waiters already queued, earlier or later, at once. Go's own model is there too:
/// `reserve(n)` takes the tokens now and says how long until they are the caller's, to wait for, act on
/// elsewhere, or cancel (rein::basic_token_reservation).
///
/// Compared with `rein::sliding_window` of the same average rate: 2 per 10 s (window) grants five waiters
/// started at 0.00 .. 0.04 s at 0.00, 0.01, 10.00, 10.01, 20.00; a bucket of 0.2 per second with burst 2
/// grants them at 0.00, 0.01, 5.0, 10.0, 15.0. The bucket spreads the refill evenly and so may allow 3 starts
/// within one 10 s window (0.01, 5.0, 10.0); the window never does.
///
/// The operations (`acquire`, `async_acquire`, `_for`, `_until`, `try_acquire`, `reserve`, `refund`,
/// `charge`, `limit_remaining`, `close`) are those of rein::basic_rate_limiter, with tokens as units.
///
/// Budgets whose true cost is known only afterwards (an LLM call's tokens) reserve an estimate, then settle:
/// `refund(estimate - actual)` for an over-estimate, `charge(actual - estimate)` for an under-estimate, which
/// takes the bucket below zero so that the next callers wait until the rate has repaid it (Go's
/// `rate.Limiter` reservations also go below zero); never a silent overrun. A provider's own count (read by
/// rein::read_response, applied in its provider's meaning by rein::limit_remaining) lowers the bucket:
/// `limit_remaining(remaining, reset_after)` caps it at `remaining` until a window's reset, and
/// `limit_remaining(remaining, 0)` lowers its balance to `remaining` (a continuous refill); it never raises
/// what the bucket admits.
///
/// @tparam Executor the I/O executor; completions default to it.
/// @tparam Clock    the clock of refill and deadlines; tick of a nanosecond or coarser
///                  (std::chrono::steady_clock; rein::testing::manual_clock in tests).
/// @tparam Mutex    std::mutex (default): safe from many threads and strands; rein::null_mutex: one thread or
///                  strand only.
///
/// @par Thread Safety
/// With std::mutex, every member function may be called concurrently, except destruction (which, as for
/// Asio's I/O objects, must not race with its own operations, their cancellation signals included).
/// With null_mutex, all use must happen on one thread or strand.
///
/// @par Lifetime
/// Movable, not copyable. Destroying it completes every waiter with `net::error::operation_aborted`.
template <class Executor = net::any_io_executor, class Clock = std::chrono::steady_clock, class Mutex = std::mutex>
class basic_token_bucket : public basic_rate_limiter<algo::basic_token_bucket<Clock>, Executor, Mutex> {
  using base = basic_rate_limiter<algo::basic_token_bucket<Clock>, Executor, Mutex>;

 public:
  /// The clock that times the rule and the deadlines.
  using typename base::clock_type;
  /// A duration of `clock_type`.
  using typename base::duration;
  /// The executor that runs completion handlers without an associated executor of their own.
  using typename base::executor_type;
  /// The rule that decides admissions, a plain class of rein::algo.
  using typename base::limit_type;
  /// A point in time of `clock_type`.
  using typename base::time_point;
  /// The rule it takes.
  using rule_type = token_bucket_options;

  /// The bucket type when rebound to another executor.
  template <class OtherExecutor>
  struct rebind_executor {
    /// The same limiter type on `OtherExecutor`.
    using other = basic_token_bucket<OtherExecutor, Clock, Mutex>;
  };

  /// What reserve() returns (rein::basic_token_reservation).
  using typename base::reservation;

  /// Makes a bucket holding `o.initial_tokens` (default: full) now, completing operations on `ex` by default;
  /// `line` is its waiting line's (rein::line_options; partitions are refused).
  ///
  /// @throws std::invalid_argument if the rate is not in (0, 1e9] (NaN and infinities included), the
  /// capacity not in [1, 1e15], the initial tokens not in [0, capacity], or a line option is invalid; the
  /// message names the type, the field and the value ("rein::token_bucket: rate must be > 0, ..., got -1").
  basic_token_bucket(const executor_type& ex, const token_bucket_options& o, line_options line = {});

  /// Makes a bucket on an execution context (an io_context).
  template <class ExecutionContext>
    requires std::is_convertible_v<ExecutionContext&, net::execution_context&>
  basic_token_bucket(ExecutionContext& context, const token_bucket_options& o, line_options line = {})
      : basic_token_bucket(context.get_executor(), o, std::move(line)) {}

  /// Changes the rate (tokens per second) from now on: tokens up to now arrived at the old rate. Queued
  /// waiters are re-timed at once, earlier or later (Go's `SetLimit`).
  /// @throws std::invalid_argument as the constructor does, changing nothing.
  ///
  /// The rate is the quota: a pacing margin learned from refusals still applies on top of it.
  void set_rate(double rate) {
    renamed([&] {
      this->update([this, rate](limit_type& b, time_point now) {
        // The rate given is checked, not the paced one (which a margin could bring back into range).
        if (!(rate > 0 && rate <= limit_type::max_rate)) b.set_rate(rate, now);  // throws, naming `rate`
        b.set_rate(margin_.paced_rate(rate, now), now);
        quota_ = rate;
      });
    }, this->name());
  }

  /// The upstream refused a call that this bucket admitted at `sent` because it arrived too early (a 429,
  /// or a 503 with Retry-After): the pacing margin widens unless the call was sent before the latest
  /// widening (see rein::algo::basic_pacing_margin), and queued waiters are re-timed at once. rein::throttle
  /// calls it for the stages that learn a rejection (throttle_options::rejections).
  /// @param sent when the refused call was admitted.
  void refused(time_point sent) {
    this->update([this, sent](limit_type& b, time_point now) {
      if (margin_.on_refused(sent, now)) learning_.store(true, std::memory_order_relaxed);
      pace(b, now);
    });
  }

  /// Reports how a call ended: the pacing margin's decay is applied (a bucket that has learned no margin
  /// does nothing here, and takes no lock). Refusals are reported with refused().
  void record(outcome, time_point) {
    if (!learning_.load(std::memory_order_relaxed)) return;
    this->update([this](limit_type& b, time_point now) { pace(b, now); });
  }

  /// The rate as set (by the options or set_rate), before the pacing margin, tokens per second.
  double quota() const {
    return this->inspect([this](const limit_type&, const wait_stats&) { return quota_; });
  }

  /// The pacing margin now: a share of the interval 1 / quota() (`margin.initial` until a refusal).
  double margin() const {
    const time_point now = Clock::now();
    return this->inspect([this, now](const limit_type&, const wait_stats&) { return margin_.margin(now); });
  }

  /// Changes the capacity (burst) from now on; tokens above it are dropped. A waiter queued for more than the
  /// new capacity is granted when the bucket is full, taking all of it (new requests above it fail with
  /// errc::exceeds_capacity); raising the capacity again restores its request (Go's `SetBurst`).
  /// @throws std::invalid_argument as the constructor does, changing nothing.
  void set_capacity(std::int64_t capacity) {
    renamed([&] { this->update([capacity](limit_type& b, time_point now) { b.set_capacity(capacity, now); }); },
            this->name());
  }

  /// Tokens per second.
  double rate() const {
    return this->inspect([](const limit_type& b, const wait_stats&) { return b.rate(); });
  }

  /// The capacity (burst): the most tokens one request may ask for.
  std::int64_t capacity() const {
    return this->inspect([](const limit_type& b, const wait_stats&) { return b.capacity(); });
  }

  /// Tokens in the bucket now (fractional, rounded to a double; negative while a charge is in debt).
  double tokens() const {
    const time_point now = Clock::now();
    return this->inspect([now](const limit_type& b, const wait_stats&) { return b.tokens(now); });
  }

  /// Tokens, rate, capacity and the waiting statistics, copied under the lock in O(1).
  token_bucket_snapshot snapshot() const;

 private:
  template <class F>
  static decltype(auto) renamed(F&& f, std::string_view name = {}) {
    // A named limiter's errors name it too: rein::token_bucket "api": rate must be ...
    return detail::renaming_errors("rein::algo::token_bucket", {"rein::token_bucket", name}, std::forward<F>(f));
  }

  // Sets the bucket's rate to the quota paced by the margin at `now`, when it moved by more than 1/1024 of
  // the interval (so that the decay does not re-time the waiters at every call); stops learning once the
  // margin is back at its initial value. Under the limiter's lock.
  void pace(limit_type& b, time_point now) {
    const double margin = margin_.margin(now);
    const bool settled = margin <= margin_.get_options().initial;
    const double paced = quota_ / (1.0 + margin);
    if (std::fabs(paced - b.rate()) > b.rate() / 1024 || settled) b.set_rate(paced, now);
    if (settled) learning_.store(false, std::memory_order_relaxed);
  }

  // The quota as set and the margin learned, guarded by the limiter's lock (written in update, read in
  // inspect); `learning_` lets record() skip the lock while there is no margin to decay.
  double quota_;
  algo::basic_pacing_margin<Clock> margin_;
  struct flag {  // an atomic that moves with the bucket (the bucket is movable, std::atomic is not)
    std::atomic<bool> value{false};
    flag() = default;
    flag(flag&& other) noexcept : value(other.value.load(std::memory_order_relaxed)) {}
    flag& operator=(flag&& other) noexcept {
      value.store(other.value.load(std::memory_order_relaxed), std::memory_order_relaxed);
      return *this;
    }
    bool load(std::memory_order order) const noexcept { return value.load(order); }
    void store(bool v, std::memory_order order) noexcept { value.store(v, order); }
  };
  flag learning_;

  static limit_type make_bucket(const token_bucket_options& o, std::string_view name) {
    return renamed([&] {
      return limit_type(
          {.rate = o.rate, .capacity = o.capacity, .initial_tokens = o.initial_tokens, .warmup = o.warmup},
          Clock::now());
    }, name);
  }
};

// Members defined outside the class, so that REIN_SEPARATE_COMPILATION compiles them in one unit only: a
// unit that declares the class extern then neither instantiates them nor copies them in (config.hpp).
template <class Executor, class Clock, class Mutex>
REIN_SEPARATE_INLINE basic_token_bucket<Executor, Clock, Mutex>::basic_token_bucket(const executor_type& ex,
                                                                                    const token_bucket_options& o,
                                                                                    line_options line)
    // `line` is copied: the name is read by another argument, and arguments run in any order.
    : base("rein::token_bucket", ex, make_bucket(o, line.name), line),
      quota_(o.rate),
      margin_(detail::renaming_errors("rein::algo::pacing_margin", {"rein::token_bucket", this->name()},
                                      [&] { return algo::basic_pacing_margin<Clock>(o.margin, Clock::now()); },
                                      "margin.")) {
  if (o.margin.initial > 0) this->update([this](limit_type& b, time_point now) { pace(b, now); });
}

template <class Executor, class Clock, class Mutex>
REIN_SEPARATE_INLINE token_bucket_snapshot basic_token_bucket<Executor, Clock, Mutex>::snapshot() const {
  const time_point now = Clock::now();
  return this->inspect([this, now](const limit_type& b, const wait_stats& w) {
    token_bucket_snapshot s;
    static_cast<wait_stats&>(s) = w;
    s.tokens = b.tokens(now);
    s.rate = b.rate();
    s.current_rate = b.current_rate();
    s.capacity = b.capacity();
    s.limit = s.rate;
    s.utilisation = 1.0 - s.tokens / static_cast<double>(s.capacity);
    s.quota = quota_;
    s.margin = margin_.margin(now);
    s.refusals = margin_.widenings();
    detail::copy_reservations(this->reservations(), s);
    return s;
  });
}

/// The thread-safe token bucket on any I/O executor and std::chrono::steady_clock.
using token_bucket = basic_token_bucket<>;

/// The single-threaded token bucket: no locking; use from one thread or strand only.
using single_thread_token_bucket = basic_token_bucket<net::any_io_executor, std::chrono::steady_clock, null_mutex>;

/// The instantiations behind `token_bucket`, compiled once with REIN_SEPARATE_COMPILATION (rein/config.hpp).
#define REIN_DETAIL_TOKEN_BUCKET_INSTANTIATIONS(kind)                                                 \
  REIN_DETAIL_LINE_INSTANTIATIONS(kind, detail::limiter_core<                                          \
      detail::rate_limit_policy<algo::basic_token_bucket<std::chrono::steady_clock>>, net::any_io_executor, \
      std::chrono::steady_clock, std::mutex, void(error_code)>)                                       \
  kind template class basic_rate_limiter<algo::basic_token_bucket<std::chrono::steady_clock>>;        \
  kind template class basic_token_bucket<>;

#if defined(REIN_SEPARATE_COMPILATION)
REIN_DETAIL_TOKEN_BUCKET_INSTANTIATIONS(extern)
#if defined(REIN_DETAIL_KEYED_INSTANTIATION)  // rein/keyed.hpp came first
REIN_DETAIL_KEYED_INSTANTIATION(extern, token_bucket)
#endif
#endif

}  // namespace rein
