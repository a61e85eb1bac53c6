// The degrading-upstream experiment as a deterministic discrete-event simulation.
//
// Pure: virtual time, no Asio, no clock reads, no sleeping; every run is exact and repeatable, so tests assert
// its figures. It drives any limit algorithm (anything with `limit()` and `on_sample()`), a fixed limit, or an
// oracle that knows the true capacity. The upstream model, the scenarios, the report and its printing are
// reusable by runs of the same experiment on the async limiter (manual clock or real time).
//
// Its event order is fixed, so every run gives the same figures: among events at the same instant a capacity
// change comes first, then completions in the order they were scheduled, then arrivals; service time runs
// from acquisition; a completing call reports its outcome and then releases its slot, and waiting calls are
// admitted (FIFO) right after each release.
#pragma once

#include <rein/algo/aimd.hpp>
#include <rein/algo/gradient.hpp>
#include <rein/algo/limit_algorithm.hpp>
#include <rein/algo/tuned_aimd.hpp>
#include <rein/outcome.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <limits>
#include <stdexcept>
#include <ostream>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rein::testing {

namespace detail {

/// splitmix64 (Steele, Lea and Flood, 2014): a tiny, seedable generator, the same on every platform.
inline std::uint64_t splitmix64(std::uint64_t& state) noexcept {
  state += 0x9e3779b97f4a7c15ULL;
  std::uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace detail

/// A pause of the upstream (a garbage collection, a failover): a call that enters during
/// `[at, at + length)` first waits until `at + length`, whatever the load. Not congestion: no limit helps.
struct stall {
  std::chrono::nanoseconds at;      ///< when it starts, from the run's start
  std::chrono::nanoseconds length;  ///< how long it lasts
};

/// How each call's own service time (its payload's) is drawn, as a factor of `base` with mean 1.
enum class payload_shape {
  none,       ///< every call takes `base` (or `base` with the uniform `noise`)
  uniform,    ///< a factor uniform in [1 - spread, 1 + spread]; spread in [0, 1)
  lognormal,  ///< a lognormal factor of mean 1 and coefficient of variation `spread` (> 0): long answers
  bimodal,    ///< short or long: 0.5 for 80 % of the calls, 3 for the others (mean 1); `spread` unused
};

/// A dependency whose service time grows past its capacity and which fails past a hard cap.
///
/// A call that enters while `n` calls are inside (itself included) takes `b x (1 + max(0, n - capacity))`;
/// if `n > hard_cap` it takes `b` and then fails. `b` is `base`, or with `noise` set, `base` times a factor
/// drawn uniformly from `[1 - noise, 1 + noise]` for each call (a seeded generator, so runs repeat), or with
/// a `payload` shape, `base` times a factor drawn from it (the size of the call's answer: an LLM's tokens).
/// With `failure_rate` p, each call also fails with probability p whatever the load (a random 503: not
/// congestion), after the time it would have taken. A call entering during a stall first waits for it to
/// end. Capacity may change at any time; a call's service time is fixed when it enters.
class upstream_model {
 public:
  /// The upstream's parameters.
  struct options {
    std::chrono::nanoseconds base = std::chrono::milliseconds{5};  ///< service time at or below capacity
    std::size_t hard_cap = 25;           ///< more calls inside than this: fail after `base`
    std::size_t capacity = 16;           ///< calls it serves at base latency
    /// Added to every call's service time (0 in the exact model). 1 ms is about how late real
    /// timers fire, and brings the figures close to a real-time run's.
    std::chrono::nanoseconds overhead{0};
    /// Latency noise: each call's base is scaled by a factor uniform in [1 - noise, 1 + noise]; in [0, 1).
    double noise = 0.0;
    /// Seed of the noise generator (also draws the payload factors).
    std::uint64_t noise_seed = 0;
    /// Pauses, in any order (see `stall`).
    std::vector<stall> stalls{};
    /// How each call's payload scales its base (see `payload_shape`); replaces `noise` when not `none`.
    payload_shape payload = payload_shape::none;
    /// The payload's spread: half-width for `uniform`, coefficient of variation for `lognormal`.
    double payload_spread = 0.0;
    /// Probability that a call fails whatever the load, in [0, 1): failures independent of the limit.
    double failure_rate = 0.0;
    /// Seed of the failure draws (a generator of their own, so failures do not move the payloads).
    std::uint64_t failure_seed = 0;
  };

  /// What one call will do, decided when it enters.
  struct call_plan {
    std::chrono::nanoseconds service_time;  ///< how long until it completes (or fails)
    bool ok;                                ///< false: it fails (a timeout: congestion)
    std::size_t inside;                     ///< calls inside when it entered, itself included
    /// What the same call would have taken at or below capacity (noise and stall included): the yardstick
    /// of "slow" (`report::slow`).
    std::chrono::nanoseconds unloaded = service_time;
    /// The call's payload factor (1 without a payload shape): the work hint an honest client would give.
    double work = 1.0;
    /// True if it failed at random (`failure_rate`), not over the hard cap.
    bool random_failure = false;
  };

  /// An upstream with no call inside, at `o.capacity`.
  explicit upstream_model(const options& o) noexcept
      : options_{o}, capacity_{o.capacity}, random_{o.noise_seed}, failures_{o.failure_seed} {}

  /// The service-time rule alone, for `n` calls inside (this one included), without noise or stalls.
  static call_plan plan(std::size_t n, std::size_t capacity, const options& o) noexcept {
    return plan(n, capacity, o, o.base, std::chrono::nanoseconds{0});
  }

  /// A call enters at `now` (from the start of the run); the caller must call `leave()` when it completes.
  call_plan enter(std::chrono::nanoseconds now = {}) noexcept {
    ++inside_;
    peak_ = std::max(peak_, inside_);
    const double factor = draw_factor();
    std::chrono::nanoseconds base = options_.base;
    if (factor != 1.0)
      base = std::chrono::nanoseconds{std::llround(static_cast<double>(base.count()) * factor)};
    std::chrono::nanoseconds wait{0};
    for (const auto& s : options_.stalls)
      if (now >= s.at && now < s.at + s.length) wait = std::max(wait, s.at + s.length - now);
    call_plan p = plan(inside_, capacity_, options_, base, wait);
    p.work = factor;
    if (options_.failure_rate > 0.0 && unit(failures_) < options_.failure_rate && p.ok) {
      p.ok = false;
      p.random_failure = true;
    }
    return p;
  }
  /// A call inside completes (or fails).
  void leave() noexcept { --inside_; }

  /// The capacity becomes `c` (calls served at base latency), for calls entering from now on.
  void set_capacity(std::size_t c) noexcept { capacity_ = c; }
  /// The capacity now.
  std::size_t capacity() const noexcept { return capacity_; }
  /// Calls inside now.
  std::size_t inside() const noexcept { return inside_; }
  /// The most calls inside at once so far.
  std::size_t peak() const noexcept { return peak_; }

 private:
  static call_plan plan(std::size_t n, std::size_t capacity, const options& o, std::chrono::nanoseconds base,
                        std::chrono::nanoseconds wait) noexcept {
    const std::chrono::nanoseconds unloaded = wait + base + o.overhead;
    if (n > o.hard_cap) return {unloaded, false, n, unloaded};
    const std::size_t over = n > capacity ? n - capacity : 0;
    return {wait + base * static_cast<std::int64_t>(1 + over) + o.overhead, true, n, unloaded};
  }

  static double unit(std::uint64_t& state) noexcept {
    return static_cast<double>(detail::splitmix64(state) >> 11) * 0x1.0p-53;
  }

  // The factor of this call's base: 1, the uniform noise, or a draw of the payload shape (mean 1).
  double draw_factor() noexcept {
    switch (options_.payload) {
      case payload_shape::none: return options_.noise > 0.0 ? 1.0 + options_.noise * (2.0 * unit(random_) - 1.0) : 1.0;
      case payload_shape::uniform: return 1.0 + options_.payload_spread * (2.0 * unit(random_) - 1.0);
      case payload_shape::lognormal: {
        // mean 1, CV c: sigma^2 = ln(1 + c^2), mu = -sigma^2 / 2; a normal draw by Box-Muller.
        const double var = std::log1p(options_.payload_spread * options_.payload_spread);
        const double u1 = 1.0 - unit(random_), u2 = unit(random_);
        const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
        return std::exp(std::sqrt(var) * z - var / 2.0);
      }
      case payload_shape::bimodal: return unit(random_) < 0.8 ? 0.5 : 3.0;
    }
    return 1.0;
  }

  options options_;
  std::size_t capacity_;
  std::size_t inside_ = 0;
  std::size_t peak_ = 0;
  std::uint64_t random_;
  std::uint64_t failures_;
};

/// The upstream's capacity becomes `capacity` at `at` (from the start of the run).
struct capacity_change {
  /// When, from the start of the run.
  std::chrono::nanoseconds at;
  /// The new capacity, in calls.
  std::size_t capacity;
};

/// `per_tick` calls arrive every `tick` for `ticks` ticks, the first at `start`.
struct arrival_phase {
  std::chrono::nanoseconds start{0};                             ///< the first arrivals, from the run's start
  std::chrono::nanoseconds tick = std::chrono::milliseconds{1};  ///< between arrivals
  std::size_t ticks = 0;                                         ///< how many ticks
  std::size_t per_tick = 1;                                      ///< calls arriving at each tick

  /// Calls in the phase: ticks x per_tick.
  std::size_t calls() const noexcept { return ticks * per_tick; }
};

/// One more key of a scenario: its own upstream, capacity schedule and workload (see `scenario::more_keys`).
struct upstream_key {
  upstream_model::options upstream{};      ///< the key's upstream
  std::vector<capacity_change> changes{};  ///< its capacity schedule
  std::vector<arrival_phase> arrivals{};   ///< its workload

  /// Calls of all its phases.
  std::size_t calls() const noexcept {
    std::size_t n = 0;
    for (const auto& a : arrivals) n += a.calls();
    return n;
  }
};

/// One run of the experiment: the upstream, its capacity schedule and the workload.
///
/// Key 0 is described by the scenario's own fields (`upstream`, `changes`, the regular arrivals `tick`,
/// `ticks`, `per_tick` and the extra `bursts`); `more_keys` adds keys with their own upstream, each behind its
/// own limiter, and `global_limit` caps the calls in flight over all keys together (a semaphore shared by
/// the keys; no key waits behind another key's full limit).
struct scenario {
  /// The scenario's name in tables ("A", "B").
  std::string name = "A";
  /// One line saying what happens.
  std::string description = "capacity 16, dropping to 4 at 250 ms";
  /// The upstream at the start of the run.
  upstream_model::options upstream{};
  /// Applied in order; changes at the same instant apply in the order listed.
  std::vector<capacity_change> changes{{std::chrono::milliseconds{250}, 4}};
  std::chrono::nanoseconds tick = std::chrono::milliseconds{1};  ///< arrivals every tick, starting at 0
  std::size_t ticks = 500;              ///< number of ticks with arrivals
  std::size_t per_tick = 2;             ///< calls arriving at each tick
  /// Arrivals of key 0 on top of the regular ones (spikes of demand).
  std::vector<arrival_phase> bursts{};
  /// Keys 1, 2, ...; empty for a single upstream.
  std::vector<upstream_key> more_keys{};
  /// Calls in flight over all keys at once; 0: no global limit.
  std::size_t global_limit = 0;
  /// The interval of report::timeline.
  std::chrono::nanoseconds timeline_step = std::chrono::milliseconds{25};
  /// Each sample carries its call's payload factor as a work hint (`sample::work`), as a client that knows
  /// the size of each answer (an LLM's output tokens) would report it.
  bool work_hints = false;

  /// Keys in the run: 1 plus more_keys.
  std::size_t keys() const noexcept { return 1 + more_keys.size(); }

  /// Key `k` as an `upstream_key` (key 0 gathered from the scenario's own fields).
  upstream_key key(std::size_t k) const {
    if (k > 0) return more_keys[k - 1];
    upstream_key out{upstream, changes, {arrival_phase{std::chrono::nanoseconds{0}, tick, ticks, per_tick}}};
    out.arrivals.insert(out.arrivals.end(), bursts.begin(), bursts.end());
    return out;
  }

  /// Calls over all keys.
  std::size_t calls() const noexcept {
    std::size_t n = ticks * per_tick;
    for (const auto& b : bursts) n += b.calls();
    for (const auto& k : more_keys) n += k.calls();
    return n;
  }

  /// The true capacity of key 0 at `t`, after every change at or before `t`.
  std::size_t capacity_at(std::chrono::nanoseconds t) const noexcept {
    std::size_t c = upstream.capacity;
    for (const auto& change : changes)
      if (change.at <= t) c = change.capacity;
    return c;
  }

  /// The experiment's first scenario: capacity 16 dropping to 4 at 0.25 s; 2 calls every 1 ms for 0.5 s.
  static scenario a() { return scenario{}; }

  /// Scenario A, with the capacity back to 16 at 0.6 s: does the limiter find the capacity again?
  static scenario b() {
    scenario s;
    s.name = "B";
    s.description = "capacity 16, dropping to 4 at 250 ms, back to 16 at 600 ms";
    s.changes.push_back({std::chrono::milliseconds{600}, 16});
    return s;
  }
};

/// One call of a run, times from the start of the run.
struct call_record {
  std::chrono::nanoseconds arrived{};   ///< asked the limiter for a slot
  std::chrono::nanoseconds started{};   ///< granted a slot and entered the upstream
  std::chrono::nanoseconds finished{};  ///< completed (or failed)
  /// Whether it succeeded.
  bool ok = false;
  std::size_t key = 0;                  ///< which upstream it called
  /// What it would have taken at or below capacity (`upstream_model::call_plan::unloaded`).
  std::chrono::nanoseconds unloaded{};
  /// It failed at random (`upstream_model::options::failure_rate`), whatever the load.
  bool random_failure = false;
};

/// The limit in force at `at`, next to the true capacity.
struct timeline_point {
  /// When, from the start of the run.
  std::chrono::nanoseconds at{};
  /// The strategy's limit then.
  double limit = 0.0;
  /// The upstream's true capacity then.
  std::size_t capacity = 0;
};

/// What one strategy did in one scenario.
struct report {
  /// The strategy's name ("fixed", "aimd", "tuned_aimd", "gradient", "oracle").
  std::string strategy;
  /// The scenario's name.
  std::string scenario;
  std::size_t completed = 0;  ///< calls that succeeded
  std::size_t failed = 0;     ///< calls the upstream failed (over its hard cap, or at random)
  std::size_t failed_at_random = 0;  ///< of those, the ones that failed at random, whatever the load
  /// Service time (grant to completion, failures included), nearest-rank percentiles.
  std::chrono::nanoseconds p50{}, p95{}, p99{}, max{};
  /// @var p95
  /// Service time, 95th percentile (nearest rank).
  /// @var p99
  /// Service time, 99th percentile (nearest rank).
  /// @var max
  /// The longest service time.
  std::size_t slower_than_10ms = 0;       ///< calls whose service time exceeded 10 ms
  /// Calls slower than twice their unloaded service time (more than one call over capacity in this model:
  /// queueing inside the upstream), failures included. With no noise or stall: slower than 2 x base.
  std::size_t slow = 0;
  std::chrono::nanoseconds makespan{};    ///< when the last call finished
  std::chrono::nanoseconds e2e_p95{};     ///< arrival to completion (queueing at the client included)
  /// The strategy's limit when the run ended.
  double final_limit = 0.0;
  /// The strategy's highest limit during the run.
  double max_limit = 0.0;
  /// How many samples lowered the limit.
  std::uint64_t decreases = 0;
  std::size_t peak_inside = 0;            ///< most calls inside the upstream at once
  /// The lowest limit any decrease left, as a fraction of its key's capacity at that instant (infinity
  /// without decreases): how deep the cuts went.
  double lowest_cut = std::numeric_limits<double>::infinity();
  std::vector<timeline_point> timeline;   ///< every scenario::timeline_step from 0 to the makespan
};

/// Nearest-rank percentile (`percent` in [1, 100]) of an ascending sequence. Precondition: not empty.
inline std::chrono::nanoseconds nearest_rank(std::span<const std::chrono::nanoseconds> sorted, unsigned percent) {
  const std::size_t rank = (percent * sorted.size() + 99) / 100;
  return sorted[(rank > 0 ? rank : 1) - 1];
}

/// Fills the call statistics of `r` from the calls of one run. Precondition: `calls` is not empty.
inline void summarise_calls(report& r, std::span<const call_record> calls) {
  std::vector<std::chrono::nanoseconds> service, e2e;
  service.reserve(calls.size());
  e2e.reserve(calls.size());
  r.completed = r.failed = r.failed_at_random = r.slower_than_10ms = r.slow = 0;
  r.makespan = {};
  for (const auto& c : calls) {
    service.push_back(c.finished - c.started);
    e2e.push_back(c.finished - c.arrived);
    (c.ok ? r.completed : r.failed) += 1;
    if (c.random_failure) ++r.failed_at_random;
    if (service.back() > std::chrono::milliseconds{10}) ++r.slower_than_10ms;
    if ((!c.ok && !c.random_failure) || service.back() > 2 * c.unloaded) ++r.slow;
    r.makespan = std::max(r.makespan, c.finished);
  }
  std::sort(service.begin(), service.end());
  std::sort(e2e.begin(), e2e.end());
  r.p50 = nearest_rank(service, 50);
  r.p95 = nearest_rank(service, 95);
  r.p99 = nearest_rank(service, 99);
  r.max = service.back();
  r.e2e_p95 = nearest_rank(e2e, 95);
}

// ---------------------------------------------------------------------------------------------------------
// Strategies that are not algorithms
// ---------------------------------------------------------------------------------------------------------

/// A fixed limit: what a semaphore does. Learns nothing.
class fixed_limit {
 public:
  /// The clock of the samples it is given.
  using clock_type = std::chrono::steady_clock;
  /// What one completed call reports: `sample<Clock>`.
  using sample_type = algo::basic_sample<clock_type>;

  /// A limit of `limit` calls, forever.
  explicit fixed_limit(double limit) noexcept : limit_{limit} {}
  /// The current limit, in calls (fractional; a call is admitted while in flight < floor(limit)).
  double limit() const noexcept { return limit_; }
  /// How many samples strictly lowered the limit so far.
  std::uint64_t decreases() const noexcept { return 0; }
  /// Ignores the sample: the limit never moves.
  void on_sample(const sample_type&) noexcept {}

 private:
  double limit_;
};

/// The limit equals the true capacity at every instant: it is told of every change (`on_capacity`). The best
/// any limiter could do; no real one can, since it has to learn the change from completions.
class oracle_limit {
 public:
  /// The clock of the samples it is given.
  using clock_type = std::chrono::steady_clock;
  /// What one completed call reports: `sample<Clock>`.
  using sample_type = algo::basic_sample<clock_type>;

  /// Starts at `capacity`, the upstream's initial capacity.
  explicit oracle_limit(std::size_t capacity) noexcept : limit_{static_cast<double>(capacity)} {}
  /// The current limit, in calls (fractional; a call is admitted while in flight < floor(limit)).
  double limit() const noexcept { return limit_; }
  /// How many samples strictly lowered the limit so far.
  std::uint64_t decreases() const noexcept { return decreases_; }
  /// Ignores the sample: only capacity changes move the limit.
  void on_sample(const sample_type&) noexcept {}
  /// The upstream's capacity became `capacity`: so does the limit.
  void on_capacity(std::size_t capacity) noexcept {
    const auto next = static_cast<double>(capacity);
    if (next < limit_) ++decreases_;
    limit_ = next;
  }

 private:
  double limit_;
  std::uint64_t decreases_ = 0;
};

// ---------------------------------------------------------------------------------------------------------
// The simulation
// ---------------------------------------------------------------------------------------------------------

/// What the simulation needs of a strategy.
template <class S>
concept simulated_strategy = requires(S& s, const S& cs, const typename S::sample_type& sample) {
  { cs.limit() } -> std::convertible_to<double>;
  { cs.decreases() } -> std::convertible_to<std::uint64_t>;
  s.on_sample(sample);
};

namespace detail {

enum class event_kind : int { capacity = 0, completion = 1, arrival = 2 };  // order among equal times

struct event {
  std::chrono::nanoseconds at;
  event_kind kind;
  std::uint64_t seq;    // scheduling order: breaks the remaining ties
  std::size_t subject;  // call id, or the new capacity

  friend bool operator>(const event& a, const event& b) noexcept {
    if (a.at != b.at) return a.at > b.at;
    if (a.kind != b.kind) return a.kind > b.kind;
    return a.seq > b.seq;
  }
};

template <class Strategy>
class simulation {
 public:
  using sample_type = typename Strategy::sample_type;
  using time_point = typename sample_type::time_point;

  simulation(std::span<Strategy* const> strategies, const scenario& sc)
      : strategies_{strategies.begin(), strategies.end()}, scenario_{sc}, calls_(sc.calls()),
        granted_in_flight_(sc.calls()), work_(sc.calls(), 1.0) {
    if (strategies_.size() != sc.keys())
      throw std::invalid_argument("rein::testing::simulate: one strategy per key of the scenario is needed");
    for (std::size_t k = 0; k < sc.keys(); ++k) {
      keys_.emplace_back(sc.key(k));
    }
  }

  report run() {
    schedule_workload();
    max_limit_ = limit(0);
    while (!events_.empty()) {
      const event e = events_.top();
      events_.pop();
      record_timeline_before(e.at);
      dispatch(e);
      max_limit_ = std::max(max_limit_, limit(0));
    }
    return finish();
  }

 private:
  struct key_state {
    explicit key_state(upstream_key s) : spec{std::move(s)}, model{spec.upstream} {}
    upstream_key spec;
    upstream_model model;
    std::deque<std::size_t> waiting{};
    std::size_t in_flight = 0;
    upstream_model& upstream() { return model; }
    const upstream_model& upstream() const { return model; }
  };

  double limit(std::size_t k) const { return static_cast<double>(strategies_[k]->limit()); }

  void push(std::chrono::nanoseconds at, event_kind kind, std::size_t subject) {
    events_.push(event{at, kind, next_seq_++, subject});
  }

  void schedule_workload() {
    std::size_t id = 0;
    for (std::size_t k = 0; k < keys_.size(); ++k)
      for (const auto& phase : keys_[k].spec.arrivals)
        for (std::size_t t = 0; t < phase.ticks; ++t)
          for (std::size_t i = 0; i < phase.per_tick; ++i, ++id) {
            calls_[id].arrived = phase.start + phase.tick * static_cast<std::int64_t>(t);
            calls_[id].key = k;
            push(calls_[id].arrived, event_kind::arrival, id);
          }
    for (std::size_t k = 0; k < keys_.size(); ++k)
      for (const auto& change : keys_[k].spec.changes) {
        push(change.at, event_kind::capacity, changes_.size());
        changes_.push_back({k, change.capacity});
      }
  }

  void dispatch(const event& e) {
    switch (e.kind) {
      case event_kind::arrival: arrive(e.subject, e.at); break;
      case event_kind::completion: complete(e.subject, e.at); break;
      case event_kind::capacity: change_capacity(changes_[e.subject].first, changes_[e.subject].second, e.at); break;
    }
  }

  bool room(std::size_t k) const {
    if (scenario_.global_limit != 0 && in_flight_ >= scenario_.global_limit) return false;
    return keys_[k].in_flight < algo::admitted(limit(k));
  }

  void arrive(std::size_t id, std::chrono::nanoseconds now) {
    const std::size_t k = calls_[id].key;
    if (keys_[k].waiting.empty() && room(k))
      begin(id, now);
    else
      keys_[k].waiting.push_back(id);
  }

  void begin(std::size_t id, std::chrono::nanoseconds now) {
    key_state& key = keys_[calls_[id].key];
    ++in_flight_;
    ++key.in_flight;
    const auto plan = key.upstream().enter(now);
    calls_[id].started = now;
    calls_[id].ok = plan.ok;
    calls_[id].unloaded = plan.unloaded;
    calls_[id].random_failure = plan.random_failure;
    work_[id] = plan.work;
    granted_in_flight_[id] = key.in_flight;
    push(now + plan.service_time, event_kind::completion, id);
  }

  void complete(std::size_t id, std::chrono::nanoseconds now) {
    auto& c = calls_[id];
    key_state& key = keys_[c.key];
    key.upstream().leave();
    c.finished = now;
    sample_type s;
    s.latency = now - c.started;
    s.result = c.ok ? outcome::success : outcome::congestion;
    s.in_flight = granted_in_flight_[id];
    s.now = time_point{} + std::chrono::duration_cast<typename time_point::duration>(now);
    if constexpr (requires { s.work = 1.0; })
      if (scenario_.work_hints) s.work = work_[id];
    const double before = limit(c.key);
    strategies_[c.key]->on_sample(s);  // report, then release, as adaptive_limiter does
    if (const double after = limit(c.key); after < before)
      lowest_cut_ = std::min(lowest_cut_, after / static_cast<double>(key.upstream().capacity()));
    --key.in_flight;
    --in_flight_;
    drain(now);
  }

  void change_capacity(std::size_t k, std::size_t capacity, std::chrono::nanoseconds now) {
    keys_[k].upstream().set_capacity(capacity);
    if constexpr (requires { strategies_[k]->on_capacity(capacity); }) strategies_[k]->on_capacity(capacity);
    drain(now);
  }

  // FIFO within a key; across keys, the head that arrived first among those whose key has room.
  void drain(std::chrono::nanoseconds now) {
    for (;;) {
      std::size_t best = keys_.size();
      for (std::size_t k = 0; k < keys_.size(); ++k) {
        if (keys_[k].waiting.empty() || !room(k)) continue;
        if (best == keys_.size() || calls_[keys_[k].waiting.front()].arrived < calls_[keys_[best].waiting.front()].arrived)
          best = k;
      }
      if (best == keys_.size()) return;
      const std::size_t id = keys_[best].waiting.front();
      keys_[best].waiting.pop_front();
      begin(id, now);
    }
  }

  // Each point shows key 0 after every event at or before its instant.
  void record_timeline_before(std::chrono::nanoseconds t) {
    while (next_point_ < t) {
      timeline_.push_back({next_point_, limit(0), keys_[0].upstream().capacity()});
      next_point_ += scenario_.timeline_step;
    }
  }

  report finish() {
    report r;
    r.scenario = scenario_.name;
    summarise_calls(r, calls_);
    record_timeline_before(r.makespan + std::chrono::nanoseconds{1});
    r.timeline = std::move(timeline_);
    r.final_limit = limit(0);
    r.max_limit = max_limit_;
    r.decreases = 0;
    r.peak_inside = 0;
    for (std::size_t k = 0; k < keys_.size(); ++k) {
      r.decreases += static_cast<std::uint64_t>(strategies_[k]->decreases());
      r.peak_inside = std::max(r.peak_inside, keys_[k].upstream().peak());
    }
    r.lowest_cut = lowest_cut_;
    return r;
  }

  std::vector<Strategy*> strategies_;
  const scenario& scenario_;
  std::vector<key_state> keys_;
  std::vector<std::pair<std::size_t, std::size_t>> changes_;  // key, capacity
  std::vector<call_record> calls_;
  std::vector<std::size_t> granted_in_flight_;
  std::vector<double> work_;  // each call's payload factor, its work hint
  std::priority_queue<event, std::vector<event>, std::greater<>> events_;
  std::uint64_t next_seq_ = 0;
  std::size_t in_flight_ = 0;
  double max_limit_ = 0.0;
  double lowest_cut_ = std::numeric_limits<double>::infinity();
  std::chrono::nanoseconds next_point_{0};
  std::vector<timeline_point> timeline_;
};

}  // namespace detail

/// Runs `sc` with `strategy` deciding admission, until every call has finished.
///
/// The strategy sees one sample per call, in completion order: latency from grant to completion, `success`
/// or `congestion` (a failure past the hard cap), `in_flight` as it was right after the call's grant (this
/// call included), and `now` as `time_point{}` plus the virtual time. A strategy with `on_capacity(size_t)`
/// is also told every capacity change (the oracle).
template <simulated_strategy Strategy>
report simulate(std::string strategy_name, Strategy& strategy, const scenario& sc) {
  Strategy* const one[] = {&strategy};
  report r = detail::simulation<Strategy>{one, sc}.run();
  r.strategy = std::move(strategy_name);
  return r;
}

/// Runs a scenario of several keys, `strategies[k]` deciding admission for key `k` (one per key, see
/// `scenario::keys()`), until every call has finished. Figures are over all keys; the timeline, the final
/// and the maximum limit are key 0's.
/// @throws std::invalid_argument if there is not exactly one strategy per key.
template <simulated_strategy Strategy>
report simulate(std::string strategy_name, std::span<Strategy> strategies, const scenario& sc) {
  std::vector<Strategy*> pointers;
  for (auto& s : strategies) pointers.push_back(&s);
  report r = detail::simulation<Strategy>{pointers, sc}.run();
  r.strategy = std::move(strategy_name);
  return r;
}

// ---------------------------------------------------------------------------------------------------------
// The experiment's strategies
// ---------------------------------------------------------------------------------------------------------

/// The fixed limit of the experiment: a semaphore of 16.
inline constexpr double experiment_fixed_limit = 16.0;

/// The textbook AIMD limiter of the experiment: from 16, floor 1, ceiling 64, 20 ms target, x0.75, a cut on
/// every congested call (every failure one), no growth guard and no wait below a level found again.
inline algo::aimd_options experiment_aimd_options() {
  algo::aimd_options o;
  o.initial_limit = 16.0;
  o.latency_target = std::chrono::milliseconds{20};
  o.latency_tolerance.reset();
  o.backoff = 0.75;
  o.min_utilisation = 0.0;
  o.once_per_round_trip = false;
  o.plateau_rounds = 0.0;
  o.learn_failure_rate = false;
  return o;
}

/// rein's default tuned AIMD (from 4: it knows nothing about the upstream, and slow start finds 16).
inline algo::tuned_aimd_options experiment_tuned_aimd_options() { return algo::tuned_aimd_options{}; }

/// rein's default gradient limit (from 4).
inline algo::gradient_options experiment_gradient_options() { return algo::gradient_options{}; }

/// The five strategies of the experiment on one scenario: fixed(16), aimd, tuned_aimd, gradient, oracle.
inline std::vector<report> run_experiment(const scenario& sc) {
  std::vector<report> out;
  fixed_limit fixed{experiment_fixed_limit};
  out.push_back(simulate("fixed(16)", fixed, sc));
  algo::aimd aimd{experiment_aimd_options()};
  out.push_back(simulate("aimd", aimd, sc));
  algo::tuned_aimd tuned{experiment_tuned_aimd_options()};
  out.push_back(simulate("tuned_aimd", tuned, sc));
  algo::gradient gradient{experiment_gradient_options()};
  out.push_back(simulate("gradient", gradient, sc));
  oracle_limit oracle{sc.upstream.capacity};
  out.push_back(simulate("oracle", oracle, sc));
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// Printing
// ---------------------------------------------------------------------------------------------------------

namespace detail {

/// Milliseconds, with three decimals only when they are not zero ("65", "21.04").
inline std::string format_ms(std::chrono::nanoseconds d) {
  char buf[32];
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
  if (us % 1000 == 0)
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(us / 1000));
  else
    std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(us) / 1000.0);
  return buf;
}

inline std::string format_limit(double limit) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", limit);
  return buf;
}

inline std::string pad_left(std::string s, std::size_t width) {
  if (s.size() < width) s.insert(0, width - s.size(), ' ');
  return s;
}

inline std::string pad_right(std::string s, std::size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

}  // namespace detail

/// Prints one row per report, with a header: completed, failed, p50/p95/p99 service time, calls slower than
/// 10 ms, makespan, final limit, decreases.
inline void print_table(std::ostream& os, std::span<const report> reports) {
  using detail::pad_left;
  static constexpr std::string_view header[] = {"completed", "failed", "p50 ms",      "p95 ms",   "p99 ms",
                                                ">10 ms",    "makespan ms", "final limit", "decreases"};
  std::size_t name_width = 8;
  for (const auto& r : reports) name_width = std::max(name_width, r.strategy.size());
  os << detail::pad_right("strategy", name_width);
  for (auto h : header) os << "  " << pad_left(std::string{h}, h.size() < 7 ? 7 : h.size());
  os << '\n';
  for (const auto& r : reports) {
    const std::string cells[] = {std::to_string(r.completed), std::to_string(r.failed), detail::format_ms(r.p50),
                                 detail::format_ms(r.p95),     detail::format_ms(r.p99),
                                 std::to_string(r.slower_than_10ms), detail::format_ms(r.makespan),
                                 detail::format_limit(r.final_limit), std::to_string(r.decreases)};
    os << detail::pad_right(r.strategy, name_width);
    for (std::size_t i = 0; i < std::size(cells); ++i)
      os << "  " << pad_left(cells[i], header[i].size() < 7 ? 7 : header[i].size());
    os << '\n';
  }
}

/// A terminal chart of the limit ('#', one per admitted call) against the true capacity ('|' after the
/// capacity-th column), one line per timeline point.
inline void print_timeline(std::ostream& os, const report& r) {
  os << r.strategy << ": limit (#) vs capacity (|)\n";
  for (const auto& p : r.timeline) {
    const std::size_t admitted = algo::admitted(p.limit);
    std::string bar;
    for (std::size_t i = 0; i < std::max(admitted, p.capacity); ++i) {
      bar += i < admitted ? '#' : ' ';
      if (i + 1 == p.capacity) bar += '|';
    }
    os << detail::pad_left(detail::format_ms(p.at), 6) << " ms " << detail::pad_left(detail::format_limit(p.limit), 6)
       << ' ' << detail::pad_left(std::to_string(p.capacity), 3) << "  " << bar << '\n';
  }
}

/// The timelines as CSV, one row per point: strategy,scenario,t_ms,limit,capacity.
inline void print_timeline_csv(std::ostream& os, std::span<const report> reports) {
  os << "strategy,scenario,t_ms,limit,capacity\n";
  for (const auto& r : reports)
    for (const auto& p : r.timeline)
      os << r.strategy << ',' << r.scenario << ',' << detail::format_ms(p.at) << ',' << detail::format_limit(p.limit)
         << ',' << p.capacity << '\n';
}

}  // namespace rein::testing
