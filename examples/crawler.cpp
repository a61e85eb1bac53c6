// crawler: a whole crawler on rein: a bounded queue, a fixed pool of workers, one throttle
// around every call, cooperative 429 handling, retries, and a monitor of the three numbers that say whether a
// limiter protects you or throttles you.
//
//     producer --(bounded channel, 32)--> 16 workers --throttle.acquire(host)--> simulated web (4 hosts)
//
// The throttle composes, per call (rein::throttle):
//   1. the host's quota gate: a 429 pauses that host for every worker, for as long as the upstream asked;
//   2. a global token bucket: 200 starts per second, bursts of 20 (a rate wait holds no slot);
//   3. the host's own concurrency limit: AIMD, which halves on each 429 and grows back on successes;
//   4. a global semaphore of 12 calls in flight.
// A call that gets a 429 reports it with guard.reject(retry_after) and is retried by rein::retry (exponential
// backoff with full jitter, at least the Retry-After, at most 5 attempts, within a retry budget); every attempt
// goes through the throttle again and is its own sample for the host's limit.
//
// No network: each host is simulated on steady_timers. It enforces its own quota with an exact sliding window
// of 1 s (answering 429 with Retry-After and an x-ratelimit-reset-requests hint when it is exceeded), and its
// latency grows with the number of calls it is serving. The 400 URLs take about 3 s.
//
// Every 500 ms the monitor prints the three numbers that tell whether a limiter is binding:
//   wait        time spent inside throttle.acquire (mean, max): near zero, the limiter is not binding;
//               growing, it is now your bottleneck;
//   saturation  in flight / limit (global, and per host), tokens left / capacity: pinned at 1, demand
//               exceeds the quota;
//   429s        upstream rejections: a sustained non-zero rate means a local limit is above the real one.
// At the end every limiter's snapshot is printed in rein's one-line form (operator<<).
//
// Built with the rein::prometheus component, `crawler --metrics 127.0.0.1:9464` also serves every limiter
// on /metrics during the crawl (and `--linger S` keeps serving S seconds after it).
#include "usage.hpp"

#include <rein/adaptive_limiter.hpp>
#include <rein/algo/sliding_window.hpp>
#include <rein/keyed.hpp>
#include <rein/quota_gate.hpp>
#include <rein/retry.hpp>
#include <rein/retry_after.hpp>
#include <rein/semaphore.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>

#if defined(REIN_EXAMPLE_METRICS)
#include <rein/prometheus/collector.hpp>

#include <prometheus/exposer.h>

#include <memory>
#include <thread>
#endif

// rein::net is boost::asio, or asio when REIN_STANDALONE_ASIO is defined (rein/config.hpp).
#if defined(REIN_STANDALONE_ASIO)
#include <asio/co_spawn.hpp>
#include <asio/error.hpp>
#include <asio/experimental/channel.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#else
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/experimental/channel.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace net = rein::net;
using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

namespace {

constexpr int url_count = 400;
constexpr int worker_count = 16;
constexpr std::size_t queue_capacity = 32;
constexpr auto acquire_budget = 2s;  // a call that cannot start within this is shed: a fast, visible failure
constexpr auto monitor_interval = 500ms;

double ms(steady::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// ---- The simulated web --------------------------------------------------------------------------------------

struct response {
  int status = 200;
  std::string retry_after;     // the Retry-After field value (delta-seconds)
  std::string reset_requests;  // the x-ratelimit-reset-requests hint (Go duration syntax, e.g. "120ms")
};

// One upstream host: its quota (an exact sliding window of 1 s, as the server enforces it) and a latency that
// grows with the calls it is serving at once.
class simulated_host {
 public:
  simulated_host(std::int64_t per_second, std::chrono::milliseconds base_latency)
      : per_second_(per_second), base_latency_(base_latency), quota_({.limit = per_second, .window = 1s}, steady::now()) {}

  net::awaitable<response> get() {
    const steady::time_point now = steady::now();
    response r;
    steady::duration latency = base_latency_ + serving_ * 3ms;
    ++serving_;
    if (quota_.try_take(1, now) == rein::algo::take_result::allowed) {
      ++served_;
    } else {
      // Over quota: say when a start is free again, coarsely (RFC 9110 delta-seconds) and finely (the hint).
      const steady::duration wait = quota_.ready_at(1, now).value_or(now + 1s) - now;
      r.status = 429;
      r.retry_after = std::to_string(std::chrono::ceil<std::chrono::seconds>(wait).count());
      r.reset_requests = std::to_string(std::chrono::ceil<std::chrono::milliseconds>(wait).count()) + "ms";
      latency = 2ms;  // a rejection is cheap for the server, not for the client: still a round trip
      ++rejected_;
    }
    peak_serving_ = std::max(peak_serving_, serving_);
    net::steady_timer timer(co_await net::this_coro::executor, latency);
    co_await timer.async_wait(net::use_awaitable);
    --serving_;
    co_return r;
  }

  std::int64_t per_second() const { return per_second_; }
  int served() const { return served_; }
  int rejected() const { return rejected_; }
  int peak_serving() const { return peak_serving_; }

 private:
  std::int64_t per_second_;
  std::chrono::milliseconds base_latency_;
  rein::algo::sliding_window quota_;
  int serving_ = 0;
  int peak_serving_ = 0;
  int served_ = 0;
  int rejected_ = 0;
};

struct host_spec {
  const char* name;
  std::int64_t per_second;
  std::chrono::milliseconds base_latency;
  int share;  // percent of the URLs
};

constexpr std::array<host_spec, 4> host_specs{{{"alpha.example", 80, 15ms, 40},
                                               {"beta.example", 40, 25ms, 25},
                                               {"gamma.example", 200, 5ms, 30},
                                               {"delta.example", 8, 40ms, 5}}};

// What goes through the queue. Plain values: with g++ 12 and Boost 1.81, a message holding a std::string came
// out of an experimental::channel with its short-string pointer still aiming at the sender's copy (a bad free
// under AddressSanitizer; clang 14 is fine), so the host travels as an index.
struct job {
  int host = -1;  // index into host_specs; -1: no more work (one per worker)
  int id = 0;

  const char* host_name() const { return host_specs[static_cast<std::size_t>(host)].name; }
};

// A deterministic mix of hosts (a linear congruential generator), so that every run crawls the same URLs.
std::vector<job> make_jobs() {
  std::vector<job> jobs;
  std::uint32_t state = 2003;
  for (int i = 0; i < url_count; ++i) {
    state = state * 1664525u + 1013904223u;
    int pick = static_cast<int>((state >> 8) % 100u);
    for (std::size_t h = 0; h < host_specs.size(); ++h) {
      if (pick < host_specs[h].share) {
        jobs.push_back({static_cast<int>(h), i});
        break;
      }
      pick -= host_specs[h].share;
    }
  }
  return jobs;
}

// ---- The crawler ------------------------------------------------------------------------------------------

using gates_type = rein::keyed<rein::quota_gate>;
using per_host_type = rein::keyed<rein::aimd_limiter>;
using throttle_type = rein::throttle<gates_type, per_host_type, rein::semaphore, rein::token_bucket>;
using queue_type = net::experimental::channel<void(rein::error_code, job)>;

struct window_stats {  // since the monitor's last line
  int acquired = 0;
  steady::duration waited{};
  steady::duration longest{};
  int rejections = 0;
  int fetched = 0;
};

struct crawler {
  explicit crawler(net::io_context& io)
      : gates(io, gate_options()),
        rate(io, {.rate = 200, .capacity = 20}),
        global(io, 12),
        per_host(io, rein::algo::aimd_options{.initial_limit = 4, .min_limit = 1, .max_limit = 8, .backoff = 0.5}),
        throttle(gates, per_host, global, rate, {.default_pause = 1s}),
        retries({.backoff = {.base = 50ms, .cap = 1s, .max_attempts = 5}, .seed = 3}),
        queue(io, queue_capacity),
        monitor_timer(io) {
    for (const host_spec& h : host_specs) web.try_emplace(h.name, h.per_second, h.base_latency);
  }

  static rein::quota_gate_options gate_options() {
    rein::quota_gate_options o;
    o.jitter = 0.25;  // callers who waited out a pause resume over a quarter of its length, not at once
    o.max_pause = 5s;
    o.seed = 3;
    return o;
  }

  gates_type gates;
  rein::token_bucket rate;
  rein::semaphore global;
  per_host_type per_host;
  throttle_type throttle;
  rein::retry_policy retries;
  queue_type queue;
  std::map<std::string, simulated_host> web;

  steady::time_point started = steady::now();
  net::steady_timer monitor_timer;
  int queued = 0;
  int workers_left = worker_count;
  window_stats window;
  window_stats total;
  int shed = 0;        // could not start within acquire_budget
  int gave_up = 0;     // still 429 after every attempt, or the retry budget said no
  std::map<std::string, int> fetched_by_host;

  double elapsed() const { return std::chrono::duration<double>(steady::now() - started).count(); }

  void waited(steady::duration d) {
    for (window_stats* s : {&window, &total}) {
      ++s->acquired;
      s->waited += d;
      s->longest = std::max(s->longest, d);
    }
  }

  // One attempt: through the throttle, then the call. Its outcome feeds the host's limit.
  net::awaitable<rein::attempt<int>> attempt_once(const job& j) {
    const steady::time_point asked = steady::now();
    throttle_type::guard guard;
    try {
      guard = co_await throttle.acquire_for(j.host_name(), acquire_budget);
    } catch (const rein::system_error& e) {
      waited(steady::now() - asked);
      co_return rein::attempt<int>::permanent(e.code());
    }
    waited(steady::now() - asked);
    const response r = co_await web.at(j.host_name()).get();
    if (r.status == 429) {
      ++window.rejections;
      ++total.rejections;
      std::optional<std::chrono::nanoseconds> wait = rein::parse_reset_duration(r.reset_requests);
      if (!wait) wait = rein::parse_retry_after(r.retry_after, std::chrono::system_clock::now());
      guard.reject(wait);  // pauses this host for every worker, and counts as congestion
      co_return rein::attempt<int>::retryable(rein::error_code(net::error::try_again), wait);
    }
    guard.complete_http(r.status);
    co_return rein::attempt<int>::success(r.status);
  }

  net::awaitable<void> worker() {
    for (;;) {
      const job j = co_await queue.async_receive(net::use_awaitable);
      if (j.host < 0) break;
      const auto result = co_await rein::retry(retries, [&](std::uint32_t) { return attempt_once(j); });
      if (result) {
        ++window.fetched;
        ++total.fetched;
        ++fetched_by_host[j.host_name()];
      } else if (result.last.error() == rein::errc::timed_out) {
        ++shed;
      } else {
        ++gave_up;
      }
    }
    if (--workers_left == 0) monitor_timer.cancel();
  }

  // Bounded: async_send suspends while the queue is full, so the producer runs at the crawl's pace.
  net::awaitable<void> producer() {
    for (const job& j : make_jobs()) {
      co_await queue.async_send(rein::error_code(), j, net::use_awaitable);
      ++queued;
    }
    for (int i = 0; i < worker_count; ++i) co_await queue.async_send(rein::error_code(), job{}, net::use_awaitable);
  }

  // Saturation is sampled every 10 ms and averaged over each line's 500 ms: one reading per line would say
  // more about the instant it was taken than about the interval.
  struct saturation {
    int samples = 0;
    double global = 0;                       // in flight / permits
    double tokens = 0;                       // tokens left / capacity
    std::array<double, 4> host_in_flight{};  // per host, in flight...
    std::array<double, 4> host_limit{};      // ...and its limit
  };

  void sample(saturation& s) {
    const rein::semaphore_snapshot g = global.snapshot();
    ++s.samples;
    s.global += static_cast<double>(g.in_flight) / static_cast<double>(g.permits);
    s.tokens += rate.tokens() / static_cast<double>(rate.capacity());
    for (std::size_t h = 0; h < host_specs.size(); ++h) {
      const auto snapshot = per_host.snapshot(host_specs[h].name);
      s.host_in_flight[h] += snapshot ? static_cast<double>(snapshot->in_flight) : 0.0;
      s.host_limit[h] += snapshot ? snapshot->limit : 4.0;  // an evicted host starts again from its initial limit
    }
  }

  net::awaitable<void> monitor() {
    std::printf("  time |  wait in limiter  |   saturation (mean): in flight / limit, tokens left    | upstream\n");
    std::printf("       |  mean ms   max ms | global tokens    alpha     beta    gamma    delta  | 429s fetched\n");
    saturation s;
    while (workers_left > 0) {
      monitor_timer.expires_after(monitor_interval / 50);
      try {
        co_await monitor_timer.async_wait(net::use_awaitable);
      } catch (const rein::system_error&) {  // cancelled: the crawl is over
      }
      sample(s);
      if (s.samples == 50 || workers_left == 0) {
        print_line(s);
        s = {};
      }
    }
  }

  void print_line(const saturation& s) {
    const double n = s.samples;
    const double mean = window.acquired == 0 ? 0.0 : ms(window.waited) / window.acquired;
    std::printf("%5.1fs | %7.1f  %7.1f | %5.2f  %5.2f ", elapsed(), mean, ms(window.longest), s.global / n, s.tokens / n);
    for (std::size_t h = 0; h < host_specs.size(); ++h)
      std::printf("  %3.1f/%-3.1f", s.host_in_flight[h] / n, s.host_limit[h] / n);
    std::printf("  | %4d %7d\n", window.rejections, window.fetched);
    window = {};
  }

  void print_summary() const {
    const auto t = throttle.snapshot();
    const double calls = static_cast<double>(total.acquired);
    std::printf("\ncrawled %d URLs in %.2f s with %d workers: %d fetched, %d shed by the limiter, %d gave up\n",
                queued, elapsed(), worker_count, total.fetched, shed, gave_up);
    std::printf("wait in limiter: mean %.1f ms, max %.1f ms over %d acquires (budget %lld ms)\n",
                calls == 0 ? 0.0 : ms(total.waited) / calls, ms(total.longest), total.acquired,
                static_cast<long long>(std::chrono::milliseconds(acquire_budget).count()));
    std::printf("upstream 429s: %d of %d calls (%.1f%%)\n", total.rejections, total.acquired,
                calls == 0 ? 0.0 : 100.0 * total.rejections / calls);
    std::fflush(stdout);  // the snapshots below go through std::cout
    std::cout << "snapshots:\n"
              << "  throttle:  " << t << '\n'
              << "  retries:   " << retries.snapshot() << '\n'
              << "  rate:      " << rate.snapshot() << '\n'
              << "  global:    " << global.snapshot() << '\n'
              << "  gates:     " << gates.snapshot() << '\n'
              << "  per_host:  " << per_host.snapshot() << '\n';
    for (const host_spec& h : host_specs)
      if (const auto s = per_host.snapshot(h.name)) std::cout << "    " << h.name << ": " << *s << '\n';
    std::cout << '\n' << std::flush;
    std::printf("host            quota/s  fetched  429s  429 rate  limit at end  peak upstream in flight\n");
    for (const host_spec& h : host_specs) {
      const simulated_host& w = web.at(h.name);
      const int calls_here = w.served() + w.rejected();
      const double ratio = calls_here == 0 ? 0.0 : 100.0 * w.rejected() / calls_here;
      const auto fetched = fetched_by_host.find(h.name);
      std::printf("%-14s  %7lld  %7d  %4d  %7.1f%%", h.name, static_cast<long long>(w.per_second()),
                  fetched == fetched_by_host.end() ? 0 : fetched->second, w.rejected(), ratio);
      // An idle host's limiter may have been evicted (keyed): it would start again from its initial limit.
      if (const auto s = per_host.snapshot(h.name)) std::printf("  %12.2f", s->limit);
      else std::printf("  %12s", "evicted");
      std::printf("  %d\n", w.peak_serving());
    }
    std::printf("\nreading: ");
    const double mean = calls == 0 ? 0.0 : ms(total.waited) / calls;
    const double budget_tenth = ms(acquire_budget) / 10;
    if (mean > budget_tenth) std::printf("the wait exceeds a tenth of the budget: the limiter is the bottleneck; ");
    else std::printf("the wait stays below a tenth of the budget; ");
    if (calls > 0 && total.rejections / calls > 0.01)
      std::printf("429s above 1%% of calls: a local limit is set above a host's real quota (see the table).\n");
    else std::printf("429s below 1%% of calls: the local limits hold the upstreams' quotas.\n");
  }
};

void rethrow(std::exception_ptr e) {
  if (e) std::rethrow_exception(e);
}

}  // namespace

constexpr const char* usage =
    "usage: crawler [--help] [--metrics HOST:PORT [--linger SECONDS]]\n"
    "  400 simulated URLs over 4 hosts through one rein::throttle, with retries and a monitor (about 3 s);\n"
    "  --metrics serves every limiter on /metrics (needs the rein::prometheus component)\n";

int main(int argc, char** argv) {
  if (rein_example::asked_for_help(argc, argv, usage)) return 0;
  std::string metrics_address;
  double linger = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--metrics" && i + 1 < argc) metrics_address = argv[++i];
    else if (arg == "--linger" && i + 1 < argc) linger = std::atof(argv[++i]);
    else {
      std::fprintf(stderr, "unknown argument '%s'\n", argv[i]);
      std::fputs(usage, stderr);
      return 2;
    }
  }
  net::io_context io;
  crawler c(io);
#if defined(REIN_EXAMPLE_METRICS)
  // Everything is read at each scrape from the limiters' snapshots.
  auto metrics = std::make_shared<rein::prometheus::collector>();
  metrics->add(c.throttle, "throttle");
  metrics->add(c.rate, "rate");
  metrics->add(c.global, "global");
  metrics->add(c.retries, "retries");
  metrics->add_keyed(c.gates, "gates");
  metrics->add_keyed(c.per_host, "per_host");
  std::unique_ptr<prometheus::Exposer> exposer;
  if (!metrics_address.empty()) {
    exposer = std::make_unique<prometheus::Exposer>(metrics_address);
    exposer->RegisterCollectable(metrics);
    std::printf("metrics on http://%s/metrics\n", metrics_address.c_str());
  }
#else
  if (!metrics_address.empty()) {
    std::cerr << "crawler: --metrics needs the rein::prometheus component (Debian: prometheus-cpp-dev)\n";
    return 2;
  }
#endif
  net::co_spawn(io, c.monitor(), rethrow);
  for (int i = 0; i < worker_count; ++i) net::co_spawn(io, c.worker(), rethrow);
  net::co_spawn(io, c.producer(), rethrow);
  io.run();
  c.print_summary();
#if defined(REIN_EXAMPLE_METRICS)
  if (exposer && linger > 0) std::this_thread::sleep_for(std::chrono::duration<double>(linger));
#else
  (void)linger;
#endif
  const bool accounted = c.total.fetched + c.shed + c.gave_up == url_count;
  const rein::semaphore_snapshot g = c.global.snapshot();
  return accounted && g.available == g.permits ? 0 : 1;
}
