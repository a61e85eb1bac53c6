// rein::token_bucket with `warmup` (async layer): queued waiters are granted at the cold bucket's intervals,
// and a bad warm-up option names the bucket, the field and the value.
#include "support/catch.hpp"
#include "support/manual_time.hpp"

#include <rein/error.hpp>
#include <rein/token_bucket.hpp>

#include <chrono>
#include <stdexcept>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
using rein_test::manual_clock;
using bucket = rein::basic_token_bucket<net::any_io_executor, manual_clock>;

}  // namespace

TEST_CASE("token_bucket warm-up: waiters are granted at the cold intervals", "[token_bucket][warmup]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  bucket b(io, {.rate = 10, .capacity = 1, .warmup = {.period = 10s}});
  std::vector<manual_clock::duration> granted;
  for (int i = 0; i < 3; ++i)
    b.async_acquire(1, [&](rein::error_code ec) {
      CHECK(!ec);
      granted.push_back(rein_test::since_epoch());
    });
  rein_test::poll(io);
  CHECK(granted == std::vector<manual_clock::duration>{0ms});
  CHECK(b.snapshot().rate == 10);
  CHECK(b.snapshot().current_rate == 1000.0 / 296);  // 9.9 s of coldness left: 296 ms a token
  // 296 ms after a take that leaves 9.9 s of coldness, then 292 ms (see tests/algo/token_bucket_warmup.cpp).
  rein_test::advance_and_poll(io, 296ms - 1ns);
  CHECK(granted.size() == 1);
  rein_test::advance_and_poll(io, 1ns);
  rein_test::advance_and_poll(io, 292ms);
  CHECK(granted == std::vector<manual_clock::duration>{0ms, 296ms, 588ms});
}

TEST_CASE("token_bucket warm-up: a bad option names the bucket, the field and the value", "[token_bucket][warmup]") {
  net::io_context io;
  CHECK_THROWS_WITH(bucket(io, {.rate = 1, .capacity = 1, .warmup = {.period = 1s, .cold_factor = 0}}, {.name = "api"}),
                    "rein::token_bucket \"api\": warmup.cold_factor must be in [1, 1000], got 0");
}
