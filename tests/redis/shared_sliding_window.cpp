// rein::redis::shared_sliding_window against a real redis-server, in one process.
#include "support.hpp"

#include <rein/error.hpp>
#include <rein/redis/shared_sliding_window.hpp>

#include <algorithm>
#include <string>
#include <vector>

using namespace rein_test;
using rein::redis::shared_sliding_window;
using rein::redis::shared_sliding_window_options;

namespace {

shared_sliding_window_options per(const std::string& name, std::int64_t limit, std::chrono::milliseconds window) {
  return {.key = unique_key(name), .limit = limit, .window = window};
}

}  // namespace

TEST_CASE("the window admits its limit at once, then the next when the oldest admission leaves") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  const auto options = per("window", 3, std::chrono::milliseconds(400));
  shared_sliding_window window(c, options);
  recorder r(5);
  const auto start = steady::now();
  for (std::size_t i = 0; i < 5; ++i) window.async_acquire(1, r.handler(i));
  REQUIRE(run_until(io, [&] { return r.completed() == 3; }));
  // Three stamps (and, below score 0, this process once its fourth request was denied: the fleet queue).
  CHECK(execute(io, c, {"ZCOUNT", "rein:{" + options.key + "}:window", "0", "+inf"}).integer == 3);
  REQUIRE(run_until(io, [&] { return r.all_done(); }));
  CHECK(r.succeeded() == 5);
  CHECK(r.order == std::vector<std::size_t>{0, 1, 2, 3, 4});  // FIFO
  // The fourth and fifth were admitted when the first and second left: 400 ms after them at the earliest.
  CHECK(r.results[3]->at - r.results[0]->at >= std::chrono::milliseconds(399));
  CHECK(r.results[4]->at - r.results[1]->at >= std::chrono::milliseconds(399));
  CHECK(r.results[4]->at - start < std::chrono::seconds(2));
  const auto s = window.snapshot();
  CHECK(s.remote_allowed == 5);
  CHECK(s.remote_denied >= 1);
  CHECK(s.acquired_total == 5);
}

TEST_CASE("a deadline before the oldest admission leaves fails at once; a refund frees a place") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  shared_sliding_window window(c, per("refund", 1, std::chrono::seconds(30)));
  recorder r(3);
  window.async_acquire(1, r.handler(0));
  REQUIRE(run_until(io, [&] { return r.completed() == 1; }));
  const auto asked = steady::now();
  window.async_acquire_for(1, std::chrono::seconds(10), r.handler(1));  // the place frees in 30 s
  REQUIRE(run_until(io, [&] { return r.completed() == 2; }));
  CHECK(r.results[1]->ec == rein::errc::timed_out);
  CHECK(r.results[1]->at - asked < std::chrono::seconds(10));  // at once, not at the deadline
  window.refund(1);
  window.async_acquire_for(1, std::chrono::seconds(10), r.handler(2));
  REQUIRE(run_until(io, [&] { return r.all_done(); }));
  CHECK_FALSE(r.results[2]->ec);
  CHECK(window.snapshot().refunds == 1);
}

TEST_CASE("after SCRIPT FLUSH, the window's script is loaded again and the admission retried") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  shared_sliding_window window(c, per("noscript", 10, std::chrono::seconds(1)));
  recorder r(2);
  window.async_acquire(1, r.handler(0));
  REQUIRE(run_until(io, [&] { return r.completed() == 1; }));
  CHECK(execute(io, c, {"SCRIPT", "FLUSH"}).text == "OK");
  window.async_acquire(2, r.handler(1));
  REQUIRE(run_until(io, [&] { return r.all_done(); }));
  CHECK_FALSE(r.results[1]->ec);
  const auto s = window.snapshot();
  CHECK(s.script_loads == 1);
  CHECK(s.remote_allowed == 2);
  CHECK(s.free == 7);
}

TEST_CASE("fail_closed: a window whose Redis is gone completes acquires with unavailable") {
  net::io_context io;
  auto options = per("gone", 10, std::chrono::seconds(1));
  rein::redis::connection_options redis = local(1);  // nothing listens on port 1
  shared_sliding_window window(io, redis, options);
  recorder r(1);
  window.async_acquire(1, r.handler(0));
  REQUIRE(run_until(io, [&] { return r.all_done(); }));
  CHECK(r.results[0]->ec == rein::redis::errc::unavailable);
  window.close();
}

TEST_CASE("set_limit changes the window's limit for every process at its next request") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c1(io, local(server.port()));
  rein::redis::connection c2(io, local(server.port()));
  const auto options = per("set_limit", 5, std::chrono::seconds(60));
  shared_sliding_window a(c1, options);
  shared_sliding_window b(c2, options);  // another process: it only learns the limit from Redis
  REQUIRE(a.set_limit(2));
  CHECK(execute(io, c1, {"GET", "rein:{" + options.key + "}:window:limit"}).text == "2");  // after the SET
  recorder r(6);
  b.async_acquire(1, r.handler(0));
  b.async_acquire(1, r.handler(1));
  b.async_acquire_for(1, std::chrono::milliseconds(200), r.handler(2));  // the window holds 2 now, not 5
  REQUIRE(run_until(io, [&] { return r.completed() == 3; }));
  CHECK_FALSE(r.results[0]->ec);
  CHECK_FALSE(r.results[1]->ec);
  CHECK(r.results[2]->ec == rein::errc::timed_out);
  // More than the stored limit could only wait forever: an error, at once; the process's own limit holds
  // too. (Asked of `a`: b holds its line until the place it was denied frees, as every window does.)
  a.async_acquire(3, r.handler(3));
  a.async_acquire(6, r.handler(4));
  REQUIRE(run_until(io, [&] { return r.completed() == 5; }));
  CHECK(r.results[3]->ec == rein::redis::errc::server_error);
  CHECK(r.results[4]->ec == rein::errc::exceeds_capacity);
  // Raised again: three more fit beside the two in the window.
  REQUIRE(a.set_limit(5));
  CHECK(execute(io, c1, {"GET", "rein:{" + options.key + "}:window:limit"}).text == "5");
  a.async_acquire(3, r.handler(5));
  REQUIRE(run_until(io, [&] { return r.all_done(); }));
  CHECK_FALSE(r.results[5]->ec);
  CHECK(execute(io, c2, {"ZCOUNT", "rein:{" + options.key + "}:window", "0", "+inf"}).integer == 5);  // stamps
  CHECK_THROWS_WITH(a.set_limit(0), "rein::redis::shared_sliding_window: limit must be in [1, 2^27] admissions, got 0");
  CHECK_THROWS_WITH(a.set_limit((std::int64_t{1} << 27) + 1),
                    "rein::redis::shared_sliding_window: limit must be in [1, 2^27] admissions, got 134217729");
}

namespace {

// The window's script run by hand (EVAL) as the process `name`: {allowed, retry_after us, free places}; the
// server's time it also returns is kept in `server_time`.
struct script_runner {
  net::io_context& io;
  rein::redis::connection& c;
  std::string key;
  std::string window_us;
  std::string limit;
  std::string grace_us;
  mutable long long server_time = 0;  // of the last ask, microseconds since the Unix epoch

  // `patience`: how long the caller will wait, microseconds (0: no deadline); `wanted`: the units its
  // process waits for in all (0: n).
  std::vector<long long> ask(const std::string& name, long long n, long long patience = 0, long long wanted = 0) const {
    const std::string log = "rein:{" + key + "}:window";
    const std::string seq = log + ":seq";
    const std::string stored_limit = log + ":limit";
    const std::string script(rein::redis::detail::sliding_window_script);
    const auto r = execute(io, c, {"EVAL", script, "3", log, seq, stored_limit, window_us, limit, std::to_string(n),
                                   name, grace_us, std::to_string(patience), std::to_string(wanted)});
    std::vector<long long> out;
    for (const auto& e : r.elements) out.push_back(e.integer);
    REQUIRE(out.size() == 4);
    server_time = out.back();
    out.pop_back();
    return out;
  }

  // The stamps of the admissions in the window (their scores: the server's time of each), oldest first.
  std::vector<long long> stamps() const {
    const auto r = execute(io, c, {"ZRANGEBYSCORE", "rein:{" + key + "}:window", "(0", "+inf", "WITHSCORES"});
    std::vector<long long> out;
    for (std::size_t i = 1; i < r.elements.size(); i += 2) out.push_back(std::stoll(r.elements[i].text));
    return out;
  }

  // The queued processes, first denial first: "name served wanted".
  std::vector<std::string> queue() const {
    const auto r = execute(io, c, {"ZRANGEBYSCORE", "rein:{" + key + "}:window", "-inf", "(0"});
    std::vector<std::string> entries;
    for (const auto& e : r.elements) {
      std::string entry = e.text.substr(2, e.text.rfind(':') - 2);  // without "q:" and the expiry
      std::replace(entry.begin(), entry.end(), ':', ' ');
      entries.push_back(entry);
    }
    return entries;
  }
};

using reply_of = std::vector<long long>;
using entries = std::vector<std::string>;

}  // namespace

TEST_CASE("the fleet queue: a freed place goes to the process denied first, not to the one asking first") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  const script_runner s{io, c, unique_key("fleet"), "60000000", "2", "60000000"};  // nothing leaves by itself
  CHECK(s.ask("a", 1) == reply_of{1, 0, 1});
  CHECK(s.ask("a", 1) == reply_of{1, 0, 0});  // a counts 2 served, wants no more
  CHECK(s.ask("b", 1)[0] == 0);  // full: b is queued, then c, both joining at the least count served
  CHECK(s.ask("c", 1)[0] == 0);
  CHECK(s.queue() == entries{"a 2 0", "b 2 1", "c 2 1"});
  CHECK(s.ask("a", -1) == reply_of{1, 0, 1});  // a refund frees one place
  // The place is b's: c, queued behind b, and d, not queued, are denied though it is free. d's turn comes
  // only after b and c took theirs, a window from now at the earliest.
  const auto behind = s.ask("c", 1);
  CHECK(behind[0] == 0);
  CHECK(behind[2] == 0);
  // e will not wait that long (its deadline comes first): denied, not queued, nobody waits for it.
  CHECK(s.ask("e", 1, 59999999) == reply_of{0, 60000000, 0});
  CHECK(s.ask("d", 1, 60000000) == reply_of{0, 60000000, 0});
  CHECK(s.queue() == entries{"a 2 0", "b 2 1", "c 2 1", "d 2 1"});
  // b takes it; what is left free to its next unit is nothing: c and d are owed one each first.
  CHECK(s.ask("b", 1) == reply_of{1, 0, 0});
  CHECK(s.queue() == entries{"a 2 0", "b 3 0", "c 2 1", "d 2 1"});
  CHECK(s.ask("b", 1)[0] == 0);  // b's second unit comes after c's and d's first
  CHECK(s.ask("a", -2) == reply_of{1, 0, 2});
  CHECK(s.ask("b", 1)[0] == 0);  // two free places, both owed
  CHECK(s.ask("d", 1) == reply_of{1, 0, 0});
  CHECK(s.ask("c", 1) == reply_of{1, 0, 0});
  CHECK(s.queue() == entries{"a 2 0", "b 3 1", "c 3 0", "d 3 0"});
  // Two stamps and four processes; the counter numbered 5 admissions and 4 first appearances.
  CHECK(execute(io, c, {"ZCARD", "rein:{" + s.key + "}:window"}).integer == 6);
  CHECK(execute(io, c, {"GET", "rein:{" + s.key + "}:window:seq"}).text == "9");
}

TEST_CASE("the fleet queue: a burst of freed places is shared, not taken by whoever asks first") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  const script_runner s{io, c, unique_key("burst"), "60000000", "12", "60000000"};
  CHECK(s.ask("a", 12) == reply_of{1, 0, 0});
  for (const char* name : {"b", "c", "d"}) CHECK(s.ask(name, 1, 0, 8)[0] == 0);  // each waits for 8
  CHECK(s.ask("a", -12) == reply_of{1, 0, 12});  // 12 places free at once
  // b asks first, and again and again: it gets its share, 4 (c and d are owed as many before its next).
  CHECK(s.ask("b", 1, 0, 8) == reply_of{1, 0, 9});
  CHECK(s.ask("b", 1, 0, 7) == reply_of{1, 0, 6});
  CHECK(s.ask("b", 1, 0, 6) == reply_of{1, 0, 3});
  CHECK(s.ask("b", 1, 0, 5) == reply_of{1, 0, 0});
  CHECK(s.ask("b", 1, 0, 4)[0] == 0);
  CHECK(s.ask("d", 1, 0, 8) == reply_of{1, 0, 5});  // c is owed 2 before d's next
  CHECK(s.queue() == entries{"a 12 0", "b 16 4", "c 12 8", "d 13 7"});
}

// Requests of several units each: what the others are owed is counted before the asker's first unit, so the
// first in line gets in once its units are free. Counted to its last unit, a and b (3 each of a limit of 3)
// were each owed the other's 3 first and both were denied for ever, with the window empty.
TEST_CASE("the fleet queue: processes asking for more than limit / 2 at once take turns, none starves") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  const script_runner s{io, c, unique_key("units"), "60000000", "3", "60000000"};
  CHECK(s.ask("x", 3) == reply_of{1, 0, 0});  // the window full
  CHECK(s.ask("a", 3)[0] == 0);                // a, then b, queued for 3 each
  CHECK(s.ask("b", 3)[0] == 0);
  CHECK(s.ask("x", -3) == reply_of{1, 0, 3});  // all 3 free
  CHECK(s.ask("b", 3)[0] == 0);                // a is first in line: b waits though 3 are free
  CHECK(s.ask("a", 3) == reply_of{1, 0, 0});
  CHECK(s.ask("x", -3)[0] == 1);               // a's places back (given back as x's here, by the script's count)
  CHECK(s.ask("b", 3) == reply_of{1, 0, 0});   // then b's turn
}

TEST_CASE("the fleet queue: a queued process that stops asking loses its place its grace after its retry-after") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  const script_runner s{io, c, unique_key("grace"), "300000", "1", "300000"};  // window 300 ms, grace 300 ms
  const auto start = steady::now();
  const auto at = [&](std::chrono::milliseconds t) {
    run_for(io, std::chrono::duration_cast<std::chrono::milliseconds>(start + t - steady::now()));
  };
  CHECK(s.ask("a", 1) == reply_of{1, 0, 0});
  const auto b = s.ask("b", 1);  // queued until a's stamp leaves (300 ms) and its grace more: about 600 ms
  CHECK(b[0] == 0);
  CHECK(b[1] > 250000);
  CHECK(b[1] <= 300000);
  at(std::chrono::milliseconds(400));
  // a's stamp left, and the place is b's though b does not ask: d, behind it, is denied, told to ask again
  // when b's time is up (unless b asked meanwhile).
  const auto d = s.ask("d", 1);
  CHECK(d[0] == 0);
  CHECK(d[1] > 100000);
  CHECK(d[1] <= 250000);  // b's time runs from its ask, a round trip or two after `start`: a margin
  CHECK(d[2] == 0);
  at(std::chrono::milliseconds(700));
  // b's time is up: d, queued at 400 ms, is first now.
  CHECK(s.queue() == entries{"b 1 1", "d 1 1"});  // (dropped by the next call; a was, at 400 ms)
  CHECK(s.ask("d", 1) == reply_of{1, 0, 0});
  CHECK(s.queue() == entries{"d 2 0"});
}

TEST_CASE("each reply carries the server's time, which is the stamp the window keeps for an admission") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  const script_runner s{io, c, unique_key("stamps"), "60000000", "2", "60000000"};
  CHECK(s.ask("a", 1) == reply_of{1, 0, 1});
  const long long first = s.server_time;
  CHECK(s.ask("a", 1) == reply_of{1, 0, 0});
  const long long second = s.server_time;
  CHECK(s.stamps() == std::vector<long long>{first, second});
  CHECK(s.ask("b", 1)[0] == 0);  // a denial says when it was decided too
  CHECK(s.server_time >= second);
}

TEST_CASE("a shared window reports its limit, free places and the server's time of its last admission") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  const auto options = per("snap", 3, std::chrono::seconds(60));
  shared_sliding_window w(c, options);
  recorder r(1);
  w.async_acquire(2, r.handler(0));
  REQUIRE(run_until(io, [&] { return r.all_done(); }));
  REQUIRE_FALSE(r.results[0]->ec);
  const auto s = w.snapshot();
  CHECK(s.limit == 3);
  CHECK(s.free == 1);
  CHECK(s.round_trip.count() == 1);
  const auto stamps =
      execute(io, c, {"ZRANGEBYSCORE", "rein:{" + options.key + "}:window", "(0", "+inf", "WITHSCORES"});
  REQUIRE(stamps.elements.size() == 4);
  CHECK(std::chrono::duration_cast<std::chrono::microseconds>(s.server_time_last.time_since_epoch()).count() ==
        std::stoll(stamps.elements[3].text));
}
