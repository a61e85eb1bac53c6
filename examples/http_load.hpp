// The HTTP load generator behind examples/http_load.cpp and the nginx integration tests.
//
// Workers (coroutines, one keep-alive HTTP/1.1 connection each, Boost.Beast) send GET requests to one URL
// for a given time, each request through a rein::throttle keyed by host:
//
//   quota gate of the host (Retry-After pauses everyone) -> global concurrency (semaphore or AIMD) -> rate
//   (token bucket or adaptive rate, taken at the send) -> the gate again -> send
//
// and report the answer back: the guard's outcome feeds AIMD and the adaptive rate, and `reject(Retry-After)`
// pauses the host's gate. Everything runs on one thread.
#pragma once

#if defined(REIN_STANDALONE_ASIO)
// Boost.Beast is written for Boost.Asio; with standalone Asio there is no HTTP client to build.
#define REIN_HTTP_LOAD_AVAILABLE 0
#else
#define REIN_HTTP_LOAD_AVAILABLE 1

#include <rein/adaptive_limiter.hpp>
#include <rein/adaptive_rate_limiter.hpp>
#include <rein/error.hpp>
#include <rein/keyed.hpp>
#include <rein/outcome.hpp>
#include <rein/quota_gate.hpp>
#include <rein/semaphore.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
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
#include <exception>
#include <iomanip>
#include <optional>
#include <ostream>
#include <sstream>

#if defined(REIN_EXAMPLE_METRICS)
#include <rein/prometheus/collector.hpp>

#include <prometheus/exposer.h>

#include <memory>
#endif
#include <string>
#include <string_view>
#include <vector>

namespace http_load {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

/// The parts of an `http://host[:port][/path]` URL.
struct url_parts {
  std::string host;
  std::string port = "80";
  std::string target = "/";
};

/// Parses a plain-HTTP URL; std::nullopt for anything else (https, no host, a bad port).
inline std::optional<url_parts> parse_url(std::string_view url) {
  constexpr std::string_view scheme = "http://";
  if (url.substr(0, scheme.size()) != scheme) return std::nullopt;
  url.remove_prefix(scheme.size());
  url_parts parts;
  const std::size_t slash = url.find('/');
  if (slash != std::string_view::npos) parts.target = std::string(url.substr(slash));
  const std::string_view authority = url.substr(0, slash);
  const std::size_t colon = authority.rfind(':');
  parts.host = std::string(authority.substr(0, colon));
  if (colon != std::string_view::npos) parts.port = std::string(authority.substr(colon + 1));
  const bool port_ok = !parts.port.empty() && parts.port.size() <= 5 &&
                       parts.port.find_first_not_of("0123456789") == std::string::npos;
  if (parts.host.empty() || !port_ok) return std::nullopt;
  return parts;
}

/// How the number of requests in flight is bounded.
enum class concurrency_kind {
  none,   ///< by the number of workers only
  fixed,  ///< rein::semaphore with `concurrency` permits
  aimd,   ///< rein::aimd_limiter starting at `concurrency`
};

/// What to run.
struct config {
  url_parts url;
  int workers = 16;                     ///< coroutines, each with its own keep-alive connection
  clock::duration duration = 3s;        ///< how long requests are started
  std::optional<double> rate;           ///< token bucket rate (requests per second); the adaptive rate's start
  std::int64_t burst = 10;              ///< the bucket's capacity
  bool adaptive_rate = false;           ///< the rate follows 429/503 (rein::adaptive_rate_limiter)
  concurrency_kind concurrency = concurrency_kind::none;
  std::size_t concurrency_limit = 0;    ///< semaphore permits, or AIMD's starting limit
  rein::algo::aimd_options aimd;        ///< AIMD's options (initial_limit and max_limit from concurrency_limit)
  bool quota_gate = true;               ///< honour Retry-After on a 429 or 503 by pausing every worker
  clock::duration default_pause = 1s;   ///< pause for a Retry-After that cannot be parsed
  clock::duration request_timeout = 10s;
  bool progress = false;                ///< print a progress line on stdout once a second
  std::string metrics_address;          ///< serve /metrics there during the run (needs rein::prometheus)
};

/// Counters of requests, by the second in which they were sent.
struct counts {
  std::uint64_t sent = 0;
  std::uint64_t ok = 0;           ///< 2xx
  std::uint64_t too_many = 0;     ///< 429
  std::uint64_t unavailable = 0;  ///< 503
  std::uint64_t other = 0;        ///< any other status
  std::uint64_t errors = 0;       ///< no answer: connection or timeout errors

  counts& operator+=(const counts& c) {
    sent += c.sent, ok += c.ok, too_many += c.too_many, unavailable += c.unavailable, other += c.other;
    errors += c.errors;
    return *this;
  }
};

/// One second of the run: its counts and the adaptive limits at its end.
struct second : counts {
  std::optional<double> rate;               ///< the adaptive rate, requests per second
  std::optional<double> concurrency_limit;  ///< AIMD's limit
};

/// A Retry-After applied to the quota gate: at `at` the gate was closed until `until`.
struct pause_event {
  clock::time_point at;
  clock::time_point until;
};

/// What a run measured.
struct report {
  config cfg;
  std::string limits;                      ///< the limiters in force, described
  counts total;
  clock::time_point start;
  clock::duration elapsed{};               ///< from the start to the last answer (sending stops at cfg.duration)
  std::vector<clock::duration> latencies;  ///< send to complete answer, every answered request, sorted
  clock::duration limiter_wait{};          ///< summed over requests: time from asking the limiters to sending
  std::vector<second> seconds;             ///< by the second in which requests were sent
  std::vector<clock::time_point> sends;    ///< every send, in order
  std::vector<pause_event> pauses;
  std::vector<std::string> snapshots;      ///< each limiter's snapshot at the end, one line each

  /// The sending window (cfg.duration) in seconds: rates are per second of it.
  double window_seconds() const { return std::chrono::duration<double>(cfg.duration).count(); }
  /// 2xx answers per second of the sending window.
  double achieved_rate() const { return static_cast<double>(total.ok) / window_seconds(); }
  /// Requests sent per second of the sending window.
  double send_rate() const { return static_cast<double>(total.sent) / window_seconds(); }

  /// The latency at quantile q in [0, 1] (nearest rank); zero without answers.
  clock::duration latency(double q) const {
    if (latencies.empty()) return {};
    const auto rank = static_cast<std::size_t>(q * static_cast<double>(latencies.size() - 1) + 0.5);
    return latencies[std::min(rank, latencies.size() - 1)];
  }

  /// Counts of the requests sent from second `first` on (0: the whole run).
  counts from_second(std::size_t first) const {
    counts c;
    for (std::size_t i = first; i < seconds.size(); ++i) c += seconds[i];
    return c;
  }
};

namespace detail {

inline std::string fixed(double v, int decimals) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(decimals) << v;
  return out.str();
}

inline std::string ms(clock::duration d) { return fixed(std::chrono::duration<double, std::milli>(d).count(), 2) + " ms"; }

inline std::string describe(const config& c) {
  std::vector<std::string> parts;
  if (c.quota_gate) parts.push_back("quota gate per host (Retry-After)");
  if (c.rate) {
    parts.push_back((c.adaptive_rate ? "adaptive rate from " : "token bucket ") + fixed(*c.rate, 1) + "/s burst " +
                    std::to_string(c.burst));
  }
  if (c.concurrency == concurrency_kind::fixed) parts.push_back("semaphore " + std::to_string(c.concurrency_limit));
  if (c.concurrency == concurrency_kind::aimd) {
    parts.push_back("aimd from " + std::to_string(c.concurrency_limit));
    parts.back() += c.aimd.latency_tolerance ? ", latency x " + fixed(*c.aimd.latency_tolerance, 2) + " noise floor " +
                                                   ms(c.aimd.noise_floor)
                                             : ", latency not judged";
  }
  if (parts.empty()) return "none";
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

// Anything rein can print (every snapshot has an operator<<), as a string.
template <class T>
std::string to_line(const T& value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

// The throttle's stages, each present only if configured (the gates always: without --no-gate nothing
// pauses them, and an open gate costs a lookup).
struct limiters {
  rein::keyed<rein::quota_gate> gates;
  std::optional<rein::token_bucket> bucket;
  std::optional<rein::adaptive_rate_limiter> adaptive;
  std::optional<rein::semaphore> semaphore;
  std::optional<rein::aimd_limiter> aimd;

  limiters(net::io_context& io, const config& c) : gates(io, {}) {
    if (c.rate && !c.adaptive_rate) bucket.emplace(io, rein::token_bucket_options{.rate = *c.rate, .capacity = c.burst});
    if (c.rate && c.adaptive_rate) {
      rein::algo::adaptive_rate_options o;
      o.initial_rate = *c.rate;
      o.burst = c.burst;
      adaptive.emplace(io, o);
    }
    if (c.concurrency == concurrency_kind::fixed) semaphore.emplace(io, c.concurrency_limit);
    if (c.concurrency == concurrency_kind::aimd) {
      rein::algo::aimd_options o = c.aimd;
      o.initial_limit = static_cast<double>(c.concurrency_limit);
      o.max_limit = std::max(64.0, o.initial_limit);
      aimd.emplace(io, o);
    }
  }

  // Calls f with the rate stage and the global stage as configured (rein::unlimited where none), so that one
  // rein::throttle type is instantiated per combination.
  template <class F>
  void with_stages(F&& f) {
    with_rate([&](auto& rate) {
      if (semaphore) return f(rate, *semaphore);
      if (aimd) return f(rate, *aimd);
      return f(rate, rein::unlimited);
    });
  }

  template <class F>
  void with_rate(F&& f) {
    if (bucket) return f(*bucket);
    if (adaptive) return f(*adaptive);
    return f(rein::unlimited);
  }

  // Every stage's snapshot in rein's one-line form (operator<<).
  std::vector<std::string> snapshots(const std::string& host) const {
    std::vector<std::string> lines;
    if (const auto s = gates.snapshot(host)) lines.push_back("quota_gate[" + host + "]: " + to_line(*s));
    if (bucket) lines.push_back("token_bucket: " + to_line(bucket->snapshot()));
    if (adaptive) lines.push_back("adaptive_rate_limiter: " + to_line(adaptive->snapshot()));
    if (semaphore) lines.push_back("semaphore: " + to_line(semaphore->snapshot()));
    if (aimd) lines.push_back("aimd_limiter: " + to_line(aimd->snapshot()));
    return lines;
  }
};

inline std::string throttle_line(const rein::throttle_snapshot& s) { return "throttle: " + to_line(s); }

#if defined(REIN_EXAMPLE_METRICS)
// /metrics for Prometheus while the load runs (rein::prometheus, prometheus-cpp's exposer): every stage, read
// at each scrape from its snapshot.
template <class Throttle>
class metrics_server {
 public:
  metrics_server(const std::string& address, limiters& l, const Throttle& throttle)
      : collector_(std::make_shared<rein::prometheus::collector>()), exposer_(address) {
    collector_->add(throttle, "throttle");
    collector_->add_keyed(l.gates, "gates");
    if (l.bucket) collector_->add(*l.bucket, "rate");
    if (l.adaptive) collector_->add(*l.adaptive, "rate");
    if (l.semaphore) collector_->add(*l.semaphore, "concurrency");
    if (l.aimd) collector_->add(*l.aimd, "concurrency");
    exposer_.RegisterCollectable(collector_);
  }

 private:
  std::shared_ptr<rein::prometheus::collector> collector_;
  prometheus::Exposer exposer_;
};
#endif

// Everything the workers share. One thread: no locking.
template <class Throttle>
struct run_state {
  const config& cfg;
  limiters& limits;
  Throttle& throttle;
  net::ip::tcp::resolver::results_type endpoints;
  report& out;
  clock::time_point end;

  second& second_of(clock::time_point t) {
    const auto index = static_cast<std::size_t>(std::max<clock::rep>(0, (t - out.start) / 1s));
    if (out.seconds.size() <= index) out.seconds.resize(index + 1);
    return out.seconds[index];
  }
};

// Passes the throttle; std::nullopt when the run is over. Throws what the throttle throws, except its
// timeout at the run's end.
template <class Throttle>
net::awaitable<std::optional<typename Throttle::guard>> admit(run_state<Throttle>& s) {
  using guard = typename Throttle::guard;
  if (clock::now() >= s.end) co_return std::nullopt;  // with no limiter, nothing else would tell
  const clock::time_point asked = clock::now();
  try {
    guard g = co_await s.throttle.acquire_until(s.cfg.url.host, s.end);
    const clock::time_point now = clock::now();
    s.out.limiter_wait += now - asked;
    // A grant due at the deadline's very instant wins over the timeout, but the sending window is over.
    if (now < s.end) co_return std::optional<guard>(std::move(g));
  } catch (const rein::system_error& e) {
    if (e.code() != rein::errc::timed_out) throw;
  }
  co_return std::nullopt;
}

// Applies one answer to the limiters and the report.
template <class Throttle, class Guard>
void account(run_state<Throttle>& s, Guard& g, clock::time_point sent, const http::response<http::string_body>& res) {
  const int status = static_cast<int>(res.result_int());
  const rein::outcome result = rein::classify_http_status(status);  // the guard feeds every adaptive stage
  second& sec = s.second_of(sent);
  if (status >= 200 && status < 300) {
    ++sec.ok;
  } else if (status == 429) {
    ++sec.too_many;
  } else if (status == 503) {
    ++sec.unavailable;
  } else {
    ++sec.other;
  }
  const auto retry_after = res.find(http::field::retry_after);
  if (s.cfg.quota_gate && (status == 429 || status == 503) && retry_after != res.end()) {
    const clock::time_point now = clock::now();
    const auto value = retry_after->value();
    g.reject(std::string_view(value.data(), value.size()));  // pauses the host's gate, then releases
    if (auto gate = s.limits.gates.find(s.cfg.url.host)) {
      const clock::time_point until = gate->paused_until();
      if (until > now) s.out.pauses.push_back({now, until});
    }
  } else {
    g.complete(result);
  }
  s.out.latencies.push_back(clock::now() - sent);
}

// A failed exchange: no answer to learn from, except that a timeout means "too much".
template <class Throttle, class Guard>
void account_error(run_state<Throttle>& s, Guard& g, clock::time_point sent, const beast::error_code& ec) {
  const bool timeout = ec == beast::error::timeout;
  g.complete(timeout ? rein::outcome::congestion : rein::outcome::ignored);
  ++s.second_of(sent).errors;
}

template <class Throttle>
net::awaitable<void> worker(run_state<Throttle>& s) {
  beast::tcp_stream stream(co_await net::this_coro::executor);
  beast::flat_buffer buffer;
  http::request<http::empty_body> req{http::verb::get, s.cfg.url.target, 11};
  req.set(http::field::host, s.cfg.url.host);
  req.set(http::field::user_agent, "rein-http_load");
  req.keep_alive(true);
  bool connected = false;
  for (;;) {
    auto g = co_await admit(s);
    if (!g) break;
    if (!connected) {
      stream.expires_after(s.cfg.request_timeout);
      auto [ec, endpoint] = co_await stream.async_connect(s.endpoints, net::as_tuple(net::use_awaitable));
      (void)endpoint;
      if (ec) {
        g->complete(rein::outcome::ignored);
        ++s.second_of(clock::now()).errors;
        co_await net::steady_timer(stream.get_executor(), 100ms).async_wait(net::as_tuple(net::use_awaitable));
        continue;
      }
      connected = true;
    }
    const clock::time_point sent = clock::now();
    s.out.sends.push_back(sent);
    ++s.second_of(sent).sent;
    stream.expires_after(s.cfg.request_timeout);
    auto [write_ec, written] = co_await http::async_write(stream, req, net::as_tuple(net::use_awaitable));
    (void)written;
    http::response<http::string_body> res;
    beast::error_code ec = write_ec;
    if (!ec) {
      auto [read_ec, read] = co_await http::async_read(stream, buffer, res, net::as_tuple(net::use_awaitable));
      (void)read;
      ec = read_ec;
    }
    if (ec) {
      account_error(s, *g, sent, ec);
      beast::error_code ignored;
      stream.socket().close(ignored);
      buffer.clear();
      connected = false;
      continue;
    }
    account(s, *g, sent, res);
    if (!res.keep_alive()) {
      beast::error_code ignored;
      stream.socket().shutdown(net::ip::tcp::socket::shutdown_both, ignored);
      stream.socket().close(ignored);
      connected = false;
    }
  }
  beast::error_code ignored;
  stream.socket().shutdown(net::ip::tcp::socket::shutdown_both, ignored);
}

inline std::string progress_line(const report& out, const limiters& l, std::size_t second_index) {
  const counts c = out.from_second(0);
  std::string line = "t=" + std::to_string(second_index) + "s sent " + std::to_string(c.sent) + " 2xx " +
                     std::to_string(c.ok) + " 429 " + std::to_string(c.too_many) + " 503 " + std::to_string(c.unavailable);
  if (l.adaptive) line += " rate " + fixed(l.adaptive->rate(), 1) + "/s";
  if (l.aimd) line += " limit " + fixed(l.aimd->limit(), 2);
  return line;
}

// Once a second: samples the adaptive limits into the report and prints the progress line.
template <class Throttle>
net::awaitable<void> ticker(run_state<Throttle>& s) {
  net::steady_timer timer(co_await net::this_coro::executor);
  for (std::size_t i = 1; s.out.start + i * 1s <= s.end; ++i) {
    timer.expires_at(s.out.start + i * 1s);
    co_await timer.async_wait(net::use_awaitable);
    second& sec = s.second_of(s.out.start + (i - 1) * 1s);
    if (s.limits.adaptive) sec.rate = s.limits.adaptive->rate();
    if (s.limits.aimd) sec.concurrency_limit = s.limits.aimd->limit();
    if (s.cfg.progress) {
      std::printf("\r%s   ", progress_line(s.out, s.limits, i).c_str());
      std::fflush(stdout);
    }
  }
}

// Runs the workers through `throttle` until the end; the throttle's counters go into the report.
template <class Throttle>
void run_with(net::io_context& io, const config& cfg, limiters& limits, Throttle& throttle,
              const net::ip::tcp::resolver::results_type& endpoints, report& out) {
  out.start = clock::now();
  run_state<Throttle> state{cfg, limits, throttle, endpoints, out, out.start + cfg.duration};
  std::exception_ptr failure;
  auto remember = [&failure](std::exception_ptr e) {
    if (e && !failure) failure = e;
  };
  for (int i = 0; i < cfg.workers; ++i) net::co_spawn(io, worker(state), remember);
  net::co_spawn(io, ticker(state), remember);
  io.run();
  if (cfg.progress) std::printf("\n");
  if (failure) std::rethrow_exception(failure);
  out.elapsed = clock::now() - out.start;
  out.snapshots.push_back(throttle_line(throttle.snapshot()));
}

}  // namespace detail

/// Runs the load on the calling thread and returns what it measured. Throws on a bad host name and on
/// configuration errors of the limiters (std::invalid_argument).
inline report run(const config& cfg) {
  net::io_context io;
  detail::limiters limits(io, cfg);
  report out;
  out.cfg = cfg;
  out.limits = detail::describe(cfg);
  net::ip::tcp::resolver resolver(io);
  const auto endpoints = resolver.resolve(cfg.url.host, cfg.url.port);
  limits.with_stages([&](auto& rate, auto& global) {
    rein::throttle throttle(limits.gates, global, rate);
#if defined(REIN_EXAMPLE_METRICS)
    std::optional<detail::metrics_server<decltype(throttle)>> metrics;
    if (!cfg.metrics_address.empty()) metrics.emplace(cfg.metrics_address, limits, throttle);
#endif
    detail::run_with(io, cfg, limits, throttle, endpoints, out);
  });
  out.total = out.from_second(0);
  std::sort(out.latencies.begin(), out.latencies.end());
  const auto stages = limits.snapshots(cfg.url.host);
  out.snapshots.insert(out.snapshots.end(), stages.begin(), stages.end());
  return out;
}

/// Writes the report as a table.
inline void print(std::ostream& os, const report& r) {
  using detail::fixed;
  using detail::ms;
  const auto share = [&](std::uint64_t n) {
    return r.total.sent == 0 ? std::string() : " (" + fixed(100.0 * static_cast<double>(n) / static_cast<double>(r.total.sent), 1) + "%)";
  };
  os << "GET http://" << r.cfg.url.host << ':' << r.cfg.url.port << r.cfg.url.target << ", " << r.cfg.workers
     << " workers, " << fixed(r.window_seconds(), 2) << " s (last answer at "
     << fixed(std::chrono::duration<double>(r.elapsed).count(), 2) << " s)\n";
  os << "limits:        " << r.limits << '\n';
  os << "sent:          " << r.total.sent << " (" << fixed(r.send_rate(), 1) << "/s)\n";
  os << "2xx:           " << r.total.ok << share(r.total.ok) << '\n';
  os << "429:           " << r.total.too_many << share(r.total.too_many) << '\n';
  os << "503:           " << r.total.unavailable << share(r.total.unavailable) << '\n';
  os << "other:         " << r.total.other << share(r.total.other) << '\n';
  os << "errors:        " << r.total.errors << share(r.total.errors) << '\n';
  os << "achieved rate: " << fixed(r.achieved_rate(), 1) << " 2xx/s\n";
  os << "latency:       p50 " << ms(r.latency(0.50)) << ", p95 " << ms(r.latency(0.95)) << ", p99 " << ms(r.latency(0.99))
     << '\n';
  const double per_request = r.total.sent == 0 ? 0.0
                                               : std::chrono::duration<double, std::milli>(r.limiter_wait).count() /
                                                     static_cast<double>(r.total.sent);
  os << "limiter wait:  " << fixed(std::chrono::duration<double>(r.limiter_wait).count(), 2) << " s in total, "
     << fixed(per_request, 2) << " ms per request\n";
  os << "pauses:        " << r.pauses.size() << " Retry-After applied\n";
  os << "per second:    sent/2xx/429/503";
  if (r.cfg.adaptive_rate) os << "/rate";
  if (r.cfg.concurrency == concurrency_kind::aimd) os << "/limit";
  os << '\n';
  for (std::size_t i = 0; i < r.seconds.size(); ++i) {
    const second& s = r.seconds[i];
    os << "  " << std::setw(3) << i << "s  " << s.sent << '/' << s.ok << '/' << s.too_many << '/' << s.unavailable;
    if (s.rate) os << '/' << fixed(*s.rate, 1);
    if (s.concurrency_limit) os << '/' << fixed(*s.concurrency_limit, 2);
    os << '\n';
  }
  os << "snapshots:\n";
  for (const auto& line : r.snapshots) os << "  " << line << '\n';
}

}  // namespace http_load

#endif  // REIN_STANDALONE_ASIO
