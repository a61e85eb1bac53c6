// A client that does not know the quota: rein's adaptive rate with its defaults, starting at 5 R or at 0.2 R,
// gets at least 0.9 R over 10 s, and after the first 2 s fewer than 1 % of its requests get 429, with the
// quota gate off (the first two cases). With it on (the last two, http_load's default), each 429's
// "Retry-After: 1" pauses every worker for a second, a tenth of the run, and the first 429 is unavoidable
// from either side: what is asked is >= 0.85 R over the time not paused, and a bound on the pauses
// (tests/algo/adaptive_rate.cpp's exact simulation: 0.91 R and 3 pauses from 0.2 R, 1.04 R and 6 from 5 R;
// real runs 0.91 R and 3, 0.97 R and 4).
#include "support/catch.hpp"
#include "support/load.hpp"

#if REIN_HTTP_LOAD_AVAILABLE

#include <algorithm>

using namespace std::chrono_literals;
using rein_test::nginx_limits;

namespace {

// Seconds of the sending window during which the quota gate was closed (overlapping pauses counted once).
double paused_seconds(const http_load::report& r) {
  const http_load::clock::time_point end = r.start + r.cfg.duration;
  http_load::clock::duration paused{};
  http_load::clock::time_point covered = r.start;
  for (const http_load::pause_event& p : r.pauses) {  // in the order applied, so `at` never decreases
    const auto from = std::clamp(std::max(p.at, covered), r.start, end);
    const auto until = std::clamp(p.until, r.start, end);
    if (until > from) paused += until - from;
    covered = std::max(covered, p.until);
  }
  return std::chrono::duration<double>(paused).count();
}

// With the gate: 2xx per second of the time not paused, and the pause count, within bounds.
void check_gated(const http_load::report& r, std::size_t max_pauses, double min_achieved) {
  const double unpaused = r.window_seconds() - paused_seconds(r);
  INFO("paused " << paused_seconds(r) << " s, " << r.pauses.size() << " pauses");
  CHECK(r.total.errors == 0);
  CHECK(r.total.too_many > 0);
  CHECK(r.pauses.size() <= max_pauses);
  CHECK(static_cast<double>(r.total.ok) >= 0.85 * nginx_limits::rate * unpaused);
  CHECK(r.achieved_rate() >= min_achieved * nginx_limits::rate);
  const http_load::counts later = r.from_second(2);
  CHECK(rein_test::share(later.too_many, later.sent) < 0.01);
}

// /rate for 10 s through the adaptive rate with its defaults, starting at `start` times the quota.
http_load::config adaptive_config(const rein_test::nginx_server& nginx, double start, bool gate) {
  http_load::config c = rein_test::load_config(nginx, "/rate", 10s);
  c.quota_gate = gate;
  c.rate = start * nginx_limits::rate;
  c.burst = nginx_limits::burst / 2;
  c.adaptive_rate = true;
  return c;
}

}  // namespace

TEST_CASE("nginx: the adaptive rate starting at 5 R converges to the limit", "[integration][nginx]") {
  rein_test::nginx_server nginx;
  const http_load::config c = adaptive_config(nginx, 5, false);
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
  const http_load::config c = adaptive_config(nginx, 0.2, false);
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

TEST_CASE("nginx: with the quota gate, the adaptive rate from 5 R learns across the pauses", "[integration][nginx]") {
  rein_test::nginx_server nginx;
  const http_load::config c = adaptive_config(nginx, 5, true);
  const http_load::report r = rein_test::run_and_print(c, "adaptive rate from 5 R, quota gate on");
  // Simulated: 6 pauses (4 cuts and 429s in flight), 0.60 R over 10 s; real: 4 pauses, 0.58-0.59 R (was 8,
  // 0.29 R). A CI run on a quiet machine once paid 6 pauses, 5.7 s paused, 0.47 R (the unpaused rate still
  // 1.09 R): each pause costs a tenth of the run, so the overall bound allows for the 6 the simulation pays.
  check_gated(r, 7, 0.45);
}

TEST_CASE("nginx: with the quota gate, the adaptive rate from 0.2 R learns across the pauses", "[integration][nginx]") {
  rein_test::nginx_server nginx;
  const http_load::config c = adaptive_config(nginx, 0.2, true);
  const http_load::report r = rein_test::run_and_print(c, "adaptive rate from 0.2 R, quota gate on");
  // Simulated: 3 pauses, 0.64 R over 10 s; real: 3 pauses, 0.63 R (was 3, 0.61 R) with CUBIC's curve. With
  // the hold's defaults (30 s, a margin from 1/32) two CI runs paid 5 pauses, 0.49 R: slow start's first 429
  // comes after nginx's burst of 20 has drained, W is read near the client's own burst rate (about 1.5 R),
  // and the level held above R is taken down by margin widenings (a pause each) instead of one cut. A known
  // cost of the hold against a server with a burst, left open in the unknown-quota work. With slow start's W
  // read from the latest takes: 4 pauses, 0.64-0.65 R (two runs on a loaded machine).
  check_gated(r, 6, 0.45);
}

#endif
