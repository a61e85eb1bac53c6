// Several upstream hosts behind one throttle keyed by host, in real time: each host's workers send GET
// /<host> on their own keep-alive connections through `throttle.acquire_until(host, end)` and report every
// answer with `guard.complete(rein::read_response(response))`, as a user would. What each host got is
// counted with the instant of every answer, so that a test can read any interval of the run.
#pragma once

#include "../../../examples/http_load.hpp"

#if REIN_HTTP_LOAD_AVAILABLE

#include <rein/beast.hpp>
#include <rein/throttle.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace rein_test {

/// One host of a run: its path on the server (`/exact_a` is host "exact_a"), its quota in requests per
/// second (for the report), and how many workers send to it.
struct host_spec {
  std::string name;
  double quota = 0;
  int workers = 4;
  std::chrono::nanoseconds think{};  ///< each worker's pause after an answer before it asks again
};

/// What one host got.
struct host_result {
  std::vector<double> ok_at;         ///< seconds from the start, of every 2xx answer
  std::vector<double> refused_at;    ///< ... of every 429
  std::vector<double> admission_ms;  ///< each admission's wait in the throttle, milliseconds
  std::uint64_t other = 0;           ///< answers neither 2xx nor 429

  /// 2xx answers per second over [from, to) seconds of the run.
  double ok_rate(double from, double to) const { return static_cast<double>(count(ok_at, from, to)) / (to - from); }
  /// 429s in [from, to).
  std::uint64_t refused(double from, double to) const { return count(refused_at, from, to); }
  /// Share of the answers in [from, to) that were 429.
  double refused_share(double from, double to) const {
    const double all = static_cast<double>(count(ok_at, from, to) + count(refused_at, from, to));
    return all == 0 ? 0.0 : static_cast<double>(refused(from, to)) / all;
  }
  /// The median admission wait, milliseconds.
  double median_admission_ms() const {
    if (admission_ms.empty()) return 0;
    std::vector<double> v = admission_ms;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  }

 private:
  static std::uint64_t count(const std::vector<double>& at, double from, double to) {
    return static_cast<std::uint64_t>(std::count_if(at.begin(), at.end(), [&](double t) { return t >= from && t < to; }));
  }
};

namespace hosts_detail {

namespace net = http_load::net;
namespace beast = http_load::beast;
namespace http = http_load::http;
using clock = http_load::clock;

inline double seconds_between(clock::time_point a, clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

template <class Throttle>
net::awaitable<void> worker(Throttle& throttle, net::ip::tcp::endpoint endpoint, host_spec host_is, clock::time_point start,
                            clock::time_point end, host_result& out) {
  const std::string host = host_is.name;
  net::steady_timer think(co_await net::this_coro::executor);
  beast::tcp_stream stream(co_await net::this_coro::executor);
  co_await stream.async_connect(endpoint, net::use_awaitable);
  beast::flat_buffer buffer;
  http::request<http::empty_body> req{http::verb::get, "/" + host, 11};
  req.set(http::field::host, "127.0.0.1");
  req.keep_alive(true);
  for (;;) {
    typename Throttle::guard g;
    const clock::time_point asked = clock::now();
    try {
      g = co_await throttle.acquire_until(host, end);
    } catch (const rein::throttle_error& e) {
      if (e.code() == rein::errc::timed_out) break;
      throw;
    }
    const clock::time_point admitted = clock::now();
    if (admitted >= end) break;
    out.admission_ms.push_back(seconds_between(asked, admitted) * 1e3);
    co_await http::async_write(stream, req, net::use_awaitable);
    http::response<http::string_body> res;
    co_await http::async_read(stream, buffer, res, net::use_awaitable);
    const double at = seconds_between(start, clock::now());
    const int status = static_cast<int>(res.result_int());
    if (status == 429) out.refused_at.push_back(at);
    else if (status / 100 == 2) out.ok_at.push_back(at);
    else ++out.other;
    g.complete(rein::read_response(res));
    if (host_is.think.count() > 0) {
      think.expires_after(host_is.think);
      co_await think.async_wait(net::use_awaitable);
    }
  }
  beast::error_code ignored;
  stream.socket().shutdown(net::ip::tcp::socket::shutdown_both, ignored);
}

}  // namespace hosts_detail

/// Runs every host's workers through `throttle` against the server at `port` for `duration`, on `io` (run
/// here until every worker has ended), and returns what each host got, by name.
template <class Throttle>
std::map<std::string, host_result> run_hosts(hosts_detail::net::io_context& io, Throttle& throttle, unsigned short port,
                                             const std::vector<host_spec>& hosts, std::chrono::nanoseconds duration) {
  namespace net = hosts_detail::net;
  const net::ip::tcp::endpoint endpoint(net::ip::make_address("127.0.0.1"), port);
  std::map<std::string, host_result> out;
  const auto start = hosts_detail::clock::now();
  const auto end = start + duration;
  for (const host_spec& h : hosts)
    for (int i = 0; i < h.workers; ++i)
      net::co_spawn(io, hosts_detail::worker(throttle, endpoint, h, start, end, out[h.name]),
                    [](std::exception_ptr e) {
                      if (e) std::rethrow_exception(e);
                    });
  io.run();
  io.restart();
  return out;
}

/// Prints one line per host: its quota, what it got over [from, to) seconds, its 429s, its median wait.
inline void print_hosts(const char* title, const std::vector<host_spec>& hosts, std::map<std::string, host_result>& r,
                        double from, double to) {
  std::printf("==== %s (seconds %.0f to %.0f)\n", title, from, to);
  for (const host_spec& h : hosts) {
    const host_result& x = r[h.name];
    const double rate = x.ok_rate(from, to);
    std::printf("%-9s quota %5.1f/s: %6.2f/s = %.3f of it, 429 %llu (%.2f %%), median admission %.2f ms\n",
                h.name.c_str(), h.quota, rate, rate / h.quota, static_cast<unsigned long long>(x.refused(from, to)),
                100 * x.refused_share(from, to), x.median_admission_ms());
  }
  std::fflush(stdout);
}

/// Prints each second's 2xx/429 counts of one host over [0, seconds): where a run lost its quota.
inline void print_seconds(const host_result& x, int seconds) {
  for (int s = 0; s < seconds; ++s) {
    std::printf("%d:%llu/%llu ", s, static_cast<unsigned long long>(x.ok_rate(s, s + 1)),
                static_cast<unsigned long long>(x.refused(s, s + 1)));
  }
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace rein_test

#endif
