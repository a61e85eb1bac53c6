// Compile-time probe (compile_time.sh): the Asio idiom a user would write instead of semaphore.cpp, a
// coroutine awaiting one slot of a concurrent channel used as a semaphore (the same idiom the timed
// benchmarks compare rein's semaphore with, benchmarks/support/channel_semaphore.hpp).
#include "../support/channel_semaphore.hpp"

#include <rein/config.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#else
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#endif

namespace {

namespace net = rein::net;
using permits = rein_bench::channel_semaphore<rein_bench::concurrent_channel, true>;

net::awaitable<void> call(permits& sem) {
  co_await sem.acquire();
  sem.release();
}

}  // namespace

int rein_compile_probe_channel_idiom() {
  net::io_context io;
  permits sem(io.get_executor(), 4);
  net::co_spawn(io, call(sem), net::detached);
  return static_cast<int>(io.run());
}
