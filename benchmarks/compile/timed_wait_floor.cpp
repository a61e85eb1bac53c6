// Compile-time probe (compile_time.sh): the least Asio a translation unit instantiates when a coroutine
// awaits a timed wait, as any coroutine limiter on Asio must let it: co_spawn, an awaitable coroutine
// awaiting a nested one, a steady_timer wait through use_awaitable, and the io_context that runs them.
// It includes only the headers it needs, as the rein probes do.
#include <rein/config.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#else
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#endif

#include <chrono>

namespace {

namespace net = rein::net;

net::awaitable<int> timed_wait(net::steady_timer& timer) {
  timer.expires_after(std::chrono::milliseconds(1));
  co_await timer.async_wait(net::use_awaitable);
  co_return 1;
}

net::awaitable<void> call() {
  net::steady_timer timer(co_await net::this_coro::executor);
  co_await timed_wait(timer);
}

}  // namespace

int rein_compile_probe_timed_wait_floor() {
  net::io_context io;
  net::co_spawn(io, call(), net::detached);
  return static_cast<int>(io.run());
}
