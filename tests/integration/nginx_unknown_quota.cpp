// An unknown quota found and held: an adaptive rate per host behind the host's gate, against nginx
// limit_req with no burst (every early arrival refused with "Retry-After: 1", which the gate honours for
// the whole host). Real time, with margins. Each 429 costs the host a whole second here, so the search
// (one pause per cut) and every probe above the quota show in the figures: the adaptive rate holds a level
// it found for 10 s, then 20 s, ... before probing (algo::adaptive_rate_options::hold). Measured after the
// first 5 s of 25: 0.79-0.86 of the quota from 5x, 0.81-0.88 from 0.2x, 1-3 429s (0.74 and 0.76 with
// CUBIC's immediate probing); asserted here with a margin for a loaded machine.
#include "support/catch.hpp"
#include "support/hosts.hpp"
#include "support/nginx.hpp"

#if REIN_HTTP_LOAD_AVAILABLE

#include <rein/adaptive_rate_limiter.hpp>
#include <rein/keyed.hpp>
#include <rein/quota_gate.hpp>
#include <rein/throttle.hpp>

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
  rein::keyed<rein::quota_gate> gates{io};
  rein::keyed<rein::adaptive_rate_limiter> rate;
  rein::throttle<rein::keyed<rein::quota_gate>, rein::keyed<rein::adaptive_rate_limiter>> throttle{gates, rate};

  explicit unknown_quota_client(double initial_rate)
      : rate(io, {}, rein::algo::adaptive_rate_options{.initial_rate = initial_rate, .burst = 1}) {}
};

void run_case(double start, const char* title) {
  rein_test::nginx_server nginx;
  const std::vector<rein_test::host_spec> hosts{{"exact_b", nginx_limits::exact_b, 8}};
  unknown_quota_client c(start * nginx_limits::exact_b);
  auto r = rein_test::run_hosts(c.io, c.throttle, nginx.port(), hosts, 25s);
  rein_test::print_hosts(title, hosts, r, 0, 5);
  rein_test::print_hosts(title, hosts, r, 5, 25);
  const auto s = c.rate.get("exact_b")->snapshot();
  std::printf("rate now %.2f/s, decreases %llu, margin widenings %llu, failed probes %llu\n", s.rate,
              static_cast<unsigned long long>(s.decreases), static_cast<unsigned long long>(s.margin_widenings),
              static_cast<unsigned long long>(s.failed_probes));
  CHECK(r["exact_b"].ok_rate(5, 25) >= 0.75 * nginx_limits::exact_b);
  CHECK(r["exact_b"].refused_share(5, 25) < 0.02);
}

}  // namespace

TEST_CASE("nginx, no burst, unknown quota from 5x: >= 0.75 of it and < 2 % 429s after 5 s",
          "[integration][nginx][unknown_quota]") {
  run_case(5, "adaptive rate from 5x the quota");
}

TEST_CASE("nginx, no burst, unknown quota from 0.2x: >= 0.75 of it and < 2 % 429s after 5 s",
          "[integration][nginx][unknown_quota]") {
  run_case(0.2, "adaptive rate from 0.2x the quota");
}

#endif
