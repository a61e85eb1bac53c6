// The acquire doors every primitive shares (detail/acquire_doors.hpp), on the manual clock: the coroutine
// door with a timeout too long to represent waits without a deadline, and the coroutine door behind other
// waiters skips the synchronous try and its lock (counted by a Mutex that counts its locks).
#include "support/async.hpp"
#include "support/catch.hpp"

#include <rein/adaptive_limiter.hpp>
#include <rein/adaptive_rate_limiter.hpp>
#include <rein/algo/aimd.hpp>
#include <rein/error.hpp>
#include <rein/fixed_window.hpp>
#include <rein/permit.hpp>
#include <rein/quota_gate.hpp>
#include <rein/semaphore.hpp>
#include <rein/sliding_window.hpp>
#include <rein/token_bucket.hpp>

#include <chrono>
#include <cstddef>
#include <exception>
#include <mutex>
#include <optional>
#include <type_traits>

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
using rein::permit;
using rein_test::manual_clock;
using rein_test::poll;
using duration = manual_clock::duration;

// A std::mutex that counts how often it was locked (one counter for all: the tests run one at a time).
struct counting_mutex {
  static inline std::size_t locks = 0;
  void lock() {
    ++locks;
    m.lock();
  }
  bool try_lock() {
    if (!m.try_lock()) return false;
    ++locks;
    return true;
  }
  void unlock() { m.unlock(); }
  std::mutex m;
};

template <class Mutex>
using semaphore_on = rein::basic_semaphore<net::any_io_executor, manual_clock, Mutex>;
template <class Mutex>
using aimd_on = rein::basic_adaptive_limiter<rein::algo::aimd, net::any_io_executor, manual_clock, Mutex>;
template <class Mutex>
using bucket_on = rein::basic_token_bucket<net::any_io_executor, manual_clock, Mutex>;
template <class Mutex>
using window_on = rein::basic_sliding_window<net::any_io_executor, manual_clock, Mutex>;
template <class Mutex>
using fixed_on = rein::basic_fixed_window<net::any_io_executor, manual_clock, Mutex>;
template <class Mutex>
using gate_on = rein::basic_quota_gate<net::any_io_executor, manual_clock, Mutex>;
template <class Mutex>
using adaptive_rate_on = rein::basic_adaptive_rate_limiter<net::any_io_executor, manual_clock, Mutex>;

// How one coroutine acquire ended.
struct outcome_of {
  bool done = false;
  bool threw = false;
  bool granted = false;  // a permit (concurrency limiters) or the units (rate limiters)
};

// co_await limiter.acquire_for(n, timeout) in a coroutine of its own; a permit is kept in `held`.
template <class Limiter>
void spawn_acquire_for(net::io_context& io, Limiter& l, std::size_t n, duration timeout, outcome_of& out,
                       std::optional<permit>* held = nullptr) {
  net::co_spawn(
      io,
      [&l, n, timeout, &out, held]() -> net::awaitable<void> {
        try {
          if constexpr (std::is_same_v<decltype(l.acquire(1)), net::awaitable<permit>>) {
            permit p = co_await l.acquire_for(n, timeout);
            out.granted = static_cast<bool>(p);
            if (held != nullptr) *held = std::move(p);
          } else {
            (void)held;  // nothing to hold
            co_await l.acquire_for(n, timeout);
            out.granted = true;
          }
        } catch (const rein::system_error&) {
          out.threw = true;
        }
        out.done = true;
      },
      [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
}

// Moves the manual clock off its epoch, so that `now + duration::max()` would overflow.
void start_late() {
  manual_clock::reset();
  manual_clock::advance(10s);
}

// The first coroutine acquire finds nobody waiting: it tries (one lock, refused), then waits (one lock).
// The second finds a waiter: it skips the try, and locks once, to wait.
template <class Limiter>
void check_skips_the_try_behind_waiters(net::io_context& io, Limiter& l) {
  outcome_of first;
  outcome_of second;
  counting_mutex::locks = 0;
  spawn_acquire_for(io, l, 1, 1h, first);
  poll(io);
  CHECK_FALSE(first.done);
  CHECK(counting_mutex::locks == 2);
  counting_mutex::locks = 0;
  spawn_acquire_for(io, l, 1, 1h, second);
  poll(io);
  CHECK_FALSE(second.done);
  CHECK(counting_mutex::locks == 1);
}

}  // namespace

// ---- acquire_for(n, duration::max()) from a coroutine: no deadline ---------------------------------------

TEST_CASE("doors: concurrency limiters' acquire_for(n, duration::max()) waits until released", "[doors][deadline]") {
  start_late();
  net::io_context io;
  semaphore_on<std::mutex> sem(io, 2);
  aimd_on<std::mutex> limiter(io, rein::algo::aimd_options{.initial_limit = 2, .max_limit = 4});
  auto check = [&io](auto& l) {
    permit held = l.try_acquire(2);
    REQUIRE(held);
    outcome_of out;
    std::optional<permit> got;
    spawn_acquire_for(io, l, 2, duration::max(), out, &got);
    poll(io);  // an overflowed deadline would be in the past: it would have thrown timed_out by now
    rein_test::advance_and_poll(io, 24h);
    CHECK_FALSE(out.done);
    held.release();
    poll(io);
    CHECK(out.done);
    CHECK_FALSE(out.threw);
    REQUIRE(got);
    CHECK(got->count() == 2);
    CHECK(l.snapshot().timed_out_total == 0);
  };
  check(sem);
  check(limiter);
}

TEST_CASE("doors: rate limiters' acquire_for(n, duration::max()) waits until refilled", "[doors][deadline]") {
  start_late();
  net::io_context io;
  // 10 per second, empty: 2 units are there after exactly 200 ms.
  bucket_on<std::mutex> bucket(io, {.rate = 10, .capacity = 2, .initial_tokens = 0});
  adaptive_rate_on<std::mutex> adaptive(io, {.initial_rate = 10, .burst = 2, .initial_tokens = 0});
  // 2 per 200 ms, both taken now: 2 units fit again after exactly 200 ms.
  window_on<std::mutex> window(io, {.limit = 2, .window = 200ms});
  REQUIRE(window.try_acquire(2));
  // Windows of 200 ms from the epoch (10 s is a boundary): the next window starts after exactly 200 ms.
  fixed_on<std::mutex> fixed(io, {.limit = 2, .window = 200ms});
  REQUIRE(fixed.try_acquire(2));
  // Paused for 200 ms, no jitter: through after exactly 200 ms.
  gate_on<std::mutex> gate(io, {.jitter = 0});
  gate.pause_for(200ms);

  outcome_of on_bucket, on_adaptive, on_window, on_fixed, on_gate;
  spawn_acquire_for(io, bucket, 2, duration::max(), on_bucket);
  spawn_acquire_for(io, adaptive, 2, duration::max(), on_adaptive);
  spawn_acquire_for(io, window, 2, duration::max(), on_window);
  spawn_acquire_for(io, fixed, 2, duration::max(), on_fixed);
  spawn_acquire_for(io, gate, 2, duration::max(), on_gate);
  poll(io);  // an overflowed deadline would be in the past: each would have thrown timed_out by now
  rein_test::advance_and_poll(io, 199ms);
  for (const outcome_of* o : {&on_bucket, &on_adaptive, &on_window, &on_fixed, &on_gate}) CHECK_FALSE(o->done);
  rein_test::advance_and_poll(io, 1ms);
  for (const outcome_of* o : {&on_bucket, &on_adaptive, &on_window, &on_fixed, &on_gate}) {
    CHECK(o->done);
    CHECK(o->granted);
    CHECK_FALSE(o->threw);
  }
  CHECK(bucket.snapshot().timed_out_total == 0);
  CHECK(gate.snapshot().timed_out_total == 0);
}

// ---- The coroutine door skips the synchronous try behind waiters ------------------------------------------

TEST_CASE("doors: behind a waiter, acquire skips the try and its lock, on every primitive", "[doors][fast_path]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  SECTION("semaphore") {
    semaphore_on<counting_mutex> sem(io, 1);
    permit held = sem.try_acquire();
    check_skips_the_try_behind_waiters(io, sem);
  }
  SECTION("adaptive limiter") {
    aimd_on<counting_mutex> limiter(io, rein::algo::aimd_options{.initial_limit = 1, .max_limit = 4});
    permit held = limiter.try_acquire();
    check_skips_the_try_behind_waiters(io, limiter);
  }
  SECTION("token bucket") {
    bucket_on<counting_mutex> bucket(io, {.rate = 1, .capacity = 1, .initial_tokens = 0});
    check_skips_the_try_behind_waiters(io, bucket);
  }
  SECTION("sliding window") {
    window_on<counting_mutex> window(io, {.limit = 1, .window = 1s});
    REQUIRE(window.try_acquire());
    check_skips_the_try_behind_waiters(io, window);
  }
  SECTION("fixed window") {
    fixed_on<counting_mutex> fixed(io, {.limit = 1, .window = 1s});
    REQUIRE(fixed.try_acquire());
    check_skips_the_try_behind_waiters(io, fixed);
  }
  SECTION("adaptive rate limiter") {
    adaptive_rate_on<counting_mutex> rate(io, {.initial_rate = 1, .burst = 1, .initial_tokens = 0});
    check_skips_the_try_behind_waiters(io, rate);
  }
  SECTION("quota gate") {
    gate_on<counting_mutex> gate(io, {.jitter = 0});
    gate.pause_for(1s);
    check_skips_the_try_behind_waiters(io, gate);
  }
}
