// Several processes, one quota. Four worker processes (fork/exec of
// tools/shared_worker.cpp) share a bucket of 200 per second with a burst of 20 for 5 seconds.
#include "support.hpp"

#include "redis/processes.hpp"

#include <cstdio>
#include <string>
#include <vector>

using namespace rein_test;

TEST_CASE("four processes sharing 200 per second for 5 s admit at most 200 x 5 + burst, at least 95% of it, "
          "each about a quarter") {
  redis_server server;
  constexpr double rate = 200;
  constexpr long burst = 20;
  constexpr long seconds = 5;
  constexpr long bound = static_cast<long>(rate) * seconds + burst;  // the token bucket's own bound: 1,020
  const std::string key = unique_key("fleet");
  // A common start a second ahead, on the clock Redis reads too, so every process's window is the same.
  const auto start = std::chrono::system_clock::now() + std::chrono::seconds(1);
  const auto start_us = std::chrono::duration_cast<std::chrono::microseconds>(start.time_since_epoch()).count();

  std::vector<child> workers;
  for (int i = 0; i < 4; ++i) {
    workers.push_back(spawn(REIN_REDIS_SHARED_WORKER, {"bucket", std::to_string(server.port()), key, std::to_string(start_us),
                                                       std::to_string(seconds * 1000), "8", "200", std::to_string(burst)}));
  }
  collect(workers, steady::now() + std::chrono::seconds(30));

  long total = 0;
  for (const auto& w : workers) total += admitted_by(w);
  std::string each;
  for (const auto& w : workers) each += std::to_string(admitted_by(w)) + " ";
  INFO("admitted in total: " << total << " of at most " << bound << "; by process: " << each);
  CHECK(total <= bound);
  CHECK(static_cast<double>(total) >= 0.95 * static_cast<double>(bound));
  // Equal demand, so no process starves another: Jain's index over the processes' admissions.
  CHECK(jain_index(workers) >= 0.95);
  std::printf("bucket, 4 processes: admitted %s(Jain's index %.4f)\n", each.c_str(), jain_index(workers));
}

TEST_CASE("four processes taking tokens 8 at a time admit at most the bucket's bound plus 4 x 7, each about a "
          "quarter") {
  redis_server server;
  constexpr long seconds = 5;
  constexpr long bound = 200 * seconds + 20 + 4 * 7;  // capacity + rate x t + processes x (batch - 1)
  const std::string key = unique_key("fleet-batched");
  const auto start = std::chrono::system_clock::now() + std::chrono::seconds(1);
  const auto start_us = std::chrono::duration_cast<std::chrono::microseconds>(start.time_since_epoch()).count();
  std::vector<child> workers;
  for (int i = 0; i < 4; ++i) {
    workers.push_back(spawn(REIN_REDIS_SHARED_WORKER, {"batched", std::to_string(server.port()), key, std::to_string(start_us),
                                                       std::to_string(seconds * 1000), "8", "200", "20"}));
  }
  collect(workers, steady::now() + std::chrono::seconds(30));
  long total = 0;
  std::string each;
  for (const auto& w : workers) {
    total += admitted_by(w);
    each += std::to_string(admitted_by(w)) + " ";
  }
  INFO("admitted in total: " << total << " of at most " << bound << "; by process: " << each);
  CHECK(total <= bound);
  CHECK(static_cast<double>(total) >= 0.95 * (200 * seconds + 20));
  CHECK(jain_index(workers) >= 0.95);
}
