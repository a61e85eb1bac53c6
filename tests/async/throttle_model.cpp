// The throttle's two promises, checked on its admission machine (rein/detail/throttle_admission.hpp, the
// steps both of the throttle's doors drive) run directly over a model of its stages, with no executor: on
// every interleaving of a small scope and on random schedules at scale (exact, integer milliseconds):
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
// The model of the stages: an admission stage (global, asked first: for 1 s after a 429 it refuses every call at
// once, until it hears of a success; it hears only admitted calls' outcomes), a key's quota gate (paused 1 s by a
// 429, its waiters let through when it opens), a per-key permit (1), global permits (2), a per-key token bucket
// (1/s, burst 1) and a shared one (2/s, burst 1), each with a FIFO line that a try does not overtake; step 3 waits
// in the key bucket's own line, whose grant takes the token (the caller's claim, refunded before any other wait),
// and a deadline ends a caller's wait. The exhaustive check explores every order of
// the events below for 3 callers spread over keys in each pattern (one key, two keys, three keys): start / complete
// / 429 / cancel / timeout (caller 0 has a deadline of 1 s) / time step (500 ms, up to `ticks` of them), with the
// invariants asserted after every event and the drain at every leaf (and that a caller the admission stage refused
// held nothing and failed with errc::admission_refused). It runs the same model on a second machine, defined here,
// for the order rein used before (rates taken first), and requires that it finds a violation, so the check can
// fail. The randomized test runs the same invariants over many keys and long schedules. REIN_MODEL_THOROUGH=1
// raises the scope (more time steps); CI runs the quick tier.
#include "support/catch.hpp"
#include "support/manual_time.hpp"
#include "support/model_tier.hpp"

#include <rein/algo/token_bucket.hpp>
#include <rein/detail/throttle_admission.hpp>
#include <rein/error.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using rein_test::manual_clock;
using rein::detail::admission_event;
using rein::detail::admission_step;
using rein::detail::stage_rank;

namespace {

using model_bucket = rein::algo::basic_token_bucket<manual_clock>;

constexpr double shared_rate = 2.0;  // per second: one token every 500 ms
constexpr double key_rate = 1.0;
constexpr std::int64_t burst = 1;
constexpr std::size_t npos = static_cast<std::size_t>(-1);

manual_clock::time_point at_ms(std::int64_t ms) { return manual_clock::time_point(std::chrono::milliseconds(ms)); }

// The model's stage list, in admission order: admission -> gate -> per-key permit -> global permit -> per-key
// rate -> shared rate.
enum : std::size_t { admission_at, gate_at, per_key_at, global_at, key_rate_at, shared_at, stage_count };
struct stage_layout {
  static constexpr std::array<stage_rank, stage_count> ranks{stage_rank::admission,          stage_rank::gate,
                                                             stage_rank::per_key_concurrency,
                                                             stage_rank::global_concurrency, stage_rank::rate,
                                                             stage_rank::rate};
  static constexpr std::array<bool, stage_count> keyed{false, true, true, false, true, false};
};

// rein's order: the machine the throttle runs.
using rein_order = rein::detail::throttle_admission<stage_layout>;

// The order rein used before rates were taken at the moment of sending, as a second machine of the same
// steps: a refused first try gives everything back; then the gates, each rate (its units taken, and held
// while the caller waits at the stages after it), the per-key permit, the global one; a gate paused
// meanwhile gives the permits back (the rate units stay taken).
class rates_first {
 public:
  // A give-back of this order's own: every permit, or everything (the permits and the rate units). rein's
  // order never asks for either, so its machine has no such step.
  enum class give_back : std::uint8_t { none, permits, everything };
  // What it asks: one of the admission machine's steps, or (back set) one of its own give-backs.
  struct step {
    step(admission_step s) : common(s) {}  // a step of rein's machine is one of this one's
    step(give_back g) : back(g) {}
    admission_step common = admission_step::fail;  // unused when back is set
    give_back back = give_back::none;
  };

  explicit rates_first(bool waits) noexcept : waits_(waits) {}

  step resume(admission_event e, std::size_t stage = npos, rein::try_status = rein::try_status::busy) {
    switch (point_) {
      case point::start: return go(point::pinning, admission_step::pin);
      case point::pinning: return go(point::first_try, admission_step::try_first);
      case point::first_try:
        if (e == admission_event::took) return go(point::end, admission_step::done);
        at_ = stage;
        if (!waits_) return go(point::end, admission_step::fail);
        gate_passed_ = stage > gate_at;  // passed in this instant: not asked again in the first round
        trying_ = false;
        return go(point::round, give_back::everything);
      case point::round: return next_take();
      case point::taking:
        at_ = stage_;
        if (e == admission_event::refused) return go(point::taken, admission_step::wait_line);
        [[fallthrough]];
      case point::taken:
        if (stage_ != gate_at) held_ |= 1U << stage_;
        ++k_;
        return next_take();
      case point::checking:
        if (e == admission_event::open) return go(point::end, admission_step::done);
        held_ &= ~((1U << per_key_at) | (1U << global_at));
        k_ = 0;
        return go(point::round, give_back::permits);
      case point::end: break;
    }
    return admission_step::fail;
  }
  step fail() { return go(point::end, admission_step::fail); }
  std::size_t stage() const { return stage_; }
  std::size_t at() const { return at_; }
  std::size_t held_rate() const { return npos; }
  rein::error_code error() const { return {}; }
  bool trying() const { return trying_; }

 private:
  enum class point { start, pinning, first_try, round, taking, taken, checking, end };
  static constexpr std::array<std::size_t, 5> order{gate_at, key_rate_at, shared_at, per_key_at, global_at};

  step go(point p, step s) {
    point_ = p;
    return s;
  }
  // The round's next stage from k_ that is not held (a gate: not passed by the first try); after the last,
  // the gates' check.
  step next_take() {
    for (; k_ < order.size(); ++k_) {
      stage_ = order[k_];
      if (stage_ == gate_at ? first_ && gate_passed_ : (held_ >> stage_ & 1U) != 0) continue;
      return go(point::taking, admission_step::take);
    }
    first_ = false;
    return go(point::checking, admission_step::check_gates);
  }

  std::size_t k_ = 0;
  std::size_t stage_ = npos;
  std::size_t at_ = npos;
  unsigned held_ = 0;
  point point_ = point::start;
  bool waits_;
  bool trying_ = true;
  bool first_ = true;
  bool gate_passed_ = false;
};

template <class Machine>
struct caller {
  std::string key;
  std::optional<std::int64_t> deadline_ms;
  bool started = false;
  bool done = false;  // completed with an error, or admitted and then finished
  bool admitted = false;
  rein::error_code error;
  std::int64_t arrived_ms = 0;
  std::int64_t admitted_ms = -1;
  Machine machine{true};
  // What it holds.
  bool per_key = false;
  bool global = false;
  std::array<bool, stage_count> units{};
  // Where it waits: on a stage's line.
  std::size_t line = npos;
  bool waits() const { return line != npos; }
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

// The tokens a bucket has at `now` after the admissions alone.
double model_tokens(const std::vector<std::int64_t>& at, double rate, std::int64_t now) {
  model_bucket b({.rate = rate, .capacity = burst}, manual_clock::time_point{});
  for (std::int64_t t : at) (void)b.try_take(1, at_ms(t));
  return b.tokens(at_ms(now));
}

// One run of the model: the stages, the callers, the events applied so far, and the checks. A value: the
// exhaustive search copies it at each branch.
template <class Machine>
class run {
 public:
  run(std::vector<std::string> keys, std::optional<std::int64_t> deadline_of_first, std::size_t global_permits = 2,
      double per_key_rate = key_rate)
      : global_limit_(global_permits), key_rate_value_(per_key_rate) {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      callers_.emplace_back();
      callers_.back().key = keys[i];
      if (i == 0) callers_.back().deadline_ms = deadline_of_first;
    }
  }

  enum class kind { start, complete, reject, cancel, tick };
  struct event {
    kind what;
    std::size_t who;
  };

  std::vector<event> enabled(int ticks_left) const {
    std::vector<event> out;
    for (std::size_t i = 0; i < callers_.size(); ++i) {
      const auto& c = callers_[i];
      if (!c.started) out.push_back({kind::start, i});
      else if (c.admitted && !c.done) out.push_back({kind::complete, i}), out.push_back({kind::reject, i});
      else if (!c.done) out.push_back({kind::cancel, i});
    }
    if (ticks_left > 0) out.push_back({kind::tick, 0});
    return out;
  }

  void apply(const event& e) {
    auto& c = callers_[e.who];
    switch (e.what) {
      case kind::start: start(e.who); break;
      case kind::complete: finish(c, false); break;
      case kind::reject: finish(c, true); break;
      case kind::cancel: cancel(e.who); break;
      case kind::tick: advance(500); break;
    }
  }

  // Every invariant, at rest. Returns what failed, if anything.
  std::optional<std::string> check() const {
    if (fault_) return fault_;
    for (const auto& [stage, at] : sends_)
      if (auto v = bound_violation(at, stage.empty() ? shared_rate : key_rate_value_,
                                   stage.empty() ? "shared rate" : "rate of key " + stage))
        return v;
    if (auto v = tokens_check("shared rate", shared_, "", shared_rate)) return v;
    for (const auto& [key, b] : key_buckets_)
      if (auto v = tokens_check("rate of key " + key, b, key, key_rate_value_)) return v;
    std::size_t in_flight = 0;
    for (const auto& c : callers_) in_flight += c.admitted && !c.done ? 1 : 0;
    std::size_t at_shared_rate = 0;
    if (auto it = lines_[shared_at].find(""); it != lines_[shared_at].end()) at_shared_rate = it->second.size();
    if (global_held_ != in_flight + at_shared_rate) {
      std::ostringstream os;
      os << "global slots: " << global_held_ << " held, " << in_flight << " by admitted calls and " << at_shared_rate
         << " by callers at the shared rate (a caller waiting for its own key holds one)";
      return os.str();
    }
    return std::nullopt;
  }

  // Completes every admitted call and lets time pass until nobody waits; then everything must be at rest.
  std::optional<std::string> drain() {
    for (int step = 0; step < 1000; ++step) {
      for (auto& c : callers_)
        if (c.admitted && !c.done) finish(c, false);
      if (auto v = check()) return v;
      if (std::all_of(callers_.begin(), callers_.end(), [](const auto& c) { return c.done || !c.started; })) break;
      advance(500);
    }
    for (const auto& c : callers_)
      if (c.started && !c.done) return std::string("a caller neither admitted nor failed: deadlock or hang");
    if (global_held_ != 0) return std::string("a global slot was not given back");
    for (const auto& [key, held] : per_key_held_)
      if (held != 0 || !line(per_key_at, key).empty()) return "key " + key + ": its permit was not given back";
    return std::nullopt;
  }

  const std::vector<caller<Machine>>& callers() const { return callers_; }
  void set_deadline(std::size_t i, std::int64_t ms) { callers_[i].deadline_ms = ms; }
  std::int64_t now() const { return now_; }
  std::size_t refused_at_admission() const { return refused_at_admission_; }

  void start(std::size_t i) {
    auto& c = callers_[i];
    c.started = true;
    c.arrived_ms = now_;
    drive(i, c.machine.resume(admission_event::start));
    settle();
  }

  void finish(caller<Machine>& c, bool too_many) {
    refusing_until_ = too_many ? now_ + 1000 : now_;  // the admission stage hears admitted calls' outcomes only
    release_per_key(c);
    release_global(c);
    c.units = {};  // spent
    if (too_many) paused_until_[c.key] = now_ + 1000;
    c.done = true;
    settle();
  }

  void cancel(std::size_t i) {
    auto& c = callers_[i];
    if (!c.waits()) return;
    stop_waiting(i);
    end_with(i, make_error_code(std::errc::operation_canceled));
    settle();
  }

  void advance(std::int64_t ms) {
    now_ += ms;
    settle();
  }

 private:
  // --- the model of the stages ---

  std::deque<std::size_t>& line(std::size_t stage, const std::string& key) {
    return lines_[stage][stage_layout::keyed[stage] ? key : std::string()];
  }
  std::deque<std::size_t> line(std::size_t stage, const std::string& key) const {
    auto it = lines_[stage].find(stage_layout::keyed[stage] ? key : std::string());
    return it == lines_[stage].end() ? std::deque<std::size_t>{} : it->second;
  }
  model_bucket& bucket(std::size_t stage, const std::string& key) {
    if (stage == shared_at) return shared_;
    return key_buckets_.try_emplace(key, model_bucket({.rate = key_rate_value_, .capacity = burst}, at_ms(now_)))
        .first->second;
  }
  bool gate_open(const std::string& key) const {
    auto it = paused_until_.find(key);
    return it == paused_until_.end() || now_ >= it->second;
  }

  // A try: refused behind the stage's own line.
  bool take(caller<Machine>& c, std::size_t stage) {
    if (!line(stage, c.key).empty()) return false;
    return grant(c, stage);
  }
  // What the stage gives its line's head, or a try: whether it had room.
  bool grant(caller<Machine>& c, std::size_t stage) {
    switch (stage) {
      case gate_at: return gate_open(c.key);
      case per_key_at:
        if (per_key_held_[c.key] != 0) return false;
        ++per_key_held_[c.key];
        c.per_key = true;
        return true;
      case global_at:
        if (global_held_ >= global_limit_) return false;
        ++global_held_;
        c.global = true;
        return true;
      default:
        if (bucket(stage, c.key).try_take(1, at_ms(now_)) != rein::algo::take_result::allowed) return false;
        c.units[stage] = true;
        return true;
    }
  }
  bool ready(caller<Machine>& c, std::size_t stage) {
    return line(stage, c.key).empty() && bucket(stage, c.key).ready_at(1, at_ms(now_)) <= at_ms(now_);
  }
  void refund(caller<Machine>& c) {
    for (std::size_t i : {key_rate_at, shared_at})
      if (std::exchange(c.units[i], false)) bucket(i, c.key).refund(1, at_ms(now_));
  }
  void release_per_key(caller<Machine>& c) {
    if (std::exchange(c.per_key, false)) --per_key_held_[c.key];
  }
  void release_global(caller<Machine>& c) {
    if (std::exchange(c.global, false)) --global_held_;
  }
  // Every gate and permit in list order, then the rates, all or nothing (the throttle's try_first).
  std::size_t try_first(caller<Machine>& c) {
    for (std::size_t i : {gate_at, per_key_at, global_at})
      if (!take(c, i)) return i;
    return take_rates(c, npos);
  }
  std::size_t take_rates(caller<Machine>& c, std::size_t held) {
    for (std::size_t i : {key_rate_at, shared_at})
      if (i != held && !ready(c, i)) {
        refund(c);
        return i;
      }
    for (std::size_t i : {key_rate_at, shared_at})
      if (i != held && !take(c, i)) {
        refund(c);
        return i;
      }
    return npos;
  }

  // --- the driver: the machine's steps on the model, until it waits, admits or fails ---

  using step_type = decltype(std::declval<Machine&>().resume(admission_event::start));

  // rein's machine asks only its own steps; rates_first may ask one of its give-backs (done here, at once).
  static admission_step rein_step(admission_step s) { return s; }
  static admission_step rein_step(const rates_first::step& s) { return s.common; }
  bool gave_back(caller<Machine>&, admission_step) { return false; }
  bool gave_back(caller<Machine>& c, const rates_first::step& s) {
    if (s.back == rates_first::give_back::none) return false;
    if (s.back == rates_first::give_back::everything) refund(c);
    release_per_key(c);
    release_global(c);
    return true;
  }

  void drive(std::size_t who, step_type s) {
    caller<Machine>& c = callers_[who];
    for (;;) {
      if (gave_back(c, s)) {
        s = c.machine.resume(admission_event::took);
        continue;
      }
      admission_event e = admission_event::took;
      std::size_t where = npos;
      switch (rein_step(s)) {
        case admission_step::ask_admission: where = now_ < refusing_until_ ? admission_at : npos; break;
        case admission_step::pin: break;
        case admission_step::try_first: where = try_first(c); break;
        case admission_step::take: e = take(c, c.machine.stage()) ? e : admission_event::refused; break;
        case admission_step::take_rates: where = take_rates(c, c.machine.held_rate()); break;
        case admission_step::ask_ready:
          e = ready(c, c.machine.stage()) ? admission_event::ready : admission_event::not_ready;
          break;
        case admission_step::release_global: release_global(c); break;
        case admission_step::refund_rates: refund(c); break;
        case admission_step::check_gates: e = gate_open(c.key) ? admission_event::open : admission_event::paused; break;
        case admission_step::wait_line:
          c.line = c.machine.stage();
          line(c.line, c.key).push_back(who);
          return;
        case admission_step::done:
          c.admitted = true;
          c.admitted_ms = now_;
          sends_[""].push_back(now_);
          sends_[c.key].push_back(now_);
          return;
        case admission_step::fail:  // the guard not admitted gives back what it holds
          if (c.machine.error() == rein::errc::admission_refused) ++refused_at_admission_;
          if (c.machine.error() == rein::errc::admission_refused &&
              (c.per_key || c.global || c.units[key_rate_at] || c.units[shared_at] || c.machine.at() != admission_at))
            fault_ = "a caller the admission stage refused took something, or was said refused elsewhere";
          refund(c);
          release_per_key(c);
          release_global(c);
          c.done = true;
          if (!c.error) c.error = c.machine.error();
          return;
      }
      if (where != npos) e = admission_event::refused;
      s = c.machine.resume(e, where);
    }
  }

  void stop_waiting(std::size_t who) {
    auto& c = callers_[who];
    if (c.line != npos) {
      auto& l = line(c.line, c.key);
      l.erase(std::find(l.begin(), l.end(), who));
    }
    c.line = npos;
  }

  void end_with(std::size_t who, rein::error_code ec) {
    callers_[who].error = ec;
    drive(who, callers_[who].machine.fail());
  }

  // Lets every stage do what it can at now_: lines served head first, deadlines passed failed, until nothing
  // moves.
  void settle() {
    for (bool moved = true; moved;) {
      moved = false;
      for (std::size_t stage = 0; stage < stage_count; ++stage)
        for (auto& [key, l] : lines_[stage])
          while (!l.empty()) {
            const std::size_t who = l.front();
            auto& c = callers_[who];
            if (!grant(c, stage)) break;
            l.pop_front();
            c.line = npos;
            drive(who, c.machine.resume(admission_event::took));
            moved = true;
          }
      for (std::size_t who = 0; who < callers_.size(); ++who) {
        auto& c = callers_[who];
        if (c.waits() && c.deadline_ms && *c.deadline_ms <= now_) {
          stop_waiting(who);
          end_with(who, make_error_code(rein::errc::timed_out));
          moved = true;
        }
      }
    }
  }

  std::optional<std::string> tokens_check(const std::string& what, const model_bucket& b, const std::string& key,
                                          double rate) const {
    auto it = sends_.find(key);
    const double expected = model_tokens(it == sends_.end() ? std::vector<std::int64_t>{} : it->second, rate, now_);
    const double real = b.tokens(at_ms(now_));
    if (real == expected) return std::nullopt;
    std::ostringstream os;
    os << what << ": " << real << " tokens, but its admissions alone leave " << expected << " (a waiter holds tokens)";
    return os.str();
  }

  std::int64_t now_ = 0;
  std::int64_t refusing_until_ = 0;  // the admission stage refuses every call until then
  std::size_t refused_at_admission_ = 0;  // the admission stage's state: the last call it heard of was a 429
  std::optional<std::string> fault_;
  std::size_t global_limit_;
  double key_rate_value_;
  std::size_t global_held_ = 0;
  std::map<std::string, int> per_key_held_;
  std::map<std::string, std::int64_t> paused_until_;
  std::map<std::string, model_bucket> key_buckets_;
  model_bucket shared_{{.rate = shared_rate, .capacity = burst}, at_ms(0)};
  std::array<std::map<std::string, std::deque<std::size_t>>, stage_count> lines_;
  std::vector<caller<Machine>> callers_;
  sends sends_;
};

struct exploration {
  std::uint64_t leaves = 0;
  std::uint64_t events = 0;
  std::uint64_t admission_refusals = 0;  // leaves where the admission stage refused a caller
  std::optional<std::string> violation;  // the first one found, with the schedule that led to it
};

// Depth-first over every schedule: each node is a copy of its parent's run with one more event applied,
// checked; a leaf (no event left) also drains.
template <class Machine>
void explore(const run<Machine>& r, std::vector<typename run<Machine>::event>& prefix, int ticks_left,
             exploration& out) {
  if (out.violation) return;
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
  const auto next = r.enabled(ticks_left);
  if (next.empty()) {
    ++out.leaves;
    run<Machine> last = r;
    if (auto v = last.drain()) out.violation = describe(*v);
    out.admission_refusals += last.refused_at_admission() != 0 ? 1 : 0;
    return;
  }
  for (const auto& e : next) {
    run<Machine> child = r;
    child.apply(e);
    prefix.push_back(e);
    explore(child, prefix, ticks_left - (e.what == run<Machine>::kind::tick ? 1 : 0), out);
    prefix.pop_back();
    if (out.violation) return;
  }
}

template <class Machine>
exploration explore_all(const std::vector<std::string>& keys, int ticks) {
  exploration out;
  std::vector<typename run<Machine>::event> prefix;
  explore(run<Machine>(keys, 1000), prefix, ticks, out);
  return out;
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
      const exploration out = explore_all<rein_order>(keys, ticks);
      report((keys[0] + keys[1] + keys[2]).c_str(), out);
      INFO(out.violation.value_or("none"));
      CHECK_FALSE(out.violation.has_value());
      CHECK(out.leaves > (ticks > 1 ? 1000u : 100u));  // the scope is what the comment says, not a vacuous search
      CHECK(out.admission_refusals > 0);              // and it reaches the admission stage's refusal
    }
  }
}

TEST_CASE("model check: the order rein used before (rates first) is caught", "[throttle][model]") {
  const exploration out = explore_all<rates_first>({"A", "A", "B"}, model_ticks());
  REQUIRE(out.violation.has_value());
  INFO(*out.violation);
  CHECK(out.violation->find("holds") != std::string::npos);
}

TEST_CASE("randomized: many keys, random arrivals, completions, 429s, cancellations and deadlines",
          "[throttle][model]") {
  using rein_run = run<rein_order>;
  for (std::uint32_t seed = 1; seed <= 100; ++seed) {
    DYNAMIC_SECTION("seed " << seed) {
      std::mt19937 rng(seed);
      std::vector<std::string> keys;
      std::vector<std::string> names{"a", "b", "c", "d", "e", "f", "g", "h"};
      for (int i = 0; i < 120; ++i) keys.push_back(names[rng() % names.size()]);
      rein_run r(keys, std::nullopt, 3);
      std::size_t next = 0;
      std::optional<std::string> violation;
      for (int step = 0; step < 800 && !violation; ++step) {
        const auto roll = rng() % 10;
        if (roll < 3 && next < keys.size()) {
          if (rng() % 3 == 0) r.set_deadline(next, r.now() + 200 * static_cast<std::int64_t>(1 + rng() % 10));
          r.apply({rein_run::kind::start, next++});
        } else if (roll < 6) {
          std::vector<std::size_t> in_flight;
          for (std::size_t i = 0; i < r.callers().size(); ++i)
            if (r.callers()[i].admitted && !r.callers()[i].done) in_flight.push_back(i);
          if (!in_flight.empty())
            r.apply({rng() % 8 == 0 ? rein_run::kind::reject : rein_run::kind::complete,
                     in_flight[rng() % in_flight.size()]});
        } else if (roll < 7) {
          std::vector<std::size_t> waiting;
          for (std::size_t i = 0; i < r.callers().size(); ++i)
            if (r.callers()[i].started && !r.callers()[i].admitted && !r.callers()[i].done) waiting.push_back(i);
          if (!waiting.empty()) r.apply({rein_run::kind::cancel, waiting[rng() % waiting.size()]});
        } else {
          r.advance(50 * static_cast<std::int64_t>(1 + rng() % 10));
        }
        violation = r.check();
      }
      if (!violation) violation = r.drain();
      INFO(violation.value_or("none"));
      CHECK_FALSE(violation.has_value());
      std::size_t admitted = 0;
      for (const auto& c : r.callers()) admitted += c.admitted ? 1 : 0;
      CHECK(admitted > 10);  // the schedule did something
    }
  }
}

TEST_CASE("an idle key behind a busy key's backlog is admitted within one spacing of the shared rate",
          "[throttle][model]") {
  // 30 callers of one busy key (permit 1, each call lasts 2 s), then every 1.5 s a caller of a new key; the
  // keys' own rates (100/s) do not bind, the shared one (2/s) does.
  auto scenario = [](auto& r, std::size_t busy) {
    std::int64_t worst = 0;
    std::size_t next_idle = busy;
    for (std::size_t i = 0; i < busy; ++i) r.start(i);
    for (int step = 0; step < 400; ++step) {  // 50 ms steps: 20 s
      if (step % 30 == 0 && next_idle < r.callers().size()) r.start(next_idle++);
      for (std::size_t i = 0; i < r.callers().size(); ++i) {
        const auto& c = r.callers()[i];
        if (c.admitted && !c.done && r.now() - c.admitted_ms >= 2000) r.apply({std::remove_cvref_t<decltype(r)>::kind::complete, i});
      }
      r.advance(50);
    }
    for (std::size_t i = busy; i < next_idle; ++i) {
      const auto& c = r.callers()[i];
      worst = std::max(worst, c.admitted ? c.admitted_ms - c.arrived_ms : std::int64_t{1} << 40);
    }
    return worst;
  };
  std::vector<std::string> keys(30, "busy");
  for (int i = 0; i < 20; ++i) keys.push_back("idle" + std::to_string(i));
  SECTION("rein's order") {
    run<rein_order> r(keys, std::nullopt, 100, 100.0);
    const std::int64_t worst = scenario(r, 30);
    INFO("worst wait of an idle key's caller: " << worst << " ms");
    CHECK(worst <= 500);  // one spacing of the shared rate (2/s)
  }
  SECTION("rates first (the old order)") {
    run<rates_first> r(keys, std::nullopt, 100, 100.0);
    const std::int64_t worst = scenario(r, 30);
    INFO("worst wait of an idle key's caller: " << worst << " ms");
    CHECK(worst > 500);  // the busy key's callers hold the shared tokens
  }
}

namespace {

// One step of a script: what the machine must ask for next (and about which stage), and what it is told.
struct scripted {
  admission_step step;
  std::size_t stage;
  admission_event answer;
  std::size_t where = npos;
  rein::try_status why = rein::try_status::busy;
};

// A list with two keyed rates (a key's requests and its tokens): global permit -> requests -> tokens.
struct two_keyed {
  static constexpr std::array<stage_rank, 3> ranks{stage_rank::global_concurrency, stage_rank::rate,
                                                   stage_rank::rate};
  static constexpr std::array<bool, 3> keyed{false, true, true};
};

// Runs `script` on the machine from `s` (the step it asked for last); returns the step it asks for after the
// last answer.
template <class Machine>
admission_step play_from(Machine& m, admission_step s, const std::vector<scripted>& script) {
  for (std::size_t i = 0; i < script.size(); ++i) {
    INFO("step " << i);
    REQUIRE(s == script[i].step);
    if (script[i].stage != npos) REQUIRE(m.stage() == script[i].stage);
    s = m.resume(script[i].answer, script[i].where, script[i].why);
  }
  return s;
}

// Runs `script` on the machine from its start.
template <class Machine>
admission_step play(Machine& m, const std::vector<scripted>& script) {
  return play_from(m, m.resume(admission_event::start), script);
}

}  // namespace

TEST_CASE("the admission machine's steps, exactly", "[throttle][model]") {
  using step = admission_step;
  using ev = admission_event;
  SECTION("try_acquire: a refusal ends it, at the stage that refused, with no error") {
    rein_order m(false);
    CHECK(play(m, {{step::ask_admission, npos, ev::took},
                   {step::pin, npos, ev::took}, {step::try_first, npos, ev::refused, global_at}}) == step::fail);
    CHECK(m.at() == global_at);
    CHECK_FALSE(m.error());
    rein_order pinned(false);
    CHECK(play(pinned, {{step::ask_admission, npos, ev::took}, {step::pin, npos, ev::refused, per_key_at}}) ==
          step::fail);
    CHECK(pinned.at() == per_key_at);
    CHECK_FALSE(pinned.error());
  }
  SECTION("a waiting acquire whose key cannot be made fails with queue_full there") {
    rein_order m(true);
    CHECK(play(m, {{step::ask_admission, npos, ev::took},
                   {step::pin, npos, ev::refused, key_rate_at}}) == step::fail);
    CHECK(m.at() == key_rate_at);
    CHECK(m.error() == rein::errc::queue_full);
  }
  SECTION("refused at the global permit: the key's rate first (nothing global held to give back), then the line") {
    rein_order m(true);
    CHECK(play(m, {{step::ask_admission, npos, ev::took},
                   {step::pin, npos, ev::took},
                   {step::try_first, npos, ev::refused, global_at},
                   {step::ask_ready, key_rate_at, ev::not_ready},
                   {step::wait_line, key_rate_at, ev::took},  // the claim: the key's token, taken
                   {step::take, global_at, ev::refused},
                   {step::refund_rates, npos, ev::took},  // refunded before the wait
                   {step::wait_line, global_at, ev::took},
                   {step::take_rates, npos, ev::refused, shared_at},
                   {step::wait_line, shared_at, ev::took},
                   {step::take_rates, npos, ev::took},
                   {step::check_gates, npos, ev::open}}) == step::done);
  }
  SECTION("refused at the key's rate: the global slot goes back before the wait; a pause sends it to the gate") {
    rein_order m(true);
    CHECK(m.trying());
    const step next = play(m, {{step::ask_admission, npos, ev::took},
                   {step::pin, npos, ev::took},
                   {step::try_first, npos, ev::refused, key_rate_at},
                   {step::ask_ready, key_rate_at, ev::not_ready},
                   {step::release_global, npos, ev::took},
                   {step::wait_line, key_rate_at, ev::took},
                   {step::take, global_at, ev::took}});
    REQUIRE(next == step::take_rates);
    CHECK(m.held_rate() == key_rate_at);  // the claim's units, taken at the line's grant in this instant
    CHECK(play_from(m, next, {{step::take_rates, npos, ev::took},
                   {step::check_gates, npos, ev::paused},
                   {step::refund_rates, npos, ev::took},
                   {step::release_global, npos, ev::took},
                   {step::take, gate_at, ev::refused},
                   {step::wait_line, gate_at, ev::took},
                   {step::ask_ready, key_rate_at, ev::ready},
                   {step::take, global_at, ev::took},
                   {step::take_rates, npos, ev::refused, key_rate_at},
                   {step::release_global, npos, ev::took},  // back to 3: into the line, not asked again
                   {step::wait_line, key_rate_at, ev::took},
                   {step::take, global_at, ev::took},
                   {step::take_rates, npos, ev::took},
                   {step::check_gates, npos, ev::open}}) == step::done);
    CHECK_FALSE(m.trying());
  }
  SECTION("two keyed rates that cannot be asked: the one step 5 finds short is waited on, never re-asked") {
    // Each looks ready at step 3 (a rate that cannot say); asking the short one again at the same instant
    // would loop: its line grants at once, the other is found short, and so on.
    rein::detail::throttle_admission<two_keyed> m(true);
    const step next = play(m, {{step::pin, npos, ev::took},
                               {step::try_first, npos, ev::refused, 2},
                               {step::ask_ready, 1, ev::ready},
                               {step::ask_ready, 2, ev::ready},  // the global permit: held since the try
                               {step::take_rates, npos, ev::refused, 2},
                               {step::ask_ready, 1, ev::ready},
                               {step::release_global, npos, ev::took},
                               {step::wait_line, 2, ev::took},  // tokens claimed in their line
                               {step::ask_ready, 1, ev::ready},
                               {step::take, 0, ev::took}});
    REQUIRE(next == step::take_rates);
    CHECK(m.held_rate() == 2);
    CHECK(play_from(m, next, {{step::take_rates, npos, ev::took}, {step::check_gates, npos, ev::open}}) == step::done);
  }
  SECTION("two keyed rates: at most one claim, refunded before the other's wait, then both looked at again") {
    rein::detail::throttle_admission<two_keyed> m(true);
    const step next = play(m, {{step::pin, npos, ev::took},
                               {step::try_first, npos, ev::refused, 1},
                               {step::ask_ready, 1, ev::not_ready},
                               {step::release_global, npos, ev::took},
                               {step::wait_line, 1, ev::took},     // requests claimed
                               {step::ask_ready, 2, ev::not_ready},  // tokens: no room yet
                               {step::refund_rates, npos, ev::took},  // the claim, refunded before the wait
                               {step::wait_line, 2, ev::took},     // tokens claimed
                               {step::ask_ready, 1, ev::not_ready},  // requests taken by another meanwhile
                               {step::refund_rates, npos, ev::took},
                               {step::wait_line, 1, ev::took},
                               {step::ask_ready, 2, ev::ready},
                               {step::take, 0, ev::refused},
                               {step::refund_rates, npos, ev::took},  // never held across the permit's wait
                               {step::wait_line, 0, ev::took}});
    REQUIRE(next == step::take_rates);
    CHECK(m.held_rate() == m.npos);  // the claim went back: every rate is taken now
    CHECK(play_from(m, next, {{step::take_rates, npos, ev::took}, {step::check_gates, npos, ev::open}}) == step::done);
  }
  SECTION("the shared rate's units are held while the others are taken; a closed rate fails") {
    rein_order m(true);
    play(m, {{step::ask_admission, npos, ev::took},
                   {step::pin, npos, ev::took},
             {step::try_first, npos, ev::refused, shared_at},
             {step::ask_ready, key_rate_at, ev::ready},
             {step::take_rates, npos, ev::refused, shared_at},
             {step::wait_line, shared_at, ev::took}});
    CHECK(m.held_rate() == shared_at);
    CHECK(m.resume(ev::refused, shared_at, rein::try_status::closed) == step::fail);
    CHECK(m.at() == shared_at);
    CHECK(m.error() == rein::errc::closed);
  }
  SECTION("an admission stage's refusal ends either door at once, before any pin or take") {
    rein_order tried(false);
    CHECK(play(tried, {{step::ask_admission, npos, ev::refused, admission_at}}) == step::fail);
    CHECK(tried.at() == admission_at);
    CHECK_FALSE(tried.error());
    rein_order waiting(true);
    CHECK(play(waiting, {{step::ask_admission, npos, ev::refused, admission_at}}) == step::fail);
    CHECK(waiting.at() == admission_at);
    CHECK(waiting.error() == rein::errc::admission_refused);
    CHECK(waiting.resume(ev::took) == step::fail);  // over
  }
  SECTION("a failed wait ends it where it waits") {
    rein_order m(true);
    CHECK(play(m, {{step::ask_admission, npos, ev::took},
                   {step::pin, npos, ev::took},
                   {step::try_first, npos, ev::refused, per_key_at},
                   {step::take, per_key_at, ev::refused}}) == step::wait_line);
    CHECK(m.fail() == step::fail);
    CHECK(m.at() == per_key_at);
    CHECK(m.resume(ev::took) == step::fail);  // over
  }
}
