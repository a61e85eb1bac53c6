// The wait line's lifecycle at its edges: a core freed by its last holder after shutdown (a counted mutex
// shows it), late revocations that must not refund, drains on every kind of line, shutdown racing releases.
#include "support/async.hpp"
#include "support/catch.hpp"

#include <rein/error.hpp>
#include <rein/permit.hpp>
#include <rein/semaphore.hpp>
#include <rein/sliding_window.hpp>
#include <rein/token_bucket.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
using rein::errc;
using rein::error_code;
using rein::permit;
using rein_test::manual_clock;
using rein_test::poll;
using duration = manual_clock::duration;

const error_code aborted = net::error::operation_aborted;

// A std::mutex that counts live instances: the core holds exactly one, so `live` tells whether a core
// still exists (a leak), and `destroyed_locked` whether one was destroyed while its lock was held.
struct counted_mutex {
  static inline std::atomic<int> live{0};
  static inline std::atomic<int> destroyed_locked{0};
  std::mutex m;
  std::atomic<bool> held{false};
  counted_mutex() { ++live; }
  ~counted_mutex() {
    if (held.load()) ++destroyed_locked;
    --live;
  }
  counted_mutex(const counted_mutex&) = delete;
  counted_mutex& operator=(const counted_mutex&) = delete;
  void lock() {
    m.lock();
    held.store(true);
  }
  bool try_lock() {
    if (!m.try_lock()) return false;
    held.store(true);
    return true;
  }
  void unlock() {
    held.store(false);
    m.unlock();
  }
};

using counted_semaphore = rein::basic_semaphore<net::any_io_executor, manual_clock, counted_mutex>;
using semaphore = rein::basic_semaphore<net::any_io_executor, manual_clock>;

}  // namespace

TEST_CASE("review: a core whose last holder is a grant revoked after shutdown is freed", "[review][lifecycle]") {
  const int before = counted_mutex::live.load();
  {
    net::io_context io;
    net::cancellation_signal signal;
    auto [handler, done] = rein_test::checked_acquire();
    {
      counted_semaphore sem(io, 1);
      REQUIRE(counted_mutex::live.load() == before + 1);
      permit first = sem.try_acquire();
      REQUIRE(first);
      sem.async_acquire(1, net::bind_cancellation_slot(signal.slot(), std::move(handler)));
      poll(io);
      first.release();  // granted to the waiter; its runner is queued, not run
    }  // shutdown with one holder out (the undelivered grant): the core keeps itself alive
    signal.emit(net::cancellation_type::terminal);  // revokes the grant: the last holder is gone
    poll(io);
    REQUIRE(done->called());
    CHECK(done->ec() == aborted);
    CHECK_FALSE(done->get<1>());
  }
  CHECK(counted_mutex::destroyed_locked.load() == 0);
  CHECK(counted_mutex::live.load() == before);  // fails: self_ is never dropped (limiter_core::revoke_locked)
}

TEST_CASE("review: the last permit given back after shutdown frees the core outside its lock",
          "[review][lifecycle]") {
  const int before = counted_mutex::live.load();
  {
    net::io_context io;
    permit p;
    permit q;
    {
      counted_semaphore sem(io, 2);
      p = sem.try_acquire(2);
      q = p.split(1);
    }
    CHECK(counted_mutex::live.load() == before + 1);
    p.release();
    CHECK(counted_mutex::live.load() == before + 1);
    q.release();
    CHECK(counted_mutex::live.load() == before);
  }
  CHECK(counted_mutex::destroyed_locked.load() == 0);
}

TEST_CASE("review: a grant abandoned (context destroyed) after shutdown frees the core", "[review][lifecycle]") {
  const int before = counted_mutex::live.load();
  {
    auto io = std::make_unique<net::io_context>();
    auto [handler, done] = rein_test::checked_acquire();
    done->may_be_destroyed_uncalled = true;
    {
      counted_semaphore sem(*io, 1);
      permit first = sem.try_acquire();
      sem.async_acquire(1, std::move(handler));
      poll(*io);
      first.release();
    }
    io.reset();  // the runner is destroyed unrun: abandon() gives the holder back
  }
  CHECK(counted_mutex::destroyed_locked.load() == 0);
  CHECK(counted_mutex::live.load() == before);
}

TEST_CASE("review: a cancelled drain is not counted as a cancelled acquire", "[review][drain]") {
  net::io_context io;
  semaphore sem(io, 1);
  permit p = sem.try_acquire();
  net::cancellation_signal signal;
  auto [handler, done] = rein_test::make_checked<error_code>();
  sem.async_drain(net::bind_cancellation_slot(signal.slot(), std::move(handler)));
  poll(io);
  CHECK_FALSE(done->called());
  signal.emit(net::cancellation_type::terminal);
  poll(io);
  REQUIRE(done->called());
  CHECK(done->ec() == aborted);
  CHECK(sem.snapshot().cancelled_total == 0);  // fails: cancel_wait counts drains (timeouts are not counted)
}

TEST_CASE("review: a parked drain keeps run() going; none parked lets it stop", "[review][drain]") {
  net::io_context io;
  semaphore sem(io, 1);
  permit p = sem.try_acquire();
  auto [handler, done] = rein_test::make_checked<error_code>();
  sem.async_drain_for(5s, std::move(handler));
  poll(io);
  CHECK_FALSE(done->called());
  CHECK_FALSE(io.stopped());  // outstanding work: run() would not return
  p.release();
  poll(io);
  REQUIRE(done->called());
  CHECK_FALSE(done->ec());
  CHECK(io.stopped());  // work guard and timer both gone
}

TEST_CASE("review: a drain deadline and an acquire deadline share the timer", "[review][drain]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  semaphore sem(io, 1);
  permit p = sem.try_acquire();
  auto [dh, drained] = rein_test::make_checked<error_code>();
  auto [ah, acquired] = rein_test::checked_acquire();
  sem.async_drain_for(3s, std::move(dh));
  sem.async_acquire_for(1, 2s, std::move(ah));
  poll(io);
  rein_test::advance_and_poll(io, 2s);
  REQUIRE(acquired->called());
  CHECK(acquired->ec() == errc::timed_out);
  CHECK_FALSE(drained->called());
  rein_test::advance_and_poll(io, 1s);
  REQUIRE(drained->called());
  CHECK(drained->ec() == errc::timed_out);
  CHECK(sem.snapshot().timed_out_total == 1);  // the drain's timeout is not an acquire's
  CHECK(io.stopped());
}

TEST_CASE("review: opening a gate with add_permits refuses waiters above the new total, as set_permits does",
          "[review][shrink]") {
  net::io_context io;
  SECTION("set_permits") {
    semaphore sem(io, 0);
    auto big = rein_test::checked_acquire();
    auto small = rein_test::checked_acquire();
    sem.async_acquire(5, std::move(big.first));
    sem.async_acquire(1, std::move(small.first));
    poll(io);
    sem.set_permits(2);
    poll(io);
    REQUIRE(big.second->called());
    CHECK(big.second->ec() == errc::exceeds_capacity);
    REQUIRE(small.second->called());
    CHECK_FALSE(small.second->ec());
  }
  SECTION("add_permits") {
    semaphore sem(io, 0);
    auto big = rein_test::checked_acquire();
    auto small = rein_test::checked_acquire();
    sem.async_acquire(5, std::move(big.first));
    sem.async_acquire(1, std::move(small.first));
    poll(io);
    sem.add_permits(2);
    poll(io);
    // fails: the waiter for 5 stays at the head and blocks the one for 1, though a new acquire(5) now fails
    REQUIRE(big.second->called());
    CHECK(big.second->ec() == errc::exceeds_capacity);
    REQUIRE(small.second->called());
    CHECK_FALSE(small.second->ec());
    sem.close();
    poll(io);
  }
}

TEST_CASE("review: forget with owed permits; set_permits back; exact counts", "[review][shrink]") {
  net::io_context io;
  semaphore sem(io, 3);
  permit a = sem.try_acquire(2);
  auto w = rein_test::checked_acquire();
  sem.async_acquire(2, std::move(w.first));
  poll(io);
  sem.forget(3);  // total 0: 1 free removed, 2 owed; the waiter stays (a gate)
  CHECK(sem.permits() == 0);
  CHECK(sem.available() == 0);
  CHECK(sem.snapshot().in_flight == 2);
  a.release();  // pays the debt
  poll(io);
  CHECK_FALSE(w.second->called());
  CHECK(sem.snapshot().in_flight == 0);
  sem.set_permits(2);
  poll(io);
  REQUIRE(w.second->called());
  CHECK_FALSE(w.second->ec());
  CHECK(sem.snapshot().in_flight == 2);
  CHECK(sem.available() == 0);
}

TEST_CASE("review: shutdown racing releases on other threads frees the core exactly once", "[review][race]") {
  const int before = counted_mutex::live.load();
  for (int round = 0; round < 200; ++round) {
    net::io_context io;
    std::vector<permit> permits;
    auto sem = std::make_unique<counted_semaphore>(io, 8);
    for (int i = 0; i < 8; ++i) permits.push_back(sem->try_acquire());
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t)
      threads.emplace_back([&, t] {
        while (!go.load()) {
        }
        for (int i = t; i < 8; i += 2) permits[static_cast<std::size_t>(i)].release();
      });
    go.store(true);
    sem.reset();
    for (auto& th : threads) th.join();
  }
  CHECK(counted_mutex::destroyed_locked.load() == 0);
  CHECK(counted_mutex::live.load() == before);
}

namespace {
using window = rein::basic_sliding_window<net::any_io_executor, manual_clock>;
using bucket = rein::basic_token_bucket<net::any_io_executor, manual_clock>;
}  // namespace

#include <rein/quota_gate.hpp>

TEST_CASE("review: a window grant revoked after its start left the window refunds nothing",
          "[review][revoke]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  net::io_context elsewhere;  // the handler's executor, not run: its runner waits there
  window w(io, {.limit = 2, .window = 1s});
  REQUIRE(w.try_acquire(2));  // two starts at 0
  net::cancellation_signal signal;
  auto [handler, done] = rein_test::make_checked<error_code>();
  w.async_acquire(1, net::bind_cancellation_slot(signal.slot(), net::bind_executor(elsewhere, std::move(handler))));
  poll(io);
  rein_test::advance_and_poll(io, 1s);  // granted at 1.0 (the starts of 0 left); its runner is queued elsewhere
  CHECK_FALSE(done->called());
  manual_clock::advance(500ms);
  REQUIRE(w.try_acquire());  // a real start at 1.5 (the window holds 1.0 and 1.5)
  manual_clock::advance(700ms);  // 2.2: the revoked grant's start of 1.0 is out of the window
  signal.emit(net::cancellation_type::terminal);
  poll(elsewhere);
  REQUIRE(done->called());
  CHECK(done->ec() == aborted);
  // The window (1.2, 2.2] holds one real start (1.5): one more may start, not two.
  CHECK(w.try_acquire());
  CHECK_FALSE(w.try_acquire());  // failed on 93de797: the refund forgot the real start of 1.5
}

TEST_CASE("review: a gate release cancelled before its handler runs is taken back", "[review][revoke]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  net::io_context elsewhere;
  rein::basic_quota_gate<net::any_io_executor, manual_clock> g(io, {.jitter = 0});
  g.pause_for(1s);
  net::cancellation_signal signal;
  auto [handler, done] = rein_test::make_checked<error_code>();
  g.async_acquire(1, net::bind_cancellation_slot(signal.slot(), net::bind_executor(elsewhere, std::move(handler))));
  poll(io);
  rein_test::advance_and_poll(io, 1s);
  CHECK_FALSE(done->called());
  signal.emit(net::cancellation_type::terminal);
  poll(elsewhere);
  REQUIRE(done->called());
  // 93de797's quota_gate.hpp said "if the release came first, the handler gets success"; it is taken back
  CHECK(done->ec() == aborted);
  CHECK(g.try_acquire());
}

TEST_CASE("review: a bucket grant revoked a while later refunds no more than never taking it would leave",
          "[review][revoke]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  net::io_context elsewhere;
  bucket b(io, {.rate = 1, .capacity = 2, .initial_tokens = 1});
  net::cancellation_signal signal;
  auto [handler, done] = rein_test::make_checked<error_code>();
  // granted at once at 0 (the bucket holds 1): 0 left; its runner waits elsewhere
  b.async_acquire(1, net::bind_cancellation_slot(signal.slot(), net::bind_executor(elsewhere, std::move(handler))));
  poll(io);
  manual_clock::advance(2s);  // 2 tokens (capped; had the grant not been taken, also 2: capped)
  REQUIRE(b.try_acquire(2));  // 0 left, in both histories
  signal.emit(net::cancellation_type::terminal);  // revoke at 2.0
  poll(elsewhere);
  REQUIRE(done->called());
  CHECK(done->ec() == aborted);
  // Without the revoked grant the bucket would hold 0 now: 2 tokens were taken at 2.0 from a full bucket.
  CHECK_FALSE(b.try_acquire());  // failed on 93de797: the refund added a token the bucket never lost
}

TEST_CASE("review: shutdown racing a chain of grants delivered on a running context", "[review][race]") {
  const int before = counted_mutex::live.load();
  std::atomic<int> granted{0};
  std::atomic<int> refused{0};
  for (int round = 0; round < 100; ++round) {
    net::io_context io;
    auto guard = net::make_work_guard(io);
    auto sem = std::make_unique<counted_semaphore>(io, 2);
    permit a = sem->try_acquire();
    permit b = sem->try_acquire();
    for (int i = 0; i < 16; ++i)
      sem->async_acquire(1, [&](error_code ec, permit p) {
        if (ec) ++refused;
        else ++granted;
        p.release();  // hands the slot to the next waiter, from the context's thread
      });
    std::thread runner([&] { io.run(); });
    std::thread releaser([&] {
      a.release();
      b.release();
    });
    sem.reset();  // races the releases and the deliveries
    releaser.join();
    guard.reset();
    runner.join();
  }
  CHECK(granted.load() + refused.load() == 1600);
  CHECK(counted_mutex::destroyed_locked.load() == 0);
  CHECK(counted_mutex::live.load() == before);
}

TEST_CASE("review: single-thread semaphore: close, then drain, then the last release", "[review][drain]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::basic_semaphore<net::any_io_executor, manual_clock, rein::null_mutex> sem(io, 2);
  permit a = sem.try_acquire();
  permit b = sem.try_acquire();
  auto waiter = rein_test::checked_acquire();
  sem.async_acquire(1, std::move(waiter.first));
  sem.close();
  net::cancellation_signal signal;
  auto [h1, cancelled] = rein_test::make_checked<error_code>();
  auto [h2, drained] = rein_test::make_checked<error_code>();
  sem.async_drain_for(10s, net::bind_cancellation_slot(signal.slot(), std::move(h1)));
  sem.async_drain(std::move(h2));
  poll(io);
  REQUIRE(waiter.second->called());
  CHECK(waiter.second->ec() == errc::closed);
  CHECK_FALSE(cancelled->called());
  signal.emit(net::cancellation_type::partial);  // out of the heap: its deadline must not fire later
  poll(io);
  REQUIRE(cancelled->called());
  CHECK(cancelled->ec() == aborted);
  a.release();
  poll(io);
  CHECK_FALSE(drained->called());
  rein_test::advance_and_poll(io, 20s);
  CHECK_FALSE(drained->called());
  CHECK_FALSE(io.stopped());
  b.release();
  poll(io);
  REQUIRE(drained->called());
  CHECK_FALSE(drained->ec());
  CHECK(io.stopped());
}

TEST_CASE("review: a drain is aborted when its limiter is destroyed; permits survive", "[review][drain]") {
  const int before = counted_mutex::live.load();
  net::io_context io;
  permit p;
  auto [h, drained] = rein_test::make_checked<error_code>();
  {
    counted_semaphore sem(io, 1);
    p = sem.try_acquire();
    sem.async_drain(std::move(h));
    poll(io);
  }
  poll(io);
  REQUIRE(drained->called());
  CHECK(drained->ec() == aborted);
  CHECK(io.stopped());
  p.release();
  CHECK(counted_mutex::live.load() == before);
}
