// What an adaptive limiter costs per call, next to the semaphore and the floor, and what each algorithm costs
// per sample.
//
// call/...: one iteration is one uncontended call inside a coroutine: `co_await x.acquire()` then
// `permit.complete(outcome::success)` (the semaphore: `release()`). Nobody waits, so this is the fast path
// every call pays: a lock, a clock read at the grant and another at the report (the adaptive limiter only),
// the grant log, and one sample fed to the algorithm. The floor is a coroutine co_awaiting a nested awaitable
// that returns at once, which every `co_await x.acquire()` also pays.
//
// update/...: one iteration is one `on_sample` of a pure algorithm (no lock, no clock), over a fixed trace of
// latencies around 5 ms with a congestion outcome every 50th sample.
#include <rein/adaptive_limiter.hpp>
#include <rein/algo/aimd.hpp>
#include <rein/algo/gradient.hpp>
#include <rein/algo/pid.hpp>
#include <rein/algo/tuned_aimd.hpp>
#include <rein/algo/vegas.hpp>
#include <rein/algo/windowed_aimd.hpp>
#include <rein/null_mutex.hpp>
#include <rein/semaphore.hpp>

#include <benchmark/benchmark.h>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#else
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>
#endif

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

namespace net = rein::net;
using namespace std::chrono_literals;

namespace {

using executor = net::io_context::executor_type;

// Runs `body(state)` as a coroutine on a fresh single-threaded io_context until it returns.
template <class Body>
void in_coroutine(benchmark::State& state, Body body) {
  net::io_context io{1};
  net::co_spawn(io, body(io, state), net::detached);
  io.run();
}

net::awaitable<int> ready_value(int v) { co_return v; }

void floor_nested_co_await(benchmark::State& state) {
  in_coroutine(state, [](net::io_context&, benchmark::State& st) -> net::awaitable<void> {
    int sum = 0;
    for (auto _ : st) sum += co_await ready_value(1);
    benchmark::DoNotOptimize(sum);
  });
}

template <class Mutex>
void semaphore_acquire_release(benchmark::State& state) {
  in_coroutine(state, [](net::io_context& io, benchmark::State& st) -> net::awaitable<void> {
    rein::basic_semaphore<executor, std::chrono::steady_clock, Mutex> sem{io.get_executor(), 64};
    for (auto _ : st) {
      rein::permit p = co_await sem.acquire();
      p.release();
    }
  });
}

template <class Algorithm, class Mutex>
void adaptive_acquire_complete(benchmark::State& state) {
  in_coroutine(state, [](net::io_context& io, benchmark::State& st) -> net::awaitable<void> {
    rein::basic_adaptive_limiter<Algorithm, executor, std::chrono::steady_clock, Mutex> limiter{io.get_executor()};
    for (auto _ : st) {
      rein::permit p = co_await limiter.acquire();
      p.complete(rein::outcome::success);
    }
    st.counters["final_limit"] = limiter.limit();
  });
}

// As above with `held` other permits outstanding, oldest completed first (calls finishing in the order they
// started): the grant log then holds `held` + 1 entries.
template <class Algorithm>
void adaptive_with_held(benchmark::State& state) {
  in_coroutine(state, [](net::io_context& io, benchmark::State& st) -> net::awaitable<void> {
    const auto held = static_cast<std::size_t>(st.range(0));
    typename Algorithm::options o;
    o.initial_limit = o.max_limit = static_cast<double>(held + 1);
    rein::basic_adaptive_limiter<Algorithm, executor> limiter{io.get_executor(), o};
    std::deque<rein::permit> outstanding;
    for (std::size_t i = 0; i < held; ++i) outstanding.push_back(co_await limiter.acquire());
    for (auto _ : st) {
      outstanding.push_back(co_await limiter.acquire());
      outstanding.front().complete(rein::outcome::success);
      outstanding.pop_front();
    }
    outstanding.clear();
  });
}

// A trace of samples around 5 ms: varied so no branch is always taken, one congestion in 50.
template <class Clock>
std::vector<rein::algo::basic_sample<Clock>> trace() {
  std::vector<rein::algo::basic_sample<Clock>> out(1000);
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i].latency = 5ms + std::chrono::microseconds((i * 7919) % 3000);
    out[i].result = i % 50 == 49 ? rein::outcome::congestion : rein::outcome::success;
    out[i].in_flight = 16;
  }
  return out;
}

template <class Algorithm>
void algorithm_update(benchmark::State& state, typename Algorithm::options o) {
  Algorithm a{o};
  auto samples = trace<typename Algorithm::clock_type>();
  typename Algorithm::sample_type::time_point now{};
  std::size_t i = 0;
  for (auto _ : state) {
    auto& s = samples[i];
    now += 1ms;
    s.now = now;
    a.on_sample(s);
    benchmark::DoNotOptimize(a.limit());
    i = i + 1 == samples.size() ? 0 : i + 1;
  }
}

template <class Algorithm>
void algorithm_update_default(benchmark::State& state) {
  algorithm_update<Algorithm>(state, typename Algorithm::options{});
}

void gradient_long_average(benchmark::State& state) {
  rein::algo::gradient_options o;
  o.baseline = rein::algo::gradient_baseline::long_average;
  algorithm_update<rein::algo::gradient>(state, o);
}

}  // namespace

// Per call, uncontended: the floor, the semaphore, the adaptive limiters (thread-safe and null_mutex).
BENCHMARK(floor_nested_co_await)->Name("call/floor: co_await of a ready nested awaitable");
BENCHMARK(semaphore_acquire_release<std::mutex>)->Name("call/semaphore: co_await acquire() + release()");
BENCHMARK(semaphore_acquire_release<rein::null_mutex>)
    ->Name("call/semaphore, null_mutex: co_await acquire() + release()");
BENCHMARK(adaptive_acquire_complete<rein::algo::aimd, std::mutex>)
    ->Name("call/aimd_limiter: co_await acquire() + complete(success)");
BENCHMARK(adaptive_acquire_complete<rein::algo::aimd, rein::null_mutex>)
    ->Name("call/aimd_limiter, null_mutex: co_await acquire() + complete(success)");
BENCHMARK(adaptive_acquire_complete<rein::algo::tuned_aimd, std::mutex>)
    ->Name("call/tuned_aimd_limiter: co_await acquire() + complete(success)");
BENCHMARK(adaptive_acquire_complete<rein::algo::gradient, std::mutex>)
    ->Name("call/gradient_limiter: co_await acquire() + complete(success)");
BENCHMARK(adaptive_with_held<rein::algo::aimd>)
    ->Name("call/aimd_limiter with N other permits held, oldest completed first")
    ->Arg(0)
    ->Arg(15)
    ->Arg(63)
    ->Arg(255);

// Per sample, pure algorithms.
BENCHMARK(algorithm_update_default<rein::algo::aimd>)->Name("update/aimd");
BENCHMARK(algorithm_update_default<rein::algo::tuned_aimd>)->Name("update/tuned_aimd (window 200 median)");
BENCHMARK(algorithm_update_default<rein::algo::gradient>)->Name("update/gradient (minimum baseline)");
BENCHMARK(gradient_long_average)->Name("update/gradient (long_average baseline)");
BENCHMARK(algorithm_update_default<rein::algo::vegas>)->Name("update/vegas");
BENCHMARK(algorithm_update_default<rein::algo::windowed_aimd>)->Name("update/windowed_aimd");
BENCHMARK(algorithm_update_default<rein::algo::pid>)->Name("update/pid");
