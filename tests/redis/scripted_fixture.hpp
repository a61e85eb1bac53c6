// The scripted admission (rein/redis/detail/scripted_admission.hpp) of a shared limiter on rein's wait line,
// without Redis: the messages it would send are recorded, and the verdicts are made by hand (what the Lua
// script and the connection would report). Time is rein::testing::manual_clock, so every wait and deadline
// is exact. Shared by the sans-I/O tests of the bucket, the sliding window and the quota gate.
#pragma once

#include "support/async.hpp"
#include "support/catch.hpp"

#include <rein/detail/limiter_core.hpp>
#include <rein/permit.hpp>
#include <rein/redis/detail/scripted_admission.hpp>
#include <rein/redis/error.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace rein_test::scripted {

namespace net = rein::net;
using rein::error_code;
using rein::redis::detail::message;
using rein::redis::detail::message_list;
using rein::redis::detail::verdict;
using tp = manual_clock::time_point;

inline constexpr auto admission = message::kind::admission;
inline constexpr auto refund = message::kind::refund;
inline constexpr auto script_load = message::kind::script_load;

// What would go to the connection, in order.
struct recording_transport final : rein::detail::remote_transport<message_list> {
  std::vector<message> sent;
  void transmit(message_list& sends) noexcept override {
    for (std::size_t i = 0; i < sends.size(); ++i) sent.push_back(sends[i]);
    sends.clear();
  }
};

// One acquire's outcome (and its permit, for a semaphore).
struct result {
  bool done = false;
  error_code ec;
  rein::permit permit;
};

// The handler of an acquire: records into `r`, with or without a permit.
inline auto record(result& r) {
  return [&r](error_code ec, auto&&... p) {
    r.done = true;
    r.ec = ec;
    ((r.permit = std::move(p)), ...);
  };
}

inline verdict allowed(double available_us) { return {verdict::kind::allowed, 0, available_us, {}, 0}; }
inline verdict allowed_units(double available_us, std::int64_t units) { return {verdict::kind::allowed, 0, available_us, {}, units}; }
inline verdict denied(double retry_after_us, double available_us) { return {verdict::kind::denied, retry_after_us, available_us, {}, 0}; }
inline verdict unavailable() { return {}; }
inline verdict no_script() { return {verdict::kind::no_script, 0, 0, "NOSCRIPT No matching script.", 0}; }
inline verdict server_error() { return {verdict::kind::server_error, 0, 0, "WRONGTYPE Operation against a key holding the wrong kind of value", 0}; }

template <class Policy, class Signature = void(error_code), class Mutex = std::mutex>
struct scripted_fixture {
  using policy_type = Policy;
  using line_type = rein::detail::limiter_core<Policy, net::any_io_executor, manual_clock, Mutex, Signature>;
  rein_test::manual_clock_at_epoch epoch;
  net::io_context io;
  bool link_up = true;
  std::shared_ptr<recording_transport> transport = std::make_shared<recording_transport>();
  std::shared_ptr<line_type> line;

  explicit scripted_fixture(typename Policy::options_type o, rein::line_options options = {}) {
    if (o.key.empty()) o.key = "quota";
    line = std::make_shared<line_type>(
        io.get_executor(), rein::redis::detail::line_options_of(Policy::type_name, std::move(options)), o,
        [this] { return link_up; }, manual_clock::now());
    line->set_transport(transport);
  }
  scripted_fixture(const scripted_fixture&) = delete;
  scripted_fixture& operator=(const scripted_fixture&) = delete;
  ~scripted_fixture() {
    line->shutdown();
    poll(io);
  }

  void acquire(result& r, std::size_t n, tp deadline = tp::max()) {
    line->async_acquire(record(r), n, deadline);
  }
  void acquire(result& r, std::size_t n, net::cancellation_signal& signal) {
    line->async_acquire(net::bind_cancellation_slot(signal.slot(), record(r)), n, tp::max());
  }
  void settle(std::uint64_t ticket, const verdict& v) { line->settle(ticket, v); }
  typename Policy::snapshot_type snapshot() const {
    return line->inspect([](const Policy& p, const rein::wait_stats& w) {
      auto s = p.snapshot(manual_clock::now());
      static_cast<rein::wait_stats&>(s) = w;
      return s;
    });
  }
  std::vector<message> sent() const { return transport->sent; }
};

using messages = std::vector<message>;

}  // namespace rein_test::scripted

// A message as CHECK prints it: {kind, ticket, n, extra, wanted, resent}.
template <>
struct Catch::StringMaker<rein::redis::detail::message> {
  static std::string convert(const rein::redis::detail::message& m) {
    const auto text = [](auto v) { return std::to_string(v); };
    return "{" + text(static_cast<int>(m.what)) + ", " + text(m.ticket) + ", " + text(m.n) + ", " + text(m.extra) +
           ", " + text(m.wanted) + ", " + text(static_cast<int>(m.resent)) + "}";
  }
};
