// rein::redis::connection against a real redis-server: pipelining, order, errors, failures and reconnection.
#include "support.hpp"

#include <rein/redis/connection.hpp>
#include <rein/redis/detail/sha1.hpp>
#include <rein/redis/shared_token_bucket.hpp>

#include <string>
#include <vector>

using namespace rein_test;
using rein::redis::reply;

TEST_CASE("PING answers PONG, and the first command connects") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  CHECK_FALSE(c.connected());
  const reply r = execute(io, c, {"PING"});
  CHECK(r.type == reply::kind::status);
  CHECK(r.text == "PONG");
  const auto s = c.snapshot();
  CHECK(s.connected);
  CHECK(s.connects == 1);
  CHECK(s.requests == 1);
  CHECK(s.replies == 1);
  CHECK(s.pending == 0);
  CHECK(s.round_trip_total > std::chrono::nanoseconds(0));
  CHECK(s.round_trip_max >= s.round_trip_last);
}

TEST_CASE("a thousand commands issued at once are pipelined and answered in order") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  const std::string key = unique_key("incr");
  std::vector<long long> values;
  for (int i = 0; i < 1000; ++i) {
    c.async_execute({"INCR", key}, [&](rein::error_code ec, reply r) {
      REQUIRE_FALSE(ec);
      values.push_back(r.integer);
    });
  }
  REQUIRE(run_until(io, [&] { return values.size() == 1000; }));
  for (std::size_t i = 0; i < values.size(); ++i) REQUIRE(values[i] == static_cast<long long>(i + 1));
  const auto s = c.snapshot();
  CHECK(s.requests == 1000);
  CHECK(s.replies == 1000);
  // Pipelined: a thousand round trips one after the other would each wait for the previous reply; here the
  // writes batch, so the whole run took far fewer write calls than commands. The observable proof is that
  // the mean submit-to-reply time exceeds the minimum one (replies queue behind each other), checked loosely.
  CHECK(s.round_trip_total / 1000 <= s.round_trip_max);
}

TEST_CASE("an error reply is a reply, not a failure") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  const std::string key = unique_key("wrongtype");
  execute(io, c, {"SET", key, "text"});
  const reply r = execute(io, c, {"INCR", key});
  CHECK(r.is_error());
  CHECK(r.text.starts_with("ERR"));
  CHECK(execute(io, c, {"GET", key}).text == "text");
}

TEST_CASE("SCRIPT LOAD returns the SHA-1 rein computes for the bucket script") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  const reply r = execute(io, c, {"SCRIPT", "LOAD", rein::redis::detail::token_bucket_script});
  CHECK(r.text == rein::redis::detail::sha1_hex(rein::redis::detail::token_bucket_script));
}

TEST_CASE("the bucket script's arithmetic, read through EVALSHA") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  const std::string sha = execute(io, c, {"SCRIPT", "LOAD", rein::redis::detail::token_bucket_script}).text;
  const std::string key = unique_key("script");
  // 10 per second (100,000 us per token), capacity 3.
  const std::string stored = "{" + key + "}:rate";  // no rate stored for the fleet: ARGV's decide
  const auto take = [&](const char* n) { return execute(io, c, {"EVALSHA", sha, "2", key, stored, "100000", "3", n}); };

  const reply first = take("2");  // a fresh key is a full bucket
  REQUIRE(first.elements.size() == 5);
  CHECK(first.elements[0].integer == 1);
  CHECK(first.elements[1].integer == 0);
  CHECK(first.elements[2].integer == 100'000);  // one token left, exactly
  CHECK(first.elements[3].integer == 2);        // taken
  const reply time = execute(io, c, {"TIME"});  // the last number is the server's TIME when it decided
  REQUIRE(time.elements.size() == 2);
  const long long now_us = std::stoll(time.elements[0].text) * 1'000'000 + std::stoll(time.elements[1].text);
  CHECK(first.elements[4].integer <= now_us);
  CHECK(first.elements[4].integer > now_us - 10'000'000);

  const reply second = take("2");  // only a bit more than one token since
  CHECK(second.elements[0].integer == 0);
  const long long retry = second.elements[1].integer;
  const long long available = second.elements[2].integer;
  CHECK(retry + available == 200'000);  // what is missing plus what is there is what was asked
  CHECK(retry > 0);
  CHECK(retry <= 100'000);

  const long long ttl = execute(io, c, {"PTTL", key}).integer;  // expires when the bucket is full again
  CHECK(ttl > 0);
  CHECK(ttl <= 201);

  const reply refund = take("-3");  // back to full (never above): the key goes away
  CHECK(refund.elements[0].integer == 1);
  CHECK(refund.elements[2].integer == 300'000);
  CHECK(execute(io, c, {"EXISTS", key}).integer == 0);

  // A batch: at least 1, up to 5, as many whole tokens as the bucket holds (3, full).
  const reply batch = execute(io, c, {"EVALSHA", sha, "2", key, stored, "100000", "3", "1", "5"});
  CHECK(batch.elements[0].integer == 1);
  CHECK(batch.elements[3].integer == 3);
  CHECK(batch.elements[2].integer < 100'000);  // less than one token left
  const reply empty = execute(io, c, {"EVALSHA", sha, "2", key, stored, "100000", "3", "1", "5"});
  CHECK(empty.elements[0].integer == 0);  // not even the one it needs
  CHECK(empty.elements[3].integer == 0);

  // A rate stored for the fleet decides instead, and the reply says which: 1,000 per second, capacity 2.
  execute(io, c, {"HSET", stored, "interval", "1000", "capacity", "2"});
  execute(io, c, {"DEL", key});
  const reply fleet = take("2");
  REQUIRE(fleet.elements.size() == 7);
  CHECK(fleet.elements[0].integer == 1);
  CHECK(fleet.elements[2].integer == 0);           // 2 of capacity 2 taken
  CHECK(fleet.elements[4].integer == 1'000'000);   // nanoseconds per token
  CHECK(fleet.elements[5].integer == 2);
}

TEST_CASE("SELECT follows every connection when a database is set") {
  redis_server server;
  net::io_context io;
  auto options = local(server.port());
  options.database = 3;
  rein::redis::connection in_3(io, options);
  rein::redis::connection in_0(io, local(server.port()));
  const std::string key = unique_key("db");
  execute(io, in_3, {"SET", key, "three"});
  CHECK(execute(io, in_0, {"GET", key}).type == reply::kind::nil);
  CHECK(execute(io, in_3, {"GET", key}).text == "three");
}

TEST_CASE("AUTH comes first; a refused password drops the connection and counts as a startup error") {
  redis_server server(free_port(), {"--requirepass", "secret"});
  net::io_context io;
  auto good = local(server.port());
  good.password = "secret";
  rein::redis::connection authed(io, good);
  CHECK(execute(io, authed, {"PING"}).text == "PONG");

  auto bad = local(server.port());
  bad.password = "wrong";
  rein::redis::connection refused(io, bad);
  // Redis still answers what was pipelined behind the refused AUTH, with NOAUTH.
  const reply r = execute(io, refused, {"PING"});
  CHECK(r.is_error());
  CHECK(r.text.starts_with("NOAUTH"));
  const auto s = refused.snapshot();
  CHECK(s.disconnects >= 1);
  CHECK(s.startup_errors >= 1);
  CHECK(s.last_error == rein::redis::errc::permission_denied);  // WRONGPASS
  CHECK(s.last_error_message.starts_with("AUTH refused: WRONGPASS"));
}

TEST_CASE("a refused password backs off like any failure; its reply does not restart the backoff") {
  // The refused AUTH is a reply: had it reset the failures, every retry would be drawn below the base
  // delay for ever (hundreds of connections a second to a server that will never accept the secret).
  redis_server server(free_port(), {"--requirepass", "secret"});
  net::io_context io;
  auto bad = local(server.port());
  bad.password = "wrong";
  bad.reconnect_base = std::chrono::milliseconds{10};
  bad.reconnect_cap = std::chrono::milliseconds{400};
  rein::redis::connection refused(io, bad);
  (void)execute(io, refused, {"PING"});
  io.restart();
  io.run_for(std::chrono::milliseconds{1500});
  const auto s = refused.snapshot();
  INFO("disconnects " << s.disconnects << ", connect failures " << s.connect_failures);
  // With the backoff growing from 10 ms to 400 ms, about 10 attempts fit in 1.5 s; at the base delay
  // (the defect) well over 100 did. The bound leaves room for a slow machine in both directions.
  CHECK(s.disconnects + s.connect_failures >= 2);
  CHECK(s.disconnects + s.connect_failures <= 40);
}

TEST_CASE("with no server, commands fail with unavailable; once it starts, they succeed") {
  const std::uint16_t port = free_port();
  net::io_context io;
  rein::redis::connection c(io, local(port));
  rein::error_code ec;
  execute(io, c, {"PING"}, &ec);
  CHECK(ec == rein::redis::errc::unavailable);
  CHECK(c.snapshot().connect_failures >= 1);

  redis_server server(port);
  // The connection retries on its own (backoff capped at 100 ms here); commands work once it is back.
  bool ok = false;
  REQUIRE(run_until(io, [&] {
    if (!ok && c.connected()) ok = true;
    return ok;
  }, std::chrono::seconds(5)));
  CHECK(execute(io, c, {"PING"}).text == "PONG");
  CHECK(c.snapshot().connects == 1);
}

TEST_CASE("a silent server is given up after request_timeout, then reconnected to") {
  redis_server server;
  net::io_context io;
  auto options = local(server.port());
  options.request_timeout = std::chrono::milliseconds(300);
  rein::redis::connection c(io, options);
  CHECK(execute(io, c, {"PING"}).text == "PONG");

  server.pause();  // connected, but answers nothing
  const auto start = steady::now();
  rein::error_code ec;
  execute(io, c, {"PING"}, &ec);
  const auto waited = steady::now() - start;
  CHECK(ec == rein::redis::errc::unavailable);
  CHECK(waited >= std::chrono::milliseconds(300));
  CHECK(waited < std::chrono::milliseconds(2000));
  CHECK(c.snapshot().last_error == net::error::timed_out);
  CHECK(c.snapshot().disconnects == 1);

  server.resume();
  REQUIRE(run_until(io, [&] { return c.connected(); }, std::chrono::seconds(5)));
  CHECK(execute(io, c, {"PING"}).text == "PONG");
}

TEST_CASE("a killed server fails what is pending; a restarted one on the same port is used again") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  CHECK(execute(io, c, {"PING"}).text == "PONG");

  server.kill();
  rein::error_code ec;
  execute(io, c, {"PING"}, &ec);
  CHECK(ec == rein::redis::errc::unavailable);

  server.start();
  REQUIRE(run_until(io, [&] { return c.connected(); }, std::chrono::seconds(5)));
  CHECK(execute(io, c, {"PING"}).text == "PONG");
  const auto s = c.snapshot();
  CHECK(s.connects == 2);
  CHECK(s.disconnects == 1);
}

TEST_CASE("close() aborts pending commands and refuses later ones") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  CHECK(execute(io, c, {"PING"}).text == "PONG");
  server.pause();
  std::optional<rein::error_code> pending;
  c.async_execute({"PING"}, [&](rein::error_code ec, reply) { pending = ec; });
  run_for(io, std::chrono::milliseconds(20));
  CHECK_FALSE(pending.has_value());
  c.close();
  REQUIRE(run_until(io, [&] { return pending.has_value(); }));
  CHECK(*pending == net::error::operation_aborted);
  rein::error_code later;
  execute(io, c, {"PING"}, &later);
  CHECK(later == rein::redis::errc::unavailable);
  server.resume();
}

TEST_CASE("without rein::redis_tls, TLS options are refused at construction, never ignored") {
  net::io_context io;
  rein::redis::connection_options o;
  o.tls.enabled = true;
  CHECK_THROWS_WITH(rein::redis::connection(io, o),
                    "rein::redis::connection: tls.enabled is true, but rein was built without TLS (link "
                    "rein::redis_tls, or define REIN_REDIS_TLS for every file and link OpenSSL)");
  rein::redis::connection_options stray;
  stray.tls.server_name = "redis.internal";
  CHECK_THROWS_WITH(rein::redis::connection(io, stray),
                    "rein::redis::connection: tls.server_name is \"redis.internal\" but tls.enabled is false (no "
                    "plaintext fallback)");
}
