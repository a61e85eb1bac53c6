// The waiter core (include/rein/detail/): the intrusive queue and its orders (fifo, lifo, priority classes
// with aging, evicting the oldest on a full line, for every primitive), the deadline heap, and limiter_core driven by
// small test policies, for what the semaphore cannot show: one timer per limiter, policy wake-ups, deadlines
// that cannot be met, revocable and non-revocable grants without permits, the clock left unread on the
// fast path, and deadlines on a coarse clock.
#include "support/async.hpp"
#include "support/catch.hpp"
#include "support/invalid_argument.hpp"
#include "support/model_tier.hpp"

#include <rein/adaptive_limiter.hpp>
#include <rein/adaptive_rate_limiter.hpp>
#include <rein/algo/aimd.hpp>
#include <rein/algo/token_bucket.hpp>
#include <rein/detail/deadline_heap.hpp>
#include <rein/detail/fair_schedule.hpp>
#include <rein/detail/limiter_core.hpp>
#include <rein/detail/op_queue.hpp>
#include <rein/detail/spare_allocator.hpp>
#include <rein/fixed_window.hpp>
#include <rein/line_options.hpp>
#include <rein/queue_order.hpp>
#include <rein/quota_gate.hpp>
#include <rein/rate_limiter.hpp>
#include <rein/semaphore.hpp>
#include <rein/sliding_window.hpp>
#include <rein/token_bucket.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
using rein::error_code;
using rein::detail::deadline_heap;
using rein::detail::op_queue;
using rein::detail::wait_op;
using rein_test::manual_clock;
using rein_test::poll;

using tp = manual_clock::time_point;

// ---- policies --------------------------------------------------------------------------------------------

// Nothing passes before `open_at`; from then on everything does. A time-based rule (like a quota gate) that
// needs the core's timer to wake the line, and whose grant time is known in advance.
struct gate_policy {
  static constexpr bool needs_time = true;
  tp open_at;
  std::size_t taken = 0;
  std::size_t revoked = 0;

  explicit gate_policy(tp at) : open_at(at) {}
  bool exceeds(std::size_t n) const noexcept { return n > 100; }
  bool try_take(std::size_t n, tp now) noexcept {
    if (now < open_at) return false;
    taken += n;
    return true;
  }
  tp ready_at(std::size_t, tp) const noexcept { return open_at; }
  std::optional<tp> predict(std::size_t, std::size_t, tp) const noexcept { return open_at; }
  void on_release(std::size_t, std::chrono::nanoseconds, rein::outcome, tp) noexcept {}
};

// The same rule, with refunds: a grant taken back before its handler ran is undone.
struct refunding_gate_policy : gate_policy {
  using gate_policy::gate_policy;
  void on_revoke(std::size_t n, tp) noexcept {
    taken -= n;
    revoked += n;
  }
};

// The seam is a concept: a policy that lacks a member is refused with one readable message.
struct no_predict_policy {
  static constexpr bool needs_time = true;
  bool exceeds(std::size_t) const noexcept { return false; }
  bool try_take(std::size_t, tp) noexcept { return true; }
  tp ready_at(std::size_t, tp now) const noexcept { return now; }
  void on_release(std::size_t, std::chrono::nanoseconds, rein::outcome, tp) noexcept {}
};
static_assert(rein::detail::admission_policy<gate_policy, tp>);
static_assert(!rein::detail::admission_policy<no_predict_policy, tp>);
static_assert(!rein::detail::revocable_policy<gate_policy, tp>);
static_assert(rein::detail::revocable_policy<refunding_gate_policy, tp>);

template <class Policy>
using rate_core = rein::detail::limiter_core<Policy, net::any_io_executor, manual_clock, std::mutex, void(error_code)>;

// Owns a core as a limiter does: shut down on destruction.
template <class Core>
struct limiter {
  std::shared_ptr<Core> core;
  template <class... Args>
  explicit limiter(net::io_context& io, std::size_t max_waiters, Args&&... args)
      : core(std::make_shared<Core>(io.get_executor(), rein::detail::line_options{max_waiters},
                                    std::forward<Args>(args)...)) {}
  limiter(const limiter&) = delete;
  limiter& operator=(const limiter&) = delete;
  ~limiter() { core->shutdown(); }
  Core* operator->() const { return core.get(); }
};

using rate_record = rein_test::completion_record<error_code>;

template <class Core>
std::shared_ptr<rate_record> start(limiter<Core>& l, std::size_t n, tp deadline = tp::max()) {
  auto [handler, done] = rein_test::make_checked<error_code>();
  l->async_acquire(std::move(handler), n, deadline);
  return done;
}

template <class Core>
std::shared_ptr<rate_record> start(limiter<Core>& l, std::size_t n, net::cancellation_signal& signal) {
  auto [handler, done] = rein_test::make_checked<error_code>();
  l->async_acquire(net::bind_cancellation_slot(signal.slot(), std::move(handler)), n, tp::max());
  return done;
}

bool ok(const std::shared_ptr<rate_record>& r) { return r->called() && !r->ec(); }
bool failed_with(const std::shared_ptr<rate_record>& r, const error_code& ec) { return r->called() && r->ec() == ec; }

// A steady clock that counts how often it is read.
struct counting_clock {
  using duration = std::chrono::steady_clock::duration;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<counting_clock, duration>;
  [[maybe_unused]] static constexpr bool is_steady = true;
  static inline std::atomic<long> reads{0};
  static time_point now() noexcept {
    reads.fetch_add(1);
    return time_point(std::chrono::steady_clock::now().time_since_epoch());
  }
};

// The manual time in whole seconds: a clock coarser than nanoseconds, whose far instants do not fit in
// nanoseconds since the epoch.
struct seconds_clock {
  using duration = std::chrono::seconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<seconds_clock, duration>;
  [[maybe_unused]] static constexpr bool is_steady = false;
  static time_point now() noexcept {
    return time_point(std::chrono::duration_cast<duration>(manual_clock::now().time_since_epoch()));
  }
};

}  // namespace

// ---- op_queue and ready_list ----------------------------------------------------------------------------

TEST_CASE("op_queue: FIFO with O(1) unlink at the front, middle and back", "[core]") {
  std::deque<wait_op> ops(5);
  op_queue q;
  CHECK(q.empty());
  for (auto& op : ops) q.push_back(&op);
  CHECK(q.size() == 5);
  q.erase(&ops[0]);  // front
  q.erase(&ops[2]);  // middle
  q.erase(&ops[4]);  // back
  CHECK(q.size() == 2);
  CHECK(q.front() == &ops[1]);
  CHECK(q.front()->next == &ops[3]);
  CHECK(ops[3].next == nullptr);
  CHECK(ops[3].prev == &ops[1]);
  q.erase(&ops[1]);
  q.erase(&ops[3]);
  CHECK(q.empty());
  CHECK(q.front() == nullptr);
  q.push_back(&ops[2]);
  CHECK(q.front() == &ops[2]);
  CHECK(q.size() == 1);
}

TEST_CASE("a parked op costs 56 bytes plus its handler on a 64-bit target, 48 more with a deadline", "[core]") {
  // The budget is 64 bytes per parked waiter beyond the coroutine frames; use_awaitable's handler is one
  // pointer (the coroutine doors' deferred one is two). Only an op with a deadline carries a heap node.
  using op_type = rein::detail::basic_wait_op<net::detail::awaitable_handler<net::any_io_executor, error_code, rein::permit>,
                                              net::any_io_executor, void(error_code, rein::permit)>;
  if constexpr (sizeof(void*) == 8) {
    CHECK(sizeof(wait_op) == 56);
    CHECK(sizeof(rein::detail::deadline_node) == 48);
    CHECK(sizeof(rein::detail::fair_node) == 72);  // a fair line's op: room for a deadline, its tag, key, weight
  }
  CHECK(sizeof(op_type) == sizeof(wait_op) + sizeof(void*));
  CHECK(sizeof(rein::detail::node_block<op_type, rein::detail::deadline_node>) ==
        sizeof(rein::detail::deadline_node) + sizeof(op_type));
  CHECK(sizeof(rein::detail::node_block<op_type, rein::detail::fair_node>) ==
        sizeof(rein::detail::fair_node) + sizeof(op_type));
}

// ---- spare_allocator ---------------------------------------------------------------------------------

// Under AddressSanitizer the spares are off (every op gets a fresh block), so these tests do not apply.
#if REIN_SPARE_BLOCKS != 0

namespace {
struct block_of_72 {
  char bytes[72];
};
struct over_aligned_block {
  alignas(64) char bytes[64];
};
}  // namespace

TEST_CASE("spare_allocator keeps up to 8 freed blocks per thread and hands the latest out first", "[core]") {
  rein::detail::spare_allocator<block_of_72> alloc;
  std::vector<block_of_72*> blocks;
  for (int i = 0; i < 9; ++i) blocks.push_back(alloc.allocate(1));
  for (block_of_72* b : blocks) alloc.deallocate(b, 1);  // the ninth goes back to operator delete
  for (int i = 7; i >= 0; --i) CHECK(alloc.allocate(1) == blocks[static_cast<std::size_t>(i)]);
  for (int i = 0; i < 8; ++i) alloc.deallocate(blocks[static_cast<std::size_t>(i)], 1);
}

TEST_CASE("spare_allocator: another thread's spares are its own, an array bypasses them, alignment is kept",
          "[core]") {
  rein::detail::spare_allocator<block_of_72> alloc;
  block_of_72* mine = alloc.allocate(1);
  alloc.deallocate(mine, 1);
  block_of_72* theirs = nullptr;
  std::thread([&] {
    theirs = alloc.allocate(1);  // this thread has no spare: a fresh block
    alloc.deallocate(theirs, 1);  // freed when the thread ends
  }).join();
  CHECK(theirs != mine);
  block_of_72* array = alloc.allocate(2);
  CHECK(array != mine);
  alloc.deallocate(array, 2);
  CHECK(alloc.allocate(1) == mine);
  alloc.deallocate(mine, 1);
  rein::detail::spare_allocator<over_aligned_block> aligned;
  over_aligned_block* a = aligned.allocate(1);
  CHECK(reinterpret_cast<std::uintptr_t>(a) % 64 == 0);
  aligned.deallocate(a, 1);
  CHECK(aligned.allocate(1) == a);
  aligned.deallocate(a, 1);
}

TEST_CASE("a parked op whose handler has no allocator lives in the thread's latest spare block", "[core]") {
  net::io_context io;
  rein::single_thread_semaphore sem(io, 1);
  rein::permit held = sem.try_acquire();
  auto handler = [](error_code, rein::permit) {};
  using op_type = rein::detail::basic_wait_op<decltype(handler), net::any_io_executor, void(error_code, rein::permit), false>;
  rein::detail::spare_allocator<op_type> spares;
  op_type* x = spares.allocate(1);
  spares.deallocate(x, 1);          // x is now the latest spare
  sem.async_acquire(1, handler);    // parks in x
  op_type* other = spares.allocate(1);
  CHECK(other != x);
  spares.deallocate(other, 1);
  held.release();
  poll(io);                         // the op ran its handler and went back to the spares
  CHECK(sem.available() == 1);
  CHECK(spares.allocate(1) == x);
  spares.deallocate(x, 1);
}
#endif

// ---- deadline_heap ----------------------------------------------------------------------------------

TEST_CASE("deadline_heap: the top is always the earliest deadline, ties in arrival order, under random use",
          "[core]") {
  for (std::uint32_t seed : {1u, 2u, 3u, 42u}) {
    DYNAMIC_SECTION("seed " << seed) {
      std::mt19937 rng(seed);
      std::deque<rein::detail::deadline_node> nodes(600);
      std::vector<rein::detail::deadline_node*> in_heap;
      std::set<std::pair<std::int64_t, std::uint32_t>> reference;
      deadline_heap heap;
      std::uint32_t seq = 0xFFFFFF00u;  // crosses the wrap-around of the serial numbers
      std::size_t next_free = 0;
      for (int step = 0; step < 20000; ++step) {
        const auto action = rng() % 3;
        if (action == 0 && next_free < nodes.size()) {
          auto* op = &nodes[next_free++];
          op->deadline_ns = static_cast<std::int64_t>(rng() % 50);  // many ties
          op->seq = seq++;
          heap.push(op);
          in_heap.push_back(op);
          reference.emplace(op->deadline_ns, op->seq - 0xFFFFFF00u);
        } else if (action == 1 && !in_heap.empty()) {
          const std::size_t i = rng() % in_heap.size();
          auto* op = in_heap[i];
          heap.erase(op);
          reference.erase({op->deadline_ns, op->seq - 0xFFFFFF00u});
          in_heap.erase(in_heap.begin() + static_cast<std::ptrdiff_t>(i));
        } else if (!in_heap.empty()) {
          auto* top = heap.top();
          REQUIRE(top != nullptr);
          const auto expected = *reference.begin();
          REQUIRE(top->deadline_ns == expected.first);
          REQUIRE(top->seq - 0xFFFFFF00u == expected.second);
          heap.erase(top);
          reference.erase(reference.begin());
          std::erase(in_heap, top);
        }
        REQUIRE(heap.empty() == reference.empty());
        if (!reference.empty()) {
          REQUIRE(heap.top()->deadline_ns == reference.begin()->first);
          REQUIRE(heap.top()->seq - 0xFFFFFF00u == reference.begin()->second);
        }
      }
    }
  }
}

// ---- limiter_core with time-based policies ------------------------------------------------------------

TEST_CASE("one timer wakes the whole line: N waiters cost one timer handler", "[core][time]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  limiter<rate_core<gate_policy>> gate(io, 1000, tp(100ms));
  std::vector<std::shared_ptr<rate_record>> waiters;
  for (int i = 0; i < 10; ++i) waiters.push_back(start(gate, 1));
  CHECK(poll(io) == 0);
  CHECK(rein_test::advance_and_poll(io, 99ms) == 0);
  CHECK(rein_test::advance_and_poll(io, 1ms) == 11);  // the timer's handler, then ten completions
  for (auto& w : waiters) CHECK(ok(w));
  CHECK(io.stopped());  // nothing else left armed
}

TEST_CASE("a deadline that the policy predicts cannot be met fails at once", "[core][time]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  limiter<rate_core<gate_policy>> gate(io, 1000, tp(100ms));
  auto hopeless = start(gate, 1, tp(99ms));
  auto just_in_time = start(gate, 1, tp(100ms));
  poll(io);
  CHECK(failed_with(hopeless, rein::errc::timed_out));
  CHECK_FALSE(just_in_time->called());
  rein_test::advance_and_poll(io, 100ms);
  CHECK(ok(just_in_time));
  const auto stats = gate->inspect([](const gate_policy&, const rein::wait_stats& s) { return s; });
  CHECK(stats.timed_out_total == 1);
  CHECK(stats.acquired_total == 1);
  CHECK(stats.wait_total == 100ms);
}

TEST_CASE("update returns what its function returns and wakes the line when the rule changes", "[core][time]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  limiter<rate_core<gate_policy>> gate(io, 1000, tp(1h));
  auto w = start(gate, 2);
  poll(io);
  const std::size_t before = gate->update([](gate_policy& p, tp now) {
    p.open_at = now;
    return p.taken;
  });
  CHECK(before == 0);
  CHECK_FALSE(w->called());  // not from inside update
  poll(io);
  CHECK(ok(w));
  CHECK(gate->inspect([](const gate_policy& p, const rein::wait_stats&) { return p.taken; }) == 2);
  CHECK(io.stopped());  // the hour-long timer was cancelled once nothing needed it
}

TEST_CASE("a grant without permits is taken back by a late cancellation if the policy can refund it",
          "[core][cancel]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  limiter<rate_core<refunding_gate_policy>> gate(io, 1000, tp(10ms));
  net::cancellation_signal signal;
  auto w = start(gate, 3, signal);
  rein_test::advance_and_poll(io, 10ms);
  REQUIRE(ok(w));  // granted and delivered
  auto late = start(gate, 3, signal);  // open now: granted at once, not yet delivered
  signal.emit(net::cancellation_type::total);
  poll(io);
  CHECK(failed_with(late, net::error::operation_aborted));
  const auto [taken, revoked] =
      gate->inspect([](const refunding_gate_policy& p, const rein::wait_stats&) { return std::pair(p.taken, p.revoked); });
  CHECK(taken == 3);
  CHECK(revoked == 3);
  const auto stats = gate->inspect([](const refunding_gate_policy&, const rein::wait_stats& s) { return s; });
  CHECK(stats.acquired_total == 1);
  CHECK(stats.cancelled_total == 1);
}

TEST_CASE("a grant without permits and without refunds is not revocable: the handler gets it", "[core][cancel]") {
  net::io_context io;
  limiter<rate_core<gate_policy>> gate(io, 1000, tp::min());
  net::cancellation_signal signal;
  auto w = start(gate, 1, signal);  // granted at once
  signal.emit(net::cancellation_type::terminal);
  poll(io);
  CHECK(ok(w));
  CHECK(gate->inspect([](const gate_policy&, const rein::wait_stats& s) { return s.cancelled_total; }) == 0);
}

TEST_CASE("a grant without permits still on its way when the limiter goes completes with operation_aborted",
          "[core][lifetime]") {
  net::io_context io;
  auto gate = std::make_unique<limiter<rate_core<gate_policy>>>(io, 1000, tp::min());
  auto w = start(*gate, 1);
  gate.reset();
  poll(io);
  CHECK(failed_with(w, net::error::operation_aborted));
}

TEST_CASE("an execution context destroyed with a refundable grant queued refunds it", "[core][lifetime]") {
  net::io_context io;
  limiter<rate_core<refunding_gate_policy>> gate(io, 1000, tp::min());
  auto other = std::make_unique<net::io_context>();
  auto [handler, lost] = rein_test::make_checked<error_code>();
  lost->may_be_destroyed_uncalled = true;
  gate->async_acquire(net::bind_executor(other->get_executor(), std::move(handler)), 4, tp::max());
  CHECK(gate->inspect([](const refunding_gate_policy& p, const rein::wait_stats&) { return p.taken; }) == 4);
  other.reset();
  CHECK(gate->inspect([](const refunding_gate_policy& p, const rein::wait_stats&) { return p.taken; }) == 0);
}

namespace {

// An initiating function over the core, as a rate limiter has: `void(error_code)`.
template <class Core, class Token>
auto async_gate(Core& core, std::size_t n, Token&& token) {
  return net::async_initiate<Token, void(error_code)>(
      [&core](auto handler, std::size_t count) { core.async_acquire(std::move(handler), count, tp::max()); }, token, n);
}

}  // namespace

TEST_CASE("every completion token works for a limiter without permits, at once and after a wait", "[core][tokens]") {
  for (auto kind : rein_test::poll_tokens) {
    DYNAMIC_SECTION(rein_test::name(kind)) {
      rein_test::manual_clock_at_epoch epoch;
      net::io_context io;
      limiter<rate_core<gate_policy>> gate(io, 1, tp(5ms));
      auto [h1, later] = rein_test::make_checked<error_code>();
      rein_test::launch(kind, io, [&gate](auto token) { return async_gate(*gate.core, 1, std::move(token)); },
                        std::move(h1));
      auto [h2, full] = rein_test::make_checked<error_code>();
      rein_test::launch(kind, io, [&gate](auto token) { return async_gate(*gate.core, 1, std::move(token)); },
                        std::move(h2));
      poll(io);
      CHECK_FALSE(later->called());
      CHECK(failed_with(full, rein::errc::queue_full));
      rein_test::advance_and_poll(io, 5ms);
      CHECK(ok(later));
      auto [h3, now] = rein_test::make_checked<error_code>();
      rein_test::launch(kind, io, [&gate](auto token) { return async_gate(*gate.core, 1, std::move(token)); },
                        std::move(h3));
      poll(io);
      CHECK(ok(now));
    }
  }
}

TEST_CASE("max_waiters and close apply to every limiter built on the core", "[core]") {
  net::io_context io;
  limiter<rate_core<gate_policy>> gate(io, 1, tp::max());
  auto first = start(gate, 1);
  auto second = start(gate, 1);
  auto too_big = start(gate, 101);
  poll(io);
  CHECK(failed_with(second, rein::errc::queue_full));
  CHECK(failed_with(too_big, rein::errc::exceeds_capacity));
  gate->close();
  auto after = start(gate, 1);
  poll(io);
  CHECK(failed_with(first, rein::errc::closed));
  CHECK(failed_with(after, rein::errc::closed));
  std::chrono::nanoseconds stamp{};
  CHECK(gate->try_acquire(1, stamp) == rein::try_status::closed);
}

// ---- the clock ------------------------------------------------------------------------------------------

TEST_CASE("a timeless policy never reads the clock on the fast path", "[core]") {
  net::io_context io;
  rein::basic_semaphore<net::any_io_executor, counting_clock> sem(io, 2);
  const long before = counting_clock::reads.load();
  for (int i = 0; i < 100; ++i) {
    auto p = sem.try_acquire(2);
    REQUIRE(p);
  }
  CHECK(counting_clock::reads.load() == before);
  auto held = sem.try_acquire(2);
  bool got = false;
  sem.async_acquire(1, [&](error_code ec, rein::permit p) { got = !ec && p; });
  CHECK(counting_clock::reads.load() > before);  // a waiter is stamped with its arrival time
  held.release();
  poll(io);
  CHECK(got);
}

TEST_CASE("a far deadline on a clock coarser than nanoseconds saturates instead of overflowing", "[core][time]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::basic_semaphore<net::any_io_executor, seconds_clock> sem(io, 1);
  auto held = sem.try_acquire();
  auto [handler, done] = rein_test::checked_acquire();
  // 2^40 s is about 35,000 years: beyond what int64 nanoseconds can count.
  sem.async_acquire_until(1, seconds_clock::time_point(std::chrono::seconds(std::int64_t{1} << 40)), std::move(handler));
  rein_test::advance_and_poll(io, 10s);
  sem.add_permits(0);  // a dispatch: an overflowed deadline would look past and expire here
  poll(io);
  CHECK_FALSE(done->called());
  held.release();
  poll(io);
  CHECK(done->called());
  CHECK(!done->ec());
}

TEST_CASE("deadline_after saturates at both ends", "[core][time]") {
  rein_test::manual_clock_at_epoch epoch;
  manual_clock::advance(1s);
  using core = rein::detail::limiter_core<gate_policy, net::any_io_executor, manual_clock, std::mutex, void(error_code)>;
  CHECK(core::deadline_after(manual_clock::duration::max()) == tp::max());
  CHECK(core::deadline_after(manual_clock::duration::min()) == tp::min() + 1s);  // no overflow from +1 s
  CHECK(core::deadline_after(5ms) == tp(1s + 5ms));
  CHECK(core::deadline_after(-5ms) == tp(1s - 5ms));
  manual_clock::set(tp(-1s));
  CHECK(core::deadline_after(manual_clock::duration::min()) == tp::min());
  CHECK(core::deadline_after(manual_clock::duration::max()) == tp::max() - 1s);
}

// ---- queue order and the full-line policy ---------------------------------------------------------------

namespace {

using manual_semaphore = rein::basic_semaphore<net::any_io_executor, manual_clock, std::mutex>;
using manual_bucket = rein::basic_token_bucket<net::any_io_executor, manual_clock, std::mutex>;
using manual_aimd = rein::basic_adaptive_limiter<rein::algo::aimd, net::any_io_executor, manual_clock, std::mutex>;

// Records the order in which waiters were served (their index), and what each completion said.
struct service_log {
  std::vector<int> served;
  std::vector<std::pair<int, error_code>> failed;
  std::vector<rein::permit> held;

  auto waiter(int index) {
    return [this, index](error_code ec, rein::permit p) {
      if (ec) return failed.emplace_back(index, ec), void();
      served.push_back(index);
      held.push_back(std::move(p));
    };
  }
  auto rate_waiter(int index) {
    return [this, index](error_code ec) {
      if (ec) return failed.emplace_back(index, ec), void();
      served.push_back(index);
    };
  }
};

// Releases one held permit at a time, oldest grant first, polling after each.
void release_one_by_one(net::io_context& io, std::vector<rein::permit>& held, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    held.at(i).release();
    poll(io);
  }
}

}  // namespace

TEST_CASE("lifo: limit 4 held, waiters 0..4 queued in order, one release at a time: served 4, 3, 2, 1, 0",
          "[core][order]") {
  net::io_context io;
  manual_semaphore sem(io, 4, {.order = rein::queue_order::lifo});
  std::vector<rein::permit> holders;
  for (int i = 0; i < 4; ++i) holders.push_back(sem.try_acquire());
  service_log log;
  for (int i = 0; i < 5; ++i) sem.async_acquire(1, log.waiter(i));
  poll(io);
  REQUIRE(log.served.empty());
  CHECK(sem.snapshot().waiting == 5);
  for (auto& h : holders) {
    h.release();
    poll(io);
  }
  CHECK(log.served == std::vector<int>{4, 3, 2, 1});
  log.held.at(0).release();
  poll(io);
  CHECK(log.served == std::vector<int>{4, 3, 2, 1, 0});
  CHECK(log.failed.empty());
}

TEST_CASE("fifo (the default) serves the same waiters 0, 1, 2, 3, 4", "[core][order]") {
  net::io_context io;
  manual_semaphore sem(io, 4);
  std::vector<rein::permit> holders;
  for (int i = 0; i < 4; ++i) holders.push_back(sem.try_acquire());
  service_log log;
  for (int i = 0; i < 5; ++i) sem.async_acquire(1, log.waiter(i));
  poll(io);
  release_one_by_one(io, holders, 4);
  log.held.at(0).release();
  poll(io);
  CHECK(log.served == std::vector<int>{0, 1, 2, 3, 4});
}

TEST_CASE("lifo: a newcomer that fits is served at once, ahead of a weighted waiter; fifo keeps it behind",
          "[core][order]") {
  for (const auto order : {rein::queue_order::fifo, rein::queue_order::lifo}) {
    DYNAMIC_SECTION(rein::to_string(order)) {
      net::io_context io;
      manual_semaphore sem(io, 2, {.order = order});
      rein::permit one = sem.try_acquire();
      service_log log;
      sem.async_acquire(2, log.waiter(0));  // needs both: waits for `one`
      sem.async_acquire(1, log.waiter(1));  // fits in the free permit
      poll(io);
      if (order == rein::queue_order::lifo) {
        CHECK(log.served == std::vector<int>{1});
      } else {
        CHECK(log.served.empty());  // head-of-line: the weighted head is not passed
      }
      one.release();
      if (order == rein::queue_order::lifo) log.held.at(0).release();
      poll(io);
      CHECK(log.served == (order == rein::queue_order::lifo ? std::vector<int>{1, 0} : std::vector<int>{0}));
    }
  }
}

TEST_CASE("evict_oldest: a full line takes the newcomer and fails its longest waiter with queue_full",
          "[core][order]") {
  for (const auto order : {rein::queue_order::fifo, rein::queue_order::lifo}) {
    DYNAMIC_SECTION(rein::to_string(order)) {
      net::io_context io;
      manual_semaphore sem(io, 1,
                           {.max_waiters = 2, .order = order, .when_full = rein::queue_full_policy::evict_oldest});
      rein::permit held = sem.try_acquire();
      service_log log;
      for (int i = 0; i < 4; ++i) sem.async_acquire(1, log.waiter(i));  // 0 and 1 are evicted in turn
      poll(io);
      REQUIRE(log.failed.size() == 2);
      CHECK(log.failed[0] == std::pair<int, error_code>(0, rein::errc::queue_full));
      CHECK(log.failed[1] == std::pair<int, error_code>(1, rein::errc::queue_full));
      const auto s = sem.snapshot();
      CHECK(s.waiting == 2);
      CHECK(s.queue_full_total == 2);
      CHECK(s.rejected_total == 2);
      held.release();
      poll(io);
      log.held.at(0).release();
      poll(io);
      CHECK(log.served == (order == rein::queue_order::lifo ? std::vector<int>{3, 2} : std::vector<int>{2, 3}));
    }
  }
}

TEST_CASE("reject_newest (the default) refuses the newcomer; evict_oldest with max_waiters 0 refuses too",
          "[core][order]") {
  net::io_context io;
  manual_semaphore refusing(io, 0, {.max_waiters = 1});
  manual_semaphore evicting(io, 0, {.max_waiters = 0, .when_full = rein::queue_full_policy::evict_oldest});
  service_log log;
  refusing.async_acquire(1, log.waiter(0));
  refusing.async_acquire(1, log.waiter(1));
  evicting.async_acquire(1, log.waiter(2));
  poll(io);
  CHECK(log.failed ==
        std::vector<std::pair<int, error_code>>{{1, rein::errc::queue_full}, {2, rein::errc::queue_full}});
  CHECK(refusing.snapshot().waiting == 1);
}

TEST_CASE("evicting a weighted head lets the waiters behind it in at once", "[core][order]") {
  net::io_context io;
  manual_semaphore sem(io, 3, {.max_waiters = 2, .when_full = rein::queue_full_policy::evict_oldest});
  rein::permit one = sem.try_acquire();
  service_log log;
  sem.async_acquire(3, log.waiter(0));  // the head: needs all three
  sem.async_acquire(1, log.waiter(1));  // fits, but waits behind the head
  poll(io);
  REQUIRE(log.served.empty());
  sem.async_acquire(1, log.waiter(2));  // the line is full: 0 leaves, 1 and 2 fit in the two free permits
  poll(io);
  CHECK(log.failed == std::vector<std::pair<int, error_code>>{{0, rein::errc::queue_full}});
  CHECK(log.served == std::vector<int>{1, 2});
  CHECK(sem.available() == 0);
}

TEST_CASE("lifo on a token bucket: the newest waiter takes each new token; deadlines see nobody ahead",
          "[core][order][time]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  for (const auto order : {rein::queue_order::fifo, rein::queue_order::lifo}) {
    DYNAMIC_SECTION(rein::to_string(order)) {
      manual_clock::reset();
      manual_bucket bucket(io, {.rate = 1, .capacity = 1, .initial_tokens = 0}, {.order = order});
      service_log log;
      for (int i = 0; i < 3; ++i) bucket.async_acquire(1, log.rate_waiter(i));
      // Three tokens are promised ahead in fifo order: a fourth by 1.5 s cannot be met and fails at once;
      // in lifo order it is the next to be served, at 1 s.
      bucket.async_acquire_for(1, 1500ms, log.rate_waiter(3));
      poll(io);
      if (order == rein::queue_order::fifo) {
        CHECK(log.failed == std::vector<std::pair<int, error_code>>{{3, rein::errc::timed_out}});
      } else {
        CHECK(log.failed.empty());
      }
      for (int s = 0; s < 4; ++s) rein_test::advance_and_poll(io, 1s);
      CHECK(log.served ==
            (order == rein::queue_order::lifo ? std::vector<int>{3, 2, 1, 0} : std::vector<int>{0, 1, 2}));
    }
  }
}

TEST_CASE("lifo on an adaptive limiter: limit 2 held, waiters 0..2, releases serve 2, 1, 0", "[core][order]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::algo::aimd_options fixed_two;
  fixed_two.initial_limit = 2;
  fixed_two.min_limit = 2;
  fixed_two.max_limit = 2;
  manual_aimd limiter(io, fixed_two, {.order = rein::queue_order::lifo});
  std::vector<rein::permit> holders;
  for (int i = 0; i < 2; ++i) holders.push_back(limiter.try_acquire());
  service_log log;
  for (int i = 0; i < 3; ++i) limiter.async_acquire(1, log.waiter(i));
  poll(io);
  release_one_by_one(io, holders, 2);
  log.held.at(0).release();
  poll(io);
  CHECK(log.served == std::vector<int>{2, 1, 0});
}

TEST_CASE("lifo: a newcomer that becomes the head is granted at its own time, not the old head's",
          "[core][order][time]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  manual_bucket bucket(io, {.rate = 1, .capacity = 10, .initial_tokens = 0}, {.order = rein::queue_order::lifo});
  service_log log;
  bucket.async_acquire(10, log.rate_waiter(0));  // ready at 10 s
  bucket.async_acquire(1, log.rate_waiter(1));   // the new head: ready at 1 s
  poll(io);
  rein_test::advance_and_poll(io, 1s);
  CHECK(log.served == std::vector<int>{1});
  for (int s = 0; s < 10; ++s) rein_test::advance_and_poll(io, 1s);
  CHECK(log.served == std::vector<int>{1, 0});
  CHECK(rein_test::since_epoch() == 11s);
}

TEST_CASE("evict_oldest: a deadline is judged without the waiter the newcomer evicts", "[core][order][time]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  manual_bucket bucket(io, {.rate = 1, .capacity = 1, .initial_tokens = 0},
                       {.max_waiters = 2, .when_full = rein::queue_full_policy::evict_oldest});
  service_log log;
  bucket.async_acquire(1, log.rate_waiter(0));
  bucket.async_acquire(1, log.rate_waiter(1));
  // With 0 evicted, one waiter is ahead: served at 2 s, within 2.5 s.
  bucket.async_acquire_for(1, 2500ms, log.rate_waiter(2));
  poll(io);
  CHECK(log.failed == std::vector<std::pair<int, error_code>>{{0, rein::errc::queue_full}});
  rein_test::advance_and_poll(io, 1s);
  rein_test::advance_and_poll(io, 1s);
  CHECK(log.served == std::vector<int>{1, 2});
  CHECK(log.failed.size() == 1);
}

// ---- priority classes with aging ------------------------------------------------------------------------

namespace {

constexpr auto priority = rein::queue_order::priority;

// The stream of the bound test: `backlog` class-0 waiters and one class-1 waiter at 0 ms; from then on one
// class-0 arrival and one release every 10 ms (arrivals as fast as the service: the line never drains).
// Returns the service order; the class-1 waiter is -1, class-0 waiters count from 0.
std::vector<int> serve_saturated(manual_semaphore::duration aging, int backlog, int rounds) {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  manual_semaphore sem(io, 1, {.order = priority, .priority_aging = aging});
  rein::permit held = sem.try_acquire();
  service_log log;
  int next = 0;
  for (; next < backlog; ++next) sem.async_acquire(1, log.waiter(next));
  sem.at_priority(1).async_acquire(1, log.waiter(-1));
  poll(io);
  for (int round = 0; round < rounds; ++round) {
    rein_test::advance_and_poll(io, 10ms);
    sem.async_acquire(1, log.waiter(next++));
    if (round == 0) held.release();
    else log.held.at(static_cast<std::size_t>(round - 1)).release();
    poll(io);
  }
  return log.served;
}

}  // namespace

TEST_CASE("priority with aging: a class-1 waiter at t is served right after the class-0 arrivals before t + aging",
          "[core][order][priority][time]") {
  // The documented bound, exactly: a class-c waiter that arrives at t is served before every class-0 waiter
  // arriving at or after t + c * aging (an equal key goes to the earlier arrival), however long the stream.
  // Here t = 0, aging 50 ms: class-0 arrivals at 10..40 ms (waiters 3..6) are keyed ahead of it, the one at
  // 50 ms (waiter 7) is not.
  CHECK(serve_saturated(50ms, 3, 12) == std::vector<int>{0, 1, 2, 3, 4, 5, 6, -1, 7, 8, 9, 10});
  // Aging 0 is fifo; duration::max() is strict priority: under the stream the class-1 waiter is never served.
  CHECK(serve_saturated(0ms, 3, 6) == std::vector<int>{0, 1, 2, -1, 3, 4});
  const std::vector<int> strict = serve_saturated(manual_semaphore::duration::max(), 3, 12);
  CHECK(strict == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
}

TEST_CASE("priority keys are exact at any aging and before the clock's epoch: classes never collapse",
          "[core][order][priority][time]") {
  rein_test::manual_clock_at_epoch epoch;
  using arrival = std::pair<std::uint8_t, manual_semaphore::duration>;  // (class, arrival time)
  const auto serve = [](manual_semaphore::duration aging, const std::vector<arrival>& arrivals) {
    net::io_context io;
    // Untimed: a wait from -2^62 to +2^62 ns is beyond what the wait statistics can count.
    manual_semaphore sem(io, 1, {.order = priority, .priority_aging = aging, .measure_wait = false});
    rein::permit held = sem.try_acquire();
    service_log log;
    for (std::size_t i = 0; i < arrivals.size(); ++i) {
      manual_clock::set(tp(arrivals[i].second));
      sem.at_priority(arrivals[i].first).async_acquire(1, log.waiter(static_cast<int>(i)));
    }
    poll(io);
    held.release();
    poll(io);
    for (std::size_t i = 0; i + 1 < arrivals.size(); ++i) {
      log.held.at(i).release();
      poll(io);
    }
    return log.served;
  };
  constexpr auto max = manual_semaphore::duration::max();
  // Strict priority: class 2 at 0, class 1 at 1 ms, class 0 at 2 ms: served 2, 1, 0 (by class, not arrival).
  CHECK(serve(max, {{2, 0ms}, {1, 1ms}, {0, 2ms}}) == std::vector<int>{2, 1, 0});
  CHECK(serve(max, {{255, 0ms}, {254, 1ms}, {3, 2ms}}) == std::vector<int>{2, 1, 0});
  // aging 2^62 ns: class 3 at 0 and class 2 at 1 ms, whose keys differ by 2^62 - 1 ms.
  const manual_semaphore::duration huge(std::int64_t{1} << 62);
  CHECK(serve(huge, {{3, 0ms}, {2, 1ms}}) == std::vector<int>{1, 0});
  // Before the epoch: class 2 at -2^62 ns is keyed at +2^62 ns; a class-0 waiter 1 us later than that
  // comes after it, one 1 us earlier before it.
  CHECK(serve(huge, {{2, -huge}, {0, huge + 1us}}) == std::vector<int>{0, 1});
  CHECK(serve(huge, {{2, -huge}, {0, huge - 1us}}) == std::vector<int>{1, 0});
}

TEST_CASE("priority: an urgent newcomer placed at the head is served if it fits; a later class waits its turn",
          "[core][order][priority]") {
  net::io_context io;
  manual_semaphore sem(io, 2, {.order = priority});
  rein::permit one = sem.try_acquire();
  service_log log;
  sem.at_priority(1).async_acquire(2, log.waiter(0));  // needs both permits: waits for `one`
  sem.at_priority(2).async_acquire(1, log.waiter(1));  // fits, but is keyed behind the head
  sem.async_acquire(1, log.waiter(2));                 // class 0: the new head, and it fits
  poll(io);
  CHECK(log.served == std::vector<int>{2});
  CHECK(sem.snapshot().waiting == 2);
  one.release();
  log.held.at(0).release();
  poll(io);
  CHECK(log.served == std::vector<int>{2, 0});
  log.held.at(1).release();
  poll(io);
  CHECK(log.served == std::vector<int>{2, 0, 1});
}

TEST_CASE("priority with evict_oldest: an urgent newcomer evicts the last waiter; one that would be last is refused",
          "[core][order][priority]") {
  net::io_context io;
  manual_semaphore sem(io, 1,
                       {.max_waiters = 2, .order = priority, .when_full = rein::queue_full_policy::evict_oldest});
  rein::permit held = sem.try_acquire();
  service_log log;
  sem.at_priority(1).async_acquire(1, log.waiter(0));
  sem.at_priority(1).async_acquire(1, log.waiter(1));
  sem.async_acquire(1, log.waiter(2));                 // class 0 on a full line: 1 (the last) leaves
  sem.at_priority(2).async_acquire(1, log.waiter(3));  // would be last: refused
  poll(io);
  CHECK(log.failed ==
        std::vector<std::pair<int, error_code>>{{1, rein::errc::queue_full}, {3, rein::errc::queue_full}});
  CHECK(sem.snapshot().queue_full_total == 2);
  held.release();
  poll(io);
  log.held.at(0).release();
  poll(io);
  CHECK(log.served == std::vector<int>{2, 0});
}

TEST_CASE("priority on a token bucket: a deadline counts only the units keyed ahead of the newcomer",
          "[core][order][priority][time]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  manual_bucket bucket(io, {.rate = 1, .capacity = 1, .initial_tokens = 0}, {.order = priority});
  service_log log;
  for (int i = 0; i < 3; ++i) bucket.at_priority(1).async_acquire(1, log.rate_waiter(i));
  // Class 0 within 1.5 s: nobody is keyed ahead (the class-1 keys are 1 s later), so its token at 1 s
  // meets the deadline; the same request at class 1 has three tokens ahead and fails at once.
  bucket.async_acquire_for(1, 1500ms, log.rate_waiter(3));
  bucket.at_priority(1).async_acquire_for(1, 1500ms, log.rate_waiter(4));
  poll(io);
  CHECK(log.failed == std::vector<std::pair<int, error_code>>{{4, rein::errc::timed_out}});
  for (int s = 0; s < 4; ++s) rein_test::advance_and_poll(io, 1s);
  CHECK(log.served == std::vector<int>{3, 0, 1, 2});
}

TEST_CASE("priority on an adaptive limiter, through the coroutine door", "[core][order][priority]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::algo::aimd_options fixed_one;
  fixed_one.initial_limit = 1;
  fixed_one.min_limit = 1;
  fixed_one.max_limit = 1;
  manual_aimd limiter(io, fixed_one, {.order = priority});
  rein::permit held = limiter.try_acquire();
  std::vector<int> served;
  auto waiter = [&](int index, std::uint8_t c) -> net::awaitable<void> {
    rein::permit p = co_await limiter.at_priority(c).acquire();
    served.push_back(index);
    p.release();
  };
  net::co_spawn(io, waiter(0, 2), net::detached);
  net::co_spawn(io, waiter(1, 1), net::detached);
  net::co_spawn(io, waiter(2, 0), net::detached);
  poll(io);
  held.release();
  poll(io);
  CHECK(served == std::vector<int>{2, 1, 0});
}

TEST_CASE("at_priority needs priority order; a negative priority_aging is refused, both naming the limiter",
          "[core][order][priority]") {
  net::io_context io;
  manual_semaphore fifo(io, 1, {.name = "db"});
  CHECK_THROWS_WITH(fifo.at_priority(1),
                    "rein::semaphore \"db\": at_priority needs line_options.order = queue_order::priority, got fifo");
  CHECK_THROWS_WITH(manual_semaphore(io, 1, {.order = priority, .priority_aging = -1ns}),
                    "rein::semaphore: priority_aging must be >= 0, got -1 ns");
  CHECK_THROWS_WITH(manual_bucket(io, {.rate = 1, .capacity = 1}, {.name = "api", .priority_aging = -5ms}),
                    "rein::token_bucket \"api\": priority_aging must be >= 0, got -5000000 ns");
  manual_bucket lifo(io, {.rate = 1, .capacity = 1}, {.order = rein::queue_order::lifo});
  CHECK_THROWS_WITH(lifo.at_priority(0),
                    "rein::token_bucket: at_priority needs line_options.order = queue_order::priority, got lifo");
  using manual_adaptive_rate = rein::basic_adaptive_rate_limiter<net::any_io_executor, manual_clock, std::mutex>;
  CHECK_THROWS_WITH(manual_adaptive_rate(io, {.initial_rate = 10}, {.name = "llm", .priority_aging = -1ns}),
                    "rein::adaptive_rate_limiter \"llm\": priority_aging must be >= 0, got -1 ns");
  manual_semaphore prioritized(io, 1, {.order = priority});
  CHECK(prioritized.at_priority(3).priority() == 3);
}

TEST_CASE("priority order against a model: every grant goes to the smallest (arrival + class x aging, arrival)",
          "[core][order][priority][time]") {
  // Randomized: 200 runs of 300 steps on a semaphore of 1..3 permits, classes 0..3, aging 0..40 ms, mixed
  // with arrivals, releases, cancellations and clock steps; the model is a set ordered by (key, arrival).
  // Each grant must be the model's first waiter. Not exhaustive: a property test at small scale.
  rein_test::manual_clock_at_epoch epoch;
  std::mt19937 rng(20261202);
  for (int run = 0; run < 200; ++run) {
    manual_clock::reset();
    net::io_context io;
    const auto aging = std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 4)(rng) * 10);
    const std::size_t permits = std::uniform_int_distribution<std::size_t>(1, 3)(rng);
    manual_semaphore sem(io, permits, {.order = priority, .priority_aging = aging});
    std::set<std::tuple<std::int64_t, int>> model;  // (key, index) of the waiters
    std::vector<std::pair<int, rein::permit>> held;  // (index, permit) of the holders
    std::vector<std::unique_ptr<net::cancellation_signal>> signals;
    std::size_t free = permits;
    int arrivals = 0;
    const auto pick = [&rng](std::size_t size) {  // a position in [0, size)
      return std::uniform_int_distribution<std::ptrdiff_t>(0, static_cast<std::ptrdiff_t>(size) - 1)(rng);
    };
    for (int step = 0; step < 300; ++step) {
      std::optional<int> expect;  // the grant this step must make
      const std::size_t holders = held.size();
      const int what = std::uniform_int_distribution<int>(0, 9)(rng);
      if (what < 5) {
        const auto c = static_cast<std::uint8_t>(std::uniform_int_distribution<int>(0, 3)(rng));
        const int index = arrivals++;
        const std::int64_t key = rein_test::since_epoch().count() + c * std::chrono::nanoseconds(aging).count();
        signals.push_back(std::make_unique<net::cancellation_signal>());
        sem.at_priority(c).async_acquire(
            1, net::bind_cancellation_slot(signals.back()->slot(), [&held, index](error_code ec, rein::permit p) {
              if (!ec) held.emplace_back(index, std::move(p));
            }));
        if (free > 0) --free, expect = index;  // a free permit means nobody waits: granted at once
        else model.emplace(key, index);
      } else if (what < 8 && !held.empty()) {
        held.erase(held.begin() + pick(held.size()));  // the permit's destructor releases it
        if (model.empty()) {
          ++free;
        } else {
          expect = std::get<1>(*model.begin());
          model.erase(model.begin());
        }
      } else if (what == 8 && !model.empty()) {
        auto it = model.begin();
        std::advance(it, pick(model.size()));
        signals[static_cast<std::size_t>(std::get<1>(*it))]->emit(net::cancellation_type::terminal);
        model.erase(it);
      } else {
        manual_clock::advance(std::chrono::milliseconds(std::uniform_int_distribution<int>(1, 30)(rng)));
      }
      poll(io);
      const std::size_t released = (what >= 5 && what < 8 && holders > 0) ? 1 : 0;
      REQUIRE(held.size() == holders - released + (expect ? 1 : 0));
      if (expect) REQUIRE(held.back().first == *expect);
      REQUIRE(sem.snapshot().waiting == model.size());
    }
  }
}

TEST_CASE("a named limiter destroyed under a waiting coroutine fails it with its name, touching nothing freed",
          "[core][lifetime]") {
  net::io_context io;
  auto sem = std::make_unique<manual_semaphore>(io, 0, rein::line_options{.name = "db"});
  std::string what;
  error_code code;
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        try {
          (void)co_await sem->acquire();
        } catch (const rein::system_error& e) {
          what = e.what();
          code = e.code();
        }
      },
      net::detached);
  poll(io);
  sem.reset();  // under ASan, reading the name from the freed line after the wait would be reported here
  poll(io);
  CHECK(code == net::error::operation_aborted);
  CHECK(what.rfind("rein::semaphore \"db\"", 0) == 0);
}

// A coroutine's executor is an any_io_executor; when it holds a strand, the grant must be posted through the
// strand, not to the io_context underneath (before Asio 1.24, any_io_executor::target<T>() casts without
// checking the type, so a strand looked like a plain io_context executor and its coroutines resumed off it).
TEST_CASE("a coroutine on a strand resumes on its strand after a waited grant, a timeout and a cancellation",
          "[core][executor]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  auto strand = net::make_strand(io);
  manual_semaphore sem(io, 1);
  rein::permit held = sem.try_acquire();
  REQUIRE(held);
  std::vector<bool> on_strand;
  net::cancellation_signal cancel;
  net::co_spawn(
      strand,
      [&]() -> net::awaitable<void> {
        rein::permit p = co_await sem.async_acquire(1, net::use_awaitable);  // granted by the release below
        on_strand.push_back(strand.running_in_this_thread());
        auto [ec1, q] = co_await sem.async_acquire_for(1, 1ms, rein_test::as_tuple(net::use_awaitable));
        on_strand.push_back(strand.running_in_this_thread() && ec1 == rein::errc::timed_out);
        auto [ec2, r] = co_await sem.async_acquire(1,
            net::bind_cancellation_slot(cancel.slot(), rein_test::as_tuple(net::use_awaitable)));
        on_strand.push_back(strand.running_in_this_thread() && ec2 == net::error::operation_aborted);
      },
      net::detached);
  poll(io);
  held.release();
  poll(io);
  REQUIRE(on_strand.size() == 1);
  rein_test::advance_and_poll(io, 1ms);
  REQUIRE(on_strand.size() == 2);
  net::post(strand, [&] { cancel.emit(net::cancellation_type::terminal); });
  poll(io);
  CHECK(on_strand == std::vector<bool>{true, true, true});
}

// ---- partitions with guaranteed shares (rein/partition.hpp) --------------------------------------------

namespace {

// What one partition of a snapshot says: {guaranteed, in_flight, waiting}.
std::tuple<std::size_t, std::size_t, std::size_t> part_state(const rein::semaphore_snapshot& s, std::size_t i) {
  const rein::partition_snapshot& p = s.partitions.at(i);
  return {p.guaranteed, p.in_flight, p.waiting};
}

// The rule of rein::partition, written again as plainly as it reads: the model every line must match.
struct partition_model {
  struct waiter {
    int index;
    std::size_t partition;
    std::size_t n;
  };
  std::vector<double> shares;         // [0] is the rest
  std::size_t limit = 0;
  std::vector<std::size_t> held;      // per partition
  std::deque<waiter> line;
  std::vector<int> granted;           // indices, in grant order

  std::size_t in_flight() const {
    std::size_t total = 0;
    for (std::size_t h : held) total += h;
    return total;
  }
  std::size_t guaranteed(std::size_t p) const {
    return std::min(limit, static_cast<std::size_t>(std::floor(shares[p] * static_cast<double>(limit) + 1e-9)));
  }
  bool starved(std::size_t p) const {
    const bool waits = std::any_of(line.begin(), line.end(), [p](const waiter& w) { return w.partition == p; });
    return waits && held[p] < guaranteed(p);
  }
  bool fits(const waiter& w) const { return in_flight() + w.n <= limit; }
  void grant(std::deque<waiter>::iterator it) {
    held[it->partition] += it->n;
    granted.push_back(it->index);
    line.erase(it);
  }
  // Each starved partition's first waiter in line order is a candidate: the first that fits is served; one
  // that does not fit yet (but could at this limit) keeps the freed permits; otherwise the head, if it fits.
  void dispatch() {
    while (!line.empty()) {
      std::vector<std::size_t> seen;
      bool hold = false;
      auto chosen = line.end();
      for (auto it = line.begin(); it != line.end() && chosen == line.end(); ++it) {
        if (std::find(seen.begin(), seen.end(), it->partition) != seen.end() || !starved(it->partition)) continue;
        seen.push_back(it->partition);
        if (it->n > limit) continue;
        if (fits(*it)) chosen = it;
        else hold = true;
      }
      if (chosen != line.end()) {
        grant(chosen);
        continue;
      }
      if (hold || !fits(line.front())) return;
      grant(line.begin());
    }
  }
  void acquire(int index, std::size_t p, std::size_t n) {
    if (line.empty() && in_flight() + n <= limit) {
      held[p] += n;
      granted.push_back(index);
      return;
    }
    line.push_back({index, p, n});
    if (starved(p)) dispatch();  // served at once if its partition is below its guarantee and it fits
  }
  void release(std::size_t p, std::size_t n) {
    held[p] -= n;
    dispatch();
  }
  void cancel(int index) {
    std::erase_if(line, [index](const waiter& w) { return w.index == index; });
    dispatch();
  }
};

// A semaphore with partitions "p1".."pk" beside its model, driven by the same events.
struct partitioned_line {
  struct holder {
    int index;
    std::size_t partition;
    rein::permit permit;
  };

  net::io_context io;
  manual_semaphore sem;
  partition_model model;
  std::vector<holder> held;
  std::vector<int> granted;
  std::vector<std::unique_ptr<net::cancellation_signal>> signals;
  std::vector<int> waiting;  // indices not granted, not cancelled
  int arrivals = 0;
  std::size_t checked_grants = 0;

  partitioned_line(std::size_t limit, const std::vector<double>& shares)
      : sem(io, limit, {.partitions = named(shares)}) {
    model.shares.push_back(1.0);
    for (double s : shares) model.shares.push_back(s), model.shares[0] -= s;
    if (model.shares[0] < 0) model.shares[0] = 0;
    model.limit = limit;
    model.held.assign(shares.size() + 1, 0);
  }

  static std::vector<rein::partition> named(const std::vector<double>& shares) {
    std::vector<rein::partition> out;
    for (std::size_t i = 0; i < shares.size(); ++i) out.push_back({"p" + std::to_string(i + 1), shares[i]});
    return out;
  }

  void acquire(std::size_t p, std::size_t n = 1) {
    const int index = arrivals++;
    signals.push_back(std::make_unique<net::cancellation_signal>());
    auto handler = net::bind_cancellation_slot(signals.back()->slot(), [this, index, p](error_code ec, rein::permit q) {
      if (ec) return;
      granted.push_back(index);
      held.push_back({index, p, std::move(q)});
      std::erase(waiting, index);
    });
    if (p == 0) sem.async_acquire(n, std::move(handler));
    else sem.partition("p" + std::to_string(p)).async_acquire(n, std::move(handler));
    waiting.push_back(index);
    model.acquire(index, p, n);
  }

  // Releases the oldest permit of partition p; false if it holds none.
  bool release(std::size_t p) {
    const auto it = std::find_if(held.begin(), held.end(), [p](const holder& h) { return h.partition == p; });
    if (it == held.end()) return false;
    const std::size_t n = it->permit.count();
    held.erase(it);  // the permit's destructor gives it back
    model.release(p, n);
    return true;
  }

  // Cancels the oldest waiter; false if none waits.
  bool cancel_first() {
    if (waiting.empty()) return false;
    const int index = waiting.front();
    waiting.erase(waiting.begin());
    signals[static_cast<std::size_t>(index)]->emit(net::cancellation_type::terminal);
    model.cancel(index);
    return true;
  }

  // After each event: the same grants in the same order, the same bookkeeping, and after a grant never
  // above the limit (a lowered limit leaves holders above it until they give back).
  void check() {
    const std::size_t grants_before = checked_grants;
    poll(io);
    REQUIRE(granted == model.granted);
    checked_grants = granted.size();
    const rein::semaphore_snapshot s = sem.snapshot();
    REQUIRE(s.in_flight == model.in_flight());
    if (checked_grants != grants_before) REQUIRE(s.in_flight <= model.limit);
    REQUIRE(s.partitions.size() == model.held.size());
    for (std::size_t p = 0; p < model.held.size(); ++p) {
      const std::size_t waits = static_cast<std::size_t>(std::count_if(
          model.line.begin(), model.line.end(), [p](const partition_model::waiter& w) { return w.partition == p; }));
      REQUIRE(part_state(s, p) == std::tuple{model.guaranteed(p), model.held[p], waits});
    }
  }
};

}  // namespace

TEST_CASE("partitions: Netflix's scenario, limit 10, batch 30% and live 70%", "[core][partition]") {
  net::io_context io;
  manual_semaphore sem(io, 10, {.partitions = {{"batch", 0.3}, {"live", 0.7}}});
  auto s = sem.snapshot();
  REQUIRE(s.partitions.size() == 3);
  CHECK(s.partitions[1].name == "batch");
  CHECK(part_state(s, 1) == std::tuple{3u, 0u, 0u});
  CHECK(part_state(s, 2) == std::tuple{7u, 0u, 0u});
  CHECK(part_state(s, 0) == std::tuple{0u, 0u, 0u});  // the rest: nothing left to guarantee
  // Batch alone may take all 10 (idle capacity is lent); the 11th is refused.
  std::vector<rein::permit> batch;
  for (int i = 0; i < 10; ++i) batch.push_back(sem.partition("batch").try_acquire());
  CHECK(std::all_of(batch.begin(), batch.end(), [](const rein::permit& p) { return static_cast<bool>(p); }));
  CHECK(sem.partition("batch").try_acquire().status() == rein::try_status::busy);
  // Two more batch calls queue first, then eight live calls.
  std::vector<std::string> served;
  std::vector<rein::permit> held;
  auto start = [&](const char* who) {
    sem.partition(who).async_acquire(1, [&, who](error_code ec, rein::permit p) {
      REQUIRE(!ec);
      served.push_back(who);
      held.push_back(std::move(p));
    });
  };
  start("batch");
  start("batch");
  for (int i = 0; i < 8; ++i) start("live");
  poll(io);
  CHECK(part_state(sem.snapshot(), 1) == std::tuple{3u, 10u, 2u});
  // The next 7 releases go to live, past batch's older waiters; then the line's head (batch) is next.
  for (int i = 0; i < 8; ++i) {
    batch.pop_back();
    poll(io);
    CHECK(sem.snapshot().in_flight == 10);
  }
  CHECK(served == std::vector<std::string>{"live", "live", "live", "live", "live", "live", "live", "batch"});
  s = sem.snapshot();
  CHECK(part_state(s, 1) == std::tuple{3u, 3u, 1u});  // 2 of the first 10 left, and one queued call
  CHECK(part_state(s, 2) == std::tuple{7u, 7u, 1u});
  CHECK(s.partitions[2].acquired_total == 7);
}

TEST_CASE("partitions: the rest holds plain acquires; guarantees follow set_permits", "[core][partition]") {
  net::io_context io;
  manual_semaphore sem(io, 10, {.partitions = {{"a", 0.25}, {"b", 0.25}}});
  auto s = sem.snapshot();
  CHECK(s.partitions[0].share == 0.5);
  CHECK(part_state(s, 0) == std::tuple{5u, 0u, 0u});
  CHECK(part_state(s, 1) == std::tuple{2u, 0u, 0u});  // floor(2.5)
  rein::permit plain = sem.try_acquire(6);            // the rest borrows beyond its 5
  CHECK(part_state(sem.snapshot(), 0) == std::tuple{5u, 6u, 0u});
  sem.set_permits(20);
  s = sem.snapshot();
  CHECK(part_state(s, 0) == std::tuple{10u, 6u, 0u});
  CHECK(part_state(s, 1) == std::tuple{5u, 0u, 0u});
  // A split part goes back to its partition.
  rein::permit part = plain.split(2);
  part.release();
  CHECK(part_state(sem.snapshot(), 0) == std::tuple{10u, 4u, 0u});
}

TEST_CASE("partitions: a grant taken back by a late cancellation leaves its partition as it was",
          "[core][partition]") {
  net::io_context io;
  manual_semaphore sem(io, 2, {.partitions = {{"a", 0.5}}});
  rein::permit first = sem.partition("a").try_acquire();
  rein::permit second = sem.try_acquire();
  net::cancellation_signal cancel;
  bool aborted = false;
  sem.partition("a").async_acquire(1, net::bind_cancellation_slot(cancel.slot(), [&](error_code ec, rein::permit p) {
    aborted = ec == net::error::operation_aborted && !p;
  }));
  first.release();                                 // granted to the waiter of "a"; its handler has not run
  CHECK(part_state(sem.snapshot(), 1) == std::tuple{1u, 1u, 0u});
  cancel.emit(net::cancellation_type::terminal);   // taken back before it runs
  poll(io);
  CHECK(aborted);
  auto s = sem.snapshot();
  CHECK(part_state(s, 1) == std::tuple{1u, 0u, 0u});
  CHECK(s.partitions[1].acquired_total == 1);  // the try_acquire; the revoked grant is not counted
  CHECK(s.available == 1);
}

TEST_CASE("partitions on an adaptive limiter: guarantees are shares of the current limit", "[core][partition]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::algo::aimd_options options;
  options.initial_limit = 10;
  options.min_limit = 1;
  options.max_limit = 10;
  options.backoff = 0.5;
  options.learn_failure_rate = false;  // one congestion outcome halves it
  manual_aimd limiter(io, options, {.partitions = {{"live", 0.7}}});
  std::vector<rein::permit> rest;
  for (int i = 0; i < 10; ++i) rest.push_back(limiter.try_acquire());
  std::vector<int> served;
  auto waiter = [&](int index, bool live) -> net::awaitable<void> {
    rein::permit p;
    if (live) p = co_await limiter.partition("live").acquire();
    else p = co_await limiter.acquire();
    served.push_back(index);
    rest.push_back(std::move(p));
  };
  net::co_spawn(io, waiter(0, false), net::detached);
  net::co_spawn(io, waiter(1, true), net::detached);
  poll(io);
  auto s = limiter.snapshot();
  REQUIRE(s.partitions.size() == 2);
  CHECK(s.partitions[1].guaranteed == 7);
  rest.back().complete(rein::outcome::congestion);  // the limit halves to 5: live's guarantee is 3
  rest.pop_back();
  s = limiter.snapshot();
  CHECK(s.partitions[1].guaranteed == 3);
  CHECK(s.partitions[0].guaranteed == 1);  // floor(0.3 x 5)
  while (rest.size() > 4) rest.pop_back();   // 4 in flight, under the limit of 5: one grant, to live first
  poll(io);
  CHECK(served == std::vector<int>{1});
  CHECK(limiter.snapshot().in_flight == 5);
}

TEST_CASE("partitions: a waiter arriving below its guarantee is served at once past a head that does not fit",
          "[core][partition]") {
  net::io_context io;
  manual_semaphore sem(io, 4, {.partitions = {{"live", 0.5}}});
  rein::permit rest = sem.try_acquire(2);
  bool big = false;
  rein::permit live;
  sem.async_acquire(3, [&](error_code ec, rein::permit) { big = !ec; });  // the head: 3 of the 2 free
  sem.partition("live").async_acquire(1, [&](error_code, rein::permit p) { live = std::move(p); });
  poll(io);
  CHECK(live.count() == 1);  // live held nothing of its 2: the free permit is its
  CHECK_FALSE(big);
  CHECK(part_state(sem.snapshot(), 1) == std::tuple{2u, 1u, 0u});
  CHECK(sem.partition("live").try_acquire().status() == rein::try_status::busy);  // try never passes a waiter
}

TEST_CASE("partitions: a first waiter that does not fit holds back neither another partition nor, beyond the "
          "limit, anyone", "[core][partition]") {
  net::io_context io;
  manual_semaphore sem(io, 4, {.partitions = {{"a", 0.5}, {"b", 0.5}}});
  rein::permit rest = sem.try_acquire(4);
  std::vector<std::string> served;
  auto start = [&](const char* who, std::size_t n) {
    auto handler = [&served, who](error_code ec, rein::permit) {
      if (!ec) served.push_back(who);
    };
    if (std::string(who) == "rest") sem.async_acquire(n, handler);
    else sem.partition(who).async_acquire(n, handler);
  };
  start("a", 3);
  start("b", 1);
  rest = rest.split(2);  // 2 come back: a's 3 does not fit, b's 1 does
  poll(io);
  CHECK(served == std::vector<std::string>{"b"});
  rest.release();  // a's first waiter kept the freed permit and now fits
  poll(io);
  CHECK(served == std::vector<std::string>{"b", "a"});

  // On an adaptive limiter whose limit is 4, a starved request for 5 cannot fit: it claims nothing.
  rein_test::manual_clock_at_epoch epoch;
  rein::algo::aimd_options options;
  options.initial_limit = 4;
  options.max_limit = 10;
  manual_aimd limiter(io, options, {.partitions = {{"a", 0.5}, {"b", 0.5}}});
  rein::permit b = limiter.partition("b").try_acquire(4);
  int rest_served = 0;
  for (int i = 0; i < 2; ++i) limiter.async_acquire(1, [&](error_code ec, rein::permit) { rest_served += !ec; });
  limiter.partition("a").async_acquire(5, [](error_code, rein::permit) {});
  b.release();  // without an outcome: the limit stays 4
  poll(io);
  CHECK(rest_served == 2);
  CHECK(limiter.snapshot().partitions[1].waiting == 1);
}

TEST_CASE("partitions in lifo order: a newcomer at the head that fits is served past a request above the limit",
          "[core][partition][order]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  rein::algo::aimd_options options;
  options.initial_limit = 6;
  options.max_limit = 10;
  manual_aimd limiter(io, options, {.order = rein::queue_order::lifo, .partitions = {{"b", 0.5}, {"c", 0.5}}});
  bool big = false;
  rein::permit plain;
  limiter.partition("b").async_acquire(8, [&](error_code ec, rein::permit) { big = !ec; });  // above the limit
  limiter.async_acquire(1, [&](error_code, rein::permit p) { plain = std::move(p); });     // the rest, at the head
  poll(io);
  CHECK(plain.count() == 1);
  CHECK_FALSE(big);
  CHECK(limiter.snapshot().partitions[1].waiting == 1);
}

TEST_CASE("partitions: invalid options and names are refused, naming the limiter, field and value",
          "[core][partition]") {
  net::io_context io;
  CHECK_THROWS_WITH(manual_semaphore(io, 4, {.name = "db", .partitions = {{"", 0.5}}}),
                    "rein::semaphore \"db\": partitions[0].name must not be empty, got \"\"");
  CHECK_THROWS_WITH(manual_semaphore(io, 4, {.partitions = {{"a", 0.5}, {"a", 0.25}}}),
                    "rein::semaphore: partitions[1].name must differ from partitions[0].name, got \"a\"");
  CHECK_THROWS_WITH(manual_semaphore(io, 4, {.partitions = {{"a", 0.0}}}),
                    "rein::semaphore: partitions[0].share must be in (0, 1], got 0");
  CHECK_THROWS_WITH(manual_semaphore(io, 4, {.partitions = {{"a", 1.5}}}),
                    "rein::semaphore: partitions[0].share must be in (0, 1], got 1.5");
  CHECK_THROWS_WITH(manual_semaphore(io, 4, {.partitions = {{"a", std::nan("")}}}),
                    "rein::semaphore: partitions[0].share must be in (0, 1], got nan");
  CHECK_THROWS_WITH(manual_semaphore(io, 4, {.partitions = {{"a", 0.75}, {"b", 0.5}}}),
                    "rein::semaphore: the shares of partitions must sum to <= 1, got 1.25");
  CHECK_THROWS_WITH(manual_aimd(io, {}, {.name = "api", .partitions = {{"a", -1}}}),
                    "rein::adaptive_limiter \"api\": partitions[0].share must be in (0, 1], got -1");
  manual_semaphore plain(io, 4, {.name = "db"});
  CHECK_THROWS_WITH(plain.partition("live"),
                    "rein::semaphore \"db\": partition(name) needs line_options.partitions, which is empty, got \"live\"");
  manual_semaphore parted(io, 4, {.partitions = {{"live", 0.5}}});
  CHECK_THROWS_WITH(parted.partition("batch"),
                    "rein::semaphore: partition(name) needs a name given in line_options.partitions, got \"batch\"");
  // Shares within 1e-9 of summing to 1 are accepted (0.1 + 0.2 + 0.7 is 1.0000000000000002 in doubles).
  CHECK_NOTHROW(manual_semaphore(io, 10, {.partitions = {{"a", 0.1}, {"b", 0.2}, {"c", 0.7}}}));
}

// The quick tier (CI): 6 events, 5 under a sanitizer (several times slower); REIN_MODEL_THOROUGH=1: 7.
int partition_model_depth() { return rein_test::model_scope(6, 5, 7); }

TEST_CASE("partitions against the model, exhaustively: every sequence of 6 events over a small line",
          "[core][partition][model]") {
  // Every sequence of 6 events (the quick tier; see partition_model_depth) from {acquire in the rest, in
  // p1, in p2; release the oldest permit of the rest, of p1, of p2; cancel the oldest waiter} on a limit of
  // 2 and of 3 with shares {0.5, 0.5} and {0.34, 0.33} (guarantees 1/1 and, at limit 3, 1/0 with a rest of
  // 1): 2 x 2 x 7^6 = 470,596 runs, each checked against the model after every event (grants in the same
  // order, each partition's guarantee, holdings and waiters, never above the limit after a grant). What it
  // covers: every interleaving of up to 6 arrivals, releases and cancellations by up to 6 callers in three
  // partitions at these limits, unit requests.
  const int depth = partition_model_depth();
  constexpr int events = 7;
  long runs = 0;
  for (std::size_t limit : {2u, 3u}) {
    for (const std::vector<double>& shares : {std::vector<double>{0.5, 0.5}, std::vector<double>{0.34, 0.33}}) {
      rein_test::for_each_sequence(depth, events, [&](long code, const std::vector<int>& sequence) {
        partitioned_line line(limit, shares);
        INFO("limit " << limit << ", events (lowest digit first, base 7) " << code);
        ++runs;
        for (int e : sequence) {
          bool acted = true;
          if (e < 3) line.acquire(static_cast<std::size_t>(e));
          else if (e < 6) acted = line.release(static_cast<std::size_t>(e - 3));
          else acted = line.cancel_first();
          if (acted) line.check();
        }
      });
    }
  }
  long per_setting = 1;
  for (int i = 0; i < depth; ++i) per_setting *= events;
  CHECK(runs == 4 * per_setting);
}

TEST_CASE("partitions against the model at scale: weighted requests, 1 to 4 partitions, changing limits",
          "[core][partition][model]") {
  // Randomized: 300 runs of 400 events, limits 1..12 (changed by set_permits now and then), 1..4
  // partitions with shares in steps of 0.05, requests of 1 or 2 permits. A property test at scale.
  std::mt19937 rng(20261202);
  for (int run = 0; run < 300; ++run) {
    const std::size_t limit = std::uniform_int_distribution<std::size_t>(2, 12)(rng);
    const std::size_t parts = std::uniform_int_distribution<std::size_t>(1, 4)(rng);
    std::vector<double> shares;
    int left = 20;
    for (std::size_t i = 0; i < parts && left > 0; ++i) {
      const int twentieths = std::uniform_int_distribution<int>(1, left)(rng);
      shares.push_back(twentieths * 0.05);
      left -= twentieths;
    }
    partitioned_line line(limit, shares);
    for (int step = 0; step < 400; ++step) {
      const int e = std::uniform_int_distribution<int>(0, 19)(rng);
      const std::size_t p = std::uniform_int_distribution<std::size_t>(0, shares.size())(rng);
      bool acted = true;
      if (e < 9) {
        line.acquire(p, std::uniform_int_distribution<std::size_t>(1, 2)(rng));
      } else if (e < 17) {
        acted = line.release(p);
      } else if (e < 19) {
        acted = line.cancel_first();
      } else {
        // A new total at least 2 (a request of 2 never exceeds it): the guarantees follow.
        const std::size_t total = std::uniform_int_distribution<std::size_t>(2, 12)(rng);
        line.sem.set_permits(total);
        line.model.limit = total;
        line.model.dispatch();
      }
      if (acted) line.check();
    }
  }
}

// ---- fair order: start-time fair queueing between keys ---------------------------------------------------

namespace {

// Callers of one key in a closed loop on a fair semaphore: each waits, holds, gives back and asks again.
// The driver releases the oldest grant, lets its caller ask again, and records who each grant went to.
struct fair_bench {
  struct holder {
    int key;
    rein::permit permit;
  };

  net::io_context io;
  rein::queue_order order;
  manual_semaphore sem;
  std::vector<std::string> names;
  std::vector<std::uint32_t> weights;
  std::vector<bool> active;  // whether the key's callers ask again after a release
  std::deque<holder> held;   // oldest grant first
  std::vector<int> grants;   // the key of every grant, in order

  fair_bench(std::size_t permits, std::vector<std::string> n, std::vector<std::uint32_t> w,
             rein::queue_order o = rein::queue_order::fair)
      : order(o), sem(io, permits, {.order = o}), names(std::move(n)), weights(std::move(w)), active(names.size(), true) {}

  void ask(int key) {
    auto done = [this, key](error_code ec, rein::permit p) {
      REQUIRE(!ec);
      grants.push_back(key);
      held.push_back({key, std::move(p)});
    };
    if (order != rein::queue_order::fair) return sem.async_acquire(1, done);
    sem.for_key(names[static_cast<std::size_t>(key)], weights[static_cast<std::size_t>(key)]).async_acquire(1, done);
  }

  void start(const std::vector<int>& callers) {  // callers[k]: how many callers key k has
    for (std::size_t k = 0; k < callers.size(); ++k)
      for (int i = 0; i < callers[k]; ++i) ask(static_cast<int>(k));
    poll(io);
  }

  // One release of the oldest grant; its caller asks again if its key is active.
  void step() {
    const int key = held.front().key;
    held.pop_front();  // the permit's destructor gives it back
    if (active[static_cast<std::size_t>(key)]) ask(key);
    poll(io);
  }

  // Per key, the fewest and the most grants in any `window` consecutive grants from index `from` on.
  std::vector<std::pair<int, int>> window_counts(std::size_t from, std::size_t window) const {
    std::vector<std::pair<int, int>> range(names.size(), {INT32_MAX, 0});
    std::vector<int> count(names.size(), 0);
    for (std::size_t i = from; i < grants.size(); ++i) {
      ++count[static_cast<std::size_t>(grants[i])];
      if (i >= from + window) --count[static_cast<std::size_t>(grants[i - window])];
      if (i + 1 >= from + window)
        for (std::size_t k = 0; k < names.size(); ++k)
          range[k] = {std::min(range[k].first, count[k]), std::max(range[k].second, count[k])};
    }
    return range;
  }

  // Jain's fairness index of the grants from `from` on, each key's count divided by its weight.
  double jain(std::size_t from) const {
    std::vector<double> x(names.size(), 0.0);
    for (std::size_t i = from; i < grants.size(); ++i)
      x[static_cast<std::size_t>(grants[i])] += 1.0 / weights[static_cast<std::size_t>(grants[i])];
    double sum = 0.0, squares = 0.0;
    for (double v : x) sum += v, squares += v * v;
    return sum * sum / (static_cast<double>(x.size()) * squares);
  }
};

}  // namespace

namespace {

// Gives back `holder`, then the oldest grant of `log`, `times` times: each release serves the next waiter.
void release_in_turn(net::io_context& io, rein::permit& holder, service_log& log, int times) {
  poll(io);
  holder.release();
  poll(io);
  for (int i = 0; i < times; ++i) {
    log.held.front().release();
    log.held.erase(log.held.begin());
    poll(io);
  }
}

}  // namespace

TEST_CASE("fair: keys of weights 1, 1, 2 on 8 permits, A with 10x the callers: 25% / 25% / 50% within one "
          "permit in any 1,000 grants",
          "[core][order][fair]") {
  fair_bench b(8, {"A", "B", "C"}, {1, 1, 2});
  b.start({60, 6, 6});  // A first: its first 8 callers take the permits at once (nobody waited)
  REQUIRE(b.grants == std::vector<int>(8, 0));
  CHECK(b.sem.snapshot().waiting == 64);
  for (int i = 0; i < 12'000; ++i) b.step();
  REQUIRE(b.grants.size() == 12'008);
  const auto range = b.window_counts(8, 1000);
  // Served in rounds of A, B, C, C: every window of 1,000 holds exactly the shares.
  CHECK(range[0] == std::pair{250, 250});
  CHECK(range[1] == std::pair{250, 250});
  CHECK(range[2] == std::pair{500, 500});
  CHECK(b.jain(8) >= 0.99999);
  // The same callers in fifo order: A takes 60 / 72 of the grants, by arrival.
  fair_bench fifo(8, {"A", "B", "C"}, {1, 1, 2}, rein::queue_order::fifo);
  fifo.start({60, 6, 6});
  for (int i = 0; i < 7'200; ++i) fifo.step();
  CHECK(fifo.window_counts(8, 7'200)[0] == std::pair{6'000, 6'000});
}

TEST_CASE("fair: with one key idle, the others split its share; back, it gets its share at once and no more",
          "[core][order][fair]") {
  fair_bench b(8, {"A", "B", "C"}, {1, 1, 2});
  b.start({60, 6, 6});
  for (int i = 0; i < 2'000; ++i) b.step();
  b.active[2] = false;  // C's callers stop asking: its 6 callers drain out of the line and the permits
  for (int i = 0; i < 100; ++i) b.step();
  const std::size_t idle_from = b.grants.size();
  for (int i = 0; i < 4'000; ++i) b.step();
  const auto idle = b.window_counts(idle_from, 1000);
  CHECK(idle[0] == std::pair{500, 500});
  CHECK(idle[1] == std::pair{500, 500});
  CHECK(idle[2] == std::pair{0, 0});
  // C comes back with 6 callers: it saved up no credit while idle (its share from the round it joins, at
  // most one request above it).
  b.active[2] = true;
  for (int i = 0; i < 6; ++i) b.ask(2);
  poll(b.io);
  const std::size_t back_from = b.grants.size();
  for (int i = 0; i < 4'000; ++i) b.step();
  const auto back = b.window_counts(back_from, 1000);
  // Within one permit of the shares in every window (C's callers, back at once, joined the round being
  // served: one round has B and C in the other order), and never more than the bound allows, one request
  // over its share, in any 8 grants.
  CHECK(back[0] == std::pair{250, 250});
  CHECK(back[1] == std::pair{250, 251});
  CHECK(back[2] == std::pair{499, 500});
  CHECK(b.window_counts(back_from, 8)[2].second == 5);
}

namespace {

// Eight callers asking 3 permits a call ("big") and eight asking 1 ("small"), more than the 6 permits hold,
// so that both keys always wait; a closed loop in `order`, 3,000 releases of the oldest grant; the permits
// each key was granted.
std::pair<std::size_t, std::size_t> big_and_small(rein::queue_order order) {
  net::io_context io;
  manual_semaphore sem(io, 6, {.order = order});
  auto start = sem.try_acquire(6);
  std::size_t big = 0, small = 0;
  std::deque<std::pair<bool, rein::permit>> held;  // (big?, permit), oldest grant first
  std::function<void(bool)> ask = [&](bool is_big) {
    auto done = [&, is_big](error_code ec, rein::permit p) {
      REQUIRE(!ec);
      (is_big ? big : small) += p.count();
      held.emplace_back(is_big, std::move(p));
    };
    const std::size_t n = is_big ? 3 : 1;
    if (order == rein::queue_order::fair) sem.for_key(is_big ? "big" : "small").async_acquire(n, done);
    else sem.async_acquire(n, done);
  };
  for (int i = 0; i < 8; ++i) ask(true), ask(false);
  poll(io);
  start.release();
  poll(io);
  for (int i = 0; i < 3'000; ++i) {
    const bool is_big = held.front().first;
    held.pop_front();  // the permit's destructor gives it back
    ask(is_big);
    poll(io);
  }
  return {big, small};
}

}  // namespace

TEST_CASE("fair: a key asking 3 permits per call gets the same permits as one asking 1, not 3 times more",
          "[core][order][fair]") {
  // In fifo order the callers take turns, so the key asking 3 a call gets 3 times the permits; in fair order
  // the two keys' permits differ by at most one request of each (3 + 1).
  const auto [fifo_big, fifo_small] = big_and_small(rein::queue_order::fifo);
  CHECK(fifo_big == 3 * fifo_small);
  const auto [big, small] = big_and_small(rein::queue_order::fair);
  CHECK(big == 2'253);  // equal, within the bound
  CHECK(small == 2'253);
}

TEST_CASE("fair: a newcomer of a key behind the others is placed ahead of their backlog; plain acquires are "
          "the key \"\"",
          "[core][order][fair]") {
  net::io_context io;
  manual_semaphore sem(io, 1, {.order = rein::queue_order::fair});
  auto holder = sem.try_acquire();
  service_log log;
  for (int i = 0; i < 4; ++i) sem.for_key("flood").async_acquire(1, log.waiter(i));  // tags 0, 1, 2, 3
  sem.for_key("quiet").async_acquire(1, log.waiter(10));                          // tag 0: after flood's 0
  sem.async_acquire(1, log.waiter(20));                                            // key "": tag 0
  sem.for_key("quiet").async_acquire(1, log.waiter(11));                          // tag 1
  release_in_turn(io, holder, log, 6);
  CHECK(log.served == std::vector<int>{0, 10, 20, 1, 11, 2, 3});
  CHECK(sem.snapshot().waiting == 0);
}

TEST_CASE("fair: plain acquires are the key \"\" at weight 1, one turn with for_key(\"\")", "[core][order][fair]") {
  net::io_context io;
  manual_semaphore sem(io, 1, {.order = rein::queue_order::fair});
  auto holder = sem.try_acquire();
  service_log log;
  for (int i = 0; i < 3; ++i) sem.for_key("").async_acquire(1, log.waiter(i));          // tags 0, 1, 2
  for (int i = 0; i < 3; ++i) sem.for_key("other").async_acquire(1, log.waiter(100 + i));  // tags 0, 1, 2
  sem.async_acquire(1, log.waiter(10));  // the key "" again: tag 3
  release_in_turn(io, holder, log, 6);
  CHECK(log.served == std::vector<int>{0, 100, 1, 101, 2, 102, 10});
}

TEST_CASE("fair: keys arriving one after another do not pass a weighted first waiter that waits to fit",
          "[core][order][fair]") {
  // A's request for all 4 permits is first in line (tag 1, V 0): new keys join the round being served
  // (tag 1, behind it), so it is served as soon as the 4 permits are back, not after every newcomer.
  net::io_context io;
  manual_semaphore sem(io, 4, {.order = rein::queue_order::fair});
  std::vector<rein::permit> holders;
  for (int i = 0; i < 4; ++i) holders.push_back(sem.try_acquire());
  service_log log;
  sem.for_key("A").async_acquire(1, log.waiter(0));  // tag 0
  sem.for_key("A").async_acquire(4, log.waiter(1));  // tag 1
  poll(io);
  holders[0].release();  // A's first waiter: V = 0; the weighted one is first now
  poll(io);
  for (int k = 0; k < 8; ++k) sem.for_key("k" + std::to_string(k)).async_acquire(1, log.waiter(10 + k));
  poll(io);
  CHECK(sem.snapshot().waiting == 9);
  for (std::size_t i = 1; i < 4; ++i) {
    holders[i].release();
    poll(io);
  }
  CHECK(log.served == std::vector<int>{0});  // 3 free: the head needs 4, and nobody passes it
  log.held.at(0).release();
  poll(io);
  CHECK(log.served == std::vector<int>{0, 1});
  log.held.at(1).release();  // its 4 permits back: the newcomers, in arrival order
  poll(io);
  CHECK(log.served == std::vector<int>{0, 1, 10, 11, 12, 13});
}

TEST_CASE("fair: the key table gives back what a flood of keys made it grow to, once the line empties",
          "[core][order][fair]") {
  rein::detail::fair_schedule f;
  for (std::uint64_t k = 1; k <= 10'000; ++k) f.admitted(k, 1, f.start_tag(k), 1);
  CHECK(f.keys() == 10'000);
  // Rebuilt whenever half full, to 4 x (keys + 1) rounded up to a power of two: last at 8,192 keys.
  CHECK(f.capacity() == 65'536);
  f.idle();
  CHECK(f.keys() == 0);
  CHECK(f.capacity() == 65'536);  // kept: the next busy period may need it again
  f.admitted(7, 1, f.start_tag(7), 1);
  CHECK(f.start_tag(7) == 1.0);
  f.idle();  // one key needed 65,536 slots: given back
  CHECK(f.capacity() == 0);
  CHECK(f.start_tag(7) == 0.0);  // level again, and working
}

TEST_CASE("fair with evict_oldest: the waiter with the latest tag leaves; a newcomer that would be last is "
          "refused",
          "[core][order][fair]") {
  net::io_context io;
  manual_semaphore sem(io, 1,
                       {.max_waiters = 3, .order = rein::queue_order::fair,
                        .when_full = rein::queue_full_policy::evict_oldest});
  auto holder = sem.try_acquire();
  service_log log;
  for (int i = 0; i < 3; ++i) sem.for_key("flood").async_acquire(1, log.waiter(i));  // tags 0, 1, 2
  sem.for_key("flood").async_acquire(1, log.waiter(3));                             // tag 3: last, refused
  sem.for_key("other").async_acquire(1, log.waiter(4));                             // tag 0: evicts flood's 2
  poll(io);
  CHECK(log.failed == std::vector<std::pair<int, error_code>>{{3, rein::errc::queue_full}, {2, rein::errc::queue_full}});
  holder.release();
  poll(io);
  release_one_by_one(io, log.held, 2);
  CHECK(log.served == std::vector<int>{0, 4, 1});
}

TEST_CASE("fair order on every line that has one: token bucket, adaptive limiter; for_key checks its order "
          "and weight",
          "[core][order][fair]") {
  net::io_context io;
  manual_clock::reset();
  manual_bucket bucket(io, {.rate = 10.0, .capacity = 1}, {.name = "api", .order = rein::queue_order::fair});
  REQUIRE(bucket.try_acquire());
  service_log log;
  for (int i = 0; i < 3; ++i) bucket.for_key("flood").async_acquire(1, log.rate_waiter(i));
  bucket.for_key("quiet").async_acquire(1, log.rate_waiter(10));
  poll(io);
  for (int i = 0; i < 4; ++i) {
    manual_clock::advance(100ms);
    poll(io);
  }
  CHECK(log.served == std::vector<int>{0, 10, 1, 2});

  rein::algo::aimd_options fixed_one;
  fixed_one.initial_limit = 1;
  fixed_one.min_limit = 1;
  fixed_one.max_limit = 1;
  manual_aimd lim(io, fixed_one, {.order = rein::queue_order::fair});
  auto p = lim.try_acquire();
  REQUIRE(p);
  service_log log2;
  lim.for_key("flood", 1).async_acquire(1, log2.waiter(0));
  lim.for_key("flood", 1).async_acquire(1, log2.waiter(1));
  lim.for_key("heavy", 2).async_acquire(1, log2.waiter(2));
  lim.for_key("heavy", 2).async_acquire(1, log2.waiter(3));
  poll(io);
  p.release();
  poll(io);
  release_one_by_one(io, log2.held, 3);
  CHECK(log2.served == std::vector<int>{0, 2, 3, 1});  // tags 0, 0, 0.5, 1

  CHECK_THROWS_WITH(bucket.at_priority(1), Catch::Contains("at_priority needs line_options.order = queue_order::priority"));
  CHECK_THROWS_MATCHES(manual_semaphore(io, 1).for_key("a"), std::invalid_argument,
                       Catch::Message("rein::semaphore: for_key needs line_options.order = queue_order::fair, got fifo"));
  CHECK_THROWS_MATCHES(bucket.for_key("a", 0), std::invalid_argument,
                       Catch::Message("rein::token_bucket \"api\": for_key's weight must be in [1, 1000000], got 0"));
  CHECK_THROWS_MATCHES(bucket.for_key("a", 1'000'001), std::invalid_argument,
                       Catch::Message("rein::token_bucket \"api\": for_key's weight must be in [1, 1000000], got 1000001"));
  CHECK_THROWS_WITH(rein::quota_gate(io, {}, {.order = rein::queue_order::fair}), Catch::Contains("got fair"));
}

namespace {

// Start-time fair queueing written from its definition, beside a fair semaphore driven by the same events.
struct fair_model {
  struct waiter {
    double tag;
    int index;
    std::size_t n;
    bool operator<(const waiter& o) const { return std::tie(tag, index) < std::tie(o.tag, o.index); }
  };
  std::size_t free = 0;
  std::size_t capacity = 0;  // a larger request fails at once (exceeds_capacity)
  double v = 0.0;
  std::map<std::string, double> finish;
  std::set<waiter> line;
  std::vector<int> granted;

  void emptied() {
    if (!line.empty()) return;
    v = 0.0;
    finish.clear();
  }
  void arrive(int index, const std::string& key, std::uint32_t w, std::size_t n) {
    if (n > capacity) return;
    if (line.empty() && free >= n) {  // nobody waits: granted at once, untagged
      free -= n;
      granted.push_back(index);
      return;
    }
    if (!line.empty()) v = std::max(v, line.begin()->tag);  // an idle key joins the round being served
    const double tag = std::max(v, finish[key]);
    finish[key] = tag + static_cast<double>(n) / w;
    line.insert(waiter{tag, index, n});  // never ahead of the first waiter: its tag is at least V
  }
  void dispatch() {
    while (!line.empty() && line.begin()->n <= free) {
      free -= line.begin()->n;
      v = std::max(v, line.begin()->tag);
      granted.push_back(line.begin()->index);
      line.erase(line.begin());
    }
    emptied();
  }
  void release(std::size_t n) {
    free += n;
    dispatch();
  }
  void cancel(int index) {  // a head that did not fit may have held back the ones behind it
    std::erase_if(line, [index](const waiter& w) { return w.index == index; });
    dispatch();
  }
};

struct fair_line {
  net::io_context io;
  manual_semaphore sem;
  fair_model model;
  std::vector<std::pair<int, rein::permit>> held;  // oldest grant first
  std::vector<int> granted;
  std::vector<std::unique_ptr<net::cancellation_signal>> signals;
  std::vector<int> waiting;
  int arrivals = 0;

  explicit fair_line(std::size_t permits) : sem(io, permits, {.order = rein::queue_order::fair}) {
    model.free = model.capacity = permits;
  }

  void acquire(const std::string& key, std::uint32_t w, std::size_t n) {
    const int index = arrivals++;
    signals.push_back(std::make_unique<net::cancellation_signal>());
    sem.for_key(key, w).async_acquire(
        n, net::bind_cancellation_slot(signals.back()->slot(), [this, index](error_code ec, rein::permit p) {
          if (ec) return;
          granted.push_back(index);
          held.emplace_back(index, std::move(p));
          std::erase(waiting, index);
        }));
    if (n <= model.capacity) waiting.push_back(index);
    model.arrive(index, key, w, n);
  }
  bool release_oldest() {
    if (held.empty()) return false;
    const std::size_t n = held.front().second.count();
    held.erase(held.begin());
    model.release(n);
    return true;
  }
  bool cancel(std::size_t which) {  // the which-th oldest waiter still waiting
    if (waiting.size() <= which) return false;
    const int index = waiting[which];
    waiting.erase(waiting.begin() + static_cast<std::ptrdiff_t>(which));
    signals[static_cast<std::size_t>(index)]->emit(net::cancellation_type::terminal);
    model.cancel(index);
    return true;
  }
  void check() {
    poll(io);
    REQUIRE(granted == model.granted);
    REQUIRE(sem.snapshot().waiting == model.line.size());
  }
};

int fair_model_depth() { return rein_test::model_scope(6, 5, 8); }

}  // namespace

TEST_CASE("fair order against the model, exhaustively: every sequence of 6 events over a small line",
          "[core][order][fair][model]") {
  // Every sequence of 6 events (the quick tier; 5 under a sanitizer, 8 with REIN_MODEL_THOROUGH=1) from
  // {acquire 1 for key a at weight 1, for key b at weight 2, 2 for key a, 1 for the plain key "", release
  // the oldest permit, cancel the oldest waiter, cancel the newest} on 1 and on 2 permits: 2 x 7^6 =
  // 235,298 runs (2 x 7^8 = 11.5 million in the thorough tier), each checked against the model after every
  // event (the same grants in the same order, the same number of waiters). What it covers: every
  // interleaving of up to 6 (8) arrivals, releases and cancellations by as many callers of three keys
  // with two weights and two request sizes, including the line emptying and starting again level.
  constexpr int events = 7;
  for (std::size_t permits : {1u, 2u}) {
    rein_test::for_each_sequence(fair_model_depth(), events, [&](long code, const std::vector<int>& sequence) {
      fair_line line(permits);
      INFO("permits " << permits << ", events (lowest digit first, base 7) " << code);
      for (int e : sequence) {
        bool acted = true;
        switch (e) {
          case 0: line.acquire("a", 1, 1); break;
          case 1: line.acquire("b", 2, 1); break;
          case 2: line.acquire("a", 1, 2); break;
          case 3: line.acquire("", 1, 1); break;
          case 4: acted = line.release_oldest(); break;
          case 5: acted = line.cancel(0); break;
          default: acted = !line.waiting.empty() && line.cancel(line.waiting.size() - 1); break;
        }
        if (acted) line.check();
      }
    });
  }
}

TEST_CASE("fair order against the model at scale: 3 to 6 permits, up to 40 keys of weights 1 to 4",
          "[core][order][fair][model]") {
  // Randomized: 300 runs of 600 events; requests of 1 to 3 permits; many keys, so that the line's key table
  // grows and is rebuilt during a busy period. A property test at scale.
  std::mt19937 rng(20261202);
  for (int run = 0; run < 300; ++run) {
    const std::size_t permits = std::uniform_int_distribution<std::size_t>(3, 6)(rng);
    const int keys = std::uniform_int_distribution<int>(1, 40)(rng);
    fair_line line(permits);
    for (int step = 0; step < 600; ++step) {
      INFO("run " << run << ", step " << step);
      const int e = std::uniform_int_distribution<int>(0, 19)(rng);
      bool acted = true;
      if (e < 10) {
        const int k = std::uniform_int_distribution<int>(0, keys - 1)(rng);
        line.acquire("k" + std::to_string(k), static_cast<std::uint32_t>(1 + k % 4),
                     std::uniform_int_distribution<std::size_t>(1, 3)(rng));
      } else if (e < 18) {
        acted = line.release_oldest();
      } else {
        acted = !line.waiting.empty() &&
                line.cancel(std::uniform_int_distribution<std::size_t>(0, line.waiting.size() - 1)(rng));
      }
      if (acted) line.check();
    }
  }
}

TEST_CASE("fair order with deadlines, close and partitions: expiry, the node's heap entry, the rest of the line",
          "[core][order][fair][time]") {
  manual_clock::reset();
  net::io_context io;
  manual_semaphore sem(io, 1, {.order = rein::queue_order::fair, .partitions = {{"live", 0.5}}});
  auto holder = sem.try_acquire();
  service_log log;
  sem.for_key("a").async_acquire_for(1, 10ms, log.waiter(0));  // tag 0, with a deadline
  sem.for_key("a").async_acquire(1, log.waiter(1));             // tag 1, none
  sem.for_key("b").async_acquire_for(1, 30ms, log.waiter(2));  // tag 0, with a deadline
  sem.partition("live").for_key("b").async_acquire(1, log.waiter(3));  // tag 1, in partition live
  poll(io);
  manual_clock::advance(10ms);
  poll(io);
  REQUIRE(log.failed.size() == 1);
  CHECK(log.failed[0] == std::pair<int, error_code>{0, rein::errc::timed_out});
  CHECK(sem.snapshot().waiting == 3);
  // live is below its guarantee (0 of floor(0.5 x 1) = 0): nothing to take first; the line goes by tag.
  holder.release();
  poll(io);
  CHECK(log.served == std::vector<int>{2});  // b's tag-0 waiter, in time: its heap entry leaves with it
  manual_clock::advance(30ms);
  poll(io);
  CHECK(log.failed.size() == 1);  // no deadline left to fire
  sem.close();
  poll(io);
  CHECK(log.failed == std::vector<std::pair<int, error_code>>{{0, rein::errc::timed_out}, {1, rein::errc::closed},
                                                              {3, rein::errc::closed}});
  CHECK(sem.snapshot().waiting == 0);
}

// ---- the sojourn rule (line_options::sojourn, CoDel) ------------------------------------------------------

namespace {

// A semaphore of `permits` whose line sheds by sojourn with target 10 ms (slough time 20 ms), interval 100 ms.
struct sojourn_line {
  net::io_context io;
  manual_semaphore sem;
  service_log log;
  std::vector<std::pair<int, tp>> failed_at;   // who failed, and when
  std::vector<std::pair<int, tp>> granted_at;  // who was granted, and when

  explicit sojourn_line(std::size_t permits, rein::algo::codel_options rule = {.target = 10ms, .interval = 100ms})
      : sem(io, permits, {.sojourn = rule}) {}

  void arrive(int index) {
    sem.async_acquire(1, [this, index](error_code ec, rein::permit p) {
      (ec ? failed_at : granted_at).emplace_back(index, manual_clock::now());
      log.waiter(index)(ec, std::move(p));
    });
    poll(io);
  }
  void at(tp t) {
    manual_clock::set(t);
    poll(io);
  }
};

tp ms_(std::int64_t n) { return tp(std::chrono::milliseconds(n)); }

}  // namespace

TEST_CASE("sojourn: a line that stood for a whole interval sheds waiters past twice the target",
          "[core][sojourn]") {
  rein_test::manual_clock_at_epoch epoch;
  sojourn_line line(1);
  rein::permit held = line.sem.try_acquire();  // held throughout: nothing drains the line
  line.arrive(1);  // joins an empty line at 0: [0, 100) drained
  line.at(ms_(50));
  line.arrive(2);
  line.at(ms_(100));  // the timer judges [0, 100): it emptied, so it does not stand
  CHECK(line.failed_at.empty());
  line.at(ms_(200) - 1ns);
  CHECK(line.failed_at.empty());
  line.at(ms_(200));  // [100, 200) never emptied and granted nobody: it stands; both are past 20 ms
  REQUIRE(line.log.failed.size() == 2);
  CHECK(line.log.failed[0] == std::pair<int, error_code>{1, rein::errc::overloaded});
  CHECK(line.log.failed[1] == std::pair<int, error_code>{2, rein::errc::overloaded});
  CHECK(line.failed_at[0].second == ms_(200));
  CHECK(line.failed_at[1].second == ms_(200));

  // Standing until the interval in force ends: a newcomer is shed the instant it passes 20 ms.
  line.at(ms_(210));
  line.arrive(3);
  line.at(ms_(230));
  CHECK(line.log.failed.size() == 2);
  line.at(ms_(230) + 1ns);
  REQUIRE(line.log.failed.size() == 3);
  CHECK(line.failed_at[2] == std::pair<int, tp>{3, ms_(230) + 1ns});

  const auto s = line.sem.snapshot();
  CHECK(s.overloaded_total == 3);
  CHECK(s.rejected_total == 3);
  CHECK(s.timed_out_total == 0);
  CHECK(s.waiting == 0);
  CHECK(s.available == 0);  // nothing lost: the one permit is still held
  held.release();
  CHECK(line.sem.available() == 1);
  CHECK(line.log.served.empty());
}

TEST_CASE("sojourn: a burst that drains within the interval is served whole, however long it waited",
          "[core][sojourn]") {
  rein_test::manual_clock_at_epoch epoch;
  sojourn_line line(1);
  rein::permit held = line.sem.try_acquire();
  for (int i = 0; i < 6; ++i) line.arrive(i);
  // One release every 15 ms: the last is granted at 90 ms, having waited 90 ms, and the line empties.
  held.release();
  for (int i = 0; i < 6; ++i) {
    line.at(ms_(15 * (i + 1)));
    line.log.held.at(static_cast<std::size_t>(i)).release();
  }
  poll(line.io);
  CHECK(line.log.served == std::vector<int>{0, 1, 2, 3, 4, 5});
  CHECK(line.log.failed.empty());
  CHECK(line.sem.snapshot().overloaded_total == 0);
  CHECK(line.sem.snapshot().wait_max == 75ms);
}

TEST_CASE("sojourn: a standing queue is cut to the slough time, and grants then wait exactly that",
          "[core][sojourn]") {
  rein_test::manual_clock_at_epoch epoch;
  sojourn_line line(1);
  rein::permit held = line.sem.try_acquire();
  // Every 10 ms from 0 to 290 ms two callers arrive (caller i at i / 2 x 10 ms) and, from 10 ms on, the
  // permit is given back once: the queue grows by one every 10 ms.
  int next = 0;
  for (int t = 0; t < 300; t += 10) {
    line.at(ms_(t));
    line.arrive(next++);
    line.arrive(next++);
    if (t == 0) continue;
    if (held) held.release();
    else line.log.held.at(line.log.served.size() - 1).release();
    poll(line.io);
  }
  const auto arrived = [](int i) { return ms_(i / 2 * 10); };
  // [0, 100) drained at 0 (caller 0 joined an empty line); [100, 200) stood: its shortest wait was caller
  // 9's, 60 ms. At 200 ms every caller that arrived before 180 ms (19 to 35) is shed at once; from then on
  // one caller passes 20 ms every 10 ms and is shed, and each grant has waited exactly 20 ms.
  REQUIRE(line.failed_at.size() == 26);
  const auto at = [](const auto& v, int i) { return v.at(static_cast<std::size_t>(i)); };
  for (int i = 0; i < 17; ++i) CHECK(at(line.failed_at, i) == std::pair<int, tp>{19 + i, ms_(200)});
  for (int k = 0; k < 9; ++k) CHECK(at(line.failed_at, 17 + k) == std::pair<int, tp>{37 + 2 * k, ms_(210 + 10 * k)});
  REQUIRE(line.granted_at.size() == 29);
  for (int k = 0; k < 19; ++k) CHECK(at(line.granted_at, k) == std::pair<int, tp>{k, ms_(10 + 10 * k)});
  for (int k = 0; k < 10; ++k) {
    const auto [index, when] = at(line.granted_at, 19 + k);
    CHECK(index == 36 + 2 * k);
    CHECK(when == ms_(200 + 10 * k));
    CHECK(when - arrived(index) == 20ms);
  }
  const auto s = line.sem.snapshot();
  CHECK(s.overloaded_total == 26);
  CHECK(s.rejected_total == 26);
  CHECK(s.acquired_total == 30);  // the first try_acquire and 29 grants
  CHECK(s.waiting == 5);
  CHECK(s.wait_max == 100ms);  // caller 18, granted at 190 ms, before the line was judged to stand
  CHECK(line.sem.available() == 0);
}

TEST_CASE("sojourn: invalid options name the type, field and value",
          "[core][sojourn]") {
  net::io_context io;
  const auto message = [&](rein::algo::codel_options o) {
    try {
      manual_semaphore sem(io, 1, {.name = "db", .sojourn = o});
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(message({.target = -1ms, .interval = 100ms}) ==
        "rein::semaphore \"db\": sojourn.target must be >= 0, got -1000000 ns");
  CHECK(message({.target = 1ms, .interval = 0ns}) == "rein::semaphore \"db\": sojourn.interval must be > 0, got 0 ns");
  CHECK(message({.target = 0ns, .interval = 0ns}).empty());
  try {
    manual_semaphore sem(io, 1, {.name = "db", .order = rein::queue_order::lifo, .sojourn = {.target = 1ms}});
    FAIL("a lifo line with a sojourn rule was accepted");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()) == "rein::semaphore \"db\": sojourn needs queue_order::fifo, got lifo");
  }
  // A rate line's waiters wait for its pacing: a sojourn target would shed them. Refused.
  const auto paced = [&](auto make) {
    try {
      make();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(paced([&] { manual_bucket b(io, {.rate = 5, .capacity = 1}, {.name = "api", .sojourn = {.target = 50ms}}); }) ==
        "rein::token_bucket \"api\": sojourn.target must be 0 (its waits are the rule's pacing, not a queue), "
        "got 50000000 ns");
  using manual_gate = rein::basic_quota_gate<net::any_io_executor, manual_clock>;
  CHECK(paced([&] { manual_gate g(io, {}, {.sojourn = {.target = 10ms}}); }) ==
        "rein::quota_gate: sojourn.target must be 0 (its waits are the rule's pacing, not a queue), got 10000000 ns");
  CHECK(paced([&] { manual_aimd a(io, {}, {.name = "db", .sojourn = {.target = 10ms}}); }).empty());
}

namespace {

// The line's use of the sojourn rule against a model of it: the model keeps the line's state (free permits,
// waiters in arrival order, grants) and asks the rule itself (rein::algo::basic_codel, proven on its own in
// tests/algo/codel.cpp) where the line must: the head before each grant, each grant, each emptying; and it
// looks when the line's timer is due (the interval's end, or while standing the head's slough time).
struct sojourn_model_line {
  static constexpr rein::algo::codel_options rule{.target = 2ms, .interval = 6ms};

  net::io_context io;
  manual_semaphore sem;
  std::vector<rein::permit> held;                                  // the line's grants, oldest first
  std::vector<std::unique_ptr<net::cancellation_signal>> signals;  // one per caller
  std::vector<std::pair<int, bool>> outcomes;  // (caller, granted) in completion order; shed otherwise
  std::vector<tp> arrivals;

  // The model.
  rein::algo::basic_codel<manual_clock> codel{rule};
  std::size_t free;
  std::deque<int> queue;
  std::size_t holding = 0;
  std::vector<std::pair<int, bool>> expected;
  tp wake = tp::max();

  explicit sojourn_model_line(std::size_t limit) : sem(io, limit, {.sojourn = rule}), free(limit) {}

  tp now() const { return manual_clock::now(); }

  void dispatch() {
    while (!queue.empty()) {
      const int head = queue.front();
      if (codel.should_shed(arrivals[static_cast<std::size_t>(head)], now())) {
        expected.emplace_back(head, false);
        queue.pop_front();
        continue;
      }
      if (free == 0) break;
      codel.granted(arrivals[static_cast<std::size_t>(head)], now());
      --free;
      ++holding;
      expected.emplace_back(head, true);
      queue.pop_front();
    }
    if (queue.empty()) codel.empty_at(now());
    arm();
  }

  void arm() {
    if (queue.empty()) return void(wake = tp::max());
    const tp end = codel.interval_end();
    const tp due = codel.standing() ? std::min(end, codel.slough_at(arrivals[static_cast<std::size_t>(queue.front())])) : end;
    wake = std::max(due, now() + 1ns);
  }

  void arrive() {
    const int index = static_cast<int>(arrivals.size());
    arrivals.push_back(now());
    signals.push_back(std::make_unique<net::cancellation_signal>());
    sem.async_acquire(1, net::bind_cancellation_slot(signals.back()->slot(), [this, index](error_code ec, rein::permit p) {
      if (ec == net::error::operation_aborted) return;
      outcomes.emplace_back(index, !ec);
      if (!ec) held.push_back(std::move(p));
    }));
    if (queue.empty() && free > 0) {
      --free;
      ++holding;
      expected.emplace_back(index, true);
    } else {
      const bool first = queue.empty();
      if (first) codel.empty_at(now());
      queue.push_back(index);
      if (first) arm();
    }
    poll(io);
  }

  bool release() {
    if (held.empty()) return false;
    held.erase(held.begin());
    ++free;
    --holding;
    if (!queue.empty()) dispatch();
    poll(io);
    return true;
  }

  bool cancel_first() {
    if (queue.empty()) return false;
    const int first = queue.front();
    queue.pop_front();
    signals[static_cast<std::size_t>(first)]->emit(net::cancellation_type::terminal);
    dispatch();
    poll(io);
    return true;
  }

  void advance(std::chrono::nanoseconds d) {
    manual_clock::advance(d);
    if (!queue.empty() && wake <= now()) dispatch();
    poll(io);
  }

  void check() const {
    REQUIRE(outcomes == expected);
    const auto s = sem.snapshot();
    CHECK(s.available == free);
    CHECK(s.waiting == queue.size());
    CHECK(held.size() == holding);
    CHECK(s.overloaded_total == static_cast<std::uint64_t>(std::count_if(
                                    expected.begin(), expected.end(), [](const auto& e) { return !e.second; })));
  }
};

int sojourn_model_depth() { return rein_test::model_scope(8, 6, 10); }

}  // namespace

TEST_CASE("sojourn against the model, exhaustively: every sequence of 8 events on 1 and 2 permits",
          "[core][sojourn][model]") {
  // Every sequence of 8 events (the quick tier; 6 under a sanitizer, 10 by hand with REIN_MODEL_THOROUGH=1)
  // from {a caller arrives, the oldest permit is given back, the oldest waiter is cancelled, 1 ms passes,
  // 3 ms pass} on a line of 1 and of 2 permits with target 2 ms and interval 6 ms (a head that arrived as
  // an interval began passes the slough time inside it, at whole milliseconds): 2 x 5^8 = 781,250 runs,
  // checked after every event against the model (who is granted and who is shed, in order; free permits,
  // waiters, holdings, the overloaded count). What it covers: every interleaving of up to 8 arrivals,
  // releases, cancellations and passings of time across several intervals, standing and not: the line asks
  // the rule at the right instants, sheds only the head past the slough time, and loses no permit.
  const int depth = sojourn_model_depth();
  long runs = 0;
  for (std::size_t limit : {1u, 2u}) {
    rein_test::for_each_sequence(depth, 5, [&](long code, const std::vector<int>& sequence) {
      rein_test::manual_clock_at_epoch epoch;
      sojourn_model_line line(limit);
      INFO("limit " << limit << ", events (lowest digit first, base 5) " << code);
      ++runs;
      for (int e : sequence) {
        bool acted = true;
        switch (e) {
          case 0: line.arrive(); break;
          case 1: acted = line.release(); break;
          case 2: acted = line.cancel_first(); break;
          case 3: line.advance(1ms); break;
          default: line.advance(3ms); break;
        }
        if (acted) line.check();
      }
    });
  }
  long per_limit = 1;
  for (int i = 0; i < depth; ++i) per_limit *= 5;
  CHECK(runs == 2 * per_limit);
}

TEST_CASE("sojourn against the model at scale: random runs of 400 events", "[core][sojourn][model]") {
  // Randomized: 300 runs of 400 events on 1 to 3 permits, the same events with 1 to 8 ms passing (around
  // the 6 ms interval), arrivals about as frequent as releases so that lines stand, drain and stand again.
  // A property test at scale beside the exhaustive one above, reaching the long sequences it cannot (a line
  // that empties by a grant in an interval it did not start empty in, say).
  std::mt19937 rng(20261206);
  for (int run = 0; run < 300; ++run) {
    rein_test::manual_clock_at_epoch epoch;
    sojourn_model_line line(std::uniform_int_distribution<std::size_t>(1, 3)(rng));
    INFO("run " << run);
    for (int step = 0; step < 400; ++step) {
      const int e = std::uniform_int_distribution<int>(0, 19)(rng);
      bool acted = true;
      if (e < 7) line.arrive();
      else if (e < 12) acted = line.release();
      else if (e < 13) acted = line.cancel_first();
      else line.advance(std::chrono::milliseconds(std::uniform_int_distribution<int>(1, 8)(rng)));
      if (acted) line.check();
    }
  }
}

// ---- one options shape: every limiter is T(executor, rule, rein::line_options) --------------------------

namespace {

// `limiter`, named "x" with max_waiters 8 and made so that every acquire waits, takes 8 waiters; the 9th,
// through the coroutine door, fails at once with queue_full and an error naming the type and the name.
template <class Limiter>
void check_ninth_waiter_refused(net::io_context& io, Limiter& limiter, const std::string& type) {
  CHECK(limiter.name() == "x");
  int completed = 0;
  for (int i = 0; i < 8; ++i) limiter.async_acquire(1, [&completed](error_code, auto&&...) { ++completed; });
  std::optional<error_code> ninth;
  std::string what;
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        try {
          co_await limiter.acquire(1);
          ninth = error_code{};
        } catch (const rein::system_error& e) {
          ninth = e.code();
          what = e.what();
        }
      },
      net::detached);
  poll(io);
  CHECK(completed == 0);
  REQUIRE(ninth.has_value());
  CHECK(*ninth == rein::errc::queue_full);
  CHECK_THAT(what, Catch::StartsWith(type + " \"x\": "));
  const auto s = limiter.snapshot();
  CHECK(s.waiting == 8);
  CHECK(s.queue_full_total == 1);
}

// The checks every line makes, worded alike for every type: a negative priority_aging or wake_jitter, and
// partitions where the line has none.
template <class Make>
void check_invalid_line_fields(const std::string& type, Make make, bool partitions) {
  const auto refused = [&](rein::line_options l) {
    return rein_test::invalid_argument_of([&] { make(std::move(l)); });
  };
  CHECK(refused({.name = "x", .priority_aging = -1ns}) == type + " \"x\": priority_aging must be >= 0, got -1 ns");
  CHECK(refused({.name = "x", .wake_jitter = -5ns}) == type + " \"x\": wake_jitter must be >= 0, got -5 ns");
  CHECK(refused({.name = "x", .sojourn = {.target = -1ns}}) ==
        type + " \"x\": sojourn.target must be >= 0, got -1 ns");
  if (partitions) {
    CHECK(refused({.name = "x", .partitions = {{"a", 1.5}}}) ==
          type + " \"x\": partitions[0].share must be in (0, 1], got 1.5");
  } else {
    CHECK(refused({.name = "x", .partitions = {{"a", 0.5}}}) ==
          type +
              " \"x\": partitions must be empty (only rein::semaphore and rein::adaptive_limiter have "
              "partitions), got 1 partitions");
  }
}

}  // namespace

TEST_CASE("one options shape: semaphore(ex, permits, line_options)", "[core][options]") {
  net::io_context io;
  rein::semaphore sem(io, 0, {.name = "x", .max_waiters = 8});  // a gate: every acquire waits
  check_ninth_waiter_refused(io, sem, "rein::semaphore");
  check_invalid_line_fields(
      "rein::semaphore", [&](rein::line_options l) { rein::semaphore(io, 1, std::move(l)); }, true);
}

TEST_CASE("one options shape: token_bucket(ex, token_bucket_options, line_options)", "[core][options]") {
  net::io_context io;
  rein::token_bucket bucket(io, {.rate = 1e-3, .capacity = 1, .initial_tokens = 0}, {.name = "x", .max_waiters = 8});
  check_ninth_waiter_refused(io, bucket, "rein::token_bucket");
  check_invalid_line_fields(
      "rein::token_bucket",
      [&](rein::line_options l) { rein::token_bucket(io, {.rate = 1, .capacity = 1}, std::move(l)); }, false);
}

TEST_CASE("one options shape: rate_limiter(ex, limit, line_options)", "[core][options]") {
  net::io_context io;
  using limiter = rein::basic_rate_limiter<rein::algo::token_bucket>;
  const auto empty = [] {
    return rein::algo::token_bucket({.rate = 1e-3, .capacity = 1, .initial_tokens = 0},
                                    std::chrono::steady_clock::now());
  };
  limiter rate(io, empty(), {.name = "x", .max_waiters = 8});
  check_ninth_waiter_refused(io, rate, "rein::rate_limiter");
  check_invalid_line_fields(
      "rein::rate_limiter", [&](rein::line_options l) { limiter(io, empty(), std::move(l)); }, false);
}

TEST_CASE("one options shape: adaptive_rate_limiter(ex, adaptive_rate_options, line_options)", "[core][options]") {
  net::io_context io;
  const rein::algo::adaptive_rate_options slow{.initial_rate = 1e-3, .initial_tokens = 0, .min_rate = 1e-3};
  rein::adaptive_rate_limiter rate(io, slow, {.name = "x", .max_waiters = 8});
  check_ninth_waiter_refused(io, rate, "rein::adaptive_rate_limiter");
  check_invalid_line_fields(
      "rein::adaptive_rate_limiter", [&](rein::line_options l) { rein::adaptive_rate_limiter(io, slow, std::move(l)); },
      false);
}

TEST_CASE("one options shape: fixed_window and sliding_window(ex, rule, line_options)", "[core][options]") {
  net::io_context io;
  rein::fixed_window fixed(io, {.limit = 1, .window = 1h}, {.name = "x", .max_waiters = 8});
  REQUIRE(fixed.try_acquire());
  check_ninth_waiter_refused(io, fixed, "rein::fixed_window");
  check_invalid_line_fields(
      "rein::fixed_window",
      [&](rein::line_options l) { rein::fixed_window(io, {.limit = 1, .window = 1h}, std::move(l)); }, false);

  rein::sliding_window sliding(io, {.limit = 1, .window = 1h}, {.name = "x", .max_waiters = 8});
  REQUIRE(sliding.try_acquire());
  check_ninth_waiter_refused(io, sliding, "rein::sliding_window");
  check_invalid_line_fields(
      "rein::sliding_window",
      [&](rein::line_options l) { rein::sliding_window(io, {.limit = 1, .window = 1h}, std::move(l)); }, false);
}

TEST_CASE("one options shape: quota_gate(ex, quota_gate_options, line_options), fifo only", "[core][options]") {
  net::io_context io;
  rein::quota_gate gate(io, {.jitter = 0}, {.name = "x", .max_waiters = 8});
  gate.pause_for(1h);
  check_ninth_waiter_refused(io, gate, "rein::quota_gate");
  const auto make = [&](rein::line_options l) { rein::quota_gate(io, {}, std::move(l)); };
  check_invalid_line_fields("rein::quota_gate", make, false);
  const auto refused = [&](rein::line_options l) {
    return rein_test::invalid_argument_of([&] { make(std::move(l)); });
  };
  CHECK(refused({.name = "x", .order = rein::queue_order::priority}) ==
        "rein::quota_gate \"x\": order must be fifo (its release is spread in arrival order), got priority");
}

TEST_CASE("one options shape: adaptive_limiter(ex, algorithm options, line_options, its own)", "[core][options]") {
  net::io_context io;
  const rein::algo::aimd_options one{.initial_limit = 1, .min_limit = 1, .max_limit = 1};
  rein::aimd_limiter limiter(io, one, {.name = "x", .max_waiters = 8}, {.idle_restart = 0ns});
  const rein::permit held = limiter.try_acquire();
  REQUIRE(held);
  check_ninth_waiter_refused(io, limiter, "rein::adaptive_limiter");
  check_invalid_line_fields(
      "rein::adaptive_limiter", [&](rein::line_options l) { rein::aimd_limiter(io, one, std::move(l)); }, true);
}

TEST_CASE("one options shape: the line options' example compiles and runs", "[core][options]") {
  net::io_context io;
  rein::semaphore db(io, 4, {.name = "db", .max_waiters = 64});
  rein::token_bucket api(io, {.rate = 10, .capacity = 3}, {.name = "api", .order = rein::queue_order::lifo});
  CHECK(db.name() == "db");
  CHECK(api.order() == rein::queue_order::lifo);
}
