// The observer adaptor of examples/statsd.hpp: events and snapshots of limiters on the manual clock, sent
// as StatsD lines to a UDP socket on loopback that the test reads, line for line.
#include "support/asio.hpp"
#include "support/catch.hpp"
#include "support/manual_time.hpp"

// The adaptor is the example's, not a public header: the test reads the same file the example compiles.
#include "../../examples/statsd.hpp"

#include <rein/quota_gate.hpp>
#include <rein/semaphore.hpp>
#include <rein/testing.hpp>

#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace net = rein::net;
using rein_test::manual_clock;
using udp = net::ip::udp;

// A StatsD server's socket on a free loopback port.
struct receiver {
  explicit receiver(net::io_context& io) : socket(io, udp::endpoint(net::ip::address_v4::loopback(), 0)) {}

  // The datagrams waiting, one line each, in the order sent (loopback delivers a datagram before send
  // returns).
  std::vector<std::string> lines() {
    std::vector<std::string> out;
    while (socket.available() > 0) {
      char buffer[512];
      out.emplace_back(buffer, socket.receive(net::buffer(buffer)));
    }
    return out;
  }

  udp::socket socket;
};

using lines = std::vector<std::string>;

}  // namespace

TEST_CASE("statsd adaptor: a gate's pause is a timing, its end a count", "[statsd]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  receiver server(io);
  rein_example::statsd_sink sink(io.get_executor(), server.socket.local_endpoint());
  rein::basic_quota_gate<net::any_io_executor, manual_clock> gate(
      io.get_executor(), {}, {.name = "api", .observer = rein_example::forward_events(sink)});

  gate.pause_for(1500ms);
  CHECK(server.lines() == lines{"rein.api.pause:1500|ms"});
  rein_test::advance_and_poll(io, 1500ms);
  CHECK(static_cast<bool>(gate.try_acquire()));  // finds the pause over
  CHECK(server.lines() == lines{"rein.api.pause_ended:1|c"});
}

TEST_CASE("statsd adaptor: rejections by reason, limit changes, snapshots as increments and gauges", "[statsd]") {
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  receiver server(io);
  rein_example::statsd_sink sink(io.get_executor(), server.socket.local_endpoint());
  rein::basic_semaphore<net::any_io_executor, manual_clock> pool(
      io.get_executor(), 1,
      {.name = "db pool", .max_waiters = 1, .observer = rein_example::forward_events(sink)});  // ' ' is '_'
  rein_example::snapshot_reporter reporter(sink);

  auto held = pool.try_acquire();
  REQUIRE(static_cast<bool>(held));
  rein::error_code waited, refused;
  pool.async_acquire_for(1, 10ms, [&](rein::error_code ec, rein::permit) { waited = ec; });
  pool.async_acquire_for(1, 10ms, [&](rein::error_code ec, rein::permit) { refused = ec; });
  rein_test::poll(io);
  CHECK(refused == rein::errc::queue_full);
  CHECK(server.lines() == lines{"rein.db_pool.rejected.queue_full:1|c"});
  rein_test::advance_and_poll(io, 10ms);
  CHECK(waited == rein::errc::timed_out);
  CHECK(server.lines() == lines{"rein.db_pool.rejected.timed_out:1|c"});
  pool.add_permits(1);
  CHECK(server.lines() == lines{"rein.db_pool.limit:2|g"});

  reporter.report(pool.name(), pool.snapshot());
  CHECK(server.lines() == lines{"rein.db_pool.acquired:1|c", "rein.db_pool.rejected_total:2|c",
                                "rein.db_pool.waiting:0|g", "rein.db_pool.in_flight:1|g", "rein.db_pool.limit:2|g",
                                "rein.db_pool.utilisation:0.5|g"});
  // Nothing counted since: the counters send no zero; the gauges say the levels again.
  held.release();
  reporter.report(pool.name(), pool.snapshot());
  CHECK(server.lines() == lines{"rein.db_pool.waiting:0|g", "rein.db_pool.in_flight:0|g", "rein.db_pool.limit:2|g",
                                "rein.db_pool.utilisation:0|g"});
  auto both = pool.try_acquire(2);
  CHECK(static_cast<bool>(both));
  reporter.report(pool.name(), pool.snapshot());
  CHECK(server.lines() == lines{"rein.db_pool.acquired:1|c", "rein.db_pool.waiting:0|g",
                                "rein.db_pool.in_flight:2|g", "rein.db_pool.limit:2|g",
                                "rein.db_pool.utilisation:1|g"});
}
