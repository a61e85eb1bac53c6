// rein::redis's error codes, usable as rein::error_code (boost::system or std, see rein/config.hpp).
#pragma once

#include <rein/config.hpp>

#include <string>
#include <type_traits>

namespace rein::redis {

/// Why a Redis-backed operation completed without what it asked for.
///
/// The limiter's other outcomes are rein's own: rein::errc::timed_out, queue_full, closed, exceeds_capacity,
/// and `net::error::operation_aborted` for cancellation.
enum class errc {
  /// Redis could not be asked: the connection is down (reconnecting with backoff), it was lost before the
  /// reply came, no reply came within `connection_options::request_timeout`, or the server said it cannot
  /// serve now (LOADING, BUSY, MASTERDOWN, READONLY, TRYAGAIN, CLUSTERDOWN, OOM). Nothing was admitted.
  unavailable = 1,
  /// Redis answered with an error that retrying will not cure (for instance WRONGTYPE: the quota's key holds
  /// another type), or with a reply of the wrong shape. Nothing was admitted.
  server_error = 2,
  /// The server sent bytes that are not the Redis protocol (hiredis's reader refused them); the connection
  /// is dropped and reconnected. Requests see this as `unavailable`; it shows in connection snapshots.
  protocol_error = 3,
  /// The server refused the user (ACL): AUTH with a wrong user or password, or a command the user may not
  /// run (a NOPERM reply; e.g. a user without EVALSHA, which every shared limiter runs). Seen at startup
  /// (basic_connection::async_connect); the server's own text is in `connection_snapshot::last_error_message`.
  permission_denied = 4,
};

namespace detail {

class redis_category final : public error_category {
 public:
  const char* name() const noexcept override { return "rein.redis"; }
  std::string message(int ev) const override {
    switch (static_cast<errc>(ev)) {
      case errc::unavailable: return "Redis is unavailable";
      case errc::server_error: return "Redis answered with an error";
      case errc::protocol_error: return "Redis protocol error";
      case errc::permission_denied: return "Redis refused the user (ACL: wrong credentials or a command not allowed)";
    }
    return "unknown rein.redis error";
  }
};

}  // namespace detail

/// The error category of rein::redis::errc, named "rein.redis".
inline const error_category& redis_category() noexcept {
  static const detail::redis_category instance;
  return instance;
}

/// Makes an error_code from a rein::redis::errc (found by argument-dependent lookup).
inline error_code make_error_code(errc e) noexcept { return error_code(static_cast<int>(e), redis_category()); }

}  // namespace rein::redis

/// @cond
template <>
struct REIN_SYSTEM_NAMESPACE::is_error_code_enum<rein::redis::errc> : std::true_type {};
/// @endcond
