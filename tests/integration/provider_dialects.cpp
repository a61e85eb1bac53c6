// Provider headers honoured in each provider's meaning make a client no slower and refused less often.
// Against the emulated provider of each dialect (a quota of 20 requests per second: a continuously
// refilling bucket of 20 for OpenAI and Anthropic, windows of 20 per second for GitHub and the IETF
// fields), a client whose own bucket believes in 25 per second (a guess above the quota, or a quota shared
// with others) makes the same 200 calls twice: reading only the status and Retry-After, then the headers
// too (`guard.complete(rein::read_response(response))`). A refused call waits out the host's pause and is
// sent again, so every call ends in a 200. Real time, with margins.
#include "support/catch.hpp"

#if !defined(REIN_STANDALONE_ASIO)  // Beast needs Boost.Asio

#include "support/provider_emulator.hpp"

#include <rein/beast.hpp>
#include <rein/quota_gate.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
namespace http = boost::beast::http;
using steady = std::chrono::steady_clock;

constexpr int calls = 200;
constexpr int workers = 8;

struct run_result {
  double makespan = 0;       // seconds until the last call's 200
  std::uint64_t refused = 0;  // 429s seen
};

using throttle_type = rein::throttle<rein::quota_gate, rein::token_bucket>;

net::awaitable<void> worker(throttle_type& throttle, unsigned short port, bool headers, int& next, run_result& out,
                            steady::time_point start) {
  boost::beast::tcp_stream stream(co_await net::this_coro::executor);
  co_await stream.async_connect({net::ip::make_address("127.0.0.1"), port}, net::use_awaitable);
  boost::beast::flat_buffer buffer;
  http::request<http::empty_body> req{http::verb::get, "/v1/call", 11};
  req.set(http::field::host, "127.0.0.1");
  while (next < calls) {
    ++next;
    for (;;) {  // until this call is answered 200
      auto guard = co_await throttle.acquire("provider");
      co_await http::async_write(stream, req, net::use_awaitable);
      http::response<http::string_body> res;
      co_await http::async_read(stream, buffer, res, net::use_awaitable);
      const rein::upstream_response r =
          rein::read_response(res, headers ? rein::rate_limit_dialect::detect : rein::rate_limit_dialect::none);
      guard.complete(r);
      if (res.result_int() == 429) {
        ++out.refused;
        continue;
      }
      REQUIRE(res.result_int() == 200);
      out.makespan = std::chrono::duration<double>(steady::now() - start).count();
      break;
    }
  }
}

run_result run(rein_test::quota_dialect dialect, bool headers) {
  rein_test::provider_emulator provider({.dialect = dialect, .requests = {.per_period = 20}});
  net::io_context io;
  rein::quota_gate gate(io);
  rein::token_bucket rate(io, {.rate = 25, .capacity = 20});
  throttle_type throttle(gate, rate);
  run_result out;
  int next = 0;
  const steady::time_point start = steady::now();
  for (int i = 0; i < workers; ++i) {
    net::co_spawn(io, worker(throttle, provider.port(), headers, next, out, start), [](std::exception_ptr e) {
      if (e) std::rethrow_exception(e);
    });
  }
  io.run();
  return out;
}

void compare(rein_test::quota_dialect dialect, const char* name) {
  const run_result without = run(dialect, false);
  const run_result with = run(dialect, true);
  std::printf("%-9s without headers: %.2f s, %llu refused; with: %.2f s (%.3fx), %llu refused\n", name,
              without.makespan, static_cast<unsigned long long>(without.refused), with.makespan,
              with.makespan / without.makespan, static_cast<unsigned long long>(with.refused));
  std::fflush(stdout);
  CHECK(with.makespan <= 1.05 * without.makespan);
  CHECK(with.refused < without.refused);
}

}  // namespace

TEST_CASE("OpenAI's headers (continuous refill): no slower, fewer 429s", "[integration][dialect]") {
  compare(rein_test::quota_dialect::openai, "openai");
}

TEST_CASE("Anthropic's headers (continuous refill): no slower, fewer 429s", "[integration][dialect]") {
  compare(rein_test::quota_dialect::anthropic, "anthropic");
}

TEST_CASE("GitHub-style headers (a window, epoch reset): no slower, fewer 429s", "[integration][dialect]") {
  compare(rein_test::quota_dialect::github, "github");
}

TEST_CASE("IETF RateLimit fields (a window): no slower, fewer 429s", "[integration][dialect]") {
  compare(rein_test::quota_dialect::ietf, "ietf");
}

#endif
