// An awaitable token bucket whose rate adapts to the upstream's throttling responses.
#pragma once

#include <rein/algo/adaptive_rate.hpp>
#include <rein/config.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/detail/clock_time.hpp>
#include <rein/detail/format.hpp>
#include <rein/line_options.hpp>
#include <rein/null_mutex.hpp>
#include <rein/outcome.hpp>
#include <rein/rate_limiter.hpp>
#include <rein/wait_stats.hpp>

#include REIN_ASIO_HEADER(any_io_executor.hpp)
#include REIN_ASIO_HEADER(execution_context.hpp)

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>

namespace rein {

/// An adaptive rate limiter's state, copied out under its lock.
struct adaptive_rate_limiter_snapshot : wait_stats {
  double rate = 0;                       ///< tokens (requests) per second now
  double tokens = 0;                     ///< in the bucket now (fractional; decisions are exact)
  std::int64_t burst = 0;                ///< the bucket's capacity
  std::optional<double> measured_rate;   ///< what the client has been taking per second (unknown at first)
  double rate_at_decrease = 0;           ///< the rate the latest cut started from (CUBIC's W)
  std::uint64_t decreases = 0;           ///< congestion signals that cut the rate
  std::uint64_t increases = 0;           ///< successes that raised it
  std::uint64_t stale_congestion = 0;    ///< congestion from requests sent before the latest cut, ignored
  std::uint64_t margin_widenings = 0;    ///< congestion at a held level that widened the margin instead
  std::uint64_t failed_probes = 0;       ///< probes above a held level that ended in congestion
  double margin = 0;                     ///< the pacing margin below the held level now
  std::chrono::nanoseconds hold{};       ///< how long a level found is held before the next probe
  bool at_floor = false;                 ///< rate == min_rate
  bool at_ceiling = false;               ///< rate == max_rate
  double limit = 0.0;                    ///< the rate, as every limiter's `limit` (tokens per second)
  double utilisation = 0.0;              ///< share of the burst used: 1 - tokens / burst
  /// Service time of the requests reported through record(success or congestion): from `sent` to the
  /// report. Recorded always (the clock is read for every report anyway).
  duration_histogram service{};
};

/// One line: `limit=950/s tokens=3 burst=10 measured=900/s decreases=2 increases=40 stale=1 ...`.
inline std::ostream& operator<<(std::ostream& os, const adaptive_rate_limiter_snapshot& s) {
  os << "limit=";
  detail::write_number(os, s.rate);
  os << "/s tokens=";
  detail::write_number(os, s.tokens);
  os << " burst=" << s.burst << " measured=";
  if (s.measured_rate) {
    detail::write_number(os, *s.measured_rate);
    os << "/s";
  } else {
    os << '-';
  }
  os << " utilisation=";
  detail::write_number(os, s.utilisation);
  if (s.at_floor) os << " at_floor";
  if (s.at_ceiling) os << " at_ceiling";
  os << " decreases=" << s.decreases << " increases=" << s.increases << " stale=" << s.stale_congestion
     << " service[";
  detail::write_histogram(os, s.service);
  os << "] ";
  detail::write_wait_stats(os, s);
  return os;
}

/// An awaitable token bucket whose rate follows the upstream's answers: `record(outcome::congestion, sent)`
/// for a 429 or 503 cuts the rate multiplicatively, and successes let it climb back along a cubic curve. A
/// client that does not know the quota converges to it instead of paying the rejections forever.
///
/// ```
/// rein::adaptive_rate_limiter limiter(io, {.initial_rate = 1000, .burst = 10});
/// co_await limiter.acquire();
/// const auto sent = std::chrono::steady_clock::now();
/// auto response = co_await call();
/// limiter.record(rein::classify_http_status(response.status), sent);
/// ```
/// (From tests/async/doc_snippets.cpp, which compiles and runs it.)
///
/// The rule is `rein::algo::basic_adaptive_rate`: CUBIC (RFC 8312) on a sending rate, as in the AWS SDKs'
/// "adaptive" retry mode, with one cut per round trip (congestion from a request sent before the latest cut
/// is ignored: that request reported on a rate already abandoned). Admission between two feedback calls is
/// `rein::token_bucket`'s, exact to the nanosecond; each `record` re-times the queued waiters at once,
/// earlier (the rate rose) or later (it was cut).
///
/// The operations (`acquire`, `async_acquire`, `_for`, `_until`, `try_acquire`, `refund`, `charge`,
/// `limit_remaining`, `close`) are those of rein::basic_rate_limiter, with tokens as units (a charge takes the
/// bucket into debt at the current rate; see `algo::basic_adaptive_rate::charge`). A deadline that the current rate cannot meet fails at
/// once, although a later rise of the rate might have met it.
///
/// @tparam Executor the I/O executor; completions default to it.
/// @tparam Clock    the clock of refill, feedback and deadlines; tick of a nanosecond or coarser
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
class basic_adaptive_rate_limiter : public basic_rate_limiter<algo::basic_adaptive_rate<Clock>, Executor, Mutex> {
  using base = basic_rate_limiter<algo::basic_adaptive_rate<Clock>, Executor, Mutex>;

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
  /// The rule it takes: the algorithm's options.
  using rule_type = algo::adaptive_rate_options;

  /// The limiter type when rebound to another executor.
  template <class OtherExecutor>
  struct rebind_executor {
    /// The same limiter type on `OtherExecutor`.
    using other = basic_adaptive_rate_limiter<OtherExecutor, Clock, Mutex>;
  };

  /// Starts at `o.initial_rate` with `o.initial_tokens` (default: a full burst), completing operations on
  /// `ex` by default; `line` is its waiting line's (rein::line_options; partitions are refused).
  ///
  /// @throws std::invalid_argument if an option is outside its range (see algo::adaptive_rate_options) or a
  /// line option is invalid; the message names the type (and `line.name`), the field and the value
  /// ("rein::adaptive_rate_limiter \"llm\": initial_rate must be in [min_rate, max_rate], got 0").
  basic_adaptive_rate_limiter(const executor_type& ex, const algo::adaptive_rate_options& o, line_options line = {})
      // `line` is copied: the name is read by another argument, and arguments run in any order.
      : base("rein::adaptive_rate_limiter", ex, make_limit(o, line.name), line) {}

  /// The same, on an execution context (an io_context).
  template <class ExecutionContext>
    requires std::is_convertible_v<ExecutionContext&, net::execution_context&>
  basic_adaptive_rate_limiter(ExecutionContext& context, const algo::adaptive_rate_options& o, line_options line = {})
      : basic_adaptive_rate_limiter(context.get_executor(), o, std::move(line)) {}

  /// Reports how a request ended, now: `success` may raise the rate, `congestion` (429, 503, a timeout; see
  /// rein::classify_http_status) cuts it unless the request was sent before the latest cut, `ignored` does
  /// nothing. Queued waiters are re-timed at once.
  ///
  /// @param result what the answer said about capacity.
  /// @param sent   when the request was sent: read `Clock::now()` right after `acquire` returns. Any reading
  ///               is valid, `time_point::min()` and `max()` included: a send later than now took no service
  ///               time, and one too long ago to count in nanoseconds took the longest (saturated; see
  ///               rein::algo::rate_limit).
  void record(outcome result, time_point sent) { record(result, sent, duration::zero()); }

  /// As record(result, sent), for congestion that came with a pause the upstream ordered: nothing will be
  /// sent for `pause` from now (a 429's Retry-After applied by a quota gate; rein::throttle's guard.reject()
  /// passes the pause its gates applied). The curve then restarts when the pause ends, with the cuts of
  /// algo::basic_adaptive_rate::on_congestion for a pause (TCP's retransmission timeout, RFC 6298). A
  /// `pause` of zero or less is a wait already over (the rule of every pause in rein): congestion as without
  /// one.
  void record(outcome result, time_point sent, duration pause) {
    if (result == outcome::ignored) return;
    this->update([this, result, sent, pause](limit_type& limit, time_point now) {
      // Saturated: a `sent` as far as time_point::min() must not overflow the subtraction.
      service_.record(std::chrono::nanoseconds(
          std::max<std::int64_t>(0, detail::ns_between(detail::to_ns_saturated(now), detail::to_ns_saturated(sent)))));
      limit.record(result, sent, now, std::max(std::chrono::duration_cast<std::chrono::nanoseconds>(pause),
                                               std::chrono::nanoseconds::zero()));
    });
  }

  /// Tokens per second now.
  double rate() const {
    return this->inspect([](const limit_type& l, const wait_stats&) { return l.rate(); });
  }

  /// What the client has been taking per second (std::nullopt until the first measuring window closed).
  std::optional<double> measured_rate() const {
    return this->inspect([](const limit_type& l, const wait_stats&) { return l.measured_rate(); });
  }

  /// Tokens in the bucket now (fractional, rounded to a double).
  double tokens() const {
    const time_point now = Clock::now();
    return this->inspect([now](const limit_type& l, const wait_stats&) { return l.tokens(now); });
  }

  /// Rate, tokens, feedback counters and waiting statistics, copied under the lock in O(1).
  adaptive_rate_limiter_snapshot snapshot() const {
    const time_point now = Clock::now();
    return this->inspect([this, now](const limit_type& l, const wait_stats& w) {
      adaptive_rate_limiter_snapshot s;
      static_cast<wait_stats&>(s) = w;
      s.rate = l.rate();
      s.tokens = l.tokens(now);
      s.burst = l.capacity();
      s.measured_rate = l.measured_rate();
      s.rate_at_decrease = l.rate_at_decrease();
      s.decreases = l.decreases();
      s.increases = l.increases();
      s.stale_congestion = l.stale_congestion();
      s.margin_widenings = l.margin_widenings();
      s.failed_probes = l.failed_probes();
      s.margin = l.margin(now);
      s.hold = l.hold();
      s.at_floor = l.rate() <= l.get_options().min_rate;
      s.at_ceiling = l.rate() >= l.get_options().max_rate;
      s.limit = s.rate;
      s.utilisation = 1.0 - s.tokens / static_cast<double>(s.burst);
      s.service = service_;  // under the lock, as record() writes it
      return s;
    });
  }

 private:
  duration_histogram service_{};  // guarded by the limiter's lock (written in update, read in inspect)

  static limit_type make_limit(const algo::adaptive_rate_options& o, std::string_view name) {
    return detail::renaming_errors("rein::algo::adaptive_rate", {"rein::adaptive_rate_limiter", name},
                                   [&] { return limit_type(o, Clock::now()); });
  }
};

/// The thread-safe adaptive rate limiter on any I/O executor and std::chrono::steady_clock.
using adaptive_rate_limiter = basic_adaptive_rate_limiter<>;

/// The single-threaded adaptive rate limiter: no locking; use from one thread or strand only.
using single_thread_adaptive_rate_limiter =
    basic_adaptive_rate_limiter<net::any_io_executor, std::chrono::steady_clock, null_mutex>;

}  // namespace rein
