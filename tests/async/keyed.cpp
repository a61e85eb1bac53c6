// rein::keyed: one limiter per key from defaults and per-key overrides, lazy eviction of idle keys only,
// pins, the hard cap on keys (evict idle first, else queue_full), bounded scans, snapshots and iteration,
// keyed quota gates, validation, and concurrent use from several threads.
#include "support/async.hpp"
#include "support/catch.hpp"

#include <rein/adaptive_limiter.hpp>
#include <rein/algo/aimd.hpp>
#include <rein/error.hpp>
#include <rein/keyed.hpp>
#include <rein/quota_gate.hpp>
#include <rein/semaphore.hpp>
#include <rein/testing/manual_clock.hpp>
#include <rein/token_bucket.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
using rein::errc;
using rein::error_code;
using rein::testing::manual_clock;
using rein_test::poll;
using per_key_semaphore = rein::keyed<rein::semaphore>;

rein::keyed_options opts(std::size_t max_keys, std::size_t sweep_batch = 2, std::size_t max_scan = 64) {
  rein::keyed_options o;
  o.max_keys = max_keys;
  o.sweep_batch = sweep_batch;
  o.max_scan = max_scan;
  return o;
}

}  // namespace

TEST_CASE("a key's limiter is made on first use from the defaults or the key's override", "[keyed]") {
  net::io_context io;
  per_key_semaphore per_host(io, 4);
  per_host.set_override("slow-site.example", 1, {.max_waiters = 1});

  CHECK(per_host.size() == 0);
  auto fast = per_host.get("fast.example");
  auto slow = per_host.get("slow-site.example");
  CHECK(fast->snapshot().permits == 4);
  CHECK(slow->snapshot().permits == 1);
  CHECK(per_host.size() == 2);
  CHECK(per_host.get("fast.example").get() == fast.get());  // the same limiter while it lives
  CHECK(fast.key() == "fast.example");

  CHECK(per_host.erase_override("slow-site.example"));
  CHECK_FALSE(per_host.erase_override("slow-site.example"));
  CHECK(per_host.get("slow-site.example")->snapshot().permits == 1);  // the live one keeps its settings
  const auto stats = per_host.snapshot();
  CHECK(stats.keys == 2);
  CHECK(stats.created_total == 2);
}

TEST_CASE("an override of the rule alone keeps the registry's line options; one with its own line uses it",
          "[keyed]") {
  net::io_context io;
  per_key_semaphore limits(io, 4, {.name = "per_host", .max_waiters = 0});
  limits.set_override("slow.example", 1);
  limits.set_override("own.example", 1, {.name = "own"});
  auto slow = limits.get("slow.example");
  CHECK(slow->name() == "per_host");
  CHECK(limits.get("own.example")->name() == "own");
  rein::permit held = slow->try_acquire();
  REQUIRE(held);
  std::optional<rein::error_code> refused;
  slow->async_acquire(1, [&](rein::error_code ec, rein::permit) { refused = ec; });
  io.poll();
  REQUIRE(refused);
  CHECK(*refused == rein::errc::queue_full);  // max_waiters 0, as every key
}

TEST_CASE("per-host caps hold under a mix of hosts", "[keyed]") {
  net::io_context io;
  per_key_semaphore limits(io, 4);
  limits.set_override("slow-site.example", 1);
  std::map<std::string, int> active;
  std::map<std::string, int> peak;

  auto fetch = [&](std::string host) -> net::awaitable<void> {
    auto permit = co_await limits.get(host)->acquire();
    peak[host] = std::max(peak[host], ++active[host]);
    co_await net::post(io, net::use_awaitable);  // let the others run while this one holds its permit
    --active[host];
  };
  for (int i = 0; i < 5; ++i) net::co_spawn(io, fetch("slow-site.example"), net::detached);
  for (int i = 0; i < 10; ++i) net::co_spawn(io, fetch("fast.example"), net::detached);
  io.run();
  CHECK(peak["slow-site.example"] == 1);
  CHECK(peak["fast.example"] == 4);
}

TEST_CASE("idle keys are evicted lazily, when new keys are made", "[keyed][evict]") {
  net::io_context io;
  per_key_semaphore per_host(io, 1, {}, opts(100, 2));

  per_host.get("a");  // the handle is dropped at once: "a" is idle and unpinned
  CHECK(per_host.contains("a"));  // nothing happens until a new key is made (or sweep() is called)
  per_host.get("b");
  CHECK_FALSE(per_host.contains("a"));
  CHECK(per_host.contains("b"));
  CHECK(per_host.snapshot().evicted_total == 1);

  per_host.get("a");  // made again, indistinguishable from the first one
  CHECK(per_host.snapshot().created_total == 3);
  CHECK(per_host.snapshot("a")->available == 1);
}

TEST_CASE("a handle and a permit may outlive their registry", "[keyed][lifetime]") {
  // As at a service's shutdown, where coroutine frames holding them are destroyed after the stages (run
  // under ASan: the registry is on the heap, so a use of it once gone is reported).
  net::io_context io;
  auto per_host = std::make_unique<per_key_semaphore>(io, 1, rein::line_options{}, opts(100, 0));
  auto pinned = per_host->get("a");
  rein::permit held = per_host->get("b")->try_acquire();
  rein::permit held_on_pinned = pinned->try_acquire();
  REQUIRE(held);
  REQUIRE(held_on_pinned);
  std::optional<error_code> waiter_ec, pinned_waiter_ec;
  per_host->get("b")->async_acquire(1, [&](error_code ec, rein::permit) { waiter_ec = ec; });
  pinned->async_acquire(1, [&](error_code ec, rein::permit) { pinned_waiter_ec = ec; });
  per_host.reset();  // every limiter destroyed, the pinned one too: their waiters complete with operation_aborted
  poll(io);
  CHECK(waiter_ec == error_code(net::error::operation_aborted));
  CHECK(pinned_waiter_ec == error_code(net::error::operation_aborted));
  held.release();
  held_on_pinned.release();
  pinned.reset();  // the last count on "a"'s entry: its node goes now (ASan: no leak, no use after free)
}

TEST_CASE("a key is kept while a permit is held, a waiter waits or a handle pins it", "[keyed][evict]") {
  net::io_context io;
  per_key_semaphore per_host(io, 1, {}, opts(100, 0));  // no sweep on creation: sweep() decides

  rein::permit held = per_host.get("held")->try_acquire();
  REQUIRE(held);

  std::optional<error_code> waiter_ec;
  {
    auto busy = per_host.get("waited");
    rein::permit first = busy->try_acquire();
    busy->async_acquire(1, [&](error_code ec, rein::permit) { waiter_ec = ec; });
    first.release();  // the waiter is granted; its permit is handed to the handler, not yet run
  }
  auto pinned = per_host.get("pinned");
  per_host.get("idle");

  CHECK(per_host.sweep() == 1);  // only "idle"
  CHECK(per_host.contains("held"));
  CHECK(per_host.contains("waited"));  // its grant is still in flight (the permit exists)
  CHECK(per_host.contains("pinned"));
  CHECK_FALSE(per_host.contains("idle"));

  poll(io);  // the waiter's handler runs and drops its permit
  REQUIRE(waiter_ec);
  CHECK_FALSE(*waiter_ec);
  held.release();
  CHECK(per_host.sweep() == 2);
  CHECK(per_host.contains("pinned"));
  pinned.reset();
  CHECK(per_host.sweep() == 1);
  CHECK(per_host.size() == 0);
  CHECK(per_host.snapshot().evicted_total == 4);
}

TEST_CASE("at the cap a new key evicts an idle one, else it is refused with queue_full", "[keyed][cap]") {
  net::io_context io;
  per_key_semaphore per_host(io, 1, {}, opts(2, 0));
  rein::permit a = per_host.get("a")->try_acquire();
  rein::permit b = per_host.get("b")->try_acquire();

  error_code ec;
  auto refused = per_host.get("c", ec);
  CHECK(ec == errc::queue_full);
  CHECK_FALSE(refused);
  try {
    per_host.get("c");
    FAIL("no exception");
  } catch (const rein::system_error& e) {
    CHECK(e.code() == errc::queue_full);
  }
  CHECK(per_host.get("a"));  // existing keys are always served
  CHECK(per_host.snapshot().rejected_total == 2);

  a.release();
  auto c = per_host.get("c", ec);
  CHECK_FALSE(ec);
  CHECK(c);
  CHECK_FALSE(per_host.contains("a"));
  CHECK(per_host.size() == 2);
}

TEST_CASE("at the cap the scan is bounded and moves on, so a retry finds the idle key", "[keyed][cap]") {
  net::io_context io;
  per_key_semaphore per_host(io, 1, {}, opts(3, 0, 1));
  rein::permit a = per_host.get("a")->try_acquire();
  per_host.get("b");  // idle
  rein::permit c = per_host.get("c")->try_acquire();

  // The circular order is a, b, c; one key examined per attempt.
  error_code ec;
  CHECK_FALSE(per_host.get("d", ec));  // examines a: busy
  CHECK(ec == errc::queue_full);
  CHECK(per_host.get("d", ec));  // examines b: idle, evicted
  CHECK_FALSE(ec);
  CHECK_FALSE(per_host.contains("b"));
  CHECK(per_host.contains("a"));
  CHECK(per_host.contains("c"));
}

TEST_CASE("snapshot(key) reads a live key and never makes one; for_each visits every live key", "[keyed]") {
  net::io_context io;
  per_key_semaphore per_host(io, 3, {}, opts(100, 0));
  rein::permit p = per_host.get("x")->try_acquire(2);
  per_host.get("y");

  const auto x = per_host.snapshot("x");
  REQUIRE(x);
  CHECK(x->in_flight == 2);
  CHECK(x->available == 1);
  CHECK_FALSE(per_host.snapshot("absent"));
  CHECK_FALSE(per_host.contains("absent"));
  CHECK_FALSE(per_host.find("absent"));
  CHECK(per_host.find("x").get() == per_host.get("x").get());

  std::map<std::string, std::size_t> seen;
  per_host.for_each([&](const std::string& key, rein::semaphore& sem) {
    seen[key] = sem.snapshot().in_flight;
    per_host.get(key);  // the registry's lock is not held here
  });
  CHECK(seen == std::map<std::string, std::size_t>{{"x", 2}, {"y", 0}});
}

TEST_CASE("keyed quota gates: a paused host is kept until its pause ends", "[keyed][quota_gate]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  using gate_t = rein::basic_quota_gate<net::any_io_executor, manual_clock>;
  rein::quota_gate_options no_jitter;
  no_jitter.jitter = 0.0;
  rein::keyed<gate_t> gates(io, no_jitter, {}, opts(100, 0));

  gates.get("a.example")->pause_for(10s);
  gates.get("b.example");
  CHECK(gates.sweep() == 1);
  CHECK(gates.contains("a.example"));
  CHECK_FALSE(gates.get("a.example")->try_acquire());
  CHECK(gates.get("other.example")->try_acquire());  // one host's pause is not everyone's

  manual_clock::set(manual_clock::time_point{} + 10s);
  CHECK(gates.sweep() == 2);
  CHECK(gates.size() == 0);
}

TEST_CASE("keyed token buckets: a tenant's bucket is kept until it is full again", "[keyed][token_bucket]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  using bucket_t = rein::basic_token_bucket<net::any_io_executor, manual_clock>;
  rein::token_bucket_options per_tenant;
  per_tenant.rate = 10;  // one token per 100 ms
  per_tenant.capacity = 2;
  rein::keyed<bucket_t> tenants(io, per_tenant, {}, opts(100, 0));

  CHECK(tenants.get("t1")->try_acquire());
  tenants.get("t2");
  CHECK(tenants.sweep() == 1);  // t2 is full; t1 is one token short
  CHECK(tenants.contains("t1"));
  manual_clock::set(manual_clock::time_point{} + 99ms);
  CHECK(tenants.sweep() == 0);
  manual_clock::set(manual_clock::time_point{} + 100ms);
  CHECK(tenants.sweep() == 1);  // refilled: a fresh bucket would look the same
}

TEST_CASE("invalid options are rejected with the field and the value", "[keyed][validation]") {
  net::io_context io;
  auto message = [&](rein::keyed_options o) {
    try {
      per_key_semaphore k(io, 1, {}, o);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  CHECK(message(opts(0)) == "rein::keyed: max_keys must be >= 1, got 0");
  CHECK(message(opts(10, 2, 0)) == "rein::keyed: max_scan must be >= 1, got 0");
  CHECK(message(opts(1, 0, 1)) == "no exception");
}

TEST_CASE("keys sprayed from many threads stay within the cap", "[keyed][threads]") {
  net::io_context io;
  per_key_semaphore per_host(io, 2, {}, opts(8, 2, 4));
  std::atomic<int> refused{0};
  std::atomic<int> acquired{0};
  std::atomic<std::size_t> most_keys{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        const std::string key = "host-" + std::to_string((i * 7 + t * 13) % 32);
        error_code ec;
        auto h = per_host.get(key, ec);
        if (ec) {
          refused.fetch_add(1);
          continue;
        }
        if (rein::permit p = h->try_acquire()) acquired.fetch_add(1);
        if (i % 97 == 0) per_host.sweep(3);
        const std::size_t n = per_host.size();
        std::size_t seen = most_keys.load();
        while (n > seen && !most_keys.compare_exchange_weak(seen, n)) {
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(most_keys.load() <= 8);
  CHECK(acquired.load() > 0);
  const auto stats = per_host.snapshot();
  CHECK(stats.created_total == stats.evicted_total + stats.keys);
  CHECK(stats.rejected_total == static_cast<std::uint64_t>(refused.load()));
}

TEST_CASE("invalid limiter options fail where they are given, not at a key's first use", "[keyed][validation]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  using bucket_t = rein::basic_token_bucket<net::any_io_executor, manual_clock>;
  rein::token_bucket_options bad;
  bad.rate = -1;
  bad.capacity = 2;
  CHECK_THROWS_WITH(rein::keyed<bucket_t>(io, bad, {}, opts(100, 0)),
                    "rein::token_bucket: rate must be > 0, finite and at most 1e9 tokens per second, got -1");

  rein::token_bucket_options good;
  good.rate = 10;
  good.capacity = 2;
  rein::keyed<bucket_t> tenants(io, good, {}, opts(100, 0));
  CHECK_THROWS_WITH(tenants.set_override("t1", bad), "rein::token_bucket: rate must be > 0, finite and at most 1e9 tokens per second, got -1");
  CHECK(tenants.get("t1")->capacity() == 2);  // the refused override was not set: the defaults apply
  CHECK(tenants.snapshot().created_total == 1);  // checking made no key
}

namespace {

using adaptive_on_manual_clock = rein::basic_adaptive_limiter<rein::algo::aimd, net::any_io_executor, manual_clock>;
using per_key_adaptive = rein::keyed<adaptive_on_manual_clock>;

// The adaptive limiter's own options (its circuit), given to keyed after the line options and the
// registry's: each key's limiter gets them.
rein::adaptive_limiter_options fail_fast() {
  rein::adaptive_limiter_options o;
  o.circuit.open_after = 1;
  o.circuit.open_for = 1s;
  return o;
}

rein::keyed_options ttl(std::chrono::nanoseconds idle_ttl, std::size_t max_keys = 10'000) {
  rein::keyed_options o = opts(max_keys);
  o.idle_ttl = idle_ttl;
  return o;
}

// One congestion outcome on `key`'s limiter: its learned limit goes from the initial 4 to 4 x 0.8.
template <class Keyed>
void cut_once(Keyed& keyed, const std::string& key) {
  keyed.get(key)->try_acquire().complete(rein::outcome::congestion);
}

// aimd's defaults, but one congestion outcome cuts (it does not wait for failures above a learned rate).
rein::algo::aimd_options every_failure() {
  rein::algo::aimd_options o;
  o.learn_failure_rate = false;
  return o;
}

}  // namespace

TEST_CASE("idle_ttl: an idle key keeps its learned limit until it has gone unused for idle_ttl", "[keyed][ttl]") {
  manual_clock::reset();
  net::io_context io;
  per_key_adaptive per_host(io, every_failure(), {}, ttl(10s));
  STATIC_REQUIRE(std::is_same_v<per_key_adaptive::clock_type, manual_clock>);
  cut_once(per_host, "a");
  CHECK(per_host.get("a")->limit() == 4.0 * 0.8);
  manual_clock::advance(9999ms);
  CHECK(per_host.sweep() == 0);
  CHECK(per_host.get("a")->limit() == 4.0 * 0.8);  // a use: the TTL starts again
  manual_clock::advance(9999ms);
  CHECK(per_host.sweep() == 0);
  manual_clock::advance(1ms);
  CHECK(per_host.sweep() == 1);
  CHECK_FALSE(per_host.contains("a"));
  CHECK(per_host.get("a")->limit() == 4.0);  // made again: the initial limit
}

TEST_CASE("idle_ttl: releasing a handle is a use; a busy key is kept past its TTL", "[keyed][ttl]") {
  manual_clock::reset();
  net::io_context io;
  per_key_adaptive per_host(io, every_failure(), {}, ttl(10s));
  rein::permit held;
  {
    auto h = per_host.get("a");
    manual_clock::advance(30s);  // a long call under the handle
    held = h->try_acquire();
  }  // released at 30 s
  manual_clock::advance(20s);
  CHECK(per_host.sweep() == 0);  // unused for 20 s, but a permit is out
  held.release();
  CHECK(per_host.sweep() == 1);  // its release is no use: 20 s since the handle's release
  per_host.get("b");
  manual_clock::advance(5s);
  per_host.for_each([](const std::string&, adaptive_on_manual_clock&) {});  // metrics: no use
  manual_clock::advance(5s);
  CHECK(per_host.sweep() == 1);
}

TEST_CASE("idle_ttl: at the cap a new key evicts one idle key inside its TTL rather than be refused",
          "[keyed][ttl][cap]") {
  manual_clock::reset();
  net::io_context io;
  per_key_adaptive per_host(io, every_failure(), {}, ttl(1h, 2));
  cut_once(per_host, "a");
  cut_once(per_host, "b");
  auto c = per_host.get("c");  // both idle, both inside the TTL: one of them goes
  CHECK(c);
  CHECK(per_host.size() == 2);
  CHECK(per_host.snapshot().evicted_total == 1);
  CHECK(per_host.contains("a") != per_host.contains("b"));
  auto held = c->try_acquire();
  auto other = per_host.get(per_host.contains("a") ? "a" : "b");
  error_code ec;
  CHECK_FALSE(per_host.get("d", ec));  // nothing idle: refused as before
  CHECK(ec == errc::queue_full);
}

TEST_CASE("idle_ttl: the default 0 evicts as soon as idle; a negative TTL is refused", "[keyed][ttl][validation]") {
  manual_clock::reset();
  net::io_context io;
  per_key_adaptive per_host(io, {});
  CHECK(per_host.get_options().idle_ttl == 0ns);
  cut_once(per_host, "a");
  CHECK(per_host.sweep() == 1);
  CHECK_THROWS_WITH(per_key_adaptive(io, {}, {}, ttl(-1ns)), "rein::keyed: idle_ttl must be >= 0, got -1 ns");
}

TEST_CASE("an override can give one key's adaptive limiter its own circuit", "[keyed][circuit]") {
  manual_clock::reset();
  net::io_context io;
  rein::algo::aimd_options at_floor;
  at_floor.initial_limit = 1;
  per_key_adaptive per_host(io, at_floor);  // no circuit
  per_host.set_override("down.example", at_floor, {}, fail_fast());
  cut_once(per_host, "up.example");
  cut_once(per_host, "down.example");
  CHECK(per_host.get("up.example")->try_acquire().status() == rein::try_status::acquired);
  CHECK(per_host.get("down.example")->try_acquire().status() == rein::try_status::unavailable);
}

TEST_CASE("an adaptive key whose circuit is open is kept until the circuit closes", "[keyed][circuit]") {
  manual_clock::reset();
  net::io_context io;
  rein::algo::aimd_options at_floor;
  at_floor.initial_limit = 1;
  per_key_adaptive per_host(io, at_floor, {}, {}, fail_fast());
  cut_once(per_host, "down.example");  // one congestion at the floor opens it
  CHECK(per_host.sweep() == 0);        // idle, but a fresh limiter would forget the dependency is down
  CHECK(per_host.get("down.example")->try_acquire().status() == rein::try_status::unavailable);
  manual_clock::advance(1s);
  CHECK(per_host.sweep() == 0);  // half-open: the probe decides
  per_host.get("down.example")->try_acquire().complete(rein::outcome::success);
  CHECK(per_host.sweep() == 1);  // closed and idle
}
