// Compile-time probe (compile_time.sh): the four stages of throttle4.cpp as a user would write them with
// Asio alone, thread-safe as rein's defaults are: a per-host pause (a map of instants and a timer wait), a
// per-host and a global concurrency limit (concurrent channels used as semaphores, as channel_idiom.cpp),
// and a per-host token bucket (a map of buckets and a timer wait for the next token). It has none of what
// the rein stages add (deadlines, cancellation of a waiter, a waiting order, statistics): it is the least
// the same work costs with Asio's own types, not an equivalent.
#include "../support/channel_semaphore.hpp"

#include <rein/config.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#else
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace {

namespace net = rein::net;
using clock_type = std::chrono::steady_clock;
using permits = rein_bench::channel_semaphore<rein_bench::concurrent_channel, true>;

struct bucket {
  double tokens = 5;  // burst 5
  clock_type::time_point last = clock_type::now();
};

class idiom_throttle {
 public:
  explicit idiom_throttle(const net::any_io_executor& ex) : ex_(ex), global_(ex, 16) {}

  net::awaitable<void> acquire(const std::string& host) {
    net::steady_timer timer(ex_);
    if (auto until = paused_until(host); until > clock_type::now()) {
      timer.expires_at(until);
      co_await timer.async_wait(net::use_awaitable);
    }
    co_await per_host(host).acquire();
    co_await global_.acquire();
    for (auto wait = take_token(host); wait != clock_type::duration::zero(); wait = take_token(host)) {
      timer.expires_after(wait);
      co_await timer.async_wait(net::use_awaitable);
    }
  }

  void release(const std::string& host) {
    global_.release();
    per_host(host).release();
  }

 private:
  clock_type::time_point paused_until(const std::string& host) {
    std::lock_guard lock(mutex_);
    return paused_until_[host];
  }

  permits& per_host(const std::string& host) {
    std::lock_guard lock(mutex_);
    auto& p = per_host_[host];
    if (!p) p = std::make_unique<permits>(ex_, 4);
    return *p;
  }

  // Zero when a token was taken, else how long until the next one (40 per second).
  clock_type::duration take_token(const std::string& host) {
    std::lock_guard lock(mutex_);
    auto& b = rate_[host];
    const auto now = clock_type::now();
    b.tokens = std::min(5.0, b.tokens + 40 * std::chrono::duration<double>(now - b.last).count());
    b.last = now;
    if (b.tokens >= 1) {
      b.tokens -= 1;
      return clock_type::duration::zero();
    }
    return std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>((1 - b.tokens) / 40));
  }

  net::any_io_executor ex_;
  std::mutex mutex_;
  std::unordered_map<std::string, clock_type::time_point> paused_until_;
  std::unordered_map<std::string, std::unique_ptr<permits>> per_host_;
  permits global_;
  std::unordered_map<std::string, bucket> rate_;
};

net::awaitable<void> call(idiom_throttle& throttle, std::string host) {
  co_await throttle.acquire(host);
  throttle.release(host);
}

}  // namespace

int rein_compile_probe_throttle4_idiom() {
  net::io_context io;
  idiom_throttle throttle(io.get_executor());
  net::co_spawn(io, call(throttle, "example.com"), net::detached);
  return static_cast<int>(io.run());
}
