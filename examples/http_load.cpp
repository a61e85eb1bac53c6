// http_load: GET requests to one URL for a while, through rein's limiters, and what came back.
//
//     http_load --url http://127.0.0.1:8080/rate [--workers 16] [--duration 3] [--rate R] [--burst B]
//               [--adaptive-rate] [--concurrency N|aimd] [--latency-tolerance X|off] [--noise-floor US]
//               [--no-gate] [--no-limit] [--metrics HOST:PORT]
//
// Each worker is a coroutine with its own keep-alive HTTP/1.1 connection (Boost.Beast). A request passes a
// rein::throttle keyed by host: the host's quota gate (paused by a 429 or 503 carrying Retry-After), the rate
// (--rate: a token bucket of R per second with a burst of B; with --adaptive-rate the rate starts at R and
// follows the 429s and 503s), the concurrency limit (--concurrency N: a semaphore of N; aimd: an AIMD limit
// starting at --workers; --latency-tolerance and --noise-floor (microseconds) set its options of those names,
// "off" leaves latency unjudged), and then goes out. At the end it prints the counts (sent, 2xx, 429, 503, other), the achieved rate, latency
// percentiles, the time spent waiting in the limiters, a line per second, and every limiter's snapshot. On a
// terminal a progress line updates once a second.
//
// --no-gate ignores Retry-After; --no-limit sends as fast as the workers go (no gate either). --metrics serves
// every limiter on /metrics for Prometheus during the run (built with the rein::prometheus component).
// tests/integration/nginx.conf.in is an nginx with a limit_req of 200/s (/rate) and a limit_conn of 8 (/conn)
// to run it against; docs/adaptive.md shows how.
#include "http_load.hpp"
#include "usage.hpp"

#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

#if REIN_HTTP_LOAD_AVAILABLE

namespace {

constexpr std::string_view usage =
    "usage: http_load --url http://HOST[:PORT]/PATH [--workers N] [--duration SECONDS] [--rate R] [--burst B]\n"
    "                 [--adaptive-rate] [--concurrency N|aimd] [--latency-tolerance X|off] [--noise-floor US]\n"
    "                 [--no-gate] [--no-limit] [--metrics HOST:PORT]\n";

[[noreturn]] void fail(const std::string& message) {
  std::cerr << "http_load: " << message << '\n' << usage;
  std::exit(2);
}

template <class Number>
Number number(std::string_view option, std::string_view text) {
  Number value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) fail(std::string(option) + ": not a number: " + std::string(text));
  return value;
}

http_load::config parse(int argc, char** argv) {
  http_load::config c;
  bool no_limit = false;
  bool aimd_option = false;
  bool have_url = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) fail(std::string(arg) + " needs a value");
      return argv[++i];
    };
    if (arg == "--url") {
      const auto url = http_load::parse_url(value());
      if (!url) fail("--url: only http://host[:port][/path] is supported");
      c.url = *url;
      have_url = true;
    } else if (arg == "--workers") {
      c.workers = number<int>(arg, value());
    } else if (arg == "--duration") {
      c.duration = std::chrono::duration_cast<http_load::clock::duration>(std::chrono::duration<double>(number<double>(arg, value())));
    } else if (arg == "--rate") {
      c.rate = number<double>(arg, value());
    } else if (arg == "--burst") {
      c.burst = number<std::int64_t>(arg, value());
    } else if (arg == "--adaptive-rate") {
      c.adaptive_rate = true;
    } else if (arg == "--concurrency") {
      const std::string_view v = value();
      if (v == "aimd") {
        c.concurrency = http_load::concurrency_kind::aimd;
      } else {
        c.concurrency = http_load::concurrency_kind::fixed;
        c.concurrency_limit = number<std::size_t>(arg, v);
      }
    } else if (arg == "--noise-floor") {
      c.aimd.noise_floor = std::chrono::microseconds{number<std::int64_t>(arg, value())};
      aimd_option = true;
    } else if (arg == "--latency-tolerance") {
      const std::string_view v = value();
      c.aimd.latency_tolerance = v == "off" ? std::nullopt : std::optional<double>{number<double>(arg, v)};
      aimd_option = true;
    } else if (arg == "--metrics") {
#if defined(REIN_EXAMPLE_METRICS)
      c.metrics_address = value();
#else
      fail("--metrics needs the rein::prometheus component (Debian: prometheus-cpp-dev)");
#endif
    } else if (arg == "--no-gate") {
      c.quota_gate = false;
    } else if (arg == "--no-limit") {
      no_limit = true;
    } else if (arg == "--help" || arg == "-h") {
      std::cout << usage;
      std::exit(0);
    } else {
      fail("unknown option " + std::string(arg));
    }
  }
  if (!have_url) fail("--url is required");
  if (c.workers < 1) fail("--workers must be >= 1");
  if (c.duration <= http_load::clock::duration::zero()) fail("--duration must be > 0");
  if (c.adaptive_rate && !c.rate) fail("--adaptive-rate needs --rate (the starting rate)");
  if (aimd_option && c.concurrency != http_load::concurrency_kind::aimd)
    fail("--latency-tolerance and --noise-floor need --concurrency aimd");
  if (c.concurrency == http_load::concurrency_kind::aimd) c.concurrency_limit = static_cast<std::size_t>(c.workers);
  if (no_limit) {
    if (c.rate || c.concurrency != http_load::concurrency_kind::none) fail("--no-limit excludes --rate and --concurrency");
    c.quota_gate = false;
  }
  c.progress = ::isatty(STDOUT_FILENO) != 0;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  const http_load::config config = parse(argc, argv);
  try {
    http_load::print(std::cout, http_load::run(config));
  } catch (const std::exception& e) {
    std::cerr << "http_load: " << e.what() << '\n';
    return 1;
  }
  return 0;
}

#else

int main(int argc, char** argv) {
  if (rein_example::asked_for_help(argc, argv,
                                   "usage: http_load --url http://HOST[:PORT]/PATH [options]\n"
                                   "  (this build uses standalone Asio: http_load needs Boost.Beast and only says so)\n"))
    return 0;
  std::cerr << "http_load needs Boost.Asio (Boost.Beast); this build uses standalone Asio\n";
  return 0;
}

#endif
