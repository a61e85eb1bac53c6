// The admission rule of rein::basic_adaptive_limiter (in flight < floor(limit), the limit learned from
// the permits' samples, an optional circuit), as the wait line asks it. Not API.
#pragma once

#include <rein/algo/circuit.hpp>
#include <rein/algo/limit_algorithm.hpp>
#include <rein/detail/permit_source.hpp>
#include <rein/observer.hpp>
#include <rein/outcome.hpp>
#include <rein/wait_stats.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>

namespace rein::detail {

/// After an idle spell, fewer calls at once than the learned limit: the restart window of TCP (RFC 2861,
/// "congestion window validation", as Linux's tcp_slow_start_after_idle applies it). A limit learned before
/// the spell says nothing about the dependency now, and granting all of it at once when demand returns
/// bursts into a capacity that may have dropped meanwhile. Each whole `period` with nothing in flight halves
/// the calls admitted at once, down to `floor`; each success then adds one (slow start: the window doubles
/// per round trip) until it reaches the learned limit again. The algorithm's limit is untouched: its growth
/// guard sees the smaller in-flight counts and does not grow on them. An empty limiter always admits one
/// request that fits its limit, so a request larger than the window cannot wait for ever.
template <class TimePoint>
class restart_window {
 public:
  explicit restart_window(std::chrono::nanoseconds period) noexcept : period_{period} {}

  void set_period(std::chrono::nanoseconds period) noexcept { period_ = period; }

  /// The calls admitted at once now: `admitted`, or the restart window while it is below it.
  std::size_t cap(std::size_t admitted) const noexcept { return window_ != 0 && window_ < admitted ? window_ : admitted; }

  /// The last call came back at `now`: the limiter is idle from then on.
  void idle(TimePoint now) noexcept { idle_since_ = now; }

  /// Demand on an idle limiter at `now`: opens the window if the spell lasted a whole period or more.
  void demand(TimePoint now, std::size_t admitted, std::size_t floor) noexcept {
    if (idle_since_ == TimePoint::min()) return;
    const auto spell = std::chrono::duration_cast<std::chrono::nanoseconds>(now - idle_since_);
    idle_since_ = TimePoint::min();
    if (period_ <= std::chrono::nanoseconds::zero() || spell < period_) return;
    std::size_t window = cap(admitted);
    for (auto left = spell; left >= period_ && window > floor; left -= period_) window /= 2;
    window = window < floor ? floor : window;
    window_ = window < admitted ? window : 0;
  }

  /// A success: one call more at once, until the window reaches `admitted` and closes.
  void success(std::size_t admitted) noexcept {
    if (window_ != 0 && ++window_ >= admitted) window_ = 0;
  }

  /// The window now, 0 when closed.
  std::size_t window() const noexcept { return window_; }

 private:
  std::chrono::nanoseconds period_;
  TimePoint idle_since_ = TimePoint::min();
  std::size_t window_ = 0;
};

// The admission rule of an adaptive limiter: one more call while in_flight < floor(limit). Each returning
// permit becomes a sample for the algorithm, which may move the limit; the core re-checks the head waiter after
// every release, so a limit that rose admits waiters at once and one that fell admits nobody until in_flight
// is below it again. Calls already granted keep their slots.
template <class Algorithm, class Clock>
struct adaptive_policy {
  using time_point = typename Clock::time_point;
  using sample_type = typename Algorithm::sample_type;
  static constexpr bool needs_time = true;  // grants are stamped: latency runs from the grant

  Algorithm algorithm;
  std::size_t in_flight = 0;
  std::uint64_t successes = 0;
  std::uint64_t congestions = 0;
  std::uint64_t ignored = 0;
  duration_histogram service;

  algo::basic_circuit<Clock> circuit;
  restart_window<time_point> restart;

  adaptive_policy(const typename Algorithm::options& o, const algo::circuit_options& c,
                  std::chrono::nanoseconds idle_restart)
      : algorithm(o), circuit(c), restart(idle_restart) {}

  /// The calls admitted at once now: floor(limit), or fewer in a restart window after an idle spell.
  std::size_t admitted() const noexcept { return restart.cap(algo::admitted(algorithm.limit())); }

  bool exceeds(std::size_t n) const noexcept { return n > algo::admitted(algorithm.max_limit()); }

  // What partitions divide (rein/partition.hpp): the calls admitted under the current limit.
  std::size_t partition_limit() const noexcept { return admitted(); }

  bool refuses(std::size_t, time_point now) noexcept { return circuit.refuses(now); }

  bool try_take(std::size_t n, time_point now) noexcept {
    const std::size_t limit = algo::admitted(algorithm.limit());
    if (in_flight == 0) {
      restart.demand(now, limit, restart_floor());
      if (n > limit) return false;
    } else if (in_flight + n > restart.cap(limit)) {
      return false;
    }
    in_flight += n;
    circuit.on_grant(now);
    return true;
  }

  // Noted at each grant and carried by its permit: the calls in flight right after it, which its sample
  // reports (`sample::in_flight`). Carried, not filed by grant time: grants made at one instant (a release
  // that raises the limit admits several waiters at once) share a stamp, and calls that then finish out of
  // order would each be handed another's count.
  std::uint64_t grant_note() const noexcept { return in_flight; }

  bool at_floor() const noexcept {
    return static_cast<double>(algo::admitted(algorithm.limit())) <= algorithm.min_limit();
  }

  time_point ready_at(std::size_t, time_point) const noexcept { return time_point::max(); }  // only a release helps
  std::optional<time_point> predict(std::size_t, std::size_t, time_point) const noexcept { return std::nullopt; }

  // A permit that carries no note (0: none of this policy's grants, which count their own call) reports the
  // calls in flight now.
  void on_release(std::size_t n, std::chrono::nanoseconds stamp, outcome result, time_point now) noexcept {
    on_release(n, stamp, 0, result, now);
  }

  // Report first, then release: the sample is taken with the call still counted in flight. `work` is the
  // caller's work hint (permit::complete(outcome, completion_hint), checked there) for the sample, or none.
  template <class Work = no_work>
  void on_release(std::size_t n, std::chrono::nanoseconds stamp, std::uint64_t note, outcome result,
                  time_point now, Work work = {}) noexcept {
    count(result);
    if (result != outcome::ignored) {
      sample_type s;
      s.latency = std::max(to_ns(now) - stamp, std::chrono::nanoseconds::zero());
      s.result = result;
      s.in_flight = note != 0 ? static_cast<std::size_t>(note) : in_flight;
      s.now = now;
      if constexpr (!std::is_same_v<Work, no_work> && requires { s.work = work; }) s.work = work;
      else (void)work;
      service.record(s.latency);
      feed(s);
    }
    if (circuit.enabled())
      circuit.on_sample(result, time_point(std::chrono::duration_cast<typename Clock::duration>(stamp)), now,
                        at_floor());
    if (result == outcome::success) restart.success(algo::admitted(algorithm.limit()));
    in_flight -= n;
    if (in_flight == 0) restart.idle(now);
  }

  // Where a restart window stops halving: the algorithm's starting limit when it has one (every rein
  // algorithm does), else its floor.
  std::size_t restart_floor() const noexcept {
    if constexpr (requires { algorithm.get_options().initial_limit; })
      return algo::admitted(std::max(algorithm.get_options().initial_limit, algorithm.min_limit()));
    else
      return algo::admitted(algorithm.min_limit());
  }

  static std::chrono::nanoseconds to_ns(time_point t) noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch());
  }

  observed_state observe(time_point now) const noexcept {
    observed_state s;
    s.limit = algorithm.limit();
    const std::size_t admitted = algo::admitted(s.limit);
    s.level = static_cast<double>(admitted);
    s.cuts = algorithm.decreases();
    s.at_floor = static_cast<double>(admitted) <= algorithm.min_limit();
    s.at_ceiling = static_cast<double>(admitted) >= algorithm.max_limit();
    const algo::circuit_state c = circuit.state(now);
    s.circuit = static_cast<std::uint8_t>(c);
    s.opens = circuit.opens();
    if (c == algo::circuit_state::open)
      s.open_left = std::chrono::duration_cast<std::chrono::nanoseconds>(circuit.open_until() - now);
    return s;
  }

 private:
  void count(outcome result) noexcept {
    switch (result) {
      case outcome::success: ++successes; break;
      case outcome::congestion: ++congestions; break;
      case outcome::ignored: ++ignored; break;
    }
  }

  // A sample the algorithm cannot take (it threw, e.g. bad_alloc while growing a window) is dropped: a permit
  // must always come back, and this runs inside a noexcept release.
  void feed(const sample_type& s) noexcept {
    try {
      algorithm.on_sample(s);
    } catch (...) {
    }
  }
};

}  // namespace rein::detail
