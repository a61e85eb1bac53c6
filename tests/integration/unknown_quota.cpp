// An unknown quota found and held: an adaptive rate per host behind the host's gate, against nginx
// limit_req with no burst (every early arrival refused with "Retry-After: 1", which the gate honours for
// the whole host), and against the provider emulator's continuous-refill bucket (a second's worth of burst,
// no rate-limit headers, Retry-After on each 429). Real time, with margins. Each 429 costs the host a
// whole second here, so the search (one pause per cut) and every probe above the quota show in the figures:
// the adaptive rate holds a level it found for 30 s before probing (algo::adaptive_rate_options::hold).
#include "support/catch.hpp"
#include "support/hosts.hpp"
#include "support/nginx.hpp"

#if REIN_HTTP_LOAD_AVAILABLE

#include "support/provider_emulator.hpp"

#include <rein/adaptive_rate_limiter.hpp>
#include <rein/keyed.hpp>
#include <rein/quota_gate.hpp>
#include <rein/throttle.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using rein_test::nginx_limits;
namespace net = http_load::net;

namespace {

// A client that does not know the host's quota: a gate per host and an adaptive rate per host starting at
// `start` times the quota.
struct unknown_quota_client {
  net::io_context io;
  rein::keyed<rein::quota_gate> gates{io, {}};
  rein::keyed<rein::adaptive_rate_limiter> rate;
  rein::throttle<rein::keyed<rein::quota_gate>, rein::keyed<rein::adaptive_rate_limiter>> throttle{gates, rate};

  explicit unknown_quota_client(double initial_rate)
      : rate(io, rein::algo::adaptive_rate_options{.initial_rate = initial_rate, .burst = 1}) {}
};

// Runs 25 s against the server at `port`, the host "exact_b" (50 per second) starting at `start` times its
// quota, and checks the 20 s after the first 5.
void run_case(unsigned short port, double start, const char* title) {
  const std::vector<rein_test::host_spec> hosts{{"exact_b", nginx_limits::exact_b, 8}};
  unknown_quota_client c(start * nginx_limits::exact_b);
  auto r = rein_test::run_hosts(c.io, c.throttle, port, hosts, 25s);
  rein_test::print_hosts(title, hosts, r, 0, 5);
  rein_test::print_hosts(title, hosts, r, 5, 25);
  rein_test::print_seconds(r["exact_b"], 25);
  const auto s = c.rate.get("exact_b")->snapshot();
  std::printf("rate now %.2f/s, W %.2f/s, decreases %llu, margin widenings %llu, failed probes %llu\n", s.rate,
              s.rate_at_decrease, static_cast<unsigned long long>(s.decreases), static_cast<unsigned long long>(s.margin_widenings),
              static_cast<unsigned long long>(s.failed_probes));
  CHECK(r["exact_b"].ok_rate(5, 25) >= 0.85 * nginx_limits::exact_b);
  CHECK(r["exact_b"].refused_share(5, 25) < 0.02);
}

void run_nginx(double start, const char* title) {
  rein_test::nginx_server nginx;
  run_case(nginx.port(), start, title);
}

// The emulator's bucket refills continuously at 50 per second and holds a second's worth, as a metered
// provider's does; it sends no rate-limit headers, so the quota is unknown to the client.
void run_emulator(double start, const char* title) {
  rein_test::provider_emulator provider(
      {.dialect = rein_test::quota_dialect::none, .requests = {.per_period = static_cast<std::int64_t>(nginx_limits::exact_b)}});
  run_case(provider.port(), start, title);
}

}  // namespace

TEST_CASE("nginx, no burst, unknown quota from 5x: >= 0.85 of it and < 2 % 429s after 5 s",
          "[integration][nginx][unknown_quota]") {
  run_nginx(5, "nginx: adaptive rate from 5x the quota");
}

TEST_CASE("nginx, no burst, unknown quota from 0.2x: >= 0.85 of it and < 2 % 429s after 5 s",
          "[integration][nginx][unknown_quota]") {
  run_nginx(0.2, "nginx: adaptive rate from 0.2x the quota");
}

TEST_CASE("emulator, continuous refill, unknown quota from 5x: >= 0.85 of it and < 2 % 429s after 5 s",
          "[integration][emulator][unknown_quota]") {
  run_emulator(5, "emulator: adaptive rate from 5x the quota");
}

TEST_CASE("emulator, continuous refill, unknown quota from 0.2x: >= 0.85 of it and < 2 % 429s after 5 s",
          "[integration][emulator][unknown_quota]") {
  run_emulator(0.2, "emulator: adaptive rate from 0.2x the quota");
}

#endif
