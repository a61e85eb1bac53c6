// A TCP relay on loopback that delays what clients send, for the integration tests: network jitter without
// netem. Each chunk a client sends is held for a seeded random delay uniform in [0, spread], and never
// forwarded before the previous chunk of its connection (so the bytes keep their order); what the upstream
// answers is relayed at once. Boost.Asio only.
#pragma once

#if defined(REIN_STANDALONE_ASIO)
#error "delay_proxy.hpp is written for Boost.Asio"
#endif

#include "loopback_listener.hpp"

#include <rein/config.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rein_test {

namespace net = rein::net;

struct delay_options {
  std::chrono::nanoseconds spread{0};  ///< each client chunk waits a delay uniform in [0, spread]
  std::uint64_t seed = 1;              ///< of the delays, drawn in the order chunks arrive
};

/// One chunk a client sent (one read from its socket), as the proxy handled it.
struct relayed_chunk {
  std::uint64_t connection = 0;            ///< 1 for the first connection accepted, 2 for the next, ...
  std::size_t bytes = 0;
  std::chrono::nanoseconds drawn{0};       ///< the random delay drawn for it
  std::chrono::steady_clock::time_point received{};   ///< read from the client
  std::chrono::steady_clock::time_point forwarded{};  ///< handed to the upstream socket
};

/// Listens on 127.0.0.1 at a free port from the constructor on, on a thread of its own, until the
/// destructor; every connection accepted is relayed to 127.0.0.1:upstream_port (a connection the upstream
/// refuses is closed). A chunk read at `received` is forwarded at max(received + drawn, the previous chunk's
/// forwarding time). A client's end of stream is passed on after its last chunk, the upstream's at once.
class delay_proxy {
 public:
  using clock = std::chrono::steady_clock;

  /// Throws std::invalid_argument for a negative spread, and Asio's system_error if it cannot listen.
  explicit delay_proxy(unsigned short upstream_port, delay_options options = {})
      : upstream_{net::ip::address_v4::loopback(), upstream_port}, spread_(options.spread), random_(options.seed) {
    if (spread_ < spread_.zero()) throw std::invalid_argument("delay_proxy: negative spread");
    listener_.start([this](tcp::socket socket) {
      net::co_spawn(listener_.io(), open(std::make_shared<relay>(std::move(socket), ++connections_)), net::detached);
    });
  }

  delay_proxy(const delay_proxy&) = delete;
  delay_proxy& operator=(const delay_proxy&) = delete;

  unsigned short port() const noexcept { return listener_.port(); }
  /// "http://127.0.0.1:<port><path>"
  std::string url(std::string_view path) const { return listener_.url(path); }

  /// Connections accepted so far.
  std::uint64_t connections() const noexcept { return connections_.load(); }

  /// The client chunks forwarded so far, in the order they were forwarded.
  std::vector<relayed_chunk> chunks() const {
    const std::lock_guard lock(mutex_);
    return chunks_;
  }

 private:
  using tcp = net::ip::tcp;

  struct pending {
    std::string data;
    relayed_chunk record;
    clock::time_point due;
  };

  // One client connection and its upstream: three coroutines share it (client reader, forwarder, answer
  // relay), and it closes both sockets when the last of them ends.
  struct relay {
    relay(tcp::socket accepted, std::uint64_t number)
        : client(std::move(accepted)), upstream(client.get_executor()), wake(client.get_executor()), connection(number) {}

    void close() {
      boost::system::error_code ignored;
      client.close(ignored);
      upstream.close(ignored);
      wake.cancel();
    }

    tcp::socket client;
    tcp::socket upstream;
    net::steady_timer wake;  // the forwarder waits on it: for the front chunk's due time, or for a chunk
    std::deque<pending> queue;
    clock::time_point last_due{};
    bool client_done = false;
    std::uint64_t connection;
  };

  net::awaitable<void> open(std::shared_ptr<relay> r) {
    auto [error] = co_await r->upstream.async_connect(upstream_, net::as_tuple(net::use_awaitable));
    if (error) {
      r->close();
      co_return;
    }
    // Small writes go out at once: the delay is ours to add, not Nagle's.
    r->client.set_option(tcp::no_delay(true), error);
    r->upstream.set_option(tcp::no_delay(true), error);
    net::co_spawn(listener_.io(), read_client(r), net::detached);
    net::co_spawn(listener_.io(), forward(r), net::detached);
    net::co_spawn(listener_.io(), answer(r), net::detached);
  }

  // Client -> queue, each chunk with its due time.
  net::awaitable<void> read_client(std::shared_ptr<relay> r) {
    std::array<char, 16384> buffer;
    for (;;) {
      auto [error, n] = co_await r->client.async_read_some(net::buffer(buffer), net::as_tuple(net::use_awaitable));
      if (error) break;
      pending chunk{std::string(buffer.data(), n), {r->connection, n, draw(), clock::now(), {}}, {}};
      chunk.due = std::max(chunk.record.received + chunk.record.drawn, r->last_due);
      r->last_due = chunk.due;
      r->queue.push_back(std::move(chunk));
      r->wake.cancel();
    }
    r->client_done = true;
    r->wake.cancel();
  }

  // Queue -> upstream, in order, each chunk once due; then the client's end of stream.
  net::awaitable<void> forward(std::shared_ptr<relay> r) {
    while (!r->queue.empty() || !r->client_done) {
      const clock::time_point now = clock::now();
      if (r->queue.empty() || now < r->queue.front().due) {
        r->wake.expires_at(r->queue.empty() ? clock::time_point::max() : r->queue.front().due);
        co_await r->wake.async_wait(net::as_tuple(net::use_awaitable));  // or cancelled by a new chunk
        continue;
      }
      pending chunk = std::move(r->queue.front());
      r->queue.pop_front();
      chunk.record.forwarded = now;
      record(chunk.record);
      auto [error, n] = co_await net::async_write(r->upstream, net::buffer(chunk.data), net::as_tuple(net::use_awaitable));
      if (error) {
        r->close();
        co_return;
      }
    }
    boost::system::error_code ignored;
    r->upstream.shutdown(tcp::socket::shutdown_send, ignored);
  }

  // Upstream -> client, at once.
  net::awaitable<void> answer(std::shared_ptr<relay> r) {
    std::array<char, 16384> buffer;
    for (;;) {
      auto [read_error, n] = co_await r->upstream.async_read_some(net::buffer(buffer), net::as_tuple(net::use_awaitable));
      if (read_error) break;
      auto [write_error, written] =
          co_await net::async_write(r->client, net::buffer(buffer.data(), n), net::as_tuple(net::use_awaitable));
      if (write_error) {
        r->close();
        co_return;
      }
    }
    boost::system::error_code ignored;
    r->client.shutdown(tcp::socket::shutdown_send, ignored);
  }

  std::chrono::nanoseconds draw() {
    if (spread_ == spread_.zero()) return spread_;
    return std::chrono::nanoseconds{std::uniform_int_distribution<std::int64_t>(0, spread_.count())(random_)};
  }

  void record(const relayed_chunk& chunk) {
    const std::lock_guard lock(mutex_);
    chunks_.push_back(chunk);
  }

  tcp::endpoint upstream_;
  std::chrono::nanoseconds spread_;
  std::mt19937_64 random_;  // the proxy thread's only
  std::atomic<std::uint64_t> connections_{0};
  mutable std::mutex mutex_;
  std::vector<relayed_chunk> chunks_;  // under mutex_
  loopback_listener listener_;  // last: its thread stops before the members above are destroyed
};

}  // namespace rein_test
