// Every adaptive concurrency algorithm of rein, with its default options, on a family of generated upstreams
// (rein/testing/scenario_family.hpp), scored exactly against an oracle that knows the capacity.
//
//     adaptive_family [--seeds N] [--first SEED] [--noise-seeds N] [--worst]
//
// Prints a Markdown table: per algorithm, in how many scenarios calls failed, the share of calls slower than
// twice their unloaded service time, makespan over the oracle's, and after a recovery, makespan over a fixed
// limit at the recovered capacity (median and worst over the seeds); then, on upstreams whose latency is only
// noisy (+-20 %), the deepest cut as a fraction of the capacity. --worst names the scenario behind each worst
// figure. Pure simulation: no Asio, no clock, the same figures on every machine.
#include <rein/algo/aimd.hpp>
#include <rein/algo/gradient.hpp>
#include <rein/algo/pid.hpp>
#include <rein/algo/tuned_aimd.hpp>
#include <rein/algo/vegas.hpp>
#include <rein/algo/windowed_aimd.hpp>
#include <rein/testing/scenario_family.hpp>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

struct arguments {
  std::size_t seeds = 1000;
  std::uint64_t first = 1;
  std::size_t noise_seeds = 200;
  bool worst = false;
};

arguments parse(int argc, char** argv) {
  arguments a;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg{argv[i]};
    const auto value = [&]() -> std::uint64_t {
      if (i + 1 >= argc) throw std::invalid_argument(std::string{arg} + " needs a value");
      return std::stoull(argv[++i]);
    };
    if (arg == "--seeds")
      a.seeds = value();
    else if (arg == "--first")
      a.first = value();
    else if (arg == "--noise-seeds")
      a.noise_seeds = value();
    else if (arg == "--worst")
      a.worst = true;
    else
      throw std::invalid_argument("unknown argument '" + std::string{arg} + "'");
  }
  if (a.seeds == 0) throw std::invalid_argument("--seeds must be at least 1");
  return a;
}

template <class Algorithm>
void add(std::vector<rein::testing::family_summary>& rows, std::vector<rein::testing::family_summary>& noise,
         const char* name, const rein::testing::family& f, const rein::testing::family& quiet) {
  const auto make = [] { return Algorithm{}; };
  rows.push_back(rein::testing::evaluate(name, f, make));
  noise.push_back(rein::testing::evaluate(name, quiet, make));
}

int run(const arguments& args) {
  using namespace rein;
  const auto f = testing::family::generate(args.first, args.seeds);
  testing::family quiet;
  for (std::size_t i = 0; i < args.noise_seeds; ++i) {
    quiet.scenarios.push_back(testing::generate_noise_scenario(args.first + i));
    quiet.marks.push_back(testing::measure_yardsticks(quiet.scenarios.back()));
  }
  std::vector<testing::family_summary> rows, noise;
  add<algo::aimd>(rows, noise, "aimd", f, quiet);
  add<algo::tuned_aimd>(rows, noise, "tuned_aimd", f, quiet);
  add<algo::gradient>(rows, noise, "gradient", f, quiet);
  add<algo::vegas>(rows, noise, "vegas", f, quiet);
  add<algo::windowed_aimd>(rows, noise, "windowed_aimd", f, quiet);
  add<algo::pid>(rows, noise, "pid", f, quiet);

  std::cout << args.seeds << " generated scenarios (seeds " << args.first << " to " << args.first + args.seeds - 1
            << "), default options:\n\n";
  testing::print_family_table(std::cout, rows);
  std::cout << "\nLatency noise +-20 %, no capacity change (" << args.noise_seeds
            << " seeds): the deepest cut, as a fraction of the capacity\n\n| strategy | deepest cut | makespan / oracle, "
               "median / worst |\n|---|---|---|\n";
  for (const auto& r : noise) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "| %s | %.2f | %.3f / %.3f |\n", r.strategy.c_str(), r.lowest_cut, r.median_makespan,
                  r.worst_makespan);
    std::cout << buf;
  }
  if (args.worst) {
    std::cout << '\n';
    for (const auto& r : rows)
      std::cout << r.strategy << ": most failures in " << r.worst_failed_at << ", slowest in " << r.worst_slow_at
                << ", longest makespan in " << r.worst_makespan_at << ", worst recovery in " << r.worst_recovery_at
                << '\n';
    for (const auto& r : noise) std::cout << r.strategy << ": deepest noise cut in " << r.lowest_cut_at << '\n';
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << "adaptive_family: " << e.what() << '\n';
    return 2;
  }
}
