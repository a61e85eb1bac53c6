// Admissions per second on ONE connection to a local redis-server (started here, persistence off):
//
//   rein_pipelined/64          64 coroutines share a rein::redis::shared_token_bucket; their EVALSHA requests
//                              are pipelined (max_in_flight 64)
//   rein_one_at_a_time/64      the same 64 coroutines, with max_in_flight 1: each request waits for the
//                              previous reply
//   rein_one_coroutine         one coroutine, acquire after acquire
//   rein_batched/k             the 64 coroutines with batch = k: one request at a time takes up to k tokens
//   hiredis_blocking           the idiom without rein: blocking redisCommand(EVALSHA ...) in a loop
//   hiredis_blocking_pipelined the floor: blocking hiredis, 64 commands appended, then 64 replies read
//   rein_semaphore_pipelined/64  64 coroutines share a rein::redis::shared_semaphore: acquire, then release
//                              (two script calls per item, the release not awaited)
//   hiredis_semaphore_pipelined  its floor: blocking hiredis, 64 acquires and 64 releases of the same script
//                              appended, then their replies read
//   rein_fleet/P               P processes (fork), each as rein_pipelined/64 on its own connection, all on
//                              one bucket: items_per_second is the total, per_process_per_second its share
//   hiredis_fleet/P            its floor: P processes, each as hiredis_blocking_pipelined
//
// The bucket's rate is far above what is measured (1e9 per second), so every admission is one allowed
// round trip and the numbers are the cost of the machinery, not of waiting. items_per_second is the result;
// rtt_us is the mean request-to-reply time rein measured.
#include "redis_server.hpp"
#include "support/asio.hpp"

#include <rein/redis/connection.hpp>
#include <rein/redis/detail/sha1.hpp>
#include <rein/redis/shared_semaphore.hpp>
#include <rein/redis/shared_token_bucket.hpp>

#include <benchmark/benchmark.h>
#include <hiredis/hiredis.h>

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace {

namespace net = rein::net;

rein_test::redis_server& server() {
  static rein_test::redis_server instance;
  return instance;
}

constexpr std::size_t admissions_per_iteration = 6400;

std::string next_key() {
  static std::atomic<int> n{0};
  return "rein:bench:" + std::to_string(n.fetch_add(1));
}

// admissions_per_iteration admissions, shared by `coroutines` coroutines acquiring back to back.
void acquire_all(net::io_context& io, rein::redis::shared_token_bucket& bucket, std::size_t coroutines) {
  const std::size_t each = admissions_per_iteration / coroutines;
  std::size_t running = coroutines;
  for (std::size_t i = 0; i < coroutines; ++i) {
    net::co_spawn(io, [&]() -> net::awaitable<void> {
      for (std::size_t k = 0; k < each; ++k) co_await bucket.acquire();
      --running;
    }, net::detached);
  }
  io.restart();
  while (running > 0) io.run_one();  // the connection's pending read keeps run() from returning
}

bool all_from_redis(const rein::redis::shared_token_bucket& bucket, std::uint64_t expected) {
  const auto s = bucket.snapshot();
  return s.acquired_total == expected && s.remote_allowed + s.batch_admitted == s.acquired_total;
}

void rein_limiter(benchmark::State& state, std::size_t coroutines, std::size_t max_in_flight, std::int64_t batch = 1) {
  net::io_context io;
  rein::redis::connection_options options;
  options.port = server().port();
  rein::redis::connection connection(io, options);
  rein::redis::shared_token_bucket bucket(
      connection,
      {.key = next_key(), .rate = 1e9, .capacity = 1'000'000'000'000, .max_in_flight = max_in_flight, .batch = batch});
  for (auto _ : state) acquire_all(io, bucket, coroutines);
  if (!all_from_redis(bucket, static_cast<std::uint64_t>(state.iterations()) * admissions_per_iteration)) {
    state.SkipWithError("admissions were lost or not from Redis");
  }
  const auto s = bucket.snapshot();
  state.SetItemsProcessed(static_cast<std::int64_t>(s.acquired_total));
  state.counters["rtt_us"] = s.round_trips == 0 ? 0.0
                                                : std::chrono::duration<double, std::micro>(s.round_trip_total).count() /
                                                      static_cast<double>(s.round_trips);
}

void rein_pipelined(benchmark::State& state) { rein_limiter(state, static_cast<std::size_t>(state.range(0)), 64); }
void rein_one_at_a_time(benchmark::State& state) { rein_limiter(state, static_cast<std::size_t>(state.range(0)), 1); }
void rein_one_coroutine(benchmark::State& state) { rein_limiter(state, 1, 64); }
void rein_batched(benchmark::State& state) { rein_limiter(state, 64, 64, state.range(0)); }

// Acquire + release of a shared semaphore whose limit is never reached: the cost of a permit's two calls.
void rein_semaphore_pipelined(benchmark::State& state) {
  const auto coroutines = static_cast<std::size_t>(state.range(0));
  net::io_context io;
  rein::redis::connection_options options;
  options.port = server().port();
  rein::redis::connection connection(io, options);
  rein::redis::shared_semaphore sem(connection, {.key = next_key(), .limit = 1'000'000'000});
  const std::size_t each = admissions_per_iteration / coroutines;
  for (auto _ : state) {
    std::size_t running = coroutines;
    for (std::size_t i = 0; i < coroutines; ++i) {
      net::co_spawn(io, [&]() -> net::awaitable<void> {
        for (std::size_t k = 0; k < each; ++k) {
          rein::permit p = co_await sem.acquire();
          p.release();
        }
        --running;
      }, net::detached);
    }
    io.restart();
    while (running > 0) io.run_one();
  }
  const auto s = sem.snapshot();
  if (s.acquired_total != static_cast<std::uint64_t>(state.iterations()) * coroutines * each || s.remote_allowed != s.acquired_total) {
    state.SkipWithError("permits were lost or not from Redis");
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(s.acquired_total));
}

struct hiredis_session {
  redisContext* context;
  std::string sha;
  std::string key;

  explicit hiredis_session(std::string shared = next_key()) : context(redisConnect("127.0.0.1", server().port())), key(std::move(shared)) {
    auto* r = static_cast<redisReply*>(redisCommand(context, "SCRIPT LOAD %s", rein::redis::detail::token_bucket_script.data()));
    sha.assign(r->str, r->len);
    freeReplyObject(r);
  }
  hiredis_session(const hiredis_session&) = delete;
  hiredis_session& operator=(const hiredis_session&) = delete;
  ~hiredis_session() { redisFree(context); }

  void append() { redisAppendCommand(context, "EVALSHA %s 2 %s {%s}:rate 0.001 1000000000000 1", sha.c_str(), key.c_str(), key.c_str()); }

  bool read_allowed() {
    void* out = nullptr;
    if (redisGetReply(context, &out) != REDIS_OK) return false;
    auto* r = static_cast<redisReply*>(out);
    const bool ok = r->type == REDIS_REPLY_ARRAY && r->elements >= 3 && r->element[0]->integer == 1;
    freeReplyObject(r);
    return ok;
  }
};

void hiredis_blocking(benchmark::State& state) {
  hiredis_session session;
  for (auto _ : state) {
    for (std::size_t i = 0; i < admissions_per_iteration; ++i) {
      session.append();
      if (!session.read_allowed()) state.SkipWithError("not allowed");
    }
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(admissions_per_iteration));
}

// admissions_per_iteration admissions, 64 commands appended, then their 64 replies read. False if one was
// not allowed.
bool pipelined_by_64(hiredis_session& session) {
  bool ok = true;
  for (std::size_t i = 0; i < admissions_per_iteration; i += 64) {
    for (int k = 0; k < 64; ++k) session.append();
    for (int k = 0; k < 64; ++k) ok = session.read_allowed() && ok;
  }
  return ok;
}

void hiredis_blocking_pipelined(benchmark::State& state) {
  hiredis_session session;
  for (auto _ : state) {
    if (!pipelined_by_64(session)) state.SkipWithError("not allowed");
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(admissions_per_iteration));
}

// Each iteration forks `processes` children that each run `member(key)` (admissions_per_iteration
// admissions on one shared key, exit status 0 if all were allowed) and waits for them all. The children
// leave with _exit: the server belongs to the parent.
template <class Member>
void fleet(benchmark::State& state, Member member) {
  const auto processes = static_cast<int>(state.range(0));
  const std::string key = next_key();
  (void)server();  // started before the first fork
  for (auto _ : state) {
    std::vector<pid_t> children;
    for (int p = 0; p < processes; ++p) {
      const pid_t pid = ::fork();
      if (pid == 0) ::_exit(member(key));
      if (pid < 0) {
        state.SkipWithError("fork failed");
        break;
      }
      children.push_back(pid);
    }
    for (const pid_t pid : children) {
      int status = 0;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) state.SkipWithError("a process's admissions failed");
    }
  }
  const auto total = state.iterations() * processes * static_cast<std::int64_t>(admissions_per_iteration);
  state.SetItemsProcessed(total);
  state.counters["per_process_per_second"] =
      benchmark::Counter(static_cast<double>(total) / processes, benchmark::Counter::kIsRate);
}

void rein_fleet(benchmark::State& state) {
  fleet(state, [](const std::string& key) {
    net::io_context io;
    rein::redis::connection_options options;
    options.port = server().port();
    rein::redis::connection connection(io, options);
    rein::redis::shared_token_bucket bucket(connection, {.key = key, .rate = 1e9, .capacity = 1'000'000'000'000});
    acquire_all(io, bucket, 64);
    return all_from_redis(bucket, admissions_per_iteration) ? 0 : 1;
  });
}

void hiredis_fleet(benchmark::State& state) {
  fleet(state, [](const std::string& key) {
    hiredis_session session(key);
    return pipelined_by_64(session) ? 0 : 1;
  });
}

void hiredis_semaphore_pipelined(benchmark::State& state) {
  redisContext* context = redisConnect("127.0.0.1", server().port());
  auto* loaded = static_cast<redisReply*>(redisCommand(context, "SCRIPT LOAD %s", rein::redis::detail::shared_semaphore_script.data()));
  const std::string sha(loaded->str, loaded->len);
  freeReplyObject(loaded);
  const std::string k = next_key();
  const std::string keys = "6 " + k + ":h " + k + ":l " + k + ":t " + k + ":q " + k + ":s " + k + ":m bench:1 10000000 1000000000 1 ";
  const auto call = [&](const char* op) {
    redisAppendCommand(context, ("EVALSHA " + sha + " " + keys + op + " 10000").c_str());
  };
  const auto read_one = [&] {
    void* out = nullptr;
    if (redisGetReply(context, &out) != REDIS_OK) return false;
    auto* r = static_cast<redisReply*>(out);
    const bool ok = r->type == REDIS_REPLY_ARRAY && r->elements >= 3 && r->element[0]->integer == 1;
    freeReplyObject(r);
    return ok;
  };
  call("f");
  if (!read_one()) state.SkipWithError("the lease was not made");
  for (auto _ : state) {
    for (std::size_t i = 0; i < admissions_per_iteration; i += 64) {
      for (int n = 0; n < 64; ++n) {
        call("a");
        call("r");
      }
      for (int n = 0; n < 128; ++n) {
        if (!read_one()) state.SkipWithError("not allowed");
      }
    }
  }
  redisFree(context);
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(admissions_per_iteration));
}

}  // namespace

BENCHMARK(rein_pipelined)->Arg(64)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(rein_one_at_a_time)->Arg(64)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(rein_one_coroutine)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(rein_batched)->Arg(8)->Arg(64)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(hiredis_blocking)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(hiredis_blocking_pipelined)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(rein_semaphore_pipelined)->Arg(64)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(hiredis_semaphore_pipelined)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(rein_fleet)->Arg(4)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(hiredis_fleet)->Arg(4)->UseRealTime()->Unit(benchmark::kMillisecond);
