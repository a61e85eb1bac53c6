// Runs one asynchronous operation with each completion token a user may pass, delivering its outcome to one
// checked handler, so a test written once covers the whole matrix (the idea is Beast's; see STYLE.md).
//
//   for (auto kind : rein_test::poll_tokens) {
//     DYNAMIC_SECTION(rein_test::name(kind)) {
//       auto [handler, done] = rein_test::checked_acquire();
//       rein_test::launch(kind, io, [&](auto&& token) { return sem.async_acquire(1, std::move(token)); },
//                         std::move(handler));
//       rein_test::poll(io);
//       CHECK(done->ec() == rein::error_code());
//     }
//   }
//
// The operation must complete with `void(error_code, Values...)`, zero or one value. Coroutine kinds start
// it from a coroutine spawned on `io`, so it starts on the next poll; `callback` starts it at once.
// `use_future` needs the io_context running on another thread and is exercised separately.
#pragma once

#include "support/asio.hpp"
#include "support/checked_handler.hpp"

#include <rein/config.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/this_coro.hpp>
#else
#include <boost/asio/this_coro.hpp>
#endif

#include <array>
#include <exception>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

namespace rein_test {

enum class token_kind {
  callback,        ///< a plain function object
  use_awaitable,   ///< `co_await op(use_awaitable)`, errors thrown as system_error
  deferred,        ///< the default token: `co_await op()` (Asio 1.26+), else `op()(use_awaitable)`
  as_tuple,        ///< `co_await op(as_tuple(use_awaitable))`
  redirect_error,  ///< `co_await op(redirect_error(use_awaitable, ec))`
};

/// Every kind that an io_context stepped with poll() can drive.
inline constexpr std::array<token_kind, 5> poll_tokens{token_kind::callback, token_kind::use_awaitable,
                                                       token_kind::deferred, token_kind::as_tuple,
                                                       token_kind::redirect_error};

constexpr std::string_view name(token_kind k) noexcept {
  switch (k) {
    case token_kind::callback: return "callback";
    case token_kind::use_awaitable: return "use_awaitable";
    case token_kind::deferred: return "deferred";
    case token_kind::as_tuple: return "as_tuple";
    case token_kind::redirect_error: return "redirect_error";
  }
  return "?";
}

namespace detail {

// co_await the operation launched with `token`, then hand (ec, value...) to the handler.
template <class... Values, class Initiate>
net::awaitable<void> await_with(token_kind kind, Initiate initiate, checked_handler<rein::error_code, Values...> handler,
                                bool all_cancellation_types) {
  static_assert(sizeof...(Values) <= 1, "the token matrix handles void(error_code) and void(error_code, T)");
  // A coroutine passes only terminal cancellation to the operation it awaits unless told otherwise.
  if (all_cancellation_types) co_await net::this_coro::reset_cancellation_state(net::enable_total_cancellation());
  if (kind == token_kind::as_tuple) {
    auto result = co_await initiate(as_tuple(net::use_awaitable));
    std::apply([&](auto&&... a) { handler(std::move(a)...); }, std::move(result));
    co_return;
  }
  if (kind == token_kind::redirect_error) {
    rein::error_code ec;
    if constexpr (sizeof...(Values) == 0) {
      co_await initiate(net::redirect_error(net::use_awaitable, ec));
      handler(ec);
    } else {
      auto value = co_await initiate(net::redirect_error(net::use_awaitable, ec));
      handler(ec, std::move(value));
    }
    co_return;
  }
  rein::error_code error;
  try {
    if constexpr (sizeof...(Values) == 0) {
      if (kind == token_kind::deferred) {
#if REIN_ASIO_VERSION >= 102600
        co_await initiate(default_token);
#else
        co_await initiate(default_token)(net::use_awaitable);
#endif
      } else {
        co_await initiate(net::use_awaitable);
      }
      handler(rein::error_code());
    } else {
      if (kind == token_kind::deferred) {
#if REIN_ASIO_VERSION >= 102600
        auto value = co_await initiate(default_token);
#else
        auto value = co_await initiate(default_token)(net::use_awaitable);
#endif
        handler(rein::error_code(), std::move(value));
      } else {
        auto value = co_await initiate(net::use_awaitable);
        handler(rein::error_code(), std::move(value));
      }
    }
    co_return;
  } catch (const rein::system_error& e) {
    error = e.code();
  }
  if constexpr (sizeof...(Values) == 0) handler(error);
  else handler(error, {});
}

}  // namespace detail

/// Starts `initiate(token)` with the token of kind `kind`; the outcome, whatever the token, reaches `handler`
/// exactly once (or the handler is destroyed uncalled, which fails the test unless the record allows it).
///
/// If `slot` is connected, cancellation emitted there reaches the operation: bound to the callback, or, for
/// coroutine kinds, to the spawned coroutine, which lets terminal, partial and total cancellation through.
template <class... Values, class Initiate>
void launch(token_kind kind, net::io_context& io, Initiate initiate, checked_handler<rein::error_code, Values...> handler,
            net::cancellation_slot slot = {}) {
  if (kind == token_kind::callback) {
    if (slot.is_connected()) initiate(net::bind_cancellation_slot(slot, std::move(handler)));
    else initiate(std::move(handler));
    return;
  }
  auto coroutine = detail::await_with<Values...>(kind, std::move(initiate), std::move(handler), slot.is_connected());
  if (slot.is_connected()) net::co_spawn(io, std::move(coroutine), net::bind_cancellation_slot(slot, net::detached));
  else net::co_spawn(io, std::move(coroutine), net::detached);
}

}  // namespace rein_test
