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
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <ostream>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rein::testing {

/// A dependency whose service time grows past its capacity and which fails past a hard cap.
///
/// A call that enters while `n` calls are inside (itself included) takes `base x (1 + max(0, n - capacity))`;
/// if `n > hard_cap` it takes `base` and then fails. Capacity may change at any time; a call's service time is
/// fixed when it enters.
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
  };

  /// What one call will do, decided when it enters.
  struct call_plan {
    std::chrono::nanoseconds service_time;  ///< how long until it completes (or fails)
    bool ok;                                ///< false: it fails (a timeout: congestion)
    std::size_t inside;                     ///< calls inside when it entered, itself included
  };

  /// An upstream with no call inside, at `o.capacity`.
  explicit upstream_model(const options& o) noexcept : options_{o}, capacity_{o.capacity} {}

  /// The service-time rule alone, for `n` calls inside (this one included).
  static call_plan plan(std::size_t n, std::size_t capacity, const options& o) noexcept {
    if (n > o.hard_cap) return {o.base + o.overhead, false, n};
    const std::size_t over = n > capacity ? n - capacity : 0;
    return {o.base * static_cast<std::int64_t>(1 + over) + o.overhead, true, n};
  }

  /// A call enters; the caller must call `leave()` when it completes.
  call_plan enter() noexcept {
    ++inside_;
    peak_ = std::max(peak_, inside_);
    return plan(inside_, capacity_, options_);
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
  options options_;
  std::size_t capacity_;
  std::size_t inside_ = 0;
  std::size_t peak_ = 0;
};

/// The upstream's capacity becomes `capacity` at `at` (from the start of the run).
struct capacity_change {
  /// When, from the start of the run.
  std::chrono::nanoseconds at;
  /// The new capacity, in calls.
  std::size_t capacity;
};

/// One run of the experiment: the upstream, its capacity schedule and the workload.
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
  /// The interval of report::timeline.
  std::chrono::nanoseconds timeline_step = std::chrono::milliseconds{25};

  /// Calls in the run: ticks x per_tick.
  std::size_t calls() const noexcept { return ticks * per_tick; }

  /// The true capacity at `t`, after every change at or before `t`.
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
  std::size_t failed = 0;     ///< calls the upstream failed (over its hard cap)
  /// Service time (grant to completion, failures included), nearest-rank percentiles.
  std::chrono::nanoseconds p50{}, p95{}, p99{}, max{};
  /// @var p95
  /// Service time, 95th percentile (nearest rank).
  /// @var p99
  /// Service time, 99th percentile (nearest rank).
  /// @var max
  /// The longest service time.
  std::size_t slower_than_10ms = 0;       ///< calls whose service time exceeded 10 ms
  std::chrono::nanoseconds makespan{};    ///< when the last call finished
  std::chrono::nanoseconds e2e_p95{};     ///< arrival to completion (queueing at the client included)
  /// The strategy's limit when the run ended.
  double final_limit = 0.0;
  /// The strategy's highest limit during the run.
  double max_limit = 0.0;
  /// How many samples lowered the limit.
  std::uint64_t decreases = 0;
  std::size_t peak_inside = 0;            ///< most calls inside the upstream at once
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
  r.completed = r.failed = r.slower_than_10ms = 0;
  r.makespan = {};
  for (const auto& c : calls) {
    service.push_back(c.finished - c.started);
    e2e.push_back(c.finished - c.arrived);
    (c.ok ? r.completed : r.failed) += 1;
    if (service.back() > std::chrono::milliseconds{10}) ++r.slower_than_10ms;
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

  simulation(Strategy& strategy, const scenario& sc)
      : strategy_{strategy}, scenario_{sc}, upstream_{sc.upstream}, calls_(sc.calls()), granted_in_flight_(sc.calls()) {}

  report run() {
    schedule_workload();
    max_limit_ = strategy_.limit();
    while (!events_.empty()) {
      const event e = events_.top();
      events_.pop();
      record_timeline_before(e.at);
      dispatch(e);
      max_limit_ = std::max(max_limit_, static_cast<double>(strategy_.limit()));
    }
    return finish();
  }

 private:
  void push(std::chrono::nanoseconds at, event_kind kind, std::size_t subject) {
    events_.push(event{at, kind, next_seq_++, subject});
  }

  void schedule_workload() {
    std::size_t id = 0;
    for (std::size_t k = 0; k < scenario_.ticks; ++k) {
      for (std::size_t i = 0; i < scenario_.per_tick; ++i, ++id) {
        calls_[id].arrived = scenario_.tick * static_cast<std::int64_t>(k);
        push(calls_[id].arrived, event_kind::arrival, id);
      }
    }
    for (const auto& change : scenario_.changes) push(change.at, event_kind::capacity, change.capacity);
  }

  void dispatch(const event& e) {
    switch (e.kind) {
      case event_kind::arrival: arrive(e.subject, e.at); break;
      case event_kind::completion: complete(e.subject, e.at); break;
      case event_kind::capacity: change_capacity(e.subject, e.at); break;
    }
  }

  bool room() const { return in_flight_ < algo::admitted(static_cast<double>(strategy_.limit())); }

  void arrive(std::size_t id, std::chrono::nanoseconds now) {
    if (waiting_.empty() && room())
      begin(id, now);
    else
      waiting_.push_back(id);
  }

  void begin(std::size_t id, std::chrono::nanoseconds now) {
    ++in_flight_;
    const auto plan = upstream_.enter();
    calls_[id].started = now;
    calls_[id].ok = plan.ok;
    granted_in_flight_[id] = in_flight_;
    push(now + plan.service_time, event_kind::completion, id);
  }

  void complete(std::size_t id, std::chrono::nanoseconds now) {
    upstream_.leave();
    auto& c = calls_[id];
    c.finished = now;
    sample_type s;
    s.latency = now - c.started;
    s.result = c.ok ? outcome::success : outcome::congestion;
    s.in_flight = granted_in_flight_[id];
    s.now = time_point{} + std::chrono::duration_cast<typename time_point::duration>(now);
    strategy_.on_sample(s);  // report, then release, as adaptive_limiter does
    --in_flight_;
    drain(now);
  }

  void change_capacity(std::size_t capacity, std::chrono::nanoseconds now) {
    upstream_.set_capacity(capacity);
    if constexpr (requires { strategy_.on_capacity(capacity); }) strategy_.on_capacity(capacity);
    drain(now);
  }

  void drain(std::chrono::nanoseconds now) {
    while (!waiting_.empty() && room()) {
      const std::size_t id = waiting_.front();
      waiting_.pop_front();
      begin(id, now);
    }
  }

  // Each point shows the state after every event at or before its instant.
  void record_timeline_before(std::chrono::nanoseconds t) {
    while (next_point_ < t) {
      timeline_.push_back({next_point_, static_cast<double>(strategy_.limit()), upstream_.capacity()});
      next_point_ += scenario_.timeline_step;
    }
  }

  report finish() {
    report r;
    r.scenario = scenario_.name;
    summarise_calls(r, calls_);
    record_timeline_before(r.makespan + std::chrono::nanoseconds{1});
    r.timeline = std::move(timeline_);
    r.final_limit = static_cast<double>(strategy_.limit());
    r.max_limit = max_limit_;
    r.decreases = static_cast<std::uint64_t>(strategy_.decreases());
    r.peak_inside = upstream_.peak();
    return r;
  }

  Strategy& strategy_;
  const scenario& scenario_;
  upstream_model upstream_;
  std::vector<call_record> calls_;
  std::vector<std::size_t> granted_in_flight_;
  std::priority_queue<event, std::vector<event>, std::greater<>> events_;
  std::deque<std::size_t> waiting_;
  std::uint64_t next_seq_ = 0;
  std::size_t in_flight_ = 0;
  double max_limit_ = 0.0;
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
  report r = detail::simulation<Strategy>{strategy, sc}.run();
  r.strategy = std::move(strategy_name);
  return r;
}

// ---------------------------------------------------------------------------------------------------------
// The experiment's strategies
// ---------------------------------------------------------------------------------------------------------

/// The fixed limit of the experiment: a semaphore of 16.
inline constexpr double experiment_fixed_limit = 16.0;

/// The textbook AIMD limiter of the experiment: from 16, floor 1, ceiling 64, 20 ms target, x0.75.
inline algo::aimd_options experiment_aimd_options() {
  algo::aimd_options o;
  o.initial_limit = 16.0;
  o.latency_target = std::chrono::milliseconds{20};
  return o;
}

/// rein's default tuned AIMD, starting from 16 like every strategy of the experiment.
inline algo::tuned_aimd_options experiment_tuned_aimd_options() {
  algo::tuned_aimd_options o;
  o.initial_limit = 16.0;
  return o;
}

/// rein's default gradient limit, starting from 16 (its default).
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
