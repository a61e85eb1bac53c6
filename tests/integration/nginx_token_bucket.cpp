// rein's token bucket at 0.95 R with a burst no larger than nginx's keeps every request
// under nginx's limit_req (zero 429s) while using the quota (at least 0.93 R achieved).
#include "support/catch.hpp"
#include "support/load.hpp"

#if REIN_HTTP_LOAD_AVAILABLE

using namespace std::chrono_literals;
using rein_test::nginx_limits;

TEST_CASE("nginx: a token bucket at 0.95 R gets no 429 and at least 0.93 R through", "[integration][nginx]") {
  rein_test::nginx_server nginx;
  http_load::config c = rein_test::load_config(nginx, "/rate", 4s);
  c.rate = 0.95 * nginx_limits::rate;
  c.burst = nginx_limits::burst / 2;
  const http_load::report r = rein_test::run_and_print(c, "token bucket at 0.95 R, /rate");
  INFO(nginx.log());
  CHECK(r.total.errors == 0);
  CHECK(r.total.too_many == 0);
  CHECK(r.total.ok == r.total.sent);
  CHECK(r.achieved_rate() >= 0.93 * nginx_limits::rate);
}

#endif

#if REIN_HTTP_LOAD_AVAILABLE

#include <rein/keyed.hpp>
#include <rein/quota_gate.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>

#include <map>

namespace {

namespace net = http_load::net;
namespace beast = http_load::beast;
namespace http = http_load::http;

// Two upstreams behind one throttle with a rate per host: each host's workers send GET /<host> on their own
// keep-alive connections for `duration`, every request through the throttle keyed by host.
struct two_hosts {
  struct host_counts {
    std::uint64_t sent = 0;
    std::uint64_t ok = 0;
    std::uint64_t too_many = 0;
    std::uint64_t other = 0;
  };
  std::map<std::string, host_counts> counts;
};

template <class Throttle>
net::awaitable<void> host_worker(Throttle& throttle, net::ip::tcp::endpoint endpoint, std::string host,
                                 http_load::clock::time_point end, two_hosts& out) {
  beast::tcp_stream stream(co_await net::this_coro::executor);
  co_await stream.async_connect(endpoint, net::use_awaitable);
  beast::flat_buffer buffer;
  http::request<http::empty_body> req{http::verb::get, "/" + host, 11};
  req.set(http::field::host, "127.0.0.1");
  req.keep_alive(true);
  for (;;) {
    typename Throttle::guard g;
    try {
      g = co_await throttle.acquire_until(host, end);
    } catch (const rein::throttle_error& e) {
      if (e.code() == rein::errc::timed_out) break;
      throw;
    }
    if (http_load::clock::now() >= end) break;
    ++out.counts[host].sent;
    co_await http::async_write(stream, req, net::use_awaitable);
    http::response<http::string_body> res;
    co_await http::async_read(stream, buffer, res, net::use_awaitable);
    const int status = static_cast<int>(res.result_int());
    if (status == 429) {
      ++out.counts[host].too_many;
      const auto field = res[http::field::retry_after];
      g.reject(std::string_view(field.data(), field.size()));
    } else {
      (status == 200 ? out.counts[host].ok : out.counts[host].other)++;
      g.complete_http(status);
    }
  }
  beast::error_code ignored;
  stream.socket().shutdown(net::ip::tcp::socket::shutdown_both, ignored);
}

}  // namespace

TEST_CASE("nginx: two hosts with their own quotas behind one throttle with a rate per host",
          "[integration][nginx]") {
  rein_test::nginx_server nginx;
  net::io_context io;
  rein::keyed<rein::quota_gate> gates(io);
  // 0.99 of each host's quota, with a burst of 2 (nginx allows 10): sends stay under it even when the
  // network bunches them a little.
  rein::keyed<rein::token_bucket> rate(io, {}, rein::token_bucket_options{.rate = 1, .capacity = 1});
  rate.set_override("host_a", rein::token_bucket_options{.rate = 0.99 * nginx_limits::host_a, .capacity = 2});
  rate.set_override("host_b", rein::token_bucket_options{.rate = 0.99 * nginx_limits::host_b, .capacity = 2});
  rein::throttle throttle(gates, rate);

  const net::ip::tcp::endpoint endpoint(net::ip::make_address("127.0.0.1"), nginx.port());
  const auto duration = 4s;
  two_hosts out;
  const auto start = http_load::clock::now();
  const auto end = start + duration;
  for (std::string host : {"host_a", "host_b"})
    for (int i = 0; i < 8; ++i)
      net::co_spawn(io, host_worker(throttle, endpoint, host, end, out), [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  io.run();
  const double seconds = std::chrono::duration<double>(duration).count();
  for (const auto& [host, quota] : {std::pair<std::string, double>{"host_a", nginx_limits::host_a},
                                    std::pair<std::string, double>{"host_b", nginx_limits::host_b}}) {
    const auto& c = out.counts[host];
    const double achieved = static_cast<double>(c.ok) / seconds;
    std::printf("%s: quota %.0f/s, sent %llu, 2xx %llu (%.1f/s, %.3f of the quota), 429 %llu\n", host.c_str(), quota,
                static_cast<unsigned long long>(c.sent), static_cast<unsigned long long>(c.ok), achieved,
                achieved / quota, static_cast<unsigned long long>(c.too_many));
    INFO(host << ": " << achieved << "/s of " << quota << "/s");
    INFO(nginx.log());
    CHECK(c.too_many == 0);
    CHECK(c.other == 0);
    CHECK(achieved >= 0.99 * quota);
    CHECK(achieved <= 1.01 * quota);
  }
}

#endif
