// REIN_SEPARATE_COMPILATION: this unit declares the default semaphore, quota gate and token bucket, and
// their keyed registries, `extern template`, and src.cpp defines them. The program links only if every
// member this unit calls is among the instantiations src.cpp compiles, and the limiters behave as in a
// header-only build. (check_extern.cmake checks that this unit really left the lines to src.cpp.)
#include "support/catch.hpp"

#include <rein/quota_gate.hpp>
#include <rein/semaphore.hpp>
#include <rein/token_bucket.hpp>
// After the limiters, so that keyed.hpp declares keyed<semaphore> and the others extern (src.hpp includes
// it first, so that the limiters' headers do).
#include <rein/keyed.hpp>
#include <rein/throttle.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#else
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#endif

#include <chrono>
#include <cstddef>
#include <string>

#if !defined(REIN_SEPARATE_COMPILATION)
#error "tests/separate is built with REIN_SEPARATE_COMPILATION"
#endif

namespace net = rein::net;

TEST_CASE("separately compiled semaphore: a parked acquire gets the permit given back", "[separate]") {
  net::io_context io;
  rein::semaphore sem(io, 1);
  rein::try_permit first = sem.try_acquire();
  REQUIRE(first.status() == rein::try_status::acquired);
  REQUIRE(sem.available() == 0);
  std::size_t granted = 0;
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        rein::permit p = co_await sem.acquire();
        granted = p.count();
      },
      net::detached);
  io.poll();
  REQUIRE(granted == 0);
  REQUIRE(sem.snapshot().waiting == 1);
  first.release();
  io.run();
  REQUIRE(granted == 1);
  REQUIRE(sem.available() == 1);
}

TEST_CASE("separately compiled token bucket and quota gate", "[separate]") {
  net::io_context io;
  // A token every 1,000 s of the real clock: none comes back between the two calls.
  rein::token_bucket bucket(io, rein::token_bucket_options{.rate = 1e-3, .capacity = 3});
  REQUIRE(bucket.try_acquire(3));
  REQUIRE_FALSE(bucket.try_acquire());
  rein::quota_gate gate(io);
  REQUIRE(gate.try_acquire());
  gate.pause_for(std::chrono::hours(1));
  const rein::try_result refused = gate.try_acquire();
  REQUIRE_FALSE(refused);
  REQUIRE(refused.status() == rein::try_status::busy);
}

TEST_CASE("separately compiled keyed semaphores: one limiter per key", "[separate]") {
  net::io_context io;
  rein::keyed<rein::semaphore> per_host(io, std::size_t{2});
  auto a = per_host.get("a.example");
  rein::try_permit held = a->try_acquire(2);
  REQUIRE(held.status() == rein::try_status::acquired);
  REQUIRE(a->available() == 0);
  REQUIRE(per_host.get("b.example")->available() == 2);
  REQUIRE(per_host.size() == 2);
  REQUIRE(per_host.snapshot().created_total == 2);
}

namespace {

// A key's capacity of 1 under a global 4: a charge of 2 requests fails at the key's stage, after its wait.
struct per_host_and_global {
  net::io_context io;
  rein::keyed<rein::semaphore> per_host{io, std::size_t{1}};
  rein::semaphore global{io, 4};
  rein::throttle<rein::keyed<rein::semaphore>, rein::semaphore> throttle{per_host, global};
};

}  // namespace

TEST_CASE("separately compiled throttle: a failed wait names its stage", "[separate]") {
  // The wait goes through the per-key line's use_awaitable wait and the error's message through
  // detail::throttle_failure, both compiled in src.cpp only.
  per_host_and_global t;
  std::string what;
  rein::error_code failed;
  net::co_spawn(
      t.io,
      [&]() -> net::awaitable<void> {
        try {
          co_await t.throttle.acquire("h", rein::charge{.requests = 2});  // more than the key's capacity of 1
        } catch (const rein::throttle_error& e) {
          failed = e.code();
          what = e.what();
        }
      },
      net::detached);
  t.io.run();
  REQUIRE(failed == rein::errc::exceeds_capacity);
  const std::string prefix = "rein::throttle::acquire: stage 0 (per_key), key \"h\"";
  REQUIRE(what.substr(0, prefix.size()) == prefix);
  REQUIRE(t.global.available() == 4);
}

TEST_CASE("separately compiled throttle: async_acquire's slot-bound wait", "[separate]") {
  // async_acquire's stage waits go through use_awaitable bound to a cancellation slot: another handler type,
  // compiled in src.cpp only (check_extern.cmake fails if this unit defines that wait).
  per_host_and_global t;
  rein::error_code failed;
  bool empty = false;
  std::size_t stage = 99;
  t.throttle.async_acquire("h", rein::charge{.requests = 2}, [&](rein::error_code ec, auto g) {
    failed = ec;
    empty = !g;
    stage = g.rejected_stage();
  });
  t.io.run();
  REQUIRE(failed == rein::errc::exceeds_capacity);
  REQUIRE(empty);
  REQUIRE(stage == 0);
  REQUIRE(t.global.available() == 4);
}
