// A family of generated upstreams for the exact simulation (rein/testing/upstream_sim.hpp), and a runner that
// scores any limit algorithm on it against an oracle that knows the capacity.
//
// One scenario is a pure function of its seed: random capacities, base latencies and hard caps; drops,
// recoveries and slow drifts of the capacity; short spikes of arrivals; latency noise and stalls; and
// sometimes several keys (each with its own upstream and its own limiter) behind one global limit. A limit
// chosen on one scenario can look perfect there and fail on the next; chosen on the family's worst case, it
// has to work on upstreams nobody tuned it for.
#pragma once

#include <rein/testing/upstream_sim.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace rein::testing {

namespace detail {

/// Draws of the generator, from splitmix64.
class family_random {
 public:
  explicit family_random(std::uint64_t seed) noexcept : state_{seed} {}

  std::uint64_t next() noexcept { return splitmix64(state_); }
  /// Uniform in [lo, hi).
  double uniform(double lo, double hi) noexcept { return lo + (hi - lo) * static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Uniform in [lo, hi].
  std::size_t between(std::size_t lo, std::size_t hi) noexcept { return lo + static_cast<std::size_t>(next() % (hi - lo + 1)); }
  bool chance(double p) noexcept { return uniform(0.0, 1.0) < p; }

 private:
  std::uint64_t state_;
};

inline std::size_t at_least_one(double v) noexcept { return v < 1.0 ? 1 : static_cast<std::size_t>(std::lround(v)); }

inline std::chrono::nanoseconds scaled(std::chrono::nanoseconds d, double f) noexcept {
  return std::chrono::nanoseconds{static_cast<std::int64_t>(static_cast<double>(d.count()) * f)};
}

/// One key of a generated scenario; appends what happens to `what`.
inline upstream_key generate_key(family_random& random, std::string& what) {
  upstream_key key;
  auto& up = key.upstream;
  up.base = std::chrono::microseconds{random.between(1000, 20000)};
  up.capacity = random.between(2, 40);
  // 40 to 100 round trips' worth of calls at the first capacity: long enough that a run is not only its start.
  const std::size_t calls = std::max<std::size_t>(200, up.capacity * random.between(40, 100));
  const double load = random.uniform(0.6, 1.5);  // demand over what the first capacity serves at base latency
  const auto tick = std::chrono::nanoseconds{
      static_cast<std::int64_t>(static_cast<double>(up.base.count()) / (load * static_cast<double>(up.capacity)))};
  key.arrivals.push_back({std::chrono::nanoseconds{0}, tick, calls, 1});
  const auto span = tick * static_cast<std::int64_t>(calls);  // how long arrivals last
  char buf[160];
  std::snprintf(buf, sizeof buf, "capacity %zu, base %.1f ms, load %.2f, %zu calls", up.capacity,
                static_cast<double>(up.base.count()) / 1e6, load, calls);
  what += buf;

  std::size_t highest = up.capacity;
  const double shape = random.uniform(0.0, 1.0);
  if (shape < 0.6) {  // a drop, often followed by a recovery
    const auto at = scaled(span, random.uniform(0.2, 0.5));
    const std::size_t low = at_least_one(static_cast<double>(up.capacity) * random.uniform(0.15, 0.6));
    key.changes.push_back({at, low});
    std::snprintf(buf, sizeof buf, "; drop to %zu at %.0f ms", low, static_cast<double>(at.count()) / 1e6);
    what += buf;
    if (random.chance(0.6)) {
      const auto back = at + scaled(span, random.uniform(0.15, 0.35));
      const std::size_t recovered = at_least_one(static_cast<double>(up.capacity) * random.uniform(0.8, 1.2));
      key.changes.push_back({back, recovered});
      highest = std::max(highest, recovered);
      std::snprintf(buf, sizeof buf, ", back to %zu at %.0f ms", recovered, static_cast<double>(back.count()) / 1e6);
      what += buf;
    }
  } else if (shape < 0.85) {  // a slow drift, one call at a time
    const std::size_t to = at_least_one(static_cast<double>(up.capacity) * random.uniform(0.5, 1.5));
    const auto from_t = scaled(span, 0.2), to_t = scaled(span, 0.8);
    const std::size_t steps = to > up.capacity ? to - up.capacity : up.capacity - to;
    for (std::size_t i = 1; i <= steps; ++i) {
      const std::size_t c = to > up.capacity ? up.capacity + i : up.capacity - i;
      key.changes.push_back({from_t + (to_t - from_t) * static_cast<std::int64_t>(i) / static_cast<std::int64_t>(steps), c});
    }
    highest = std::max(highest, to);
    std::snprintf(buf, sizeof buf, "; drift to %zu", to);
    what += buf;
  }
  if (random.chance(0.4)) {  // a short spike: several times the demand for a few base latencies
    const double factor = random.uniform(3.0, 8.0);
    const auto at = scaled(span, random.uniform(0.1, 0.9));
    const auto spike_tick = scaled(tick, 1.0 / factor);
    const std::size_t n = at_least_one(static_cast<double>(up.base.count() * 3) / static_cast<double>(spike_tick.count()));
    key.arrivals.push_back({at, spike_tick > std::chrono::nanoseconds{0} ? spike_tick : std::chrono::nanoseconds{1}, n, 1});
    std::snprintf(buf, sizeof buf, "; spike of %zu calls at %.0f ms", n, static_cast<double>(at.count()) / 1e6);
    what += buf;
  }
  if (random.chance(0.5)) {
    up.noise = random.uniform(0.05, 0.2);
    up.noise_seed = random.next();
    std::snprintf(buf, sizeof buf, "; noise %.0f%%", up.noise * 100);
    what += buf;
  }
  if (random.chance(0.3)) {
    const std::size_t n = random.between(1, 2);
    for (std::size_t i = 0; i < n; ++i)
      up.stalls.push_back({scaled(span, random.uniform(0.1, 0.9)), scaled(up.base, random.uniform(2.0, 6.0))});
    std::snprintf(buf, sizeof buf, "; %zu stall%s", n, n > 1 ? "s" : "");
    what += buf;
  }
  up.hard_cap = std::max(highest + 2, static_cast<std::size_t>(std::ceil(static_cast<double>(highest) * random.uniform(1.2, 2.0))));
  return key;
}

}  // namespace detail

/// The scenario of seed `seed`: one key (70 %) or two to three, each an upstream of the model with capacity
/// 2-40, base latency 1-20 ms, a hard cap 1.2-2x its highest capacity (at least 2 above it), 40-100
/// round trips' worth of calls at the first capacity (at least 200) arriving at 0.6-1.5x what it serves; then a drop to 15-60 % (60 %, followed by a recovery to 80-120 %
/// of the first capacity in 60 % of those) or a drift to 50-150 % one call at a time (25 %); a spike of 3-8x
/// the demand for three base latencies (40 %); latency noise of +-5-20 % (50 %); one or two stalls of 2-6 base
/// latencies (30 %). With several keys, half the scenarios add a global limit of 60-100 % of the sum of the
/// first capacities. The same seed gives the same scenario everywhere.
inline scenario generate_scenario(std::uint64_t seed) {
  detail::family_random random{seed};
  scenario sc;
  sc.name = "seed " + std::to_string(seed);
  sc.description.clear();
  const std::size_t keys = random.chance(0.7) ? 1 : random.between(2, 3);
  std::vector<upstream_key> all;
  std::size_t capacity_sum = 0;
  for (std::size_t k = 0; k < keys; ++k) {
    if (k > 0) sc.description += " | ";
    all.push_back(detail::generate_key(random, sc.description));
    capacity_sum += all.back().upstream.capacity;
  }
  if (keys > 1 && random.chance(0.5)) {
    sc.global_limit = detail::at_least_one(static_cast<double>(capacity_sum) * random.uniform(0.6, 1.0));
    sc.description += " | global limit " + std::to_string(sc.global_limit);
  }
  sc.upstream = all[0].upstream;
  sc.changes = all[0].changes;
  sc.tick = all[0].arrivals[0].tick;
  sc.ticks = all[0].arrivals[0].ticks;
  sc.per_tick = all[0].arrivals[0].per_tick;
  sc.bursts.assign(all[0].arrivals.begin() + 1, all[0].arrivals.end());
  sc.more_keys.assign(all.begin() + 1, all.end());
  sc.timeline_step = sc.upstream.base * 5;
  return sc;
}

/// An upstream of fixed capacity whose latency is only noisy: capacity 2-40, base 1-20 ms, noise +-`noise`,
/// demand 1.2-2x the capacity (so a limiter sits at the capacity and hears every jitter), 80 round trips'
/// worth of calls. A
/// limit that takes jitter for congestion cuts deep here; `report::lowest_cut` says how deep.
inline scenario generate_noise_scenario(std::uint64_t seed, double noise = 0.2) {
  detail::family_random random{seed};
  scenario sc;
  sc.name = "noise seed " + std::to_string(seed);
  sc.upstream.base = std::chrono::microseconds{random.between(1000, 20000)};
  sc.upstream.capacity = random.between(2, 40);
  sc.upstream.hard_cap = sc.upstream.capacity * 2 + 2;
  sc.upstream.noise = noise;
  sc.upstream.noise_seed = random.next();
  sc.changes.clear();
  const double load = random.uniform(1.2, 2.0);
  sc.tick = std::chrono::nanoseconds{static_cast<std::int64_t>(static_cast<double>(sc.upstream.base.count()) /
                                                               (load * static_cast<double>(sc.upstream.capacity)))};
  sc.ticks = sc.upstream.capacity * 80;  // 80 round trips' worth
  sc.per_tick = 1;
  sc.timeline_step = sc.upstream.base * 5;
  char buf[120];
  std::snprintf(buf, sizeof buf, "capacity %zu, base %.1f ms, load %.2f, noise %.0f%%", sc.upstream.capacity,
                static_cast<double>(sc.upstream.base.count()) / 1e6, load, noise * 100);
  sc.description = buf;
  return sc;
}

/// One shape of the world beyond today's family: how each call's service time follows its payload, and how
/// often calls fail whatever the load. Real upstreams (LLM and other metered APIs) have both.
struct world_shape {
  std::string name;                                  ///< for tables ("lognormal cv 1")
  payload_shape payload = payload_shape::none;       ///< how each call's base is drawn
  double spread = 0.0;                               ///< the payload's spread (see `payload_shape`)
  double noise = 0.0;                                ///< uniform noise when `payload` is none
  double failure_rate = 0.0;                         ///< calls that fail at random, whatever the load
};

/// The shapes of the grown family: payload noise (uniform +-40 % and +-60 %, lognormal with a coefficient of
/// variation of 0.5 and 1, bimodal short/long), random failures (1 % and 5 %, on +-10 % noise), and both at
/// once (lognormal cv 1 with 5 % failures).
inline std::vector<world_shape> world_shapes() {
  return {
      {"uniform 40%", payload_shape::uniform, 0.4, 0.0, 0.0},
      {"uniform 60%", payload_shape::uniform, 0.6, 0.0, 0.0},
      {"lognormal cv 0.5", payload_shape::lognormal, 0.5, 0.0, 0.0},
      {"lognormal cv 1", payload_shape::lognormal, 1.0, 0.0, 0.0},
      {"bimodal", payload_shape::bimodal, 0.0, 0.0, 0.0},
      {"failures 1%", payload_shape::none, 0.0, 0.1, 0.01},
      {"failures 5%", payload_shape::none, 0.0, 0.1, 0.05},
      {"lognormal cv 1 + failures 5%", payload_shape::lognormal, 1.0, 0.0, 0.05},
  };
}

/// An upstream of fixed capacity with the world's `shape`: capacity 2-40, base (the mean service time) 1-20
/// ms, demand 1.2-2x the capacity (so a limiter sits at the capacity and hears every draw), 80 round trips'
/// worth of calls, a hard cap of 2 x capacity + 2. The oracle is a fixed limit at the capacity; a limiter
/// that reads payload noise as a queue, or random failures as congestion, sits far below it.
/// With `work_hints`, each sample carries its call's payload factor (`scenario::work_hints`).
inline scenario generate_shaped_scenario(std::uint64_t seed, const world_shape& shape, bool work_hints = false) {
  scenario sc = generate_noise_scenario(seed, shape.noise);
  sc.name = shape.name + " seed " + std::to_string(seed);
  sc.upstream.payload = shape.payload;
  sc.upstream.payload_spread = shape.spread;
  sc.upstream.failure_rate = shape.failure_rate;
  sc.upstream.failure_seed = sc.upstream.noise_seed ^ 0x5bd1e995u;
  sc.work_hints = work_hints;
  sc.description += "; " + shape.name;
  return sc;
}

/// What a limiter is measured against on one scenario.
struct yardsticks {
  /// The oracle's makespan: a limit equal to each key's true capacity at every instant.
  std::chrono::nanoseconds oracle_makespan{};
  /// Scenarios in which some key's capacity ends higher than it was before its last change (a recovery, or a
  /// drift upwards): the makespan of a fixed limit at each key's final capacity, from the start.
  std::optional<std::chrono::nanoseconds> fixed_makespan{};
};

/// A limit that is told each capacity change of its key (`oracle_limit`) or never moves (`fixed_limit`),
/// behind one type so that one simulation runs every key.
class yardstick_limit {
 public:
  using clock_type = std::chrono::steady_clock;       ///< only names the samples' time_point
  using sample_type = algo::basic_sample<clock_type>;  ///< what the simulation reports
  /// A limit of `limit` calls; `follows`: set to each new capacity of its key (the oracle).
  yardstick_limit(std::size_t limit, bool follows) noexcept : limit_{static_cast<double>(limit)}, follows_{follows} {}
  /// The limit, in calls.
  double limit() const noexcept { return limit_; }
  /// Never cuts: 0.
  std::uint64_t decreases() const noexcept { return 0; }
  /// Ignores samples.
  void on_sample(const sample_type&) noexcept {}
  /// The key's capacity changed to `c`: the oracle follows it, a fixed limit does not.
  void on_capacity(std::size_t c) noexcept {
    if (follows_) limit_ = static_cast<double>(c);
  }

 private:
  double limit_;
  bool follows_;
};

/// The best a rule could do from the same start as the algorithms without being told the capacity: the
/// unavoidable cost of not knowing it, which no rule that starts at `initial` can avoid on this family.
///
/// Idealised, and deliberately optimistic. Until it first sees a call served over capacity, it knows only
/// what its calls have shown exactly (a call granted with n calls out and served unqueued proves capacity
/// >= n, which no real rule can tell apart from noise and stalls), and grows as fast as that is safe on the
/// family: to `max(n + 2, ceil(1.2 x n))` calls, the smallest margin of a hard cap over the highest capacity
/// (`generate_key`), so it never fails a call, and any faster growth would fail some upstream of the family
/// that its calls cannot tell apart from this one. The first call served over capacity tells it the capacity exactly (as a noise-free latency
/// would), and from then on it follows every change as the oracle does, so the cost of detecting a later
/// drop or recovery is not part of it: its figures bound the cost of the start from below.
///
/// With `drops_seen_late`, it learns of a drop only as a rule fed by completions can: when the first call
/// granted over the lower capacity completes (and then it knows the capacity exactly). Rises are still seen
/// at once. That adds the unavoidable delay of seeing a drop, which grows with its depth (a call granted
/// with n calls out over a capacity c takes `1 + n - c` base latencies to say so).
class blind_reference {
 public:
  using clock_type = std::chrono::steady_clock;       ///< only names the samples' time_point
  using sample_type = algo::basic_sample<clock_type>;  ///< what the simulation reports
  /// The family's smallest hard cap over the highest capacity: `max(c + margin, ceil(c x ratio))`.
  static constexpr double ratio = 1.2;
  static constexpr double margin = 2.0;  ///< see `ratio`

  /// For `key` (only its capacity schedule is read, to say what each call proved), from `initial` calls.
  explicit blind_reference(upstream_key key, double initial = 4.0, bool drops_seen_late = false)
      : key_{std::move(key)}, limit_{initial}, late_{drops_seen_late} {}
  /// The limit, in calls.
  double limit() const noexcept { return limit_; }
  /// Samples that lowered the limit.
  std::uint64_t decreases() const noexcept { return decreases_; }
  /// True once a call served over capacity has told it the capacity.
  bool learned() const noexcept { return learned_; }

  /// What one call proved: capacity >= its calls out, or (over capacity) the capacity itself.
  void on_sample(const sample_type& s) noexcept {
    if (learned_ && !late_) return;
    const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(s.now.time_since_epoch());
    if (s.in_flight > capacity_at(now - s.latency)) {
      learned_ = true;
      set(static_cast<double>(capacity_at(now)));
      return;
    }
    if (learned_) return;
    const double n = static_cast<double>(s.in_flight);
    limit_ = std::max(limit_, std::max(n + margin, std::ceil(n * ratio - 1e-9)));  // whole calls, as the cap
  }
  /// Once it has learned the capacity, it follows each change of it (with `drops_seen_late`, each rise).
  void on_capacity(std::size_t c) noexcept {
    if (learned_ && (!late_ || static_cast<double>(c) > limit_)) set(static_cast<double>(c));
  }

 private:
  std::size_t capacity_at(std::chrono::nanoseconds t) const noexcept {
    std::size_t c = key_.upstream.capacity;
    for (const auto& change : key_.changes)
      if (change.at <= t) c = change.capacity;
    return c;
  }
  void set(double next) noexcept {
    if (next < limit_) ++decreases_;
    limit_ = next;
  }

  upstream_key key_;
  double limit_;
  std::uint64_t decreases_ = 0;
  bool late_;
  bool learned_ = false;
};

/// Runs the oracle (and, for a scenario with a recovery, the fixed limit at the recovered capacity).
inline yardsticks measure_yardsticks(const scenario& sc) {
  yardsticks y;
  std::vector<yardstick_limit> oracle, fixed;
  bool recovers = false;
  for (std::size_t k = 0; k < sc.keys(); ++k) {
    const upstream_key key = sc.key(k);
    oracle.emplace_back(key.upstream.capacity, true);
    std::size_t final_capacity = key.upstream.capacity;
    if (!key.changes.empty()) {
      final_capacity = key.changes.back().capacity;
      const std::size_t before =
          key.changes.size() > 1 ? key.changes[key.changes.size() - 2].capacity : key.upstream.capacity;
      recovers = recovers || final_capacity > before;
    }
    fixed.emplace_back(final_capacity, false);
  }
  y.oracle_makespan = simulate("oracle", std::span{oracle}, sc).makespan;
  if (recovers) y.fixed_makespan = simulate("fixed", std::span{fixed}, sc).makespan;
  return y;
}

/// How one strategy did on one scenario.
struct family_score {
  std::string scenario;                        ///< the scenario's name (its seed)
  std::size_t failed = 0;                      ///< calls that failed because of the load (over a hard cap)
  std::size_t failed_at_random = 0;            ///< calls that failed at random, whatever the limit
  double slow_fraction = 0.0;    ///< `report::slow` / calls
  double makespan_ratio = 0.0;   ///< makespan / the oracle's
  std::optional<double> recovery_ratio{};  ///< makespan / the fixed limit's at the recovered capacity
  double lowest_cut = 0.0;       ///< `report::lowest_cut`
};

namespace detail {

/// `make(key)` if `make` takes the key, else `make()`.
template <class Make>
auto make_for(Make& make, const upstream_key& key) {
  if constexpr (std::is_invocable_v<Make&, const upstream_key&>)
    return make(key);
  else
    return make();
}

}  // namespace detail

/// Scores `make()`'s strategy (one made per key) on `sc`. `make` returns a fresh strategy by value; if it
/// takes an `upstream_key`, it is given the key the strategy is for (as `blind_reference` needs).
template <class Make>
family_score score(const scenario& sc, const yardsticks& y, Make&& make) {
  using strategy = decltype(detail::make_for(make, sc.key(0)));
  std::vector<strategy> strategies;
  strategies.reserve(sc.keys());
  for (std::size_t k = 0; k < sc.keys(); ++k) strategies.push_back(detail::make_for(make, sc.key(k)));
  const report r = simulate("", std::span{strategies}, sc);
  family_score s;
  s.scenario = sc.name;
  s.failed = r.failed - r.failed_at_random;
  s.failed_at_random = r.failed_at_random;
  s.slow_fraction = static_cast<double>(r.slow) / static_cast<double>(sc.calls());
  s.makespan_ratio = static_cast<double>(r.makespan.count()) / static_cast<double>(y.oracle_makespan.count());
  if (y.fixed_makespan)
    s.recovery_ratio = static_cast<double>(r.makespan.count()) / static_cast<double>(y.fixed_makespan->count());
  s.lowest_cut = r.lowest_cut;
  return s;
}

/// A set of generated scenarios with their yardsticks, measured once and shared by every strategy.
struct family {
  std::vector<scenario> scenarios;  ///< in seed order
  std::vector<yardsticks> marks;    ///< the yardsticks of scenarios[i]

  /// Seeds `first`, `first + 1`, ..., `first + count - 1`.
  static family generate(std::uint64_t first, std::size_t count) {
    family f;
    for (std::size_t i = 0; i < count; ++i) {
      f.scenarios.push_back(generate_scenario(first + i));
      f.marks.push_back(measure_yardsticks(f.scenarios.back()));
    }
    return f;
  }

  /// Seeds `first`, ..., `first + count - 1` of `generate_shaped_scenario(seed, shape, work_hints)`.
  static family generate_shaped(const world_shape& shape, std::uint64_t first, std::size_t count,
                                bool work_hints = false) {
    family f;
    for (std::size_t i = 0; i < count; ++i) {
      f.scenarios.push_back(generate_shaped_scenario(first + i, shape, work_hints));
      f.marks.push_back(measure_yardsticks(f.scenarios.back()));
    }
    return f;
  }
};

/// Median and worst of each figure of one strategy over a family.
struct family_summary {
  std::string strategy;                      ///< the strategy's name
  std::size_t scenarios = 0;                 ///< scenarios scored
  std::size_t scenarios_with_failures = 0;   ///< scenarios where at least one call failed
  std::size_t worst_failed = 0;              ///< the most failed calls in one scenario
  double median_slow = 0.0;                  ///< median of family_score::slow_fraction
  double worst_slow = 0.0;                   ///< largest family_score::slow_fraction
  double median_makespan = 0.0;              ///< median of family_score::makespan_ratio
  /// The lowest throughput over the oracle's: the oracle's makespan over this one's, 1 / worst_makespan.
  double worst_throughput() const noexcept { return worst_makespan > 0.0 ? 1.0 / worst_makespan : 0.0; }
  /// The median throughput over the oracle's, 1 / median_makespan.
  double median_throughput() const noexcept { return median_makespan > 0.0 ? 1.0 / median_makespan : 0.0; }
  double worst_makespan = 0.0;               ///< largest family_score::makespan_ratio
  std::size_t recoveries = 0;  ///< scenarios with a recovery figure
  double median_recovery = 0.0;              ///< median of family_score::recovery_ratio
  double worst_recovery = 0.0;               ///< largest family_score::recovery_ratio
  /// The lowest `family_score::lowest_cut` (infinity: no decrease anywhere).
  double lowest_cut = std::numeric_limits<double>::infinity();
  std::vector<family_score> scores;  ///< one per scenario, in the family's order
  /// The scenario of each worst figure (failures, slow, makespan, recovery), for a closer look.
  std::string worst_failed_at;    ///< where worst_failed was seen
  std::string worst_slow_at;      ///< where worst_slow was seen
  std::string worst_makespan_at;  ///< where worst_makespan was seen
  std::string worst_recovery_at;  ///< where worst_recovery was seen
  std::string lowest_cut_at;      ///< where lowest_cut was seen
};

namespace detail {

/// The median (lower middle for an even count) of `v`. Precondition: not empty.
inline double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

}  // namespace detail

/// Scores `make()`'s strategy on every scenario of `f` and summarises.
template <class Make>
family_summary evaluate(std::string name, const family& f, Make&& make) {
  family_summary out;
  out.strategy = std::move(name);
  std::vector<double> slow, makespan, recovery;
  for (std::size_t i = 0; i < f.scenarios.size(); ++i) {
    family_score s = score(f.scenarios[i], f.marks[i], make);
    if (s.failed > 0) ++out.scenarios_with_failures;
    if (s.failed > out.worst_failed) out.worst_failed = s.failed, out.worst_failed_at = s.scenario;
    if (s.lowest_cut < out.lowest_cut) out.lowest_cut = s.lowest_cut, out.lowest_cut_at = s.scenario;
    if (slow.empty() || s.slow_fraction > out.worst_slow) out.worst_slow = s.slow_fraction, out.worst_slow_at = s.scenario;
    if (makespan.empty() || s.makespan_ratio > out.worst_makespan)
      out.worst_makespan = s.makespan_ratio, out.worst_makespan_at = s.scenario;
    slow.push_back(s.slow_fraction);
    makespan.push_back(s.makespan_ratio);
    if (s.recovery_ratio) {
      if (recovery.empty() || *s.recovery_ratio > out.worst_recovery)
        out.worst_recovery = *s.recovery_ratio, out.worst_recovery_at = s.scenario;
      recovery.push_back(*s.recovery_ratio);
    }
    out.scores.push_back(std::move(s));
  }
  out.scenarios = f.scenarios.size();
  if (!slow.empty()) {
    out.median_slow = detail::median_of(slow);
    out.median_makespan = detail::median_of(makespan);
  }
  out.recoveries = recovery.size();
  if (!recovery.empty()) out.median_recovery = detail::median_of(recovery);
  return out;
}

/// A Markdown table, one row per strategy: scenarios with failures, the most failures in one, calls slower
/// than 2x their unloaded time (median / worst), makespan over the oracle's (median / worst), and after a
/// recovery, makespan over the fixed limit's at the recovered capacity (median / worst).
inline void print_family_table(std::ostream& os, std::span<const family_summary> rows) {
  char buf[256];
  os << "| strategy | scenarios with failures | most failures | slow calls, median / worst | makespan / oracle, "
        "median / worst | after recovery / fixed, median / worst |\n|---|---|---|---|---|---|\n";
  for (const auto& r : rows) {
    std::snprintf(buf, sizeof buf, "| %s | %zu of %zu | %zu | %.1f%% / %.1f%% | %.3f / %.3f | %.3f / %.3f |\n",
                  r.strategy.c_str(), r.scenarios_with_failures, r.scenarios, r.worst_failed, r.median_slow * 100,
                  r.worst_slow * 100, r.median_makespan, r.worst_makespan, r.median_recovery, r.worst_recovery);
    os << buf;
  }
}

}  // namespace rein::testing
