// A circuit breaker for an adaptive concurrency limit at its floor: fail fast while the dependency is down.
#pragma once

#include <rein/algo/limit_algorithm.hpp>
#include <rein/outcome.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace rein::algo {

/// Options of `basic_circuit` (and of an adaptive limiter's `adaptive_limiter_options::circuit`).
///
/// The rule: the circuit opens after `open_after` consecutive congestion outcomes that each leave the limit
/// at its floor (a success in between starts the count again); it stays open for `open_for`, refusing every
/// call; then it is half-open and admits `probes` calls; the first probe to succeed closes it, the first to
/// report congestion opens it again for another `open_for`.
///
/// Why consecutive samples at the floor rather than a time at the floor: at the floor the limiter admits
/// min_limit calls at once, so a count of samples there is a count of round trips, whatever the latency; a
/// time would depend on how slow the failures are (a 30 s timeout would open the circuit on its first
/// failure, a fast 503 only after many). Only `congestion` outcomes count (timeouts, 429, 503, 504): a slow
/// success means the dependency still answers. The count is Envoy's outlier detection rule
/// (`consecutive_5xx`, default 5, ejected for `base_ejection_time`, default 30 s); the states are
/// resilience4j's CircuitBreaker (CLOSED, OPEN for `waitDurationInOpenState`, HALF_OPEN with
/// `permittedNumberOfCallsInHalfOpenState`), whose failure-rate trigger needs a window of calls that a
/// limit of 1 takes long to fill. Netflix concurrency-limits has no circuit: its limit only sits at the
/// floor and queues there.
///
/// Off by default (`open_after` 0): an open circuit turns waits into errors the caller sees
/// (errc::upstream_unavailable), which is a change of contract only the caller can choose; and it is not free
/// for every algorithm. On the generated family (rein::testing::family, seeds 1-1000, none of whose
/// upstreams is ever down), a circuit with open_after 5 would never open beside the defaults of any of
/// rein's algorithms; but an algorithm that sits at its floor while calls succeed slowly would trip it (pid
/// did, in 242 scenarios, before its windows spanned a round trip), failing calls that would have been
/// served.
struct circuit_options {
  /// Consecutive congestion outcomes, each leaving the limit at its floor, that open the circuit. 0: never
  /// (the default). 5 is Envoy's `consecutive_5xx`.
  std::size_t open_after = 0;
  /// How long the circuit stays open before it lets probes through, in nanoseconds; > 0. Default 5 s
  /// (Hystrix's `sleepWindowInMilliseconds`; resilience4j waits 60 s, Envoy 30 s).
  std::chrono::nanoseconds open_for = std::chrono::seconds(5);
  /// Calls granted while half-open (the probes); >= 1. Default 1: one call tests the dependency.
  std::size_t probes = 1;
};

/// Where a circuit is.
enum class circuit_state : std::uint8_t {
  closed = 0,     ///< calls are admitted by the limit
  open = 1,       ///< every call is refused (errc::upstream_unavailable)
  half_open = 2,  ///< up to `probes` calls are granted; their outcome closes or re-opens the circuit
};

/// The state's name: "closed", "open", "half_open".
constexpr std::string_view to_string(circuit_state s) noexcept {
  switch (s) {
    case circuit_state::closed: return "closed";
    case circuit_state::open: return "open";
    case circuit_state::half_open: return "half_open";
  }
  return "unknown";
}

/// The circuit's state machine (see circuit_options for the rule and its sources). A plain value type:
/// time is an argument, nothing reads a clock; `adaptive_limiter` calls it under its lock.
///
/// - `refuses(now)`: whether a call asking now is refused (open, or half-open with every probe granted).
/// - `on_grant(now)`: a call was granted at `now` (counts a probe while half-open).
/// - `on_sample(result, granted, now, at_floor)`: a call granted at `granted` reported `result` at `now`;
///   `at_floor` says whether the limit sits at its floor after the algorithm took the sample.
///
/// While open, samples change nothing (they come from calls granted before it opened). While half-open,
/// only calls granted since it became half-open are probes: an older call that returns says nothing about
/// the dependency now. A probe reported `ignored` frees its place for another probe.
///
/// @tparam Clock supplies `time_point`; nothing here calls `Clock::now()`.
template <class Clock = std::chrono::steady_clock>
class basic_circuit {
 public:
  /// The clock whose time points the methods take.
  using clock_type = Clock;
  /// A point in time of `clock_type`.
  using time_point = typename Clock::time_point;
  /// The options type, as the constructor takes them.
  using options = circuit_options;

  /// @throws std::invalid_argument naming the field and value if `o` is invalid (open_for <= 0, probes 0).
  explicit basic_circuit(const options& o = {}) : options_{validated(o)} {}

  /// Replaces the options. A circuit that is open stays open until the end it was given; a consecutive count
  /// already reached opens it at the next congestion. `open_after` 0 closes it at once.
  /// @throws std::invalid_argument as the constructor; on a throw nothing changed.
  void set_options(const options& o) {
    options_ = validated(o);
    if (options_.open_after == 0) {
      state_ = circuit_state::closed;
      streak_ = 0;
      probes_out_ = 0;
    }
  }

  /// The options in force.
  const options& get_options() const noexcept { return options_; }

  /// Whether the circuit can open at all (`open_after` > 0).
  bool enabled() const noexcept { return options_.open_after != 0; }

  /// The state at `now` (an open circuit whose time is over is half-open).
  circuit_state state(time_point now) const noexcept {
    if (state_ == circuit_state::open && now >= open_until_) return circuit_state::half_open;
    return state_;
  }

  /// When an open circuit lets probes through (meaningful while state() is open).
  time_point open_until() const noexcept { return open_until_; }

  /// How many times the circuit opened so far.
  std::uint64_t opens() const noexcept { return opens_; }

  /// Congestion outcomes at the floor in a row, so far (0 once the circuit opens).
  std::size_t streak() const noexcept { return streak_; }

  /// True if a call asking at `now` is refused.
  bool refuses(time_point now) noexcept {
    if (state_ == circuit_state::closed) return false;
    settle(now);
    if (state_ == circuit_state::open) return true;
    return probes_out_ >= options_.probes;
  }

  /// A call was granted at `now`.
  void on_grant(time_point now) noexcept {
    if (state_ == circuit_state::closed) return;
    settle(now);
    if (state_ == circuit_state::half_open) ++probes_out_;
  }

  /// A call granted at `granted` reported `result` at `now`; `at_floor`: the limit is at its floor now.
  void on_sample(outcome result, time_point granted, time_point now, bool at_floor) noexcept {
    if (!enabled()) return;
    settle(now);
    switch (state_) {
      case circuit_state::closed:
        if (result == outcome::success) streak_ = 0;
        else if (result == outcome::congestion && at_floor && ++streak_ >= options_.open_after) open(now);
        return;
      case circuit_state::open: return;
      case circuit_state::half_open:
        if (granted < half_open_since_) return;  // granted before the probes: not one of them
        if (probes_out_ > 0) --probes_out_;
        if (result == outcome::success) close();
        else if (result == outcome::congestion) open(now);
        return;
    }
  }

 private:
  // An open circuit whose time is over becomes half-open.
  void settle(time_point now) noexcept {
    if (state_ == circuit_state::open && now >= open_until_) {
      state_ = circuit_state::half_open;
      half_open_since_ = open_until_;
      probes_out_ = 0;
    }
  }

  void open(time_point now) noexcept {
    state_ = circuit_state::open;
    streak_ = 0;
    probes_out_ = 0;
    ++opens_;
    const auto d = std::chrono::duration_cast<typename Clock::duration>(options_.open_for);
    open_until_ = now > time_point::max() - d ? time_point::max() : now + d;  // saturated
  }

  void close() noexcept {
    state_ = circuit_state::closed;
    streak_ = 0;
    probes_out_ = 0;
  }

  static const options& validated(const options& o) {
    if (o.open_for <= std::chrono::nanoseconds::zero())
      detail::invalid_option("circuit", "open_for", "> 0", o.open_for);
    if (o.probes == 0) detail::invalid_option("circuit", "probes", ">= 1", o.probes);
    return o;
  }

  options options_;
  circuit_state state_ = circuit_state::closed;
  std::size_t streak_ = 0;
  std::size_t probes_out_ = 0;
  std::uint64_t opens_ = 0;
  time_point open_until_{};
  time_point half_open_since_{};
};

/// `basic_circuit` on `std::chrono::steady_clock`.
using circuit = basic_circuit<>;

}  // namespace rein::algo
