// The one switch between Boost.Asio and standalone Asio for the rest of include/ (as Tradias/asio-grpc's
// asio_forward.hpp): REIN_ASIO_HEADER(path) names Asio's header `path` in the flavour config.hpp chose, so a
// header writes
//
//   #include <rein/detail/asio_header.hpp>
//
//   #include REIN_ASIO_HEADER(any_io_executor.hpp)  // <boost/asio/any_io_executor.hpp> or <asio/...>
//   #include REIN_ASIO_HEADER(ip/tcp.hpp)
//
// and tests no flavour macro itself. Not API: users include rein's own headers.
//
// Why a computed include, not a few grouped headers (core, timers, ip and ssl) that include the union of what
// their users need: each header keeps its own list and parses exactly what it did with its own #if block. A
// group costs its light members the heavy ones' includes (detail/spawned_operation.hpp needs three small
// headers, throttle.hpp thirteen, among them co_spawn), and its list drifts from what any header uses.
//
// The one hazard: the argument is macro-expanded before it becomes a header name, so no component of a path
// may be a macro where a rein header is included. Those in use are `hpp`, `compose`, the directories `ip` and
// `experimental`, and names of Asio's own classes, functions and namespaces (a user macro of such a name
// breaks Asio itself anyway); none is predefined by g++ 12 or clang 14, in -std=c++20 or -std=gnu++20. GNU
// modes predefine `linux` and `unix`, and Windows headers `near` and `far`: no path may use those.
#pragma once

#include <rein/config.hpp>

#if defined(REIN_STANDALONE_ASIO)
#define REIN_ASIO_HEADER(path) <asio/path>
#else
#define REIN_ASIO_HEADER(path) <boost/asio/path>
#endif
