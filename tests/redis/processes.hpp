// Child processes of the multi-process tests: fork/exec with the child's stdout on a pipe, read by the test
// until the children are done (tests/redis/quota_processes.cpp, shared_processes.cpp).
#pragma once

#include "support/catch.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace rein_test {

/// A child process and what it wrote so far.
struct child {
  pid_t pid = -1;
  int out = -1;  // read end of its stdout
  std::string output;
};

/// Starts `program` with `args`, its stdout on a pipe.
inline child spawn(const char* program, const std::vector<std::string>& args) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  child c;
  c.pid = ::fork();
  REQUIRE(c.pid >= 0);
  if (c.pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    std::vector<const char*> argv;
    argv.push_back(program);
    for (const auto& a : args) argv.push_back(a.c_str());
    argv.push_back(nullptr);
    ::execv(program, const_cast<char* const*>(argv.data()));
    ::_exit(127);
  }
  ::close(fds[1]);
  c.out = fds[0];
  return c;
}

/// Reads every child's output until each of `workers` closed its stdout or `give_up` passes (`others`, e.g.
/// a monitor that never ends by itself, are read meanwhile). Workers not done by then are killed. Returns
/// whether every worker ended by itself.
inline bool pump(std::vector<child*> workers, std::vector<child*> others, std::chrono::steady_clock::time_point give_up) {
  std::vector<child*> all = workers;
  all.insert(all.end(), others.begin(), others.end());
  const auto open_workers = [&] {
    std::size_t n = 0;
    for (const child* w : workers) n += w->out >= 0 ? 1 : 0;
    return n;
  };
  while (open_workers() > 0 && std::chrono::steady_clock::now() < give_up) {
    std::vector<pollfd> fds;
    for (const child* c : all) fds.push_back({c->out, POLLIN, 0});  // a negative fd is ignored by poll
    ::poll(fds.data(), fds.size(), 100);
    for (std::size_t i = 0; i < all.size(); ++i) {
      if (all[i]->out < 0 || (fds[i].revents & (POLLIN | POLLHUP)) == 0) continue;
      std::array<char, 4096> buffer{};
      const ssize_t n = ::read(all[i]->out, buffer.data(), buffer.size());
      if (n > 0) {
        all[i]->output.append(buffer.data(), static_cast<std::size_t>(n));
      } else {
        ::close(all[i]->out);
        all[i]->out = -1;
      }
    }
  }
  return open_workers() == 0;
}

/// Reads what `children` write for `d` (for children that never end by themselves, e.g. a monitor).
inline void read_for(std::vector<child*> children, std::chrono::milliseconds d) {
  child timer;  // a worker that never ends: pump then reads until the time is up
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  timer.out = fds[0];
  pump({&timer}, std::move(children), std::chrono::steady_clock::now() + d);
  ::close(fds[0]);
  ::close(fds[1]);
}

/// Reaps `c`, killing it first if its stdout is still open; returns its wait status.
inline int reap(child& c) {
  if (c.out >= 0) {
    ::kill(c.pid, SIGKILL);
    ::close(c.out);
    c.out = -1;
  }
  int status = 0;
  ::waitpid(c.pid, &status, 0);
  return status;
}

/// Reads every worker's output to its end and reaps it; kills whoever is not done by `give_up`. Each must
/// have exited with status 0.
inline void collect(std::vector<child>& workers, std::chrono::steady_clock::time_point give_up) {
  std::vector<child*> ptrs;
  for (auto& w : workers) ptrs.push_back(&w);
  pump(ptrs, {}, give_up);
  for (auto& w : workers) {
    const int status = reap(w);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
}

/// What a worker reported on its first line ("admitted N errors M"), checked: no errors and a share of the
/// admissions. Returns N.
inline long admitted_by(const child& w) {
  long admitted = -1;
  long errors = -1;
  INFO("worker said: " << w.output);
  REQUIRE(std::sscanf(w.output.c_str(), "admitted %ld errors %ld", &admitted, &errors) == 2);
  CHECK(errors == 0);
  CHECK(admitted > 0);  // every process got a share
  return admitted;
}

/// Jain's fairness index of the processes' admissions: 1 when equal, 1/n when one process took everything.
inline double jain_index(const std::vector<child>& workers) {
  double sum = 0, squares = 0;
  for (const child& w : workers) {
    const auto x = static_cast<double>(admitted_by(w));
    sum += x;
    squares += x * x;
  }
  return squares == 0 ? 0 : sum * sum / (static_cast<double>(workers.size()) * squares);
}

}  // namespace rein_test
