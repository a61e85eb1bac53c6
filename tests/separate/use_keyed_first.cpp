// REIN_SEPARATE_COMPILATION, the other include order: keyed.hpp first, so that the limiters' headers
// declare keyed<quota_gate> and keyed<token_bucket> extern (use.cpp includes it last).
#include "support/catch.hpp"

#include <rein/keyed.hpp>
#include <rein/quota_gate.hpp>
#include <rein/token_bucket.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#else
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#endif

#include <chrono>
#include <exception>

namespace net = rein::net;

TEST_CASE("separately compiled keyed gates and buckets: a parked acquire ends when its gate closes", "[separate]") {
  net::io_context io;
  rein::keyed<rein::quota_gate> gates(io, {});
  rein::keyed<rein::token_bucket> buckets(io, rein::token_bucket_options{.rate = 1e-3, .capacity = 2});
  REQUIRE(buckets.get("a.example")->try_acquire(2));
  REQUIRE_FALSE(buckets.get("a.example")->try_acquire());
  REQUIRE(buckets.get("b.example")->try_acquire());

  auto gate = gates.get("a.example");
  gate->pause_for(std::chrono::hours(1));
  rein::error_code result;
  bool done = false;
  net::co_spawn(io, gate->acquire(), [&](std::exception_ptr e) {
    done = true;
    try {
      if (e) std::rethrow_exception(e);
    } catch (const rein::system_error& failure) {
      result = failure.code();
    }
  });
  io.poll();
  REQUIRE_FALSE(done);
  REQUIRE(gate->snapshot().waiting == 1);
  gate->close();
  io.run();
  REQUIRE(done);
  REQUIRE(result == rein::errc::closed);
  REQUIRE(gates.size() == 1);
  REQUIRE(buckets.size() == 2);
}
