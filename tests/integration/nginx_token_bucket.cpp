// Issue 6, point 2: rein's token bucket at 0.95 R with a burst no larger than nginx's keeps every request
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
