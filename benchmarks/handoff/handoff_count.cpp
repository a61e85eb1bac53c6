// The contended handoff of benchmarks/semaphore.cpp (64 coroutines share 4 permits: acquire, co_await post,
// release) for an exact number of iterations, so that an instruction counter (callgrind) can compare the
// idioms without the timing noise of code placement, which moves the contended rows of the timed benchmark
// by up to 15% between builds of the same code. instructions.sh runs it.
//
//   rein_handoff_count <idiom> <iterations> [reactor: 0|1, default 1]
//   idioms: floor, bare_semaphore (rein_bench::handoff_floor), single_thread_semaphore, semaphore,
//           single_thread_semaphore_untimed, semaphore_untimed,
//           single_thread_semaphore_observed, semaphore_observed (an observer set that counts events),
//           single_thread_semaphore_coarse, semaphore_coarse (waits timed on the coarse clock),
//           single_thread_semaphore_direct, semaphore_direct (line_options::direct_handoff),
//           channel_async_send, channel_try_send_then_async_send, concurrent_channel_async_send,
//           concurrent_channel_try_send_then_async_send,
//           throttle_uncontended (one coroutine: `co_await throttle.acquire(key)` and complete, every stage
//           admitting at once), throttle_contended (64 coroutines over 8 keys, the global semaphore of 4
//           permits the one stage that makes them wait: acquire, co_await post, complete); both on the
//           four stages of benchmarks/throttle.cpp (keyed gate, keyed semaphore, global semaphore, token
//           bucket), the keyed ones never full and the bucket bottomless
#include "../support/channel_semaphore.hpp"
#include "../support/floors.hpp"

#include <rein/config.hpp>
#include <rein/observer.hpp>
#include <rein/keyed.hpp>
#include <rein/outcome.hpp>
#include <rein/permit.hpp>
#include <rein/quota_gate.hpp>
#include <rein/semaphore.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#else
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#endif

#include <array>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

namespace {

namespace net = rein::net;
using rein_bench::channel_semaphore;
using rein_bench::post_round_trip;

constexpr int coroutines = 64;
constexpr std::size_t permits = 4;
long remaining = 0;

bool next() noexcept { return remaining-- > 0; }

net::awaitable<void> floor_loop() {
  while (next()) co_await post_round_trip();
}

template <class Sem>
net::awaitable<void> rein_loop(Sem& sem) {
  while (next()) {
    rein::permit p = co_await sem.acquire();
    co_await post_round_trip();
  }
}

template <class Sem>
net::awaitable<void> idiom_loop(Sem& sem) {
  while (next()) {
    co_await sem.acquire();
    co_await post_round_trip();
    sem.release();
  }
}

template <class Sem, class Loop>
void run(net::io_context& io, Sem& sem, Loop loop) {
  for (int i = 0; i < coroutines; ++i) net::co_spawn(io, loop(sem), net::detached);
  io.run();
}

template <class Channel, bool TrySendFirst>
void run_channel(net::io_context& io) {
  channel_semaphore<Channel, TrySendFirst> sem(io.get_executor(), permits);
  run(io, sem, [](auto& s) { return idiom_loop(s); });
}

long observed_events = 0;

template <class Sem>
void run_rein(net::io_context& io, bool measure_wait, bool observed = false, bool coarse = false,
              bool direct = false) {
  rein::limiter_observer observer;
  if (observed) observer = [](const rein::limiter_event&) { ++observed_events; };
  Sem sem(io.get_executor(), permits,
          {.observer = std::move(observer),
           .measure_wait = measure_wait,
           .coarse_wait_clock = coarse,
           .direct_handoff = direct});
  run(io, sem, [](auto& s) { return rein_loop(s); });
}

// The four stages of benchmarks/throttle.cpp; only the global semaphore can run out.
struct throttle_stages {
  throttle_stages(const net::any_io_executor& ex, std::size_t global_permits)
      : gates(ex, {}),
        per_key(ex, std::size_t{1'000'000}),
        global(ex, global_permits),
        rate(ex, rein::token_bucket_options{.rate = 1e9, .capacity = 1'000'000'000'000'000}) {}
  rein::keyed<rein::quota_gate> gates;
  rein::keyed<rein::semaphore> per_key;
  rein::semaphore global;
  rein::token_bucket rate;
  rein::throttle<rein::keyed<rein::quota_gate>, rein::keyed<rein::semaphore>, rein::semaphore, rein::token_bucket>
      throttle{gates, per_key, global, rate};
};

// 24 characters, as benchmarks/throttle.cpp's host: longer than std::string's small buffer.
const std::array<std::string, 8> hosts{"api-0.provider.example.com", "api-1.provider.example.com",
                                       "api-2.provider.example.com", "api-3.provider.example.com",
                                       "api-4.provider.example.com", "api-5.provider.example.com",
                                       "api-6.provider.example.com", "api-7.provider.example.com"};

template <class Throttle>
net::awaitable<void> throttle_loop(Throttle& t, const std::string& key, bool yield) {
  while (next()) {
    auto guard = co_await t.acquire(key);
    if (yield) co_await post_round_trip();
    guard.complete(rein::outcome::success);
  }
}

void run_throttle(net::io_context& io, bool contended) {
  throttle_stages s(io.get_executor(), contended ? permits : std::size_t{1'000'000});
  const int loops = contended ? coroutines : 1;
  for (int i = 0; i < loops; ++i)
    net::co_spawn(io, throttle_loop(s.throttle, hosts[static_cast<std::size_t>(i) % hosts.size()], contended),
                  net::detached);
  io.run();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <idiom> <iterations> [reactor 0|1]\n", argv[0]);
    return 2;
  }
  const std::string idiom = argv[1];
  remaining = std::atol(argv[2]);
  net::io_context io;
  std::optional<net::steady_timer> reactor;  // a timer starts the io_context's reactor
  if (argc < 4 || std::atoi(argv[3]) != 0) reactor.emplace(io);
  using rein_bench::channel;
  using rein_bench::concurrent_channel;
  if (idiom == "floor") {
    for (int i = 0; i < coroutines; ++i) net::co_spawn(io, floor_loop(), net::detached);
    io.run();
  } else if (idiom == "bare_semaphore") {
    rein_bench::handoff_floor sem(io.get_executor(), permits);
    run(io, sem, [](auto& s) { return idiom_loop(s); });
  } else if (idiom == "single_thread_semaphore") {
    run_rein<rein::single_thread_semaphore>(io, true);
  } else if (idiom == "semaphore") {
    run_rein<rein::semaphore>(io, true);
  } else if (idiom == "single_thread_semaphore_untimed") {
    run_rein<rein::single_thread_semaphore>(io, false);
  } else if (idiom == "semaphore_untimed") {
    run_rein<rein::semaphore>(io, false);
  } else if (idiom == "single_thread_semaphore_observed") {
    run_rein<rein::single_thread_semaphore>(io, true, true);
  } else if (idiom == "semaphore_observed") {
    run_rein<rein::semaphore>(io, true, true);
  } else if (idiom == "single_thread_semaphore_coarse") {
    run_rein<rein::single_thread_semaphore>(io, true, false, true);
  } else if (idiom == "semaphore_coarse") {
    run_rein<rein::semaphore>(io, true, false, true);
  } else if (idiom == "single_thread_semaphore_direct") {
    run_rein<rein::single_thread_semaphore>(io, true, false, false, true);
  } else if (idiom == "semaphore_direct") {
    run_rein<rein::semaphore>(io, true, false, false, true);
  } else if (idiom == "channel_async_send") {
    run_channel<channel, false>(io);
  } else if (idiom == "channel_try_send_then_async_send") {
    run_channel<channel, true>(io);
  } else if (idiom == "concurrent_channel_async_send") {
    run_channel<concurrent_channel, false>(io);
  } else if (idiom == "concurrent_channel_try_send_then_async_send") {
    run_channel<concurrent_channel, true>(io);
  } else if (idiom == "throttle_uncontended") {
    run_throttle(io, false);
  } else if (idiom == "throttle_contended") {
    run_throttle(io, true);
  } else {
    std::fprintf(stderr, "unknown idiom: %s\n", idiom.c_str());
    return 2;
  }
  return remaining < 0 ? 0 : 1;  // every iteration ran
}
