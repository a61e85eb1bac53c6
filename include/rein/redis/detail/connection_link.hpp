// The parts of rein::redis::connection below its core: the request list, the link the limiters send through,
// the address source, and the helpers that validate options, name commands and make a TLS context. Not API.
#pragma once

#include <rein/redis/connection_options.hpp>

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

namespace rein::redis::detail {

// rein::detail's names are spelled out below: inside rein::redis::detail, `detail::` means this namespace.

/// One command waiting for its reply. The connection never owns or frees a node: it calls `complete`
/// exactly once and forgets it, and `complete` may delete the node.
class request_node {
 public:
  request_node() = default;
  request_node(const request_node&) = delete;
  request_node& operator=(const request_node&) = delete;

  /// The reply (`ec` clear, `reply` non-null; valid only during the call), or why there is none (`reply`
  /// null): errc::unavailable if the connection failed first, `operation_aborted` if it was closed. Never
  /// called under the connection's lock or from inside `submit`; normally on the connection's strand, and
  /// from `close()` on the caller's thread.
  virtual void complete(const error_code& ec, const ::redisReply* reply) noexcept = 0;

 protected:
  ~request_node() = default;

 private:
  template <class>
  friend class connection_core;
  friend class request_list;
  request_node* next_ = nullptr;
  std::chrono::steady_clock::time_point submitted_{};
};

/// FIFO of nodes through request_node::next_. Allocates nothing.
class request_list {
 public:
  request_list() = default;
  request_list(request_list&& other) noexcept
      : head_(std::exchange(other.head_, nullptr)), tail_(std::exchange(other.tail_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  request_list& operator=(request_list&& other) noexcept {
    std::swap(head_, other.head_);
    std::swap(tail_, other.tail_);
    std::swap(size_, other.size_);
    return *this;
  }

  bool empty() const noexcept { return head_ == nullptr; }
  std::size_t size() const noexcept { return size_; }
  request_node* front() const noexcept { return head_; }

  void push_back(request_node* n) noexcept {
    n->next_ = nullptr;
    if (tail_ != nullptr) tail_->next_ = n;
    else head_ = n;
    tail_ = n;
    ++size_;
  }

  request_node* pop_front() noexcept {
    request_node* n = head_;
    if (n == nullptr) return nullptr;
    head_ = n->next_;
    if (head_ == nullptr) tail_ = nullptr;
    n->next_ = nullptr;
    --size_;
    return n;
  }

  /// Moves all of `front` before this list's nodes.
  void splice_front(request_list& front) noexcept {
    if (front.empty()) return;
    front.tail_->next_ = head_;
    if (tail_ == nullptr) tail_ = front.tail_;
    head_ = front.head_;
    size_ += front.size_;
    front.head_ = front.tail_ = nullptr;
    front.size_ = 0;
  }

  /// Completes every node in order with `ec` (no reply). Call without holding any lock.
  void fail_all(const error_code& ec) noexcept {
    while (request_node* n = pop_front()) n->complete(ec, nullptr);
  }

 private:
  request_node* head_ = nullptr;
  request_node* tail_ = nullptr;
  std::size_t size_ = 0;
};

/// Where a limiter's commands go: one connection, or the node of a Redis Cluster that serves the limiter's
/// hash slot. The limiters' transport talks only to this.
class command_link {
 public:
  command_link() = default;
  command_link(const command_link&) = delete;
  command_link& operator=(const command_link&) = delete;

  /// Queues one encoded command; `node` is completed with its reply. False, leaving `node` untouched, when
  /// the command cannot be sent now (the connection is backing off or closed).
  virtual bool submit(std::string_view command, request_node* node) = 0;
  /// A command sent first on every connection this link uses, present and future (e.g. SCRIPT LOAD).
  virtual void add_startup_command(std::string command) = 0;
  /// Whether commands can be sent now; may start a connection (or a cluster's slot map refresh) as a side
  /// effect, so that a later call can say yes.
  virtual bool connected() noexcept = 0;
  /// The counters of the connection the link uses now.
  virtual connection_snapshot snapshot() const = 0;

 protected:
  ~command_link() = default;
};

/// Where a connection goes when its address is not fixed (Redis Sentinel): asked anew before every
/// connection attempt, the first included. Not API; rein::redis::basic_sentinel implements it.
class address_source {
 public:
  /// The answer: clear `ec` and the address to connect to, or why there is none (the attempt then fails
  /// as a refused connection would: backoff, then ask again).
  using done_type = std::function<void(const error_code& ec, const std::string& host, std::uint16_t port)>;

  address_source() = default;
  address_source(const address_source&) = delete;
  address_source& operator=(const address_source&) = delete;

  /// Finds the address and calls `done` exactly once, from any thread, possibly inside this call. Must
  /// answer in bounded time: the connection arms its connect_timeout only once it has the address.
  virtual void async_address(done_type done) = 0;

 protected:
  ~address_source() = default;
};

inline connection_options validated(connection_options o) {
  const auto fail = [](const std::string& what) {
    throw std::invalid_argument("rein::redis::connection: " + what);
  };
  if (o.host.empty()) fail("host must not be empty");
  if (o.port == 0) fail("port must be in [1, 65535], got 0");
  if (o.connect_timeout.count() <= 0)
    fail("connect_timeout must be > 0, got " + std::to_string(o.connect_timeout.count()) + "ms");
  if (o.request_timeout.count() <= 0)
    fail("request_timeout must be > 0, got " + std::to_string(o.request_timeout.count()) + "ms");
  if (o.reconnect_base.count() <= 0)
    fail("reconnect_base must be > 0, got " + std::to_string(o.reconnect_base.count()) + "ms");
  if (o.reconnect_cap < o.reconnect_base)
    fail("reconnect_cap must be >= reconnect_base, got " + std::to_string(o.reconnect_cap.count()) + "ms");
  if (o.database < 0) fail("database must be >= 0, got " + std::to_string(o.database));
  if (!o.username.empty() && o.password.empty()) fail("username needs a password");
  const tls_options& t = o.tls;
  if (!t.enabled) {
    const auto set = [&](const std::string& field, const std::string& value) {
      if (!value.empty()) fail("tls." + field + " is \"" + value + "\" but tls.enabled is false (no plaintext fallback)");
    };
    set("ca_file", t.ca_file);
    set("ca_directory", t.ca_directory);
    set("certificate_file", t.certificate_file);
    set("private_key_file", t.private_key_file);
    set("server_name", t.server_name);
    return o;
  }
#if !defined(REIN_REDIS_TLS)
  fail("tls.enabled is true, but rein was built without TLS (link rein::redis_tls, or define REIN_REDIS_TLS "
       "for every file and link OpenSSL)");
#endif
  if (t.certificate_file.empty() != t.private_key_file.empty())
    fail(t.certificate_file.empty() ? "tls.private_key_file \"" + t.private_key_file + "\" needs tls.certificate_file"
                                    : "tls.certificate_file \"" + t.certificate_file + "\" needs tls.private_key_file");
  return o;
}

// A command's name for messages: its first argument, and the second for commands with subcommands
// ("SCRIPT LOAD"). `encoded` is in the protocol's array form, as encode_command writes it.
inline std::string command_label(std::string_view encoded) {
  std::string label;
  for (int i = 0; i < 2; ++i) {
    const auto dollar = encoded.find('$');
    const auto end = encoded.find("\r\n", dollar == std::string_view::npos ? 0 : dollar);
    if (dollar == std::string_view::npos || end == std::string_view::npos) break;
    std::size_t length = 0;
    const auto [ptr, ec] = std::from_chars(encoded.data() + dollar + 1, encoded.data() + end, length);
    if (ec != std::errc{} || ptr != encoded.data() + end || end + 2 + length > encoded.size()) break;
    const std::string_view arg = encoded.substr(end + 2, length);
    if (i == 1 && label != "SCRIPT" && label != "CLIENT" && label != "CONFIG" && label != "ACL" && label != "CLUSTER")
      break;
    if (!label.empty()) label += ' ';
    for (const char c : arg) label += (c >= 'a' && c <= 'z') ? static_cast<char>(c - 'a' + 'A') : c;
    encoded.remove_prefix(std::min(encoded.size(), end + 2 + length + 2));
  }
  return label;
}

// True for the error replies by which Redis refuses a user (ACL): NOPERM, WRONGPASS, NOAUTH.
inline bool is_refusal(std::string_view text) noexcept {
  return text.starts_with("NOPERM") || text.starts_with("WRONGPASS") || text.starts_with("NOAUTH");
}

// True for a stream the server closed, reset or ended with a TLS alert (how a TLS 1.3 server refuses a
// client certificate after the client's handshake ended), not for a timeout or a local error.
inline bool closed_by_peer(const error_code& ec) noexcept {
  if (ec == net::error::eof || ec == net::error::connection_reset || ec == net::error::broken_pipe) return true;
#if defined(REIN_REDIS_TLS)
  if (ec == net::ssl::error::stream_truncated || ec.category() == net::error::get_ssl_category()) return true;
#endif
  return false;
}

#if defined(REIN_REDIS_TLS)
// One TLS client context per connection, from validated options. A file that cannot be used is a bad option.
inline std::shared_ptr<net::ssl::context> make_tls_context(const tls_options& t) {
  auto context = std::make_shared<net::ssl::context>(net::ssl::context::tls_client);
  const auto check = [](const error_code& ec, const std::string& field, const std::string& value) {
    if (ec)
      throw std::invalid_argument("rein::redis::connection: tls." + field + " \"" + value + "\" cannot be used: " +
                                  ec.message());
  };
  error_code ec;
  ::SSL_CTX_set_min_proto_version(context->native_handle(), TLS1_2_VERSION);
  context->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_compression, ec);
  check(ec, "enabled", "true");
  if (t.ca_file.empty() && t.ca_directory.empty()) {
    context->set_default_verify_paths(ec);
    check(ec, "ca_file", "");
  }
  if (!t.ca_file.empty()) {
    context->load_verify_file(t.ca_file, ec);
    check(ec, "ca_file", t.ca_file);
  }
  if (!t.ca_directory.empty()) {
    // OpenSSL accepts any path here and looks it up only at the handshake.
    std::error_code not_there;
    if (!std::filesystem::is_directory(t.ca_directory, not_there))
      throw std::invalid_argument("rein::redis::connection: tls.ca_directory \"" + t.ca_directory +
                                  "\" is not a directory");
    context->add_verify_path(t.ca_directory, ec);
    check(ec, "ca_directory", t.ca_directory);
  }
  if (!t.certificate_file.empty()) {
    context->use_certificate_chain_file(t.certificate_file, ec);
    check(ec, "certificate_file", t.certificate_file);
    context->use_private_key_file(t.private_key_file, net::ssl::context::pem, ec);
    check(ec, "private_key_file", t.private_key_file);
    if (::SSL_CTX_check_private_key(context->native_handle()) != 1)
      throw std::invalid_argument("rein::redis::connection: tls.private_key_file \"" + t.private_key_file +
                                  "\" does not match tls.certificate_file \"" + t.certificate_file + "\"");
  }
  context->set_verify_mode(t.verify_peer ? net::ssl::verify_peer : net::ssl::verify_none, ec);
  check(ec, "verify_peer", t.verify_peer ? "true" : "false");
  return context;
}
#endif

}  // namespace rein::redis::detail
