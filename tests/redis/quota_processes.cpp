// Several processes, one quota: the acceptance case. Four worker processes (fork/exec of
// tools/quota_worker.cpp) share a bucket of 200 per second with a burst of 20 for 5 seconds.
#include "support.hpp"

#include <poll.h>

#include <array>
#include <cstdio>
#include <string>
#include <vector>

using namespace rein_test;

namespace {

struct worker {
  pid_t pid = -1;
  int out = -1;  // read end of its stdout
  std::string output;
};

worker spawn(const std::vector<std::string>& args) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  worker w;
  w.pid = ::fork();
  REQUIRE(w.pid >= 0);
  if (w.pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    std::vector<const char*> argv;
    argv.push_back(REIN_REDIS_QUOTA_WORKER);
    for (const auto& a : args) argv.push_back(a.c_str());
    argv.push_back(nullptr);
    ::execv(REIN_REDIS_QUOTA_WORKER, const_cast<char* const*>(argv.data()));
    ::_exit(127);
  }
  ::close(fds[1]);
  w.out = fds[0];
  return w;
}

// Reads every worker's output to its end and reaps it; kills whoever is not done by `give_up`.
void collect(std::vector<worker>& workers, steady::time_point give_up) {
  std::size_t open = workers.size();
  while (open > 0 && steady::now() < give_up) {
    std::vector<pollfd> fds;
    for (const auto& w : workers) fds.push_back({w.out, POLLIN, 0});
    ::poll(fds.data(), fds.size(), 100);
    for (std::size_t i = 0; i < workers.size(); ++i) {
      if (workers[i].out < 0 || (fds[i].revents & (POLLIN | POLLHUP)) == 0) continue;
      std::array<char, 256> buffer{};
      const ssize_t n = ::read(workers[i].out, buffer.data(), buffer.size());
      if (n > 0) {
        workers[i].output.append(buffer.data(), static_cast<std::size_t>(n));
      } else {
        ::close(workers[i].out);
        workers[i].out = -1;
        --open;
      }
    }
  }
  for (auto& w : workers) {
    if (w.out >= 0) {
      ::kill(w.pid, SIGKILL);
      ::close(w.out);
    }
    int status = 0;
    ::waitpid(w.pid, &status, 0);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
}

}  // namespace

TEST_CASE("four processes sharing 200 per second for 5 s admit at most 200 x 5 + burst, and at least 95% of it") {
  redis_server server;
  constexpr double rate = 200;
  constexpr long burst = 20;
  constexpr long seconds = 5;
  constexpr long bound = static_cast<long>(rate) * seconds + burst;  // the token bucket's own bound: 1,020
  const std::string key = unique_key("fleet");
  // A common start a second ahead, on the clock Redis reads too, so every process's window is the same.
  const auto start = std::chrono::system_clock::now() + std::chrono::seconds(1);
  const auto start_us = std::chrono::duration_cast<std::chrono::microseconds>(start.time_since_epoch()).count();

  std::vector<worker> workers;
  for (int i = 0; i < 4; ++i) {
    workers.push_back(spawn({std::to_string(server.port()), key, "200", std::to_string(burst), std::to_string(start_us),
                             std::to_string(seconds * 1000), "8"}));
  }
  collect(workers, steady::now() + std::chrono::seconds(30));

  long total = 0;
  for (const auto& w : workers) {
    long admitted = -1;
    long errors = -1;
    INFO("worker said: " << w.output);
    REQUIRE(std::sscanf(w.output.c_str(), "admitted %ld errors %ld", &admitted, &errors) == 2);
    CHECK(errors == 0);
    CHECK(admitted > 0);  // every process got a share
    total += admitted;
  }
  INFO("admitted in total: " << total << " of at most " << bound);
  CHECK(total <= bound);
  CHECK(static_cast<double>(total) >= 0.95 * static_cast<double>(bound));
}
