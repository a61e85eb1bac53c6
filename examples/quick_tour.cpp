// The README's first example as a complete program: four stages composed into a throttle around a call.
//
// The "upstream" is simulated (no network): each call takes 10 ms, and host "busy.example" answers 429 with
// Retry-After: 1 to every fifth call. 40 calls over three hosts go through the throttle; the program prints what
// each stage saw and finishes in about 1.5 s. Then the recipe for one upstream with a published quota (60 calls
// per minute, 4 in flight): 12 calls, in three waves of 4 (about 30 ms more).
#include "usage.hpp"

#include <rein/keyed.hpp>
#include <rein/adaptive_limiter.hpp>
#include <rein/quota_gate.hpp>
#include <rein/semaphore.hpp>
#include <rein/sliding_window.hpp>
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

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>

namespace net = rein::net;
using namespace std::chrono_literals;

namespace {

struct response {
  int status;
  std::string retry_after;
};

int busy_calls = 0;

net::awaitable<response> http_get(const std::string& host, const std::string&) {
  net::steady_timer t(co_await net::this_coro::executor, 10ms);
  co_await t.async_wait(net::use_awaitable);
  if (host == "busy.example" && ++busy_calls % 5 == 0) co_return response{429, "1"};
  co_return response{200, {}};
}

int ok = 0;
int rejected = 0;

}  // namespace

constexpr const char* usage =
    "usage: quick_tour [--help]\n"
    "  the README's first example: 40 simulated calls through a throttle of four stages (about 1.5 s)\n";

int main(int argc, char** argv) {
  if (rein_example::asked_for_help(argc, argv, usage)) return 0;
  if (rein_example::unexpected_arguments(argc, argv, usage)) return 2;
  net::io_context io;
  //! [throttle]
  rein::keyed<rein::quota_gate> gates(io, {});                    // a 429 pauses that host for all
  rein::keyed<rein::semaphore> per_host(io, 4);                   // at most 4 in flight per host
  rein::tuned_aimd_limiter global(io);                            // in flight overall, found by feedback
  rein::keyed<rein::token_bucket> rate(io, {.rate = 40, .capacity = 5});
  rein::throttle throttle(gates, per_host, global, rate);         // in admission order; 40/s per host

  auto call = [&](std::string host) -> net::awaitable<void> {
    auto guard = co_await throttle.acquire(host);                   // waits until every stage has room
    auto response = co_await http_get(host, "/v1/items");           // your call
    if (response.status == 429) {
      guard.reject(response.retry_after);                           // pause the host, count congestion
      ++rejected;
    } else {
      guard.complete_http(response.status);                         // success feeds the adaptive limit
      ++ok;
    }
  };
  //! [throttle]

  const char* hosts[] = {"api.example", "busy.example", "cdn.example"};
  for (int i = 0; i < 40; ++i)
    net::co_spawn(io, call(hosts[i % 3]), [](std::exception_ptr e) {
      if (e) std::rethrow_exception(e);
    });
  const auto start = std::chrono::steady_clock::now();
  io.run();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  //! [one_upstream]
  rein::quota_gate gate(io);                                          // a 429 pauses every call
  rein::semaphore in_flight(io, 4);                                   // at most 4 calls at once
  rein::sliding_window per_minute(io, {.limit = 60, .window = 60s});  // at most 60 starts in any minute
  rein::throttle upstream(gate, in_flight, per_minute);               // no keyed stage: the key names nothing

  auto ask = [&]() -> net::awaitable<void> {
    auto guard = co_await upstream.acquire("");
    auto response = co_await http_get("llm.example", "/v1/chat");
    if (response.status == 429) guard.reject(response.retry_after);
    else guard.complete_http(response.status);
  };
  //! [one_upstream]
  for (int i = 0; i < 12; ++i)
    net::co_spawn(io, ask(), [](std::exception_ptr e) {
      if (e) std::rethrow_exception(e);
    });
  io.restart();
  io.run();

  const auto t = throttle.snapshot();
  const auto g = global.snapshot();
  std::printf("%d calls succeeded, %d got 429 in %.2f s\n", ok, rejected, seconds);
  std::printf("throttle: %llu admitted, %llu 429s reported\n", static_cast<unsigned long long>(t.admitted_total),
              static_cast<unsigned long long>(t.rejections_reported));
  std::printf("api.example: %.1f tokens left; global limit %.2f, %zu in flight\n", rate.get("api.example")->tokens(),
              g.limit, g.in_flight);
  std::printf("busy.example gate: %llu pause(s)\n",
              static_cast<unsigned long long>(gates.snapshot("busy.example").value_or(rein::quota_gate_snapshot{}).pauses));
  const auto w = per_minute.snapshot();
  std::printf("one upstream: %llu admitted, %lld starts in the last minute\n",
              static_cast<unsigned long long>(upstream.snapshot().admitted_total), static_cast<long long>(w.in_window));
  if (upstream.snapshot().admitted_total != 12 || w.in_window != 12) return 1;
}
