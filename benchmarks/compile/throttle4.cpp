// Compile-time probe (compile_time.sh): a translation unit that uses a four-stage throttle from a coroutine
// (a keyed quota gate, a keyed semaphore, a global semaphore and a keyed token bucket), including only the
// headers it needs.
#include <rein/config.hpp>
#include <rein/keyed.hpp>
#include <rein/quota_gate.hpp>
#include <rein/semaphore.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#else
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#endif

#include <cstddef>
#include <string>

namespace {

namespace net = rein::net;

template <class Throttle>
net::awaitable<void> call(Throttle& throttle, std::string host) {
  auto guard = co_await throttle.acquire(host);
  guard.complete(rein::outcome::success);
}

}  // namespace

int rein_compile_probe_throttle4() {
  net::io_context io;
  rein::keyed<rein::quota_gate> gates(io, {});
  rein::keyed<rein::semaphore> per_host(io, 4);
  rein::semaphore global(io, 16);
  rein::keyed<rein::token_bucket> rate(io, {.rate = 40, .capacity = 5});
  rein::throttle throttle(gates, per_host, global, rate);
  net::co_spawn(io, call(throttle, "example.com"), net::detached);
  return static_cast<int>(io.run());
}
