// The throttle's and keyed's fast paths against what a user writes by hand and against the stages' own fast
// paths, side by side in one binary:
//
//   throttle/try_acquire/<n>_stages/...   one synchronous admission + completion, uncontended
//   throttle/acquire/<n>_stages/...       `co_await acquire(key)` + completion, uncontended (nothing waits)
//       floor_stage_try_acquire_sum       each stage's own try_acquire on a limiter fetched once (no key lookup),
//                                         its permits released: the least the stages themselves cost
//       floor_stage_acquire_sum           (acquire only) each stage's own `co_await acquire()` on a limiter
//                                         fetched once: the stages' own coroutine fast paths
//       idiom_by_hand                     what a user writes without the throttle: look the key up in each
//                                         keyed registry and take every stage in turn (try_acquire, or co_await
//                                         each limiter's acquire())
//       rein_throttle                     rein::throttle over the same stages, guard completed with success
//     2 stages: keyed semaphore, token bucket; 4 stages: keyed quota gate, keyed semaphore, global semaphore,
//     token bucket (the admission order). The key is a 24-character host name, longer than std::string's
//     small buffer, so a lookup that copies it allocates; every row also reports its operator new calls.
//
//   keyed/get_hit/<n>_keys/...            get() of an existing key among n (strided over all of them)
//       floor_unordered_map_find          std::unordered_map<std::string, ...>::find alone
//       idiom_mutex_map_shared_ptr        a map of std::shared_ptr<semaphore> under a std::mutex (the pin is the
//                                         shared_ptr copy), as a user writes a registry without eviction
//       rein_keyed                        rein::keyed<rein::semaphore>::get, handle dropped
//       rein_keyed_by_view                the same get given a std::string_view of the key (heterogeneous
//                                         lookup: no std::string made; reports its operator new calls)
//   keyed/get_new_key/...                 get() of a key not there, in steady state: the limiter is made, and
//                                         the registry stays small because each new key evicts idle ones
//       floor_make_semaphore              making and destroying one rein::semaphore (std::make_shared)
//       idiom_mutex_map_shared_ptr        the map above, inserting the new key and erasing the oldest
//       rein_keyed                        rein::keyed<rein::semaphore>::get (reports limiters made per get)
//
// Everything runs on the benchmark's one thread, on limiters that never run out (permits and a bucket far
// larger than any run takes), so every row is a fast path.

#include "support/bench_io.hpp"
#include "support/counting_new.hpp"
#include "support/ratio_summary.hpp"

#include <rein/config.hpp>
#include <rein/keyed.hpp>
#include <rein/outcome.hpp>
#include <rein/permit.hpp>
#include <rein/quota_gate.hpp>
#include <rein/semaphore.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

using namespace rein_bench;
namespace net = rein::net;

// Far more than any run takes: every take is the fast path.
const rein::token_bucket_options bottomless{.rate = 1e9, .capacity = 1'000'000'000'000'000};
constexpr std::size_t plenty = 1'000'000;
// 24 characters: longer than the small-string buffer (15 in libstdc++), as real host names usually are.
const std::string host = "api.provider.example.com";

using gates_type = rein::keyed<rein::quota_gate>;
using per_key_type = rein::keyed<rein::semaphore>;
using throttle_2 = rein::throttle<per_key_type, rein::token_bucket>;
using throttle_4 = rein::throttle<gates_type, per_key_type, rein::semaphore, rein::token_bucket>;

struct stages {
  explicit stages(net::any_io_executor ex)
      : gates(ex, {}), per_key(ex, plenty), global(ex, plenty), rate(ex, bottomless) {}
  gates_type gates;
  per_key_type per_key;
  rein::semaphore global;
  rein::token_bucket rate;
  throttle_2 two{per_key, rate};
  throttle_4 four{gates, per_key, global, rate};
};

void check(bool admitted) {
  if (!admitted) throw std::logic_error("throttle benchmark: a fast path refused");
}

// operator new calls per operation between start() and stop() (0 when the counting operator new, defined by
// benchmarks/semaphore.cpp, is not linked in).
class allocation_count {
 public:
  explicit allocation_count(std::string name) : name_(std::move(name)) {}
  void start() noexcept { before_ = heap::sample().allocations; }
  void stop(benchmark::State& state) {
    const std::size_t after = heap::sample().allocations;
    if (heap::counting() && state.iterations() > 0) {
      const double per_op = static_cast<double>(after - before_) / static_cast<double>(state.iterations());
      state.counters["allocations_per_op"] = per_op;
      results::get().record_value(name_, "operator new calls per op", per_op);
    }
  }

 private:
  std::string name_;
  std::size_t before_ = 0;
};

// ---- try_acquire ------------------------------------------------------------------------------------------

template <int N>
void try_floor(benchmark::State& state, stages& s, run_clock& clock, allocation_count& allocs) {
  auto key_sem = s.per_key.get(host);
  auto gate = s.gates.get(host);
  clock.start();
  allocs.start();
  for (auto _ : state) {
    if constexpr (N == 4) check(static_cast<bool>(gate->try_acquire()));
    rein::permit key_permit = key_sem->try_acquire();
    check(static_cast<bool>(key_permit));
    if constexpr (N == 4) {
      rein::permit global_permit = s.global.try_acquire();
      check(static_cast<bool>(global_permit));
      check(static_cast<bool>(s.rate.try_acquire()));
    } else {
      check(static_cast<bool>(s.rate.try_acquire()));
    }
  }
  allocs.stop(state);
  clock.stop();
}

template <int N>
void try_idiom(benchmark::State& state, stages& s, run_clock& clock, allocation_count& allocs) {
  clock.start();
  allocs.start();
  for (auto _ : state) {
    if constexpr (N == 4) check(static_cast<bool>(s.gates.get(host)->try_acquire()));
    rein::permit key_permit = s.per_key.get(host)->try_acquire();
    check(static_cast<bool>(key_permit));
    rein::permit global_permit;
    if constexpr (N == 4) {
      global_permit = s.global.try_acquire();
      check(static_cast<bool>(global_permit));
    }
    if (!s.rate.try_acquire()) throw std::logic_error("throttle benchmark: the bucket refused");
  }
  allocs.stop(state);
  clock.stop();
}

template <int N>
void try_rein(benchmark::State& state, stages& s, run_clock& clock, allocation_count& allocs) {
  clock.start();
  allocs.start();
  for (auto _ : state) {
    if constexpr (N == 4) {
      auto guard = s.four.try_acquire(host);
      check(static_cast<bool>(guard));
      guard.complete(rein::outcome::success);
    } else {
      auto guard = s.two.try_acquire(host);
      check(static_cast<bool>(guard));
      guard.complete(rein::outcome::success);
    }
  }
  allocs.stop(state);
  clock.stop();
}

// ---- co_await acquire -------------------------------------------------------------------------------------

template <int N>
net::awaitable<void> acquire_floor(benchmark::State& state, stages& s, run_clock& clock, allocation_count& allocs) {
  try_floor<N>(state, s, clock, allocs);
  co_return;
}

template <int N>
net::awaitable<void> acquire_floor_awaited(benchmark::State& state, stages& s, run_clock& clock,
                                           allocation_count& allocs) {
  auto key_sem = s.per_key.get(host);
  auto gate = s.gates.get(host);
  clock.start();
  allocs.start();
  for (auto _ : state) {
    if constexpr (N == 4) co_await gate->acquire();
    rein::permit key_permit = co_await key_sem->acquire();
    rein::permit global_permit;
    if constexpr (N == 4) global_permit = co_await s.global.acquire();
    co_await s.rate.acquire();
  }
  allocs.stop(state);
  clock.stop();
}

template <int N>
net::awaitable<void> acquire_idiom(benchmark::State& state, stages& s, run_clock& clock, allocation_count& allocs) {
  clock.start();
  allocs.start();
  for (auto _ : state) {
    if constexpr (N == 4) co_await s.gates.get(host)->acquire();
    rein::permit key_permit = co_await s.per_key.get(host)->acquire();
    rein::permit global_permit;
    if constexpr (N == 4) global_permit = co_await s.global.acquire();
    co_await s.rate.acquire();
  }
  allocs.stop(state);
  clock.stop();
}

template <int N>
net::awaitable<void> acquire_rein(benchmark::State& state, stages& s, run_clock& clock, allocation_count& allocs) {
  clock.start();
  allocs.start();
  for (auto _ : state) {
    if constexpr (N == 4) {
      auto guard = co_await s.four.acquire(host);
      guard.complete(rein::outcome::success);
    } else {
      auto guard = co_await s.two.acquire(host);
      guard.complete(rein::outcome::success);
    }
  }
  allocs.stop(state);
  clock.stop();
}

enum class idiom { floor, floor_awaited, by_hand, rein };

template <int N, idiom I>
void throttle_benchmark(const std::string& name, bool awaiting) {
  results::get().declare(name);
  benchmark::RegisterBenchmark(name.c_str(), [name, awaiting](benchmark::State& state) {
    bench_io io(reactor::off);
    stages s(io.executor());
    run_clock clock(state, name);
    allocation_count allocs(name);
    if (!awaiting) {
      if constexpr (I == idiom::floor || I == idiom::floor_awaited) try_floor<N>(state, s, clock, allocs);
      else if constexpr (I == idiom::by_hand) try_idiom<N>(state, s, clock, allocs);
      else try_rein<N>(state, s, clock, allocs);
    } else {
      if constexpr (I == idiom::floor) io.run(acquire_floor<N>(state, s, clock, allocs));
      else if constexpr (I == idiom::floor_awaited) io.run(acquire_floor_awaited<N>(state, s, clock, allocs));
      else if constexpr (I == idiom::by_hand) io.run(acquire_idiom<N>(state, s, clock, allocs));
      else io.run(acquire_rein<N>(state, s, clock, allocs));
    }
  })->Unit(benchmark::kNanosecond);
}

// ---- keyed get() ------------------------------------------------------------------------------------------

#ifdef NDEBUG
const std::vector<std::size_t> key_counts{10, 10'000, 1'000'000};
#else
const std::vector<std::size_t> key_counts{10, 1'000};  // the CTest smoke run (Debug): small registries
#endif

std::vector<std::string> make_keys(std::size_t n, const char* prefix) {
  std::vector<std::string> keys;
  keys.reserve(n);
  char buffer[64];
  for (std::size_t i = 0; i < n; ++i) {
    std::snprintf(buffer, sizeof buffer, "%s-%07zu.example.com", prefix, i);
    keys.emplace_back(buffer);
  }
  return keys;
}

// Visits every key once per n lookups in a scattered order (a stride coprime with n), so that a large
// registry is not read in the order it was built.
std::size_t stride_for(std::size_t n) {
  std::size_t stride = n / 2 + 1;
  auto gcd = [](std::size_t a, std::size_t b) {
    while (b != 0) a = std::exchange(b, a % b);
    return a;
  };
  while (gcd(stride, n) != 1) ++stride;
  return stride;
}

using shared_map = std::unordered_map<std::string, std::shared_ptr<rein::semaphore>>;

// The registries of n keys are built once per process and kept (a million limiters take seconds to make,
// and Google Benchmark runs each benchmark several times): the io_context outlives the limiters.
struct hit_maps {
  explicit hit_maps(std::size_t n) : keys(make_keys(n, "host")) {
    for (const std::string& k : keys) map.emplace(k, std::make_shared<rein::semaphore>(io, 4));
  }
  net::io_context io;
  std::vector<std::string> keys;
  shared_map map;
  std::mutex mutex;
};

struct hit_registry {
  explicit hit_registry(std::size_t n) : keys(make_keys(n, "host")), registry(io, std::size_t{4}, {}, options(n)) {
    for (const std::string& k : keys) registry.get(k);
    if (registry.size() != n) throw std::logic_error("keyed/get_hit: the registry lost keys");
  }
  static rein::keyed_options options(std::size_t n) {
    rein::keyed_options o;
    o.max_keys = n;
    o.sweep_batch = 0;  // nothing is evicted while the registry is built, nor later: no new key comes
    return o;
  }
  net::io_context io;
  std::vector<std::string> keys;
  per_key_type registry;
};

template <class Fixture>
Fixture& built(std::size_t n) {
  static std::unordered_map<std::size_t, std::unique_ptr<Fixture>> cache;
  std::unique_ptr<Fixture>& f = cache[n];
  if (!f) f = std::make_unique<Fixture>(n);
  return *f;
}

void get_hit_floor(benchmark::State& state, const std::string& name, std::size_t n) {
  hit_maps& f = built<hit_maps>(n);
  const std::size_t stride = stride_for(n);
  std::size_t i = 0;
  run_clock clock(state, name);
  clock.start();
  for (auto _ : state) {
    auto it = f.map.find(f.keys[i]);
    benchmark::DoNotOptimize(it);
    i = (i + stride) % n;
  }
  clock.stop();
}

void get_hit_idiom(benchmark::State& state, const std::string& name, std::size_t n) {
  hit_maps& f = built<hit_maps>(n);
  const std::size_t stride = stride_for(n);
  std::size_t i = 0;
  run_clock clock(state, name);
  clock.start();
  for (auto _ : state) {
    std::shared_ptr<rein::semaphore> pinned;
    {
      std::lock_guard<std::mutex> lock(f.mutex);
      pinned = f.map.find(f.keys[i])->second;
    }
    benchmark::DoNotOptimize(pinned.get());
    i = (i + stride) % n;
  }
  clock.stop();
}

void get_hit_rein(benchmark::State& state, const std::string& name, std::size_t n) {
  hit_registry& f = built<hit_registry>(n);
  const std::size_t stride = stride_for(n);
  std::size_t i = 0;
  run_clock clock(state, name);
  clock.start();
  for (auto _ : state) {
    auto handle = f.registry.get(f.keys[i]);
    benchmark::DoNotOptimize(handle.get());
    i = (i + stride) % n;
  }
  clock.stop();
  if (f.registry.snapshot().created_total != n) throw std::logic_error("keyed/get_hit: a lookup missed");
}

void get_hit_rein_view(benchmark::State& state, const std::string& name, std::size_t n) {
  hit_registry& f = built<hit_registry>(n);
  std::vector<std::string_view> views(f.keys.begin(), f.keys.end());
  const std::size_t stride = stride_for(n);
  std::size_t i = 0;
  run_clock clock(state, name);
  allocation_count allocs(name);
  clock.start();
  allocs.start();
  for (auto _ : state) {
    auto handle = f.registry.get(views[i]);
    benchmark::DoNotOptimize(handle.get());
    i = (i + stride) % n;
  }
  allocs.stop(state);
  clock.stop();
  if (f.registry.snapshot().created_total != n) throw std::logic_error("keyed/get_hit: a lookup missed");
}

// New keys come from a ring far larger than what stays alive, so each one is a miss.
constexpr std::size_t new_key_ring = 1 << 16;

void get_new_floor(benchmark::State& state, const std::string& name, std::size_t) {
  net::io_context io;
  run_clock clock(state, name);
  clock.start();
  for (auto _ : state) {
    auto made = std::make_shared<rein::semaphore>(io, 4);
    benchmark::DoNotOptimize(made.get());
  }
  clock.stop();
}

void get_new_idiom(benchmark::State& state, const std::string& name, std::size_t) {
  net::io_context io;
  const std::vector<std::string> keys = make_keys(new_key_ring, "new");
  shared_map map;
  std::deque<const std::string*> order;  // oldest first: the user's eviction, by age
  std::mutex mutex;
  std::size_t i = 0;
  run_clock clock(state, name);
  clock.start();
  for (auto _ : state) {
    std::shared_ptr<rein::semaphore> pinned;
    {
      std::lock_guard<std::mutex> lock(mutex);
      auto [it, made] = map.try_emplace(keys[i]);
      if (made) {
        it->second = std::make_shared<rein::semaphore>(io, 4);
        order.push_back(&keys[i]);
        if (order.size() > 2) {
          map.erase(*order.front());
          order.pop_front();
        }
      }
      pinned = it->second;
    }
    benchmark::DoNotOptimize(pinned.get());
    i = (i + 1) % new_key_ring;
  }
  clock.stop();
}

void get_new_rein(benchmark::State& state, const std::string& name, std::size_t) {
  net::io_context io;
  const std::vector<std::string> keys = make_keys(new_key_ring, "new");
  per_key_type registry(io, std::size_t{4});
  std::size_t i = 0;
  run_clock clock(state, name);
  const auto made_before = registry.snapshot().created_total;
  clock.start();
  for (auto _ : state) {
    auto handle = registry.get(keys[i]);
    benchmark::DoNotOptimize(handle.get());
    i = (i + 1) % new_key_ring;
  }
  clock.stop();
  const auto made = registry.snapshot().created_total - made_before;
  const double per_get = static_cast<double>(made) / static_cast<double>(state.iterations());
  state.counters["limiters_made_per_get"] = per_get;
  state.counters["keys_alive_at_end"] = static_cast<double>(registry.size());
  results::get().record_value(name, "limiters made per get", per_get);
}

template <void (*F)(benchmark::State&, const std::string&, std::size_t)>
void keyed_benchmark(const std::string& name, std::size_t keys) {
  results::get().declare(name);
  benchmark::RegisterBenchmark(name.c_str(), [name, keys](benchmark::State& state) { F(state, name, keys); })
      ->Unit(benchmark::kNanosecond);
}

// ---- Registration ------------------------------------------------------------------------------------------

[[maybe_unused]] const bool registered = [] {
  results& r = results::get();
  for (const bool awaiting : {false, true}) {
    const std::string door = awaiting ? "throttle/acquire/" : "throttle/try_acquire/";
    for (const int n : {2, 4}) {
      const std::string p = door + std::to_string(n) + "_stages/";
      if (n == 2) {
        throttle_benchmark<2, idiom::floor>(p + "floor_stage_try_acquire_sum", awaiting);
        if (awaiting) throttle_benchmark<2, idiom::floor_awaited>(p + "floor_stage_acquire_sum", awaiting);
        throttle_benchmark<2, idiom::by_hand>(p + "idiom_by_hand", awaiting);
        throttle_benchmark<2, idiom::rein>(p + "rein_throttle", awaiting);
      } else {
        throttle_benchmark<4, idiom::floor>(p + "floor_stage_try_acquire_sum", awaiting);
        if (awaiting) throttle_benchmark<4, idiom::floor_awaited>(p + "floor_stage_acquire_sum", awaiting);
        throttle_benchmark<4, idiom::by_hand>(p + "idiom_by_hand", awaiting);
        throttle_benchmark<4, idiom::rein>(p + "rein_throttle", awaiting);
      }
      r.add_group({std::string(awaiting ? "co_await throttle.acquire(key) + complete" : "throttle.try_acquire(key) + complete") +
                       ", " + std::to_string(n) + " stages",
                   p, p + "floor_stage_try_acquire_sum"});
      r.add_target({door + std::to_string(n) + " stages: rein_throttle / idiom_by_hand", p + "rein_throttle",
                    p + "idiom_by_hand", bound::at_most, 1.0, {}});
    }
  }
  for (const std::string door : {"try_acquire", "acquire"}) {
    const std::string p = "throttle/" + door + "/4_stages/";
    const std::string floor = p + (door == "acquire" ? "floor_stage_acquire_sum" : "floor_stage_try_acquire_sum");
    r.add_target({"throttle/" + door + "/4 stages: rein_throttle / the stages' own fast paths (target)",
                  p + "rein_throttle", floor, bound::at_most, 1.5, {}});
  }

  for (const std::size_t n : key_counts) {
    const std::string p = "keyed/get_hit/" + std::to_string(n) + "_keys/";
    keyed_benchmark<get_hit_floor>(p + "floor_unordered_map_find", n);
    keyed_benchmark<get_hit_idiom>(p + "idiom_mutex_map_shared_ptr", n);
    keyed_benchmark<get_hit_rein>(p + "rein_keyed", n);
    keyed_benchmark<get_hit_rein_view>(p + "rein_keyed_by_view", n);
    r.add_group({"keyed get() of an existing key, " + std::to_string(n) + " keys", p, p + "floor_unordered_map_find"});
  }
  const std::string p = "keyed/get_new_key/";
  keyed_benchmark<get_new_floor>(p + "floor_make_semaphore", 0);
  keyed_benchmark<get_new_idiom>(p + "idiom_mutex_map_shared_ptr", 0);
  keyed_benchmark<get_new_rein>(p + "rein_keyed", 0);
  r.add_group({"keyed get() of a new key (steady state: each new key evicts idle ones)", p, p + "floor_make_semaphore"});
  r.add_note("throttle rows: the floor takes each stage's fast path on limiters fetched once; the idiom looks the "
             "key up in each keyed registry and takes the stages in turn; both give everything back at the end of "
             "the iteration, as the throttle's guard does.");
  return true;
}();

}  // namespace
