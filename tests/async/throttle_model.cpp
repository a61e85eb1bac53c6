// The throttle's two promises, checked on every interleaving of a small scope and on random schedules at
// scale (manual clock, exact):
//
// - Send-time bound: for every rate stage (the shared one, and each key's), the admissions in every window
//   [t1, t2] number at most burst + rate x (t2 - t1), counted at the instant each call is admitted (sent),
//   and each bucket holds exactly the tokens that its admissions alone leave (nobody holds tokens while
//   waiting).
// - No cross-key head-of-line blocking: the global concurrency slots are held only by admitted calls and by
//   callers waiting at the shared rate (which every key needs); a caller waiting for its key's gate, permit
//   or rate holds none of them. And no order of calls deadlocks: whatever happened, once the calls in flight
//   complete and time passes, every caller is admitted or fails, and every stage returns to rest.
//
// What "proven" covers here: the exhaustive check explores every order of the events below, for 3 callers
// spread over keys in each pattern (one key, two keys, three keys), with stages gate -> per-key permit (1) ->
// global permit (2) -> per-key rate (1/s, burst 1) -> shared rate (2/s, burst 1), events start / complete /
// 429 (pauses the key 1 s) / cancel / timeout (caller 0 has a deadline of 1 s) / time step (500 ms, up to
// `ticks` of them), with the invariants asserted after every event and the drain at every leaf. It runs
// the same model on the order rein used before (rates taken first) and requires that it finds a violation,
// so the check can fail. The randomized test runs the same invariants over many keys and long schedules.
// REIN_MODEL_THOROUGH=1 raises the scope (more time steps); CI runs the quick tier.
#include "support/asio.hpp"
#include "support/catch.hpp"
#include "support/manual_time.hpp"
#include "support/model_tier.hpp"

#include <rein/algo/token_bucket.hpp>
#include <rein/keyed.hpp>
#include <rein/quota_gate.hpp>
#include <rein/semaphore.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace std::chrono_literals;
namespace net = rein::net;
using rein_test::manual_clock;

namespace {

using executor = net::any_io_executor;
using gate_t = rein::basic_quota_gate<executor, manual_clock>;
using sem_t = rein::basic_semaphore<executor, manual_clock>;
using bucket_t = rein::basic_token_bucket<executor, manual_clock>;
using model_bucket = rein::algo::basic_token_bucket<manual_clock>;

constexpr double shared_rate = 2.0;  // per second: one token every 500 ms
constexpr double key_rate = 1.0;
constexpr std::int64_t burst = 1;

rein::quota_gate_options no_jitter() {
  rein::quota_gate_options o;
  o.jitter = 0.0;
  return o;
}

std::int64_t now_ms() { return std::chrono::duration_cast<std::chrono::milliseconds>(rein_test::since_epoch()).count(); }

// The stages and the throttle, in rein's order or, with RatesFirst, in the order it used before.
template <bool RatesFirst>
struct world {
  net::io_context io;
  rein::keyed<gate_t> gates{io.get_executor(), rein::keyed_options{}, no_jitter()};
  rein::keyed<sem_t> per_key{io.get_executor(), rein::keyed_options{}, std::size_t{1}};
  sem_t global;
  double key_rate_value;
  rein::keyed<bucket_t> key_rate_stage;
  // The pacing margin is off: a 429 would change the rates, and the model's oracle keeps them fixed (the
  // margin only ever lowers a rate, as set_rate does; tests/async/token_bucket.cpp covers it).
  bucket_t shared{io.get_executor(), rein::token_bucket_options{.rate = shared_rate, .capacity = burst, .margin = {.max = 0}}};

  using throttle_type = std::conditional_t<
      RatesFirst,
      rein::throttle<rein::detail::rates_first_t, rein::keyed<gate_t>, rein::keyed<sem_t>, sem_t,
                     rein::keyed<bucket_t>, bucket_t>,
      rein::throttle<rein::keyed<gate_t>, rein::keyed<sem_t>, sem_t, rein::keyed<bucket_t>, bucket_t>>;
  std::unique_ptr<throttle_type> throttle;

  world(std::size_t global_permits, double per_key_rate)
      : global(io.get_executor(), global_permits),
        key_rate_value(per_key_rate),
        key_rate_stage(io.get_executor(), rein::keyed_options{},
                       rein::token_bucket_options{.rate = per_key_rate, .capacity = burst, .margin = {.max = 0}}) {
    if constexpr (RatesFirst)
      throttle = std::make_unique<throttle_type>(rein::detail::rates_first_t{}, gates, per_key, global, key_rate_stage,
                                                 shared);
    else
      throttle = std::make_unique<throttle_type>(gates, per_key, global, key_rate_stage, shared);
  }
};

template <bool RatesFirst>
using guard_of = typename world<RatesFirst>::throttle_type::guard;

template <bool RatesFirst>
struct caller {
  std::string key;
  std::optional<std::int64_t> deadline_ms;
  bool started = false;
  bool done = false;  // completed with an error, or admitted and then finished
  bool admitted = false;
  rein::error_code error;
  guard_of<RatesFirst> guard;
  std::shared_ptr<net::cancellation_signal> signal = std::make_shared<net::cancellation_signal>();
  std::int64_t arrived_ms = 0;
  std::int64_t admitted_ms = -1;
};

// Admission instants per rate stage: "" is the shared rate, a key its own.
using sends = std::map<std::string, std::vector<std::int64_t>>;

// burst + rate x window, for every window between two admissions (integer milliseconds, exact).
std::optional<std::string> bound_violation(const std::vector<std::int64_t>& at, double rate, const std::string& what) {
  const auto per_ms = static_cast<std::int64_t>(rate * 1000.0 + 0.5);  // tokens per 1000 s, exact here
  for (std::size_t i = 0; i < at.size(); ++i)
    for (std::size_t j = i; j < at.size(); ++j) {
      const auto count = static_cast<std::int64_t>(j - i + 1);
      if (count * 1000 * 1000 > burst * 1000 * 1000 + per_ms * (at[j] - at[i])) {
        std::ostringstream os;
        os << what << ": " << count << " admissions in [" << at[i] << " ms, " << at[j] << " ms]";
        return os.str();
      }
    }
  return std::nullopt;
}

double model_tokens(const std::vector<std::int64_t>& at, double rate) {
  model_bucket b({.rate = rate, .capacity = burst}, manual_clock::time_point{});
  for (std::int64_t t : at) (void)b.try_take(1, manual_clock::time_point(std::chrono::milliseconds(t)));
  return b.tokens(manual_clock::now());
}

// One run of the model: the callers, the events applied so far, and the checks.
template <bool RatesFirst>
class run {
 public:
  run(std::vector<std::string> keys, std::optional<std::int64_t> deadline_of_first, std::size_t global_permits = 2,
      double per_key_rate = key_rate)
      : w_(global_permits, per_key_rate) {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      callers_.push_back(std::make_unique<caller<RatesFirst>>());
      callers_.back()->key = keys[i];
      if (i == 0) callers_.back()->deadline_ms = deadline_of_first;
    }
  }

  // Pending acquires hold keyed handles: they end (cancelled) before the stages go.
  ~run() {
    for (auto& c : callers_)
      if (c->started && !c->done) c->signal->emit(net::cancellation_type::terminal);
    rein_test::poll(w_.io);
    callers_.clear();
  }
  run(const run&) = delete;
  run& operator=(const run&) = delete;

  enum class kind { start, complete, reject, cancel, tick };
  struct event {
    kind what;
    std::size_t who;
  };

  std::vector<event> enabled(int ticks_left) const {
    std::vector<event> out;
    for (std::size_t i = 0; i < callers_.size(); ++i) {
      const auto& c = *callers_[i];
      if (!c.started) out.push_back({kind::start, i});
      else if (c.admitted && !c.done) out.push_back({kind::complete, i}), out.push_back({kind::reject, i});
      else if (!c.done) out.push_back({kind::cancel, i});
    }
    if (ticks_left > 0) out.push_back({kind::tick, 0});
    return out;
  }

  void apply(const event& e) {
    auto& c = *callers_[e.who];
    switch (e.what) {
      case kind::start: start(e.who); break;
      case kind::complete: finish(c, false); break;
      case kind::reject: finish(c, true); break;
      case kind::cancel: c.signal->emit(net::cancellation_type::terminal); break;
      case kind::tick: manual_clock::advance(500ms); break;
    }
    rein_test::poll(w_.io);
  }

  // Every invariant, at quiescence. Returns what failed, if anything.
  std::optional<std::string> check() const {
    for (const auto& [stage, at] : sends_) {
      const double rate = stage.empty() ? shared_rate : w_.key_rate_value;
      if (auto v = bound_violation(at, rate, stage.empty() ? "shared rate" : "rate of key " + stage)) return v;
      if (!stage.empty() && !w_.key_rate_stage.contains(stage)) continue;  // evicted when full: nothing held
      const double real = stage.empty() ? w_.shared.tokens() : w_.key_rate_stage.snapshot(stage)->tokens;
      if (real != model_tokens(at, rate)) {
        std::ostringstream os;
        os << (stage.empty() ? std::string("shared rate") : "rate of key " + stage) << ": " << real
           << " tokens, but its admissions alone leave " << model_tokens(at, rate) << " (a waiter holds tokens)";
        return os.str();
      }
    }
    if (!sends_.count("") && w_.shared.tokens() != model_tokens({}, shared_rate))
      return std::string("shared rate: tokens held before any admission (a waiter holds tokens)");
    std::size_t in_flight = 0;
    for (const auto& c : callers_) in_flight += c->admitted && !c->done ? 1 : 0;
    const auto global = w_.global.snapshot().in_flight;
    const auto at_shared_rate = w_.shared.snapshot().waiting;
    if (global != in_flight + at_shared_rate) {
      std::ostringstream os;
      os << "global slots: " << global << " held, " << in_flight << " by admitted calls and " << at_shared_rate
         << " by callers at the shared rate (a caller waiting for its own key holds one)";
      return os.str();
    }
    return std::nullopt;
  }

  // Completes every admitted call and lets time pass until nobody waits; then everything must be at rest.
  std::optional<std::string> drain() {
    for (int step = 0; step < 1000; ++step) {
      for (auto& c : callers_)
        if (c->admitted && !c->done) finish(*c, false);
      rein_test::poll(w_.io);
      if (auto v = check()) return v;
      if (std::all_of(callers_.begin(), callers_.end(), [](const auto& c) { return c->done || !c->started; })) break;
      manual_clock::advance(500ms);
      rein_test::poll(w_.io);
    }
    for (const auto& c : callers_)
      if (c->started && !c->done) return std::string("a caller neither admitted nor failed: deadlock or hang");
    if (w_.global.snapshot().in_flight != 0) return std::string("a global slot was not given back");
    for (const auto& c : callers_) {
      if (auto s = w_.per_key.snapshot(c->key); s && (s->in_flight != 0 || s->waiting != 0))
        return "key " + c->key + ": its permit was not given back";
    }
    return std::nullopt;
  }

  const auto& callers() const { return callers_; }
  world<RatesFirst>& stages() { return w_; }

  void start(std::size_t i) {
    auto& c = *callers_[i];
    c.started = true;
    c.arrived_ms = now_ms();
    auto handler = [this, &c](rein::error_code ec, guard_of<RatesFirst> g) {
      if (ec) {
        c.error = ec;
        c.done = true;
        return;
      }
      c.admitted = true;
      c.admitted_ms = now_ms();
      c.guard = std::move(g);
      sends_[""].push_back(c.admitted_ms);
      sends_[c.key].push_back(c.admitted_ms);
    };
    auto token = net::bind_cancellation_slot(c.signal->slot(), std::move(handler));
    if (c.deadline_ms)
      w_.throttle->async_acquire_until(c.key, manual_clock::time_point(std::chrono::milliseconds(*c.deadline_ms)),
                                       std::move(token));
    else
      w_.throttle->async_acquire(c.key, std::move(token));
  }

  void finish(caller<RatesFirst>& c, bool too_many) {
    if (too_many) c.guard.reject(std::optional<manual_clock::duration>(1s));
    else c.guard.complete(rein::outcome::success);
    c.done = true;
  }

 private:
  world<RatesFirst> w_;
  std::vector<std::unique_ptr<caller<RatesFirst>>> callers_;
  sends sends_;
};

struct exploration {
  std::uint64_t leaves = 0;
  std::uint64_t events = 0;
  std::optional<std::string> violation;  // the first one found, with the schedule that led to it
};

// Depth-first over every schedule: each node replays its prefix on fresh stages (Asio objects cannot be
// copied), applies one more event and checks; a leaf (no event left) also drains.
template <bool RatesFirst>
void explore(const std::vector<std::string>& keys, std::vector<typename run<RatesFirst>::event>& prefix, int ticks,
             exploration& out) {
  if (out.violation) return;
  rein_test::manual_clock_at_epoch epoch;
  run<RatesFirst> r(keys, 1000);
  int ticks_used = 0;
  for (const auto& e : prefix) {
    r.apply(e);
    ticks_used += e.what == run<RatesFirst>::kind::tick ? 1 : 0;
  }
  ++out.events;
  auto describe = [&](const std::string& what) {
    std::ostringstream os;
    os << what << " after:";
    const char* names[] = {"start", "complete", "429", "cancel", "tick"};
    for (const auto& e : prefix) os << ' ' << names[static_cast<int>(e.what)] << '(' << e.who << ')';
    return os.str();
  };
  if (auto v = r.check()) {
    out.violation = describe(*v);
    return;
  }
  const auto next = r.enabled(ticks - ticks_used);
  if (next.empty()) {
    ++out.leaves;
    if (auto v = r.drain()) out.violation = describe(*v);
    return;
  }
  for (const auto& e : next) {
    prefix.push_back(e);
    explore<RatesFirst>(keys, prefix, ticks, out);
    prefix.pop_back();
    if (out.violation) return;
  }
}

// The quick tier (CI): two time steps, one under a sanitizer (several times slower); the thorough one: four.
int model_ticks() { return rein_test::model_scope(2, 1, 4); }

void report(const char* what, const exploration& out) {
  if (std::getenv("REIN_MODEL_VERBOSE") != nullptr)
    std::printf("%s: %llu schedules, %llu events\n", what, static_cast<unsigned long long>(out.leaves),
                static_cast<unsigned long long>(out.events));
}

const std::vector<std::vector<std::string>> key_patterns{{"A", "A", "A"}, {"A", "A", "B"}, {"A", "B", "C"}};

}  // namespace

TEST_CASE("model check: every schedule of 3 callers keeps the send-time bound and holds no slot across keys",
          "[throttle][model]") {
  const int ticks = model_ticks();
  for (const auto& keys : key_patterns) {
    DYNAMIC_SECTION("keys " << keys[0] << keys[1] << keys[2]) {
      exploration out;
      std::vector<run<false>::event> prefix;
      explore<false>(keys, prefix, ticks, out);
      report((keys[0] + keys[1] + keys[2]).c_str(), out);
      INFO(out.violation.value_or("none"));
      CHECK_FALSE(out.violation.has_value());
      CHECK(out.leaves > (ticks > 1 ? 1000u : 100u));  // the scope is what the comment says, not a vacuous search
    }
  }
}

TEST_CASE("model check: the order rein used before (rates first) is caught", "[throttle][model]") {
  exploration out;
  std::vector<run<true>::event> prefix;
  explore<true>({"A", "A", "B"}, prefix, model_ticks(), out);
  REQUIRE(out.violation.has_value());
  INFO(*out.violation);
  CHECK(out.violation->find("holds") != std::string::npos);
}

TEST_CASE("randomized: many keys, random arrivals, completions, 429s, cancellations and deadlines",
          "[throttle][model]") {
  for (std::uint32_t seed = 1; seed <= 100; ++seed) {
    DYNAMIC_SECTION("seed " << seed) {
      rein_test::manual_clock_at_epoch epoch;
      std::mt19937 rng(seed);
      std::vector<std::string> keys;
      std::vector<std::string> names{"a", "b", "c", "d", "e", "f", "g", "h"};
      for (int i = 0; i < 120; ++i) keys.push_back(names[rng() % names.size()]);
      run<false> r(keys, std::nullopt, 3);
      std::size_t next = 0;
      std::optional<std::string> violation;
      for (int step = 0; step < 800 && !violation; ++step) {
        const auto roll = rng() % 10;
        if (roll < 3 && next < keys.size()) {
          if (rng() % 3 == 0) r.callers()[next]->deadline_ms = now_ms() + 200 * static_cast<std::int64_t>(1 + rng() % 10);
          r.apply({run<false>::kind::start, next++});
        } else if (roll < 6) {
          std::vector<std::size_t> in_flight;
          for (std::size_t i = 0; i < r.callers().size(); ++i)
            if (r.callers()[i]->admitted && !r.callers()[i]->done) in_flight.push_back(i);
          if (!in_flight.empty())
            r.apply({rng() % 8 == 0 ? run<false>::kind::reject : run<false>::kind::complete,
                     in_flight[rng() % in_flight.size()]});
        } else if (roll < 7) {
          std::vector<std::size_t> waiting;
          for (std::size_t i = 0; i < r.callers().size(); ++i)
            if (r.callers()[i]->started && !r.callers()[i]->admitted && !r.callers()[i]->done) waiting.push_back(i);
          if (!waiting.empty()) r.apply({run<false>::kind::cancel, waiting[rng() % waiting.size()]});
        } else {
          manual_clock::advance(std::chrono::milliseconds(50 * (1 + rng() % 10)));
          rein_test::poll(r.stages().io);
        }
        violation = r.check();
      }
      if (!violation) violation = r.drain();
      INFO(violation.value_or("none"));
      CHECK_FALSE(violation.has_value());
      std::size_t admitted = 0;
      for (const auto& c : r.callers()) admitted += c->admitted ? 1 : 0;
      CHECK(admitted > 10);  // the schedule did something
    }
  }
}

TEST_CASE("an idle key behind a busy key's backlog is admitted within one spacing of the shared rate",
          "[throttle][model]") {
  for (bool rates_first : {false, true}) {
    DYNAMIC_SECTION((rates_first ? "rates first (the old order)" : "rein's order")) {
      rein_test::manual_clock_at_epoch epoch;
      // 30 callers of one busy key (permit 1, each call lasts 2 s), then every 1.5 s a caller of a new key;
      // the keys' own rates (100/s) do not bind, the shared one (2/s) does.
      auto scenario = [](auto& r, std::size_t busy) {
        std::int64_t worst = 0;
        std::size_t next_idle = busy;
        for (std::size_t i = 0; i < busy; ++i) r.start(i);
        rein_test::poll(r.stages().io);
        for (int step = 0; step < 400; ++step) {  // 50 ms steps: 20 s
          if (step % 30 == 0 && next_idle < r.callers().size()) r.start(next_idle++);
          for (const auto& c : r.callers())
            if (c->admitted && !c->done && rein_test::since_epoch() - std::chrono::milliseconds(c->admitted_ms) >= 2s)
              r.finish(*c, false);
          manual_clock::advance(50ms);
          rein_test::poll(r.stages().io);
        }
        for (std::size_t i = busy; i < next_idle; ++i) {
          const auto& c = *r.callers()[i];
          worst = std::max(worst, c.admitted ? c.admitted_ms - c.arrived_ms : std::int64_t{1} << 40);
        }
        return worst;
      };
      std::vector<std::string> keys(30, "busy");
      for (int i = 0; i < 20; ++i) keys.push_back("idle" + std::to_string(i));
      std::int64_t worst = 0;
      if (rates_first) {
        run<true> r(keys, std::nullopt, 100, 100.0);
        worst = scenario(r, 30);
      } else {
        run<false> r(keys, std::nullopt, 100, 100.0);
        worst = scenario(r, 30);
      }
      INFO("worst wait of an idle key's caller: " << worst << " ms");
      if (rates_first) CHECK(worst > 500);  // the busy key's callers hold the shared tokens
      else CHECK(worst <= 500);             // one spacing of the shared rate (2/s)
    }
  }
}
