// A client that does not know the quota (issue 14): rein's adaptive rate with its defaults, starting at 5 R
// or at 0.2 R, gets at least 0.9 R over 10 s, and after the first 2 s fewer than 1 % of its requests get 429.
// The quota gate is off (load_config): with it, each 429's "Retry-After: 1" pauses every worker for a second,
// a tenth of the run, so 0.9 R would allow no 429 at all.
#include "support/catch.hpp"
#include "support/load.hpp"

#if REIN_HTTP_LOAD_AVAILABLE

using namespace std::chrono_literals;
using rein_test::nginx_limits;

TEST_CASE("nginx: the adaptive rate starting at 5 R converges to the limit", "[integration][nginx]") {
  rein_test::nginx_server nginx;
  http_load::config c = rein_test::load_config(nginx, "/rate", 10s);
  c.rate = 5 * nginx_limits::rate;
  c.burst = nginx_limits::burst / 2;
  c.adaptive_rate = true;
  const http_load::report r = rein_test::run_and_print(c, "adaptive rate from 5 R, /rate");
  INFO(nginx.log());
  const http_load::counts later = r.from_second(2);
  CHECK(r.total.errors == 0);
  CHECK(r.total.too_many > 0);  // it did start above the limit, and learnt from the 429s
  CHECK(later.sent > 0);
  CHECK(rein_test::share(later.too_many, later.sent) < 0.01);
  CHECK(r.achieved_rate() >= 0.9 * nginx_limits::rate);
  REQUIRE(r.seconds.size() >= 3);
  REQUIRE(r.seconds[0].rate);
  CHECK(*r.seconds[0].rate < 1.5 * nginx_limits::rate);  // down from 5 R within the first second
}

// From below: slow start doubles the rate every 500 ms window until the first 429, so R is reached in the
// second second (the SDKs' curve, initial + 0.4 t^3, needed 7.4 s from 0.2 R).
TEST_CASE("nginx: the adaptive rate starting at 0.2 R finds the limit within 2 s", "[integration][nginx]") {
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
  // Accepted in the second second, not the rate at its end: a cut on the plateau may have just set 0.85 W.
  REQUIRE(r.seconds.size() >= 2);
  CHECK(static_cast<double>(r.seconds[1].ok) >= 0.9 * nginx_limits::rate);
  CHECK(r.achieved_rate() >= 0.9 * nginx_limits::rate);
}

#endif
