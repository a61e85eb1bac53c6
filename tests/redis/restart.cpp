// Redis killed mid-run and restarted on the same port, under each failure policy: no crash, no wait past a
// deadline, the policy observed during the outage, admissions from Redis again once it is back.
#include "support.hpp"

#include <rein/error.hpp>
#include <rein/redis/shared_token_bucket.hpp>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

using namespace rein_test;
using rein::redis::failure_policy;

namespace {

struct event {
  steady::time_point at;
  rein::error_code ec;
  steady::duration took;
};

struct run_result {
  std::vector<event> events;
  steady::time_point killed_at;
  steady::time_point restarting_at;  // just before start(): Redis cannot have answered before this
  steady::time_point restarted_at;   // start() returned: the server answers PING
  std::uint64_t remote_allowed_before_restart = 0;
  rein::redis::shared_token_bucket_snapshot before_stop;  // 1.5 s after the restart, still running
  rein::redis::shared_token_bucket_snapshot end;
  rein::redis::connection_snapshot connection;
};

constexpr auto deadline = std::chrono::milliseconds(200);

// Four coroutines take tokens (100 per second, burst 10) with a 200 ms deadline each, in a loop (pausing
// 10 ms after an error, as a client would), while another thread kills Redis at 1 s and restarts it at 2 s.
run_result run_with_outage(failure_policy policy) {
  redis_server server;
  net::io_context io;
  auto connection = local(server.port());
  connection.request_timeout = std::chrono::milliseconds(300);
  rein::redis::shared_token_bucket bucket(
      io, connection,
      {.key = unique_key("restart"), .rate = 100, .capacity = 10, .on_failure = policy, .fail_open_share = 0.5});

  run_result result;
  std::mutex m;
  std::atomic<bool> stop{false};
  int running = 4;
  for (int i = 0; i < 4; ++i) {
    net::co_spawn(io, [&]() -> net::awaitable<void> {
      net::steady_timer pause(io);
      while (!stop.load()) {
        const auto t0 = steady::now();
        auto [ec] = co_await bucket.async_acquire_for(1, deadline, as_tuple(net::use_awaitable));
        const auto t1 = steady::now();
        {
          std::lock_guard<std::mutex> lock(m);
          result.events.push_back({t1, ec, t1 - t0});
        }
        if (ec) {
          pause.expires_after(std::chrono::milliseconds(10));
          co_await pause.async_wait(net::use_awaitable);
        }
      }
      if (--running == 0) bucket.close();  // closes its own connection: run() returns
    }, net::detached);
  }
  std::thread outage([&] {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    server.kill();
    result.killed_at = steady::now();
    std::this_thread::sleep_for(std::chrono::seconds(1));
    result.remote_allowed_before_restart = bucket.snapshot().remote_allowed;
    result.restarting_at = steady::now();
    server.start();
    result.restarted_at = steady::now();
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    result.before_stop = bucket.snapshot();
    stop.store(true);
  });
  io.run();
  outage.join();
  result.end = bucket.snapshot();
  result.connection = bucket.connection_snapshot();
  return result;
}

void check_common(const run_result& r) {
  REQUIRE_FALSE(r.events.empty());
  for (const auto& e : r.events) {
    // Nothing waits past its deadline (plus scheduling slack): not on a dead socket, not on reconnection.
    REQUIRE(e.took < deadline + std::chrono::milliseconds(250));
  }
  std::size_t before = 0;
  std::size_t after = 0;
  for (const auto& e : r.events) {
    if (e.ec) continue;
    if (e.at < r.killed_at) ++before;
    if (e.at > r.restarted_at) ++after;
  }
  INFO("admitted before the kill: " << before << ", after the restart: " << after);
  CHECK(before > 50);  // about 100 per second plus the burst
  CHECK(after > 50);   // admissions resumed
  // ... from Redis, not just locally: the connection came back and the script was loaded on it.
  CHECK(r.end.remote_allowed > r.remote_allowed_before_restart + 50);
  CHECK_FALSE(r.before_stop.degraded);
  CHECK(r.before_stop.connected);
  CHECK(r.connection.disconnects >= 1);
  CHECK(r.connection.connects >= 2);
}

}  // namespace

TEST_CASE("fail_closed: while Redis is down nothing is admitted and callers get unavailable at once") {
  const run_result r = run_with_outage(failure_policy::fail_closed);
  check_common(r);
  std::size_t admitted_during = 0;
  std::size_t unavailable = 0;
  for (const auto& e : r.events) {
    const bool during = e.at > r.killed_at + std::chrono::milliseconds(50) && e.at < r.restarting_at;
    if (!e.ec) {
      if (during) ++admitted_during;
      continue;
    }
    // Only the policy's error, and deadlines.
    CHECK((e.ec == rein::redis::errc::unavailable || e.ec == rein::errc::timed_out));
    if (e.ec == rein::redis::errc::unavailable) ++unavailable;
  }
  INFO("admitted during the outage: " << admitted_during << ", unavailable: " << unavailable);
  CHECK(admitted_during == 0);
  CHECK(unavailable > 10);
  CHECK(r.end.unavailable_total == unavailable);
  CHECK(r.end.local_admitted == 0);
}

TEST_CASE("fail_open: while Redis is down the local bucket admits its share of the quota, and no errors") {
  const run_result r = run_with_outage(failure_policy::fail_open);
  check_common(r);
  std::size_t admitted_during = 0;
  for (const auto& e : r.events) {
    CHECK((!e.ec || e.ec == rein::errc::timed_out));
    if (!e.ec && e.at > r.killed_at && e.at < r.restarting_at) ++admitted_during;
  }
  const double outage_s = std::chrono::duration<double>(r.restarting_at - r.killed_at).count();
  INFO("admitted during the outage: " << admitted_during << " in " << outage_s << " s, locally in all: "
                                      << r.end.local_admitted);
  // Locally 50 per second with a burst of 5; a few more may be Redis's own just before the kill.
  CHECK(static_cast<double>(admitted_during) <= 50 * outage_s + 5 + 10);
  CHECK(static_cast<double>(admitted_during) >= 0.5 * 50 * outage_s);
  CHECK(r.end.local_admitted >= admitted_during - 10);
  CHECK(r.end.unavailable_total == 0);
}
