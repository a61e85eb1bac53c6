// Shedding by queueing time against a deadline per call, under overload: a report.
//
// A semaphore of 4 permits guards an upstream whose calls take 20-60 ms (uniform; about 100 calls per
// second), and callers arrive at random (Poisson) at loads from 0.95x to 3x of that. Each caller gives up
// 500 ms after it arrived: a call that ends later was wasted. Every run is on the manual clock (1 ms steps),
// so the figures are exact and the same on every machine. For each load shape it prints, for each way of
// bounding the wait (a fixed deadline per call, or the line's sojourn rule with the caller's own patience as
// its deadline):
//   goodput  calls that ended within the caller's patience, per second (the worst seed's)
//   p99      the 99th percentile of the waits of granted calls, ms (the worst seed's)
//   shed     calls failed by the line without a permit (timed_out or shed), share of arrivals (mean)
//
//   sojourn_overload [--seeds N]
#define BOOST_ASIO_DISABLE_EPOLL  // the manual clock needs the select reactor (see rein::testing::manual_clock)
#define ASIO_DISABLE_EPOLL

#include <rein/null_mutex.hpp>
#include <rein/semaphore.hpp>
#include <rein/testing/manual_clock.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "usage.hpp"

namespace {

using namespace std::chrono_literals;
using rein::testing::manual_clock;
using ms = std::chrono::milliseconds;
using semaphore = rein::basic_semaphore<rein::net::io_context::executor_type, manual_clock, rein::null_mutex>;

constexpr std::size_t permits = 4;
constexpr ms patience{500};
constexpr ms run_length{60'000};

// The load over time as a multiple of the upstream's capacity (100 calls per second).
struct shape {
  const char* name;
  std::function<double(ms)> load;
};

std::vector<shape> shapes() {
  return {
      {"steady 0.95x", [](ms) { return 0.95; }},
      {"steady 1.5x", [](ms) { return 1.5; }},
      {"bursts 2x/0.5x, 1 s each", [](ms t) { return (t.count() / 1000) % 2 == 0 ? 2.0 : 0.5; }},
      {"spikes 3x for 2 s every 10 s, else 0.8x", [](ms t) { return t.count() % 10'000 < 2'000 ? 3.0 : 0.8; }},
  };
}

struct bound {
  std::string name;
  ms deadline;                     // per call
  rein::line_options options;  // of the line
};

struct figures {
  double goodput = 0;  // per second
  double p99_ms = 0;
  double shed_share = 0;
};

figures run(const shape& s, const bound& b, std::uint64_t seed) {
  manual_clock::reset();
  rein::net::io_context io;
  const auto work = rein::net::make_work_guard(io);  // poll() would stop the context whenever it ran dry
  semaphore line(io.get_executor(), permits, b.options);
  std::mt19937_64 random(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int> service(20, 60);
  std::multimap<ms, rein::permit> ends;  // calls in progress, by the instant they end
  std::vector<double> waits;
  std::uint64_t arrivals = 0, good = 0, refused = 0;
  for (ms now{0}; now < run_length + patience; ++now) {
    manual_clock::set(manual_clock::time_point(now));
    for (auto it = ends.begin(); it != ends.end() && it->first <= now;) it = ends.erase(it);  // releases
    // Poisson arrivals, one draw per millisecond (the chance of two in one step is below 1 %).
    if (now < run_length && unit(random) < s.load(now) * 0.1) {
      ++arrivals;
      const ms arrived = now;
      const ms takes{service(random)};
      line.async_acquire_for(1, b.deadline, [&, arrived, takes](rein::error_code ec, rein::permit p) {
        if (ec) {
          ++refused;
          return;
        }
        const ms at = std::chrono::duration_cast<ms>(manual_clock::now().time_since_epoch());
        waits.push_back(static_cast<double>((at - arrived).count()));
        if (at + takes - arrived <= patience) ++good;
        ends.emplace(at + takes, std::move(p));
      });
    }
    while (io.poll() > 0) {
    }
  }
  figures f;
  f.goodput = static_cast<double>(good) / std::chrono::duration<double>(run_length).count();
  if (!waits.empty()) {
    std::sort(waits.begin(), waits.end());
    f.p99_ms = waits[std::min(waits.size() - 1, waits.size() * 99 / 100)];
  }
  f.shed_share = arrivals == 0 ? 0 : static_cast<double>(refused) / static_cast<double>(arrivals);
  return f;
}

std::vector<bound> bounds() {
  std::vector<bound> all;
  for (const ms d : {ms(50), ms(100), ms(200), ms(300), ms(440)})
    all.push_back({"deadline " + std::to_string(d.count()) + " ms", d, {}});
  for (const ms target : {ms(25), ms(50), ms(100), ms(150)}) {
    // CoDel's interval, 100 ms, for the short targets; twice the target for the long ones.
    const ms interval = target <= ms(50) ? ms(100) : 2 * target;
    rein::line_options o;
    o.sojourn = {.target = target, .interval = interval};
    all.push_back({"sojourn " + std::to_string(target.count()) + "/" + std::to_string(interval.count()) +
                       " ms, deadline 440",
                   ms(440), o});
  }
  return all;
}

constexpr const char* usage = "usage: sojourn_overload [--help] [--seeds N]\n";

}  // namespace

int main(int argc, char** argv) {
  if (rein_example::asked_for_help(argc, argv, usage)) return 0;
  std::uint64_t seeds = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--seeds" && i + 1 < argc) {
      seeds = std::strtoull(argv[++i], nullptr, 10);
    } else {
      std::fputs(usage, stderr);
      return 2;
    }
  }
  for (const shape& s : shapes()) {
    std::printf("%s (seeds 1-%llu)\n  %-34s %8s %8s %8s\n", s.name, static_cast<unsigned long long>(seeds), "bound",
                "goodput", "p99 ms", "shed");
    for (const bound& b : bounds()) {
      figures worst{1e300, 0, 0};
      for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
        const figures f = run(s, b, seed);
        worst.goodput = std::min(worst.goodput, f.goodput);
        worst.p99_ms = std::max(worst.p99_ms, f.p99_ms);
        worst.shed_share += f.shed_share / static_cast<double>(seeds);
      }
      std::printf("  %-34s %8.1f %8.0f %7.1f%%\n", b.name.c_str(), worst.goodput, worst.p99_ms, 100 * worst.shed_share);
    }
  }
}
