// What a limiter costs in memory: its own size, the heap it holds idle and after waits, and a keyed
// registry of many keys; and what the wait histogram does when memory runs out.
#include "support/async.hpp"
#include "support/catch.hpp"
#include "support/counting_new.hpp"

#include <rein/algo/log_histogram.hpp>
#include <rein/keyed.hpp>
#include <rein/semaphore.hpp>
#include <rein/throttle.hpp>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>

using namespace std::chrono_literals;
namespace net = rein::net;
using rein::algo::log_histogram;
using rein_test::manual_clock;
using rein_test::poll;
using rein_test::heap::live_bytes;
using timed_semaphore = rein::basic_semaphore<net::any_io_executor, manual_clock>;

namespace {

// The i-th of n waits spread evenly on a log scale over 1 us .. 1 s (1 us * 10^(6 i / (n - 1))).
std::chrono::nanoseconds spread_wait(int i, int n) {
  const double us = std::pow(10.0, 6.0 * static_cast<double>(i) / static_cast<double>(n - 1));
  return std::chrono::nanoseconds(static_cast<std::int64_t>(std::llround(us * 1000.0)));
}

// Makes `n` grants after waiting on a one-permit semaphore, the i-th after spread_wait(i, n).
void wait_spread(net::io_context& io, timed_semaphore& sem, int n) {
  for (int i = 0; i < n; ++i) {
    rein::permit held = sem.try_acquire();
    REQUIRE(held);
    rein::permit got;
    sem.async_acquire(1, [&](rein::error_code, rein::permit p) { got = std::move(p); });
    poll(io);
    manual_clock::advance(spread_wait(i, n));
    held.release();
    poll(io);
    REQUIRE(got);
  }
}

}  // namespace

// Heap bytes are read before any assertion (Catch allocates as it reports) and are exact where nothing else
// allocates: the semaphore's shared state, whose size depends on the standard library, is only bounded.
TEST_CASE("memory: an idle semaphore holds no heap memory for its histogram", "[memory]") {
  net::io_context io;
  const long before = live_bytes.load();
  auto sem = std::make_unique<rein::semaphore>(io, 4);
  const long idle = live_bytes.load() - before;
  const std::size_t idle_histogram = sem->snapshot().wait.allocated_bytes();
  rein::permit p = sem->try_acquire();
  const long holding = live_bytes.load() - before;
  p.release();
  const std::size_t one_grant_histogram = sem->snapshot().wait.allocated_bytes();
  const long one_grant = live_bytes.load() - before;
  sem.reset();
  const long destroyed = live_bytes.load() - before;

  CHECK(sizeof(rein::semaphore) <= 2 * sizeof(void*));  // a handle to the shared state
  CHECK(idle_histogram == 0);
  CHECK(idle < 1536);   // the state with its histogram's 104 bytes; 9,544 bytes with the 8,712-byte one
  CHECK(holding == idle);  // the fast path allocates nothing
  CHECK(one_grant_histogram == 256);  // the zero wait, added at the snapshot: block 0
  CHECK(one_grant == idle + 256);
  CHECK(destroyed == 0);
  std::printf("memory: sizeof(rein::semaphore) = %zu, heap idle %ld bytes, after one grant %ld bytes\n",
              sizeof(rein::semaphore), idle, one_grant);
}

TEST_CASE("memory: 1000 waits from 1 us to 1 s hold one block per octave they span", "[memory]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  timed_semaphore warm(io, 1);
  wait_spread(io, warm, 2);  // Asio's per-thread cache of handler memory takes its blocks here
  auto sem = std::make_unique<timed_semaphore>(io, 1);
  const long idle = live_bytes.load();
  wait_spread(io, *sem, 1000);
  const long waited = live_bytes.load() - idle;
  const auto s = sem->snapshot();
  const long with_snapshot = live_bytes.load() - idle;

  CHECK(s.wait.count() == 2000);  // 1000 immediate grants (zeros) and 1000 measured waits
  CHECK(s.wait.lost() == 0);
  CHECK(s.wait.min() == 0ns);
  CHECK(s.wait.max() == 1s);
  // 1 us to 1 s: block 1 ([512, 1024 ns)) and the octaves 2^10 .. 2^29 ns; the zeros (block 0) are added
  // at the snapshot.
  CHECK(waited == 21 * 256);
  CHECK(s.wait.allocated_bytes() == 22 * 256);
  CHECK(with_snapshot == 2 * 22 * 256);  // the limiter's and the snapshot's copy
  std::printf("memory: after 1000 waits over 1 us..1 s: %ld heap bytes more than idle\n", with_snapshot / 2);
}

TEST_CASE("memory: a keyed registry of 10k semaphores", "[memory]") {
  net::io_context io;
  const long before = live_bytes.load();
  auto per_key = std::make_unique<rein::keyed<rein::semaphore>>(io, std::size_t{4}, rein::line_options{},
                                                                rein::keyed_options{.idle_ttl = std::chrono::hours(1)});
  for (int i = 0; i < 10'000; ++i) {
    auto limiter = per_key->get("k" + std::to_string(i));  // keys of at most 6 characters: no string heap
    rein::permit p = limiter->try_acquire();
    if (!p) throw std::logic_error("no permit");
  }
  const std::size_t keys = per_key->snapshot().keys;
  const long held = live_bytes.load() - before;
  per_key.reset();
  const long destroyed = live_bytes.load() - before;

  CHECK(keys == 10'000);
  CHECK(held / 10'000 < 1536);  // 96 MB in all (9,648 bytes a key) with the 8,712-byte histogram inline
  CHECK(destroyed == 0);
  std::printf("memory: keyed<semaphore> with 10k keys: %ld heap bytes (%ld per key)\n", held, held / 10'000);
}

TEST_CASE("memory: a wait whose block cannot be allocated is counted but not bucketed", "[memory][log_histogram]") {
  log_histogram h;
  h.record(1us);
  rein_test::heap::failing.store(true);
  h.record(1ms, 2);  // a new octave: no memory
  h.record(1us);     // its block exists: bucketed
  h.record(3h);      // the overflow bucket needs no block
  log_histogram copy = h;
  log_histogram merged;
  merged += h;
  rein_test::heap::failing.store(false);
  CHECK(h.count() == 5);
  CHECK(h.lost() == 2);
  CHECK(h.sum() == 2us + 2ms + 3h);
  CHECK(h.max() == 3h);
  CHECK(h.bucket(log_histogram::index_of(1000)) == 2);
  CHECK(h.bucket(log_histogram::index_of(1'000'000)) == 0);
  CHECK(h.p50() == 1us);  // rank 2 of the 3 bucketed values
  CHECK(h.count_below(1s) == 2);
  CHECK(h.count_below(4h) == 5);
  CHECK(copy.count() == 5);  // a copy without memory keeps the summaries; its bucketed values are lost
  CHECK(copy.lost() == 4);
  CHECK(copy.bucket(log_histogram::bucket_count - 1) == 1);
  CHECK(copy.allocated_bytes() == 0);
  CHECK(merged.count() == 5);
  CHECK(merged.lost() == 4);
  CHECK(merged.max() == 3h);
  h.record(1ms);  // memory again: the block is made
  CHECK(h.bucket(log_histogram::index_of(1'000'000)) == 1);
  CHECK(h.lost() == 2);
}

TEST_CASE("memory: a semaphore out of memory still grants and counts every wait", "[memory]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  timed_semaphore sem(io, 1);
  rein::permit held = sem.try_acquire();
  rein::permit got;
  sem.async_acquire(1, [&](rein::error_code, rein::permit p) { got = std::move(p); });
  poll(io);
  manual_clock::advance(3ms);
  // Only the histogram's block (256 bytes) fails: the completion's post, smaller, must still find memory
  // (whether Asio's per-thread cache has a block for it does not matter then).
  rein_test::heap::failing_from.store(256);
  rein_test::heap::failing.store(true);
  held.release();  // the grant records 3 ms under the lock: no block for it
  rein_test::heap::failing.store(false);
  rein_test::heap::failing_from.store(0);
  poll(io);
  REQUIRE(got);
  const auto s = sem.snapshot();
  CHECK(s.acquired_total == 2);
  CHECK(s.wait.count() == 2);
  CHECK(s.wait.lost() == 1);
  CHECK(s.wait.max() == 3ms);
  CHECK(s.wait.bucket(0) == 1);
}

TEST_CASE("a throttle's async_acquire out of memory completes its handler once, with not_enough_memory",
          "[memory][throttle]") {
  net::io_context io;
  rein::keyed<timed_semaphore> per_key{io.get_executor(), std::size_t{1}};
  rein::throttle<rein::keyed<timed_semaphore>> throttle{per_key};
  int calls = 0;
  rein::error_code got;
  throttle.async_acquire("new-key", [&](rein::error_code ec, auto) {
    ++calls;
    got = ec;
  });
  rein_test::heap::failing_from.store(64);  // the new key's entry and limiter cannot be made
  rein_test::heap::failing.store(true);
  poll(io);
  rein_test::heap::failing.store(false);
  rein_test::heap::failing_from.store(0);
  poll(io);
  CHECK(calls == 1);
  CHECK(got == std::errc::not_enough_memory);
  CHECK(throttle.snapshot().failed_total == 1);
  CHECK(per_key.size() == 0);
}
