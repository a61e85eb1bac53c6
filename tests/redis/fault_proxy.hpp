// A TCP proxy between a client and the test's redis-server, for fault injection: it can slow the traffic
// down, cut the connections or refuse new ones, which a real network does and a loopback server never
// does (redis_server::kill and pause stop the server itself; this leaves it running and healthy).
//
// It runs on a thread and io_context of its own, so it keeps forwarding (or holding back) bytes while the
// test's io_context is not being run, as a network would, and the code under test gets no help from it.
#pragma once

#include "support/asio.hpp"

#if defined(REIN_STANDALONE_ASIO)
#include <asio/ip/tcp.hpp>
#include <asio/write.hpp>
#else
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#endif

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace rein_test {

/// Listens on a free loopback port and forwards every connection to 127.0.0.1:`upstream`. The controls
/// may be called from any thread; none may be called from the proxy's own handlers.
class fault_proxy {
 public:
  explicit fault_proxy(std::uint16_t upstream)
      : upstream_(net::ip::address_v4::loopback(), upstream),
        acceptor_(io_, tcp::endpoint(net::ip::address_v4::loopback(), 0)),
        port_(acceptor_.local_endpoint().port()) {
    net::co_spawn(io_, accept_loop(), net::detached);
    thread_ = std::thread([this] { io_.run(); });
  }

  fault_proxy(const fault_proxy&) = delete;
  fault_proxy& operator=(const fault_proxy&) = delete;

  /// Closes the listener and every connection; once nothing is pending, run() returns and the thread ends.
  ~fault_proxy() {
    on_proxy_thread([this] {
      rein::error_code ignored;
      acceptor_.close(ignored);
      close_all();
    });
    thread_.join();
  }

  /// The port clients connect to.
  std::uint16_t port() const noexcept { return port_; }

  /// Every chunk read from now on, in either direction, is written `d` after it was read. Chunks keep
  /// their order: a chunk never overtakes one read before it (so lowering the delay takes effect only
  /// behind what is already held back).
  void set_delay(std::chrono::milliseconds d) { delay_ms_.store(d.count()); }

  /// Closes every open connection, on both sides, dropping what is held back. Returns once done: the
  /// clients' next read sees the end of the stream. New connections are forwarded as before.
  void cut() {
    on_proxy_thread([this] { close_all(); });
  }

  /// While true, new connections are accepted and closed at once, before anything reaches Redis: the
  /// client's connect succeeds but its first read fails, as with a server that dies at once. Open
  /// connections are left alone (cut() them too for a full outage).
  void refuse(bool on) { refusing_.store(on); }

 private:
  using tcp = net::ip::tcp;
  using clock = std::chrono::steady_clock;

  // One direction of one connection: the chunks read and not yet written, each with when it is due.
  struct pipe {
    explicit pipe(const net::any_io_executor& ex) : wake(ex) {}
    std::deque<std::pair<clock::time_point, std::string>> chunks;
    net::steady_timer wake;  // the writer waits on it for the next chunk's time, or for a chunk at all
  };

  // Both sockets of one forwarded connection. Used on the proxy's thread only.
  struct session {
    explicit session(tcp::socket accepted)
        : client(std::move(accepted)),
          server(client.get_executor()),
          up(client.get_executor()),
          down(client.get_executor()) {}

    // Always closes both sockets, even when already closed: an async_connect opens a closed socket again.
    void close() {
      closed = true;
      rein::error_code ignored;
      client.close(ignored);
      server.close(ignored);
      up.wake.cancel();
      down.wake.cancel();
    }

    tcp::socket client;
    tcp::socket server;
    pipe up;    // client -> server
    pipe down;  // server -> client
    bool closed = false;
  };

  net::awaitable<void> accept_loop() {
    for (;;) {
      auto [ec, socket] = co_await acceptor_.async_accept(as_tuple(net::use_awaitable));
      if (ec) co_return;  // closed by the destructor
      if (refusing_.load()) {
        rein::error_code ignored;
        socket.close(ignored);
        continue;
      }
      auto s = std::make_shared<session>(std::move(socket));
      std::erase_if(sessions_, [](const std::weak_ptr<session>& w) { return w.expired(); });
      sessions_.push_back(s);
      net::co_spawn(io_, open(std::move(s)), net::detached);
    }
  }

  net::awaitable<void> open(std::shared_ptr<session> s) {
    if (s->closed) co_return;  // cut before it started
    auto [ec] = co_await s->server.async_connect(upstream_, as_tuple(net::use_awaitable));
    if (ec || s->closed) {
      s->close();
      co_return;
    }
    net::co_spawn(io_, read(s, s->client, s->up), net::detached);
    net::co_spawn(io_, write(s, s->server, s->up), net::detached);
    net::co_spawn(io_, read(s, s->server, s->down), net::detached);
    net::co_spawn(io_, write(s, s->client, s->down), net::detached);
  }

  // Reads as fast as the peer sends (no back-pressure: tests send little), stamping each chunk with its due
  // time. The end of the stream or an error on either side closes the whole connection.
  net::awaitable<void> read(std::shared_ptr<session> s, tcp::socket& from, pipe& p) {
    std::array<char, 16 * 1024> buffer;
    for (;;) {
      auto [ec, n] = co_await from.async_read_some(net::buffer(buffer), as_tuple(net::use_awaitable));
      if (ec || s->closed) break;
      p.chunks.emplace_back(clock::now() + std::chrono::milliseconds(delay_ms_.load()), std::string(buffer.data(), n));
      p.wake.cancel();  // the writer may be waiting for a chunk
    }
    s->close();
  }

  // Writes the chunks in order, each no earlier than its due time.
  net::awaitable<void> write(std::shared_ptr<session> s, tcp::socket& to, pipe& p) {
    while (!s->closed) {
      if (p.chunks.empty() || p.chunks.front().first > clock::now()) {
        p.wake.expires_at(p.chunks.empty() ? clock::time_point::max() : p.chunks.front().first);
        co_await p.wake.async_wait(as_tuple(net::use_awaitable));  // ends early on a new chunk or close
        continue;
      }
      const std::string data = std::move(p.chunks.front().second);
      p.chunks.pop_front();
      auto [ec, n] = co_await net::async_write(to, net::buffer(data), as_tuple(net::use_awaitable));
      if (ec) break;
    }
    s->close();
  }

  void close_all() {
    for (const std::weak_ptr<session>& w : sessions_) {
      if (const auto s = w.lock()) s->close();
    }
    sessions_.clear();
  }

  // Runs `f` on the proxy's thread and waits for it: the sockets are touched by that thread only.
  template <class F>
  void on_proxy_thread(F f) {
    std::promise<void> done;
    std::future<void> finished = done.get_future();
    net::post(io_, [&] {
      f();
      done.set_value();
    });
    finished.wait();
  }

  net::io_context io_;
  const tcp::endpoint upstream_;
  tcp::acceptor acceptor_;
  const std::uint16_t port_;
  std::vector<std::weak_ptr<session>> sessions_;  // proxy thread only
  std::atomic<std::int64_t> delay_ms_{0};
  std::atomic<bool> refusing_{false};
  std::thread thread_;
};

}  // namespace rein_test
