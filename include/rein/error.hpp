// rein's error codes, usable as rein::error_code (boost::system or std, see config.hpp).
#pragma once

#include <rein/config.hpp>

#include <string>
#include <type_traits>

namespace rein {

/// Why a waiting operation completed without what it asked for.
///
/// Cancellation is not among them: a cancelled operation completes with `net::error::operation_aborted`,
/// as every Asio operation does.
enum class errc {
  timed_out = 1,         ///< the operation's deadline passed first (or could not be met, judged at once)
  queue_full = 2,        ///< `max_waiters` operations were already waiting: backpressure, nothing was queued
  closed = 3,            ///< the limiter was closed with `close()`
  exceeds_capacity = 4,  ///< the request can never be granted (n larger than the limiter's total capacity)
  /// The dependency behind the limiter is treated as down (an adaptive limiter's open circuit, see
  /// rein::circuit_options): the call was refused at once instead of queueing behind it. Retry later.
  upstream_unavailable = 5,
  /// The waiting line shed the operation: the line had stood for a whole interval of its sojourn rule and
  /// this waiter had queued more than twice its target (see rein::line_options::sojourn, CoDel). The
  /// upstream is overloaded for now; retry later, or elsewhere.
  overloaded = 6,
  /// Refused locally, at once, by client-side adaptive throttling (a rein::admission_throttle stage of a
  /// rein::throttle): the backend has lately refused a share of calls for overload, and this one was not
  /// sent. Retry later.
  admission_refused = 7,
};

namespace detail {

class rein_category final : public error_category {
 public:
  const char* name() const noexcept override { return "rein"; }
  std::string message(int ev) const override {
    switch (static_cast<errc>(ev)) {
      case errc::timed_out: return "operation timed out";
      case errc::queue_full: return "waiting line is full";
      case errc::closed: return "limiter is closed";
      case errc::exceeds_capacity: return "request exceeds the limiter's capacity";
      case errc::upstream_unavailable: return "upstream unavailable: the limiter's circuit is open";
      case errc::overloaded: return "overloaded: the waiting line shed it past its sojourn target";
      case errc::admission_refused: return "refused locally: the backend has been refusing calls for overload";
    }
    return "unknown rein error";
  }
};

}  // namespace detail

/// The error category of rein::errc, named "rein".
inline const error_category& rein_category() noexcept {
  static const detail::rein_category instance;
  return instance;
}

/// Makes an error_code from a rein::errc (found by argument-dependent lookup).
inline error_code make_error_code(errc e) noexcept { return error_code(static_cast<int>(e), rein_category()); }

}  // namespace rein

/// @cond
template <>
struct REIN_SYSTEM_NAMESPACE::is_error_code_enum<rein::errc> : std::true_type {};
/// @endcond
