// rein::prometheus end to end: examples/prometheus/prometheus_throttle runs a throttle under load and serves
// /metrics; a real Prometheus server scrapes it every second; its HTTP API must then return the series with
// the values the program printed once its load had stopped. Skipped (exit code 77) without Prometheus.
// With redis-server, a shared semaphore held in this process is scraped the same way.
#include "prometheus_server.hpp"
#include "support/catch.hpp"

#if defined(REIN_REDIS_SERVER)
#include "redis/redis_server.hpp"

#include <rein/permit.hpp>
#include <rein/prometheus/collector.hpp>
#include <rein/redis/connection.hpp>
#include <rein/redis/shared_semaphore.hpp>

#include <prometheus/exposer.h>

#include <memory>
#endif

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

#if defined(REIN_REDIS_SERVER)

TEST_CASE("Prometheus scrapes a shared semaphore's limit, in_flight, held, free and waiting",
          "[prometheus][integration][redis]") {
  const std::optional<std::string> prometheus = rein_test::find_prometheus();
  if (!prometheus) {
    std::cerr << "SKIP: no Prometheus server (Debian: apt-get install prometheus; or set REIN_PROMETHEUS)\n";
    std::exit(77);
  }
  rein_test::redis_server redis;
  namespace net = rein::net;
  net::io_context io;
  rein::redis::connection_options at;
  at.port = redis.port();
  rein::redis::connection c1(io, at);
  rein::redis::connection c2(io, at);
  // Two semaphore objects stand for two processes sharing 3 permits: "pool" holds 2 and waits for 2 more;
  // "other" holds the third.
  rein::redis::shared_semaphore pool(c1, {.key = "scrape", .limit = 3}, {.name = "pool"});
  rein::redis::shared_semaphore other(c2, {.key = "scrape", .limit = 3});
  rein::permit held, third, later;
  pool.async_acquire(2, [&](rein::error_code, rein::permit p) { held = std::move(p); });
  other.async_acquire(1, [&](rein::error_code, rein::permit p) { third = std::move(p); });
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!(held && third) && std::chrono::steady_clock::now() < give_up) io.run_for(std::chrono::milliseconds(10));
  REQUIRE(held.count() == 2);
  REQUIRE(third.count() == 1);
  pool.async_acquire(2, [&](rein::error_code, rein::permit p) { later = std::move(p); });
  // Denied (one free at most), it keeps asking: the state stays as it is while Prometheus scrapes.
  while (pool.snapshot().remote_denied == 0 && std::chrono::steady_clock::now() < give_up)
    io.run_for(std::chrono::milliseconds(10));
  REQUIRE(pool.snapshot().remote_denied > 0);
  std::thread runner([&io] { io.run(); });  // renewals and polls go on; the collector reads from its thread
  struct joined {
    net::io_context& io;
    std::thread& runner;
    ~joined() {
      io.stop();
      runner.join();
    }
  } stop_at_exit{io, runner};

  auto metrics = std::make_shared<rein::prometheus::collector>();
  metrics->add(pool);
  ::prometheus::Exposer exposer("127.0.0.1:0");
  exposer.RegisterCollectable(metrics);
  rein_test::prometheus_server server(*prometheus, static_cast<unsigned short>(exposer.GetListeningPorts().at(0)));
  INFO(server.log());
  CHECK(wait_for(server, "rein_limit{limiter=\"pool\"}") == 3.0);
  CHECK(wait_for(server, "rein_in_flight{limiter=\"pool\"}") == 2.0);
  CHECK(wait_for(server, "rein_held{limiter=\"pool\"}") == 2.0);
  CHECK(wait_for(server, "rein_free{limiter=\"pool\"}") == 0.0);
  CHECK(wait_for(server, "rein_waiting{limiter=\"pool\"}") == 1.0);
  CHECK(wait_for(server, "rein_acquired_total{limiter=\"pool\"}") == 1.0);
  CHECK(wait_for(server, "rein_redis_round_trip_seconds_count{limiter=\"pool\"} > 1").has_value());
  CHECK_FALSE(later);
  CHECK(metrics->remove("pool"));
}

#endif
