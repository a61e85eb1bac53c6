// Asio's coroutine frames go through operator new, so that they are counted too (Asio otherwise takes them
// from std::aligned_alloc); this file is its own test binary.
#define BOOST_ASIO_DISABLE_STD_ALIGNED_ALLOC 1
#define BOOST_ASIO_DISABLE_BOOST_ALIGN 1
#define ASIO_DISABLE_STD_ALIGNED_ALLOC 1

// Fast paths that must not allocate: a keyed lookup of a live string key (heterogeneous lookup, no copy of
// the key), and the throttle's uncontended admission through try_acquire and through `co_await acquire(key)`
// (no key copy, no coroutine beyond acquire's own, whose frame Asio recycles). Every operator new of the
// process is counted (support/counting_new.hpp).
#include "support/asio.hpp"
#include "support/catch.hpp"
#include "support/counting_new.hpp"
#include "support/manual_time.hpp"

#include <rein/keyed.hpp>
#include <rein/outcome.hpp>
#include <rein/quota_gate.hpp>
#include <rein/semaphore.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>

#include <chrono>
#include <cstddef>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace {

namespace net = rein::net;
using rein_test::manual_clock;
using executor = net::any_io_executor;
using gate_type = rein::basic_quota_gate<executor, manual_clock>;
using bucket_type = rein::basic_token_bucket<executor, manual_clock>;
using sem_type = rein::basic_semaphore<executor, manual_clock>;

// Longer than std::string's small buffer (15 characters in libstdc++): a copy of it allocates.
constexpr std::string_view long_host = "api.provider.example.com";

using rein_test::heap::allocations_of;

// The four stages in admission order, none of which runs out during a test.
struct four_stages {
  net::io_context io;
  rein::keyed<gate_type> gates{io.get_executor(), {}};
  rein::keyed<sem_type> per_key{io.get_executor(), std::size_t{1}};
  sem_type global{io.get_executor(), 1};
  bucket_type rate{io.get_executor(), rein::token_bucket_options{.rate = 1, .capacity = 1'000}};
  rein::throttle<rein::keyed<gate_type>, rein::keyed<sem_type>, sem_type, bucket_type> throttle{gates, per_key, global,
                                                                                                 rate};
};

}  // namespace

TEST_CASE("string keys are looked up as views; other hashes take the key itself", "[keyed][alloc]") {
  STATIC_REQUIRE(std::is_same_v<rein::keyed<rein::semaphore>::key_view, std::string_view>);
  STATIC_REQUIRE(std::is_same_v<rein::keyed<rein::semaphore, std::string, std::mutex, std::hash<std::string>>::key_view,
                                const std::string&>);
  STATIC_REQUIRE(std::is_same_v<rein::keyed<rein::semaphore, int>::key_view, const int&>);
}

TEST_CASE("a live string key is found without allocating, by view, string or literal", "[keyed][alloc]") {
  net::io_context io;
  rein::keyed<rein::semaphore> per_host(io, std::size_t{4});
  per_host.set_override("api.slow-provider.example.com", std::size_t{1});
  const std::string host(long_host);
  auto pin = per_host.get(host);  // made: the key is copied into the registry; pinned, so never evicted
  REQUIRE(pin->snapshot().permits == 4);
  auto slow = per_host.get(std::string_view("api.slow-provider.example.com"));
  REQUIRE(slow->snapshot().permits == 1);  // the override, found by a view

  const long hits = allocations_of([&] {
    for (int i = 0; i < 100; ++i) {
      auto by_view = per_host.get(long_host);
      auto by_string = per_host.get(host);
      auto by_literal = per_host.get("api.provider.example.com");
      rein::error_code ec;
      auto with_code = per_host.get(long_host, ec);
      auto found = per_host.find(long_host);
      if (!by_view || by_view.get() != by_string.get() || by_string.get() != by_literal.get() ||
          with_code.get() != found.get() || ec || !per_host.contains(long_host))
        throw std::logic_error("not the same limiter");
    }
  });
  CHECK(hits == 0);
  CHECK(per_host.snapshot().created_total == 2);
  CHECK(per_host.erase_override("api.slow-provider.example.com"));
  CHECK_FALSE(per_host.erase_override("api.slow-provider.example.com"));

  const long miss = allocations_of([&] { (void)per_host.get("another.provider.example.com"); });
  CHECK(miss >= 1);  // a new key is copied, and its limiter made
  CHECK(per_host.snapshot().created_total == 3);
}

TEST_CASE("the throttle's try_acquire and complete allocate nothing on the fast path", "[throttle][alloc]") {
  four_stages s;
  auto warm = s.throttle.try_acquire(long_host);  // makes the key's gate and semaphore
  REQUIRE(warm);
  warm.complete(rein::outcome::success);

  int admitted = 0;
  const long n = allocations_of([&] {
    for (int i = 0; i < 100; ++i) {
      auto g = s.throttle.try_acquire(long_host);
      admitted += static_cast<bool>(g) ? 1 : 0;
      g.complete(rein::outcome::success);
    }
  });
  CHECK(n == 0);
  CHECK(admitted == 100);
  CHECK(s.throttle.snapshot().admitted_total == 101);
  CHECK(s.rate.snapshot().acquired_total == 101);
}

TEST_CASE("co_await throttle.acquire(key) and complete allocate nothing on the fast path", "[throttle][alloc]") {
  four_stages s;
  long during = -1;
  int admitted = 0;
  net::co_spawn(
      s.io,
      [&]() -> net::awaitable<void> {
        // Once outside the count: makes the key's limiters and lets Asio's frame cache take this frame size.
        (co_await s.throttle.acquire(long_host)).complete(rein::outcome::success);
        rein_test::heap::allocations.store(0);
        rein_test::heap::counting.store(true);
        for (int i = 0; i < 100; ++i) {
          auto g = co_await s.throttle.acquire(long_host);
          admitted += static_cast<bool>(g) ? 1 : 0;
          g.complete(rein::outcome::success);
        }
        rein_test::heap::counting.store(false);
        during = rein_test::heap::allocations.load();
      },
      net::detached);
  s.io.run();
  CHECK(during == 0);
  CHECK(admitted == 100);
  CHECK(s.throttle.snapshot().admitted_total == 101);
  CHECK(s.global.snapshot().acquired_total == 101);
}

TEST_CASE("a waiting acquire that times out names its key, from a temporary string", "[throttle]") {
  rein_test::manual_clock_at_epoch epoch;
  four_stages s;
  auto holder = s.throttle.try_acquire(long_host);  // the key's only permit
  REQUIRE(holder);
  std::string key_named;
  std::string what;
  std::size_t stage = 99;
  net::co_spawn(
      s.io,
      [&]() -> net::awaitable<void> {
        try {
          // The temporary is the only string with the key; the failure comes after a wait of 50 ms.
          (void)co_await s.throttle.acquire_for(std::string(long_host), std::chrono::milliseconds(50));
        } catch (const rein::throttle_error& e) {
          key_named = e.key();
          what = e.what();
          stage = e.stage();
        }
      },
      net::detached);
  rein_test::poll(s.io);
  CHECK(key_named.empty());
  rein_test::advance_and_poll(s.io, std::chrono::milliseconds(50));
  CHECK(key_named == long_host);
  CHECK(stage == 1);
  CHECK(what.find("key \"api.provider.example.com\"") != std::string::npos);
  CHECK(s.throttle.snapshot().timed_out_total == 1);
}
