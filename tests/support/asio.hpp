// The Asio pieces rein's async tests use, for both flavours (Boost.Asio and standalone Asio 1.22+), under
// `net` (= rein::net) and `rein_test`.
#pragma once

#include <rein/config.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/bind_allocator.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#if REIN_ASIO_VERSION >= 102400
#include <asio/as_tuple.hpp>
#else
#include <asio/experimental/as_tuple.hpp>
#endif
#else
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_allocator.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#endif

// ThreadSanitizer does not see libstdc++'s exception reference counts (the library is not instrumented), so
// an exception object created on one thread, read on another and freed on the first looks like a race to
// it. Tests that catch exceptions thrown on another thread (use_future) skip reading them under TSan.
#if defined(__SANITIZE_THREAD__)
#define REIN_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define REIN_TEST_TSAN 1
#endif
#endif
#ifndef REIN_TEST_TSAN
#define REIN_TEST_TSAN 0
#endif

namespace rein_test {

namespace net = rein::net;

// as_tuple left `experimental` in Asio 1.24 (Boost 1.80).
#if defined(REIN_STANDALONE_ASIO) && REIN_ASIO_VERSION < 102400
using net::experimental::as_tuple;
#else
using net::as_tuple;
#endif

/// The `deferred` token rein uses as its default (experimental before Asio 1.24).
inline constexpr rein::default_token_t default_token{};

/// Polls `io` after restarting it: an io_context that ran out of work is stopped, and a plain poll() on a
/// stopped io_context runs nothing. Returns the number of handlers run.
inline std::size_t poll(net::io_context& io) {
  io.restart();
  return io.poll();
}

}  // namespace rein_test
