// What the in-process servers of the integration tests share (provider_emulator, delay_proxy): an acceptor
// on 127.0.0.1 at a free port, and an io_context running on a thread of its own until destruction.
// Boost.Asio only.
#pragma once

#if defined(REIN_STANDALONE_ASIO)
#error "loopback_listener.hpp is written for Boost.Asio"
#endif

#include <rein/config.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

namespace rein_test {

namespace net = rein::net;

/// Listens from construction on (the kernel picks the port, so nothing can take it first); start() hands
/// every accepted connection to a callback on the listener's own thread. The destructor stops that thread,
/// then destroys the coroutines still suspended: an owner whose coroutines use its other members declares
/// the listener as its last member, so that it goes first.
class loopback_listener {
 public:
  using tcp = net::ip::tcp;

  /// Throws Asio's system_error if it cannot listen.
  loopback_listener() {
    const tcp::endpoint loopback{net::ip::address_v4::loopback(), 0};
    acceptor_.open(loopback.protocol());
    acceptor_.bind(loopback);
    acceptor_.listen();
    port_ = acceptor_.local_endpoint().port();
  }

  loopback_listener(const loopback_listener&) = delete;
  loopback_listener& operator=(const loopback_listener&) = delete;

  ~loopback_listener() {
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }

  /// Accepts connections, each given to `on_accept` on the listener's thread, from now until destruction.
  void start(std::function<void(tcp::socket)> on_accept) {
    net::co_spawn(io_, accept_loop(std::move(on_accept)), net::detached);
    thread_ = std::thread([this] { io_.run(); });
  }

  net::io_context& io() noexcept { return io_; }
  unsigned short port() const noexcept { return port_; }
  /// "http://127.0.0.1:<port><path>"
  std::string url(std::string_view path) const { return "http://127.0.0.1:" + std::to_string(port_) + std::string(path); }

 private:
  net::awaitable<void> accept_loop(std::function<void(tcp::socket)> on_accept) {
    for (;;) {
      auto [error, socket] = co_await acceptor_.async_accept(net::as_tuple(net::use_awaitable));
      if (error == net::error::operation_aborted) co_return;
      if (error) continue;  // a connection reset before it was accepted, out of descriptors: keep listening
      on_accept(std::move(socket));
    }
  }

  net::io_context io_;
  tcp::acceptor acceptor_{io_};
  unsigned short port_ = 0;
  std::thread thread_;
};

}  // namespace rein_test
