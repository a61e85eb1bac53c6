// The degrading-upstream experiment run on the real async limiters (rein::semaphore for the fixed limit,
// rein::basic_adaptive_limiter for the rest): every call is a coroutine that co_awaits acquire(), enters the
// upstream model, waits for its service time and reports its outcome. Time is rein::testing::manual_clock,
// moved event by event, so the run is exact and must equal the pure simulation (rein/testing/upstream_sim.hpp)
// figure for figure, which itself reproduces an independent model of the same experiment.
//
// Event order. The pure simulation orders events at one instant as: capacity change, then completions in the
// order they were scheduled, then arrivals. Asio does not order timers that expire at the same instant, so the
// driver keeps that schedule itself: it sets the manual clock to the next event's instant, fires exactly that
// event (spawns the arriving call, or wakes the completing call through its own timer), and polls until
// nothing is ready before taking the next one. Everything the event causes (the report, the release, the
// grants to waiters and their entry into the upstream) happens in that poll, at that instant.
#include <rein/adaptive_limiter.hpp>
#include <rein/algo/pid.hpp>
#include <rein/algo/vegas.hpp>
#include <rein/algo/windowed_aimd.hpp>
#include <rein/semaphore.hpp>
#include <rein/testing/manual_clock.hpp>
#include <rein/testing/scenario_family.hpp>
#include <rein/testing/upstream_sim.hpp>
#include <rein/try_result.hpp>

#include "support/catch.hpp"

#if defined(REIN_STANDALONE_ASIO)
#include <asio/basic_waitable_timer.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/redirect_error.hpp>
#include <asio/use_awaitable.hpp>
#else
#include <boost/asio/basic_waitable_timer.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#endif

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <queue>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
namespace net = rein::net;
using rein::outcome;
using rein::testing::call_record;
using rein::testing::manual_clock;
using rein::testing::report;
using rein::testing::scenario;

namespace {

using executor = net::io_context::executor_type;
template <class Algorithm>
using limiter_type = rein::basic_adaptive_limiter<Algorithm, executor, manual_clock>;
using semaphore_type = rein::basic_semaphore<executor, manual_clock>;
using wake_timer = net::basic_waitable_timer<manual_clock, net::wait_traits<manual_clock>, executor>;

struct oracle_options {
  std::size_t capacity = 16;
};

/// The oracle as a limit algorithm: its limit is the true capacity, set from outside (update_algorithm) at
/// every change, exactly as the pure simulation's oracle_limit is told.
template <class Clock = std::chrono::steady_clock>
class oracle_algorithm {
 public:
  using clock_type = Clock;
  using options = oracle_options;
  using sample_type = rein::algo::basic_sample<Clock>;
  template <class C>
  using rebind_clock = oracle_algorithm<C>;

  explicit oracle_algorithm(const options& o = {}) : limit_{static_cast<double>(o.capacity)} {}
  double limit() const { return limit_; }
  double min_limit() const { return 1.0; }
  double max_limit() const { return 64.0; }
  std::uint64_t decreases() const { return decreases_; }
  std::uint64_t increases() const { return 0; }
  void on_sample(const sample_type&) {}
  void on_capacity(std::size_t capacity) {
    const auto next = static_cast<double>(capacity);
    if (next < limit_) ++decreases_;
    limit_ = next;
  }

 private:
  double limit_;
  std::uint64_t decreases_ = 0;
};

enum class event_kind : int { capacity = 0, completion = 1, arrival = 2 };  // order among equal instants

struct event {
  std::chrono::nanoseconds at;
  event_kind kind;
  std::uint64_t seq;
  std::size_t subject;  // call id, or the new capacity

  friend bool operator>(const event& a, const event& b) {
    if (a.at != b.at) return a.at > b.at;
    if (a.kind != b.kind) return a.kind > b.kind;
    return a.seq > b.seq;
  }
};

/// What the driver needs to know of the limiters besides acquire(): each key's limit, the decreases over all
/// keys, and how to tell a key's limiter of a capacity change (only the oracle listens).
struct strategy_hooks {
  std::function<double(std::size_t)> limit;
  std::function<std::uint64_t()> decreases;
  std::function<void(std::size_t, std::size_t)> on_capacity = [](std::size_t, std::size_t) {};
};

// Runs a scenario of any shape the family makes: one limiter per key, the regular arrivals and the spikes of
// every key, stalls, random failures, and a global limit over all keys.
//
// Without a global limit each call co_awaits its key's limiter, so the async wait line decides who goes next,
// as in use. With one, a call must find room both in its key's limiter and under the global cap, and the
// simulation's rule is "the earliest-arrived head among the keys with room" (a key never waits behind another
// key's full limit): no pair of rein limiters co_awaited in some order does that (the call holding one slot
// while it waits for the other shifts the in-flight counts the algorithms learn from), so there the driver
// keeps the simulation's queues itself and takes each slot with try_acquire, still through the real limiter,
// its permits and its reports.
template <class Limiter>
class async_experiment {
 public:
  async_experiment(net::io_context& io, std::vector<Limiter*> limiters, strategy_hooks hooks, const scenario& sc)
      : io_{io}, limiters_{std::move(limiters)}, hooks_{std::move(hooks)}, scenario_{sc}, calls_(sc.calls()),
        slots_(sc.calls()), work_(sc.calls(), 1.0) {
    REQUIRE(limiters_.size() == sc.keys());
    for (std::size_t k = 0; k < sc.keys(); ++k) keys_.push_back(std::make_unique<key_state>(sc.key(k)));
    for (std::size_t i = 0; i < sc.calls(); ++i) wake_.push_back(std::make_unique<wake_timer>(io.get_executor()));
  }

  report run(std::string name) {
    manual_clock::reset();
    schedule_workload();
    max_limit_ = hooks_.limit(0);
    while (!events_.empty()) {
      const event e = events_.top();
      events_.pop();
      record_timeline_before(e.at);
      manual_clock::set(manual_clock::time_point{e.at});
      fire(e);
      io_.poll();
      max_limit_ = std::max(max_limit_, hooks_.limit(0));
    }
    return finish(std::move(name));
  }

 private:
  struct key_state {
    explicit key_state(rein::testing::upstream_key s) : spec{std::move(s)}, model{spec.upstream} {}
    rein::testing::upstream_key spec;
    rein::testing::upstream_model model;
    std::deque<std::size_t> waiting{};  // only with a global limit: calls the driver has not admitted yet
  };

  bool global() const { return scenario_.global_limit != 0; }

  void push(std::chrono::nanoseconds at, event_kind kind, std::size_t subject) {
    events_.push(event{at, kind, next_seq_++, subject});
  }

  // Calls and capacity changes numbered and scheduled in the simulation's order (key by key, phase by phase).
  void schedule_workload() {
    std::size_t id = 0;
    for (std::size_t k = 0; k < keys_.size(); ++k)
      for (const auto& phase : keys_[k]->spec.arrivals)
        for (std::size_t t = 0; t < phase.ticks; ++t)
          for (std::size_t i = 0; i < phase.per_tick; ++i, ++id) {
            calls_[id].arrived = phase.start + phase.tick * static_cast<std::int64_t>(t);
            calls_[id].key = k;
            push(calls_[id].arrived, event_kind::arrival, id);
          }
    for (std::size_t k = 0; k < keys_.size(); ++k)
      for (const auto& change : keys_[k]->spec.changes) {
        push(change.at, event_kind::capacity, changes_.size());
        changes_.push_back({k, change.capacity});
      }
  }

  void fire(const event& e) {
    switch (e.kind) {
      case event_kind::arrival: net::co_spawn(io_, call(e.subject), net::detached); break;
      case event_kind::completion: wake_[e.subject]->cancel(); break;
      case event_kind::capacity: {
        const auto [k, capacity] = changes_[e.subject];
        keys_[k]->model.set_capacity(capacity);
        hooks_.on_capacity(k, capacity);
        if (global()) drain();
        break;
      }
    }
  }

  static std::chrono::nanoseconds elapsed() { return manual_clock::now().time_since_epoch(); }

  // Waits on the call's own timer until the driver cancels it (the cancel is the wake-up, not an error).
  net::awaitable<void> sleep(std::size_t id) {
    wake_timer& wake = *wake_[id];
    wake.expires_at(manual_clock::time_point::max());
    rein::error_code cancelled;
    co_await wake.async_wait(net::redirect_error(net::use_awaitable, cancelled));
  }

  // One call: wait for a slot, enter the upstream, wait until the driver says the upstream is done with it,
  // report, release.
  net::awaitable<void> call(std::size_t id) {
    key_state& key = *keys_[calls_[id].key];
    if (!global()) {
      slots_[id] = co_await limiters_[calls_[id].key]->acquire();
      begin(id);
    } else if (!(key.waiting.empty() && admit(id))) {
      key.waiting.push_back(id);
      co_await sleep(id);  // until drain() admits it
    }
    co_await sleep(id);  // until its completion event
    call_record& c = calls_[id];
    key.model.leave();
    c.finished = elapsed();
    const double before = hooks_.limit(c.key);
    const outcome result = c.ok ? outcome::success : outcome::congestion;
    if (scenario_.work_hints) slots_[id].complete(result, {.work = work_[id]});  // as the simulation's samples
    else slots_[id].complete(result);
    if (const double after = hooks_.limit(c.key); after < before)
      lowest_cut_ = std::min(lowest_cut_, after / static_cast<double>(key.model.capacity()));
    --in_flight_;
    if (global()) drain();
  }

  // The call has its slot: it enters its key's upstream now.
  void begin(std::size_t id) {
    call_record& c = calls_[id];
    ++in_flight_;
    c.started = elapsed();
    const auto plan = keys_[c.key]->model.enter(c.started);
    c.ok = plan.ok;
    c.unloaded = plan.unloaded;
    c.random_failure = plan.random_failure;
    work_[id] = plan.work;
    push(c.started + plan.service_time, event_kind::completion, id);
  }

  // With a global limit: takes a slot of the call's key if the global cap and the key's limiter both have room.
  bool admit(std::size_t id) {
    if (in_flight_ >= scenario_.global_limit) return false;
    rein::try_permit p = limiters_[calls_[id].key]->try_acquire();
    if (!p) return false;
    slots_[id] = std::move(p);
    begin(id);
    return true;
  }

  // The simulation's drain: repeatedly, of the keys whose head can be admitted, the head that arrived first
  // (the lowest key on a tie).
  void drain() {
    for (;;) {
      std::vector<std::size_t> order;
      for (std::size_t k = 0; k < keys_.size(); ++k)
        if (!keys_[k]->waiting.empty()) order.push_back(k);
      std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return calls_[keys_[a]->waiting.front()].arrived < calls_[keys_[b]->waiting.front()].arrived;
      });
      bool admitted = false;
      for (const std::size_t k : order) {
        const std::size_t id = keys_[k]->waiting.front();
        if (!admit(id)) continue;
        keys_[k]->waiting.pop_front();
        wake_[id]->cancel();
        admitted = true;
        break;
      }
      if (!admitted) return;
    }
  }

  void record_timeline_before(std::chrono::nanoseconds t) {
    while (next_point_ < t) {
      timeline_.push_back({next_point_, hooks_.limit(0), keys_[0]->model.capacity()});
      next_point_ += scenario_.timeline_step;
    }
  }

  report finish(std::string name) {
    report r;
    r.strategy = std::move(name);
    r.scenario = scenario_.name;
    rein::testing::summarise_calls(r, calls_);
    record_timeline_before(r.makespan + 1ns);
    r.timeline = std::move(timeline_);
    r.final_limit = hooks_.limit(0);
    r.max_limit = max_limit_;
    r.decreases = hooks_.decreases();
    for (const auto& k : keys_) r.peak_inside = std::max(r.peak_inside, k->model.peak());
    r.lowest_cut = lowest_cut_;
    return r;
  }

  net::io_context& io_;
  std::vector<Limiter*> limiters_;
  strategy_hooks hooks_;
  const scenario& scenario_;
  std::vector<std::unique_ptr<key_state>> keys_;
  std::vector<std::pair<std::size_t, std::size_t>> changes_;  // key, capacity
  std::vector<rein::testing::call_record> calls_;
  std::vector<rein::permit> slots_;
  std::vector<double> work_;  // each call's payload factor: its work hint with scenario::work_hints
  std::vector<std::unique_ptr<wake_timer>> wake_;
  std::priority_queue<event, std::vector<event>, std::greater<>> events_;
  std::uint64_t next_seq_ = 0;
  std::size_t in_flight_ = 0;  // over all keys
  double max_limit_ = 0.0;
  double lowest_cut_ = std::numeric_limits<double>::infinity();
  std::chrono::nanoseconds next_point_{0};
  std::vector<rein::testing::timeline_point> timeline_;
};

template <class Limiter>
report run_on(net::io_context& io, std::vector<Limiter*> limiters, strategy_hooks hooks, const scenario& sc,
              std::string name) {
  const auto work = net::make_work_guard(io);  // poll() stops an io_context that runs out of work
  async_experiment<Limiter> experiment{io, std::move(limiters), std::move(hooks), sc};
  return experiment.run(std::move(name));
}

report run_fixed(const scenario& sc) {
  net::io_context io;
  std::vector<std::unique_ptr<semaphore_type>> owned;
  std::vector<semaphore_type*> limiters;
  for (std::size_t k = 0; k < sc.keys(); ++k) {
    owned.push_back(std::make_unique<semaphore_type>(io.get_executor(), 16));
    limiters.push_back(owned.back().get());
  }
  strategy_hooks hooks{[](std::size_t) { return rein::testing::experiment_fixed_limit; }, [] { return std::uint64_t{0}; }};
  return run_on(io, std::move(limiters), std::move(hooks), sc, "fixed(16)");
}

/// Runs `sc` on one async adaptive limiter per key, key k's algorithm made with `options_for(key k)`.
template <class Algorithm, class OptionsFor>
  requires std::is_invocable_v<OptionsFor&, const rein::testing::upstream_key&>
report run_adaptive(const scenario& sc, OptionsFor options_for, std::string name) {
  net::io_context io;
  rein::adaptive_limiter_options lo;
  // The simulation models the algorithm alone: no restart window after an idle spell (TCP's, which the
  // limiter adds on its own).
  lo.idle_restart = 0ns;
  std::vector<std::unique_ptr<limiter_type<Algorithm>>> owned;
  std::vector<limiter_type<Algorithm>*> limiters;
  for (std::size_t k = 0; k < sc.keys(); ++k) {
    owned.push_back(
        std::make_unique<limiter_type<Algorithm>>(io.get_executor(), options_for(sc.key(k)), rein::line_options{}, lo));
    limiters.push_back(owned.back().get());
  }
  strategy_hooks hooks{[&](std::size_t k) { return owned[k]->limit(); },
                       [&] {
                         std::uint64_t n = 0;
                         for (const auto& l : owned) n += l->snapshot().decreases;
                         return n;
                       }};
  if constexpr (requires(typename limiter_type<Algorithm>::algorithm_type& a) { a.on_capacity(std::size_t{}); })
    hooks.on_capacity = [&](std::size_t k, std::size_t c) {
      owned[k]->update_algorithm([c](auto& a) { a.on_capacity(c); });
    };
  report r = run_on(io, std::move(limiters), std::move(hooks), sc, std::move(name));
  std::uint64_t acquired = 0;
  for (const auto& l : owned) {
    CHECK(l->in_flight() == 0);
    acquired += l->snapshot().acquired_total;
  }
  CHECK(acquired == sc.calls());
  return r;
}

/// The same options for every key.
template <class Algorithm>
report run_adaptive(const scenario& sc, const typename Algorithm::options& options, std::string name) {
  return run_adaptive<Algorithm>(sc, [&](const rein::testing::upstream_key&) { return options; }, std::move(name));
}

/// The experiment's five strategies on the async limiters, in the order of rein::testing::run_experiment.
std::vector<report> run_async_experiment(const scenario& sc) {
  using namespace rein::testing;
  std::vector<report> out;
  out.push_back(run_fixed(sc));
  out.push_back(run_adaptive<rein::algo::aimd>(sc, experiment_aimd_options(), "aimd"));
  out.push_back(run_adaptive<rein::algo::tuned_aimd>(sc, experiment_tuned_aimd_options(), "tuned_aimd"));
  out.push_back(run_adaptive<rein::algo::gradient>(sc, experiment_gradient_options(), "gradient"));
  out.push_back(run_adaptive<oracle_algorithm<>>(
      sc, [](const rein::testing::upstream_key& k) { return oracle_options{k.upstream.capacity}; }, "oracle"));
  return out;
}

const report& find(const std::vector<report>& rs, const std::string& name) {
  for (const auto& r : rs)
    if (r.strategy == name) return r;
  FAIL("no strategy " << name);
  return rs.front();
}

/// Every figure and every timeline point of the async run equals the pure simulation's.
void check_same(const report& async, const report& pure) {
  INFO(async.strategy << " in scenario " << async.scenario);
  CHECK(async.strategy == pure.strategy);
  CHECK(async.completed == pure.completed);
  CHECK(async.failed == pure.failed);
  CHECK(async.failed_at_random == pure.failed_at_random);
  CHECK(async.slow == pure.slow);
  CHECK(async.lowest_cut == pure.lowest_cut);
  CHECK(async.p50 == pure.p50);
  CHECK(async.p95 == pure.p95);
  CHECK(async.p99 == pure.p99);
  CHECK(async.max == pure.max);
  CHECK(async.slower_than_10ms == pure.slower_than_10ms);
  CHECK(async.makespan == pure.makespan);
  CHECK(async.e2e_p95 == pure.e2e_p95);
  CHECK(async.final_limit == pure.final_limit);
  CHECK(async.max_limit == pure.max_limit);
  CHECK(async.decreases == pure.decreases);
  CHECK(async.peak_inside == pure.peak_inside);
  REQUIRE(async.timeline.size() == pure.timeline.size());
  for (std::size_t i = 0; i < pure.timeline.size(); ++i) {
    INFO("timeline point at " << pure.timeline[i].at.count() << " ns");
    CHECK(async.timeline[i].limit == pure.timeline[i].limit);
    CHECK(async.timeline[i].capacity == pure.timeline[i].capacity);
  }
}

std::string two_decimals(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

struct figures {
  std::size_t completed, failed;
  std::chrono::milliseconds p50, p95, p99;
  std::size_t slower_than_10ms;
  std::chrono::milliseconds makespan;
  std::string final_limit;
  std::uint64_t decreases;
};

void check_figures(const report& r, const figures& e) {
  INFO(r.strategy << " in scenario " << r.scenario);
  CHECK(r.completed == e.completed);
  CHECK(r.failed == e.failed);
  CHECK(r.p50 == e.p50);
  CHECK(r.p95 == e.p95);
  CHECK(r.p99 == e.p99);
  CHECK(r.slower_than_10ms == e.slower_than_10ms);
  CHECK(r.makespan == e.makespan);
  CHECK(two_decimals(r.final_limit) == e.final_limit);
  CHECK(r.decreases == e.decreases);
}

}  // namespace

TEST_CASE("degrading upstream, async, scenario A: every strategy equals the pure simulation exactly") {
  const scenario sc = scenario::a();
  const auto pure = rein::testing::run_experiment(sc);
  const auto async = run_async_experiment(sc);
  REQUIRE(async.size() == pure.size());
  for (std::size_t i = 0; i < pure.size(); ++i) check_same(async[i], pure[i]);
}

TEST_CASE("degrading upstream, async, scenario B: every strategy equals the pure simulation exactly") {
  const scenario sc = scenario::b();
  const auto pure = rein::testing::run_experiment(sc);
  const auto async = run_async_experiment(sc);
  REQUIRE(async.size() == pure.size());
  for (std::size_t i = 0; i < pure.size(); ++i) check_same(async[i], pure[i]);
}

TEST_CASE("degrading upstream, async, scenario A: the independent model's figures and rein's defaults") {
  const auto rs = run_async_experiment(scenario::a());
  // The independent model: fixed p95 65 ms, makespan 2,298 ms; aimd p95 25 ms, 9 failures;
  // oracle p95 5 ms, makespan 879 ms.
  check_figures(find(rs, "fixed(16)"), {1000, 0, 5ms, 65ms, 65ms, 500, 2298ms, "16.00", 0});
  check_figures(find(rs, "aimd"), {991, 9, 5ms, 25ms, 60ms, 265, 1592ms, "3.83", 93});
  check_figures(find(rs, "oracle"), {1000, 0, 5ms, 5ms, 5ms, 0, 879ms, "4.00", 1});
  check_figures(find(rs, "tuned_aimd"), {1000, 0, 5ms, 5ms, 35ms, 17, 931ms, "4.09", 12});
  check_figures(find(rs, "gradient"), {1000, 0, 5ms, 10ms, 35ms, 23, 976ms, "4.79", 16});
}

TEST_CASE("degrading upstream, async, scenario B: the adaptive limiters find the capacity again") {
  const auto rs = run_async_experiment(scenario::b());
  check_figures(find(rs, "fixed(16)"), {1000, 0, 5ms, 65ms, 65ms, 96, 747ms, "16.00", 0});
  check_figures(find(rs, "aimd"), {991, 9, 5ms, 25ms, 60ms, 133, 882ms, "16.68", 40});
  check_figures(find(rs, "oracle"), {1000, 0, 5ms, 5ms, 5ms, 0, 670ms, "16.00", 1});
  check_figures(find(rs, "tuned_aimd"), {1000, 0, 5ms, 10ms, 35ms, 34, 762ms, "16.81", 9});
  check_figures(find(rs, "gradient"), {1000, 0, 5ms, 10ms, 35ms, 23, 756ms, "16.05", 13});
}

TEST_CASE("degrading upstream, async: tuned_aimd and gradient meet the experiment's targets with default options") {
  const auto a = run_async_experiment(scenario::a());
  const auto b = run_async_experiment(scenario::b());
  const auto oracle_a = find(a, "oracle").makespan;
  const auto fixed_b = find(b, "fixed(16)").makespan;
  for (const char* name : {"tuned_aimd", "gradient"}) {
    INFO(name);
    const report& ra = find(a, name);
    CHECK(ra.failed == 0);
    CHECK(ra.slower_than_10ms <= 50);
    CHECK(ra.p95 <= 10ms);
    CHECK(ra.makespan * 10 <= oracle_a * 14);
    const report& rb = find(b, name);
    CHECK(rb.failed == 0);
    CHECK(rb.makespan * 10 <= fixed_b * 11);
  }
  const report& aimd = find(a, "aimd");
  CHECK(aimd.p95 >= 20ms);
  CHECK(aimd.p95 <= 25ms);
  CHECK(aimd.failed > 0);
  CHECK(aimd.failed < 20);
}

TEST_CASE("degrading upstream, async: a tuned textbook AIMD and Gradient2's settings equal the simulation too") {
  // These keep the limit far above the in-flight count (that tuned AIMD fails calls past the hard
  // cap), so they exercise the in-flight-at-grant bookkeeping and congestion reports far more than rein's
  // defaults do.
  rein::algo::tuned_aimd_options t;
  t.initial_limit = 16;
  t.window = 50;
  t.tolerance = 2.0;
  t.backoff = 0.75;
  t.hold = 40ms;
  t.min_utilisation = 0;
  rein::algo::gradient_options g;
  g.initial_limit = 16;
  g.queue_size = 4;
  g.tolerance = 1.5;
  g.smoothing = 0.2;
  g.baseline = rein::algo::gradient_baseline::long_average;
  g.baseline_window = 600;
  g.failures_as_congestion = false;
  for (const scenario& sc : {scenario::a(), scenario::b()}) {
    rein::algo::tuned_aimd guide{t};
    check_same(run_adaptive<rein::algo::tuned_aimd>(sc, t, "guide tuned_aimd"),
               rein::testing::simulate("guide tuned_aimd", guide, sc));
    rein::algo::gradient gradient2{g};
    check_same(run_adaptive<rein::algo::gradient>(sc, g, "gradient2"),
               rein::testing::simulate("gradient2", gradient2, sc));
  }
}

namespace {

/// The first figure in which two reports of one run differ ("" if none): a failing family test lists one line
/// per scenario and strategy instead of hundreds of failed checks.
std::string first_difference(const report& a, const report& p) {
  const auto ms = [](std::chrono::nanoseconds d) { return std::to_string(d.count()) + " ns"; };
  const auto num = [](double v) { return std::to_string(v); };
  const std::pair<const char*, std::pair<std::string, std::string>> figures[] = {
      {"completed", {std::to_string(a.completed), std::to_string(p.completed)}},
      {"failed", {std::to_string(a.failed), std::to_string(p.failed)}},
      {"failed_at_random", {std::to_string(a.failed_at_random), std::to_string(p.failed_at_random)}},
      {"slow", {std::to_string(a.slow), std::to_string(p.slow)}},
      {"p50", {ms(a.p50), ms(p.p50)}},
      {"p95", {ms(a.p95), ms(p.p95)}},
      {"p99", {ms(a.p99), ms(p.p99)}},
      {"max", {ms(a.max), ms(p.max)}},
      {"makespan", {ms(a.makespan), ms(p.makespan)}},
      {"e2e_p95", {ms(a.e2e_p95), ms(p.e2e_p95)}},
      {"final_limit", {num(a.final_limit), num(p.final_limit)}},
      {"max_limit", {num(a.max_limit), num(p.max_limit)}},
      {"decreases", {std::to_string(a.decreases), std::to_string(p.decreases)}},
      {"peak_inside", {std::to_string(a.peak_inside), std::to_string(p.peak_inside)}},
      {"lowest_cut", {num(a.lowest_cut), num(p.lowest_cut)}},
      {"timeline points", {std::to_string(a.timeline.size()), std::to_string(p.timeline.size())}},
  };
  for (const auto& [name, values] : figures)
    if (values.first != values.second) return std::string{name} + ": async " + values.first + ", simulate " + values.second;
  for (std::size_t i = 0; i < p.timeline.size(); ++i)
    if (a.timeline[i].limit != p.timeline[i].limit || a.timeline[i].capacity != p.timeline[i].capacity)
      return "timeline at " + ms(p.timeline[i].at) + ": async limit " + num(a.timeline[i].limit) + ", simulate " +
             num(p.timeline[i].limit);
  return {};
}

/// simulate() on one `Algorithm` per key against the async limiters on the same scenario; appends a line to
/// `differences` if they differ in any figure or timeline point.
template <class Algorithm>
void compare_on(const scenario& sc, const typename Algorithm::options& options, const char* name,
                std::vector<std::string>& differences) {
  std::vector<Algorithm> pure;
  for (std::size_t k = 0; k < sc.keys(); ++k) pure.emplace_back(options);
  const report p = rein::testing::simulate(name, std::span{pure}, sc);
  const report a = run_adaptive<Algorithm>(sc, options, name);
  if (std::string d = first_difference(a, p); !d.empty()) differences.push_back(sc.name + ", " + name + ": " + d);
}

}  // namespace

TEST_CASE("degrading upstream, async: every scenario of the family's CI seeds equals the pure simulation") {
  // Seeds 1-13 hold every kind of the family: noise, drops and recoveries, drifts, spikes, stalls, three keys
  // (seed 6) and a global limit (seed 13); the world's shapes add payload-shaped latency (calls granted at one
  // instant that finish out of order) and random failures.
  std::vector<scenario> scenarios;
  for (std::uint64_t seed = 1; seed <= 13; ++seed) scenarios.push_back(rein::testing::generate_scenario(seed));
  for (const auto& shape : rein::testing::world_shapes())
    for (std::uint64_t seed = 1; seed <= 2; ++seed)
      scenarios.push_back(rein::testing::generate_shaped_scenario(seed, shape));
  std::vector<std::string> differences;
  for (const scenario& sc : scenarios) {
    compare_on<rein::algo::tuned_aimd>(sc, rein::testing::experiment_tuned_aimd_options(), "tuned_aimd", differences);
    compare_on<rein::algo::gradient>(sc, rein::testing::experiment_gradient_options(), "gradient", differences);
    compare_on<rein::algo::aimd>(sc, rein::testing::experiment_aimd_options(), "aimd", differences);
    compare_on<rein::algo::vegas>(sc, rein::algo::vegas_options{}, "vegas", differences);
    compare_on<rein::algo::windowed_aimd>(sc, rein::algo::windowed_aimd_options{}, "windowed_aimd", differences);
    compare_on<rein::algo::pid>(sc, rein::algo::pid_options{}, "pid", differences);
  }
  std::string listed;
  for (const auto& d : differences) listed += d + "\n";
  INFO(differences.size() << " of " << scenarios.size() * 6 << " runs differ:\n" << listed);
  CHECK(differences.empty());
}

TEST_CASE("degrading upstream, async: with work hints on the permits, the family's shapes equal the simulation") {
  // Each call completes with its payload factor as its work hint (permit::complete(outcome, completion_hint)),
  // as the simulation's samples carry it (scenario::work_hints): tuned_aimd judges latency per unit of work;
  // the others take the hint and must still match figure for figure.
  std::vector<scenario> scenarios;
  for (const auto& shape : rein::testing::world_shapes())
    for (std::uint64_t seed = 1; seed <= 2; ++seed)
      scenarios.push_back(rein::testing::generate_shaped_scenario(seed, shape, true));
  std::vector<std::string> differences;
  for (const scenario& sc : scenarios) {
    REQUIRE(sc.work_hints);
    compare_on<rein::algo::tuned_aimd>(sc, rein::testing::experiment_tuned_aimd_options(), "tuned_aimd", differences);
    compare_on<rein::algo::gradient>(sc, rein::testing::experiment_gradient_options(), "gradient", differences);
    compare_on<rein::algo::aimd>(sc, rein::testing::experiment_aimd_options(), "aimd", differences);
  }
  std::string listed;
  for (const auto& d : differences) listed += d + "\n";
  INFO(differences.size() << " of " << scenarios.size() * 3 << " runs differ:\n" << listed);
  CHECK(differences.empty());
  // The hints reach the algorithm: the same shapes without them end tuned_aimd elsewhere in some scenario.
  std::size_t moved = 0;
  for (const scenario& hinted : scenarios) {
    scenario plain = hinted;
    plain.work_hints = false;
    const auto options = rein::testing::experiment_tuned_aimd_options();
    if (run_adaptive<rein::algo::tuned_aimd>(hinted, options, "hinted").final_limit !=
        run_adaptive<rein::algo::tuned_aimd>(plain, options, "plain").final_limit)
      ++moved;
  }
  CHECK(moved > 0);
}
