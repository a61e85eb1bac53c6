// rein's rate limiters against their floors and against what a user writes today, side by side in
// one binary:
//
//   rate/try_acquire/...        one synchronous check: rein::token_bucket (std::mutex), the single-threaded
//                               variant (null_mutex), rein::sliding_window; the pure algo::token_bucket with a
//                               clock read (the floor); the seed guides' bucket (a double refilled under a lock)
//   rate/acquire_ready/...      `co_await bucket.acquire()` when a token is there, against the floor of
//                               co_await-ing a nested awaitable that returns at once, and against that floor plus
//                               one steady_clock::now() (what any exact bucket costs at least: it must read the
//                               time to take). `ratio_to_floor` times all three in alternating batches in one
//                               run and reports x_floor (target: <= 2) and x_floor_with_clock_read. The
//                               `coarse_clock` rows use CLOCK_MONOTONIC_COARSE instead of steady_clock, to show
//                               the share of the clock read (an exact bucket must read the time on every take)
//   rate/parked_100k/...        100,000 coroutines park on a bucket refilling at 1,000,000 tokens/s (and, to
//                               show the herd, 100,000/s), real time, and are granted one token each: rein (one
//                               timer for the whole line) against the sleep-and-recheck pattern (every waiter sleeps on
//                               its own timer until its token should be there, then re-checks). Counters: CPU ns
//                               per grant, handlers run per grant, grants per second achieved. The burst is
//                               1,000, more than arrives during a timer's wake-up latency (with a burst of 1 at
//                               1,000,000/s every token must be taken within 1 us of arriving or is lost).
//                               Debug builds (the CTest smoke run) use 10,000 waiters and 1 simulated second
//   rate/accuracy_10s/...       8 coroutines compete for 10 simulated seconds at 100,000/s on the manual clock:
//                               admitted vs rate x time + burst (never above it at any step, and >= 0.9999 of it)
//
// Everything but the parked benchmarks runs on the benchmark's thread without waiting.

#include <rein/algo/token_bucket.hpp>
#include <rein/config.hpp>
#include <rein/null_mutex.hpp>
#include <rein/sliding_window.hpp>
#include <rein/testing/manual_clock.hpp>
#include <rein/token_bucket.hpp>

#include <benchmark/benchmark.h>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#else
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

namespace {

namespace net = rein::net;
using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

// A bucket that never runs dry, so that every check is the fast path: 1e9 tokens/s, a burst of 1e15.
const rein::token_bucket_options bottomless{.rate = 1e9, .capacity = 1'000'000'000'000'000};

double thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

// Runs a coroutine to completion on `io`; rethrows what it threw.
template <class Awaitable>
void run(net::io_context& io, Awaitable coroutine) {
  std::exception_ptr failure;
  net::co_spawn(io, std::move(coroutine), [&failure](std::exception_ptr e) { failure = e; });
  io.run();
  io.restart();
  if (failure) std::rethrow_exception(failure);
}

// CLOCK_MONOTONIC_COARSE: a few ns to read, ticks of 1-4 ms. A bucket on it shows how much of the fast path is
// the steady_clock read (a Clock is a template parameter of every rein limiter).
struct coarse_clock {
  using rep = std::int64_t;
  using period = std::nano;
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<coarse_clock>;
  [[maybe_unused]] static constexpr bool is_steady = true;
  static time_point now() noexcept {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
  }
};

using coarse_token_bucket = rein::basic_token_bucket<net::any_io_executor, coarse_clock>;

// ---- The seed guides' token bucket (seeds 001, 003, 004), as a user would port it ------------------------

/// Tokens as a double, refilled from the elapsed time on every call, under a lock.
class naive_bucket {
 public:
  naive_bucket(double rate, double capacity, double initial)
      : rate_(rate), capacity_(capacity), tokens_(initial), last_(steady::now()) {}

  /// Takes a token if there is one; otherwise says how long until there will be.
  bool try_take(steady::duration& wait) {
    std::lock_guard<std::mutex> lock(mutex_);
    const steady::time_point now = steady::now();
    tokens_ = std::min(capacity_, tokens_ + std::chrono::duration<double>(now - last_).count() * rate_);
    last_ = now;
    if (tokens_ >= 1) {
      tokens_ -= 1;
      return true;
    }
    wait = std::chrono::duration_cast<steady::duration>(std::chrono::duration<double>((1 - tokens_) / rate_));
    return false;
  }

  /// The sleep-and-recheck acquire: sleep (outside the lock) until the token should be there, then check again.
  net::awaitable<void> acquire() {
    steady::duration wait{};
    if (try_take(wait)) co_return;
    net::steady_timer timer(co_await net::this_coro::executor);
    do {
      timer.expires_after(wait);
      co_await timer.async_wait(net::use_awaitable);
    } while (!try_take(wait));
  }

 private:
  std::mutex mutex_;
  double rate_;
  double capacity_;
  double tokens_;
  steady::time_point last_;
};

// Debug builds run the benchmarks only as CTest's smoke test, so they run a tenth of the sizes (and say so in
// the names): 10,000 parked waiters, 1 simulated second.
#ifdef NDEBUG
constexpr std::size_t parked_waiters = 100'000;
constexpr std::chrono::seconds simulated{10};
#else
constexpr std::size_t parked_waiters = 10'000;
constexpr std::chrono::seconds simulated{1};
#endif

// ---- try_acquire ------------------------------------------------------------------------------------------

template <class Bucket>
void try_acquire_bucket(benchmark::State& state) {
  net::io_context io;
  Bucket bucket(io, bottomless);
  for (auto _ : state) benchmark::DoNotOptimize(bucket.try_acquire());
}

void try_acquire_window(benchmark::State& state) {
  net::io_context io;
  rein::sliding_window window(io, {.limit = 1024, .window = 1ns});
  for (auto _ : state) benchmark::DoNotOptimize(window.try_acquire());
}

void try_acquire_algo_floor(benchmark::State& state) {
  rein::algo::token_bucket bucket({.rate = bottomless.rate, .capacity = bottomless.capacity}, steady::now());
  for (auto _ : state) benchmark::DoNotOptimize(bucket.try_take(1, steady::now()));
}

void try_acquire_naive(benchmark::State& state) {
  naive_bucket bucket(bottomless.rate, static_cast<double>(bottomless.capacity), 1e15);
  steady::duration wait{};
  for (auto _ : state) benchmark::DoNotOptimize(bucket.try_take(wait));
}

// ---- co_await acquire() with a token there ----------------------------------------------------------------

net::awaitable<void> ready_now() { co_return; }

// The least any exact bucket can cost: the nested awaitable plus the one clock read a take needs.
net::awaitable<void> ready_now_with_clock_read() {
  benchmark::DoNotOptimize(steady::now());
  co_return;
}

net::awaitable<void> floor_loop(benchmark::State& state) {
  for (auto _ : state) co_await ready_now();
}

template <class Bucket>
net::awaitable<void> acquire_loop(benchmark::State& state, Bucket& bucket) {
  for (auto _ : state) co_await bucket.acquire();
}

void acquire_ready_floor(benchmark::State& state) {
  net::io_context io;
  run(io, floor_loop(state));
}

net::awaitable<void> clock_floor_loop(benchmark::State& state) {
  for (auto _ : state) co_await ready_now_with_clock_read();
}

void acquire_ready_clock_floor(benchmark::State& state) {
  net::io_context io;
  run(io, clock_floor_loop(state));
}

template <class Bucket>
void acquire_ready_bucket(benchmark::State& state) {
  net::io_context io;
  Bucket bucket(io, bottomless);
  run(io, acquire_loop(state, bucket));
}

// Both in alternating batches within one run, so that the ratio does not depend on when each ran; timed in
// this thread's CPU time, so that it does not depend on what else the machine runs either.
template <class Bucket>
net::awaitable<void> ratio_loop(benchmark::State& state, Bucket& bucket) {
  constexpr int batch = 1000;
  double floor_ns = 0, clock_floor_ns = 0, acquire_ns = 0;
  for (auto _ : state) {
    const double t0 = thread_cpu_ns();
    for (int i = 0; i < batch; ++i) co_await ready_now();
    const double t1 = thread_cpu_ns();
    for (int i = 0; i < batch; ++i) co_await ready_now_with_clock_read();
    const double t2 = thread_cpu_ns();
    for (int i = 0; i < batch; ++i) co_await bucket.acquire();
    const double t3 = thread_cpu_ns();
    floor_ns += t1 - t0;
    clock_floor_ns += t2 - t1;
    acquire_ns += t3 - t2;
  }
  const auto ops = static_cast<double>(state.iterations()) * batch;
  state.counters["floor_ns"] = floor_ns / ops;
  state.counters["floor_with_clock_read_ns"] = clock_floor_ns / ops;
  state.counters["acquire_ns"] = acquire_ns / ops;
  state.counters["x_floor"] = acquire_ns / floor_ns;
  state.counters["x_floor_with_clock_read"] = acquire_ns / clock_floor_ns;
}

template <class Bucket>
void acquire_ready_ratio(benchmark::State& state) {
  net::io_context io;
  Bucket bucket(io, bottomless);
  run(io, ratio_loop(state, bucket));
}

// ---- 100,000 parked waiters, 1,000,000 tokens/s ------------------------------------------------------------

// Both buckets start 0.3 s in debt, so that every waiter has parked before the first token arrives, however
// long spawning 100,000 coroutines takes.
constexpr double parked_debt_s = 0.3;

struct drain_record {
  std::size_t granted = 0;
  steady::time_point first{}, last{};
};

template <class Bucket>
net::awaitable<void> take_one(Bucket& bucket, drain_record& record) {
  co_await bucket.acquire();
  record.last = steady::now();
  if (record.granted++ == 0) record.first = record.last;
}

// Spawns every waiter, then runs until all are granted. Counters: the CPU time and the handlers run per grant
// over the whole run (parking included; the debt is spent asleep), and the grants per second of real time
// from the first grant to the last (the rate is 1,000,000: a design that cannot keep up shows less).
template <class MakeBucket>
void parked(benchmark::State& state, MakeBucket make_bucket) {
  double cpu_ns = 0, handlers = 0, drain_s = 0;
  for (auto _ : state) {
    net::io_context io;
    auto bucket = make_bucket(io, state.range(0), static_cast<double>(state.range(1)));
    drain_record record;
    for (std::size_t i = 0; i < parked_waiters; ++i) net::co_spawn(io, take_one(*bucket, record), net::detached);
    const double cpu0 = thread_cpu_ns();
    handlers += static_cast<double>(io.run());
    cpu_ns += thread_cpu_ns() - cpu0;
    if (record.granted != parked_waiters) throw std::logic_error("rate/parked: a waiter was not granted");
    drain_s += std::chrono::duration<double>(record.last - record.first).count();
  }
  const auto grants = static_cast<double>(state.iterations()) * parked_waiters;
  state.counters["cpu_ns_per_grant"] = cpu_ns / grants;
  state.counters["handlers_per_grant"] = handlers / grants;
  state.counters["grants_per_s"] = (grants - static_cast<double>(state.iterations())) / drain_s;
}

void parked_rein(benchmark::State& state) {
  parked(state, [](net::io_context& io, std::int64_t capacity, double rate) {
    auto bucket = std::make_unique<rein::token_bucket>(
        io, rein::token_bucket_options{.rate = rate, .capacity = capacity, .initial_tokens = 0});
    // The pure bucket's reserve() is the way to put it in debt (the async layer itself never reserves).
    const auto debt = static_cast<std::int64_t>(rate * parked_debt_s);
    bucket->update([capacity, debt](rein::algo::token_bucket& b, steady::time_point now) {
      for (std::int64_t owed = debt; owed > 0; owed -= capacity) (void)b.reserve(std::min(owed, capacity), now);
    });
    return bucket;
  });
}

void parked_naive(benchmark::State& state) {
  parked(state, [](net::io_context&, std::int64_t capacity, double rate) {
    return std::make_unique<naive_bucket>(rate, static_cast<double>(capacity), -rate * parked_debt_s);
  });
}

// ---- Accuracy over 10 simulated seconds (1 in Debug builds) ----------------------------------------------

using manual_bucket = rein::basic_token_bucket<net::any_io_executor, rein::testing::manual_clock>;

net::awaitable<void> compete(manual_bucket& bucket, std::uint64_t& admitted) {
  try {
    for (;;) {
      co_await bucket.acquire();
      ++admitted;
    }
  } catch (const rein::system_error&) {  // closed at the end
  }
}

// The benchmark binary keeps Asio's default reactor (epoll), which notices a manual-clock timer only through
// a timerfd armed in real time; so rather than wait for the bucket's timer, each step asks the bucket to grant
// what is due at the new manual time (update() with nothing to change).
void accuracy(benchmark::State& state) {
  using clock = rein::testing::manual_clock;
  constexpr double rate = 100'000;
  constexpr std::int64_t burst = 100;
  double admitted_sum = 0, ratio = 0;
  std::int64_t worst_excess = std::numeric_limits<std::int64_t>::min();
  for (auto _ : state) {
    clock::reset();
    net::io_context io;
    manual_bucket bucket(io, {.rate = rate, .capacity = burst});
    std::uint64_t admitted = 0;
    for (int i = 0; i < 8; ++i) net::co_spawn(io, compete(bucket, admitted), net::detached);
    io.poll();
    std::uint64_t lcg = 42;
    for (clock::time_point t{}; t < clock::time_point(simulated);) {
      lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
      t = std::min(t + std::chrono::microseconds(1 + (lcg >> 33) % 990), clock::time_point(simulated));
      clock::set(t);
      bucket.update([](auto&, auto) {});
      io.restart();
      io.poll();
      const std::int64_t bound = burst + t.time_since_epoch().count() / 10'000;  // 1 token per 10 us
      worst_excess = std::max(worst_excess, static_cast<std::int64_t>(admitted) - bound);
    }
    admitted_sum += static_cast<double>(admitted);
    ratio = static_cast<double>(admitted) / (burst + rate * std::chrono::duration<double>(simulated).count());
    bucket.close();
    io.restart();
    io.poll();
  }
  state.counters["admitted"] = admitted_sum / static_cast<double>(state.iterations());
  state.counters["admitted_over_bound"] = ratio;  // target: in [0.9999, 1]
  state.counters["worst_excess"] = static_cast<double>(worst_excess);  // max of admitted - (rate t + burst): <= 0
}

// ---- Registration ------------------------------------------------------------------------------------------

BENCHMARK(try_acquire_algo_floor)->Name("rate/try_acquire/floor_algo_token_bucket_with_clock_read");
BENCHMARK(try_acquire_bucket<rein::single_thread_token_bucket>)
    ->Name("rate/try_acquire/rein_single_thread_token_bucket");
BENCHMARK(try_acquire_bucket<rein::token_bucket>)->Name("rate/try_acquire/rein_token_bucket");
BENCHMARK(try_acquire_window)->Name("rate/try_acquire/rein_sliding_window");
BENCHMARK(try_acquire_naive)->Name("rate/try_acquire/naive_double_bucket_with_mutex");

BENCHMARK(acquire_ready_floor)->Name("rate/acquire_ready/floor_nested_awaitable");
BENCHMARK(acquire_ready_clock_floor)->Name("rate/acquire_ready/floor_nested_awaitable_with_clock_read");
BENCHMARK(acquire_ready_bucket<rein::single_thread_token_bucket>)
    ->Name("rate/acquire_ready/rein_single_thread_token_bucket");
BENCHMARK(acquire_ready_bucket<rein::token_bucket>)->Name("rate/acquire_ready/rein_token_bucket");
BENCHMARK(acquire_ready_bucket<coarse_token_bucket>)->Name("rate/acquire_ready/rein_token_bucket_coarse_clock");
BENCHMARK(acquire_ready_ratio<rein::token_bucket>)->Name("rate/acquire_ready/ratio_to_floor");
BENCHMARK(acquire_ready_ratio<coarse_token_bucket>)->Name("rate/acquire_ready/ratio_to_floor_coarse_clock");

const std::string parked_name = "rate/parked_" + std::to_string(parked_waiters / 1000) + "k/";
const std::string accuracy_name = "rate/accuracy_" + std::to_string(simulated.count()) + "s/";

BENCHMARK(parked_rein)
    ->Name(parked_name + "rein_token_bucket")
    ->ArgNames({"burst", "rate"})
    ->Args({1000, 1'000'000})
    ->Args({1000, 100'000})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(parked_naive)
    ->Name(parked_name + "naive_timer_per_waiter")
    ->ArgNames({"burst", "rate"})
    ->Args({1000, 1'000'000})
    ->Args({1000, 100'000})
    ->Unit(benchmark::kMillisecond);

BENCHMARK(accuracy)->Name(accuracy_name + "rein_token_bucket_8_coroutines")->Unit(benchmark::kMillisecond);

}  // namespace
