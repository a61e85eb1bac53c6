// rein::semaphore against what a user writes today, side by side, with the semaphore's design targets:
//
//   floor_nested_awaitable   co_await of a nested awaitable that returns at once (the fast path's floor)
//   floor_nested_awaitable_permit
//                            the same returning an empty rein::permit, as rein's acquire() returns one
//   floor_post               co_await net::post(net::use_awaitable) (one scheduler round trip)
//   rein_single_thread_semaphore, rein_semaphore
//                            rein::single_thread_semaphore (null_mutex) and rein::semaphore (std::mutex)
//   *_untimed, *_observed    the same with wait measurement off (no wait histogram), and with wait
//                            measurement on and an observer set (line_options::observer): the
//                            observability model's cost next to none
//   *_coarse                 the same timing its waits on the coarse clock (line_options::
//                            coarse_wait_clock), contended only
//   *_direct                 the same handing a released permit to a waiter on the releasing thread's executor
//                            in place (line_options::direct_handoff: dispatch instead of post),
//                            contended only
//   contended_64x4_2_threads/ the contended loop on an io_context run by two threads (reactor on), wall time
//                            per handoff (manual time: the benchmark thread is one of the two), for the
//                            thread-safe idioms only: floor_post, rein_semaphore, concurrent_channel_*
//   *_lifo                   the same serving its newest waiter first (queue_order::lifo), contended only
//   *_priority               the same in priority order, every other acquire at class 1 (so that a
//                            newcomer's place is found by a walk from the back), contended only
//   *_fair                   the same in fair order (queue_order::fair), acquires cycling through four keys of
//                            weights 1, 1, 2 and 4 (each newcomer is tagged and placed by a walk from both
//                            ends), contended only
//   *_partitioned            the same with partitions live 70% and batch 30% (line_options::partitions),
//                            acquires alternating between them, contended only
//   *_hint1                  the same on an io_context(1) (concurrency hint 1: run by one thread), contended
//                            only
//   *_try_first              the same called the hot-loop way: try_acquire() first, co_await acquire() only if
//                            that fails, uncontended only
//   floor_bare_semaphore     rein_bench::handoff_floor (support/floors.hpp): a count and a ring of parked
//                            handlers, release() posting the oldest one's completion; nothing else (no
//                            cancellation, deadline, statistic or lock). The least a semaphore that parks
//                            coroutines can cost, fast path and handoff
//   channel_*, concurrent_channel_*
//                            net::experimental::channel<void(error_code)> (concurrent_channel: thread-safe) as a
//                            semaphore with `permits` buffer slots: acquire = send, release = try_receive.
//                            `try_send_then_async_send` tries a synchronous send first; `async_send` always
//                            co_awaits async_send
//   steady_timer_cancel_one  a count plus a steady_timer that never expires: acquire waits on the timer while
//                            the count is 0, release increments it and cancel_one()s a waiter. Not FIFO (a
//                            woken waiter can be overtaken and waits again); single-threaded only; its timer
//                            turns the reactor on, so it has no reactor_off row
//
// Every idiom's acquire is a nested coroutine, as rein's `acquire()` is (what a small user-written wrapper
// class looks like). Everything but the two-thread rows runs on the benchmark's one thread: the thread-safe
// variants show what their locks cost, not scaling. Groups:
//
//   uncontended/<reactor>/<idiom>         one coroutine: acquire, release
//   contended_64x4/<reactor>/<idiom>      64 coroutines, 4 permits: acquire, co_await post, release
//   contended_64x4_2_threads/<idiom>      the same on an io_context run by two threads, reactor on
//   memory/parked_100k/<idiom>            100,000 coroutines parked on the idiom; heap per waiter
//
// At exit the binary prints (stderr) Markdown tables of CPU-time medians with ratios to the floors, and the
// pass/fail of those targets (support/ratio_summary.hpp).
#define REIN_BENCH_DEFINE_COUNTING_NEW
#include "support/counting_new.hpp"

#include "support/bench_io.hpp"
#include "support/channel_semaphore.hpp"
#include "support/floors.hpp"
#include "support/ratio_summary.hpp"

#include <rein/config.hpp>
#include <rein/observer.hpp>
#include <rein/permit.hpp>
#include <rein/queue_order.hpp>
#include <rein/semaphore.hpp>

#include <benchmark/benchmark.h>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#else
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#endif

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

namespace {

using namespace rein_bench;
using rein::error_code;
using rein::permit;

constexpr std::size_t contended_coroutines = 64;
constexpr std::size_t contended_permits = 4;
constexpr std::size_t parked_waiters = 100'000;

// ---- The idioms ------------------------------------------------------------------------------------------

/// The steady_timer + cancel_one semaphore (see the file comment).
class timer_semaphore {
 public:
  timer_semaphore(const net::any_io_executor& ex, std::size_t permits)
      : timer_(ex, net::steady_timer::time_point::max()), available_(permits) {}

  net::awaitable<void> acquire() {
    while (available_ == 0) co_await timer_.async_wait(net::redirect_error(net::use_awaitable, ignored_));
    --available_;
  }

  void release() {
    ++available_;
    timer_.cancel_one();
  }

  /// Lets every parked acquire through, for tear-down.
  void open_all() {
    available_ = std::numeric_limits<std::size_t>::max();
    timer_.cancel();
  }

 private:
  net::steady_timer timer_;
  std::size_t available_;
  error_code ignored_;
};

using st_semaphore = rein::single_thread_semaphore;
using ts_semaphore = rein::semaphore;

/// A rein semaphore made with the options `Options()` returns instead of the default ones.
template <class Sem, rein::line_options (*Options)()>
class configured : public Sem {
 public:
  configured(const net::any_io_executor& ex, std::size_t permits) : Sem(ex, permits, Options()) {}
};

/// Wait timing off (line_options::measure_wait = false): a handoff then reads no clock, and
/// snapshot().wait_total stays zero, as in the other idioms, which time nothing.
rein::line_options untimed_options() { return {.measure_wait = false}; }
using st_untimed = configured<st_semaphore, untimed_options>;
using ts_untimed = configured<ts_semaphore, untimed_options>;

/// Waits timed on the kernel's coarse clock (line_options::coarse_wait_clock).
rein::line_options coarse_options() { return {.coarse_wait_clock = true}; }
using st_coarse = configured<st_semaphore, coarse_options>;
using ts_coarse = configured<ts_semaphore, coarse_options>;

/// A release resumes a waiter on its own executor in place (line_options::direct_handoff).
rein::line_options direct_options() { return {.direct_handoff = true}; }
using st_direct = configured<st_semaphore, direct_options>;
using ts_direct = configured<ts_semaphore, direct_options>;

/// Wait measurement on (the default) and an observer set: every event goes to a counter (an uncontended
/// acquire and release cause none; what is measured is the test for one).
inline std::uint64_t observed_events = 0;
rein::line_options observed_options() {
  return {.observer = [](const rein::limiter_event&) { ++observed_events; }};
}
using st_observed = configured<st_semaphore, observed_options>;
using ts_observed = configured<ts_semaphore, observed_options>;

/// The newest waiter served first (line_options::order = queue_order::lifo).
rein::line_options lifo_options() { return {.order = rein::queue_order::lifo}; }
using st_lifo = configured<st_semaphore, lifo_options>;
using ts_lifo = configured<ts_semaphore, lifo_options>;

/// A rein semaphore in priority order whose acquires alternate between class 0 and class 1.
template <class Sem>
class prioritized : public Sem {
 public:
  prioritized(const net::any_io_executor& ex, std::size_t permits)
      : Sem(ex, permits, {.order = rein::queue_order::priority}) {}
  net::awaitable<permit> acquire() { return this->at_priority(static_cast<std::uint8_t>(next_++ & 1U)).acquire(); }

 private:
  std::size_t next_ = 0;
};

using st_priority = prioritized<st_semaphore>;
using ts_priority = prioritized<ts_semaphore>;

/// A rein semaphore in fair order whose acquires cycle through four keys of weights 1, 1, 2 and 4.
template <class Sem>
class fair : public Sem {
 public:
  fair(const net::any_io_executor& ex, std::size_t permits) : Sem(ex, permits, {.order = rein::queue_order::fair}) {}
  net::awaitable<permit> acquire() {
    static constexpr const char* keys[] = {"a", "b", "c", "d"};
    static constexpr std::uint32_t weights[] = {1, 1, 2, 4};
    const std::size_t k = next_++ & 3U;
    return this->for_key(keys[k], weights[k]).acquire();
  }

 private:
  std::size_t next_ = 0;
};

using st_fair = fair<st_semaphore>;
using ts_fair = fair<ts_semaphore>;

/// A rein semaphore with partitions live (70%) and batch (30%) whose acquires alternate between them.
template <class Sem>
class partitioned : public Sem {
 public:
  partitioned(const net::any_io_executor& ex, std::size_t permits)
      : Sem(ex, permits, {.partitions = {{"live", 0.7}, {"batch", 0.3}}}) {}
  net::awaitable<permit> acquire() { return this->partition((next_++ & 1U) != 0 ? "live" : "batch").acquire(); }

 private:
  std::size_t next_ = 0;
};

using st_partitioned = partitioned<st_semaphore>;
using ts_partitioned = partitioned<ts_semaphore>;

/// A rein semaphore used the hot-loop way: `try_acquire()` first, `co_await acquire()` only if that fails
/// (no coroutine frame when a permit is free).
template <class Sem>
class try_first : public Sem {
 public:
  try_first(const net::any_io_executor& ex, std::size_t permits) : Sem(ex, permits) {}
  static constexpr bool tries_first = true;
};

using st_try_first = try_first<st_semaphore>;
using ts_try_first = try_first<ts_semaphore>;

template <class Sem>
constexpr bool is_rein = std::is_same_v<Sem, st_semaphore> || std::is_same_v<Sem, ts_semaphore> ||
                         std::is_same_v<Sem, st_untimed> || std::is_same_v<Sem, ts_untimed> ||
                         std::is_same_v<Sem, st_coarse> || std::is_same_v<Sem, ts_coarse> ||
                         std::is_same_v<Sem, st_direct> || std::is_same_v<Sem, ts_direct> ||
                         std::is_same_v<Sem, st_observed> || std::is_same_v<Sem, ts_observed> ||
                         std::is_same_v<Sem, st_lifo> || std::is_same_v<Sem, ts_lifo> ||
                         std::is_same_v<Sem, st_priority> || std::is_same_v<Sem, ts_priority> ||
                         std::is_same_v<Sem, st_fair> || std::is_same_v<Sem, ts_fair> ||
                         std::is_same_v<Sem, st_partitioned> || std::is_same_v<Sem, ts_partitioned> ||
                         std::is_same_v<Sem, st_try_first> || std::is_same_v<Sem, ts_try_first>;
using bare_semaphore = handoff_floor;
using channel_try_first = channel_semaphore<channel, true>;
using channel_async = channel_semaphore<channel, false>;
using concurrent_channel_try_first = channel_semaphore<concurrent_channel, true>;
using concurrent_channel_async = channel_semaphore<concurrent_channel, false>;

// ---- Uncontended: one coroutine, acquire + release per iteration ---------------------------------------

/// `T` a number: the nested-awaitable floor. `T` a permit (empty), as `co_await sem.acquire()` returns one:
/// the same coroutine plus moving the permit out of the frame and destroying the moved-from one (an empty
/// permit gives nothing back).
template <class T>
net::awaitable<void> uncontended_nested_floor(benchmark::State& state, run_clock& clock) {
  clock.start();
  for (auto _ : state) {
    T v = co_await ready_now<T>(T{});
    benchmark::DoNotOptimize(v);
  }
  clock.stop();
}

net::awaitable<void> uncontended_post_floor(benchmark::State& state, run_clock& clock) {
  clock.start();
  for (auto _ : state) co_await post_round_trip();
  clock.stop();
}

template <class Sem>
net::awaitable<void> uncontended_rein(benchmark::State& state, run_clock& clock, Sem& sem) {
  clock.start();
  for (auto _ : state) {
    if constexpr (requires { Sem::tries_first; }) {
      permit p = sem.try_acquire();
      if (!p) p = co_await sem.acquire();
      benchmark::DoNotOptimize(p);
    } else {
      permit p = co_await sem.acquire();
      benchmark::DoNotOptimize(p);
    }
  }
  clock.stop();
}

template <class Idiom>
net::awaitable<void> uncontended_idiom(benchmark::State& state, run_clock& clock, Idiom& sem) {
  clock.start();
  for (auto _ : state) {
    co_await sem.acquire();
    sem.release();
  }
  clock.stop();
}

template <class Sem>
void make_and_run_uncontended(benchmark::State& state, bench_io& io, run_clock& clock) {
  if constexpr (is_rein<Sem>) {
    Sem sem(io.executor(), 1);
    io.run(uncontended_rein(state, clock, sem));
  } else {
    Sem sem(io.executor(), 1);
    io.run(uncontended_idiom(state, clock, sem));
  }
}

// ---- Contended: 64 coroutines, 4 permits: acquire, co_await post, release -----------------------------

net::awaitable<void> contended_floor(iteration_gate& gate) {
  while (gate.next()) co_await post_round_trip();
}

template <class Sem>
net::awaitable<void> contended_rein(iteration_gate& gate, Sem& sem) {
  while (gate.next()) {
    permit p = co_await sem.acquire();
    co_await post_round_trip();
  }
}

template <class Idiom>
net::awaitable<void> contended_idiom(iteration_gate& gate, Idiom& sem) {
  while (gate.next()) {
    co_await sem.acquire();
    co_await post_round_trip();
    sem.release();
  }
}

template <class Sem>
void make_and_run_contended(bench_io& io, iteration_gate& gate) {
  Sem sem(io.executor(), contended_permits);
  for (std::size_t i = 0; i < contended_coroutines; ++i) {
    if constexpr (is_rein<Sem>) io.spawn(contended_rein(gate, sem));
    else io.spawn(contended_idiom(gate, sem));
  }
  io.run_all();
}

// ---- Registration of the timing benchmarks ------------------------------------------------------------

template <class T>
struct floor_nested {
  using value_type = T;
};
template <class>
constexpr bool is_floor_nested = false;
template <class T>
constexpr bool is_floor_nested<floor_nested<T>> = true;
struct floor_post {};

template <class Sem>
void uncontended_benchmark(const std::string& name, reactor mode) {
  results::get().declare(name);
  benchmark::RegisterBenchmark(name.c_str(),
                               [name, mode](benchmark::State& state) {
                                 bench_io io(mode);
                                 run_clock clock(state, name);
                                 if constexpr (is_floor_nested<Sem>)
                                   io.run(uncontended_nested_floor<typename Sem::value_type>(state, clock));
                                 else if constexpr (std::is_same_v<Sem, floor_post>)
                                   io.run(uncontended_post_floor(state, clock));
                                 else
                                   make_and_run_uncontended<Sem>(state, io, clock);
                               })
      ->Unit(benchmark::kNanosecond);
}

template <class Sem>
void contended_benchmark(const std::string& name, reactor mode, int concurrency_hint = default_concurrency_hint) {
  results::get().declare(name);
  benchmark::RegisterBenchmark(name.c_str(),
                               [name, mode, concurrency_hint](benchmark::State& state) {
                                 bench_io io(mode, concurrency_hint);
                                 run_clock clock(state, name);
                                 iteration_gate gate(state, clock);
                                 if constexpr (std::is_same_v<Sem, floor_post>) {
                                   for (std::size_t i = 0; i < contended_coroutines; ++i)
                                     io.spawn(contended_floor(gate));
                                   io.run_all();
                                 } else {
                                   make_and_run_contended<Sem>(io, gate);
                                 }
                               })
      ->Unit(benchmark::kNanosecond);
}

// ---- The contended loop on two threads ----------------------------------------------------------------

// Handoffs per timed batch of the two-thread rows: each batch runs the io_context to completion on both
// threads, so it is long enough that starting and joining the second thread is a small part of it.
constexpr long two_thread_batch = 20'000;

template <class Sem>
net::awaitable<void> two_thread_loop(std::atomic<long>& left, Sem* sem) {
  while (left.fetch_sub(1, std::memory_order_relaxed) > 0) {
    if constexpr (std::is_same_v<Sem, floor_post>) {
      co_await post_round_trip();
    } else if constexpr (is_rein<Sem>) {
      permit p = co_await sem->acquire();
      co_await post_round_trip();
    } else {
      co_await sem->acquire();
      co_await post_round_trip();
      sem->release();
    }
  }
}

template <class Sem>
void two_thread_benchmark(const std::string& name) {
  benchmark::RegisterBenchmark(name.c_str(),
                               [](benchmark::State& state) {
                                 while (state.KeepRunningBatch(two_thread_batch)) {
                                   bench_io io(reactor::on);
                                   std::unique_ptr<Sem> sem;
                                   if constexpr (!std::is_same_v<Sem, floor_post>)
                                     sem = std::make_unique<Sem>(io.executor(), contended_permits);
                                   std::atomic<long> left{two_thread_batch};
                                   for (std::size_t i = 0; i < contended_coroutines; ++i)
                                     io.spawn(two_thread_loop<Sem>(left, sem.get()));
                                   const auto start = std::chrono::steady_clock::now();
                                   std::thread second([&] { io.context().run(); });
                                   io.context().run();
                                   second.join();
                                   const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
                                   io.run_all();  // nothing left to run: rethrows what a coroutine threw
                                   state.SetIterationTime(took.count());  // the batch's: time per handoff
                                 }
                               })
      ->UseManualTime()
      ->Unit(benchmark::kNanosecond);
}

// ---- Memory: 100,000 parked waiters -----------------------------------------------------------------------

/// Heap growth per parked waiter.
struct growth {
  double new_bytes = 0;        // bytes requested through operator new (rein's ops; not frames, not Asio's ops)
  double new_allocations = 0;  // operator new calls, net of deletes
  double heap_bytes = 0;       // glibc's bytes in use, frames and chunk overhead included
};

template <class SpawnOne>
growth park_all(bench_io& io, SpawnOne spawn_one) {
  const heap::counters c0 = heap::sample();
  const double h0 = heap::heap_in_use();
  for (std::size_t i = 0; i < parked_waiters; ++i) spawn_one(i);
  io.drain_ready();  // every coroutine runs until it parks
  const heap::counters c1 = heap::sample();
  const double h1 = heap::heap_in_use();
  const auto n = static_cast<double>(parked_waiters);
  const auto live = [](const heap::counters& c) { return static_cast<double>(c.allocations - c.deallocations); };
  return {static_cast<double>(c1.bytes - c0.bytes) / n, (live(c1) - live(c0)) / n, (h1 - h0) / n};
}

// The frame-only baseline mirrors rein's frames: the same worker shape, a nested coroutine shaped like
// basic_semaphore::acquire_until (arguments, a permit local, a synchronous try first), and an async operation
// whose frame keeps the same arguments as rein's initiation does.
net::awaitable<permit> park_like_acquire_until(park_lot& lot, std::size_t n, std::chrono::steady_clock::time_point deadline) {
  if (permit p{}) co_return p;  // rein's try_acquire, which fails here
  co_return co_await lot.async_park<permit>(n, deadline);
}

net::awaitable<void> park_on_lot(park_lot& lot) {
  try {
    permit p = co_await park_like_acquire_until(lot, 1, std::chrono::steady_clock::time_point::max());
  } catch (const rein::system_error&) {
    // never resumed: clearing the lot destroys the coroutine
  }
}

template <class Sem>
net::awaitable<void> park_on_rein(Sem& sem) {
  try {
    permit p = co_await sem.acquire();
  } catch (const rein::system_error&) {
    // closed at tear-down
  }
}

template <class Idiom>
net::awaitable<void> park_on_idiom(Idiom& sem) {
  try {
    co_await sem.acquire();
  } catch (const rein::system_error&) {
    // closed at tear-down
  }
}

/// Parks the waiters of one idiom (with a cancellation slot connected to each if `cancellable`) and tears
/// them down again.
template <class Sem>
growth measure_parked(bench_io& io, bool cancellable) {
  auto signals = std::make_unique<net::cancellation_signal[]>(parked_waiters);  // reserved before measuring
  const auto slot = [&](std::size_t i) { return cancellable ? signals[i].slot() : net::cancellation_slot(); };
  growth g;
  if constexpr (std::is_same_v<Sem, park_lot>) {
    park_lot lot(parked_waiters);
    g = park_all(io, [&](std::size_t i) { io.spawn(park_on_lot(lot), slot(i)); });
    lot.clear();
    io.run_all();
  } else if constexpr (is_rein<Sem>) {
    Sem sem(io.executor(), 1);
    permit held = sem.try_acquire();  // a semaphore of 0 permits would fail every acquire (exceeds_capacity)
    g = park_all(io, [&](std::size_t i) { io.spawn(park_on_rein(sem), slot(i)); });
    sem.close();
    io.run_all();
  } else if constexpr (std::is_same_v<Sem, timer_semaphore>) {
    Sem sem(io.executor(), 0);
    g = park_all(io, [&](std::size_t i) { io.spawn(park_on_idiom(sem), slot(i)); });
    sem.open_all();
    io.run_all();
  } else {
    Sem sem(io.executor(), 1);
    io.run(sem.acquire());  // fills the only slot, so that every later acquire waits
    g = park_all(io, [&](std::size_t i) { io.spawn(park_on_idiom(sem), slot(i)); });
    sem.close();
    io.run_all();
  }
  return g;
}

template <class Sem>
void memory_benchmark(const std::string& name, bool cancellable) {
  results::get().declare(name);
  benchmark::RegisterBenchmark(
      name.c_str(),
      [name, cancellable](benchmark::State& state) {
        for (auto _ : state) {
          // The baseline is measured right before, in the same state of the allocator: measured once for
          // the whole process, it moved by 16 bytes per waiter depending on what had run before.
          bench_io io(reactor::off);
          const growth base = measure_parked<park_lot>(io, cancellable);
          const growth g = measure_parked<Sem>(io, cancellable);
          state.counters["new_B/waiter"] = g.new_bytes;
          state.counters["new_allocs/waiter"] = g.new_allocations;
          state.counters["heap_B/waiter"] = g.heap_bytes;
          state.counters["beyond_baseline_B/waiter"] = g.heap_bytes - base.heap_bytes;
          results& r = results::get();
          r.record_value(name, "bytes through operator new per waiter", g.new_bytes);
          r.record_value(name, "operator new allocations per waiter (net)", g.new_allocations);
          r.record_value(name, "heap bytes per waiter (frames included)", g.heap_bytes);
          r.record_value(name, "heap bytes per waiter beyond the frame-only baseline", g.heap_bytes - base.heap_bytes);
        }
      })
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
}

// ---- Names, groups and targets --------------------------------------------------------------------------

const std::string uncontended = "uncontended/";
const std::string contended = "contended_64x4/";
const std::string memory = "memory/parked_100k/";

std::string on(const std::string& group, reactor mode, const char* idiom) {
  return group + to_string(mode) + "/" + idiom;
}

void register_timing(reactor mode) {
  uncontended_benchmark<floor_nested<std::size_t>>(on(uncontended, mode, "floor_nested_awaitable"), mode);
  uncontended_benchmark<floor_nested<permit>>(on(uncontended, mode, "floor_nested_awaitable_permit"), mode);
  uncontended_benchmark<floor_post>(on(uncontended, mode, "floor_post"), mode);
  uncontended_benchmark<st_semaphore>(on(uncontended, mode, "rein_single_thread_semaphore"), mode);
  uncontended_benchmark<ts_semaphore>(on(uncontended, mode, "rein_semaphore"), mode);
  uncontended_benchmark<st_try_first>(on(uncontended, mode, "rein_single_thread_semaphore_try_first"), mode);
  uncontended_benchmark<ts_try_first>(on(uncontended, mode, "rein_semaphore_try_first"), mode);
  uncontended_benchmark<st_untimed>(on(uncontended, mode, "rein_single_thread_semaphore_untimed"), mode);
  uncontended_benchmark<ts_untimed>(on(uncontended, mode, "rein_semaphore_untimed"), mode);
  uncontended_benchmark<st_observed>(on(uncontended, mode, "rein_single_thread_semaphore_observed"), mode);
  uncontended_benchmark<ts_observed>(on(uncontended, mode, "rein_semaphore_observed"), mode);
  uncontended_benchmark<bare_semaphore>(on(uncontended, mode, "floor_bare_semaphore"), mode);
  uncontended_benchmark<channel_try_first>(on(uncontended, mode, "channel_try_send_then_async_send"), mode);
  uncontended_benchmark<channel_async>(on(uncontended, mode, "channel_async_send"), mode);
  uncontended_benchmark<concurrent_channel_try_first>(
      on(uncontended, mode, "concurrent_channel_try_send_then_async_send"), mode);
  uncontended_benchmark<concurrent_channel_async>(on(uncontended, mode, "concurrent_channel_async_send"), mode);
  if (mode == reactor::on)
    uncontended_benchmark<timer_semaphore>(on(uncontended, mode, "steady_timer_cancel_one"), mode);

  contended_benchmark<floor_post>(on(contended, mode, "floor_post"), mode);
  contended_benchmark<st_semaphore>(on(contended, mode, "rein_single_thread_semaphore"), mode);
  contended_benchmark<ts_semaphore>(on(contended, mode, "rein_semaphore"), mode);
  contended_benchmark<st_untimed>(on(contended, mode, "rein_single_thread_semaphore_untimed"), mode);
  contended_benchmark<ts_untimed>(on(contended, mode, "rein_semaphore_untimed"), mode);
  contended_benchmark<st_coarse>(on(contended, mode, "rein_single_thread_semaphore_coarse"), mode);
  contended_benchmark<ts_coarse>(on(contended, mode, "rein_semaphore_coarse"), mode);
  contended_benchmark<st_direct>(on(contended, mode, "rein_single_thread_semaphore_direct"), mode);
  contended_benchmark<ts_direct>(on(contended, mode, "rein_semaphore_direct"), mode);
  contended_benchmark<st_observed>(on(contended, mode, "rein_single_thread_semaphore_observed"), mode);
  contended_benchmark<ts_observed>(on(contended, mode, "rein_semaphore_observed"), mode);
  contended_benchmark<st_lifo>(on(contended, mode, "rein_single_thread_semaphore_lifo"), mode);
  contended_benchmark<ts_lifo>(on(contended, mode, "rein_semaphore_lifo"), mode);
  contended_benchmark<st_priority>(on(contended, mode, "rein_single_thread_semaphore_priority"), mode);
  contended_benchmark<ts_priority>(on(contended, mode, "rein_semaphore_priority"), mode);
  contended_benchmark<st_fair>(on(contended, mode, "rein_single_thread_semaphore_fair"), mode);
  contended_benchmark<ts_fair>(on(contended, mode, "rein_semaphore_fair"), mode);
  contended_benchmark<st_partitioned>(on(contended, mode, "rein_single_thread_semaphore_partitioned"), mode);
  contended_benchmark<ts_partitioned>(on(contended, mode, "rein_semaphore_partitioned"), mode);
  // io_context(1): the application says one thread runs the context (see the note at the end).
  contended_benchmark<floor_post>(on(contended, mode, "floor_post_hint1"), mode, 1);
  contended_benchmark<st_semaphore>(on(contended, mode, "rein_single_thread_semaphore_hint1"), mode, 1);
  contended_benchmark<bare_semaphore>(on(contended, mode, "floor_bare_semaphore"), mode);
  contended_benchmark<channel_try_first>(on(contended, mode, "channel_try_send_then_async_send"), mode);
  contended_benchmark<channel_async>(on(contended, mode, "channel_async_send"), mode);
  contended_benchmark<concurrent_channel_try_first>(
      on(contended, mode, "concurrent_channel_try_send_then_async_send"), mode);
  contended_benchmark<concurrent_channel_async>(on(contended, mode, "concurrent_channel_async_send"), mode);
  if (mode == reactor::on) contended_benchmark<timer_semaphore>(on(contended, mode, "steady_timer_cancel_one"), mode);
}

void register_two_threads() {
  const std::string p = "contended_64x4_2_threads/";
  two_thread_benchmark<floor_post>(p + "floor_post");
  two_thread_benchmark<ts_semaphore>(p + "rein_semaphore");
  two_thread_benchmark<ts_coarse>(p + "rein_semaphore_coarse");
  two_thread_benchmark<ts_direct>(p + "rein_semaphore_direct");
  two_thread_benchmark<concurrent_channel_try_first>(p + "concurrent_channel_try_send_then_async_send");
  two_thread_benchmark<concurrent_channel_async>(p + "concurrent_channel_async_send");
}

void register_memory() {
  memory_benchmark<park_lot>(memory + "frame_only_baseline", false);
  memory_benchmark<st_semaphore>(memory + "rein_single_thread_semaphore", false);
  memory_benchmark<ts_semaphore>(memory + "rein_semaphore", false);
  memory_benchmark<ts_semaphore>(memory + "rein_semaphore_cancellable", true);
  memory_benchmark<channel_try_first>(memory + "channel", false);
  memory_benchmark<channel_try_first>(memory + "channel_cancellable", true);
  memory_benchmark<timer_semaphore>(memory + "steady_timer_cancel_one", false);
}

void ratio_target(std::string description, std::string numerator, std::string denominator, bound kind, double limit) {
  results::get().add_target({std::move(description), std::move(numerator), std::move(denominator), kind, limit, {}});
}

void register_summary() {
  results& r = results::get();
  for (reactor mode : {reactor::on, reactor::off}) {
    const std::string u = uncontended + to_string(mode) + "/";
    r.add_group({"Uncontended acquire + release, " + std::string(to_string(mode)), u, u + "floor_nested_awaitable"});
  }
  for (reactor mode : {reactor::off, reactor::on}) {
    const std::string c = contended + to_string(mode) + "/";
    r.add_group({"Contended (64 coroutines, 4 permits: acquire, co_await post, release), " +
                     std::string(to_string(mode)),
                 c, c + "floor_post"});
  }

  const std::string u = uncontended + "reactor_on/";
  ratio_target("uncontended, reactor on: single_thread_semaphore / nested-awaitable floor", u + "rein_single_thread_semaphore",
               u + "floor_nested_awaitable", bound::at_most, 2);
  ratio_target("uncontended, reactor on: semaphore / nested-awaitable floor", u + "rein_semaphore",
               u + "floor_nested_awaitable", bound::at_most, 3);
  for (const char* ch : {"channel_try_send_then_async_send", "channel_async_send"}) {
    ratio_target(std::string("uncontended, reactor on: ") + ch + " / single_thread_semaphore", u + ch,
                 u + "rein_single_thread_semaphore", bound::at_least, 30);
    ratio_target(std::string("uncontended, reactor on: ") + ch + " / semaphore", u + ch, u + "rein_semaphore",
                 bound::at_least, 30);
    ratio_target(std::string("uncontended, reactor on: concurrent_") + ch + " / semaphore",
                 u + "concurrent_" + ch, u + "rein_semaphore", bound::at_least, 30);
  }

  // What the door does beyond a nested coroutine that returns what it returns (a permit): the try and the
  // release, through the lock-free word on the thread-safe semaphore.
  ratio_target("uncontended, reactor on: single_thread_semaphore / nested-awaitable floor returning a permit",
               u + "rein_single_thread_semaphore", u + "floor_nested_awaitable_permit", bound::at_most, 1.5);
  ratio_target("uncontended, reactor on: semaphore / nested-awaitable floor returning a permit",
               u + "rein_semaphore", u + "floor_nested_awaitable_permit", bound::at_most, 1.5);

  // The lock-free word (detail/permit_pool.hpp): trying first on the thread-safe semaphore costs about what it
  // costs on the single-threaded one (two locked sections made it 2.4 times as much).
  ratio_target("uncontended, reactor on: semaphore_try_first / single_thread_semaphore_try_first",
               u + "rein_semaphore_try_first", u + "rein_single_thread_semaphore_try_first", bound::at_most, 1.5);

  // The best any coroutine fast path could do against the channel's round trip on this machine: the floor.
  ratio_target("reference: channel_async_send / nested-awaitable floor (the most any fast path can reach)",
               u + "channel_async_send", u + "floor_nested_awaitable", bound::at_least, 30);

  const std::string off = contended + "reactor_off/";
  ratio_target("contended, reactor off: single_thread_semaphore / post floor", off + "rein_single_thread_semaphore",
               off + "floor_post", bound::at_most, 1.8);
  ratio_target("contended, reactor off: semaphore / post floor", off + "rein_semaphore", off + "floor_post",
               bound::at_most, 1.8);
  // A handoff parks the waiter in an async operation and resumes it through the scheduler: the bare semaphore
  // (nothing but that) and Asio's own channel show what that costs next to the same floor.
  ratio_target("reference: channel_async_send / post floor, reactor off (Asio's own handoff)",
               off + "channel_async_send", off + "floor_post", bound::at_most, 1.8);
  const std::string c_on = contended + "reactor_on/";
  // A reference row states a floor against a target it shows out of reach: it is expected to FAIL.
  ratio_target("reference: floor_bare_semaphore / post floor, reactor on (the least a parking handoff costs)",
               c_on + "floor_bare_semaphore", c_on + "floor_post", bound::at_most, 2.5);
  // What rein does beyond the least a parking semaphore must: queue order, cancellation, deadlines, wait
  // statistics, shutdown.
  ratio_target("contended, reactor on: single_thread_semaphore / bare semaphore",
               c_on + "rein_single_thread_semaphore", c_on + "floor_bare_semaphore", bound::at_most, 1.5);
  ratio_target("contended, reactor on: semaphore / bare semaphore", c_on + "rein_semaphore",
               c_on + "floor_bare_semaphore", bound::at_most, 1.5);
  for (const char* ch : {"channel_try_send_then_async_send", "channel_async_send"}) {
    // "faster than": the channel's time over rein's must exceed 1.
    ratio_target(std::string("contended, reactor on: ") + ch + " / single_thread_semaphore (> 1: rein faster)",
                 c_on + ch, c_on + "rein_single_thread_semaphore", bound::at_least, 1);
    ratio_target(std::string("contended, reactor on: concurrent_") + ch + " / semaphore (> 1: rein faster)",
                 c_on + "concurrent_" + ch, c_on + "rein_semaphore", bound::at_least, 1);
    // The same without the two clock reads per handoff that time the waits (the channel times nothing).
    ratio_target(std::string("contended, reactor on: ") + ch + " / single_thread_semaphore, measure_wait off",
                 c_on + ch, c_on + "rein_single_thread_semaphore_untimed", bound::at_least, 1);
    ratio_target(std::string("contended, reactor on: concurrent_") + ch + " / semaphore, measure_wait off",
                 c_on + "concurrent_" + ch, c_on + "rein_semaphore_untimed", bound::at_least, 1);
  }

  // What timing the waits on the coarse clock costs a contended handoff, against the same semaphore timing
  // nothing (budget: 5%). The default, steady_clock, costs more: the rows show how much.
  for (const char* sem : {"rein_single_thread_semaphore", "rein_semaphore"}) {
    ratio_target(std::string("contended, reactor on: ") + sem + "_coarse / " + sem + "_untimed (coarse timing's cost)",
                 c_on + sem + "_coarse", c_on + sem + "_untimed", bound::at_most, 1.05);
  }

  // An observer set against none, side by side: each variant of a semaphore (observed, untimed, lifo,
  // priority) as a multiple of the plain one. With an observer, each locked section compares the policy's
  // observed state with the last one seen (a semaphore's handoff changes none, so no event is delivered);
  // with none, the cost is a test of a bool per path (benchmarks/handoff/instructions.sh counts it without
  // timing noise).
  for (const std::string& group : {uncontended, contended}) {
    for (reactor mode : {reactor::on, reactor::off}) {
      const std::string g = group + to_string(mode) + "/";
      for (const char* sem : {"rein_single_thread_semaphore", "rein_semaphore"}) {
        r.add_group({std::string(sem) + " variants against " + sem + ", " + g, g + sem, g + sem});
      }
    }
  }

  // The op is 56 bytes plus the coroutine's 16-byte handler (the wait is awaited as a deferred operation).
  // By heap difference a parked waiter costs 32 bytes beyond the frame-only baseline with g++ 12 (the budget
  // was 64): 40 catches a door frame that grows by 16 bytes (a kept view of the line did, once; frames are
  // allocated in 16-byte steps). A connected cancellation slot adds Asio's own 64-byte handler (as it does
  // for a channel).
  for (const char* sem : {"rein_single_thread_semaphore", "rein_semaphore", "rein_semaphore_cancellable"}) {
    const double slot = std::string(sem) == "rein_semaphore_cancellable" ? 64 : 0;
    r.add_target({std::string("memory: ") + sem + ", bytes per waiter through operator new (beyond frames)",
                  memory + sem, "", bound::at_most, 72, "bytes through operator new per waiter"});
    r.add_target({std::string("memory: ") + sem + ", heap bytes per waiter beyond the frame-only baseline",
                  memory + sem, "", bound::at_most, 40 + slot,
                  "heap bytes per waiter beyond the frame-only baseline"});
  }

  r.add_note("hint1 rows: the same work on io_context(1), the concurrency hint that says one thread runs the "
             "context; Asio's scheduler then keeps handlers posted from that thread in a thread-private queue. "
             "An application that runs each io_context on one thread can pass it.");
  r.add_note("reactor_off rows: nothing on the io_context owns a timer. A rein limiter makes its timer only when "
             "a deadline (or, for rate limiters, a wait) first needs it, so a semaphore used without timeouts "
             "leaves the reactor off.");
  r.add_note("Memory: 'through operator new' counts a counting global operator new, which sees rein's parked "
             "ops (std::allocator) but neither coroutine frames nor Asio's own ops (Asio's recycling "
             "allocator uses aligned_alloc); 'heap' is glibc's mallinfo2 bytes in use, everything included; the "
             "baseline parks the same coroutines on nothing (handlers kept in storage reserved beforehand).");
  r.add_note("Heap bytes per waiter (mallinfo2) move by 16 between processes (allocator state), and coroutine "
             "frames differ in size between idioms: the heap difference is a cross-check; the operator new count, "
             "exact, judges rein's own bytes.");
  r.add_note("All idioms run on the benchmark's single thread; CPU time is the thread's (user + system).");
}

[[maybe_unused]] const bool registered = [] {
  register_timing(reactor::on);
  register_timing(reactor::off);
  register_two_threads();
  register_memory();
  register_summary();
  return true;
}();

}  // namespace
