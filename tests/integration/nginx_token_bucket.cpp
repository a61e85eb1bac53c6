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

#include "support/hosts.hpp"

#include <rein/keyed.hpp>
#include <rein/quota_gate.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>

TEST_CASE("nginx: two hosts with their own quotas behind one throttle with a rate per host",
          "[integration][nginx]") {
  rein_test::nginx_server nginx;
  http_load::net::io_context io;
  rein::keyed<rein::quota_gate> gates(io, {});
  // 0.99 of each host's quota, with a burst of 2 (nginx allows 10): sends stay under it even when the
  // network bunches them a little.
  rein::keyed<rein::token_bucket> rate(io, rein::token_bucket_options{.rate = 1, .capacity = 1});
  rate.set_override("host_a", rein::token_bucket_options{.rate = 0.99 * nginx_limits::host_a, .capacity = 2});
  rate.set_override("host_b", rein::token_bucket_options{.rate = 0.99 * nginx_limits::host_b, .capacity = 2});
  rein::throttle throttle(gates, rate);

  const std::vector<rein_test::host_spec> hosts{{"host_a", nginx_limits::host_a, 8}, {"host_b", nginx_limits::host_b, 8}};
  auto r = rein_test::run_hosts(io, throttle, nginx.port(), hosts, 4s);
  rein_test::print_hosts("two hosts at 0.99 of their quotas, burst 2", hosts, r, 0, 4);
  for (const auto& h : hosts) {
    const double achieved = r[h.name].ok_rate(0, 4);
    INFO(h.name << ": " << achieved << "/s of " << h.quota << "/s");
    INFO(nginx.log());
    CHECK(r[h.name].refused(0, 4) == 0);
    CHECK(r[h.name].other == 0);
    CHECK(achieved >= 0.99 * h.quota);
    CHECK(achieved <= 1.01 * h.quota);
  }
}

#endif
