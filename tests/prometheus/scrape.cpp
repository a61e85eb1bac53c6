// rein::prometheus end to end: examples/prometheus/prometheus_throttle runs a throttle under load and serves
// /metrics; a real Prometheus server scrapes it every second; its HTTP API must then return the series with
// the values the program printed once its load had stopped. Skipped (exit code 77) without Prometheus.
#include "prometheus_server.hpp"
#include "support/catch.hpp"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

namespace {

// The program's printed `rein_..._total{...} N` lines, by series.
std::map<std::string, double> printed_series(const std::string& output) {
  std::map<std::string, double> series;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("rein_", 0) != 0) continue;
    const std::size_t space = line.rfind(' ');
    series[line.substr(0, space)] = std::strtod(line.c_str() + space + 1, nullptr);
  }
  return series;
}

// Waits until Prometheus answers `promql` with one sample.
std::optional<double> wait_for(const rein_test::prometheus_server& server, const std::string& promql) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < give_up) {
    if (auto v = server.query_one(promql)) return v;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("Prometheus scrapes a throttle's metrics with the values the program printed", "[prometheus][integration]") {
  const std::optional<std::string> prometheus = rein_test::find_prometheus();
  if (!prometheus) {
    std::cerr << "SKIP: no Prometheus server (Debian: apt-get install prometheus; or set REIN_PROMETHEUS)\n";
    std::exit(77);  // CTest's SKIP_RETURN_CODE for this test
  }
  rein_test::temp_dir dir{"prometheus"};
  const std::filesystem::path log = dir.path() / "example.log";
  rein_test::child_process example({REIN_PROMETHEUS_EXAMPLE, "--port", "0", "--seconds", "2", "--serve-seconds", "-1"},
                                   log);
  // The load runs 2 s; then the final counts are printed and stay as they are.
  std::string output;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (output.find("\ndone") == std::string::npos && std::chrono::steady_clock::now() < give_up) {
    REQUIRE(example.running());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    output = rein_test::read_text(log);
  }
  INFO(output);
  REQUIRE(output.find("\ndone") != std::string::npos);
  std::smatch port;
  REQUIRE(std::regex_search(output, port, std::regex("listening on 127\\.0\\.0\\.1:([0-9]+)")));
  const auto series = printed_series(output);
  const std::string rate_series = "rein_rejected_total{limiter=\"outbound\",reason=\"rate\"}";
  REQUIRE(series.count(rate_series) == 1);
  CHECK(series.at(rate_series) > 0);  // 8 workers against 50 per second: the rate stage refused some

  rein_test::prometheus_server server(*prometheus, static_cast<unsigned short>(std::stoi(port[1].str())));
  INFO(server.log());
  for (const auto& [name, value] : series) {
    INFO(name);
    const std::optional<double> scraped = wait_for(server, name);
    REQUIRE(scraped);
    CHECK(*scraped == value);
  }
  // The histogram, the gauges and the keyed registry's series are there too.
  const std::optional<double> acquired = wait_for(server, "rein_acquired_total{limiter=\"rate\"}");
  REQUIRE(acquired);
  CHECK(wait_for(server, "rein_wait_seconds_count{limiter=\"rate\"}") == acquired);
  CHECK(wait_for(server, "rein_wait_seconds_bucket{limiter=\"rate\",le=\"+Inf\"}") == acquired);
  CHECK(wait_for(server, "rein_limit{limiter=\"rate\"}") == 50.0);
  CHECK(wait_for(server, "rein_limit{limiter=\"global\"}") == 4.0);
  CHECK(wait_for(server, "rein_in_flight{limiter=\"outbound\"}") == 0.0);
  CHECK(wait_for(server, "rein_keys{limiter=\"per_host\"}") == 3.0);
  CHECK(wait_for(server, "rein_limit{limiter=\"per_host\",key=\"host-0\"}") == 2.0);
  // The sum rule: the global stage's grants, summed over `as`, are its own count; those kept are admissions.
  const std::optional<double> global_grants =
      wait_for(server, "sum without (as) (rein_throttle_stage_acquired_total{limiter=\"outbound\",stage=\"1\"})");
  const std::optional<double> global_kept =
      wait_for(server, "rein_throttle_stage_acquired_total{limiter=\"outbound\",stage=\"1\",as=\"admitted\"}");
  REQUIRE(global_grants);
  REQUIRE(global_kept);
  CHECK(*global_grants == wait_for(server, "rein_acquired_total{limiter=\"global\"}"));
  CHECK(*global_kept == wait_for(server, "rein_acquired_total{limiter=\"outbound\"}"));
}
