// nginx's limit_conn of C = 8 with 16 workers. rein's semaphore at C gets no 503; an AIMD
// limit starting at 16 converges to C with under 2 % 503 after the first second (it waits at C longer each
// time a probe finds C + 1 again). Without a limiter, most
// requests get 503 (the contrast).
#include "support/catch.hpp"
#include "support/load.hpp"

#if REIN_HTTP_LOAD_AVAILABLE

#include <cstddef>

using namespace std::chrono_literals;
using rein_test::nginx_limits;

TEST_CASE("nginx: without a limiter, 16 workers against limit_conn 8 mostly get 503", "[integration][nginx]") {
  rein_test::nginx_server nginx;
  const http_load::report r = rein_test::run_and_print(rein_test::load_config(nginx, "/conn", 2s), "no limiter, /conn");
  INFO(nginx.log());
  CHECK(r.total.errors == 0);
  CHECK(rein_test::share(r.total.unavailable, r.total.sent) > 0.5);
}

TEST_CASE("nginx: a semaphore at C gets no 503 from limit_conn C", "[integration][nginx]") {
  rein_test::nginx_server nginx;
  http_load::config c = rein_test::load_config(nginx, "/conn", 3s);
  c.concurrency = http_load::concurrency_kind::fixed;
  c.concurrency_limit = nginx_limits::connections;
  const http_load::report r = rein_test::run_and_print(c, "semaphore at C, /conn");
  INFO(nginx.log());
  CHECK(r.total.errors == 0);
  CHECK(r.total.unavailable == 0);
  CHECK(r.total.ok == r.total.sent);
  CHECK(r.total.ok > 100);  // ~160/s: eight slots of ~50 ms each
}

TEST_CASE("nginx: AIMD starting at 16 converges to about C with few 503s after the first second",
          "[integration][nginx]") {
  rein_test::nginx_server nginx;
  http_load::config c = rein_test::load_config(nginx, "/conn", 4s);
  c.concurrency = http_load::concurrency_kind::aimd;
  c.concurrency_limit = 16;
  // Only 503s teach this limit: the pacing holds a call either not at all or ~100 ms whatever the limit, so a
  // latency judgement would sink the limit to about 2 (the latency-judging default measures ~2 here).
  c.aimd.latency_tolerance = std::nullopt;
  const http_load::report r = rein_test::run_and_print(c, "aimd from 16, /conn");
  INFO(nginx.log());
  const http_load::counts later = r.from_second(1);
  CHECK(r.total.errors == 0);
  CHECK(later.sent > 0);
  // Measured (3 runs): 3 of ~480 (0.6 %) answered 503 after the first second, the limit sampled at 7.4 to
  // 8.0; without aimd's wait below a level found again (plateau_rounds 0), 23-24 of ~500 (4.6-4.8 %) and
  // 7.3 to 8.9. A clean clone's CI run beside other builds once saw 10 of 489 (2.0 %). Margins for real
  // time on a loaded machine, still below what the rule it tests removes.
  CHECK(rein_test::share(later.unavailable, later.sent) < 0.03);
  // The limit, sampled at the end of each second after the first, stays just below C + 1 (which fails).
  double sum = 0;
  std::size_t samples = 0;
  for (std::size_t i = 1; i < r.seconds.size(); ++i) {
    if (!r.seconds[i].concurrency_limit) continue;
    const double limit = *r.seconds[i].concurrency_limit;
    CHECK(limit >= 0.75 * nginx_limits::connections);
    CHECK(limit < nginx_limits::connections + 1);
    sum += limit;
    ++samples;
  }
  REQUIRE(samples >= 2);
  const double mean = sum / static_cast<double>(samples);
  CHECK(mean >= 0.9 * nginx_limits::connections);
}

#endif
