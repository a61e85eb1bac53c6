// The degrading-upstream experiment in real time, on Asio timers.
//
// An upstream serves 16 calls at 5 ms each; past its capacity every extra call inside adds 5 ms to the next
// one, and past 25 inside it fails. At 250 ms its capacity drops to 4 (scenario B: back to 16 at 600 ms).
// Two calls arrive every millisecond for half a second, and each one does what a service would do:
//
//     rein::permit slot = co_await limiter.acquire();
//     ... call the upstream ...
//     slot.complete(ok ? rein::outcome::success : rein::outcome::congestion);
//
// Five strategies run side by side, each with its own limiter and its own copy of the upstream, on one
// io_context thread: a fixed rein::semaphore(16), a textbook AIMD, rein's tuned AIMD and gradient with their
// default options, and an oracle that is told the true capacity. It prints how each one did and a timeline of
// its limit against the true capacity every 25 ms.
//
//     degrading_upstream [--scenario a|b] [--strategy fixed,aimd,tuned_aimd,gradient,oracle] [--csv FILE]
//                        [--no-timeline] [--check]
//
// --csv writes the timelines (strategy,scenario,t_ms,limit,capacity) for plotting; --check exits with status 1
// if tuned_aimd, the recommended default, misses the real-time target (p95 service time at most 12 ms, no
// failures); gradient's result is printed too. The
// same experiment runs exactly on a manual clock in tests/async/degrading_upstream.cpp.
#include "usage.hpp"

#include <rein/adaptive_limiter.hpp>
#include <rein/semaphore.hpp>
#include <rein/testing/upstream_sim.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#else
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#endif

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace net = rein::net;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
using rein::testing::report;
using rein::testing::scenario;

namespace {

/// A user-written limit algorithm: its limit is whatever capacity it was last told. No real limiter can know
/// this; it is the yardstick for the others.
struct oracle_options {
  std::size_t capacity = 16;
};

template <class Clock = clock_type>
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

/// Limiters whose algorithm can be told the true capacity (the oracle).
template <class L>
concept announces_capacity = requires(typename L::algorithm_type& a) { a.on_capacity(std::size_t{}); };

std::string ms(std::chrono::nanoseconds d) {
  std::ostringstream out;
  out << std::chrono::duration<double, std::milli>(d).count();
  return out.str();
}

/// One strategy's run in real time.
class run_base {
 public:
  virtual ~run_base() = default;
  virtual void start(net::io_context& io, clock_type::time_point t0) = 0;
  virtual report result() = 0;
};

template <class Limiter>
class live_run final : public run_base {
 public:
  template <class... Args>
  live_run(std::string name, const scenario& sc, net::io_context& io, Args&&... limiter_args)
      : name_{std::move(name)}, scenario_{sc}, limiter_{io, std::forward<Args>(limiter_args)...},
        upstream_{sc.upstream}, calls_(sc.calls()) {}

  void start(net::io_context& io, clock_type::time_point t0) override {
    t0_ = t0;
    net::co_spawn(io, arrivals(), net::detached);
    net::co_spawn(io, capacity_changes(), net::detached);
    net::co_spawn(io, sampler(), net::detached);
  }

  report result() override {
    report r;
    r.strategy = name_;
    r.scenario = scenario_.name;
    rein::testing::summarise_calls(r, calls_);
    std::erase_if(timeline_, [&](const auto& p) { return p.at > r.makespan; });
    r.timeline = timeline_;
    r.final_limit = limit();
    r.max_limit = max_limit_;
    r.decreases = decreases();
    r.peak_inside = upstream_.peak();
    return r;
  }

 private:
  std::chrono::nanoseconds elapsed() const { return clock_type::now() - t0_; }

  double limit() const {
    if constexpr (requires { limiter_.limit(); })
      return limiter_.limit();
    else
      return static_cast<double>(limiter_.snapshot().permits);
  }

  std::uint64_t decreases() const {
    if constexpr (requires { limiter_.limit(); })
      return limiter_.snapshot().decreases;
    else
      return 0;
  }

  // What a service does around each outbound call.
  net::awaitable<void> call(std::size_t id) {
    rein::permit slot = co_await limiter_.acquire();
    rein::testing::call_record& c = calls_[id];
    c.started = elapsed();
    const auto plan = upstream_.enter();  // the upstream decides how long this call takes, and whether it fails
    net::steady_timer service{co_await net::this_coro::executor};
    service.expires_at(t0_ + c.started + plan.service_time);
    co_await service.async_wait(net::use_awaitable);
    upstream_.leave();
    c.finished = elapsed();
    c.ok = plan.ok;
    slot.complete(plan.ok ? rein::outcome::success : rein::outcome::congestion);
    ++finished_;
  }

  net::awaitable<void> arrivals() {
    net::steady_timer tick{co_await net::this_coro::executor};
    std::size_t id = 0;
    for (std::size_t k = 0; k < scenario_.ticks; ++k) {
      const auto at = scenario_.tick * static_cast<std::int64_t>(k);
      tick.expires_at(t0_ + at);
      co_await tick.async_wait(net::use_awaitable);
      for (std::size_t i = 0; i < scenario_.per_tick; ++i, ++id) {
        calls_[id].arrived = elapsed();
        net::co_spawn(tick.get_executor(), call(id), net::detached);
      }
    }
  }

  net::awaitable<void> capacity_changes() {
    net::steady_timer at{co_await net::this_coro::executor};
    for (const auto& change : scenario_.changes) {
      at.expires_at(t0_ + change.at);
      co_await at.async_wait(net::use_awaitable);
      upstream_.set_capacity(change.capacity);
      if constexpr (announces_capacity<Limiter>) limiter_.update_algorithm([&](auto& a) { a.on_capacity(change.capacity); });
    }
  }

  net::awaitable<void> sampler() {
    net::steady_timer at{co_await net::this_coro::executor};
    max_limit_ = limit();
    for (std::chrono::nanoseconds t{0}; finished_ < calls_.size(); t += scenario_.timeline_step) {
      at.expires_at(t0_ + t);
      co_await at.async_wait(net::use_awaitable);
      const double l = limit();
      max_limit_ = std::max(max_limit_, l);
      timeline_.push_back({t, l, upstream_.capacity()});
    }
  }

  std::string name_;
  const scenario& scenario_;
  Limiter limiter_;
  rein::testing::upstream_model upstream_;
  std::vector<rein::testing::call_record> calls_;
  std::vector<rein::testing::timeline_point> timeline_;
  clock_type::time_point t0_{};
  std::size_t finished_ = 0;
  double max_limit_ = 0.0;
};

std::unique_ptr<run_base> make_run(std::string_view strategy, const scenario& sc, net::io_context& io) {
  using namespace rein::testing;
  if (strategy == "fixed")
    return std::make_unique<live_run<rein::semaphore>>("fixed(16)", sc, io, std::size_t{16});
  if (strategy == "aimd")
    return std::make_unique<live_run<rein::aimd_limiter>>("aimd", sc, io, experiment_aimd_options());
  if (strategy == "tuned_aimd")
    return std::make_unique<live_run<rein::tuned_aimd_limiter>>("tuned_aimd", sc, io, experiment_tuned_aimd_options());
  if (strategy == "gradient")
    return std::make_unique<live_run<rein::gradient_limiter>>("gradient", sc, io, experiment_gradient_options());
  if (strategy == "oracle")
    return std::make_unique<live_run<rein::adaptive_limiter<oracle_algorithm<>>>>(
        "oracle", sc, io, oracle_options{sc.upstream.capacity});
  throw std::invalid_argument("unknown strategy '" + std::string{strategy} +
                              "' (expected fixed, aimd, tuned_aimd, gradient or oracle)");
}

struct arguments {
  scenario sc = scenario::a();
  std::vector<std::string> strategies{"fixed", "aimd", "tuned_aimd", "gradient", "oracle"};
  std::string csv;
  bool timeline = true;
  bool check = false;
};

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  std::istringstream in{list};
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

arguments parse(int argc, char** argv) {
  arguments a;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg{argv[i]};
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(std::string{arg} + " needs a value");
      return argv[++i];
    };
    if (arg == "--scenario") {
      const std::string s = value();
      if (s == "a" || s == "A")
        a.sc = scenario::a();
      else if (s == "b" || s == "B")
        a.sc = scenario::b();
      else
        throw std::invalid_argument("--scenario must be a or b, got '" + s + "'");
    } else if (arg == "--strategy") {
      a.strategies = split(value());
    } else if (arg == "--csv") {
      a.csv = value();
    } else if (arg == "--no-timeline") {
      a.timeline = false;
    } else if (arg == "--check") {
      a.check = true;
    } else {
      throw std::invalid_argument("unknown argument '" + std::string{arg} + "'");
    }
  }
  return a;
}

// The real-time target for rein's default tuned_aimd (and, reported only, gradient).
bool meets_target(const report& r) { return r.failed == 0 && r.p95 <= 12ms; }

int run(const arguments& args) {
  net::io_context io{1};
  std::vector<std::unique_ptr<run_base>> runs;
  for (const auto& s : args.strategies) runs.push_back(make_run(s, args.sc, io));
  const auto t0 = clock_type::now() + 5ms;  // every run starts on the same instant
  for (auto& r : runs) r->start(io, t0);
  io.run();
  std::vector<report> reports;
  for (auto& r : runs) reports.push_back(r->result());

  std::cout << "Scenario " << args.sc.name << ": " << args.sc.description << "; " << args.sc.per_tick
            << " calls every " << ms(args.sc.tick) << " ms for " << ms(args.sc.tick * static_cast<std::int64_t>(args.sc.ticks))
            << " ms. Real time (Asio steady_timer); the strategies run side by side on one thread.\n\n";
  if (args.timeline)
    for (const auto& r : reports) {
      rein::testing::print_timeline(std::cout, r);
      std::cout << '\n';
    }
  rein::testing::print_table(std::cout, reports);
  std::cout << "\nService time runs from the grant to the report. Real timers fire a little late, so a call of exactly two\n"
               "base times (one call over capacity: 10 ms) counts as slower than 10 ms here; the manual-clock run of the\n"
               "same experiment (tests/async/degrading_upstream.cpp) is exact.\n";
  if (!args.csv.empty()) {
    std::ofstream out{args.csv};
    rein::testing::print_timeline_csv(out, reports);
    if (!out) throw std::runtime_error("cannot write " + args.csv);
    std::cout << "\nTimelines written to " << args.csv << '\n';
  }

  bool all_met = true;
  for (const auto& r : reports) {
    if (r.strategy != "tuned_aimd" && r.strategy != "gradient") continue;
    const bool met = meets_target(r);
    if (r.strategy == "tuned_aimd") all_met = all_met && met;  // the recommended default
    std::cout << "\n" << r.strategy << ": p95 " << ms(r.p95) << " ms, " << r.failed
              << " failed: real-time target (p95 <= 12 ms, no failures) " << (met ? "met" : "MISSED");
  }
  std::cout << '\n';
  return args.check && !all_met ? 1 : 0;
}

}  // namespace

constexpr const char* usage =
    "usage: degrading_upstream [--scenario a|b] [--strategy fixed,aimd,tuned_aimd,gradient,oracle] [--csv FILE]\n"
    "                          [--no-timeline] [--check]\n";

int main(int argc, char** argv) {
  if (rein_example::asked_for_help(argc, argv, usage)) return 0;
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << "degrading_upstream: " << e.what() << '\n' << usage;
    return 2;
  }
}
