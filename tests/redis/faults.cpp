// Fault injection between the Redis-backed limiters and a real redis-server: Redis made slow, unreachable
// or cut off by a proxy (fault_proxy.hpp), stopped (SIGSTOP: hung), and killed and restarted. What each case
// shows is in its name. Real time with generous margins (`slack`): each case takes a few seconds.
#include "fault_proxy.hpp"
#include "semaphore_support.hpp"
#include "support.hpp"

#include <rein/error.hpp>
#include <rein/permit.hpp>
#include <rein/redis/shared_semaphore.hpp>
#include <rein/redis/shared_token_bucket.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

using namespace rein_test;
using rein::redis::failure_policy;
using rein::redis::shared_semaphore;
using rein::redis::shared_semaphore_options;
using rein::redis::shared_token_bucket;
using rein::redis::shared_token_bucket_snapshot;
using ms = std::chrono::milliseconds;

namespace {

// What a busy machine (builds next door) may add to a deadline or a timeout before a completion runs.
constexpr ms slack{250};
// The longest a request waits for Redis's answer on the tests' connections (500 ms).
const ms request_timeout = local(1).request_timeout;

// ---- The token bucket under a slow Redis ------------------------------------------------------------------

// One acquire of a client loop: when it started and ended, and how.
struct attempt {
  steady::time_point start;
  steady::time_point end;
  rein::error_code ec;
};

// A client: takes one token after another, each with `deadline`, until `stop`; after an error it pauses
// 10 ms, as a client would (fail_closed's errors come at once).
net::awaitable<void> keep_acquiring(net::io_context& io, shared_token_bucket& bucket, ms deadline,
                                    std::vector<attempt>& log, const bool& stop, int& running) {
  net::steady_timer pause(io);
  while (!stop) {
    const auto start = steady::now();
    auto [ec] = co_await bucket.async_acquire_for(1, deadline, as_tuple(net::use_awaitable));
    log.push_back({start, steady::now(), ec});
    if (ec) {
      pause.expires_after(ms(10));
      co_await pause.async_wait(as_tuple(net::use_awaitable));
    }
  }
  --running;
}

constexpr ms patient_deadline{1500};  // longer than request_timeout: Redis's silence ends these
constexpr ms hurried_deadline{300};   // shorter: their deadline may come first

struct slow_run {
  std::vector<attempt> patient;
  std::vector<attempt> hurried;
  steady::time_point fast_from;        // the delay was removed
  shared_token_bucket_snapshot warm;   // after one admission at full speed
  shared_token_bucket_snapshot slow;   // at the end of the slow phase
  shared_token_bucket_snapshot end;
};

// A bucket (100 per second, burst 10; locally half of that) behind a proxy: one admission at full speed,
// then 2.5 s with every chunk held back 800 ms each way (a round trip of 1.6 s, request_timeout 0.5 s)
// while two clients keep acquiring, then the delay removed until Redis has admitted 20 more.
slow_run run_slow_redis(failure_policy policy) {
  redis_server server;
  fault_proxy proxy(server.port());
  net::io_context io;
  shared_token_bucket bucket(
      io, local(proxy.port()),
      {.key = unique_key("slow"), .rate = 100, .capacity = 10, .on_failure = policy, .fail_open_share = 0.5});
  slow_run r;
  std::optional<rein::error_code> first;
  bucket.async_acquire(1, [&](rein::error_code ec) { first = ec; });
  REQUIRE(run_until(io, [&] { return first.has_value(); }));
  REQUIRE(*first == rein::error_code{});
  r.warm = bucket.snapshot();

  proxy.set_delay(ms(800));
  bool stop = false;
  int running = 2;
  net::co_spawn(io, keep_acquiring(io, bucket, patient_deadline, r.patient, stop, running), net::detached);
  net::co_spawn(io, keep_acquiring(io, bucket, hurried_deadline, r.hurried, stop, running), net::detached);
  run_for(io, ms(2500));
  r.slow = bucket.snapshot();

  proxy.set_delay(ms(0));
  r.fast_from = steady::now();
  REQUIRE(run_until(io, [&] { return bucket.snapshot().remote_allowed >= r.slow.remote_allowed + 20; }));
  stop = true;
  REQUIRE(run_until(io, [&] { return running == 0; }));
  r.end = bucket.snapshot();
  return r;
}

// Nothing waits past its deadline, whatever the policy.
void check_deadlines(const slow_run& r) {
  for (const auto& a : r.patient) CHECK(a.end - a.start <= patient_deadline + slack);
  for (const auto& a : r.hurried) CHECK(a.end - a.start <= hurried_deadline + slack);
}

// Attempts that ended before the delay was removed.
std::vector<attempt> during_slow(const std::vector<attempt>& log, steady::time_point fast_from) {
  std::vector<attempt> out;
  std::copy_if(log.begin(), log.end(), std::back_inserter(out), [&](const attempt& a) { return a.end < fast_from; });
  return out;
}

// ---- The semaphore --------------------------------------------------------------------------------------

// Permits held by their holders' own count (granted, not given back).
template <std::size_t N>
std::int64_t held(const std::array<taken, N>& ts) {
  std::int64_t n = 0;
  for (const auto& t : ts) n += static_cast<std::int64_t>(t.permit.count());
  return n;
}

template <std::size_t N>
bool all_done(const std::array<taken, N>& ts) {
  return std::all_of(ts.begin(), ts.end(), [](const taken& t) { return t.ec.has_value(); });
}


// The permits Redis counts (GET total; nil, an expired semaphore, is 0), asked on `c`, never through a proxy.
std::int64_t server_total(net::io_context& io, rein::redis::connection& c, const shared_semaphore_options& o) {
  const rein::redis::reply r = execute(io, c, {"GET", total_key(o)});
  if (r.type == rein::redis::reply::kind::nil) return 0;
  REQUIRE(r.type == rein::redis::reply::kind::string);
  return std::stoll(r.text);
}

// Once Redis is reachable again: runs `io` until `c` is connected and longer than recheck_interval (100 ms)
// has passed, so that a fail_closed limiter asks Redis again. Before that it fails acquires at once (the
// connection refuses requests while it backs off), as documented.
void wait_until_back(net::io_context& io, rein::redis::connection& c) {
  REQUIRE(run_until(io, [&] { return c.connected(); }, std::chrono::seconds(3)));
  run_for(io, ms(150));
  REQUIRE(c.connected());
}

// Runs `io` for `d`, calling `check` after every handler.
template <class Check>
void run_checking(net::io_context& io, ms d, Check check) {
  const auto end = steady::now() + d;
  run_until(io, [&] {
    check();
    return steady::now() >= end;
  }, d + ms(100));
}

}  // namespace

// ---- Slow Redis ---------------------------------------------------------------------------------------

TEST_CASE("slow Redis, fail_closed bucket: acquires end with unavailable or timed_out by their deadline, "
          "none admitted; admissions come from Redis again once it is fast") {
  const slow_run r = run_slow_redis(failure_policy::fail_closed);
  check_deadlines(r);
  const auto patient = during_slow(r.patient, r.fast_from);
  const auto hurried = during_slow(r.hurried, r.fast_from);
  INFO("while slow: " << patient.size() << " patient and " << hurried.size() << " hurried attempts");
  REQUIRE(patient.size() >= 3);
  REQUIRE(hurried.size() >= 3);
  for (const auto& a : patient) {
    // A request on the wire ends with the connection's request_timeout, long before the deadline.
    CHECK(a.ec == rein::redis::errc::unavailable);
    CHECK(a.end - a.start <= request_timeout + slack);
  }
  std::size_t timed_out = 0;
  for (const auto& a : hurried) {
    CHECK((a.ec == rein::redis::errc::unavailable || a.ec == rein::errc::timed_out));
    timed_out += a.ec == rein::errc::timed_out ? 1 : 0;
  }
  CHECK(timed_out >= 1);  // the first one at least: its request was on the wire at its deadline
  CHECK(r.slow.remote_allowed == r.warm.remote_allowed);  // no answer ever came back in time
  CHECK(r.slow.local_admitted == 0);
  CHECK(r.slow.unavailable_total >= patient.size());
  // Fast again: Redis admits (run_slow_redis waited for 20 more), and the limiter is no longer degraded.
  CHECK(r.end.remote_allowed >= r.slow.remote_allowed + 20);
  CHECK_FALSE(r.end.degraded);
  CHECK(r.end.local_admitted == 0);
}

TEST_CASE("slow Redis, fail_open bucket: acquires are granted by the local rule within request_timeout; "
          "admissions come from Redis again once it is fast") {
  const slow_run r = run_slow_redis(failure_policy::fail_open);
  check_deadlines(r);
  const auto patient = during_slow(r.patient, r.fast_from);
  const auto hurried = during_slow(r.hurried, r.fast_from);
  INFO("while slow: " << patient.size() << " patient and " << hurried.size() << " hurried attempts");
  REQUIRE(patient.size() >= 3);
  std::size_t granted = 0;
  for (const auto& a : patient) {
    // At worst one request_timeout on the wire, then the local bucket (50 per second, burst 5).
    CHECK(a.ec == rein::error_code{});
    CHECK(a.end - a.start <= request_timeout + slack);
    granted += a.ec ? 0 : 1;
  }
  for (const auto& a : hurried) {
    // Timed out while its request was on the wire (300 ms < request_timeout), or granted; never unavailable.
    CHECK((!a.ec || a.ec == rein::errc::timed_out));
    granted += a.ec ? 0 : 1;
  }
  CHECK(r.slow.remote_allowed == r.warm.remote_allowed);
  // Every grant of the slow phase was local (a grant made just before the snapshot may not have reached
  // its client yet: one per client).
  CHECK(r.slow.local_admitted >= granted);
  CHECK(r.slow.local_admitted <= granted + 2);
  CHECK(r.slow.unavailable_total == 0);
  CHECK(r.end.remote_allowed >= r.slow.remote_allowed + 20);
  CHECK_FALSE(r.end.degraded);
}

// ---- Hung Redis -------------------------------------------------------------------------------------------

TEST_CASE("hung Redis (SIGSTOP), fail_open bucket at share 0.5: after at most one request_timeout the local "
          "rule admits >= 0.9 of its rate for the whole hang; Redis admits again once it resumes") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  constexpr double local_rate = 50;  // rate 100 per second at share 0.5
  constexpr double local_burst = 5;  // capacity 10 at share 0.5
  shared_token_bucket bucket(
      c, {.key = unique_key("hung"), .rate = 100, .capacity = 10, .on_failure = failure_policy::fail_open,
          .fail_open_share = 0.5});
  std::optional<rein::error_code> first;
  bucket.async_acquire(1, [&](rein::error_code ec) { first = ec; });
  REQUIRE(run_until(io, [&] { return first.has_value(); }));
  REQUIRE(*first == rein::error_code{});

  // Three clients want more than the local rule gives, so its rate is what they get.
  bool stop = false;
  int running = 3;
  std::array<std::vector<attempt>, 3> logs;
  for (auto& log : logs) {
    net::co_spawn(io, keep_acquiring(io, bucket, patient_deadline, log, stop, running), net::detached);
  }
  run_for(io, ms(100));
  server.pause();  // connected, its kernel still accepts connections, it answers nothing
  const auto paused_at = steady::now();
  run_for(io, ms(3000));
  const auto hung = bucket.snapshot();
  const auto hung_connection = c.snapshot();
  server.resume();
  const auto resumed_at = steady::now();
  const auto redis_admits = [&] { return bucket.snapshot().remote_allowed >= hung.remote_allowed + 20; };
  REQUIRE(run_until(io, redis_admits, std::chrono::seconds(5)));
  const auto back_after = steady::now() - resumed_at;
  stop = true;
  REQUIRE(run_until(io, [&] { return running == 0; }));

  // Switch-over: the requests on the wire at the pause end with request_timeout; from then on nobody waits
  // for Redis (the circuit refuses at once), so no attempt takes longer than that.
  const auto switched_by = paused_at + request_timeout + slack;
  std::size_t granted = 0;
  std::optional<steady::time_point> first_local;
  for (const auto& log : logs) {
    for (const auto& a : log) {
      if (a.end < paused_at || a.start >= resumed_at) continue;
      CHECK(a.ec == rein::error_code{});  // fail_open: never unavailable
      CHECK(a.end - a.start <= request_timeout + slack);
      if (a.ec || a.end >= resumed_at) continue;
      if (!first_local || a.end < *first_local) first_local = a.end;
      if (a.end >= switched_by) ++granted;
    }
  }
  REQUIRE(first_local.has_value());
  CHECK(*first_local <= switched_by);
  // After the switch-over, the local rate: at most its burst above rate * time, and at least 0.9 of the rate.
  const double seconds = std::chrono::duration<double>(resumed_at - switched_by).count();
  INFO("granted " << granted << " locally in " << seconds << " s after the switch-over; Redis used again "
                  << std::chrono::duration_cast<ms>(back_after).count() << " ms after the resume");
  CHECK(static_cast<double>(granted) >= 0.9 * local_rate * seconds + local_burst);
  CHECK(static_cast<double>(granted) <= local_rate * seconds + local_burst + 1);
  CHECK(hung.unavailable_total == 0);
  CHECK(hung.local_admitted >= granted);
  // One timeout opened the circuit; the probes that followed timed out without any caller waiting on them.
  CHECK(hung_connection.circuit_open);
  CHECK(hung_connection.circuit_opens == 1);
  CHECK_FALSE(hung_connection.connected);
  CHECK(hung_connection.probes >= 1);
  // Used again within reconnect_cap + connect_timeout and a round trip of the resume (plus the limiter's
  // recheck_interval of 100 ms and the 20 admissions waited for, 200 ms at 100 per second).
  CHECK(back_after <= ms(100) + ms(500) + ms(100) + ms(200) + slack);
  CHECK_FALSE(c.snapshot().circuit_open);
}

// ---- Unreachable Redis ----------------------------------------------------------------------------------

TEST_CASE("unreachable Redis, fail_closed semaphore: every acquire ends with unavailable at once and nothing "
          "is granted; it answers again once Redis is reachable") {
  redis_server server;
  fault_proxy proxy(server.port());
  proxy.refuse(true);
  net::io_context io;
  rein::redis::connection via(io, local(proxy.port()));
  rein::redis::connection direct(io, local(server.port()));
  const shared_semaphore_options options{.key = unique_key("refused"), .limit = 3, .lease = ms(900)};
  shared_semaphore sem(via, options);
  // Two rounds: the first finds the connection idle (it connects and is dropped at once), the second finds
  // it backing off or reconnecting.
  for (int round = 0; round < 2; ++round) {
    std::array<taken, 3> t;
    for (auto& one : t) sem.async_acquire_for(1, ms(2000), into(one));
    REQUIRE(run_until(io, [&] { return all_done(t); }));
    for (const auto& one : t) {
      CHECK(*one.ec == rein::redis::errc::unavailable);
      CHECK(one.at - one.start <= request_timeout + slack);
      CHECK_FALSE(one.permit);
    }
    run_for(io, ms(300));
  }
  const auto s = sem.snapshot();
  CHECK(s.acquired_total == 0);
  CHECK(s.unavailable_total == 6);
  CHECK(s.held == 0);
  CHECK(s.remote_allowed == 0);
  CHECK(s.renewals == 0);  // no lease was ever made, so none to renew
  CHECK(via.snapshot().replies == 0);
  CHECK(via.snapshot().disconnects + via.snapshot().connect_failures >= 2);
  CHECK(execute(io, direct, {"EXISTS", total_key(options)}).integer == 0);  // nothing reached Redis

  proxy.refuse(false);
  wait_until_back(io, via);
  taken back;
  sem.async_acquire_for(1, ms(3000), into(back));
  REQUIRE(run_until(io, [&] { return back.ec.has_value(); }));
  CHECK(*back.ec == rein::error_code{});
  CHECK(server_total(io, direct, options) == 1);
  back.permit.release();  // sent through the proxy, while GET goes straight to Redis: wait for it
  REQUIRE(run_until(io, [&] { return server_total(io, direct, options) == 0; }, std::chrono::seconds(2)));
}

TEST_CASE("unreachable Redis, fail_open semaphore: at most floor(limit * share) permits are held at once, "
          "a local release lets the next waiter in, the others time out") {
  redis_server server;
  fault_proxy proxy(server.port());
  proxy.refuse(true);
  net::io_context io;
  rein::redis::connection via(io, local(proxy.port()));
  const shared_semaphore_options options{.key = unique_key("open"),
                                         .limit = 5,
                                         .lease = ms(900),
                                         .on_failure = failure_policy::fail_open,
                                         .fail_open_share = 0.5};  // floor(2.5): 2 permits locally
  shared_semaphore sem(via, options);
  std::array<taken, 5> t;
  for (auto& one : t) sem.async_acquire_for(1, ms(1500), into(one));
  std::int64_t most = 0;
  const auto watch = [&] { most = std::max(most, held(t)); };
  REQUIRE(run_until(io, [&] {
    watch();
    return held(t) == 2;
  }));
  run_checking(io, ms(300), watch);  // no third one meanwhile
  CHECK(held(t) == 2);
  CHECK(t[0].permit);  // in order
  CHECK(t[1].permit);
  t[0].permit.release();  // back to the local rule: the next waiter gets it
  REQUIRE(run_until(io, [&] {
    watch();
    return t[2].ec.has_value();
  }));
  CHECK(*t[2].ec == rein::error_code{});
  REQUIRE(run_until(io, [&] {
    watch();
    return t[3].ec && t[4].ec;
  }));
  for (const auto& one : {&t[3], &t[4]}) {
    CHECK(*one->ec == rein::errc::timed_out);
    CHECK(one->at - one->start <= ms(1500) + slack);
  }
  CHECK(most == 2);
  const auto s = sem.snapshot();
  CHECK(s.local_admitted == 3);
  CHECK(s.remote_allowed == 0);
  CHECK(s.unavailable_total == 0);
  CHECK(s.held == 0);  // counts Redis's grants only
}

// ---- Cut connections --------------------------------------------------------------------------------------

// a talks to Redis through the proxy, b and the watcher directly. Lease 900 ms: renewed every 300 ms, and
// long enough that a's lease outlives the short cuts below (at most ~300 + 100 + 300 ms without a renewal),
// so what corrects the count is a renewal, not the lease's end.
TEST_CASE("connections cut while a semaphore holds permits: a release lost in the cut is corrected by the "
          "next renewal; never above the limit, nothing granted twice") {
  redis_server server;
  fault_proxy proxy(server.port());
  net::io_context io;
  rein::redis::connection via(io, local(proxy.port()));
  rein::redis::connection direct(io, local(server.port()));
  rein::redis::connection watcher(io, local(server.port()));
  const shared_semaphore_options options{.key = unique_key("cut"), .limit = 3, .lease = ms(900)};
  shared_semaphore a(via, options);
  shared_semaphore b(direct, options);
  std::array<taken, 2> ta;
  std::array<taken, 2> tb;
  std::int64_t most = 0;
  std::int64_t most_counted = 0;
  const auto watch = [&] {
    most = std::max(most, held(ta) + held(tb));
    most_counted = std::max(most_counted, server_total(io, watcher, options));
  };
  a.async_acquire(1, into(ta[0]));
  a.async_acquire(1, into(ta[1]));
  b.async_acquire(1, into(tb[0]));
  REQUIRE(run_until(io, [&] { return all_done(ta) && tb[0].ec; }));
  REQUIRE(*ta[0].ec == rein::error_code{});
  REQUIRE(*ta[1].ec == rein::error_code{});
  REQUIRE(*tb[0].ec == rein::error_code{});
  CHECK(server_total(io, watcher, options) == 3);

  // Cut a off, and keep it off until its connection noticed, so that the release cannot reach Redis.
  const auto drops = via.snapshot().disconnects;
  proxy.refuse(true);
  proxy.cut();
  REQUIRE(run_until(io, [&] { return via.snapshot().disconnects > drops; }, std::chrono::seconds(2)));
  ta[0].permit.release();
  CHECK(a.snapshot().held == 1);
  CHECK(server_total(io, watcher, options) == 3);  // Redis never heard of it

  // a reconnects; b asks for the permit a gave back and gets it once a's renewal told Redis a holds 1.
  proxy.refuse(false);
  const auto back = steady::now();
  b.async_acquire_for(1, ms(3000), into(tb[1]));
  REQUIRE(run_until(io, [&] {
    watch();
    return tb[1].ec.has_value();
  }));
  CHECK(*tb[1].ec == rein::error_code{});
  INFO("b got a's permit " << std::chrono::duration_cast<ms>(tb[1].at - back).count() << " ms after the cut ended");
  CHECK(tb[1].at - back <= ms(100 + 300) + slack);  // reconnection, then a renewal (not the lease's end)
  run_checking(io, ms(400), watch);                // a's renewals go on: nothing changes
  CHECK(a.snapshot().leases_lost == 0);
  CHECK(a.snapshot().held == 1);
  CHECK(b.snapshot().held == 2);
  CHECK(server_total(io, watcher, options) == held(ta) + held(tb));
  CHECK(held(ta) + held(tb) == 3);
  CHECK(most <= 3);
  CHECK(most_counted <= 3);

  for (auto& one : ta) one.permit.release();
  for (auto& one : tb) one.permit.release();
  REQUIRE(run_until(io, [&] { return server_total(io, watcher, options) == 0; }, std::chrono::seconds(2)));
}

TEST_CASE("a grant whose answer is lost in a cut is held by nobody: the acquire ends with unavailable and "
          "the next renewal gives the permit back; nothing granted twice") {
  redis_server server;
  fault_proxy proxy(server.port());
  net::io_context io;
  rein::redis::connection via(io, local(proxy.port()));
  rein::redis::connection direct(io, local(server.port()));
  rein::redis::connection watcher(io, local(server.port()));
  const shared_semaphore_options options{.key = unique_key("lost-answer"), .limit = 2, .lease = ms(900)};
  shared_semaphore a(via, options);
  shared_semaphore b(direct, options);
  std::array<taken, 2> ta;
  std::array<taken, 1> tb;
  std::int64_t most = 0;
  std::int64_t most_counted = 0;
  const auto watch = [&] {
    most = std::max(most, held(ta) + held(tb));
    most_counted = std::max(most_counted, server_total(io, watcher, options));
  };
  a.async_acquire(1, into(ta[0]));
  REQUIRE(run_until(io, [&] { return ta[0].ec.has_value(); }));
  REQUIRE(*ta[0].ec == rein::error_code{});

  // 200 ms each way: a round trip of 400 ms, within request_timeout, so only the cut can fail it.
  proxy.set_delay(ms(200));
  a.async_acquire(1, into(ta[1]));
  // Redis counts the second permit as soon as the request reaches it; the answer is still on its way.
  REQUIRE(run_until(io, [&] { return server_total(io, watcher, options) == 2; }, std::chrono::seconds(2)));
  proxy.cut();
  proxy.set_delay(ms(0));
  const auto cut_at = steady::now();
  REQUIRE(run_until(io, [&] { return ta[1].ec.has_value(); }));
  CHECK(*ta[1].ec == rein::redis::errc::unavailable);
  CHECK_FALSE(ta[1].permit);
  CHECK(a.snapshot().held == 1);

  // b gets the orphaned permit once a's renewal told Redis that a holds 1.
  b.async_acquire_for(1, ms(3000), into(tb[0]));
  REQUIRE(run_until(io, [&] {
    watch();
    return tb[0].ec.has_value();
  }));
  CHECK(*tb[0].ec == rein::error_code{});
  INFO("b got it " << std::chrono::duration_cast<ms>(tb[0].at - cut_at).count() << " ms after the cut");
  CHECK(tb[0].at - cut_at <= ms(100 + 300) + slack);
  run_checking(io, ms(400), watch);
  CHECK(a.snapshot().leases_lost == 0);
  CHECK(server_total(io, watcher, options) == 2);
  CHECK(held(ta) + held(tb) == 2);
  CHECK(most <= 2);
  CHECK(most_counted <= 2);

  for (auto& one : ta) one.permit.release();
  tb[0].permit.release();
  REQUIRE(run_until(io, [&] { return server_total(io, watcher, options) == 0; }, std::chrono::seconds(2)));
}

// Two outages, each ended by a grant from Redis: the permit the local rule granted in the first one is
// released after the second. It must go back to the local rule; Redis never counted it.
// (A permit may be held across any number of outages, so every spell with local permits out is remembered.)
TEST_CASE("fail_open semaphore: a permit granted locally in an earlier outage goes back to the local rule, "
          "not to Redis, after two outages") {
  redis_server server;
  fault_proxy proxy(server.port());
  net::io_context io;
  rein::redis::connection via(io, local(proxy.port()));
  rein::redis::connection direct(io, local(server.port()));
  rein::redis::connection watcher(io, local(server.port()));
  const shared_semaphore_options options{.key = unique_key("spells"),
                                         .limit = 4,
                                         .lease = ms(3000),
                                         .on_failure = failure_policy::fail_open,
                                         .fail_open_share = 0.25};  // 1 permit locally
  shared_semaphore a(via, options);
  shared_semaphore b(direct, options);
  std::array<taken, 3> remote;  // granted by Redis
  std::array<taken, 3> outage;  // asked while Redis is unreachable
  std::array<taken, 2> tb;

  const auto acquire_from_redis = [&](taken& t) {
    a.async_acquire_for(1, ms(2000), into(t));
    REQUIRE(run_until(io, [&] { return t.ec.has_value(); }));
    REQUIRE(*t.ec == rein::error_code{});
  };
  // Redis unreachable: open connections cut, new ones refused.
  const auto go_down = [&] {
    proxy.refuse(true);
    proxy.cut();
  };
  // Reachable again: the next acquire asks Redis, which ends the degraded spell.
  const auto come_back = [&] {
    proxy.refuse(false);
    wait_until_back(io, via);
  };

  acquire_from_redis(remote[0]);
  go_down();
  a.async_acquire_for(1, ms(2000), into(outage[0]));  // Redis fails it: the local rule grants it
  REQUIRE(run_until(io, [&] { return outage[0].ec.has_value(); }));
  REQUIRE(*outage[0].ec == rein::error_code{});
  come_back();
  acquire_from_redis(remote[1]);
  go_down();
  a.async_acquire_for(1, ms(300), into(outage[1]));  // the local permit is taken: it waits, and times out
  REQUIRE(run_until(io, [&] { return outage[1].ec.has_value(); }));
  CHECK(*outage[1].ec == rein::errc::timed_out);
  come_back();
  acquire_from_redis(remote[2]);
  const auto s = a.snapshot();
  REQUIRE(s.local_admitted == 1);
  REQUIRE(s.held == 3);
  REQUIRE(server_total(io, watcher, options) == 3);

  outage[0].permit.release();  // the local permit: nothing for Redis
  run_for(io, ms(100));
  CHECK(a.snapshot().refunds == s.refunds);
  CHECK(a.snapshot().held == 3);
  CHECK(server_total(io, watcher, options) == 3);
  // a holds 3 of Redis's 4 permits: b gets exactly one.
  for (auto& t : tb) b.async_acquire_for(1, ms(500), into(t));
  REQUIRE(run_until(io, [&] { return all_done(tb); }));
  CHECK(held(remote) + held(tb) <= options.limit);
  CHECK(held(tb) == 1);
  for (auto& t : tb) t.permit.release();

  // A third outage: the local permit came back, so the local rule grants again.
  go_down();
  a.async_acquire_for(1, ms(1000), into(outage[2]));
  REQUIRE(run_until(io, [&] { return outage[2].ec.has_value(); }));
  CHECK(*outage[2].ec == rein::error_code{});
  proxy.refuse(false);
}

// ---- Redis killed and restarted ---------------------------------------------------------------------------

TEST_CASE("Redis killed and restarted while a semaphore holds permits: nothing hangs, a new lease is made, "
          "and releasing the old permits never drives the server's count below zero") {
  redis_server server;
  net::io_context io;
  rein::redis::connection c(io, local(server.port()));
  rein::redis::connection watcher(io, local(server.port()));
  const shared_semaphore_options options{.key = unique_key("restart"), .limit = 2, .lease = ms(900)};
  shared_semaphore sem(c, options);
  std::array<taken, 2> before;
  for (auto& t : before) sem.async_acquire(1, into(t));
  REQUIRE(run_until(io, [&] { return all_done(before); }));
  REQUIRE(*before[0].ec == rein::error_code{});
  REQUIRE(*before[1].ec == rein::error_code{});
  taken waiter;  // full: it waits, asking every poll_interval
  sem.async_acquire_for(1, ms(2000), into(waiter));
  REQUIRE(run_until(io, [&] { return sem.snapshot().remote_denied >= 1; }));
  REQUIRE_FALSE(waiter.ec);

  server.kill();  // SIGKILL, persistence off: every key is gone
  std::array<taken, 3> down;
  for (auto& t : down) sem.async_acquire_for(1, ms(2000), into(t));
  REQUIRE(run_until(io, [&] { return waiter.ec && all_done(down); }));
  CHECK(*waiter.ec == rein::redis::errc::unavailable);
  for (const auto& t : down) {
    CHECK(*t.ec == rein::redis::errc::unavailable);
    CHECK(t.at - t.start <= request_timeout + slack);
  }
  run_for(io, ms(300));  // renewals meanwhile go nowhere

  server.start();
  // An old permit given back before the semaphore has heard from the new server: at most a release of a
  // lease Redis does not know, which changes nothing.
  before[0].permit.release();
  wait_until_back(io, c);
  taken after;
  sem.async_acquire_for(1, ms(3000), into(after));
  REQUIRE(run_until(io, [&] { return after.ec.has_value(); }));
  CHECK(*after.ec == rein::error_code{});
  auto s = sem.snapshot();
  CHECK(s.leases_lost == 1);  // the old lease died with the data; the grant is the new lease's
  CHECK(s.lease == 2);
  CHECK(s.held == 1);
  CHECK(server_total(io, watcher, options) == 1);

  // The other old permit, given back under the new lease: it was never counted there, so nothing is sent.
  const auto refunds = sem.snapshot().refunds;
  before[1].permit.release();
  run_for(io, ms(100));
  CHECK(sem.snapshot().refunds == refunds);
  CHECK(server_total(io, watcher, options) == 1);
  after.permit.release();
  std::int64_t lowest = 0;
  REQUIRE(run_until(io, [&] {
    const std::int64_t n = server_total(io, watcher, options);
    lowest = std::min(lowest, n);
    return n == 0;
  }, std::chrono::seconds(2)));
  run_checking(io, ms(400), [&] { lowest = std::min(lowest, server_total(io, watcher, options)); });
  CHECK(lowest == 0);
  CHECK(sem.snapshot().held == 0);
}
