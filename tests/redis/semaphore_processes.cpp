// Several processes, one shared semaphore: four worker processes (fork/exec of tools/shared_worker.cpp)
// hold permits of one limit, and the bound is checked from the spans every process logged; a process
// killed with SIGKILL while holding permits gives them back through its lease's end; a process stopped
// (SIGSTOP) with a grant on its way finds it stale on waking and does not take it.
#include "support.hpp"

#include "redis/processes.hpp"

#include <rein/permit.hpp>
#include <rein/redis/shared_semaphore.hpp>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace rein_test;

namespace {

// Every "held <granted us> <released us>" line of the workers' output.
std::vector<std::pair<long long, long long>> spans(const std::vector<child>& workers) {
  std::vector<std::pair<long long, long long>> found;
  for (const child& w : workers) {
    std::istringstream lines(w.output);
    for (std::string line; std::getline(lines, line);) {
      long long granted = 0, released = 0;
      if (std::sscanf(line.c_str(), "held %lld %lld", &granted, &released) == 2) found.emplace_back(granted, released);
    }
  }
  return found;
}

// The most spans open at one instant (a release at the instant of another's grant counts as before it).
long most_at_once(const std::vector<std::pair<long long, long long>>& held) {
  std::vector<std::pair<long long, int>> events;
  for (const auto& [granted, released] : held) {
    events.emplace_back(granted, +1);
    events.emplace_back(released, -1);
  }
  std::sort(events.begin(), events.end());  // at one instant, -1 sorts before +1
  long open = 0, most = 0;
  for (const auto& e : events) most = std::max(most, open += e.second);
  return most;
}

}  // namespace

TEST_CASE("four processes sharing 6 permits never hold more than 6 at once, and take turns") {
  redis_server server;
  constexpr long limit = 6;
  const std::string key = unique_key("fleet-sem");
  const auto start = std::chrono::system_clock::now() + std::chrono::seconds(1);
  const auto start_us = std::chrono::duration_cast<std::chrono::microseconds>(start.time_since_epoch()).count();

  // 4 processes x 4 coroutines want 16 permits, each held 20 ms, for 3 s.
  std::vector<child> workers;
  for (int i = 0; i < 4; ++i) {
    workers.push_back(spawn(REIN_REDIS_SHARED_WORKER, {"semaphore", std::to_string(server.port()), key, std::to_string(start_us),
                                                       "3000", "4", std::to_string(limit), "20"}));
  }
  collect(workers, steady::now() + std::chrono::seconds(30));

  long total = 0;
  std::string each;
  for (const auto& w : workers) {
    total += admitted_by(w);
    each += std::to_string(admitted_by(w)) + " ";
  }
  const auto held = spans(workers);
  CHECK(static_cast<long>(held.size()) == total);
  const long most = most_at_once(held);
  // At most limit x 3 s / 20 ms = 900 grants; each cross-process handoff waits up to a 10 ms poll.
  INFO("grants: " << total << " (by process: " << each << "), most held at once: " << most);
  CHECK(most <= limit);
  CHECK(most >= limit - 1);  // saturated (the spans logged are a little shorter than those Redis counted)
  CHECK(total >= 600);  // two thirds of the most (802 to 804 measured on an idle 2-core machine)
  CHECK(jain_index(workers) >= 0.95);  // equal demand: no process starves another

  // Every release reached Redis: nothing is held.
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  const auto left = execute(io, c, {"GET", "rein:{" + key + "}:sem:total"});
  CHECK(left.text == "0");
}

TEST_CASE("a process that wants every permit does not starve one that wants a single permit") {
  redis_server server;
  const std::string key = unique_key("greedy");
  const auto start = std::chrono::system_clock::now() + std::chrono::seconds(1);
  const auto start_us = std::chrono::duration_cast<std::chrono::microseconds>(start.time_since_epoch()).count();
  // The greedy process: 8 coroutines on 4 permits, so one of its waiters asks right after each of its
  // releases. The modest one: 1 coroutine, which alone would hold a permit 150 times in 3 s.
  std::vector<child> workers;
  for (const char* coroutines : {"8", "1"}) {
    workers.push_back(spawn(REIN_REDIS_SHARED_WORKER, {"semaphore", std::to_string(server.port()), key, std::to_string(start_us),
                                                       "3000", coroutines, "4", "20"}));
  }
  collect(workers, steady::now() + std::chrono::seconds(30));
  const long greedy = admitted_by(workers[0]);
  const long modest = admitted_by(workers[1]);
  INFO("greedy: " << greedy << ", modest: " << modest);
  CHECK(most_at_once(spans(workers)) <= 4);
  CHECK(modest >= 100);  // its turn comes after at most one round of the others: 2 of every 3 of its holds
}

TEST_CASE("a process killed with SIGKILL while holding permits gives them back within one lease") {
  redis_server server;
  const std::string key = unique_key("killed");
  constexpr long lease_ms = 500;
  child holder = spawn(REIN_REDIS_SHARED_WORKER, {"holder", std::to_string(server.port()), key, "4", std::to_string(lease_ms), "3"});
  const auto give_up = steady::now() + std::chrono::seconds(10);
  while (holder.output.find("holding") == std::string::npos && steady::now() < give_up) {
    read_for({&holder}, std::chrono::milliseconds(20));
  }
  REQUIRE(holder.output.find("holding") != std::string::npos);

  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  rein::redis::shared_semaphore sem(c, {.key = key, .limit = 4, .lease = std::chrono::milliseconds(lease_ms)});
  // The holder keeps its 3 permits while it lives (two leases long here): only 1 is free.
  std::optional<rein::error_code> all;
  rein::permit got;
  sem.async_acquire_for(4, std::chrono::milliseconds(2 * lease_ms), [&](rein::error_code ec, rein::permit p) {
    all = ec;
    got = std::move(p);
  });
  REQUIRE(run_until(io, [&] { return all.has_value(); }));
  CHECK(*all == rein::errc::timed_out);

  ::kill(holder.pid, SIGKILL);
  reap(holder);
  const auto killed = steady::now();
  all.reset();
  sem.async_acquire(4, [&](rein::error_code ec, rein::permit p) {
    all = ec;
    got = std::move(p);
  });
  REQUIRE(run_until(io, [&] { return all.has_value(); }));
  CHECK(*all == rein::error_code{});
  const auto back_after = std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - killed);
  INFO("the killed process's permits came back after " << back_after.count() << " ms (lease " << lease_ms << " ms)");
  CHECK(back_after.count() <= lease_ms + 100);  // one lease after its last renewal, plus a poll and a margin
}

TEST_CASE("a process stopped longer than its lease with a grant in its socket gives it back on waking: the "
          "fleet never holds more than the limit") {
  redis_server server;
  const std::string key = unique_key("stalled");
  constexpr long limit = 2;
  constexpr auto lease = std::chrono::milliseconds(300);
  const auto at = std::chrono::system_clock::now() + std::chrono::milliseconds(800);
  const auto at_us = std::chrono::duration_cast<std::chrono::microseconds>(at.time_since_epoch()).count();
  child staller = spawn(REIN_REDIS_SHARED_WORKER, {"staller", std::to_string(server.port()), key, std::to_string(limit),
                                                   std::to_string(lease.count()), std::to_string(at_us)});
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  rein::redis::shared_semaphore sem(c, {.key = key, .limit = limit, .lease = lease});
  CHECK(execute(io, c, {"PING"}).text == "PONG");

  // Redis stopped across the staller's request; the staller stopped before Redis answers it.
  std::this_thread::sleep_until(at - std::chrono::milliseconds(200));
  server.pause();
  std::this_thread::sleep_until(at + std::chrono::milliseconds(200));  // its acquire is in Redis's socket now
  ::kill(staller.pid, SIGSTOP);
  server.resume();  // Redis grants it (2 free) and extends its lease by 300 ms; the reply waits in its socket

  // The lease runs out while it sleeps: this process takes every permit (asked once its lease is gone).
  run_for(io, lease + std::chrono::milliseconds(100));
  std::optional<rein::error_code> all;
  rein::permit mine;
  sem.async_acquire_for(limit, std::chrono::seconds(3), [&](rein::error_code ec, rein::permit p) {
    all = ec;
    mine = std::move(p);
  });
  REQUIRE(run_until(io, [&] { return all.has_value(); }));
  REQUIRE(*all == rein::error_code{});

  ::kill(staller.pid, SIGCONT);  // it reads the grant, a lease and more after its request left
  run_for(io, std::chrono::milliseconds(300));  // running: this process's renewals keep its own lease
  CHECK(sem.lease_held());  // so its permits still count until the release below
  const auto released = std::chrono::system_clock::now().time_since_epoch();
  const auto released_us = std::chrono::duration_cast<std::chrono::microseconds>(released).count();
  mine.release();
  run_for(io, std::chrono::milliseconds(300));  // the release goes out; the staller polls, takes one, ends
  pump({&staller}, {}, steady::now() + std::chrono::seconds(5));
  const int status = reap(staller);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);

  INFO("staller said: " << staller.output);
  long long granted_us = 0;
  int held = -1;
  unsigned long long stale = 0, lost = 0;
  REQUIRE(std::sscanf(staller.output.c_str(), "granted %lld lease_held %d\nstale_grants %llu leases_lost %llu",
                      &granted_us, &held, &stale, &lost) == 4);
  CHECK(stale == 1);       // the grant it found on waking, given back
  CHECK(lost == 1);        // asked again under its lease, Redis said it had expired: a new one
  CHECK(granted_us >= released_us);  // its permit only after this process's were given back: never 3 held
  CHECK(granted_us - released_us < 200'000);  // by that release (polling every 10 ms), not a lease's end
  CHECK(held == 1);
  const auto left = execute(io, c, {"GET", "rein:{" + key + "}:sem:total"});
  CHECK(left.text == "0");
}
