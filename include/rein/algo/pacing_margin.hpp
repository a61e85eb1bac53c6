// The margin a client paced at a known quota needs against a server that refuses early arrivals: learned
// from the server's refusals, forgotten slowly. Pure: time is an argument.
#pragma once

#include <rein/algo/rate_limit.hpp>
#include <rein/detail/clock_time.hpp>
#include <rein/detail/invalid_option.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>

namespace rein::algo {

/// Options of `basic_pacing_margin`. Margins are shares of the pacing interval 1/rate: a margin m paces
/// sends `(1 + m) / rate` apart, so the rate becomes `rate / (1 + m)`.
struct pacing_margin_options {
  /// The margin before any refusal, in [0, max]. Default 0: a client whose sends arrive as they left pays
  /// nothing.
  double initial = 0;
  /// The first widening, in (0, max]: a refusal widens the margin to at least this. Default 1/32 (a
  /// 3 % slower pace), so that sends 20 ms apart gain 0.625 ms, more than loopback's own jitter.
  double step = 1.0 / 32;
  /// The widest margin, in [step, 8]. Default 1: the pace never drops below half the rate on this account.
  /// 0 turns the margin off: refusals change nothing (`step` and `initial` are then not used).
  double max = 1;
  /// How much a fresh refusal widens the margin: it is multiplied by `growth` (at least to `step`), in
  /// (1, 4]. Default 1.5: the margin learned is at most 1.5 times what the jitter needs, so a pace within
  /// 0.96 of the best one the jitter allows, for a few more refusals while learning than doubling takes.
  double growth = 1.5;
  /// How fast the margin is forgotten: it halves every `half_life` without a refusal, > 0. Default 60 s,
  /// so that a jitter that lasts costs about one refusal a minute, not one every few seconds.
  std::chrono::nanoseconds half_life = std::chrono::seconds(60);
};

/// How much slower than its quota a client must pace so that jitter on the way does not make a send arrive
/// early, learned from the server's refusals.
///
/// A server that enforces a rate with no burst allowance (nginx `limit_req` without `burst`, many API
/// gateways) refuses any request that arrives sooner than 1/rate after the last one it admitted. A client
/// that sends exactly 1/rate apart has its sends delayed by different amounts on the way (scheduling, the
/// network, the server reading its clock in whole milliseconds), so some arrive early and are refused,
/// and each refusal usually comes with a Retry-After that pauses the client for far longer than the margin
/// would have cost.
///
/// The rule:
/// - a refusal (429, or 503 with Retry-After) of a request sent after the latest widening multiplies the
///   margin by `growth`, to at least `step` and at most `max` (a multiplicative backoff, as RFC 6298
///   section 5.5 backs off a retransmission timeout, with a smaller factor so that the margin learned
///   overshoots what the jitter needs by at most that factor); a refusal of a request sent before it
///   reports on the old pace and changes nothing (RFC 5681's one reduction per window of data);
/// - between refusals the margin decays exponentially, halving every `half_life`, so that the client
///   forgets a jitter that has gone, slowly: with a steady jitter it pays about one refusal per half-life
///   (one Retry-After pause a minute by default) and a pace `1 + m` times slower, with m at most `growth`
///   times what the jitter needs;
/// - without jitter (no refusals) the margin stays at `initial`: the default costs nothing.
///
/// The margin is a share of the interval, so it is the same for a stage charged by requests or by tokens.
///
/// @par Time
/// Any reading is a valid stamp, `time_point::min()` and `max()` included (see rein::algo::rate_limit): a
/// reading before the latest widening counts as that instant.
///
/// @par Thread Safety
/// A plain value: distinct objects are independent; one object must not be used concurrently.
///
/// @tparam Clock a Chrono clock whose tick is a nanosecond or coarser (default `std::chrono::steady_clock`).
template <class Clock = std::chrono::steady_clock>
class basic_pacing_margin {
  static_assert(detail::tick_at_least_a_nanosecond<Clock>, "rein::algo: the clock's tick must be >= 1 ns");

 public:
  /// The clock that times the rule.
  using clock = Clock;
  /// A point in time of `clock`.
  using time_point = typename Clock::time_point;
  /// The options type, as the constructor takes them.
  using options = pacing_margin_options;

  /// Starts at `o.initial` at time `now`.
  /// @throws std::invalid_argument naming the field and the value if an option is outside its range (NaN and
  /// infinities included).
  basic_pacing_margin(const options& o, time_point now)
      : options_(validated(o)), widened_ns_(detail::to_ns(now)), at_widening_(o.max == 0 ? 0 : o.initial) {
    if (options_.max == 0) options_.initial = options_.step = 0;
  }

  /// The margin at t: the latest widening's margin, halved every half_life since; `initial` once that is
  /// within step / 1024 of it (so a margin is forgotten after log2(1024 x max / step) half-lives at most).
  double margin(time_point t) const noexcept {
    const std::int64_t since = std::max<std::int64_t>(rein::detail::ns_between(detail::to_ns(t), widened_ns_), 0);
    const double halvings = static_cast<double>(since) / static_cast<double>(options_.half_life.count());
    const double decayed = at_widening_ * std::exp2(-halvings);
    // Within a thousandth of the step of `initial`, the margin is forgotten (an exponential never gets there).
    return decayed - options_.initial <= options_.step / 1024 ? options_.initial : decayed;
  }

  /// `rate / (1 + margin(t))`: the rate to pace at, for a quota of `rate` (any unit per second).
  double paced_rate(double rate, time_point t) const noexcept { return rate / (1.0 + margin(t)); }

  /// The server refused a request sent at `sent`, seen at `now`. Unless it was sent before the latest
  /// widening, the margin grows by `growth` (to at least `step`, at most `max`) from `now` on.
  /// @returns true if the margin widened; false if the refusal was stale or the margin was at `max` (whose
  /// decay then starts again from `now`).
  bool on_refused(time_point sent, time_point now) {
    if (options_.max == 0) return false;  // off
    if (detail::to_ns(sent) < widened_ns_ && widenings_ > 0) {
      ++stale_;
      return false;
    }
    const double before = margin(now);
    const double next = std::min(options_.max, std::max(options_.step, options_.growth * before));
    widened_ns_ = std::max(widened_ns_, detail::to_ns(now));
    at_widening_ = next;  // at `max`, this restarts its decay
    if (!(next > before)) return false;
    ++widenings_;
    return true;
  }

  /// Refusals that widened the margin.
  std::uint64_t widenings() const noexcept { return widenings_; }
  /// Refusals ignored as stale (sent before the latest widening).
  std::uint64_t stale_refusals() const noexcept { return stale_; }
  /// The options in force.
  const options& get_options() const noexcept { return options_; }

 private:
  static constexpr const char* type_name = "rein::algo::pacing_margin";

  static void check(bool ok, const char* rule, const std::string& got) {
    if (!ok) detail::throw_invalid(type_name, rule, got);
  }

  static const options& validated(const options& o) {
    using detail::show;
    check(o.max >= 0 && o.max <= 8, "max must be in [0, 8] (a share of the pacing interval)", show(o.max));
    if (o.max == 0) return o;  // off
    check(o.step > 0 && o.step <= o.max, "step must be in (0, max]", show(o.step));
    check(o.initial >= 0 && o.initial <= o.max, "initial must be in [0, max]", show(o.initial));
    check(o.growth > 1 && o.growth <= 4, "growth must be in (1, 4]", show(o.growth));
    check(o.half_life.count() > 0, "half_life must be > 0", show(o.half_life));
    return o;
  }

  options options_;
  std::int64_t widened_ns_;  // the latest widening (construction before any)
  double at_widening_;       // the margin set then
  std::uint64_t widenings_ = 0;
  std::uint64_t stale_ = 0;
};

/// The pacing margin on `std::chrono::steady_clock`.
using pacing_margin = basic_pacing_margin<>;

}  // namespace rein::algo
