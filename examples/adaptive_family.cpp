// Every adaptive concurrency algorithm of rein, with its default options, on a family of generated upstreams
// (rein/testing/scenario_family.hpp), scored exactly against an oracle that knows the capacity.
//
//     adaptive_family [--seeds N] [--first SEED] [--noise-seeds N] [--worst] [--algorithm NAME]
//     adaptive_family --show SEED | --show-noise SEED [--algorithm NAME]
//     adaptive_family --shapes [--seeds N] [--first SEED] [--work-hints] [--algorithm NAME]
//     ... [--median-window N]
//
// Prints a Markdown table: per algorithm, in how many scenarios calls failed, the share of calls slower than
// twice their unloaded service time, makespan over the oracle's, and after a recovery, makespan over a fixed
// limit at the recovered capacity (median and worst over the seeds); then, on upstreams whose latency is only
// noisy (+-20 %), the deepest cut as a fraction of the capacity. --worst names the scenario behind each worst
// figure; --show prints one scenario, each algorithm's run on it and a timeline of its limit. Pure
// simulation: no Asio, no clock, the same figures on every machine.
//
// The last row, blind_reference (rein/testing/scenario_family.hpp), is no algorithm: an idealised rule that
// starts from the same 4 calls, is not told the capacity, grows as fast as the family's smallest hard-cap
// margin allows and then follows the capacity like the oracle. What it misses, no rule starting from 4
// can reach on this family. blind_reference_late sees each later drop only when a call granted over the
// new capacity completes, as a rule fed by completions must (rises still at once). --algorithm selects
// either alone.
//
// --shapes scores the grown family's shapes instead (rein::testing::world_shapes: payload-shaped latency,
// random failures): per algorithm and shape, the throughput over the oracle's (its makespan over this one's),
// worst / median over the seeds, and the calls failed because of the load (random failures are not counted).
// --work-hints gives every sample its call's payload factor as a work hint.
//
// --median-window N sets tuned_aimd's `median_window` (its noisy rule; 0: off) instead of its default, in
// every mode, to compare values of it on the same seeds.
#include "usage.hpp"

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
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace {

struct arguments {
  std::size_t seeds = 1000;
  std::uint64_t first = 1;
  std::size_t noise_seeds = 200;
  bool worst = false;
  std::optional<std::uint64_t> show{};
  bool show_noise = false;
  std::string algorithm;
  bool shapes = false;
  bool work_hints = false;
  std::optional<std::size_t> median_window{};  // tuned_aimd's, instead of its default
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
    else if (arg == "--show")
      a.show = value();
    else if (arg == "--show-noise")
      a.show = value(), a.show_noise = true;
    else if (arg == "--shapes")
      a.shapes = true;
    else if (arg == "--work-hints")
      a.work_hints = true;
    else if (arg == "--median-window")
      a.median_window = value();
    else if (arg == "--algorithm" && i + 1 < argc)
      a.algorithm = argv[++i];
    else
      throw std::invalid_argument("unknown argument '" + std::string{arg} + "'");
  }
  if (a.seeds == 0) throw std::invalid_argument("--seeds must be at least 1");
  return a;
}

// An algorithm with its default options; tuned_aimd's median_window from --median-window if given.
template <class Algorithm>
Algorithm make_default(const arguments& args) {
  if constexpr (std::is_same_v<Algorithm, rein::algo::tuned_aimd>) {
    rein::algo::tuned_aimd_options o;
    if (args.median_window) o.median_window = *args.median_window;
    return Algorithm{o};
  } else {
    (void)args;
    return Algorithm{};
  }
}

// What the tables' headings add when --median-window replaces tuned_aimd's default.
std::string window_note(const arguments& args) {
  return args.median_window ? " (tuned_aimd: median_window " + std::to_string(*args.median_window) + ")" : "";
}

template <class Algorithm>
void add(std::vector<rein::testing::family_summary>& rows, std::vector<rein::testing::family_summary>& noise,
         const char* name, const rein::testing::family& f, const rein::testing::family& quiet, const arguments& args) {
  if (!args.algorithm.empty() && args.algorithm != name) return;
  const auto make = [&args] { return make_default<Algorithm>(args); };
  rows.push_back(rein::testing::evaluate(name, f, make));
  noise.push_back(rein::testing::evaluate(name, quiet, make));
}

// One scenario in detail: what it is, each algorithm's figures, and a timeline of key 0's limit.
template <class Algorithm>
void show_one(const char* name, const rein::testing::scenario& sc, const arguments& args,
              std::vector<rein::testing::report>& reports) {
  if (!args.algorithm.empty() && args.algorithm != name) return;
  std::vector<Algorithm> keys(sc.keys(), make_default<Algorithm>(args));
  reports.push_back(rein::testing::simulate(name, std::span{keys}, sc));
}

int show(const arguments& args) {
  using namespace rein;
  const auto sc = args.show_noise ? testing::generate_noise_scenario(*args.show) : testing::generate_scenario(*args.show);
  const auto marks = testing::measure_yardsticks(sc);
  std::cout << sc.name << ": " << sc.description << "\noracle makespan "
            << std::chrono::duration<double, std::milli>(marks.oracle_makespan).count() << " ms\n\n";
  std::vector<testing::report> reports;
  show_one<algo::aimd>("aimd", sc, args, reports);
  show_one<algo::tuned_aimd>("tuned_aimd", sc, args, reports);
  show_one<algo::gradient>("gradient", sc, args, reports);
  show_one<algo::vegas>("vegas", sc, args, reports);
  show_one<algo::windowed_aimd>("windowed_aimd", sc, args, reports);
  show_one<algo::pid>("pid", sc, args, reports);
  for (const bool late : {false, true}) {
    const char* name = late ? "blind_reference_late" : "blind_reference";
    if (!args.algorithm.empty() && args.algorithm != name) continue;
    std::vector<testing::blind_reference> keys;
    for (std::size_t k = 0; k < sc.keys(); ++k) keys.emplace_back(sc.key(k), 4.0, late);
    reports.push_back(testing::simulate(name, std::span{keys}, sc));
  }
  testing::print_table(std::cout, reports);
  for (const auto& r : reports) {
    std::cout << '\n';
    testing::print_timeline(std::cout, r);
  }
  return 0;
}

// One row of the shapes table: an algorithm's worst / median throughput over the oracle's on each shape.
template <class Make>
void shape_row(const char* name, std::span<const rein::testing::family> families, const arguments& args, Make make) {
  if (!args.algorithm.empty() && args.algorithm != name) return;
  std::cout << "| " << name;
  std::size_t failed = 0;
  for (const auto& f : families) {
    const auto s = rein::testing::evaluate(name, f, make);
    for (const auto& one : s.scores) failed += one.failed;
    char buf[64];
    std::snprintf(buf, sizeof buf, " | %.2f / %.2f", s.worst_throughput(), s.median_throughput());
    std::cout << buf;
  }
  std::cout << " | " << failed << " |\n";
}

int shapes(const arguments& args) {
  using namespace rein;
  const auto all = testing::world_shapes();
  std::vector<testing::family> families;
  for (const auto& shape : all) families.push_back(testing::family::generate_shaped(shape, args.first, args.seeds, args.work_hints));
  std::cout << "Throughput / oracle's, worst / median over seeds " << args.first << " to " << args.first + args.seeds - 1
            << (args.work_hints ? ", with work hints" : "") << ", default options" << window_note(args)
            << ":\n\n| algorithm";
  for (const auto& shape : all) std::cout << " | " << shape.name;
  std::cout << " | calls failed by load |\n|---";
  for (std::size_t i = 0; i <= all.size(); ++i) std::cout << "|---";
  std::cout << "|\n";
  shape_row("aimd", families, args, [] { return algo::aimd{}; });
  shape_row("tuned_aimd", families, args, [&args] { return make_default<algo::tuned_aimd>(args); });
  shape_row("gradient", families, args, [] { return algo::gradient{}; });
  shape_row("vegas", families, args, [] { return algo::vegas{}; });
  shape_row("windowed_aimd", families, args, [] { return algo::windowed_aimd{}; });
  shape_row("pid", families, args, [] { return algo::pid{}; });
  shape_row("blind_reference", families, args, [](const testing::upstream_key& k) { return testing::blind_reference{k}; });
  return 0;
}

int run(const arguments& args) {
  using namespace rein;
  if (args.show) return show(args);
  if (args.shapes) return shapes(args);
  const auto f = testing::family::generate(args.first, args.seeds);
  testing::family quiet;
  for (std::size_t i = 0; i < args.noise_seeds; ++i) {
    quiet.scenarios.push_back(testing::generate_noise_scenario(args.first + i));
    quiet.marks.push_back(testing::measure_yardsticks(quiet.scenarios.back()));
  }
  std::vector<testing::family_summary> rows, noise;
  add<algo::aimd>(rows, noise, "aimd", f, quiet, args);
  add<algo::tuned_aimd>(rows, noise, "tuned_aimd", f, quiet, args);
  add<algo::gradient>(rows, noise, "gradient", f, quiet, args);
  add<algo::vegas>(rows, noise, "vegas", f, quiet, args);
  add<algo::windowed_aimd>(rows, noise, "windowed_aimd", f, quiet, args);
  add<algo::pid>(rows, noise, "pid", f, quiet, args);
  // Not algorithms: the idealised references (see blind_reference), with drops seen at once and late.
  for (const bool late : {false, true}) {
    const char* name = late ? "blind_reference_late" : "blind_reference";
    if (!args.algorithm.empty() && args.algorithm != name) continue;
    const auto make = [late](const testing::upstream_key& key) { return testing::blind_reference{key, 4.0, late}; };
    rows.push_back(testing::evaluate(name, f, make));
  }

  std::cout << args.seeds << " generated scenarios (seeds " << args.first << " to " << args.first + args.seeds - 1
            << "), default options" << window_note(args) << ":\n\n";
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

constexpr const char* usage =
    "usage: adaptive_family [--help] [--seeds N] [--first SEED] [--noise-seeds N] [--worst] [--algorithm NAME]\n"
    "       adaptive_family --show SEED | --show-noise SEED [--algorithm NAME]\n"
    "       adaptive_family --shapes [--seeds N] [--first SEED] [--work-hints] [--algorithm NAME]\n"
    "       ... [--median-window N]: tuned_aimd's median_window (0: off) instead of its default\n"
    "  every adaptive algorithm with its defaults on a generated family of upstreams, against an oracle,\n"
    "  and two idealised references (blind_reference, blind_reference_late) that are not told the capacity\n";

int main(int argc, char** argv) {
  if (rein_example::asked_for_help(argc, argv, usage)) return 0;
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << "adaptive_family: " << e.what() << '\n';
    return 2;
  }
}
