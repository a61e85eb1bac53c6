// rein::semaphore: its acceptance cases 1-7, every completion token, every cancellation type at every
// place in the line, deadlines on the manual clock, destruction, close, backpressure, statistics, and the
// properties of the fast path (no scheduler trip, no stack growth). Case 8 is in semaphore_stress.cpp.
#include "support/async.hpp"
#include "support/catch.hpp"
#include "support/model_tier.hpp"

#include <rein/error.hpp>
#include <rein/null_mutex.hpp>
#include <rein/permit.hpp>
#include <rein/semaphore.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
using rein::error_code;
using rein::permit;
using rein_test::acquire_record;
using rein_test::checked_acquire;
using rein_test::manual_clock;
using rein_test::poll;

using timed_semaphore = rein::basic_semaphore<net::any_io_executor, manual_clock, std::mutex>;
using record_ptr = std::shared_ptr<acquire_record>;

const error_code aborted = net::error::operation_aborted;

template <class Sem>
record_ptr start(Sem& sem, std::size_t n) {
  auto [handler, done] = checked_acquire();
  sem.async_acquire(n, std::move(handler));
  return done;
}

template <class Sem>
record_ptr start(Sem& sem, std::size_t n, net::cancellation_signal& signal) {
  auto [handler, done] = checked_acquire();
  sem.async_acquire(n, net::bind_cancellation_slot(signal.slot(), std::move(handler)));
  return done;
}

// A waiter that also appends `tag` to `log` when it completes, to check grant order.
template <class Sem>
record_ptr start_logged(Sem& sem, std::size_t n, std::string& log, char tag) {
  auto [handler, done] = checked_acquire();
  sem.async_acquire(n, [h = std::move(handler), &log, tag](error_code ec, permit p) mutable {
    log.push_back(tag);
    h(ec, std::move(p));
  });
  return done;
}

// A waiter with a deadline on the manual clock that records the manual time at which it completed.
struct timed_waiter {
  record_ptr done;
  std::shared_ptr<manual_clock::duration> at = std::make_shared<manual_clock::duration>(-1);
};

timed_waiter start_for(timed_semaphore& sem, std::size_t n, manual_clock::duration timeout) {
  auto [handler, done] = checked_acquire();
  timed_waiter w{done};
  sem.async_acquire_for(n, timeout, [h = std::move(handler), at = w.at](error_code ec, permit p) mutable {
    *at = rein_test::since_epoch();
    h(ec, std::move(p));
  });
  return w;
}

bool granted(const record_ptr& r, std::size_t n) {
  return r->called() && !r->ec() && r->get<1>() && r->get<1>().count() == n;
}

bool failed_with(const record_ptr& r, const error_code& ec) { return r->called() && r->ec() == ec && !r->get<1>(); }

constexpr std::array<net::cancellation_type, 3> cancellation_types{
    net::cancellation_type::terminal, net::cancellation_type::partial, net::cancellation_type::total};

const char* type_name(net::cancellation_type t) {
  if (t == net::cancellation_type::terminal) return "terminal";
  if (t == net::cancellation_type::partial) return "partial";
  return "total";
}

}  // namespace

// ---- acceptance cases 1-7, for the thread-safe and the single-threaded semaphore -------------

TEMPLATE_TEST_CASE("case 1: a big request at the head is not overtaken by a smaller one behind it", "[semaphore]",
                   rein::semaphore, rein::single_thread_semaphore) {
  net::io_context io;
  TestType sem(io, 5);
  permit one = sem.try_acquire(1);
  REQUIRE(one);
  CHECK(sem.available() == 4);
  CHECK_FALSE(sem.try_acquire(5));
  CHECK(sem.available() == 4);

  record_ptr w2 = start(sem, 5);
  record_ptr w3 = start(sem, 3);
  poll(io);
  CHECK_FALSE(w2->called());
  CHECK_FALSE(w3->called());  // 4 are free, yet W3 waits behind W2
  CHECK(sem.available() == 4);

  one.release();  // release of 1: completes W2
  poll(io);
  CHECK(granted(w2, 5));
  CHECK_FALSE(w3->called());
  CHECK(sem.available() == 0);

  permit& p2 = w2->get<1>();
  p2.split(1).release();  // release of 1: wakes nobody
  poll(io);
  CHECK_FALSE(w3->called());
  CHECK(sem.available() == 1);

  p2.split(2).release();  // release of 2: wakes W3
  poll(io);
  CHECK(granted(w3, 3));
  CHECK(sem.available() == 0);
  CHECK(p2.count() == 2);
  CHECK(sem.snapshot().in_flight == 5);
}

TEMPLATE_TEST_CASE("case 2: a holder that releases and asks again queues behind the waiters", "[semaphore]",
                   rein::semaphore, rein::single_thread_semaphore) {
  net::io_context io;
  TestType sem(io, 1);
  std::string order;
  permit a = sem.try_acquire();
  REQUIRE(a);
  record_ptr b = start_logged(sem, 1, order, 'B');
  record_ptr c = start_logged(sem, 1, order, 'C');
  poll(io);
  a.release();
  record_ptr a2 = start_logged(sem, 1, order, 'A');
  poll(io);
  CHECK(order == "B");
  b->get<1>().release();
  poll(io);
  CHECK(order == "BC");
  c->get<1>().release();
  poll(io);
  CHECK(order == "BCA");
  CHECK(granted(a2, 1));
  CHECK(sem.available() == 0);
}

TEMPLATE_TEST_CASE("case 3: a waiter cancelled after its grant but before it resumes passes the permit on",
                   "[semaphore]", rein::semaphore, rein::single_thread_semaphore) {
  for (auto type : cancellation_types) {
    DYNAMIC_SECTION(type_name(type)) {
      net::io_context io;
      TestType sem(io, 0);
      net::cancellation_signal s1;
      record_ptr w1 = start(sem, 1, s1);
      record_ptr w2 = start(sem, 1);
      poll(io);
      sem.add_permits(1);  // the one release: granted to W1, whose handler has not run yet
      s1.emit(type);
      poll(io);
      CHECK(failed_with(w1, aborted));
      CHECK(granted(w2, 1));
      CHECK(sem.available() == 0);
      const auto s = sem.snapshot();
      CHECK(s.acquired_total == 1);
      CHECK(s.cancelled_total == 1);
      CHECK(s.waiting == 0);
    }
  }
}

TEMPLATE_TEST_CASE("case 4: two releases in the same tick resume both waiters", "[semaphore]", rein::semaphore,
                   rein::single_thread_semaphore) {
  net::io_context io;
  TestType sem(io, 2);
  permit a = sem.try_acquire();
  permit b = sem.try_acquire();
  record_ptr c = start(sem, 1);
  record_ptr d = start(sem, 1);
  poll(io);
  a.release();
  b.release();
  poll(io);
  CHECK(granted(c, 1));
  CHECK(granted(d, 1));
  CHECK(sem.available() == 0);
}

TEMPLATE_TEST_CASE("case 5: cancelling a big head waiter lets the small one behind it through at once",
                   "[semaphore]", rein::semaphore, rein::single_thread_semaphore) {
  net::io_context io;
  TestType sem(io, 3);
  permit held = sem.try_acquire(2);
  net::cancellation_signal s1;
  record_ptr w1 = start(sem, 3, s1);
  record_ptr w2 = start(sem, 1);
  poll(io);
  CHECK_FALSE(w2->called());
  s1.emit(net::cancellation_type::terminal);
  poll(io);
  CHECK(failed_with(w1, aborted));
  CHECK(granted(w2, 1));
  CHECK(sem.available() == 0);
}

TEMPLATE_TEST_CASE("case 6: a try_acquire between a release and the waiter's resumption is denied",
                   "[semaphore]", rein::semaphore, rein::single_thread_semaphore) {
  net::io_context io;
  TestType sem(io, 1);
  permit a = sem.try_acquire();
  record_ptr b = start(sem, 1);
  poll(io);
  a.release();
  CHECK_FALSE(sem.try_acquire());  // C
  CHECK(sem.snapshot().in_flight == 1);
  CHECK(sem.available() == 0);
  poll(io);
  CHECK(granted(b, 1));
  CHECK(sem.snapshot().in_flight == 1);
}

TEMPLATE_TEST_CASE("case 7: close fails the waiters and later acquires but keeps the holders",
                   "[semaphore]", rein::semaphore, rein::single_thread_semaphore) {
  net::io_context io;
  TestType sem(io, 2);
  permit a = sem.try_acquire();
  permit b = sem.try_acquire();
  record_ptr w1 = start(sem, 1);
  record_ptr w2 = start(sem, 1);
  poll(io);
  sem.close();
  poll(io);
  CHECK(failed_with(w1, rein::errc::closed));
  CHECK(failed_with(w2, rein::errc::closed));
  a.release();
  b.release();
  CHECK(sem.available() == 2);
  record_ptr late = start(sem, 1);
  poll(io);
  CHECK(failed_with(late, rein::errc::closed));
  CHECK_FALSE(sem.try_acquire());
  sem.close();  // idempotent
  CHECK(sem.available() == 2);
}

// ---- completion tokens ------------------------------------------------------------------------------

TEST_CASE("every completion token receives a permit that is free at once after the initiating call returns",
          "[semaphore][tokens]") {
  for (auto kind : rein_test::poll_tokens) {
    DYNAMIC_SECTION(rein_test::name(kind)) {
      net::io_context io;
      rein::semaphore sem(io, 2);
      auto [handler, done] = checked_acquire();
      rein_test::launch(kind, io, [&sem](auto token) { return sem.async_acquire(2, std::move(token)); },
                        std::move(handler));
      CHECK_FALSE(done->called());
      poll(io);
      REQUIRE(granted(done, 2));
      CHECK(sem.available() == 0);
      done->get<1>().release();
      CHECK(sem.available() == 2);
    }
  }
}

TEST_CASE("every completion token waits for a release", "[semaphore][tokens]") {
  for (auto kind : rein_test::poll_tokens) {
    DYNAMIC_SECTION(rein_test::name(kind)) {
      net::io_context io;
      rein::semaphore sem(io, 1);
      permit held = sem.try_acquire();
      auto [handler, done] = checked_acquire();
      rein_test::launch(kind, io, [&sem](auto token) { return sem.async_acquire(1, std::move(token)); },
                        std::move(handler));
      poll(io);
      CHECK_FALSE(done->called());
      CHECK(sem.snapshot().waiting == 1);
      held.release();
      CHECK_FALSE(done->called());
      poll(io);
      CHECK(granted(done, 1));
    }
  }
}

TEST_CASE("every completion token receives errors as error codes or exceptions", "[semaphore][tokens]") {
  for (auto kind : rein_test::poll_tokens) {
    DYNAMIC_SECTION(rein_test::name(kind)) {
      net::io_context io;
      rein::semaphore sem(io, 2);
      auto [h1, too_big] = checked_acquire();
      rein_test::launch(kind, io, [&sem](auto token) { return sem.async_acquire(3, std::move(token)); },
                        std::move(h1));
      poll(io);
      CHECK(failed_with(too_big, rein::errc::exceeds_capacity));

      permit held = sem.try_acquire(2);
      auto [h2, closed] = checked_acquire();
      rein_test::launch(kind, io, [&sem](auto token) { return sem.async_acquire(1, std::move(token)); },
                        std::move(h2));
      poll(io);
      sem.close();
      poll(io);
      CHECK(failed_with(closed, rein::errc::closed));
    }
  }
}

TEST_CASE("every completion token honours every cancellation type", "[semaphore][tokens][cancel]") {
  for (auto kind : rein_test::poll_tokens) {
    for (auto type : cancellation_types) {
      DYNAMIC_SECTION(rein_test::name(kind) << ' ' << type_name(type)) {
        net::io_context io;
        rein::semaphore sem(io, 1);
        permit held = sem.try_acquire();
        net::cancellation_signal signal;
        auto [handler, done] = checked_acquire();
        rein_test::launch(kind, io, [&sem](auto token) { return sem.async_acquire(1, std::move(token)); },
                          std::move(handler), signal.slot());
        poll(io);
        REQUIRE(sem.snapshot().waiting == 1);
        signal.emit(type);
        poll(io);
        CHECK(failed_with(done, aborted));
        CHECK(sem.snapshot().waiting == 0);
        held.release();
        CHECK(sem.available() == 1);
      }
    }
  }
}

TEST_CASE("use_future: the future gets the permit or the error as an exception", "[semaphore][tokens]") {
  net::io_context io;
  rein::semaphore sem(io, 1);
  auto work = net::make_work_guard(io);
  std::thread runner([&io] { io.run(); });
  permit held = sem.try_acquire();
  std::future<permit> granted_later = sem.async_acquire(1, net::use_future);
  held.release();  // from this thread, while the io_context runs on the other
  permit p = granted_later.get();
  CHECK(p.count() == 1);
  std::future<permit> too_big = sem.async_acquire(2, net::use_future);
  bool threw = false;
  try {
    too_big.get();
  } catch (const rein::system_error& e) {
    threw = true;
#if !REIN_TEST_TSAN  // see support/asio.hpp
    CHECK(e.code() == rein::errc::exceeds_capacity);
#endif
  }
  CHECK(threw);
  work.reset();
  runner.join();
  p.release();
  CHECK(sem.available() == 1);
}

#if REIN_ASIO_VERSION >= 102600
TEST_CASE("the default token is co_await-able: co_await sem.async_acquire()", "[semaphore][tokens]") {
  net::io_context io;
  rein::semaphore sem(io, 1);
  std::size_t got = 0;
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        permit p = co_await sem.async_acquire();
        got = p.count();
      },
      net::detached);
  poll(io);
  CHECK(got == 1);
  CHECK(sem.available() == 1);
}
#endif

// ---- cancellation ------------------------------------------------------------------------------------

TEST_CASE("a cancelled waiter at the front or middle or back completes with operation_aborted and the rest keep their order",
          "[semaphore][cancel]") {
  for (auto type : cancellation_types) {
    for (std::size_t victim = 0; victim < 3; ++victim) {
      DYNAMIC_SECTION(type_name(type) << " at position " << victim) {
        net::io_context io;
        rein::semaphore sem(io, 1);
        permit held = sem.try_acquire();
        std::string order;
        std::array<net::cancellation_signal, 3> signals;
        std::vector<record_ptr> waiters;
        for (std::size_t i = 0; i < 3; ++i) {
          auto [handler, done] = checked_acquire();
          sem.async_acquire(1, net::bind_cancellation_slot(
                                   signals[i].slot(), [h = std::move(handler), &order, i](error_code ec, permit p) mutable {
                                     order.push_back(static_cast<char>('0' + i));
                                     h(ec, std::move(p));
                                   }));
          waiters.push_back(done);
        }
        poll(io);
        signals[victim].emit(type);
        CHECK_FALSE(waiters[victim]->called());  // not from inside the emission
        poll(io);
        CHECK(failed_with(waiters[victim], aborted));
        CHECK(sem.snapshot().waiting == 2);
        CHECK(sem.snapshot().cancelled_total == 1);
        held.release();
        poll(io);
        for (std::size_t i = 0; i < 3; ++i) {
          if (i == victim) continue;
          if (waiters[i]->called()) waiters[i]->get<1>().release();
          poll(io);
        }
        std::string expected = std::to_string(victim);
        for (std::size_t i = 0; i < 3; ++i)
          if (i != victim) expected.push_back(static_cast<char>('0' + i));
        CHECK(order == expected);
        CHECK(sem.available() == 1);
      }
    }
  }
}

TEST_CASE("a cancellation of type none is not a cancellation", "[semaphore][cancel]") {
  net::io_context io;
  rein::semaphore sem(io, 1);
  permit held = sem.try_acquire();
  net::cancellation_signal signal;
  record_ptr w = start(sem, 1, signal);
  poll(io);
  signal.emit(net::cancellation_type::none);
  poll(io);
  CHECK_FALSE(w->called());
  held.release();
  poll(io);
  CHECK(granted(w, 1));
}

TEST_CASE("a cancellation that arrives after the handler ran changes nothing", "[semaphore][cancel]") {
  net::io_context io;
  rein::semaphore sem(io, 1);
  permit held = sem.try_acquire();
  net::cancellation_signal signal;
  record_ptr w = start(sem, 1, signal);
  poll(io);
  held.release();
  poll(io);
  REQUIRE(granted(w, 1));
  signal.emit(net::cancellation_type::terminal);  // the slot was cleared when the handler ran
  poll(io);
  CHECK(granted(w, 1));
  CHECK(sem.available() == 0);
  CHECK(sem.snapshot().cancelled_total == 0);
}

TEST_CASE("a cancellation after close or after a timeout changes nothing", "[semaphore][cancel]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  timed_semaphore sem(io, 1);
  permit held = sem.try_acquire();
  net::cancellation_signal s1, s2;
  auto [h1, timed] = checked_acquire();
  sem.async_acquire_for(1, 10ms, net::bind_cancellation_slot(s1.slot(), std::move(h1)));
  record_ptr closed = start(sem, 1, s2);
  rein_test::advance_and_poll(io, 10ms);
  CHECK(failed_with(timed, rein::errc::timed_out));
  sem.close();
  s1.emit(net::cancellation_type::terminal);
  s2.emit(net::cancellation_type::terminal);
  poll(io);
  CHECK(failed_with(closed, rein::errc::closed));
  CHECK(sem.snapshot().cancelled_total == 0);
}

TEST_CASE("a revoked grant goes back to the semaphore when nobody else waits", "[semaphore][cancel]") {
  net::io_context io;
  rein::semaphore sem(io, 1);
  permit held = sem.try_acquire();
  net::cancellation_signal signal;
  record_ptr w = start(sem, 1, signal);
  poll(io);
  held.release();
  CHECK(sem.available() == 0);  // granted to w, not yet delivered
  signal.emit(net::cancellation_type::partial);
  CHECK(sem.available() == 1);
  poll(io);
  CHECK(failed_with(w, aborted));
  CHECK(sem.available() == 1);
  CHECK(sem.snapshot().acquired_total == 1);  // held's; w's grant was taken back
}

TEST_CASE("a permit granted at once is also taken back by a cancellation before its handler runs",
          "[semaphore][cancel]") {
  net::io_context io;
  rein::semaphore sem(io, 1);
  net::cancellation_signal signal;
  record_ptr w = start(sem, 1, signal);
  CHECK(sem.available() == 0);
  signal.emit(net::cancellation_type::terminal);
  CHECK(sem.available() == 1);
  poll(io);
  CHECK(failed_with(w, aborted));
  CHECK(sem.snapshot().acquired_total == 0);
  CHECK(sem.snapshot().cancelled_total == 1);
}

// ---- destruction, close, backpressure -----------------------------------------------------------------

TEST_CASE("destroying the semaphore completes its waiters with operation_aborted", "[semaphore][lifetime]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  auto sem = std::make_unique<timed_semaphore>(io, 1);
  permit held = sem->try_acquire();
  record_ptr w1 = start(*sem, 1);
  auto [h2, w2] = checked_acquire();
  sem->async_acquire_for(1, 1h, std::move(h2));  // arms the timer
  record_ptr w3 = start(*sem, 1);
  poll(io);
  held.release();  // w1 granted, not yet delivered
  sem.reset();
  CHECK_FALSE(w2->called());
  poll(io);
  CHECK(failed_with(w1, aborted));  // a grant on its way when the semaphore went is not delivered
  CHECK(failed_with(w2, aborted));
  CHECK(failed_with(w3, aborted));
  CHECK(io.stopped());  // nothing left behind: no timer, no work
}

TEMPLATE_TEST_CASE("an io_context destroyed with a grant queued gives the permit back", "[semaphore][lifetime]",
                   rein::semaphore, rein::single_thread_semaphore) {
  net::io_context io;
  TestType sem(io, 1);
  permit held = sem.try_acquire();
  auto other = std::make_unique<net::io_context>();
  auto [handler, lost] = checked_acquire();
  lost->may_be_destroyed_uncalled = true;
  // Bound to the io_context's own executor type, or to one wrapped in any_io_executor (which the
  // completion unwraps to post to the io_context directly): both completions die with `other`.
  const bool wrapped = GENERATE(false, true);
  if (wrapped)
    sem.async_acquire(1, net::bind_executor(net::any_io_executor(other->get_executor()), std::move(handler)));
  else
    sem.async_acquire(1, net::bind_executor(other->get_executor(), std::move(handler)));
  record_ptr next = start(sem, 1);
  poll(io);
  held.release();  // granted to `lost`, whose completion waits in `other`
  CHECK(sem.available() == 0);
  other.reset();
  CHECK_FALSE(lost->called());
  poll(io);
  CHECK(granted(next, 1));
  next->get<1>().release();
  CHECK(sem.available() == 1);
}

TEST_CASE("an io_context destroyed with completions queued frees them", "[semaphore][lifetime]") {
  auto io = std::make_unique<net::io_context>();
  auto sem = std::make_unique<rein::semaphore>(*io, 1);
  std::vector<record_ptr> waiters;
  for (int i = 0; i < 4; ++i) waiters.push_back(start(*sem, 1));  // one granted at once, three wait
  for (auto& w : waiters) w->may_be_destroyed_uncalled = true;
  sem.reset();  // every completion is now queued in io, none has run
  io.reset();
  for (auto& w : waiters) CHECK_FALSE(w->called());
}

TEST_CASE("a waiting acquire counts as outstanding work and nothing is left once it completes",
          "[semaphore][lifetime]") {
  net::io_context io;
  rein::semaphore sem(io, 1);
  permit held = sem.try_acquire();
  record_ptr w = start(sem, 1);
  poll(io);
  CHECK_FALSE(io.stopped());  // run() would wait for the release, as for any pending Asio operation
  held.release();
  poll(io);
  CHECK(granted(w, 1));
  CHECK(io.stopped());
}

TEST_CASE("the deadline timer does not outlive the waiters that needed it", "[semaphore][lifetime]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  timed_semaphore sem(io, 1);
  permit held = sem.try_acquire();
  auto w = start_for(sem, 1, 1h);
  poll(io);
  held.release();
  poll(io);
  CHECK(granted(w.done, 1));
  CHECK(io.stopped());  // run() returns now, not in an hour
}

TEST_CASE("max_waiters: one more waiter completes at once with queue_full", "[semaphore]") {
  net::io_context io;
  rein::semaphore sem(io, 1, rein::line_options{.max_waiters = 2});
  permit held = sem.try_acquire();
  record_ptr w1 = start(sem, 1);
  record_ptr w2 = start(sem, 1);
  record_ptr w3 = start(sem, 1);
  poll(io);
  CHECK(failed_with(w3, rein::errc::queue_full));
  CHECK_FALSE(w1->called());
  const auto s = sem.snapshot();
  CHECK(s.waiting == 2);
  CHECK(s.queue_full_total == 1);
  CHECK(s.rejected_total == 1);
  held.release();
  poll(io);
  CHECK(granted(w1, 1));
  record_ptr w4 = start(sem, 1);  // room again
  poll(io);
  CHECK_FALSE(w4->called());
  CHECK(sem.snapshot().waiting == 2);
  sem.close();
  poll(io);
  CHECK(failed_with(w2, rein::errc::closed));
  CHECK(failed_with(w4, rein::errc::closed));
}

TEST_CASE("max_waiters 0: nobody waits but a free permit is still granted", "[semaphore]") {
  net::io_context io;
  rein::semaphore sem(io, 1, rein::line_options{.max_waiters = 0});
  record_ptr w1 = start(sem, 1);
  record_ptr w2 = start(sem, 1);
  poll(io);
  CHECK(granted(w1, 1));
  CHECK(failed_with(w2, rein::errc::queue_full));
}

TEST_CASE("exceeds_capacity: more than the total fails at once and so does try_acquire", "[semaphore]") {
  net::io_context io;
  rein::semaphore sem(io, 3);
  permit held = sem.try_acquire(3);
  record_ptr w = start(sem, 4);
  poll(io);
  CHECK(failed_with(w, rein::errc::exceeds_capacity));
  CHECK_FALSE(sem.try_acquire(4));
  CHECK(sem.snapshot().waiting == 0);
  held.release();
  sem.add_permits(1);
  record_ptr w2 = start(sem, 4);
  poll(io);
  CHECK(granted(w2, 4));
}

TEST_CASE("add_permits raises the total and grants the waiters that now fit in order", "[semaphore]") {
  net::io_context io;
  rein::semaphore sem(io, 0);
  std::string order;
  record_ptr a = start_logged(sem, 2, order, 'a');
  record_ptr b = start_logged(sem, 1, order, 'b');
  record_ptr c = start_logged(sem, 2, order, 'c');
  poll(io);
  sem.add_permits(4);
  poll(io);
  CHECK(order == "ab");
  CHECK(sem.available() == 1);
  CHECK(sem.snapshot().permits == 4);
  sem.add_permits(1);
  poll(io);
  CHECK(order == "abc");
  CHECK(sem.available() == 0);
}

TEST_CASE("add_permits refuses to overflow the total", "[semaphore]") {
  net::io_context io;
  rein::semaphore sem(io, 2);
  CHECK_THROWS_AS(sem.add_permits(std::numeric_limits<std::size_t>::max()), std::invalid_argument);
  CHECK(sem.snapshot().permits == 2);
  CHECK(sem.available() == 2);
}

TEST_CASE("try_acquire takes only when free and nobody waits and never after close", "[semaphore]") {
  net::io_context io;
  rein::semaphore sem(io, 3);
  permit p = sem.try_acquire(2);
  CHECK(p.count() == 2);
  CHECK_FALSE(sem.try_acquire(2));
  record_ptr w = start(sem, 2);
  poll(io);
  CHECK_FALSE(sem.try_acquire(1));  // 1 is free, but w is first in line
  p.release();
  poll(io);
  CHECK(granted(w, 2));
  CHECK(sem.try_acquire(1).count() == 1);  // taken and given back at once
  CHECK(sem.available() == 1);
  sem.close();
  CHECK_FALSE(sem.try_acquire(1));
  CHECK(sem.snapshot().acquired_total == 3);
}

// ---- deadlines on the manual clock -------------------------------------------------------------------

TEST_CASE("async_acquire_for and async_acquire_until time out exactly at their deadlines", "[semaphore][time]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  timed_semaphore sem(io, 1);
  permit held = sem.try_acquire();
  auto w1 = start_for(sem, 1, 100ms);
  rein_test::advance_and_poll(io, 10ms);
  auto [h2, w2] = checked_acquire();
  auto w2_at = std::make_shared<manual_clock::duration>(-1);
  sem.async_acquire_until(1, manual_clock::time_point(60ms), [h = std::move(h2), w2_at](error_code ec, permit p) mutable {
    *w2_at = rein_test::since_epoch();
    h(ec, std::move(p));
  });
  rein_test::advance_and_poll(io, 49ms);
  CHECK_FALSE(w2->called());
  rein_test::advance_and_poll(io, 1ms);
  CHECK(failed_with(w2, rein::errc::timed_out));
  CHECK(*w2_at == 60ms);
  CHECK_FALSE(w1.done->called());
  rein_test::advance_and_poll(io, 39ms);
  CHECK_FALSE(w1.done->called());
  rein_test::advance_and_poll(io, 1ms);
  CHECK(failed_with(w1.done, rein::errc::timed_out));
  CHECK(*w1.at == 100ms);
  const auto s = sem.snapshot();
  CHECK(s.timed_out_total == 2);
  CHECK(s.rejected_total == 2);
  CHECK(s.waiting == 0);
  CHECK(sem.available() == 0);
}

TEST_CASE("a grant at the very instant of the deadline wins over the expiry", "[semaphore][time]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  timed_semaphore sem(io, 1);
  permit held = sem.try_acquire();
  auto w = start_for(sem, 1, 100ms);
  manual_clock::advance(100ms);
  held.release();
  poll(io);
  CHECK(granted(w.done, 1));
  CHECK(sem.snapshot().timed_out_total == 0);
}

TEST_CASE("a deadline already past fails at once unless the permits are free now", "[semaphore][time]") {
  rein_test::manual_clock_at_epoch epoch;
  manual_clock::advance(1s);
  net::io_context io;
  timed_semaphore sem(io, 1);
  auto free_now = start_for(sem, 1, -1ms);
  auto [h, late] = checked_acquire();
  sem.async_acquire_until(1, manual_clock::now(), std::move(h));
  poll(io);
  CHECK(granted(free_now.done, 1));
  CHECK(failed_with(late, rein::errc::timed_out));
  CHECK(sem.snapshot().waiting == 0);
}

TEST_CASE("the longest timeout means no deadline and does not overflow", "[semaphore][time]") {
  rein_test::manual_clock_at_epoch epoch;
  manual_clock::advance(1s);
  net::io_context io;
  timed_semaphore sem(io, 1);
  permit held = sem.try_acquire();
  auto w = start_for(sem, 1, manual_clock::duration::max());
  poll(io);
  CHECK_FALSE(w.done->called());
  rein_test::advance_and_poll(io, 24h * 365 * 100);
  CHECK_FALSE(w.done->called());
  held.release();
  poll(io);
  CHECK(granted(w.done, 1));
}

TEST_CASE("a timed-out head lets the smaller waiter behind it through at the same instant", "[semaphore][time]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  timed_semaphore sem(io, 2);
  permit held = sem.try_acquire();
  auto head = start_for(sem, 2, 10ms);
  auto small = start_for(sem, 1, 1h);
  rein_test::advance_and_poll(io, 9ms);
  CHECK_FALSE(small.done->called());
  rein_test::advance_and_poll(io, 1ms);
  CHECK(failed_with(head.done, rein::errc::timed_out));
  CHECK(granted(small.done, 1));
  CHECK(*small.at == 10ms);
}

TEST_CASE("waiters with the same deadline time out in the order they came", "[semaphore][time]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  timed_semaphore sem(io, 1);
  permit held = sem.try_acquire();
  std::string order;
  std::vector<record_ptr> waiters;
  for (char tag : std::string("abcdefgh")) {
    auto [handler, done] = checked_acquire();
    const auto deadline = manual_clock::time_point(5ms);
    sem.async_acquire_until(1, deadline, [h = std::move(handler), &order, tag](error_code ec, permit p) mutable {
      order.push_back(tag);
      h(ec, std::move(p));
    });
    waiters.push_back(done);
  }
  rein_test::advance_and_poll(io, 5ms);
  CHECK(order == "abcdefgh");
  for (auto& w : waiters) CHECK(failed_with(w, rein::errc::timed_out));
}

TEST_CASE("acquire_for in a coroutine throws timed_out", "[semaphore][time]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  timed_semaphore sem(io, 1);
  permit held = sem.try_acquire();
  error_code ec;
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        try {
          permit p = co_await sem.acquire_for(1, 20ms);
        } catch (const rein::system_error& e) {
          ec = e.code();
        }
      },
      net::detached);
  poll(io);  // the coroutine starts, and its deadline is set, at t = 0
  rein_test::advance_and_poll(io, 19ms);
  CHECK(!ec);
  rein_test::advance_and_poll(io, 1ms);
  CHECK(ec == rein::errc::timed_out);
}

TEST_CASE("snapshot: every field is exact after a known history", "[semaphore][time]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  timed_semaphore sem(io, 3, rein::line_options{.max_waiters = 4});
  permit a = sem.try_acquire(2);                    // acquired 1
  auto w1 = start_for(sem, 2, 1h);                  // queued at 0
  rein_test::advance_and_poll(io, 10ms);
  auto w2 = start_for(sem, 1, 1h);                  // queued at 10
  net::cancellation_signal cancel_me;
  record_ptr w3 = start(sem, 1, cancel_me);               // queued at 10
  auto w4 = start_for(sem, 1, 5ms);                 // queued at 10, times out at 15
  record_ptr w5 = start(sem, 1);                          // queue_full
  rein_test::advance_and_poll(io, 5ms);             // t = 15
  CHECK(failed_with(w4.done, rein::errc::timed_out));
  CHECK(failed_with(w5, rein::errc::queue_full));
  cancel_me.emit(net::cancellation_type::terminal);
  rein_test::advance_and_poll(io, 15ms);            // t = 30
  a.release();                                      // w1 (waited 30) and w2 (waited 20) granted
  poll(io);
  auto s = sem.snapshot();
  CHECK(s.permits == 3);
  CHECK(s.available == 0);
  CHECK(s.in_flight == 3);
  CHECK(s.waiting == 0);
  CHECK(s.acquired_total == 3);
  CHECK(s.rejected_total == 2);
  CHECK(s.queue_full_total == 1);
  CHECK(s.timed_out_total == 1);
  CHECK(s.cancelled_total == 1);
  CHECK(s.wait_total == 50ms);
  CHECK(s.wait_max == 30ms);
  CHECK(failed_with(w3, aborted));
  CHECK(granted(w2.done, 1));
}

namespace {

// The manual clock, counting its reads.
struct counting_clock {
  using rep = manual_clock::rep;
  using period = manual_clock::period;
  using duration = manual_clock::duration;
  using time_point = std::chrono::time_point<counting_clock, duration>;
  [[maybe_unused]] static constexpr bool is_steady = true;
  inline static std::size_t reads = 0;
  static time_point now() noexcept {
    ++reads;
    return time_point(manual_clock::now().time_since_epoch());
  }
};

using counted_semaphore = rein::basic_semaphore<net::any_io_executor, counting_clock, rein::null_mutex>;

}  // namespace

TEST_CASE("a timed wait reads the clock at the acquire call and at the grant; an untimed one never",
          "[semaphore][snapshot]") {
  rein_test::manual_clock_at_epoch epoch;
  // coarse_wait_clock is ignored on a clock other than steady_clock: the waits stay exact.
  for (const auto& [measure, coarse] : {std::pair{true, false}, std::pair{false, false}, std::pair{true, true}}) {
    DYNAMIC_SECTION("measure_wait " << measure << ", coarse_wait_clock " << coarse) {
      net::io_context io;
      counted_semaphore sem(io, 1, {.measure_wait = measure, .coarse_wait_clock = coarse});
      counting_clock::reads = 0;
      permit a = sem.try_acquire();
      record_ptr b = start(sem, 1);
      poll(io);
      rein_test::advance_and_poll(io, 7ms);
      a.release();
      poll(io);
      REQUIRE(granted(b, 1));
      b->get<1>().release();
      CHECK(counting_clock::reads == (measure ? 2u : 0u));
      const auto s = sem.snapshot();
      CHECK(s.acquired_total == 2);
      CHECK(s.wait_total == (measure ? 7ms : 0ms));
      CHECK(s.wait_max == (measure ? 7ms : 0ms));
    }
  }
}

TEST_CASE("coarse_wait_clock on steady_clock: every wait is counted, both ends read on the coarse clock",
          "[semaphore][snapshot]") {
  // Real time, but nothing sleeps: the bounds hold however fast the machine runs. A wait read on the coarse
  // clock at both ends is 0 or at least a tick (the clock moves a tick at a time); a precise end would give
  // the microseconds these waits take. One waiter has a deadline (its arrival reads the precise clock for
  // it) and one is granted by add_permits (a dispatch that reads the precise clock).
  const auto tick = rein::coarse_wait_resolution();
  REQUIRE(tick > 0ns);
  const auto before = std::chrono::steady_clock::now();
  CHECK(rein::detail::coarse_steady_now() <= std::chrono::steady_clock::now());
  net::io_context io;
  rein::semaphore sem(io, 1, {.coarse_wait_clock = true});
  permit held = sem.try_acquire();
  std::vector<record_ptr> waiters;
  for (int i = 0; i < 2; ++i) waiters.push_back(start(sem, 1));
  auto timed = std::make_shared<rein_test::completion_record<rein::error_code, permit>>();
  sem.async_acquire_for(1, 1h, rein_test::checked_handler<rein::error_code, permit>(timed));
  poll(io);
  held.release();
  poll(io);
  REQUIRE(granted(waiters[0], 1));
  sem.add_permits(1);
  poll(io);
  REQUIRE(granted(waiters[1], 1));
  waiters[0]->get<1>().release();
  poll(io);
  REQUIRE(timed->called());
  REQUIRE_FALSE(timed->ec());
  const auto elapsed = std::chrono::steady_clock::now() - before;
  const auto s = sem.snapshot();
  CHECK(s.acquired_total == 4);
  CHECK(s.wait.count() == 4);  // three waits and the immediate grant's zero
  CHECK((s.wait_max == 0ns || s.wait_max >= tick / 2));
  CHECK(s.wait_max <= elapsed + tick);
  CHECK(s.wait_total <= 3 * (elapsed + tick));
}

TEST_CASE("with measure_wait off, deadlines still expire on time and the waits stay untimed",
          "[semaphore][snapshot][deadline]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  timed_semaphore sem(io, 1, {.measure_wait = false});
  permit a = sem.try_acquire();
  record_ptr plain = start(sem, 1);     // no deadline: queued at 0 without a clock read
  auto soon = start_for(sem, 1, 5ms);   // expires at 5
  rein_test::advance_and_poll(io, 4ms);
  CHECK_FALSE(soon.done->called());
  rein_test::advance_and_poll(io, 1ms);
  CHECK(failed_with(soon.done, rein::errc::timed_out));
  CHECK(*soon.at == 5ms);
  rein_test::advance_and_poll(io, 5ms);
  a.release();
  poll(io);
  CHECK(granted(plain, 1));
  const auto s = sem.snapshot();
  CHECK(s.timed_out_total == 1);
  CHECK(s.acquired_total == 2);
  CHECK(s.wait_total == 0ms);
  CHECK(s.wait_max == 0ms);
}

namespace {

// A lock that counts how often it is taken.
struct counting_mutex {
  inline static std::size_t locks = 0;
  void lock() noexcept { ++locks; }
  void unlock() noexcept {}
  bool try_lock() noexcept { return ++locks, true; }
};

}  // namespace

TEST_CASE("a coroutine that queues behind other waiters locks once: it skips the synchronous try",
          "[semaphore][fast_path]") {
  net::io_context io;
  rein::basic_semaphore<net::any_io_executor, std::chrono::steady_clock, counting_mutex> sem(io, 1);
  int granted_count = 0;
  auto worker = [&]() -> net::awaitable<void> {
    permit p = co_await sem.acquire();
    ++granted_count;
  };
  permit held = sem.try_acquire();
  counting_mutex::locks = 0;
  net::co_spawn(io, worker(), net::detached);
  poll(io);
  CHECK(counting_mutex::locks == 2);  // nobody waited yet: the try (fails, the permit is held), then the queue
  counting_mutex::locks = 0;
  net::co_spawn(io, worker(), net::detached);
  poll(io);
  CHECK(counting_mutex::locks == 1);  // behind a waiter: the queue only
  held.release();
  poll(io);
  CHECK(granted_count == 2);
  CHECK(sem.available() == 1);
  counting_mutex::locks = 0;
  net::co_spawn(io, worker(), net::detached);
  poll(io);
  // The line is empty again, and available() above lent the free permit to the lock-free word: the try
  // takes it and the permit gives it back without the lock (with null_mutex there is no word: two locks).
  CHECK(counting_mutex::locks == 0);
  CHECK(granted_count == 3);
}

// ---- fast path, stack depth, executors, allocators, exceptions ----------------------------------------

namespace {

template <class Sem>
std::size_t handlers_run_by_coroutine_acquiring(int times) {
  net::io_context io;
  Sem sem(io, 1);
  int finished = 0;
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        for (int i = 0; i < times; ++i) {
          permit p = co_await sem.acquire();
          if (!p) throw std::logic_error("no permit");
        }
        ++finished;
      },
      net::detached);
  const std::size_t handlers = io.poll();
  CHECK(finished == 1);
  return handlers;
}

}  // namespace

TEMPLATE_TEST_CASE("co_await acquire() with a free permit completes without a trip through the scheduler",
                   "[semaphore][fast]", rein::semaphore, rein::single_thread_semaphore) {
  const std::size_t none = handlers_run_by_coroutine_acquiring<TestType>(0);
  CHECK(handlers_run_by_coroutine_acquiring<TestType>(10) == none);
  CHECK(handlers_run_by_coroutine_acquiring<TestType>(1000) == none);
}

TEST_CASE("100000 fast-path acquires in a row do not grow the stack", "[semaphore][fast]") {
  net::io_context io;
  rein::semaphore sem(io, 1);
  rein_test::stack_span span;
  int count = 0;
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        for (int i = 0; i < 100000; ++i) {
          permit p = co_await sem.acquire();
          span.sample();
          ++count;
        }
      },
      net::detached);
  poll(io);
  CHECK(count == 100000);
  CHECK(span.bytes() < 4096);
}

// 100000 waiters behind one permit, each giving it back inside its handler; the first release is made from
// inside io.run(). What came out: the grants, the handlers the io_context ran, the stack span of the handlers.
struct grant_chain {
  int granted = 0;
  std::size_t handlers = 0;
  std::size_t stack_bytes = 0;
  std::size_t available = 0;
};

grant_chain run_grant_chain(bool direct_handoff) {
  net::io_context io;
  rein::semaphore sem(io, 1, {.direct_handoff = direct_handoff});
  permit held = sem.try_acquire();
  rein_test::stack_span span;
  grant_chain out;
  for (int i = 0; i < 100000; ++i) {
    sem.async_acquire(1, [&](error_code ec, permit p) {
      span.sample();
      if (!ec && p) ++out.granted;
      // p goes back here, inside the handler
    });
  }
  poll(io);
  net::post(io, [&] { held.release(); });
  out.handlers = poll(io);
  out.stack_bytes = span.bytes();
  out.available = sem.available();
  return out;
}

TEST_CASE("100000 waiting acquires granted in a row do not nest on the stack", "[semaphore][fast]") {
  const grant_chain chain = run_grant_chain(false);
  CHECK(chain.granted == 100000);
  CHECK(chain.handlers > 100000);  // every grant posted, not run in place
  CHECK(chain.stack_bytes < 4096);
  CHECK(chain.available == 1);
}

TEST_CASE("two coroutines handing one permit back and forth 20000 times through the waiting path do not nest",
          "[semaphore][fast]") {
  net::io_context io;
  rein::semaphore sem(io, 1);
  rein_test::stack_span span;
  int rounds = 0;
  auto player = [&]() -> net::awaitable<void> {
    for (int i = 0; i < 10000; ++i) {
      permit p = co_await sem.acquire();  // waits: the other player holds the permit or is first in line
      span.sample();
      ++rounds;
      co_await net::post(io, net::use_awaitable);  // hold it across a suspension, so the other one queues
    }
  };
  net::co_spawn(io, player(), net::detached);
  net::co_spawn(io, player(), net::detached);
  const std::size_t handlers = poll(io);
  CHECK(rounds == 20000);
  CHECK(handlers >= 40000);  // a post and a grant per round: these acquires waited
  CHECK(span.bytes() < 4096);
}

TEST_CASE("handlers run on their associated executor and never inside async_acquire or a release or add_permits",
          "[semaphore][executor]") {
  net::io_context io;
  rein::semaphore sem(io, 1);
  auto strand = net::make_strand(io);
  auto on_strand = [&strand](rein_test::acquire_handler h, std::shared_ptr<bool> in_strand) {
    return net::bind_executor(strand, [&strand, h = std::move(h), in_strand](error_code ec, permit p) mutable {
      *in_strand = strand.running_in_this_thread();
      h(ec, std::move(p));
    });
  };
  auto [h1, now] = checked_acquire();
  auto now_in_strand = std::make_shared<bool>(false);
  sem.async_acquire(1, on_strand(std::move(h1), now_in_strand));
  CHECK_FALSE(now->called());  // free, yet not called from inside async_acquire
  auto [h2, later] = checked_acquire();
  auto later_in_strand = std::make_shared<bool>(false);
  sem.async_acquire(1, on_strand(std::move(h2), later_in_strand));
  poll(io);
  REQUIRE(granted(now, 1));
  CHECK(*now_in_strand);
  now->get<1>().release();
  CHECK_FALSE(later->called());  // not from inside the release
  poll(io);
  REQUIRE(granted(later, 1));
  CHECK(*later_in_strand);
  permit held = sem.try_acquire();
  record_ptr w3 = start(sem, 1);
  poll(io);
  sem.add_permits(1);
  CHECK_FALSE(w3->called());  // not from inside add_permits
  poll(io);
  CHECK(w3->called());
}

// ---- direct handoff (line_options::direct_handoff) -------------------------------------------

// Parks a waiter behind `sem`'s only permit, its handler bound to `bound` appending 'w', then gives the permit
// back from a function posted to `on` that appends 'r' once the release returned: the order they ran in.
template <class Sem, class Bound, class On>
std::string handoff_order(net::io_context& io, Sem& sem, const Bound& bound, const On& on) {
  std::string log;
  permit held = sem.try_acquire();
  REQUIRE(held);
  sem.async_acquire(1, net::bind_executor(bound, [&log](error_code ec, permit p) {
                      CHECK_FALSE(ec);
                      CHECK(p);
                      log += 'w';
                    }));
  poll(io);
  net::post(on, [&] {
    held.release();
    log += 'r';
  });
  poll(io);
  return log;
}

TEST_CASE("direct_handoff: a release on the waiter's executor runs the waiter in place; elsewhere it is posted",
          "[semaphore][direct]") {
  net::io_context io;
  rein::semaphore sem(io, 1, {.direct_handoff = true});
  CHECK(handoff_order(io, sem, io.get_executor(), io.get_executor()) == "wr");  // before the release returns
  std::string log;
  permit held = sem.try_acquire();
  REQUIRE(held);
  sem.async_acquire(1, [&](error_code, permit) { log += 'w'; });
  held.release();  // outside io.run(): posted, as without the option
  log += 'r';
  CHECK(log == "r");
  poll(io);
  CHECK(log == "rw");
  CHECK(sem.available() == 1);
  rein::semaphore plain(io, 1);  // without the option, posted even from inside io.run()
  CHECK(handoff_order(io, plain, io.get_executor(), io.get_executor()) == "rw");
}

TEST_CASE("direct_handoff: a handler bound to a strand runs in place only when the release runs in that strand",
          "[semaphore][direct][executor]") {
  net::io_context io;
  rein::semaphore sem(io, 1, {.direct_handoff = true});
  auto strand = net::make_strand(io);
  CHECK(handoff_order(io, sem, strand, io.get_executor()) == "rw");
  CHECK(handoff_order(io, sem, strand, strand) == "wr");
  CHECK(sem.available() == 1);
}

TEST_CASE("direct_handoff: coroutines handing one permit back and forth skip a scheduler trip per round",
          "[semaphore][direct][fast]") {
  net::io_context io;
  rein::semaphore sem(io, 1, {.direct_handoff = true});
  rein_test::stack_span span;
  int rounds = 0;
  auto player = [&]() -> net::awaitable<void> {
    for (int i = 0; i < 10000; ++i) {
      permit p = co_await sem.acquire();
      span.sample();
      ++rounds;
      co_await net::post(io, net::use_awaitable);
    }
  };
  net::co_spawn(io, player(), net::detached);
  net::co_spawn(io, player(), net::detached);
  const std::size_t handlers = poll(io);
  CHECK(rounds == 20000);
  CHECK(handlers < 30000);  // a post per round; the grants ran in place (posted, it would be >= 40000)
  CHECK(span.bytes() < 16384);  // one handoff deep at most
  CHECK(sem.available() == 1);
}

TEST_CASE("direct_handoff: handlers that release in place nest at most a few deep, then the grant is posted",
          "[semaphore][direct][fast]") {
  const grant_chain chain = run_grant_chain(true);
  CHECK(chain.granted == 100000);
  CHECK(chain.handlers < 100000 / 2);  // most grants ran in place
  CHECK(chain.handlers > 100000 / (rein::detail::direct_handoff_max_depth + 2));  // the chain was cut
  CHECK(chain.stack_bytes < 32768);
  CHECK(chain.available == 1);
  CHECK(rein::detail::direct_handoff_depth == 0);
}

TEST_CASE("direct_handoff: a handler run in place that throws leaves the release and is rethrown from run()",
          "[semaphore][direct]") {
  net::io_context io;
  rein::semaphore sem(io, 1, {.direct_handoff = true});
  permit held = sem.try_acquire();
  sem.async_acquire(1, [](error_code, permit p) {
    CHECK(p);
    throw std::runtime_error("handler failed");
  });
  poll(io);
  bool returned = false;
  net::post(io, [&] {
    held.release();
    returned = true;
  });
  CHECK_THROWS_AS(poll(io), std::runtime_error);
  CHECK(returned);
  CHECK(sem.available() == 1);
  CHECK(sem.snapshot().in_flight == 0);
  CHECK(rein::detail::direct_handoff_depth == 0);
}

TEST_CASE("direct_handoff: threads running one io_context hand permits over without losing one",
          "[semaphore][direct][threads]") {
  for (const bool on_strands : {false, true}) {
    net::io_context io;
    rein::semaphore sem(io, 4, {.direct_handoff = true});
    std::atomic<int> rounds{0};
    std::atomic<int> inside{0};
    std::atomic<bool> over{false};
    auto worker = [&]() -> net::awaitable<void> {
      for (int i = 0; i < 300; ++i) {
        permit p = co_await sem.acquire();
        if (inside.fetch_add(1) >= 4) over = true;
        rounds.fetch_add(1);
        co_await net::post(co_await net::this_coro::executor, net::use_awaitable);
        inside.fetch_sub(1);
      }
    };
    for (int i = 0; i < 32; ++i) {
      if (on_strands) net::co_spawn(net::make_strand(io), worker(), net::detached);
      else net::co_spawn(io, worker(), net::detached);
    }
    std::thread t1([&io] { io.run(); });
    std::thread t2([&io] { io.run(); });
    t1.join();
    t2.join();
    CHECK(rounds == 32 * 300);
    CHECK_FALSE(over);
    CHECK(sem.available() == 4);
    CHECK(sem.snapshot().in_flight == 0);
  }
}

TEST_CASE("the operation is allocated with the handler's associated allocator", "[semaphore][allocator]") {
  net::io_context io;
  rein::semaphore sem(io, 1);
  rein_test::allocation_counts counts;
  permit held = sem.try_acquire();
  auto [handler, done] = checked_acquire();
  sem.async_acquire(1, net::bind_allocator(rein_test::counting_allocator<int>(counts), std::move(handler)));
  CHECK(counts.allocations.load() == 1);  // the parked operation
  CHECK(counts.live() == 1);
  held.release();
  poll(io);
  CHECK(granted(done, 1));
  CHECK(counts.live() == 0);
  CHECK(counts.allocations.load() == counts.deallocations.load());
}

TEST_CASE("a waiter with a deadline is one allocation too: its deadline node shares the op's block",
          "[semaphore][allocator]") {
  net::io_context io;
  rein::semaphore sem(io, 1);
  permit held = sem.try_acquire();
  rein_test::allocation_counts untimed, timed, expired;
  auto [h1, first] = checked_acquire();
  sem.async_acquire(1, net::bind_allocator(rein_test::counting_allocator<int>(untimed), std::move(h1)));
  auto [h2, second] = checked_acquire();
  sem.async_acquire_for(1, 1h, net::bind_allocator(rein_test::counting_allocator<int>(timed), std::move(h2)));
  auto [h3, third] = checked_acquire();  // refused at once: its deadline is now
  sem.async_acquire_for(1, 0s, net::bind_allocator(rein_test::counting_allocator<int>(expired), std::move(h3)));
  CHECK(untimed.allocations.load() == 1);  // parked: the op, and nothing else
  CHECK(timed.allocations.load() == 1);
  CHECK(timed.bytes_in_use.load() - untimed.bytes_in_use.load() ==
        static_cast<long>(sizeof(rein::detail::deadline_node)));
  poll(io);  // the refused one's completion was posted (through its allocator too)
  CHECK(third->ec() == rein::errc::timed_out);
  CHECK(expired.live() == 0);
  CHECK(expired.bytes_in_use.load() == 0);
  held.release();
  poll(io);
  REQUIRE(granted(first, 1));
  first->get<1>().release();
  poll(io);
  REQUIRE(granted(second, 1));
  CHECK(untimed.live() == 0);
  CHECK(timed.live() == 0);
  CHECK(untimed.bytes_in_use.load() == 0);
  CHECK(timed.bytes_in_use.load() == 0);
}

TEST_CASE("an allocation failure leaves the semaphore as it was", "[semaphore][allocator]") {
  net::io_context io;
  rein::semaphore sem(io, 1);
  rein_test::allocation_counts counts;
  counts.fail_after = 0;
  permit held = sem.try_acquire();
  auto [handler, done] = checked_acquire();
  done->may_be_destroyed_uncalled = true;  // an initiating function that throws does not call the handler
  CHECK_THROWS_AS(sem.async_acquire(1, net::bind_allocator(rein_test::counting_allocator<int>(counts), std::move(handler))),
                  std::bad_alloc);
  CHECK(sem.snapshot().waiting == 0);
  CHECK_FALSE(done->called());
  held.release();
  CHECK(sem.available() == 1);
}

TEST_CASE("a handler that throws still gives its permit back", "[semaphore]") {
  net::io_context io;
  rein::semaphore sem(io, 1);
  sem.async_acquire(1, [](error_code, permit p) {
    CHECK(p);
    throw std::runtime_error("handler failed");
  });
  CHECK_THROWS_AS(poll(io), std::runtime_error);
  CHECK(sem.available() == 1);
  CHECK(sem.snapshot().in_flight == 0);
}

// ---- permit -------------------------------------------------------------------------------------------

TEST_CASE("permit: move-only and released once and split into parts that go back separately", "[semaphore][permit]") {
  net::io_context io;
  rein::semaphore sem(io, 5);
  permit p = sem.try_acquire(5);
  permit q = std::move(p);
  CHECK_FALSE(p);
  CHECK(p.count() == 0);
  CHECK(q.count() == 5);
  permit part = q.split(2);
  CHECK(part.count() == 2);
  CHECK(q.count() == 3);
  part.release();
  part.release();  // nothing the second time
  CHECK(sem.available() == 2);
  CHECK_THROWS_AS(q.split(4), std::invalid_argument);
  CHECK(q.count() == 3);
  permit all = q.split(3);
  CHECK_FALSE(q);
  CHECK(all.count() == 3);
  q = std::move(all);
  CHECK(sem.available() == 2);
  q = permit();
  CHECK(sem.available() == 5);
  CHECK_THROWS_AS(permit().split(1), std::invalid_argument);
  CHECK_FALSE(permit().split(0));
}

namespace {
// The service behind every basic_waitable_timer on steady_clock: present once such a timer was made, and with
// it the io_context's reactor (Asio detail, the same in Boost 1.81 and standalone Asio 1.22).
using steady_timer_service = net::detail::deadline_timer_service<
    net::detail::chrono_time_traits<std::chrono::steady_clock, net::wait_traits<std::chrono::steady_clock>>>;
}  // namespace

TEST_CASE("a semaphore makes its timer only when a deadline needs one", "[semaphore][timer]") {
  net::io_context io;
  rein::semaphore sem(io, 1);
  permit held = sem.try_acquire();
  std::vector<error_code> results;
  sem.async_acquire(1, [&](error_code ec, permit) { results.push_back(ec); });
  held.release();
  poll(io);
  CHECK(results == std::vector<error_code>{error_code{}});
  CHECK_FALSE(net::has_service<steady_timer_service>(io));  // waiting without a deadline: no timer, no reactor

  held = sem.try_acquire();
  sem.async_acquire_for(1, 1h, [&](error_code ec, permit) { results.push_back(ec); });
  CHECK(net::has_service<steady_timer_service>(io));
  sem.close();
  poll(io);
  CHECK(results == std::vector<error_code>{error_code{}, rein::errc::closed});
}

// The lock-free fast path (detail/permit_pool.hpp): a thread-safe semaphore lends its free permits to one
// atomic word between its locked calls, and takes them back whenever the lock is taken. Checked here
// against a model of the semaphore's rules, exhaustively: every sequence of `depth` calls (6 in the quick
// tier, 5 under a sanitizer, 7 with REIN_MODEL_THOROUGH=1) from {try_acquire(1), try_acquire(2), release
// the oldest permit, async_acquire(1), cancel the oldest pending acquire, run the completions, add_permits(1),
// forget(1), split a permit, close, snapshot} on 2 permits: 11^6 = 1.77 million runs. Every try's status is
// compared with the model's, and every snapshot (the permits, free permits, in flight, acquired_total,
// cancelled_total, waiters), including one at the end; then each run is drained (every permit back, every
// handler called with the model's result). Each call of the word takes effect at its one compare-and-swap
// and the lock's reclaim at its exchange, so the sequences of whole calls are every interleaving of a few
// callers; they cover the word opening, serving, and handing over to the line: when a waiter queues,
// when permits are owed after forget, after close, at a snapshot, a split and a late cancellation's revoke.
// Threads racing through the word are in semaphore_stress.cpp.
namespace {

struct pool_model {
  std::size_t permits = 2, available = 2, owed = 0;
  std::uint64_t acquired = 0, cancelled = 0;
  bool closed = false;
  std::vector<std::size_t> queued;   // waiter ids, oldest first (each asks for 1)
  std::vector<std::size_t> granted;  // waiter ids granted, their handlers not run yet, in grant order

  void give(std::size_t n) {
    const std::size_t paid = std::min(n, owed);
    owed -= paid;
    available += n - paid;
  }
  void dispatch(std::vector<std::size_t>& ids) {
    while (!queued.empty() && available >= 1) {
      --available;
      ++acquired;
      granted.push_back(queued.front());
      ids.push_back(queued.front());
      queued.erase(queued.begin());
    }
  }
};

struct pool_run {
  net::io_context io;
  rein::semaphore sem;
  pool_model model;
  std::vector<permit> held;  // oldest first
  std::vector<std::unique_ptr<net::cancellation_signal>> signals;
  std::vector<std::shared_ptr<acquire_record>> records;
  std::vector<error_code> expected;  // per waiter: what its handler must get (set when decided)
  std::vector<std::size_t> scratch;

  explicit pool_run(bool direct_handoff = false) : sem(io, 2, {.direct_handoff = direct_handoff}) {}

  void try_take(std::size_t n) {
    auto p = sem.try_acquire(n);
    rein::try_status want = rein::try_status::busy;
    if (model.closed) want = rein::try_status::closed;
    else if (model.permits != 0 && n > model.permits) want = rein::try_status::exceeds_capacity;
    else if (model.queued.empty() && model.available >= n) want = rein::try_status::acquired;
    REQUIRE(p.status() == want);
    if (want != rein::try_status::acquired) return;
    model.available -= n;
    ++model.acquired;
    held.push_back(std::move(p));
  }
  void release_oldest() {
    if (held.empty()) return;
    const std::size_t n = held.front().count();
    held.erase(held.begin());
    model.give(n);
    model.dispatch(scratch);
  }
  // release_oldest() from inside io.run(), as a handler does, with direct handoff on: what was pending runs
  // first (as it would ahead of the posted call), and the waiters the release grants run inside it.
  void release_oldest_in_place() {
    run_completions();
    const std::size_t before = scratch.size();
    bool ran = false;
    net::post(io, [&] {
      release_oldest();
      ran = true;
    });
    io.restart();
    io.run_one();
    REQUIRE(ran);
    for (std::size_t i = before; i < scratch.size(); ++i) {
      const std::size_t id = scratch[i];
      REQUIRE(records[id]->called());  // in place: before the release returned
      REQUIRE(!records[id]->ec());
      held.push_back(std::move(records[id]->get<1>()));
      std::erase(model.granted, id);
    }
  }
  void wait() {
    const std::size_t id = records.size();
    signals.push_back(std::make_unique<net::cancellation_signal>());
    records.push_back(start(sem, 1, *signals.back()));
    expected.emplace_back();
    if (model.closed) {
      expected[id] = rein::errc::closed;
    } else if (model.queued.empty() && model.available >= 1) {
      --model.available;
      ++model.acquired;
      model.granted.push_back(id);
    } else {
      model.queued.push_back(id);
    }
  }
  void cancel_oldest() {
    // The oldest acquire still queued or granted with its handler not run: a revoke gives the grant back.
    std::size_t id = records.size();
    if (!model.queued.empty()) id = model.queued.front();
    if (!model.granted.empty()) id = std::min(id, model.granted.front());
    if (id == records.size()) return;
    signals[id]->emit(net::cancellation_type::terminal);
    expected[id] = aborted;
    ++model.cancelled;
    if (std::erase(model.queued, id) == 0) {
      std::erase(model.granted, id);
      --model.acquired;
      model.give(1);
      model.dispatch(scratch);
    }
  }
  void run_completions() {
    poll(io);
    for (std::size_t id : model.granted) {
      REQUIRE(records[id]->called());
      REQUIRE(!records[id]->ec());
      held.push_back(std::move(records[id]->get<1>()));
    }
    model.granted.clear();
  }
  void add() {
    sem.add_permits(1);
    ++model.permits;
    model.give(1);
    model.dispatch(scratch);
  }
  void forget() {
    if (model.permits == 0) {
      REQUIRE_THROWS_AS(sem.forget(1), std::invalid_argument);
      return;
    }
    sem.forget(1);
    --model.permits;
    if (model.available != 0) --model.available;
    else ++model.owed;
  }
  void split() {
    for (permit& p : held) {
      if (p.count() < 2) continue;
      held.push_back(p.split(1));
      return;
    }
  }
  void close() {
    sem.close();
    model.closed = true;
    for (std::size_t id : model.queued) expected[id] = rein::errc::closed;
    model.queued.clear();
  }

  void check() {
    const rein::semaphore_snapshot s = sem.snapshot();
    REQUIRE(s.permits == model.permits);
    REQUIRE(s.available == model.available);
    REQUIRE(s.in_flight == model.permits + model.owed - model.available);
    REQUIRE(s.acquired_total == model.acquired);
    REQUIRE(s.cancelled_total == model.cancelled);
    REQUIRE(s.waiting == model.queued.size());
  }

  // Every permit back, every handler run with what the model decided for it.
  void drain() {
    for (;;) {
      run_completions();
      if (held.empty()) break;
      while (!held.empty()) release_oldest();
    }
    while (!model.queued.empty()) cancel_oldest();  // behind a gate (0 permits) or owed permits
    poll(io);
    for (std::size_t id = 0; id < records.size(); ++id) {
      REQUIRE(records[id]->called());
      REQUIRE(records[id]->ec() == expected[id]);
    }
    check();
    REQUIRE(model.available == model.permits);
    // No permit object counted out (what went through the word included): a drain completes at once.
    bool drained = false;
    sem.async_drain([&](error_code ec) { drained = !ec; });
    poll(io);
    REQUIRE(drained);
  }
};

int pool_model_depth() { return rein_test::model_scope(6, 5, 7); }

}  // namespace

TEST_CASE("the lock-free fast path against the model, exhaustively: every sequence of 6 calls on 2 permits",
          "[semaphore][pool][model]") {
  constexpr int calls = 11;
  rein_test::for_each_sequence(pool_model_depth(), calls, [](long code, const std::vector<int>& sequence) {
    pool_run run;
    INFO("calls (lowest digit first, base 11) " << code);
    for (int call : sequence) {
      switch (call) {
        case 0: run.try_take(1); break;
        case 1: run.try_take(2); break;
        case 2: run.release_oldest(); break;
        case 3: run.wait(); break;
        case 4: run.cancel_oldest(); break;
        case 5: run.run_completions(); break;
        case 6: run.add(); break;
        case 7: run.forget(); break;
        case 8: run.split(); break;
        case 9: run.close(); break;
        default: run.check(); break;  // a snapshot: the lock, so the word closes and opens again
      }
    }
    run.check();
    run.drain();
  });
}

// The same model with direct handoff on and every release made from inside io.run() (the one place where it
// hands off in place): a waiter that a release grants must have run, with its permit, before the release
// returned, in FIFO order, and nothing else may change (the counts, the posted grants of every other call,
// the drain). Covers every sequence of 5 calls in the quick tier (161,051 runs; 4 under a sanitizer, 7 with
// REIN_MODEL_THOROUGH=1) over the same 11 kinds; the depth cap and threads are in the [direct] cases above.
TEST_CASE("direct handoff against the model, exhaustively: every sequence of 5 calls on 2 permits",
          "[semaphore][direct][model]") {
  constexpr int calls = 11;
  rein_test::for_each_sequence(rein_test::model_scope(5, 4, 7), calls, [](long code, const std::vector<int>& sequence) {
    pool_run run(true);
    INFO("calls (lowest digit first, base 11) " << code);
    for (int call : sequence) {
      switch (call) {
        case 0: run.try_take(1); break;
        case 1: run.try_take(2); break;
        case 2: run.release_oldest_in_place(); break;
        case 3: run.wait(); break;
        case 4: run.cancel_oldest(); break;
        case 5: run.run_completions(); break;
        case 6: run.add(); break;
        case 7: run.forget(); break;
        case 8: run.split(); break;
        case 9: run.close(); break;
        default: run.check(); break;
      }
    }
    run.check();
    run.drain();
  });
}

TEST_CASE("a semaphore destroyed with permits taken through the lock-free word stays alive until they are back",
          "[semaphore][pool][lifetime]") {
  // The permits were counted in the word when the destructor's shutdown took the lock: it must fold them in
  // and keep the core for them (ASan would see a release into a freed core).
  net::io_context io;
  permit a, b;
  {
    rein::semaphore sem(io, 3);
    CHECK(sem.available() == 3);  // a locked call: the word opens
    a = sem.try_acquire(2);
    b = sem.try_acquire();
    REQUIRE(a);
    REQUIRE(b);
    permit c = a.split(1);  // a locked call among the word's grants
    c.release();
  }
  a.release();
  b.release();
  CHECK_FALSE(a);
  CHECK_FALSE(b);
}
