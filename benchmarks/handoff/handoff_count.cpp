// The contended handoff of benchmarks/semaphore.cpp (64 coroutines share 4 permits: acquire, co_await post,
// release) for an exact number of iterations, so that an instruction counter (callgrind) can compare the
// idioms without the timing noise of code placement, which moves the contended rows of the timed benchmark
// by up to 15% between builds of the same code. instructions.sh runs it.
//
//   rein_handoff_count <idiom> <iterations> [reactor: 0|1, default 1]
//   idioms: floor, single_thread_semaphore, semaphore, single_thread_semaphore_untimed, semaphore_untimed,
//           channel_async_send, channel_try_send_then_async_send, concurrent_channel_async_send,
//           concurrent_channel_try_send_then_async_send
#include <rein/config.hpp>
#include <rein/permit.hpp>
#include <rein/semaphore.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/channel.hpp>
#include <asio/experimental/concurrent_channel.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#else
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/channel.hpp>
#include <boost/asio/experimental/concurrent_channel.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#endif

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <type_traits>

namespace {

namespace net = rein::net;
using rein::error_code;

constexpr int coroutines = 64;
constexpr std::size_t permits = 4;
long remaining = 0;

bool next() noexcept { return remaining-- > 0; }

net::awaitable<void> post_round_trip() { co_await net::post(net::use_awaitable); }

net::awaitable<void> floor_loop() {
  while (next()) co_await post_round_trip();
}

template <class Sem>
net::awaitable<void> rein_loop(Sem& sem) {
  while (next()) {
    rein::permit p = co_await sem.acquire();
    co_await post_round_trip();
  }
}

// As in benchmarks/semaphore.cpp: Asio 1.22's channel cannot carry void(error_code).
#if defined(REIN_STANDALONE_ASIO) && REIN_ASIO_VERSION < 102600
using channel_signature = void();
#else
using channel_signature = void(error_code);
#endif

template <class Channel, bool TrySendFirst>
class channel_semaphore {
 public:
  channel_semaphore(const net::any_io_executor& ex, std::size_t n) : channel_(ex, n) {}

  net::awaitable<void> acquire() {
    if constexpr (TrySendFirst) {
      if (try_send()) co_return;
    }
    if constexpr (sends_error_code) co_await channel_.async_send(error_code{}, net::use_awaitable);
    else co_await channel_.async_send(net::use_awaitable);
  }

  void release() {
    channel_.try_receive([](auto&&...) {});
  }

 private:
  static constexpr bool sends_error_code = std::is_same_v<channel_signature, void(error_code)>;

  bool try_send() {
    if constexpr (sends_error_code) return channel_.try_send(error_code{});
    else return channel_.try_send();
  }

  Channel channel_;
};

template <class Sem>
net::awaitable<void> channel_loop(Sem& sem) {
  while (next()) {
    co_await sem.acquire();
    co_await post_round_trip();
    sem.release();
  }
}

template <class Sem, class Loop>
void run(net::io_context& io, Sem& sem, Loop loop) {
  for (int i = 0; i < coroutines; ++i) net::co_spawn(io, loop(sem), net::detached);
  io.run();
}

template <class Channel, bool TrySendFirst>
void run_channel(net::io_context& io) {
  channel_semaphore<Channel, TrySendFirst> sem(io.get_executor(), permits);
  run(io, sem, [](auto& s) { return channel_loop(s); });
}

template <class Sem>
void run_rein(net::io_context& io, bool measure_wait) {
  Sem sem(io.get_executor(), permits, {.measure_wait = measure_wait});
  run(io, sem, [](auto& s) { return rein_loop(s); });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <idiom> <iterations> [reactor 0|1]\n", argv[0]);
    return 2;
  }
  const std::string idiom = argv[1];
  remaining = std::atol(argv[2]);
  net::io_context io;
  std::optional<net::steady_timer> reactor;  // a timer starts the io_context's reactor
  if (argc < 4 || std::atoi(argv[3]) != 0) reactor.emplace(io);
  using channel = net::experimental::channel<channel_signature>;
  using concurrent_channel = net::experimental::concurrent_channel<channel_signature>;
  if (idiom == "floor") {
    for (int i = 0; i < coroutines; ++i) net::co_spawn(io, floor_loop(), net::detached);
    io.run();
  } else if (idiom == "single_thread_semaphore") {
    run_rein<rein::single_thread_semaphore>(io, true);
  } else if (idiom == "semaphore") {
    run_rein<rein::semaphore>(io, true);
  } else if (idiom == "single_thread_semaphore_untimed") {
    run_rein<rein::single_thread_semaphore>(io, false);
  } else if (idiom == "semaphore_untimed") {
    run_rein<rein::semaphore>(io, false);
  } else if (idiom == "channel_async_send") {
    run_channel<channel, false>(io);
  } else if (idiom == "channel_try_send_then_async_send") {
    run_channel<channel, true>(io);
  } else if (idiom == "concurrent_channel_async_send") {
    run_channel<concurrent_channel, false>(io);
  } else if (idiom == "concurrent_channel_try_send_then_async_send") {
    run_channel<concurrent_channel, true>(io);
  } else {
    std::fprintf(stderr, "unknown idiom: %s\n", idiom.c_str());
    return 2;
  }
  return remaining < 0 ? 0 : 1;  // every iteration ran
}
