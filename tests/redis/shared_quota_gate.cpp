// rein::redis::shared_quota_gate against a real redis-server: two gates on two connections stand for two
// processes.
#include "support.hpp"

#include <rein/error.hpp>
#include <rein/redis/shared_quota_gate.hpp>

#include <string>
#include <vector>

using namespace rein_test;
using rein::redis::shared_quota_gate;
using rein::redis::shared_quota_gate_options;

TEST_CASE("a pause written through one gate holds another process's gate until the stored release") {
  redis_server server;
  net::io_context io;
  rein::redis::connection ca(io, local(server.port()));
  rein::redis::connection cb(io, local(server.port()));
  const std::string key = unique_key("gate");
  shared_quota_gate writer(ca, {.key = key, .jitter = 0.5});
  shared_quota_gate reader(cb, {.key = key});
  recorder r(3);
  reader.async_acquire(1, r.handler(0));
  REQUIRE(run_until(io, [&] { return r.completed() == 1; }));
  CHECK_FALSE(r.results[0]->ec);  // open

  writer.on_retry_after("1", std::chrono::seconds(5));  // a 429 with "Retry-After: 1"
  const std::string pause_key = "rein:{" + key + "}:pause";
  REQUIRE(run_until(io, [&] { return execute(io, ca, {"EXISTS", pause_key}).integer == 1; }));
  const auto stored = execute(io, ca, {"HMGET", pause_key, "until", "release"});
  REQUIRE(stored.elements.size() == 2);
  const long long until = std::stoll(stored.elements[0].text);
  const long long release = std::stoll(stored.elements[1].text);
  CHECK(release - until >= 0);
  CHECK(release - until <= 500000);  // jitter 0.5 of 1 s, drawn by the writer

  const auto asked = steady::now();
  reader.async_acquire_for(1, std::chrono::milliseconds(100), r.handler(1));  // before the release: at once
  reader.async_acquire(1, r.handler(2));
  REQUIRE(run_until(io, [&] { return r.all_done(); }, std::chrono::seconds(5)));
  CHECK(r.results[1]->ec == rein::errc::timed_out);
  CHECK_FALSE(r.results[2]->ec);
  const auto now_us = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
  CHECK(now_us >= release);  // granted after the release (the same machine's clock as Redis's)
  CHECK(r.results[2]->at - asked >= std::chrono::milliseconds(500));
  const auto s = reader.snapshot();
  CHECK(s.remote_denied >= 1);
  CHECK(s.release == std::chrono::system_clock::time_point(std::chrono::microseconds(release)));
  CHECK(writer.snapshot().pauses == 1);
}

TEST_CASE("a shorter pause does not shorten a stored one; a longer one extends it") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  const std::string key = unique_key("extend");
  shared_quota_gate gate(c, {.key = key, .jitter = 0});
  const std::string pause_key = "rein:{" + key + "}:pause";
  const auto until = [&] { return std::stoll(execute(io, c, {"HGET", pause_key, "until"}).text); };
  gate.pause_for(std::chrono::seconds(20));
  const long long first = until();
  gate.pause_for(std::chrono::seconds(1));
  CHECK(until() == first);
  gate.pause_for(std::chrono::seconds(40));
  const long long extended = until();
  CHECK(extended - first >= 19'000'000);
  CHECK(std::stoll(execute(io, c, {"HGET", pause_key, "release"}).text) == extended);  // no jitter
  CHECK(execute(io, c, {"PTTL", pause_key}).integer > 39'000);
}

TEST_CASE("a pause written after SCRIPT FLUSH loads the script and still reaches the other process") {
  redis_server server;
  net::io_context io;
  rein::redis::connection ca(io, local(server.port()));
  rein::redis::connection cb(io, local(server.port()));
  const std::string key = unique_key("flushed");
  shared_quota_gate writer(ca, {.key = key, .jitter = 0});
  shared_quota_gate reader(cb, {.key = key});
  recorder r(2);
  reader.async_acquire(1, r.handler(0));
  REQUIRE(run_until(io, [&] { return r.completed() == 1; }));
  CHECK_FALSE(r.results[0]->ec);  // open, and both connections have loaded the script

  CHECK(execute(io, ca, {"SCRIPT", "FLUSH"}).text == "OK");
  writer.on_retry_after("2", std::chrono::seconds(5));  // answered NOSCRIPT, then loaded and sent again
  const std::string pause_key = "rein:{" + key + "}:pause";
  REQUIRE(run_until(io, [&] { return execute(io, ca, {"EXISTS", pause_key}).integer == 1; }));
  const auto w = writer.snapshot();
  CHECK(w.script_loads == 1);
  CHECK(w.server_errors == 0);
  CHECK(w.pauses == 1);

  reader.async_acquire_for(1, std::chrono::milliseconds(200), r.handler(1));  // its own load, then held
  REQUIRE(run_until(io, [&] { return r.all_done(); }, std::chrono::seconds(5)));
  CHECK(r.results[1]->ec == rein::errc::timed_out);
}
