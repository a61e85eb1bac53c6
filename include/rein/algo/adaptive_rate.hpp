// A token bucket whose rate adapts to upstream rejections (CUBIC, as the AWS SDKs' "adaptive" retry mode).
#pragma once

#include <rein/algo/pacing_margin.hpp>
#include <rein/algo/rate_limit.hpp>
#include <rein/algo/token_bucket.hpp>
#include <rein/detail/clock_time.hpp>
#include <rein/outcome.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

namespace rein::algo {

namespace detail {

// The rate of the latest few takes: the tokens taken after the oldest of them over the span from it to the
// newest; nothing until two takes at distinct times.
class recent_takes {
 public:
  void add(std::int64_t at_ns, std::int64_t n) noexcept {
    takes_[next_] = {at_ns, n};
    next_ = (next_ + 1) % size;
    count_ = std::min(count_ + 1, size);
  }

  std::optional<double> rate() const noexcept {
    if (count_ < 2) return std::nullopt;
    const std::size_t oldest = count_ < size ? 0 : next_;
    const std::size_t newest = (next_ + size - 1) % size;
    std::int64_t after_oldest = 0;
    for (std::size_t i = 1; i < count_; ++i) after_oldest += takes_[(oldest + i) % size].n;
    const std::int64_t span = rein::detail::ns_between(takes_[newest].at_ns, takes_[oldest].at_ns);
    if (span <= 0) return std::nullopt;
    return static_cast<double>(after_oldest) * 1e9 / static_cast<double>(span);
  }

 private:
  static constexpr std::size_t size = 8;
  struct take {
    std::int64_t at_ns = 0;
    std::int64_t n = 0;
  };
  std::array<take, size> takes_{};
  std::size_t next_ = 0;
  std::size_t count_ = 0;
};

}  // namespace detail

/// Construction options of `basic_adaptive_rate` (and of the async `rein::adaptive_rate_limiter`).
///
/// Defaults are the AWS SDKs' adaptive retry mode (botocore `retries/adaptive.py`, `throttling.py`,
/// `bucket.py`): beta 0.7, scale 0.4, minimum rate 0.5 per second, a sending rate measured over half-second
/// windows smoothed by 0.8, and growth capped at twice the measured rate. Only `initial_rate` has no default.
struct adaptive_rate_options {
  /// Starting rate in tokens (requests) per second, in [min_rate, max_rate]. A client that does not know the
  /// quota may start high: the first rejections bring the rate down within a few round trips.
  double initial_rate = 0;
  /// The bucket's capacity: the largest burst, in tokens, in [1, 1e15]. Keep it at or below the server's own
  /// burst allowance (nginx `limit_req ... burst=`); the SDKs use one second's worth, which a server with a
  /// small burst rejects.
  std::int64_t burst = 1;
  /// Tokens at construction, in [0, burst]; default full.
  std::optional<std::int64_t> initial_tokens{};
  /// Floor of the rate, tokens per second, > 0: a failing upstream must not stop the client for good.
  double min_rate = 0.5;
  /// Ceiling of the rate, tokens per second, in [min_rate, 1e9].
  double max_rate = 1e9;
  /// Multiplicative decrease: on congestion the rate becomes `beta` times the rate it was sending at
  /// (`(1 + beta) / 2` times on the plateau of the previous decrease; see basic_adaptive_rate); in (0, 1).
  double beta = 0.7;
  /// CUBIC's C, in tokens per second per second cubed, > 0: how fast the rate climbs back. After a decrease
  /// from W the rate is back at W after K = cbrt(W * (1 - beta) / scale) seconds of successes.
  double scale = 0.4;
  /// Width of the windows over which the sending rate is measured, > 0.
  std::chrono::nanoseconds measure_interval = std::chrono::milliseconds(500);
  /// Weight of the newest window in the measured rate (an exponential moving average), in (0, 1].
  double smoothing = 0.8;
  /// Successes never raise the rate above `max_growth` times the measured sending rate (so a client that
  /// sends little does not bank an allowance it has never tried); >= 1, infinity disables the cap.
  double max_growth = 2.0;
  /// Slow start (TCP's, RFC 5681, in measuring windows instead of round trips): until the first congestion
  /// the rate doubles every `measure_interval`, so a client that starts below its quota finds it in a few
  /// windows: from a fifth of it in log2(5) = 2.3 windows (1.2 s by default). One window per doubling is
  /// the rule, not a tuning: growth is capped at `max_growth` times the measured rate, which changes only
  /// when a window closes, so doubling faster gains nothing and doubling slower leaves the cap unused.
  /// False: the SDKs' curve, `initial_rate + scale x t^3`, which takes cbrt(0.8 R / scale) seconds (7.4 s
  /// for R = 200 per second).
  bool slow_start = true;
  /// How long the rate holds once back at a level found by a decrease, before it probes above it, >= 0. The
  /// hold doubles after each probe that ends in congestion, up to `max_hold`, so that a quota once found is
  /// probed rarely. Each probe into a server that pauses the client costs a whole Retry-After: probing after
  /// a hold H costs pause / H of the time, and the default 30 s keeps a 1 s Retry-After (nginx's, and the
  /// shortest providers send) under 3.5 % from the first probe on, 1.7 % after one failed probe. 0: no hold,
  /// no margin: CUBIC's curve as the SDKs run it, probing as soon as it is back at W.
  std::chrono::nanoseconds hold = std::chrono::seconds(30);
  /// The longest hold, >= hold.
  std::chrono::nanoseconds max_hold = std::chrono::minutes(5);
  /// The pacing margin below a held level (see algo::basic_pacing_margin): the level held is
  /// `W / (1 + margin)`, and congestion while holding (the level had been sent at without congestion for two
  /// measuring windows) widens the margin instead of cutting the rate, as jitter on the way, not the quota,
  /// made a send arrive early. Used only with a hold. The margin starts at 1/32 here (the known-quota
  /// default is 0): W is a rate at which the server refused, so a level held exactly at W is one already
  /// known to fail whenever a send arrives a little early. Setting the struct anew (`.margin = {.step = x}`)
  /// starts it from 0 again unless `.initial` is given too, and a `max` below 1/32 needs an `initial` at or
  /// below it.
  pacing_margin_options margin{.initial = 1.0 / 32};
};

/// A token bucket whose rate adapts to the upstream's throttling responses: it drops multiplicatively on a
/// 429 or 503 and climbs back along a cubic curve while requests succeed, so a client that does not know
/// the quota converges to it instead of paying the rejections forever.
///
/// The control law is CUBIC (RFC 8312, section 4.1) applied to a sending rate, as the AWS SDKs' "adaptive"
/// retry mode does (botocore `ClientRateLimiter` with `CubicCalculator`, `RateClocker` and `TokenBucket`):
/// - congestion at time t: `W = min(rate, sending rate)` (out of slow start, the sending rate is at least
///   the rate of the latest 8 takes, up to 1.44 times the window's: a doubling rate runs ahead of the
///   window's average by up to 1 / ln 2), `rate = b * W`, `K = cbrt(W * (1 - b) / scale)`,
///   and the curve restarts at t; b is `beta`, or `(1 + beta) / 2` on the plateau (below); congestion that
///   comes with a pause the upstream ordered (a Retry-After) restarts the curve when the pause ends, with
///   other cuts (see on_congestion);
/// - success at time t: `rate = scale * (t - t_decrease - K)^3 + W`, concave up to W (reached K seconds after
///   the decrease), then convex beyond it, probing for more;
/// - before any congestion, slow start: `initial_rate * 2^((t - t_start) / measure_interval)`; without it,
///   `initial_rate + scale * (t - t_start)^3` (W = initial_rate, K = 0);
/// - the rate stays in [min_rate, max_rate], and a success never raises it above max(rate, max_growth x
///   the sending rate), and never lowers it.
///
/// The sending rate is measured from the tokens taken: an exponential moving average over windows of
/// `measure_interval` (`measured_rate()`), or the current window's rate so far when that is higher. A
/// window's rate is the rate of its takes while it was sending: the tokens taken after its first take over
/// the time from that take to its last (for single tokens, `(n - 1) / (last - first)`), so that a pause (a
/// quota gate holding every caller after a 429, an idle spell) across windows does not read as a slow
/// sender; a window with a single take, or all at one instant, is no sample. A pause shorter than a window
/// and inside it still lowers that window's rate. Until a window has been a sample the rate is unknown, and caps nothing.
///
/// Holding a level found (with `hold` > 0, the default), for servers that refuse early arrivals and pause the
/// client for each refusal:
/// - the curve does not pass `L = W / (1 + margin)` on its way back, and stays at L for `hold` once there
///   (K seconds after the decrease); then it probes, `L + scale * (t - t_decrease - K - hold)^3`, gently;
/// - congestion at a rate at or below a *confirmed* level (one the client sent at for two measuring
///   windows without congestion) is jitter, not the quota: the margin widens (algo::basic_pacing_margin)
///   and the rate drops only to the new L, holding there from when sending resumes; the margin is
///   forgotten with its half-life. Only when the margin is at its widest does such congestion cut;
/// - congestion while probing (past the hold) has found the quota between L and the rate sent at, w: W
///   becomes w, the margin widens, the rate drops to the new L at once (no multiplicative cut) and holds,
///   and the hold doubles (up to `max_hold`), so that a quota once found is probed ever more rarely.
/// With `hold` = 0 the curve is CUBIC's, probing as soon as it is back at W.
///
/// Where rein departs from the SDKs, and why:
/// - Congestion from a request sent before the latest decrease is ignored: it reports on the old rate, which
///   has already been cut (RFC 5681's one reduction per window; the SDKs cut again for every throttled
///   response in flight, which collapses the rate when many requests are outstanding at once).
/// - On the plateau, half the cut: when congestion comes above the rate the previous decrease set and
///   `(1 + beta) / 2 * W` is still at or below the previous W, the quota is known to lie near that W, and the
///   cut only has to take back the overshoot (and let the server's burst allowance refill), not search
///   again. CUBIC's concave return to W loses `(1 - b) W K / 4` tokens per cut (80 for W = 200 at beta
///   0.7, 40 with half the cut); a quota that has dropped shows as congestion at or below the previous cut's
///   rate, which takes the full cut.
/// - The burst is an option instead of one second's worth of tokens; the limiter is active from the start
///   (at `initial_rate`) instead of unlimited until the first throttling error; the sending rate is counted
///   when tokens are taken rather than when responses arrive, window by window (so that the result does not
///   depend on when anyone looked), and never below the current window's own rate.
///
/// It models `rein::algo::rate_limit` (`try_take`, `ready_at`, `refund`, `capacity`, `last_time`; also
/// `charge` and `limit_remaining`, as the token bucket underneath) with the exact integer arithmetic of
/// `basic_token_bucket`: between two feedback calls, admission is the bucket's, to the nanosecond. Feedback changes the rate from its own time on (tokens up to then arrived at the old
/// rate). Rates are doubles; every decision is a pure function of the calls and their time stamps.
///
/// @par Time
/// Time is clamped to be monotonic: a stamp earlier than `last_time()` is treated as `last_time()`. Any
/// reading is a valid stamp, `time_point::min()` and `max()` included (see rein::algo::rate_limit).
///
/// @par Thread Safety
/// A plain value: distinct objects are independent; one object must not be used concurrently.
///
/// @tparam Clock a Chrono clock whose tick is a nanosecond or coarser (default `std::chrono::steady_clock`).
template <class Clock = std::chrono::steady_clock>
class basic_adaptive_rate {
  static_assert(detail::tick_at_least_a_nanosecond<Clock>, "rein::algo: the clock's tick must be >= 1 ns");

 public:
  /// The clock that times the rule.
  using clock = Clock;
  /// A point in time of `clock`.
  using time_point = typename Clock::time_point;
  /// A duration of `clock`.
  using duration = typename Clock::duration;
  /// The options type, as the constructor takes them.
  using options = adaptive_rate_options;

  /// Makes the limiter at time `now`, sending at `o.initial_rate` with `o.initial_tokens` (default: full).
  /// @throws std::invalid_argument naming the field and the value if an option is outside its documented
  /// range (NaN and infinities included, except an infinite `max_growth`).
  basic_adaptive_rate(const options& o, time_point now)
      : options_(validated(o)),
        bucket_({.rate = o.initial_rate, .capacity = o.burst, .initial_tokens = o.initial_tokens}, now),
        rate_(o.initial_rate),
        w_max_(o.initial_rate),
        epoch_ns_(detail::to_ns(now)),
        latest_ns_(epoch_ns_),
        window_start_ns_(epoch_ns_),
        margin_(rein::detail::renaming_errors("rein::algo::pacing_margin", {type_name},
                                              [&] { return basic_pacing_margin<Clock>(o.margin, now); }, "margin.")),
        hold_ns_(o.hold.count()) {}

  // ---- rein::algo::rate_limit --------------------------------------------------------------------------

  /// Takes n tokens at t if n are there (see `basic_token_bucket::try_take`); the n count towards the
  /// measured sending rate.
  /// @throws std::invalid_argument if n < 0.
  take_result try_take(std::int64_t n, time_point t) {
    const std::int64_t now = clamp(t);
    const take_result result = bucket_.try_take(n, at(now));
    if (result == take_result::allowed) {
      observe(at(now));
      if (sent_in_window_ == 0) first_take_ns_ = now, first_take_n_ = n;
      last_take_ns_ = now;
      sent_in_window_ += n;
      if (in_slow_start()) recent_.add(now, n);
    }
    return result;
  }

  /// The earliest time, not before max(t, last_time()), at which n tokens are there at the current rate, or
  /// std::nullopt (n > capacity(), or beyond the clock's range). Feedback moves it either way. Reads only.
  /// @throws std::invalid_argument if n < 0.
  std::optional<time_point> ready_at(std::int64_t n, time_point t) const { return bucket_.ready_at(n, at(clamp(t))); }

  /// Gives back n tokens at t (a call that was not made), never above the burst; they no longer count as sent
  /// in the current measuring window.
  /// @throws std::invalid_argument if n < 0.
  void refund(std::int64_t n, time_point t) {
    detail::check_request(type_name, n);
    const std::int64_t now = observe(t);
    bucket_.refund(n, at(now));
    sent_in_window_ -= std::min(n, sent_in_window_);
  }

  /// Takes n tokens at t whatever is there, into debt if need be (see `basic_token_bucket::charge`: the cost
  /// of a call above its estimate, charged after the fact; later takes wait until the rate repays it). The
  /// charge is not a send, so it does not count towards the measured sending rate; the slower takes that
  /// follow do.
  /// @throws std::invalid_argument if n < 0.
  void charge(std::int64_t n, time_point t) {
    detail::check_request(type_name, n);
    const std::int64_t now = observe(t);
    bucket_.charge(n, at(now));
  }

  /// Caps what is admitted from t until `t + reset_after` at `remaining` (see
  /// `basic_token_bucket::limit_remaining`; with `reset_after` = 0 the tokens drop to `remaining`).
  /// @returns true if the bucket now admits less.
  /// @throws std::invalid_argument if remaining < 0 or reset_after < 0.
  bool limit_remaining(std::int64_t remaining, std::chrono::nanoseconds reset_after, time_point t) {
    const std::int64_t now = clamp(t);
    const bool lowered = bucket_.limit_remaining(remaining, reset_after, at(now));
    if (lowered) observe(t);
    return lowered;
  }

  /// The burst: the largest n a single request may ask for.
  std::int64_t capacity() const noexcept { return bucket_.capacity(); }

  /// The latest time stamp seen by a call that changes the state (a take, a refund, feedback).
  time_point last_time() const noexcept { return at(latest_ns_); }

  // ---- feedback ------------------------------------------------------------------------------------------

  /// Reports how a request sent at `sent` ended, at time `now`: `success` may raise the rate, `congestion`
  /// (429, 503, a timeout: see rein::classify_http_status) lowers it unless the request was sent before the
  /// latest decrease, `ignored` changes nothing. `pause`: how long, from `now`, nothing will be sent because
  /// the upstream said so (a 429's Retry-After applied by a quota gate); see on_congestion. Ignored unless
  /// congestion.
  void record(outcome result, time_point sent, time_point now, std::chrono::nanoseconds pause = {}) {
    if (result == outcome::success) on_success(now);
    if (result == outcome::congestion) on_congestion(sent, now, pause);
  }

  /// A request succeeded at `now`: the rate moves to the cubic curve's value at `now`, within the bounds and
  /// the growth cap, and never down. Returns true if the rate rose.
  bool on_success(time_point now) {
    const std::int64_t t = observe(now);
    confirm(t);
    double next = std::clamp(curve(t), options_.min_rate, options_.max_rate);
    if (const auto sending = sending_rate(t); sending && next > rate_)
      next = std::min(next, std::max(rate_, options_.max_growth * *sending));
    if (!(next > rate_)) return false;
    ++increases_;
    apply(next, t);
    return true;
  }

  /// A request sent at `sent` was throttled, seen at `now`. Unless it was sent before the latest decrease,
  /// the rate drops to `beta` times the lower of the rate and the sending rate (on the plateau of the
  /// previous decrease, `(1 + beta) / 2` times), and the cubic curve restarts from there. Returns true if
  /// this was such a decrease, false if the signal was stale.
  ///
  /// `pause` (>= 0; a negative one counts as 0) is how long from `now` nothing will be sent because the
  /// upstream said so: the Retry-After that a quota gate applies to every caller (rein::throttle's
  /// guard.reject() passes the pause its gates applied). A decrease with a pause is the rate's version of
  /// TCP's retransmission timeout (RFC 6298 section 5, RFC 5681 section 3.1), and differs in three ways:
  /// - the curve restarts when sending resumes, at `now + pause` (RFC 8312's t counts time spent sending; a
  ///   curve that climbed during the pause would resume above the cut, as if the pause had been a success);
  ///   congestion from a request sent before then is stale;
  /// - never half the cut: each pause costs a pause's worth of the quota (a second per "Retry-After: 1"),
  ///   more than the full cut's slower climb back, so the cut is the one most likely to land below it;
  /// - a deeper cut where the last one fell short: out of slow start, `min(beta, 1/2)` (RFC 5681's ssthresh
  ///   of half the flight: doubling once per window overshoots the quota by up to 2x, and 0.7 of 2x is still
  ///   above it); below the previous plateau (under `(1 + beta) / 2` times the previous W: the previous cut
  ///   did not get under the quota), `beta^2`, as RFC 6298 backs off again after a second timeout.
  bool on_congestion(time_point sent, time_point now, std::chrono::nanoseconds pause = {}) {
    const std::int64_t t = observe(now);
    if (detail::to_ns(sent) < stale_before_ns_) {
      ++stale_;
      return false;
    }
    const bool paused = pause.count() > 0;
    const double w = congested_rate(t);
    const std::int64_t resume = paused ? rein::detail::ns_after(t, pause.count()) : t;
    if (holding() && w <= confirmed_ && margin_.margin(now) < options_.margin.max) return widen_margin(sent, now, resume);
    if (holding() && decreases_ > 0 && t >= epoch_ns_) {
      const double x = seconds_between(t, epoch_ns_) - k_;
      if (x > hold_seconds()) return failed_probe(w, sent, now, resume);
    }
    confirmed_ = std::min(confirmed_, w);  // a level that just failed is not confirmed
    // Near the previous decrease's W the quota is known, and the cut only has to take back the overshoot:
    // half the cut, when that still lands at or below the previous W.
    const double half_cut = (1.0 + options_.beta) / 2.0;
    const bool plateau = !paused && decreases_ > 0 && w > cut_to_ && half_cut * w <= w_max_;
    double beta = plateau ? half_cut : options_.beta;
    if (paused && in_slow_start()) beta = std::min(beta, 0.5);
    if (paused && decreases_ > 0 && w < half_cut * w_max_) beta = options_.beta * options_.beta;
    cut_to_ = beta * w;
    w_max_ = w;
    k_ = std::cbrt(w_max_ * (1.0 - beta) / options_.scale);
    epoch_ns_ = resume;
    stale_before_ns_ = resume;
    ++decreases_;
    apply(std::clamp(beta * w_max_, options_.min_rate, options_.max_rate), t);
    return true;
  }

  // ---- readings ------------------------------------------------------------------------------------------

  /// The current rate, tokens per second.
  double rate() const noexcept { return rate_; }
  /// The tokens in the bucket at t (fractional, rounded to a double). Reads only.
  double tokens(time_point t) const { return bucket_.tokens(at(clamp(t))); }
  /// The measured sending rate, tokens per second: an exponential moving average over the windows of
  /// `measure_interval`, as of the latest window that a take or feedback call has closed; std::nullopt until
  /// then.
  std::optional<double> measured_rate() const noexcept { return measured_; }
  /// CUBIC's W: the rate the latest decrease started from (initial_rate before any), tokens per second.
  double rate_at_decrease() const noexcept { return w_max_; }
  /// CUBIC's K: seconds from the latest decrease until the curve is back at rate_at_decrease().
  double recovery_seconds() const noexcept { return k_; }
  /// When the current curve started: the latest decrease (plus its pause, so possibly in the future), K
  /// seconds before sending resumed after a margin widening or a failed probe (the hold then starts at
  /// once), or construction.
  time_point curve_start() const noexcept { return at(epoch_ns_); }
  /// Congestion signals that cut the rate multiplicatively. Every congestion signal is counted once, in
  /// decreases(), stale_congestion(), margin_widenings() or failed_probes().
  std::uint64_t decreases() const noexcept { return decreases_; }
  /// Successes that raised the rate.
  std::uint64_t increases() const noexcept { return increases_; }
  /// Congestion signals ignored because their request was sent before the latest reaction to congestion (a
  /// decrease, a margin widening or a failed probe; counted from when sending resumed after its pause).
  std::uint64_t stale_congestion() const noexcept { return stale_; }
  /// Congestion signals at a confirmed level that widened the pacing margin instead of cutting the rate.
  std::uint64_t margin_widenings() const noexcept { return widenings_; }
  /// Probes above a held level that ended in congestion (each doubled the hold).
  std::uint64_t failed_probes() const noexcept { return probes_failed_; }
  /// The pacing margin below the held level now (0 without a hold).
  double margin(time_point t) const noexcept { return holding() ? margin_.margin(t) : 0.0; }
  /// The hold now: how long the rate stays at a level found before probing above it.
  std::chrono::nanoseconds hold() const noexcept { return std::chrono::nanoseconds(hold_ns_); }
  /// The highest rate sent at for two measuring windows without congestion (0: none yet), lowered to the
  /// rate of any congestion above which it would otherwise stay; congestion at or below it widens the
  /// margin instead of cutting.
  double confirmed_rate() const noexcept { return confirmed_; }
  /// The options in force (as validated at construction).
  const options& get_options() const noexcept { return options_; }

 private:
  static constexpr const char* type_name = "rein::algo::adaptive_rate";

  static time_point at(std::int64_t ns) noexcept {
    return time_point(std::chrono::ceil<duration>(std::chrono::nanoseconds(ns)));
  }

  // Seconds from `earlier` to `later`, saturated: the curve's start may be as far as the int64 range allows
  // (a pause of nanoseconds::max(), a construction at time_point::min()).
  static double seconds_between(std::int64_t later, std::int64_t earlier) noexcept {
    return static_cast<double>(rein::detail::ns_between(later, earlier)) / 1e9;
  }

  std::int64_t clamp(time_point t) const noexcept { return std::max(detail::to_ns(t), latest_ns_); }

  // Every state-changing call goes through here: time moves on, and the measuring window rolls.
  std::int64_t observe(time_point t) {
    const std::int64_t now = clamp(t);
    latest_ns_ = now;
    roll_window(now);
    return now;
  }

  // Windows are [start, start + interval). When time has left the current one, its rate while sending (see
  // window_rate) becomes the newest sample of the average; windows that sent nothing are no sample (the SDKs'
  // RateClocker spreads the count over all the windows passed, so a pause reads as a slow sender and the
  // next decrease starts from it). The result does not depend on when the roll happens, so a denied take
  // need not roll and reading changes nothing.
  void roll_window(std::int64_t now) {
    const std::int64_t interval = options_.measure_interval.count();
    const std::int64_t passed = rein::detail::ns_between(now, window_start_ns_) / interval;
    if (passed == 0) return;
    if (const auto newest = window_rate()) {
      measured_ = measured_ ? options_.smoothing * *newest + (1.0 - options_.smoothing) * *measured_ : *newest;
    }
    window_start_ns_ += passed * interval;
    sent_in_window_ = 0;
  }

  // The current window's sending rate while it sent: the tokens taken after its first take, over the span
  // from that take to its last; nothing if there are none or the span is zero.
  std::optional<double> window_rate() const noexcept {
    const std::int64_t span = rein::detail::ns_between(last_take_ns_, first_take_ns_);
    const std::int64_t after_first = sent_in_window_ - first_take_n_;
    if (after_first <= 0 || span <= 0) return std::nullopt;
    return static_cast<double>(after_first) * 1e9 / static_cast<double>(span);
  }

  // What the client has been sending: the smoothed rate of past windows, or the current window's rate so far
  // if higher (a burst is not a slow sender). Unknown before a window has been a sample.
  std::optional<double> sending_rate(std::int64_t) const noexcept {
    if (!measured_) return std::nullopt;
    const auto partial = window_rate();
    return partial ? std::max(*measured_, *partial) : *measured_;
  }

  // W: the rate the client was sending at when congestion came: the sending rate, capped by the rate. In
  // slow start the rate doubles every window, so the window's average lags the rate it had reached by up to
  // 1 / ln 2 (1.44): the rate of the latest few takes reads it.
  double congested_rate(std::int64_t now) const {
    auto sending = sending_rate(now);
    if (sending && in_slow_start()) {
      if (const auto latest = recent_.rate()) sending = std::max(*sending, std::min(*latest, 1.44 * *sending));
    }
    return sending ? std::min(rate_, *sending) : rate_;
  }

  // Until the first cut: the rate doubles every window. Only that cut reads the latest takes, so takes are
  // recorded only here.
  bool in_slow_start() const noexcept { return decreases_ == 0 && options_.slow_start; }

  double curve(std::int64_t now) const noexcept {
    const double t = seconds_between(now, epoch_ns_);
    if (in_slow_start())
      return options_.initial_rate * std::exp2(t * 1e9 / static_cast<double>(options_.measure_interval.count()));
    const double x = t - k_;
    if (!holding() || decreases_ == 0) return options_.scale * x * x * x + w_max_;
    const double level = w_max_ / (1.0 + margin_.margin(at(now)));
    if (x < 0) return std::min(options_.scale * x * x * x + w_max_, level);
    const double probe = std::max(0.0, x - hold_seconds());
    return level + options_.scale * probe * probe * probe;
  }

  bool holding() const noexcept { return options_.hold.count() > 0; }
  double hold_seconds() const noexcept { return static_cast<double>(hold_ns_) / 1e9; }

  // A rate sent at for two measuring windows since the latest congestion (or its pause) is confirmed; not
  // before the first decrease (slow start's rate is a search, not a level).
  void confirm(std::int64_t t) {
    if (!holding() || decreases_ == 0) return;
    if (rein::detail::ns_between(t, std::max(epoch_ns_, congested_ns_)) < 2 * options_.measure_interval.count()) return;
    const auto sending = sending_rate(t);
    confirmed_ = std::max(confirmed_, sending ? std::min(rate_, *sending) : rate_);
  }

  // Congestion while probing above the held level: the quota lies between that level and `w`, the rate
  // sent at. W becomes `w`, the margin widens (the probe's sends were the early ones), the rate drops to the
  // new level at once (no multiplicative cut: the level below was sent at without congestion) and holds
  // there from `resume`, twice as long as before.
  bool failed_probe(double w, time_point sent, time_point now, std::int64_t resume) {
    hold_ns_ = std::min(2 * hold_ns_, options_.max_hold.count());
    ++probes_failed_;
    w_max_ = w;
    margin_.on_refused(sent, now);
    congested_ns_ = resume;
    stale_before_ns_ = resume;
    epoch_ns_ = restart_holding(resume);
    apply(std::clamp(w_max_ / (1.0 + margin_.margin(now)), options_.min_rate, options_.max_rate), detail::to_ns(now));
    return true;
  }

  // The curve's start that puts `resume` at the beginning of the hold (K seconds in).
  std::int64_t restart_holding(std::int64_t resume) const noexcept {
    if (resume == std::numeric_limits<std::int64_t>::max()) return resume;
    // Saturating: K is a double that a tiny `scale` makes huge.
    const double k_ns = std::ceil(k_ * 1e9);
    constexpr double limit = 4.0e18;  // |resume| and k_ns both below it: their difference fits
    if (k_ns < limit && resume > -static_cast<std::int64_t>(limit)) return resume - static_cast<std::int64_t>(k_ns);
    return std::numeric_limits<std::int64_t>::min();
  }

  // Congestion at a confirmed level: the margin widens, the rate drops to the new level and holds there
  // from `resume` (the curve restarted K seconds in); W, K and the hold stay.
  bool widen_margin(time_point sent, time_point now, std::int64_t resume) {
    const bool widened = margin_.on_refused(sent, now);
    if (!widened) {
      ++stale_;
      return false;
    }
    ++widenings_;
    congested_ns_ = resume;
    stale_before_ns_ = resume;
    epoch_ns_ = restart_holding(resume);
    const double level = std::clamp(w_max_ / (1.0 + margin_.margin(now)), options_.min_rate, options_.max_rate);
    apply(std::min(rate_, level), detail::to_ns(now));
    return true;
  }

  void apply(double next, std::int64_t now) {
    if (next == rate_) return;
    bucket_.set_rate(next, at(now));
    rate_ = next;
  }

  static void check(bool ok, const char* rule, const std::string& got) {
    if (!ok) detail::throw_invalid(type_name, rule, got);
  }

  static const options& validated(const options& o) {
    using detail::show;
    const double max_bucket_rate = basic_token_bucket<Clock>::max_rate;
    check(o.min_rate > 0 && o.min_rate <= max_bucket_rate, "min_rate must be > 0 and at most 1e9 tokens per second",
          show(o.min_rate));
    check(o.max_rate >= o.min_rate && o.max_rate <= max_bucket_rate,
          "max_rate must be in [min_rate, 1e9] tokens per second", show(o.max_rate));
    check(o.initial_rate >= o.min_rate && o.initial_rate <= o.max_rate, "initial_rate must be in [min_rate, max_rate]",
          show(o.initial_rate));
    check(o.burst >= 1 && o.burst <= basic_token_bucket<Clock>::max_capacity, "burst must be in [1, 1e15] tokens",
          show(o.burst));
    check(!o.initial_tokens || (*o.initial_tokens >= 0 && *o.initial_tokens <= o.burst),
          "initial_tokens must be in [0, burst]", show(o.initial_tokens.value_or(0)));
    check(o.beta > 0 && o.beta < 1, "beta must be in (0, 1)", show(o.beta));
    check(o.scale > 0 && o.scale < std::numeric_limits<double>::infinity(), "scale must be > 0 and finite",
          show(o.scale));
    check(o.measure_interval.count() > 0, "measure_interval must be > 0 ns", show(o.measure_interval.count()));
    check(o.smoothing > 0 && o.smoothing <= 1, "smoothing must be in (0, 1]", show(o.smoothing));
    check(o.max_growth >= 1, "max_growth must be >= 1", show(o.max_growth));
    check(o.hold.count() >= 0, "hold must be >= 0", show(o.hold));
    check(o.max_hold >= o.hold, "max_hold must be >= hold", show(o.max_hold));
    return o;
  }

  options options_;
  basic_token_bucket<Clock> bucket_;
  double rate_;
  double w_max_;
  double k_ = 0;
  double cut_to_ = 0;
  std::int64_t epoch_ns_;
  // Congestion from a request sent before this reported on a rate already reacted to (a cut, a widening,
  // a failed probe; when sending resumed after its pause): stale.
  std::int64_t stale_before_ns_ = std::numeric_limits<std::int64_t>::min();
  std::int64_t latest_ns_;
  std::int64_t window_start_ns_;
  std::int64_t sent_in_window_ = 0;
  std::int64_t first_take_ns_ = 0;  // of the current window
  std::int64_t first_take_n_ = 0;
  std::int64_t last_take_ns_ = 0;
  std::optional<double> measured_{};
  detail::recent_takes recent_{};
  basic_pacing_margin<Clock> margin_;
  std::int64_t hold_ns_;
  double confirmed_ = 0;
  std::int64_t congested_ns_ = std::numeric_limits<std::int64_t>::min();
  std::uint64_t probes_failed_ = 0;
  std::uint64_t widenings_ = 0;
  std::uint64_t decreases_ = 0;
  std::uint64_t increases_ = 0;
  std::uint64_t stale_ = 0;
};

/// The adaptive rate on `std::chrono::steady_clock`.
using adaptive_rate = basic_adaptive_rate<>;

}  // namespace rein::algo
