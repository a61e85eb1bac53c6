// A process-wide record of benchmark runs, and a summary printed when the benchmark binary exits: a Markdown
// table of medians with the ratio of each benchmark to its floor, and the pass/fail of stated targets.
//
// Why not a custom reporter: the benchmark binary uses benchmark_main (benchmarks/CMakeLists.txt), so the
// runs are measured by the benchmarks themselves (bench_io.hpp's run_clock) and summarised from a static
// object's destructor. Google Benchmark first runs each benchmark with growing iteration counts to find how
// many fill the minimum time; only the runs with the largest count (the reported ones, one per repetition)
// are kept. The summary goes to stderr so that `--benchmark_format=json` output on stdout stays valid.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace rein_bench {

/// The median and range of one measured quantity over the repetitions of a benchmark.
struct stat {
  double median = 0;
  double min = 0;
  double max = 0;
  std::size_t samples = 0;
};

inline stat summarise(std::vector<double> v) {
  stat s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  s.median = n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  s.min = v.front();
  s.max = v.back();
  s.samples = n;
  return s;
}

/// How a target compares a measured value (or ratio) with its limit.
enum class bound { at_most, at_least };

/// A stated target: numerator / denominator (or the numerator's value alone when the denominator is empty)
/// must be at most / at least `limit`.
struct target {
  std::string description;
  std::string numerator;
  std::string denominator;  // empty: compare the numerator's value itself
  bound kind = bound::at_most;
  double limit = 0;
  std::string value_key;  // empty: CPU ns per operation; otherwise a recorded value (record_value)
};

/// A group of benchmarks printed as one table, each shown as a multiple of `floor` (a benchmark name).
struct table_group {
  std::string title;
  std::string prefix;  // benchmarks whose name starts with it
  std::string floor;   // empty: no ratio column
};

class results {
 public:
  static results& get() {
    static results instance;
    return instance;
  }

  results(const results&) = delete;
  results& operator=(const results&) = delete;

  ~results() {
    if (runs_.empty() && values_.empty()) return;
    const std::string text = render();
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
  }

  /// Fixes where `name` appears in the tables (call it when registering a benchmark): otherwise benchmarks
  /// appear in the order they first ran, which --benchmark_enable_random_interleaving shuffles.
  void declare(const std::string& name) { remember(name); }

  /// One run of `name`: `iterations` operations took `cpu_ns` of this thread's CPU time and `wall_ns`.
  void record_run(const std::string& name, std::int64_t iterations, double cpu_ns, double wall_ns) {
    remember(name);
    runs_[name].push_back({iterations, cpu_ns, wall_ns});
  }

  /// A measured value other than time (bytes per waiter...), one per run.
  void record_value(const std::string& name, const std::string& key, double value) {
    remember(name);
    values_[{name, key}].push_back(value);
  }

  /// CPU ns per operation over the reported runs of `name`.
  std::optional<stat> cpu_ns_per_op(const std::string& name) const { return per_op(name, true); }

  /// Wall-clock ns per operation over the reported runs of `name`.
  std::optional<stat> wall_ns_per_op(const std::string& name) const { return per_op(name, false); }

  std::optional<stat> value(const std::string& name, const std::string& key) const {
    auto it = values_.find({name, key});
    if (it == values_.end() || it->second.empty()) return std::nullopt;
    return summarise(it->second);
  }

  void add_group(table_group g) { groups_.push_back(std::move(g)); }
  void add_target(target t) { targets_.push_back(std::move(t)); }
  /// Extra lines printed after the tables (footnotes: how something was measured).
  void add_note(std::string line) { notes_.push_back(std::move(line)); }

 private:
  struct run {
    std::int64_t iterations;
    double cpu_ns;
    double wall_ns;
  };

  results() = default;

  void remember(const std::string& name) {
    if (std::find(order_.begin(), order_.end(), name) == order_.end()) order_.push_back(name);
  }

  std::optional<stat> per_op(const std::string& name, bool cpu) const {
    auto it = runs_.find(name);
    if (it == runs_.end() || it->second.empty()) return std::nullopt;
    std::int64_t most = 0;
    for (const run& r : it->second) most = std::max(most, r.iterations);
    std::vector<double> v;
    for (const run& r : it->second)
      if (r.iterations == most) v.push_back((cpu ? r.cpu_ns : r.wall_ns) / static_cast<double>(r.iterations));
    return summarise(std::move(v));
  }

  std::optional<double> measure(const std::string& name, const std::string& key) const {
    auto s = key.empty() ? cpu_ns_per_op(name) : value(name, key);
    if (!s) return std::nullopt;
    return s->median;
  }

  static std::string fixed(double v, int digits) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", digits, v);
    return buf;
  }

  static std::string ns(double v) { return v >= 100 ? fixed(v, 0) : fixed(v, 1); }

  void render_group(std::ostringstream& out, const table_group& g) const {
    std::vector<std::string> names;
    for (const std::string& n : order_)
      if (n.rfind(g.prefix, 0) == 0 && runs_.count(n) != 0) names.push_back(n);
    if (names.empty()) return;
    const auto floor = g.floor.empty() ? std::nullopt : cpu_ns_per_op(g.floor);
    out << "\n**" << g.title << "**\n\n";
    out << "| benchmark | CPU ns/op, median | min - max | wall ns/op, median |" << (floor ? " x floor |" : "") << "\n";
    out << "| --- | ---: | ---: | ---: |" << (floor ? " ---: |" : "") << "\n";
    for (const std::string& n : names) {
      const stat c = *cpu_ns_per_op(n);
      const stat w = *wall_ns_per_op(n);
      out << "| " << n.substr(g.prefix.size()) << " | " << ns(c.median) << " | " << ns(c.min) << " - " << ns(c.max)
          << " | " << ns(w.median) << " |";
      if (floor) out << " " << fixed(c.median / floor->median, 2) << " |";
      out << "\n";
    }
  }

  void render_values(std::ostringstream& out) const {
    if (values_.empty()) return;
    out << "\n**Measured values (median over runs)**\n\n| benchmark | quantity | median | min - max |\n"
        << "| --- | --- | ---: | ---: |\n";
    for (const std::string& n : order_)
      for (const auto& [k, v] : values_)
        if (k.first == n) {
          const stat s = summarise(v);
          out << "| " << n << " | " << k.second << " | " << fixed(s.median, 1) << " | " << fixed(s.min, 1) << " - "
              << fixed(s.max, 1) << " |\n";
        }
  }

  // Targets whose benchmarks did not run (filtered out) are left out.
  void render_targets(std::ostringstream& out) const {
    bool header = false;
    for (const target& t : targets_) {
      const auto num = measure(t.numerator, t.value_key);
      const auto den = t.denominator.empty() ? std::optional<double>(1.0) : measure(t.denominator, t.value_key);
      if (!num || !den || *den == 0) continue;
      if (!header) {
        out << "\n**Targets (CPU time medians of this run)**\n\n| target | measured | limit | result |\n"
            << "| --- | ---: | ---: | --- |\n";
        header = true;
      }
      const double v = *num / *den;
      const bool ok = t.kind == bound::at_most ? v <= t.limit : v >= t.limit;
      const std::string unit = t.denominator.empty() ? "" : "x";
      out << "| " << t.description << " | " << fixed(v, 2) << unit << " | " << (t.kind == bound::at_most ? "<= " : ">= ")
          << fixed(t.limit, 2) << unit << " | " << (ok ? "PASS" : "FAIL") << " |\n";
    }
  }

  std::string render() const {
    std::ostringstream out;
    out << "\n## Benchmark summary (CPU time of the benchmark thread per operation; median and range over "
           "the reported runs)\n";
    for (const table_group& g : groups_) render_group(out, g);
    render_values(out);
    render_targets(out);
    if (!notes_.empty()) out << "\n";
    for (const std::string& n : notes_) out << "- " << n << "\n";
    return out.str();
  }

  std::vector<std::string> order_;
  std::map<std::string, std::vector<run>> runs_;
  std::map<std::pair<std::string, std::string>, std::vector<double>> values_;
  std::vector<table_group> groups_;
  std::vector<target> targets_;
  std::vector<std::string> notes_;
};

}  // namespace rein_bench
