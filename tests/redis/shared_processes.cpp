// Several processes, one sliding window or one quota gate: four worker processes (fork/exec of
// tools/shared_worker.cpp) share a limiter, and the bound is checked from what every process logged and
// what Redis executed (MONITOR, through redis-cli: the server's stamp of every admission, and the stored
// pause).
#include "support.hpp"

#include "redis/processes.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

using namespace rein_test;

namespace {

// A MONITOR client, ready once the server acknowledged it.
child start_monitor(std::uint16_t port) {
  child m = spawn(REIN_REDIS_CLI, {"-p", std::to_string(port), "monitor"});
  const auto give_up = steady::now() + std::chrono::seconds(5);
  while (m.output.find("OK") == std::string::npos && steady::now() < give_up) {
    pollfd fd{m.out, POLLIN, 0};
    ::poll(&fd, 1, 50);
    std::array<char, 256> buffer{};
    if ((fd.revents & POLLIN) != 0) {
      const ssize_t n = ::read(m.out, buffer.data(), buffer.size());
      if (n > 0) m.output.append(buffer.data(), static_cast<std::size_t>(n));
    }
  }
  REQUIRE(m.output.find("OK") != std::string::npos);
  return m;
}

// The arguments of every `command` on `key` that MONITOR printed (quoted, after the key), one vector each.
std::vector<std::vector<std::string>> calls(const std::string& log, const std::string& command, const std::string& key) {
  std::vector<std::vector<std::string>> found;
  const std::string needle = "\"" + command + "\" \"" + key + "\"";
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    const auto at = line.find(needle);
    if (at == std::string::npos) continue;
    std::vector<std::string> args;
    std::istringstream rest(line.substr(at + needle.size()));
    for (std::string word; rest >> word;) args.push_back(word.substr(1, word.size() - 2));  // unquote
    found.push_back(args);
  }
  return found;
}

long long unix_us(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

}  // namespace

TEST_CASE("four processes sharing 40 per second never admit more than 40 in any second of server time") {
  INFO("redis-cli (Debian: redis-tools, a dependency of redis-server) runs MONITOR: " << REIN_REDIS_CLI);
  REQUIRE(::access(REIN_REDIS_CLI, X_OK) == 0);
  redis_server server;
  constexpr long limit = 40;
  constexpr long long window_us = 1'000'000;
  const std::string name = "fleet-window-" + std::to_string(::getpid());
  child monitor = start_monitor(server.port());
  const auto start_us = unix_us(std::chrono::system_clock::now() + std::chrono::seconds(1));

  std::vector<child> workers;
  for (int i = 0; i < 4; ++i) {
    workers.push_back(spawn(REIN_REDIS_SHARED_WORKER, {"window", std::to_string(server.port()), name, std::to_string(start_us),
                                                       "4000", "8", std::to_string(limit), "1000"}));
  }
  std::vector<child*> ptrs;
  for (auto& w : workers) ptrs.push_back(&w);
  REQUIRE(pump(ptrs, {&monitor}, steady::now() + std::chrono::seconds(30)));
  read_for({&monitor}, std::chrono::milliseconds(300));  // MONITOR's last lines may still be on their way
  reap(monitor);
  collect(workers, steady::now());

  long total = 0;
  for (const auto& w : workers) total += admitted_by(w);
  const std::string log_key = "rein:{" + name + "}:window";
  std::vector<long long> stamps;
  long queued = 0;  // the fleet queue's entries, in the same sorted set below score 0
  for (const auto& args : calls(monitor.output, "ZADD", log_key)) {
    REQUIRE(args.size() == 2);  // score, member
    const long long score = std::stoll(args[0]);
    if (score < 0) {
      CHECK(args[1].starts_with("q:"));
      ++queued;
    } else {
      stamps.push_back(score);
    }
  }
  CHECK(queued > 0);  // the processes did wait their turns
  CHECK(calls(monitor.output, "ZREMRANGEBYRANK", log_key).empty());  // no refunds: every stamp was counted
  CHECK(static_cast<long>(stamps.size()) == total);
  std::sort(stamps.begin(), stamps.end());
  // The most admissions whose server stamps lie in one window (t - 1 s, t], over every t.
  long most = 0;
  std::size_t first = 0;
  for (std::size_t last = 0; last < stamps.size(); ++last) {
    while (stamps[first] <= stamps[last] - window_us) ++first;
    most = std::max(most, static_cast<long>(last - first + 1));
  }
  INFO("admissions: " << total << ", most in one window: " << most);
  CHECK(most == limit);         // saturated, and never above
  CHECK(total >= 4 * limit);    // four windows' worth in four seconds at least
  // Equal demand, equal shares: the fleet queue gives freed places in turn (without it, whoever asked first
  // took them: 0.86 to 0.99).
  std::string each;
  for (const auto& w : workers) each += std::to_string(admitted_by(w)) + " ";
  const double jain = jain_index(workers);
  std::printf("window, 4 processes: admitted %s(Jain's index %.4f)\n", each.c_str(), jain);
  CHECK(jain >= 0.95);
}

TEST_CASE("four processes sharing a quota gate: a pause one of them writes stops all of them until its release") {
  INFO("redis-cli (Debian: redis-tools, a dependency of redis-server) runs MONITOR: " << REIN_REDIS_CLI);
  REQUIRE(::access(REIN_REDIS_CLI, X_OK) == 0);
  redis_server server;
  constexpr long long pause_us = 1'000'000;
  const std::string name = "fleet-gate-" + std::to_string(::getpid());
  child monitor = start_monitor(server.port());
  const auto start_us = unix_us(std::chrono::system_clock::now() + std::chrono::seconds(1));

  std::vector<child> workers;
  for (int i = 0; i < 4; ++i) {
    const std::string pause_at = i == 0 ? "1500" : "-1";  // worker 0 sees a "429, Retry-After: 1" at 1.5 s
    workers.push_back(spawn(REIN_REDIS_SHARED_WORKER, {"gate", std::to_string(server.port()), name, std::to_string(start_us),
                                                       "4000", "4", pause_at, std::to_string(pause_us / 1000)}));
  }
  std::vector<child*> ptrs;
  for (auto& w : workers) ptrs.push_back(&w);
  REQUIRE(pump(ptrs, {&monitor}, steady::now() + std::chrono::seconds(30)));
  read_for({&monitor}, std::chrono::milliseconds(300));
  reap(monitor);
  collect(workers, steady::now());

  // The stored pause, by the server's clock: HSET key until <end> release <release>.
  const auto stored = calls(monitor.output, "HSET", "rein:{" + name + "}:pause");
  REQUIRE(stored.size() == 1);
  REQUIRE(stored[0].size() == 4);
  const long long until = std::stoll(stored[0][1]);
  const long long release = std::stoll(stored[0][3]);
  const long long paused_at = until - pause_us;  // the script's TIME when it stored the pause
  CHECK(release - until >= 0);
  CHECK(release - until <= pause_us / 5);  // the writer's jitter: at most 0.2 x the pause

  long inside = 0;  // admissions called and granted inside [paused_at, release): must be none
  for (std::size_t i = 0; i < workers.size(); ++i) {
    INFO("worker " << i);
    const long admitted = admitted_by(workers[i]);
    std::istringstream lines(workers[i].output);
    std::string first_line;
    std::getline(lines, first_line);
    long held = 0;  // acquires still waiting when the pause ended: this process did meet the pause
    long granted_lines = 0;
    for (std::string line; std::getline(lines, line);) {
      long long called = 0;
      long long granted = 0;
      REQUIRE(std::sscanf(line.c_str(), "grant %lld %lld", &called, &granted) == 2);
      ++granted_lines;
      if (called >= paused_at && granted < release) ++inside;
      if (called >= paused_at && called < release) CHECK(granted >= release);  // called during the pause
      // Held across the release, wherever it was called: a call made just before the pause was stored, whose
      // request reached Redis after it, waits it out too (on a loaded machine a process's every coroutine
      // may have called then, so "called during the pause" alone can be empty for a process that did wait).
      if (called < release && granted >= release) ++held;
    }
    CHECK(granted_lines == admitted);
    CHECK(held > 0);  // this process had acquires waiting on the pause, and none passed it
  }
  CHECK(inside == 0);
}
