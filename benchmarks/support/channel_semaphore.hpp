// Asio's experimental channel used as a semaphore, the idiom rein's semaphore is compared with (the timed
// benchmark, benchmarks/semaphore.cpp, and the instruction counter, benchmarks/handoff/handoff_count.cpp).
#pragma once

#include <rein/config.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/experimental/channel.hpp>
#include <asio/experimental/concurrent_channel.hpp>
#include <asio/use_awaitable.hpp>
#else
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/experimental/channel.hpp>
#include <boost/asio/experimental/concurrent_channel.hpp>
#include <boost/asio/use_awaitable.hpp>
#endif

#include <cstddef>
#include <type_traits>

namespace rein_bench {

namespace net = rein::net;

// The channel's signature. Standalone Asio 1.22's channel_traits has two equally good partial
// specializations for void(error_code) (R(error_code, Args...) and R(T)), so that flavour sends nothing.
#if defined(REIN_STANDALONE_ASIO) && REIN_ASIO_VERSION < 102600
using channel_signature = void();
#else
using channel_signature = void(rein::error_code);
#endif

using channel = net::experimental::channel<channel_signature>;
using concurrent_channel = net::experimental::concurrent_channel<channel_signature>;

/// An experimental channel used as a semaphore: `permits` buffer slots; a sent value holds a slot.
/// `TrySendFirst` tries a synchronous send before co_awaiting async_send.
template <class Channel, bool TrySendFirst>
class channel_semaphore {
 public:
  channel_semaphore(const net::any_io_executor& ex, std::size_t permits) : channel_(ex, permits) {}

  net::awaitable<void> acquire() {
    if constexpr (TrySendFirst) {
      if (try_send()) co_return;
    }
    co_await async_send();
  }

  void release() {
    channel_.try_receive([](auto&&...) {});
  }

  /// Fails every parked acquire (they throw), for tear-down. (close() alone leaves parked senders parked.)
  void close() {
    channel_.cancel();
    channel_.close();
  }

 private:
  static constexpr bool sends_error_code = std::is_same_v<channel_signature, void(rein::error_code)>;

  bool try_send() {
    if constexpr (sends_error_code) return channel_.try_send(rein::error_code{});
    else return channel_.try_send();
  }

  auto async_send() {
    if constexpr (sends_error_code) return channel_.async_send(rein::error_code{}, net::use_awaitable);
    else return channel_.async_send(net::use_awaitable);
  }

  Channel channel_;
};

}  // namespace rein_bench
