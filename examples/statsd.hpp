// An observer adaptor: rein's events (rein::limiter_event) and snapshots forwarded to a metrics system
// through three calls, count, gauge and timing, and a StatsD sink that writes them as UDP lines
// (`name:value|c`, `|g`, `|ms`). examples/statsd.cpp runs it; tests/async/statsd.cpp reads its lines.
// Any other system (OpenTelemetry's counters, gauges and histograms; docs/observability.md) implements
// metrics_sink the same way.
#pragma once

#include <rein/config.hpp>
#include <rein/observer.hpp>
#include <rein/wait_stats.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/any_io_executor.hpp>
#include <asio/buffer.hpp>
#include <asio/ip/udp.hpp>
#else
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/ip/udp.hpp>
#endif

#include <charconv>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

namespace rein_example {

namespace net = rein::net;

/// What a metrics system offers rein: a counter's increment, a level now, one duration.
class metrics_sink {
 public:
  virtual ~metrics_sink() = default;
  virtual void count(std::string_view name, std::uint64_t n) = 0;
  virtual void gauge(std::string_view name, double value) = 0;
  virtual void timing(std::string_view name, std::chrono::nanoseconds d) = 0;
};

/// `rein.<limiter>.<what>`, with what StatsD cannot carry in a name (':', '|', '@', spaces) as '_'.
inline std::string metric_name(std::string_view limiter, std::string_view what) {
  std::string s = "rein.";
  for (const char c : limiter.empty() ? std::string_view("unnamed") : limiter)
    s += (c == ':' || c == '|' || c == '@' || c <= ' ') ? '_' : c;
  return s + '.' + std::string(what);
}

/// An observer (options' `.observer`) forwarding each event: a rejection counts `rejected.<reason>` by its
/// count, a limit change sets the `limit` gauge, a pause or an opened circuit times its length (`pause`,
/// `circuit_open`), and every other kind counts itself (`pause_ended`, `key_evicted`, `at_floor`, ...).
/// Keys stay out of the names: a key per client would make a series per client.
inline rein::limiter_observer forward_events(metrics_sink& sink) {
  return [&sink](const rein::limiter_event& e) {
    const std::string_view kind = rein::to_string(e.kind);
    switch (e.kind) {
      case rein::event_kind::rejected:
        sink.count(metric_name(e.name, "rejected." + std::string(rein::to_string(e.reason))), e.count);
        return;
      case rein::event_kind::limit_changed: sink.gauge(metric_name(e.name, "limit"), e.to); return;
      case rein::event_kind::pause_started: sink.timing(metric_name(e.name, "pause"), e.pause); return;
      case rein::event_kind::circuit_opened: sink.timing(metric_name(e.name, "circuit_open"), e.pause); return;
      default: sink.count(metric_name(e.name, kind), 1); return;
    }
  };
}

/// Sends a limiter's snapshot on each report(): the growth of `acquired` and `rejected_total` since the last
/// report (StatsD counters are increments; a zero is not sent; the reasons come from the events, under
/// other names, so that nothing is counted twice), and the levels as gauges (`waiting`, and `in_flight`, `limit`,
/// `utilisation` where the snapshot has them). Call it from a timer, every scrape interval.
class snapshot_reporter {
 public:
  explicit snapshot_reporter(metrics_sink& sink) : sink_(sink) {}

  template <class Snapshot>
  void report(std::string_view limiter, const Snapshot& s) {
    const rein::wait_stats& w = s;
    add(limiter, "acquired", w.acquired_total);
    add(limiter, "rejected_total", w.rejected_total);
    sink_.gauge(metric_name(limiter, "waiting"), static_cast<double>(w.waiting));
    if constexpr (requires { s.in_flight; }) sink_.gauge(metric_name(limiter, "in_flight"), double(s.in_flight));
    if constexpr (requires { s.limit; }) sink_.gauge(metric_name(limiter, "limit"), s.limit);
    if constexpr (requires { s.utilisation; }) sink_.gauge(metric_name(limiter, "utilisation"), s.utilisation);
  }

 private:
  void add(std::string_view limiter, const std::string& what, std::uint64_t total) {
    const std::string name = metric_name(limiter, what);
    std::uint64_t& last = sent_[name];
    if (total > last) sink_.count(name, total - last);
    last = total;
  }

  metrics_sink& sink_;
  std::map<std::string, std::uint64_t> sent_;  // each counter's total at the last report
};

/// A metrics_sink writing StatsD lines, one datagram each, to a UDP endpoint. A send on UDP does not wait
/// for the receiver, so it may run inside an observer; a mutex orders observers called from several
/// threads. A lost datagram is a lost sample, as StatsD accepts.
class statsd_sink : public metrics_sink {
 public:
  statsd_sink(const net::any_io_executor& ex, const net::ip::udp::endpoint& to) : socket_(ex) {
    socket_.open(to.protocol());
    socket_.connect(to);
  }

  void count(std::string_view name, std::uint64_t n) override { send(name, std::to_string(n), "c"); }
  void gauge(std::string_view name, double value) override { send(name, number(value), "g"); }
  void timing(std::string_view name, std::chrono::nanoseconds d) override {
    send(name, number(std::chrono::duration<double, std::milli>(d).count()), "ms");
  }

 private:
  // The shortest text that reads back as `value` ("0.75", "4", "1500"), whatever the locale.
  static std::string number(double value) {
    char text[32];
    const auto end = std::to_chars(text, text + sizeof text, value).ptr;
    return std::string(text, end);
  }

  void send(std::string_view name, const std::string& value, std::string_view type) {
    const std::string line = std::string(name) + ':' + value + '|' + std::string(type);
    std::lock_guard lock(mutex_);
    rein::error_code ignored;  // no receiver (ECONNREFUSED from an earlier datagram) must not break a limiter
    socket_.send(net::buffer(line), 0, ignored);
  }

  std::mutex mutex_;
  net::ip::udp::socket socket_;
};

}  // namespace rein_example
