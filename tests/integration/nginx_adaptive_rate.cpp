// A client that does not know the quota. rein's adaptive rate starts at 5 R; after the
// first 2 seconds fewer than 5% of its requests get 429, and over the whole run it gets at least 0.8 R.
#include "support/catch.hpp"
#include "support/load.hpp"

#if REIN_HTTP_LOAD_AVAILABLE

using namespace std::chrono_literals;
using rein_test::nginx_limits;

TEST_CASE("nginx: the adaptive rate starting at 5 R converges to the limit", "[integration][nginx]") {
  rein_test::nginx_server nginx;
  http_load::config c = rein_test::load_config(nginx, "/rate", 5s);
  c.rate = 5 * nginx_limits::rate;
  c.burst = nginx_limits::burst / 2;
  c.adaptive_rate = true;
  const http_load::report r = rein_test::run_and_print(c, "adaptive rate from 5 R, /rate");
  INFO(nginx.log());
  const http_load::counts later = r.from_second(2);
  CHECK(r.total.errors == 0);
  CHECK(r.total.too_many > 0);  // it did start above the limit, and learnt from the 429s
  CHECK(later.sent > 0);
  CHECK(rein_test::share(later.too_many, later.sent) < 0.05);
  CHECK(r.achieved_rate() >= 0.8 * nginx_limits::rate);
  REQUIRE(r.seconds.size() >= 3);
  REQUIRE(r.seconds[0].rate);
  CHECK(*r.seconds[0].rate < 1.5 * nginx_limits::rate);  // down from 5 R within the first second
}

// From below: slow start doubles the rate every second until the first 429, so R is reached in the third
// second (the SDKs' curve, initial + 0.4 t^3, needed 7.4 s from 0.2 R).
TEST_CASE("nginx: the adaptive rate starting at 0.2 R finds the limit within 3 s", "[integration][nginx]") {
  rein_test::nginx_server nginx;
  http_load::config c = rein_test::load_config(nginx, "/rate", 10s);
  c.rate = 0.2 * nginx_limits::rate;
  c.burst = nginx_limits::burst / 2;
  c.adaptive_rate = true;
  const http_load::report r = rein_test::run_and_print(c, "adaptive rate from 0.2 R, /rate");
  INFO(nginx.log());
  const http_load::counts later = r.from_second(2);
  CHECK(r.total.errors == 0);
  CHECK(rein_test::share(later.too_many, later.sent) < 0.01);
  REQUIRE(r.seconds.size() >= 4);
  REQUIRE(r.seconds[3].rate);
  CHECK(*r.seconds[3].rate >= 0.9 * nginx_limits::rate);
  CHECK(r.achieved_rate() >= 0.8 * nginx_limits::rate);
}

#endif
