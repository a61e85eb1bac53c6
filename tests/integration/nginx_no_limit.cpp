// The contrast: no limiter, 16 workers for 3 s against nginx's limit_req of R = 200/s.
// Most requests above R are rejected with 429; nginx lets through about R per second.
#include "support/catch.hpp"
#include "support/load.hpp"

#if REIN_HTTP_LOAD_AVAILABLE

using namespace std::chrono_literals;
using rein_test::nginx_limits;

TEST_CASE("nginx: without a limiter, most requests are rejected with 429", "[integration][nginx]") {
  rein_test::nginx_server nginx;
  const http_load::report r = rein_test::run_and_print(rein_test::load_config(nginx, "/rate", 3s), "no limiter, /rate");
  const double window = r.window_seconds();
  INFO(nginx.log());
  CHECK(r.total.errors == 0);
  CHECK(static_cast<double>(r.total.sent) > 2 * nginx_limits::rate * window);  // the workers really push more than R
  CHECK(rein_test::share(r.total.too_many, r.total.sent) > 0.5);
  CHECK(static_cast<double>(r.total.ok) <= nginx_limits::rate * window * 1.1 + nginx_limits::burst);
}

#endif
