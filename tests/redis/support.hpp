// Helpers of the rein::redis tests: running an io_context in real time with a cap, and recording
// completions with the time they happened.
#pragma once

#include "redis_server.hpp"
#include "support/asio.hpp"
#include "support/catch.hpp"

#include <rein/redis/connection.hpp>
#include <rein/redis/shared_token_bucket.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rein_test {

using steady = std::chrono::steady_clock;
using namespace std::chrono_literals;

/// Runs `io` until `done()` holds or `limit` (real time) passes. Returns whether `done()` held.
template <class Done>
bool run_until(net::io_context& io, Done done, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto give_up = steady::now() + limit;
  io.restart();
  while (!done()) {
    if (steady::now() >= give_up) return false;
    io.run_one_for(std::chrono::milliseconds(5));
    if (io.stopped()) io.restart();
  }
  return true;
}

/// Runs `io` for `d` of real time.
inline void run_for(net::io_context& io, std::chrono::milliseconds d) {
  const auto end = steady::now() + d;
  run_until(io, [&] { return steady::now() >= end; }, d + std::chrono::milliseconds(100));
}

/// One completion of an operation with signature void(error_code): when and how it ended.
struct outcome {
  rein::error_code ec;
  steady::time_point at;
};

/// Records completions (in completion order) of operations started through `handler(i)`.
struct recorder {
  std::vector<std::optional<outcome>> results;
  std::vector<std::size_t> order;  ///< indices in completion order

  explicit recorder(std::size_t n) : results(n) {}

  auto handler(std::size_t i) {
    return [this, i](rein::error_code ec) {
      REQUIRE_FALSE(results[i].has_value());
      results[i] = outcome{ec, steady::now()};
      order.push_back(i);
    };
  }

  std::size_t completed() const { return order.size(); }
  bool all_done() const { return order.size() == results.size(); }
  std::size_t succeeded() const {
    std::size_t n = 0;
    for (const auto& r : results) n += (r && !r->ec) ? 1 : 0;
    return n;
  }
};

/// A unique key per test, so tests never see each other's quotas.
inline std::string unique_key(const std::string& name) {
  static std::atomic<int> counter{0};
  return "rein:test:" + name + ":" + std::to_string(::getpid()) + ":" + std::to_string(counter.fetch_add(1));
}

/// Connection options for the test server with short timeouts, so failures show within a test's time.
inline rein::redis::connection_options local(std::uint16_t port) {
  rein::redis::connection_options o;
  o.port = port;
  o.connect_timeout = std::chrono::milliseconds(500);
  o.request_timeout = std::chrono::milliseconds(500);
  o.reconnect_base = std::chrono::milliseconds(10);
  o.reconnect_cap = std::chrono::milliseconds(100);
  return o;
}

/// Executes one command on `c` and runs `io` until its reply (at most 5 s).
inline rein::redis::reply execute(net::io_context& io, rein::redis::connection& c,
                                  std::initializer_list<std::string_view> args, rein::error_code* ec_out = nullptr) {
  std::optional<std::pair<rein::error_code, rein::redis::reply>> got;
  c.async_execute(args, [&](rein::error_code ec, rein::redis::reply r) { got.emplace(ec, std::move(r)); });
  REQUIRE(run_until(io, [&] { return got.has_value(); }, std::chrono::seconds(5)));
  if (ec_out != nullptr) *ec_out = got->first;
  else REQUIRE_FALSE(got->first);
  return std::move(got->second);
}

}  // namespace rein_test
