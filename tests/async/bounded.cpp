// rein::for_each_bounded: at most `limit` calls in flight, items pulled lazily (memory does not grow with the
// input), the first error propagates and the calls in flight see cancellation, cancellation of the caller,
// ranges by reference and by value, validation, and a multi-threaded io_context.
#include "support/async.hpp"
#include "support/catch.hpp"
#include "support/counting_new.hpp"

#include <rein/bounded.hpp>
#include <rein/testing/manual_clock.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <exception>
#include <iterator>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using rein_test::heap::live_blocks;  // of the whole process, to show that memory does not grow with the input

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
using rein::error_code;
using rein::testing::manual_clock;
using rein_test::poll;
using ns = std::chrono::nanoseconds;
using timer_t = net::basic_waitable_timer<manual_clock>;

// An input range of 0 .. n-1 that counts the items taken from it (one per increment): a stand-in for a file
// or a socket read item by item.
struct counting_source {
  int n;
  int taken = 0;

  struct iterator {
    using value_type = int;
    using difference_type = std::ptrdiff_t;
    counting_source* source = nullptr;
    int i = 0;
    int operator*() const { return i; }
    iterator& operator++() {
      ++i;
      ++source->taken;
      return *this;
    }
    void operator++(int) { ++*this; }
    bool operator==(std::default_sentinel_t) const { return i >= source->n; }
  };

  iterator begin() { return iterator{this, 0}; }
  std::default_sentinel_t end() { return {}; }
};
static_assert(std::ranges::input_range<counting_source&>);
static_assert(!std::ranges::forward_range<counting_source&>);

net::awaitable<void> sleep_for(ns d) {
  timer_t timer(co_await net::this_coro::executor, d);
  co_await timer.async_wait(net::use_awaitable);
}

// Spawns the loop on io and records how it ended.
struct outcome {
  bool done = false;
  std::exception_ptr error;
  ns at{-1};
};

void spawn(net::io_context& io, net::awaitable<void> loop, outcome& out, net::cancellation_slot slot = {}) {
  auto handler = [&out](std::exception_ptr e) {
    out.done = true;
    out.error = e;
    out.at = manual_clock::now().time_since_epoch();
  };
  if (slot.is_connected()) net::co_spawn(io, std::move(loop), net::bind_cancellation_slot(slot, handler));
  else net::co_spawn(io, std::move(loop), handler);
}

// Steps the manual clock by 1 ms until `out` is done (at most `horizon`).
void step_until_done(net::io_context& io, const outcome& out, ns horizon = 10s) {
  poll(io);
  for (ns t = 1ms; !out.done && t <= horizon; t += 1ms) rein_test::set_and_poll(io, manual_clock::time_point{} + t);
}

std::string message_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
  return "?";
}

}  // namespace

TEST_CASE("at most `limit` calls are in flight and every item is processed once", "[bounded]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  int active = 0;
  int peak = 0;
  std::vector<int> processed;
  auto fn = [&](int i) -> net::awaitable<void> {
    peak = std::max(peak, ++active);
    co_await sleep_for((i % 3 + 1) * 10ms);
    --active;
    processed.push_back(i);
  };
  std::vector<int> items{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  outcome out;
  spawn(io, rein::for_each_bounded(io.get_executor(), items, 3, fn), out);
  step_until_done(io, out);
  REQUIRE(out.done);
  CHECK_FALSE(out.error);
  CHECK(peak == 3);
  std::sort(processed.begin(), processed.end());
  CHECK(processed == items);
  // Three lanes, each taking the next item as it frees up: 0, 1, 2 start at 0; 3 at 10 (ends 20); 4 and 5 at
  // 20 (end 40, 50); 6 at 30 (ends 40); 7 and 8 at 40 (end 60, 70); 9 at 50 (ends 60). Done at 70 ms.
  CHECK(out.at == 70ms);
}

TEST_CASE("items are pulled lazily: taken minus finished never exceeds the limit", "[bounded]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  counting_source source{1000};
  int finished = 0;
  int most_ahead = 0;
  auto fn = [&](int) -> net::awaitable<void> {
    most_ahead = std::max(most_ahead, source.taken - finished);
    co_await sleep_for(1ms);
    ++finished;
  };
  outcome out;
  spawn(io, rein::for_each_bounded(io.get_executor(), source, 4, fn), out);
  poll(io);
  CHECK(source.taken == 4);  // the first window only
  step_until_done(io, out);
  REQUIRE(out.done);
  CHECK_FALSE(out.error);
  CHECK(finished == 1000);
  CHECK(source.taken == 1000);
  CHECK(most_ahead == 4);
  CHECK(out.at == 250ms);  // 1000 items, 4 at a time, 1 ms each
}

namespace {

// Runs n trivial suspending calls, 8 at a time, and returns the most heap blocks alive at once above the
// count before the loop started (sampled in every call).
long peak_blocks_for(int n) {
  net::io_context io;
  counting_source source{n};
  long peak = 0;
  int live_calls = 0;
  int most_live_calls = 0;
  const long before = live_blocks.load();
  auto fn = [&](int) -> net::awaitable<void> {
    most_live_calls = std::max(most_live_calls, ++live_calls);
    peak = std::max(peak, live_blocks.load() - before);
    co_await net::post(co_await net::this_coro::executor, net::use_awaitable);
    --live_calls;
  };
  std::exception_ptr error;
  net::co_spawn(io, rein::for_each_bounded(io.get_executor(), source, 8, fn), [&](std::exception_ptr e) { error = e; });
  io.run();
  REQUIRE_FALSE(error);
  REQUIRE(source.taken == n);
  CHECK(most_live_calls == 8);
  return peak;
}

}  // namespace

TEST_CASE("a huge input costs the memory of the window, not of the input", "[bounded][memory]") {
  const long small = peak_blocks_for(2'000);
  const long huge = peak_blocks_for(200'000);
  INFO("peak live heap blocks: " << small << " for 2,000 items, " << huge << " for 200,000");
  CHECK(huge <= small);
}

TEST_CASE("the first error propagates; the calls in flight see cancellation; no new item is taken",
          "[bounded][errors]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  counting_source source{10};
  std::vector<int> started;
  std::vector<int> saw_cancellation;
  auto fn = [&](int i) -> net::awaitable<void> {
    started.push_back(i);
    if (i == 1) {
      co_await sleep_for(10ms);
      throw std::runtime_error("item 1 failed");
    }
    try {
      co_await sleep_for(100ms);
    } catch (const rein::system_error& e) {
      if (e.code() == net::error::operation_aborted) saw_cancellation.push_back(i);
      throw;
    }
  };
  outcome out;
  spawn(io, rein::for_each_bounded(io.get_executor(), source, 3, fn), out);
  step_until_done(io, out);
  REQUIRE(out.done);
  REQUIRE(out.error);
  CHECK(message_of(out.error) == "item 1 failed");  // the first error, not the cancellations it caused
  CHECK(out.at == 10ms);
  CHECK(started == std::vector<int>{0, 1, 2});
  std::sort(saw_cancellation.begin(), saw_cancellation.end());
  CHECK(saw_cancellation == std::vector<int>{0, 2});
  CHECK(source.taken == 3);
}

TEST_CASE("cancelling the caller cancels every call in flight and ends with operation_aborted",
          "[bounded][cancel]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  counting_source source{5};
  int saw_cancellation = 0;
  auto fn = [&](int) -> net::awaitable<void> {
    try {
      co_await sleep_for(1s);
    } catch (const rein::system_error& e) {
      if (e.code() == net::error::operation_aborted) ++saw_cancellation;
      throw;
    }
  };
  net::cancellation_signal signal;
  outcome out;
  spawn(io, rein::for_each_bounded(io.get_executor(), source, 2, fn), out, signal.slot());
  poll(io);
  rein_test::set_and_poll(io, manual_clock::time_point{} + 100ms);
  CHECK_FALSE(out.done);
  signal.emit(net::cancellation_type::terminal);
  poll(io);
  REQUIRE(out.done);
  REQUIRE(out.error);
  try {
    std::rethrow_exception(out.error);
  } catch (const rein::system_error& e) {
    CHECK(e.code() == net::error::operation_aborted);
  }
  CHECK(saw_cancellation == 2);
  CHECK(source.taken == 2);
  CHECK(out.at == 100ms);
}

TEST_CASE("an empty range completes at once", "[bounded]") {
  net::io_context io;
  std::vector<int> none;
  int calls = 0;
  outcome out;
  spawn(io, rein::for_each_bounded(io.get_executor(), none, 4, [&](int) -> net::awaitable<void> {
          ++calls;
          co_return;
        }),
        out);
  poll(io);
  CHECK(out.done);
  CHECK_FALSE(out.error);
  CHECK(calls == 0);
}

TEST_CASE("a container is passed by reference; an rvalue container is moved in", "[bounded]") {
  net::io_context io;
  std::vector<int> values{1, 2, 3};
  outcome by_reference;
  spawn(io, rein::for_each_bounded(io.get_executor(), values, 2, [](int& v) -> net::awaitable<void> {
          v *= 10;
          co_return;
        }),
        by_reference);

  std::vector<std::string> seen;
  outcome by_value;
  auto loop = rein::for_each_bounded(io.get_executor(), std::vector<std::string>{"a", "b", "c"}, 1,
                                     [&](const std::string& s) -> net::awaitable<void> {
                                       seen.push_back(s);
                                       co_return;
                                     });
  spawn(io, std::move(loop), by_value);  // the temporary vector is long gone: it was moved in
  io.run();
  CHECK_FALSE(by_reference.error);
  CHECK(values == std::vector<int>{10, 20, 30});
  CHECK_FALSE(by_value.error);
  CHECK(seen == std::vector<std::string>{"a", "b", "c"});
}

TEST_CASE("an exception from iterating the range is the error", "[bounded][errors]") {
  net::io_context io;
  struct failing_source {
    struct iterator {
      using value_type = int;
      using difference_type = std::ptrdiff_t;
      int i = 0;
      int operator*() const {
        if (i == 2) throw std::runtime_error("read failed");
        return i;
      }
      iterator& operator++() {
        ++i;
        return *this;
      }
      void operator++(int) { ++i; }
      bool operator==(std::default_sentinel_t) const { return i >= 5; }
    };
    iterator begin() { return {}; }
    std::default_sentinel_t end() { return {}; }
  } source;
  std::vector<int> processed;
  outcome out;
  spawn(io, rein::for_each_bounded(io.get_executor(), source, 1, [&](int i) -> net::awaitable<void> {
          processed.push_back(i);
          co_return;
        }),
        out);
  io.run();
  REQUIRE(out.error);
  CHECK(message_of(out.error) == "read failed");
  CHECK(processed == std::vector<int>{0, 1});
}

TEST_CASE("a limit of 0 is rejected at the call", "[bounded][validation]") {
  net::io_context io;
  std::vector<int> items{1};
  auto fn = [](int) -> net::awaitable<void> { co_return; };
  CHECK_THROWS_WITH(rein::for_each_bounded(io.get_executor(), items, 0, fn),
                    "rein::for_each_bounded: limit must be >= 1, got 0");
}

TEST_CASE("on a multi-threaded io_context the calls run one at a time on a strand", "[bounded][threads]") {
  net::io_context io;
  counting_source source{20'000};
  long unguarded = 0;  // touched by every call without a lock: the strand must serialise them
  auto fn = [&](int i) -> net::awaitable<void> {
    unguarded += i;
    co_await net::post(io.get_executor(), net::use_awaitable);  // completes on any thread, resumes on the strand
    unguarded -= i;
    ++unguarded;
  };
  std::exception_ptr error;
  std::atomic<bool> done{false};
  net::co_spawn(io, rein::for_each_bounded(io.get_executor(), source, 8, fn), [&](std::exception_ptr e) {
    error = e;
    done = true;
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) threads.emplace_back([&] { io.run(); });
  for (auto& t : threads) t.join();
  CHECK(done.load());
  CHECK_FALSE(error);
  CHECK(unguarded == 20'000);
}
