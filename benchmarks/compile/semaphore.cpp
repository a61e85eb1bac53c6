// Compile-time probe (compile_time.sh): a translation unit that awaits one rein::semaphore from a coroutine,
// including only the headers it needs.
#include <rein/config.hpp>
#include <rein/permit.hpp>
#include <rein/semaphore.hpp>

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

net::awaitable<void> call(rein::semaphore& sem) {
  rein::permit p = co_await sem.acquire();
}

}  // namespace

int rein_compile_probe_semaphore() {
  net::io_context io;
  rein::semaphore sem(io, 4);
  net::co_spawn(io, call(sem), net::detached);
  return static_cast<int>(io.run());
}
