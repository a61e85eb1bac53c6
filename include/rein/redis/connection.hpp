// A pipelined connection to one Redis server: Asio moves the bytes, hiredis encodes and parses them.
#pragma once

#include <rein/redis/connection_options.hpp>
#include <rein/redis/detail/connection_core.hpp>

#include <rein/algo/backoff.hpp>
#include <rein/config.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/error.hpp>
#include <rein/redis/error.hpp>
#include <rein/redis/reply.hpp>

#include <hiredis/hiredis.h>

#include REIN_ASIO_HEADER(any_io_executor.hpp)
#include REIN_ASIO_HEADER(associated_executor.hpp)
#include REIN_ASIO_HEADER(async_result.hpp)
#include REIN_ASIO_HEADER(basic_stream_socket.hpp)
#include REIN_ASIO_HEADER(basic_waitable_timer.hpp)
#include REIN_ASIO_HEADER(bind_executor.hpp)
#include REIN_ASIO_HEADER(buffer.hpp)
#include REIN_ASIO_HEADER(connect.hpp)
#include REIN_ASIO_HEADER(error.hpp)
#include REIN_ASIO_HEADER(execution_context.hpp)
#include REIN_ASIO_HEADER(ip/address.hpp)
#include REIN_ASIO_HEADER(ip/basic_resolver.hpp)
#include REIN_ASIO_HEADER(ip/tcp.hpp)
#include REIN_ASIO_HEADER(post.hpp)
#include REIN_ASIO_HEADER(strand.hpp)
#include REIN_ASIO_HEADER(wait_traits.hpp)
#include REIN_ASIO_HEADER(write.hpp)
#if defined(REIN_REDIS_TLS)
#include REIN_ASIO_HEADER(ssl/context.hpp)
#include REIN_ASIO_HEADER(ssl/error.hpp)
#include REIN_ASIO_HEADER(ssl/stream.hpp)

#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>

#include <filesystem>
#include <system_error>
#endif

#include <algorithm>
#include <array>
#include <charconv>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace rein::redis {

/// A pipelined connection to one Redis server, for the Redis-backed limiters and for plain commands.
///
/// Commands from any number of callers share one TCP connection and are written back to back without
/// waiting for replies (pipelining); replies are matched to commands in order, as Redis answers in order.
/// hiredis encodes the commands (`redisFormatCommandArgv`) and parses the replies (its reader, fed the bytes
/// Asio reads); rein implements no part of the protocol.
///
/// Failures: the first command connects. A lost connection, a failed attempt, or a server silent for
/// `request_timeout` fails every pending command with errc::unavailable, and reconnection starts after a
/// jittered exponential backoff (`reconnect_base`, `reconnect_cap`), on its own, until it succeeds or the
/// connection is closed. While it backs off, commands fail at once with errc::unavailable rather than wait.
/// Commands issued while a connection attempt is in progress wait for it (at most `connect_timeout`).
///
/// Circuit: a timeout (a request unanswered for `request_timeout`, or an attempt longer than
/// `connect_timeout`) opens the circuit: from then on commands fail at once with errc::unavailable and
/// `connected()` is false, whatever the TCP state, until a probe is answered. Each connection made while it
/// is open sends only its handshake and one PING; the first reply on it closes the circuit. So a hung
/// server (stopped, whose kernel still accepts connections) costs callers one `request_timeout` in all, not
/// one per reconnection: at most `request_timeout` after the oldest pending command was sent, every command
/// fails and later ones are refused without waiting. A server that answers again is used again at most
/// `reconnect_cap + connect_timeout` and one round trip after it resumed (a probe pending then is answered
/// at once; otherwise the next attempt sends one).
///
/// TLS (`connection_options::tls`, with rein::redis_tls): every connection, reconnections included, makes a
/// new TLS session (handshake within `connect_timeout`) and verifies the server's certificate unless told
/// not to; a failure is a failed attempt, never a plaintext one. `async_connect` reports it at startup.
///
/// @par Thread Safety
/// Every member function may be called concurrently, except destruction. Socket work runs on a strand.
///
/// @par Lifetime
/// Not copyable or movable. Destroying it closes it: pending commands complete with operation_aborted.
/// Limiters using it keep its machinery alive but see it as closed (errc::unavailable) once it is destroyed.
/// It must be destroyed before its execution context.
template <class Executor = net::any_io_executor>
class basic_connection {
 public:
  /// The executor that runs completion handlers without an associated executor of their own.
  using executor_type = Executor;
  /// The waiter core (an implementation type).
  using core_type = detail::connection_core<Executor>;

  /// The connection type when rebound to another executor.
  template <class OtherExecutor>
  struct rebind_executor {
    /// The same limiter type on `OtherExecutor`.
    using other = basic_connection<OtherExecutor>;
  };

  /// A connection on `ex`; nothing happens on the network until the first command.
  /// @throws std::invalid_argument naming the field and value if an option is out of range.
  explicit basic_connection(const executor_type& ex, connection_options options = {})
      : core_(std::make_shared<core_type>(ex, std::move(options))) {}

  /// A connection whose handlers run on `context`'s executor by default.
  template <class ExecutionContext>
    requires std::is_convertible_v<ExecutionContext&, net::execution_context&>
  explicit basic_connection(ExecutionContext& context, connection_options options = {})
      : basic_connection(context.get_executor(), std::move(options)) {}

  basic_connection(const basic_connection&) = delete;
  basic_connection& operator=(const basic_connection&) = delete;

  ~basic_connection() { core_->close(); }

  /// The executor given at construction.
  executor_type get_executor() const noexcept { return core_->get_executor(); }

  /// True while a connection is established and its circuit closed (commands are sent, not refused).
  bool connected() const noexcept { return core_->connected(); }

  /// Closes for good; pending commands complete with operation_aborted. Idempotent.
  void close() { core_->close(); }

  /// The connection's counters, copied under its lock.
  connection_snapshot snapshot() const { return core_->snapshot(); }

  /// The options in force (as validated at construction).
  const connection_options& get_options() const noexcept { return core_->get_options(); }

  /// Sends one command, pipelined with everyone else's, and completes with its reply.
  ///
  /// @param args  the command and its arguments, each sent as is (binary-safe), e.g. {"GET", key}.
  /// @param token completion token; signature `void(error_code, rein::redis::reply)`. Default: `deferred`.
  ///
  /// An error *reply* from Redis is a successful completion whose reply has `kind::error`. Errors:
  /// errc::unavailable (not connected, the connection failed before the reply, or it was closed before the
  /// call), `operation_aborted` (closed while the command was pending). The handler runs on its associated
  /// executor, never inside this function.
  ///
  /// GCC 12 rejects a braced list of arguments directly inside a `co_await` expression ("array used as
  /// initializer"); there, name the arguments first (`std::array<std::string_view, 2> get{"GET", key};`).
  ///
  /// @par Per-Operation Cancellation
  /// None: a command on the wire cannot be taken back.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, reply)) Token = default_token_t>
  auto async_execute(std::span<const std::string_view> args, Token&& token = Token{}) {
    return net::async_initiate<Token, void(error_code, reply)>(initiate_execute{core_}, token,
                                                               encode_command(args));
  }

  /// As above, for a braced list of arguments: `async_execute({"GET", key}, token)`.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, reply)) Token = default_token_t>
  auto async_execute(std::initializer_list<std::string_view> args, Token&& token = Token{}) {
    return async_execute(std::span<const std::string_view>(args.begin(), args.size()), std::forward<Token>(token));
  }

  /// Connects now (if not yet) and completes once the server has answered the connection's handshake
  /// (TLS, AUTH, SELECT) and its startup commands (each limiter's SCRIPT LOAD, and for them a check that
  /// the user may run EVALSHA): a start-up check, so that a misconfiguration fails at start, clearly, and
  /// not at the first acquire. Limiters constructed on this connection before the call are included.
  ///
  /// @param token completion token; signature `void(error_code)`. Default: `deferred`.
  ///
  /// Errors (`snapshot().last_error_message` gives the details, naming the server and the command):
  /// - a server certificate refused (wrong CA, expired, issued for another name): a code of
  ///   tls_verify_category(); other handshake failures: Asio's SSL error codes. A server that requires a
  ///   client certificate and got none closes the connection after the handshake (TLS 1.3): the read's
  ///   error (e.g. connection reset), with a message saying so. A server that does not speak TLS usually
  ///   leaves the handshake to time out (`net::error::timed_out`). There is never a plaintext fallback.
  /// - errc::permission_denied: AUTH refused, or a startup command or EVALSHA refused by the user's ACL;
  ///   errc::server_error: a startup command refused otherwise.
  /// - the cause of a failed attempt (connection refused, `net::error::timed_out` after `connect_timeout`),
  ///   or errc::unavailable if the connection is backing off or its circuit is open (see above);
  ///   `operation_aborted` if it is closed meanwhile.
  /// The connection itself keeps trying to reconnect after a failure, as for any failure.
  ///
  /// @par Thread Safety
  /// May be called from any thread, concurrently with every other member but destruction.
  ///
  /// @par Per-Operation Cancellation
  /// None.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code)) Token = default_token_t>
  auto async_connect(Token&& token = Token{}) {
    return net::async_initiate<Token, void(error_code)>(initiate_connect{core_}, token);
  }

  /// The shared machinery, for limiters built on this connection. Not API.
  const std::shared_ptr<core_type>& core() const noexcept { return core_; }

 private:
  struct initiate_connect {
    std::shared_ptr<core_type> core;
    using executor_type = Executor;
    executor_type get_executor() const noexcept { return core->get_executor(); }

    template <class Handler>
    void operator()(Handler&& handler) const {
      using node_type = detail::ready_node<std::decay_t<Handler>, Executor, core_type>;
      auto node = std::make_unique<node_type>(std::forward<Handler>(handler), core->get_executor(), core);
      if (core->submit(encode_command({"PING"}), node.get())) {
        node.release();
        return;
      }
      node.release()->complete(errc::unavailable, nullptr);
    }
  };

  struct initiate_execute {
    std::shared_ptr<core_type> core;  // a deferred operation may be launched after the object is gone
    using executor_type = Executor;
    executor_type get_executor() const noexcept { return core->get_executor(); }

    template <class Handler>
    void operator()(Handler&& handler, const std::string& command) const {
      detail::start_execute(std::forward<Handler>(handler), core->get_executor(),
                            [&](detail::request_node* node) { return core->submit(command, node); });
    }
  };

  std::shared_ptr<core_type> core_;
};

/// A connection on any I/O executor.
using connection = basic_connection<>;

}  // namespace rein::redis
