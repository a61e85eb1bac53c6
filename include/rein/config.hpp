// rein: Boost.Asio or standalone Asio, chosen once here.
//
// Boost.Asio is the default. Define REIN_STANDALONE_ASIO to use standalone Asio (asio.hpp) instead.
// Everything in rein names the library through `rein::net` and its error type through `rein::error_code`,
// so one code base serves both flavours (as Tradias/asio-grpc does).
//
// rein is header-only. A program with many translation units may define REIN_SEPARATE_COMPILATION in all of
// them and include <rein/impl/src.hpp> in exactly one (as Asio's ASIO_SEPARATE_COMPILATION): the waiting
// lines and public classes of `semaphore`, `quota_gate` and `token_bucket` (with `basic_rate_limiter`, the
// token bucket's base) and the `keyed` registries of the three are then compiled in that unit only, and
// the others declare them `extern template`, with the waits that coroutines await on those lines (through
// use_awaitable, bound or not to a cancellation slot, and as deferred operations). The functions that are not
// templates (REIN_DECL, below) are compiled there too, so every unit that uses rein needs that one linked,
// not only those using the three limiters. Other instantiations, member templates with other completion
// tokens, and what the compiler copies in to inline stay in the units that use them. The unit with src.hpp
// must be linked into the same binary (a shared library built with hidden visibility does not export the
// instantiations).
#pragma once

#if defined(REIN_STANDALONE_ASIO)
#include <asio/version.hpp>
// Asio 1.22 enables co_await for clang only with libc++'s <experimental/coroutine>; with libstdc++'s
// <coroutine> it must be told (Boost 1.81's Asio already tests for this).
#if ASIO_VERSION < 102600 && defined(__clang__) && !defined(ASIO_HAS_CO_AWAIT) && !defined(ASIO_DISABLE_CO_AWAIT)
#if (__clang_major__ >= 14) && (__cplusplus >= 202002) && (__cpp_impl_coroutine >= 201902) && __has_include(<coroutine>)
#define ASIO_HAS_CO_AWAIT 1
#endif
#endif
#include <system_error>
#define REIN_ASIO_VERSION ASIO_VERSION
#define REIN_ASIO_NAMESPACE asio
#define REIN_SYSTEM_NAMESPACE std
#else
#include <boost/asio/version.hpp>
#include <boost/system/error_code.hpp>
#include <boost/system/system_error.hpp>
#define REIN_ASIO_VERSION BOOST_ASIO_VERSION
#define REIN_ASIO_NAMESPACE boost::asio
#define REIN_SYSTEM_NAMESPACE boost::system
#endif
// REIN_SYSTEM_NAMESPACE: the namespace of rein::error_code (std or boost::system), where an error enum
// specializes is_error_code_enum.

// Boost.Beast (rein/beast.hpp, rein/beast/server.hpp) works with Boost.Asio only: 1 in that flavour when Beast
// is installed.
#if !defined(REIN_STANDALONE_ASIO) && __has_include(<boost/beast/http/message.hpp>)
#define REIN_HAS_BEAST 1
#else
#define REIN_HAS_BEAST 0
#endif

// Asio 1.26 (Boost 1.81) is the oldest supported Boost.Asio; Debian's standalone 1.22 is the oldest standalone.
#if REIN_ASIO_VERSION < 102200
#error "rein needs Asio 1.22 or newer (Boost 1.81 or newer)"
#endif

// co_await of an async operation (a deferred one) inside net::awaitable<>: Asio 1.26 (Boost 1.81) has it;
// older versions await only awaitables (use_awaitable).
#if REIN_ASIO_VERSION >= 102600
#define REIN_HAS_AWAIT_DEFERRED 1
#else
#define REIN_HAS_AWAIT_DEFERRED 0
#endif

// Keeps a rarely taken path out of a hot caller, so that the caller stays small enough to inline.
#if defined(__GNUC__) || defined(__clang__)
#define REIN_NOINLINE __attribute__((noinline))
#elif defined(_MSC_VER)
#define REIN_NOINLINE __declspec(noinline)
#else
#define REIN_NOINLINE
#endif

// Marks a member of a class template that is defined outside its class. With REIN_SEPARATE_COMPILATION it is
// not inline, so that a unit where its class is declared extern neither instantiates it nor copies it in
// (an extern declaration does not stop the compiler from instantiating an inline member, and clang optimizes
// that copy before discarding it). Header-only builds generate what a definition in the class would: g++
// treats both as inline, clang gives an inlining hint to the keyword only, so it gets none.
#if defined(REIN_SEPARATE_COMPILATION) || defined(__clang__)
#define REIN_SEPARATE_INLINE
#else
#define REIN_SEPARATE_INLINE inline
#endif

// Marks a function that is not a template, declared in a header and defined in rein/impl/*.ipp (as Asio's
// ASIO_DECL): inline and included by its header in header-only builds; with REIN_SEPARATE_COMPILATION
// compiled once, by rein/impl/src.hpp, so that other units neither compile it nor parse what it includes.
#if defined(REIN_SEPARATE_COMPILATION)
#define REIN_DECL
#else
#define REIN_DECL inline
#endif

#if defined(REIN_STANDALONE_ASIO)
#include <asio/async_result.hpp>
#if REIN_ASIO_VERSION >= 102400
#include <asio/deferred.hpp>
#else
#include <asio/experimental/deferred.hpp>
#endif
#define REIN_COMPLETION_TOKEN_FOR(sig) ASIO_COMPLETION_TOKEN_FOR(sig)
#else
#include <boost/asio/async_result.hpp>
#include <boost/asio/deferred.hpp>
#define REIN_COMPLETION_TOKEN_FOR(sig) BOOST_ASIO_COMPLETION_TOKEN_FOR(sig)
#endif

namespace rein {

namespace net = ::REIN_ASIO_NAMESPACE;

/// The completion token rein's `async_*` functions use when none is given: `deferred`, which
/// `co_await` accepts inside `net::awaitable<>` and which can be composed or launched later with any token.
/// (Boost 1.81 has no default completion token of its own; standalone Asio 1.22 keeps `deferred` in
/// `experimental`.)
#if defined(REIN_STANDALONE_ASIO) && REIN_ASIO_VERSION < 102400
using default_token_t = net::experimental::deferred_t;
#else
using default_token_t = net::deferred_t;
#endif

#if defined(REIN_STANDALONE_ASIO)
using error_code = std::error_code;
using error_category = std::error_category;
using system_error = std::system_error;
#else
using error_code = boost::system::error_code;
using error_category = boost::system::error_category;
using system_error = boost::system::system_error;
#endif

}  // namespace rein
