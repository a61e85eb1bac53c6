// The least ACL a rein user needs (docs/redis.md), against a real redis-server: a user restricted to it runs
// every shared limiter, and one without EVALSHA gets a clear error at startup (async_connect).
#include "support.hpp"

#include <rein/error.hpp>
#include <rein/permit.hpp>
#include <rein/redis/connection.hpp>
#include <rein/redis/error.hpp>
#include <rein/redis/shared_quota_gate.hpp>
#include <rein/redis/shared_semaphore.hpp>
#include <rein/redis/shared_sliding_window.hpp>
#include <rein/redis/shared_token_bucket.hpp>

#include <chrono>
#include <optional>
#include <string>

using namespace rein_test;

namespace {

// The commands of docs/redis.md's least ACL: the handshake and circuit probe (PING), SCRIPT LOAD and
// EVALSHA, and what the four limiters' scripts and settings run. Keys: the default prefix "rein:".
constexpr const char* least_commands[] = {
    "+ping", "+script|load", "+evalsha", "+time", "+get", "+set", "+del", "+incr", "+incrby", "+pexpire",
    "+hget", "+hset", "+hmget", "+hdel", "+zadd", "+zcard", "+zrange", "+zrangebyscore", "+zrank", "+zrem",
    "+zremrangebyrank", "+zremrangebyscore"};

void set_user(net::io_context& io, rein::redis::connection& admin, const std::string& name, bool with_evalsha) {
  std::vector<std::string> args{"ACL", "SETUSER", name, "reset", "on", ">secret", "~rein:*", "-@all"};
  for (const char* command : least_commands) {
    if (with_evalsha || std::string(command) != "+evalsha") args.emplace_back(command);
  }
  std::vector<std::string_view> views(args.begin(), args.end());
  std::optional<rein::redis::reply> got;
  admin.async_execute(std::span<const std::string_view>(views), [&](rein::error_code ec, rein::redis::reply r) {
    REQUIRE_FALSE(ec);
    got = std::move(r);
  });
  REQUIRE(run_until(io, [&] { return got.has_value(); }));
  REQUIRE(got->text == "OK");
}

rein::redis::connection_options as_user(std::uint16_t port, const std::string& name) {
  auto o = local(port);
  o.username = name;
  o.password = "secret";
  return o;
}

rein::error_code start(net::io_context& io, rein::redis::connection& c) {
  std::optional<rein::error_code> result;
  c.async_connect([&](rein::error_code ec) { result = ec; });
  REQUIRE(run_until(io, [&] { return result.has_value(); }, std::chrono::seconds(5)));
  return *result;
}

}  // namespace

TEST_CASE("acl: a user restricted to the documented commands runs every shared limiter") {
  redis_server server;
  net::io_context io;
  rein::redis::connection admin(io, local(server.port()));
  set_user(io, admin, "rein-least", true);

  rein::redis::connection c(io, as_user(server.port(), "rein-least"));
  const std::string key = unique_key("acl");
  rein::redis::shared_semaphore sem(c, {.key = key + ":sem", .limit = 2});
  // The bucket's keys are `key` and its rate's key: with a hash tag, key + ":rate", so both start with "rein:".
  rein::redis::shared_token_bucket bucket(c, {.key = "rein:{" + key + "}:bucket", .rate = 100, .capacity = 5});
  rein::redis::shared_sliding_window window(c, {.key = key + ":window", .limit = 5, .window = std::chrono::seconds(1)});
  rein::redis::shared_quota_gate gate(c, {.key = key + ":gate"});
  CHECK(start(io, c) == rein::error_code{});
  CHECK(c.snapshot().startup_errors == 0);
  CHECK(c.snapshot().last_error_message.empty());

  std::optional<rein::error_code> sem_ec;
  rein::permit held;
  sem.async_acquire(2, [&](rein::error_code ec, rein::permit p) {
    sem_ec = ec;
    held = std::move(p);
  });
  recorder r(3);
  bucket.async_acquire(1, r.handler(0));
  window.async_acquire(1, r.handler(1));
  gate.async_acquire(1, r.handler(2));
  REQUIRE(run_until(io, [&] { return sem_ec.has_value() && r.all_done(); }));
  CHECK(*sem_ec == rein::error_code{});
  CHECK(held.count() == 2);
  for (const auto& result : r.results) CHECK(result->ec == rein::error_code{});
  // The settings and the release: SET, and the semaphore's release script.
  CHECK(sem.set_limit(3));
  CHECK(window.set_limit(6));
  CHECK(bucket.set_rate(200, 5));
  held.release();
  gate.pause_for(std::chrono::milliseconds(50));
  std::optional<rein::error_code> again;
  sem.async_acquire(2, [&](rein::error_code ec, rein::permit) { again = ec; });
  REQUIRE(run_until(io, [&] { return again.has_value(); }));
  CHECK(*again == rein::error_code{});
  CHECK(sem.snapshot().server_errors == 0);
  CHECK(bucket.snapshot().server_errors == 0);
  CHECK(window.snapshot().server_errors == 0);
  CHECK(gate.snapshot().server_errors == 0);
}

TEST_CASE("acl: a user without EVALSHA gets a clear error at startup, not at the first acquire") {
  redis_server server;
  net::io_context io;
  rein::redis::connection admin(io, local(server.port()));
  set_user(io, admin, "rein-no-evalsha", false);

  rein::redis::connection c(io, as_user(server.port(), "rein-no-evalsha"));
  rein::redis::shared_semaphore sem(c, {.key = unique_key("acl-denied"), .limit = 2});
  const rein::error_code ec = start(io, c);
  CHECK(ec == rein::redis::errc::permission_denied);
  CHECK(ec.message() == "Redis refused the user (ACL: wrong credentials or a command not allowed)");
  const auto s = c.snapshot();
  INFO(s.last_error_message);
  CHECK(s.last_error_message.starts_with("EVALSHA (permission check) refused: NOPERM"));
  CHECK(s.last_error_message.find("evalsha") != std::string::npos);
  CHECK(s.startup_errors == 1);

  // A connection with no limiter on it checks nothing about scripts: PING is all it needs.
  rein::redis::connection plain(io, as_user(server.port(), "rein-no-evalsha"));
  CHECK(start(io, plain) == rein::error_code{});
}

TEST_CASE("acl: a wrong password is a permission error at startup") {
  redis_server server;
  net::io_context io;
  rein::redis::connection admin(io, local(server.port()));
  set_user(io, admin, "rein-least", true);
  auto o = as_user(server.port(), "rein-least");
  o.password = "wrong";
  rein::redis::connection c(io, o);
  // The startup commands behind the refused AUTH are answered NOAUTH: the message stays AUTH's.
  rein::redis::shared_semaphore sem(c, {.key = unique_key("acl-wrongpass"), .limit = 1});
  const rein::error_code ec = start(io, c);
  CHECK(ec == rein::redis::errc::permission_denied);
  CHECK(c.snapshot().last_error_message.starts_with("AUTH refused: WRONGPASS"));
}
