// A known quota met from the client side, against nginx limit_req with no burst: the throttle's rate per
// host is set to each host's quota, and nginx refuses any request that arrives sooner than 1/rate after the
// last one it admitted (counted in whole milliseconds), with "Retry-After: 1", which the throttle's gates
// honour for the whole host. What the client must not do is keep causing those refusals: each rate stage
// learns a pacing margin from them (rein::algo::basic_pacing_margin). Real time, with margins.
#include "support/catch.hpp"
#include "support/hosts.hpp"
#include "support/nginx.hpp"

#if REIN_HTTP_LOAD_AVAILABLE  // Boost.Beast: Boost.Asio builds only

#include "support/delay_proxy.hpp"

#include <rein/keyed.hpp>
#include <rein/quota_gate.hpp>
#include <rein/semaphore.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>

#include <string>
#include <vector>

using namespace std::chrono_literals;
using rein_test::nginx_limits;
namespace net = http_load::net;

namespace {

// The setup of a user who knows each host's quota: a gate per host (a 429 pauses that host for everyone),
// at most 4 in flight per host and 64 overall, and a token bucket per host at its quota with a burst of 1.
struct known_quota_client {
  net::io_context io;
  rein::keyed<rein::quota_gate> gates{io, {}};
  rein::keyed<rein::semaphore> per_host{io, std::size_t{4}};
  rein::semaphore global{io, 64};
  rein::keyed<rein::token_bucket> rate;
  rein::throttle<rein::keyed<rein::quota_gate>, rein::keyed<rein::semaphore>, rein::semaphore,
                 rein::keyed<rein::token_bucket>>
      throttle{gates, per_host, global, rate};

  known_quota_client(const std::vector<rein_test::host_spec>& hosts, rein::algo::pacing_margin_options margin)
      : rate(io, rein::token_bucket_options{.rate = 1000, .capacity = 1, .margin = margin}) {
    for (const auto& h : hosts) {
      rate.set_override(h.name, rein::token_bucket_options{.rate = h.quota, .capacity = 1, .margin = margin});
    }
  }
};

const std::vector<rein_test::host_spec> exact_hosts{{"exact_a", nginx_limits::exact_a, 4},
                                                    {"exact_b", nginx_limits::exact_b, 4}};

// Against a server that refuses every early arrival, start with the margin of one step: loopback's own
// jitter and nginx's millisecond clock make some sends 1/rate apart arrive early.
constexpr rein::algo::pacing_margin_options burst_zero_margin{.initial = 1.0 / 32};

}  // namespace

TEST_CASE("nginx, no burst: each host gets >= 0.95 of its quota with < 1 % 429s over 10 s",
          "[integration][nginx][known_quota]") {
  rein_test::nginx_server nginx;
  known_quota_client c(exact_hosts, burst_zero_margin);
  auto r = rein_test::run_hosts(c.io, c.throttle, nginx.port(), exact_hosts, 10s);
  rein_test::print_hosts("known quotas, no burst, initial margin 1/32", exact_hosts, r, 0, 10);
  INFO(nginx.log());
  for (const auto& h : exact_hosts) {
    INFO(h.name);
    CHECK(r[h.name].ok_rate(0, 10) >= 0.95 * h.quota);
    CHECK(r[h.name].refused_share(0, 10) < 0.01);
    CHECK(r[h.name].other == 0);
  }
}

TEST_CASE("nginx, no burst, no initial margin: the first 429s teach the margin, then none",
          "[integration][nginx][known_quota]") {
  rein_test::nginx_server nginx;
  known_quota_client c(exact_hosts, {});
  auto r = rein_test::run_hosts(c.io, c.throttle, nginx.port(), exact_hosts, 10s);
  rein_test::print_hosts("known quotas, no burst, margin learned from 0", exact_hosts, r, 0, 10);
  for (const auto& h : exact_hosts) {
    INFO(h.name);
    // Each 429 pauses the host for its Retry-After (1 s); the margin after one or two of them holds.
    CHECK(r[h.name].refused(0, 10) <= 2);
    CHECK(r[h.name].ok_rate(0, 10) >= 0.75 * h.quota);
    const std::size_t widenings = c.rate.get(h.name)->snapshot().refusals;
    CHECK(widenings <= r[h.name].refused(0, 10));  // a 429 of a call sent before a widening is stale
    if (r[h.name].refused(0, 10) > 0) CHECK(widenings >= 1);
  }
}

TEST_CASE("nginx, burst 1: >= 0.98 of the quota and no 429 after the first second",
          "[integration][nginx][known_quota]") {
  rein_test::nginx_server nginx;
  const std::vector<rein_test::host_spec> hosts{{"burst1_a", nginx_limits::burst1_a, 4}};
  known_quota_client c(hosts, {});
  auto r = rein_test::run_hosts(c.io, c.throttle, nginx.port(), hosts, 6s);
  rein_test::print_hosts("known quota, burst 1, no margin", hosts, r, 1, 6);
  CHECK(r["burst1_a"].ok_rate(1, 6) >= 0.98 * nginx_limits::burst1_a);
  CHECK(r["burst1_a"].refused(1, 6) == 0);
}

TEST_CASE("nginx: a saturated host adds < 5 ms to another host's median admission",
          "[integration][nginx][known_quota]") {
  rein_test::nginx_server nginx;
  // "free" is served by nginx's unlimited location; its two workers ask every 20 ms, far below its rate.
  const rein_test::host_spec calm{"free", 1000, 2, 20ms};
  const std::vector<rein_test::host_spec> alone{calm};
  const std::vector<rein_test::host_spec> beside{calm, {"exact_a", nginx_limits::exact_a, 16}};
  known_quota_client quiet(alone, burst_zero_margin);
  auto a = rein_test::run_hosts(quiet.io, quiet.throttle, nginx.port(), alone, 3s);
  known_quota_client busy(beside, burst_zero_margin);
  auto b = rein_test::run_hosts(busy.io, busy.throttle, nginx.port(), beside, 3s);
  rein_test::print_hosts("a calm host alone", alone, a, 0, 3);
  rein_test::print_hosts("the calm host beside a saturated one", beside, b, 0, 3);
  CHECK(b["free"].median_admission_ms() < a["free"].median_admission_ms() + 5);
  CHECK(b["exact_a"].median_admission_ms() > 100);  // it was saturated: 16 workers on 20 per second
}

// Measured on a quiet machine: 1.01 of the ceiling from 10 s on. Each 429 costs a whole second of pause,
// so one 429 more in the window costs 0.05 of it: on a loaded machine, whose scheduling adds its own jitter to
// the 5 ms, the margin learned needs a refusal or two more (one CI run saw 0.89 over 10 s with one 429 in
// it). Hence the 20 s window and the assertion at 0.9.
TEST_CASE("nginx, no burst, jitter of 5 ms on 50 ms: >= 0.9 of the ceiling T / (T + s) once learned",
          "[integration][nginx][known_quota][jitter]") {
  rein_test::nginx_server nginx;
  // Every request waits a delay uniform in [0, 5 ms] on its way: no spacing below T + s = 55 ms is safe,
  // so the most any client can get without 429s is 50 / 55 of the quota.
  rein_test::delay_proxy proxy(nginx.port(), {.spread = 5ms, .seed = 7});
  const std::vector<rein_test::host_spec> hosts{{"exact_a", nginx_limits::exact_a, 4}};
  const double ceiling = 50.0 / 55.0 * nginx_limits::exact_a;
  known_quota_client c(hosts, burst_zero_margin);
  auto r = rein_test::run_hosts(c.io, c.throttle, proxy.port(), hosts, 30s);
  rein_test::print_hosts("jitter 5 ms on 50 ms, learning", hosts, r, 0, 10);
  rein_test::print_hosts("jitter 5 ms on 50 ms, learned", hosts, r, 10, 30);
  std::printf("ceiling %.2f/s; margin learned %.4f after %llu refusals\n", ceiling, c.rate.get("exact_a")->margin(),
              static_cast<unsigned long long>(c.rate.get("exact_a")->snapshot().refusals));
  CHECK(r["exact_a"].ok_rate(10, 30) >= 0.9 * ceiling);
  CHECK(r["exact_a"].refused_share(10, 30) < 0.01);
}

#endif
