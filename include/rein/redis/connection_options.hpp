// The options and snapshot of rein::redis::connection: where and how to connect, and what the connection
// reports.
#pragma once

#include <rein/config.hpp>
#include <rein/error.hpp>

#if defined(REIN_REDIS_TLS)
#include <openssl/x509_vfy.h>
#endif

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace rein::redis {

/// TLS to the server (Asio's ssl::stream over OpenSSL). Needs rein built with TLS: the CMake target
/// rein::redis_tls (it defines REIN_REDIS_TLS for every file of the program and links OpenSSL::SSL);
/// without it, `enabled = true` is refused at construction. With TLS on there is no plaintext fallback:
/// a handshake or certificate failure fails the connection attempt (see basic_connection::async_connect).
struct tls_options {
  bool enabled = false;  ///< TLS on every connection; when false, the file and name fields must be empty
  /// Check the server's certificate: its chain up to a trusted CA, its dates, and its name against
  /// `server_name` (a DNS name or an IP address, RFC 6125). Turn off only for tests.
  bool verify_peer = true;
  std::string ca_file;       ///< PEM file of trusted CAs; with `ca_directory` empty too: the system's CAs
  std::string ca_directory;  ///< directory of hashed CA certificates (`openssl rehash`)
  std::string certificate_file;  ///< client certificate chain (PEM), for servers that ask for one
  std::string private_key_file;  ///< its private key (PEM, unencrypted); set both or neither
  /// The name sent as SNI (not when it is an IP address, RFC 6066) and checked against the certificate.
  /// Empty: `connection_options::host` (for a Cluster: each node's address, or this name for every node).
  std::string server_name;
};

#if defined(REIN_REDIS_TLS)
namespace detail {
class tls_verify_category_impl final : public error_category {
 public:
  const char* name() const noexcept override { return "rein.redis.tls"; }
  std::string message(int ev) const override {
    return std::string("the server's TLS certificate was refused: ") + ::X509_verify_cert_error_string(ev);
  }
};
}  // namespace detail

/// The category of a server certificate that failed verification: the value is OpenSSL's `X509_V_ERR_*`
/// code (e.g. X509_V_ERR_CERT_HAS_EXPIRED, X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH,
/// X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY), the message OpenSSL's text for it. Other TLS failures
/// (no certificate sent when the server requires one, a server that does not speak TLS) keep Asio's SSL
/// error codes.
inline const error_category& tls_verify_category() noexcept {
  static const detail::tls_verify_category_impl instance;
  return instance;
}
#endif

/// Where and how to connect. Write with designated initializers: `{.host = "10.0.0.7", .port = 6380}`.
struct connection_options {
  std::string host = "127.0.0.1";  ///< name or address, resolved at every connection attempt
  /// TCP port.
  std::uint16_t port = 6379;
  std::string username;  ///< with `password`: `AUTH username password` (Redis 6 ACL users)
  std::string password;  ///< when not empty, AUTH is the first command on every connection
  int database = 0;      ///< when not 0, SELECT follows AUTH on every connection
  /// A connection attempt (resolve + TCP connect) that takes longer fails. Must be > 0.
  std::chrono::milliseconds connect_timeout{1000};
  /// The oldest request still unanswered after this long means the server is gone (stopped, partitioned):
  /// the connection is dropped, every pending request fails with errc::unavailable, and it reconnects. It
  /// bounds how long anything can wait on Redis. A timeout also opens the circuit (see basic_connection):
  /// commands are refused at once until a probe is answered. Must be > 0.
  std::chrono::milliseconds request_timeout{1000};
  /// Reconnection delays: exponential backoff with full jitter (rein::algo::backoff): after the k-th failed
  /// attempt in a row, a uniform draw from [0, min(reconnect_cap, reconnect_base * 2^(k-1))).
  /// base must be > 0, cap >= base.
  std::chrono::milliseconds reconnect_base{25};
  /// The largest reconnection delay; >= reconnect_base.
  std::chrono::milliseconds reconnect_cap{1000};
  /// TLS; off by default.
  tls_options tls{};
};

/// A connection's counters, copied under its lock.
struct connection_snapshot {
  bool connected = false;                ///< a TCP connection is up and being used
  std::uint64_t connects = 0;            ///< connections established (the first included)
  std::uint64_t connect_failures = 0;    ///< attempts that failed (refused, timed out, handshake error)
  std::uint64_t disconnects = 0;         ///< established connections lost (error, EOF, request_timeout)
  std::uint64_t requests = 0;            ///< commands accepted by submit (handshake commands included)
  std::uint64_t replies = 0;             ///< replies received
  std::uint64_t failed_requests = 0;     ///< commands failed because the connection failed or closed
  std::uint64_t startup_errors = 0;      ///< error replies to startup commands (e.g. a SCRIPT LOAD refused)
  /// True while the circuit is open: a request or connection attempt timed out and no reply came since;
  /// commands are refused at once, and each new connection sends a probe (PING) to close it.
  bool circuit_open = false;
  std::uint64_t circuit_opens = 0;       ///< times the circuit opened (a timeout while it was closed)
  std::uint64_t probes = 0;              ///< probes sent while the circuit was open
  std::size_t pending = 0;               ///< accepted, not answered yet
  std::chrono::nanoseconds round_trip_last{0};   ///< submit to reply, last reply
  std::chrono::nanoseconds round_trip_total{0};  ///< summed over replies (mean = total / replies)
  /// The longest round trip so far.
  std::chrono::nanoseconds round_trip_max{0};
  error_code last_error{};  ///< why the last connection or attempt failed
  /// Details of the last failure or refusal, e.g. "TLS handshake with 127.0.0.1:6380 failed: certificate
  /// has expired" or "EVALSHA (permission check) refused: NOPERM ...". Empty if none.
  std::string last_error_message;
};

}  // namespace rein::redis
