// The round trip (integration, real time): rein's own client against rein's own server on loopback. The
// server admits through rein::beast::admission and answers with the IETF RateLimit fields; the client is a
// throttle (a quota gate, then a token bucket twice as fast as the server's) fed with
// `guard.complete(rein::read_response(response))`. Once it has read the server's fields, a client that
// honours them must see no 429: the test counts the 429s after the first window and wants none.
//
// The fields' `r` counts what the server admitted when it answered, not the client's requests sent after
// the one answered; the throttle takes those off itself (the units its rate stage admitted since that
// request's admission and still in flight). Before it did, 4 connections saw 3, 2 and 1 429s in windows 0, 1 and 2 (one at the
// end of each window: the requests in flight when `r=0` came back).
#include "support/catch.hpp"

#include <rein/beast.hpp>
#include <rein/beast/server.hpp>
#include <rein/quota_gate.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <iostream>
#include <vector>

namespace {

namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

// The server's policy: 20 per second with a burst of 20, so its fields say q=20;w=1.
constexpr double server_rate = 20;
constexpr std::int64_t server_burst = 20;
constexpr auto window = 1s;
constexpr auto run_for = 2s;

// One keep-alive connection of the in-test server: admit, answer 200 with the fields or the refusal.
net::awaitable<void> session(tcp::socket socket, rein::beast::admission& admission) {
  boost::beast::tcp_stream stream(std::move(socket));
  boost::beast::flat_buffer buffer;
  for (;;) {
    http::request<http::string_body> request;
    boost::system::error_code ec;
    co_await http::async_read(stream, buffer, request, net::redirect_error(net::use_awaitable, ec));
    if (ec) co_return;  // the client closed
    rein::beast::admission_result admitted = co_await admission.admit(request);
    if (!admitted) {
      co_await http::async_write(stream, admitted.response(), net::use_awaitable);
      continue;
    }
    http::response<http::string_body> ok{http::status::ok, request.version()};
    admitted.state()->set_fields(ok, admission.get_options().policy);
    ok.keep_alive(true);
    ok.prepare_payload();
    admitted.permit().release();
    co_await http::async_write(stream, ok, net::use_awaitable);
  }
}

net::awaitable<void> listen(tcp::acceptor& acceptor, rein::beast::admission& admission) {
  for (;;) {
    tcp::socket socket = co_await acceptor.async_accept(net::use_awaitable);
    net::co_spawn(acceptor.get_executor(), session(std::move(socket), admission), net::detached);
  }
}

// What the client saw of one request: when it was sent (from the start) and the status.
struct sent {
  clock_type::duration at;
  unsigned status;
};

// The 200s and 429s of each window of the server's policy, counted by when the request was sent.
struct figures {
  std::vector<int> ok, refused;
};

// rein's client against rein's server for run_for: `connections` coroutines, each with one keep-alive
// connection and one request at a time, through one throttle (a quota gate, then a token bucket twice as
// fast as the server's: the client does not know the server's rate).
figures round_trip(int connections) {
  net::io_context io;
  rein::beast::admission admission(io.get_executor(),
                                   {.rate = server_rate, .burst = server_burst, .concurrency = 64});
  tcp::acceptor acceptor(io, tcp::endpoint(net::ip::address_v4::loopback(), 0));  // a free port
  const tcp::endpoint server = acceptor.local_endpoint();
  net::co_spawn(io, listen(acceptor, admission), net::detached);

  rein::quota_gate_options no_jitter;
  no_jitter.jitter = 0.0;
  rein::quota_gate gate(io, no_jitter);
  rein::token_bucket bucket(io, {.rate = 2 * server_rate, .capacity = 2 * server_burst});
  rein::throttle throttle(gate, bucket);

  const clock_type::time_point start = clock_type::now();
  std::vector<sent> log;
  int running = connections;
  auto client = [&]() -> net::awaitable<void> {
    boost::beast::tcp_stream stream(io);
    co_await stream.async_connect(server, net::use_awaitable);
    boost::beast::flat_buffer buffer;
    while (clock_type::now() - start < run_for) {
      auto guard = co_await throttle.acquire("server");
      const clock_type::duration at = clock_type::now() - start;
      http::request<http::empty_body> request{http::verb::get, "/", 11};
      request.set(http::field::host, "127.0.0.1");
      co_await http::async_write(stream, request, net::use_awaitable);
      http::response<http::string_body> response;
      co_await http::async_read(stream, buffer, response, net::use_awaitable);
      // The fields lower the bucket until their reset, less the requests sent since this one; a 429 pauses
      // the gate for its Retry-After.
      guard.complete(rein::read_response(response));
      log.push_back({at, response.result_int()});
    }
    if (--running == 0) acceptor.close();
  };
  std::exception_ptr failed;
  for (int i = 0; i < connections; ++i)
    net::co_spawn(io, client(), [&](std::exception_ptr e) {
      if (e && !failed) failed = e;
    });
  io.run_for(run_for + 5s);
  if (failed) std::rethrow_exception(failed);
  REQUIRE(running == 0);

  const auto windows = static_cast<std::size_t>(run_for / window) + 1;
  figures f{std::vector<int>(windows), std::vector<int>(windows)};
  for (const sent& s : log) ++(s.status == 200 ? f.ok : f.refused)[static_cast<std::size_t>(s.at / window)];
  for (std::size_t w = 0; w < windows; ++w) {
    std::cout << "round trip, " << connections << " connection(s): window " << w << ": 200=" << f.ok[w] << " 429=" << f.refused[w] << '\n';
  }
  return f;
}

}  // namespace

TEST_CASE("round trip: one request at a time, the client honouring the fields sees no 429 after the first window",
          "[beast][integration]") {
  const figures f = round_trip(1);
  CHECK(f.ok[0] == server_burst);  // the burst, then r=0;t=1 holds the client to the next window
  for (std::size_t w = 1; w < f.refused.size(); ++w) CHECK(f.refused[w] == 0);
}

TEST_CASE("round trip: four connections honouring the fields see no 429 after the first window",
          "[beast][integration]") {
  const figures f = round_trip(4);
  CHECK(f.ok[0] == server_burst);
  for (std::size_t w = 1; w < f.refused.size(); ++w) CHECK(f.refused[w] == 0);
}
