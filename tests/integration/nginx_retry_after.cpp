// A 429 carrying Retry-After pauses every caller of that host through rein's quota gate:
// no request is sent to the host before the pause ends.
#include "support/catch.hpp"
#include "support/load.hpp"

#if REIN_HTTP_LOAD_AVAILABLE

#include <algorithm>

using namespace std::chrono_literals;

TEST_CASE("nginx: a 429 with Retry-After pauses every worker until the pause ends", "[integration][nginx]") {
  rein_test::nginx_server nginx;
  http_load::config c = rein_test::load_config(nginx, "/rate", 3500ms);
  c.quota_gate = true;
  const http_load::report r = rein_test::run_and_print(c, "quota gate only, /rate (Retry-After: 1)");
  INFO(nginx.log());
  CHECK(r.total.errors == 0);
  REQUIRE(r.total.too_many > 0);
  REQUIRE_FALSE(r.pauses.empty());
  for (const http_load::pause_event& p : r.pauses) {
    CHECK(p.until - p.at >= 990ms);  // "Retry-After: 1", less the time to read the answer
    const auto inside = std::count_if(r.sends.begin(), r.sends.end(), [&](auto s) { return s > p.at && s < p.until; });
    CHECK(inside == 0);
  }
  // Sending resumed once the first pause was over, and the run saw more than one pause.
  const auto after_first = std::count_if(r.sends.begin(), r.sends.end(), [&](auto s) { return s >= r.pauses.front().until; });
  CHECK(after_first > 0);
  CHECK(r.pauses.back().at - r.pauses.front().at >= 1s);
}

#endif

#if REIN_HTTP_LOAD_AVAILABLE

TEST_CASE("nginx: callers already past the gate, waiting for the rate, do not send during the pause either",
          "[integration][nginx]") {
  rein_test::nginx_server nginx;
  http_load::config c = rein_test::load_config(nginx, "/rate", 3500ms);
  c.quota_gate = true;
  c.rate = 2 * rein_test::nginx_limits::rate;  // above the limit: 429s come, while most workers wait here
  c.burst = rein_test::nginx_limits::burst / 2;
  const http_load::report r = rein_test::run_and_print(c, "quota gate + token bucket at 2 R, /rate");
  INFO(nginx.log());
  CHECK(r.total.errors == 0);
  REQUIRE_FALSE(r.pauses.empty());
  for (const http_load::pause_event& p : r.pauses) {
    const auto inside = std::count_if(r.sends.begin(), r.sends.end(), [&](auto s) { return s > p.at && s < p.until; });
    CHECK(inside == 0);
  }
  const auto after_first = std::count_if(r.sends.begin(), r.sends.end(), [&](auto s) { return s >= r.pauses.front().until; });
  CHECK(after_first > 0);
}

#endif
