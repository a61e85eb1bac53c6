// A pipelined connection to one Redis server: Asio moves the bytes, hiredis encodes and parses them.
#pragma once

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

namespace detail {

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

// The connection's machinery, shared (shared_ptr) by the public connection object, the limiters using it,
// and its own pending handlers.
//
// Threads: `submit`, `close`, `snapshot` and `add_startup_command` may be called from any thread; they
// touch only the state under `mutex_`. The socket, resolver, timers, hiredis reader and write buffer are
// touched only on `strand_` (Asio I/O objects are not thread-safe, and one read plus one write in flight
// must be initiated from one strand). Nodes are completed outside the lock, in FIFO order.
//
// States: idle (never used) -> connecting -> connected; any failure -> backing_off -> (after a jittered
// delay) connecting ...; close() -> closed, from anywhere, for good. While backing off, submit refuses at
// once (returns false) so callers can apply their failure policy without waiting; while connecting it
// queues, and the queued commands are written once the handshake is written.
//
// The circuit: a timeout (request_timeout, connect_timeout) opens it. A hung server (SIGSTOP, a stalled
// VM) still accepts TCP connections in its kernel, so reconnecting succeeds at once and, without the
// circuit, every caller would wait out another request_timeout after every reconnect. While it is open,
// submit refuses in every state and connected() says no; each new connection sends its handshake and a
// PING (the probe) and nothing else, and the first reply on it closes the circuit. A probe that times out
// fails the connection as any request would (backoff, reconnect, probe again).
//
// Generations: every connection attempt and every failure bumps `generation_`; a completion handler
// carrying an older generation belongs to a socket or timer wait that no longer matters and does nothing.
template <class Executor>
class connection_core final : public command_link, public std::enable_shared_from_this<connection_core<Executor>> {
 public:
  using executor_type = Executor;
  using clock = std::chrono::steady_clock;
  using tcp = net::ip::tcp;
  using socket_type = net::basic_stream_socket<tcp, Executor>;
  using resolver_type = net::ip::basic_resolver<tcp, Executor>;
  using timer_type = net::basic_waitable_timer<clock, net::wait_traits<clock>, Executor>;
#if defined(REIN_REDIS_TLS)
  using tls_stream_type = net::ssl::stream<socket_type>;
#endif

  connection_core(const Executor& ex, connection_options options)
      : executor_(ex),
        strand_(net::make_strand(ex)),
        socket_(ex),
        resolver_(ex),
        retry_timer_(ex),
        watchdog_(ex),
        options_(validated(std::move(options))),
        backoff_(algo::backoff_options{.base = options_.reconnect_base, .cap = options_.reconnect_cap}),
        reader_(make_reader()),
        rng_(static_cast<std::minstd_rand::result_type>(clock::now().time_since_epoch().count())) {
#if defined(REIN_REDIS_TLS)
    try {
      if (options_.tls.enabled) tls_context_ = make_tls_context(options_.tls);
    } catch (...) {
      ::redisReaderFree(reader_);  // no destructor runs for a constructor that throws
      throw;
    }
#endif
  }

  connection_core(const connection_core&) = delete;
  connection_core& operator=(const connection_core&) = delete;

  ~connection_core() {
    pending_.fail_all(net::error::operation_aborted);
    ::redisReaderFree(reader_);
  }

  const Executor& get_executor() const noexcept { return executor_; }
  const connection_options& options() const noexcept { return options_; }

  /// Lock-free: true while a connection is established (its handshake written) and the circuit is closed.
  bool connected() const noexcept { return connected_.load(std::memory_order_acquire); }
  bool connected() noexcept override { return connected_.load(std::memory_order_acquire); }

  /// Queues one encoded command; `node` is completed with its reply. Returns false, leaving `node`
  /// untouched, when the connection is backing off after a failure, its circuit is open or it is closed.
  /// The first submit connects.
  bool submit(std::string_view command, request_node* node) override { return submit_pair({}, nullptr, command, node); }

  /// As submit, for a command that must follow another with nothing between them (Redis Cluster's ASKING):
  /// both are queued under one lock. `first_node` may be null only if `first` is empty.
  bool submit_pair(std::string_view first, request_node* first_node, std::string_view command, request_node* node) {
    bool connect_now = false;
    bool flush_now = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (state_ == state::closed || state_ == state::backing_off || circuit_open_) return false;
      out_.reserve(out_.size() + first.size() + command.size());  // the only throw: before anything changes
      const auto now = clock::now();
      if (first_node != nullptr) {
        first_node->submitted_ = now;
        out_.append(first);
        pending_.push_back(first_node);
        ++stats_.requests;
      }
      node->submitted_ = now;
      out_.append(command);
      pending_.push_back(node);
      ++stats_.requests;
      if (state_ == state::idle) {
        state_ = state::connecting;
        connect_now = true;
      } else if (state_ == state::connected && !writing_ && !flush_posted_) {
        flush_posted_ = true;
        flush_now = true;
      }
    }
    if (connect_now) net::post(strand_, [self = this->shared_from_this()] { self->start_connect(); });
    if (flush_now) net::post(strand_, [self = this->shared_from_this()] { self->flush(); });
    return true;
  }

  /// Takes the address of every later connection attempt from `source` instead of `host` and `port` (which
  /// are then ignored). Then a READONLY error reply (the server was demoted to a replica) drops the
  /// connection after its replies are delivered, so that the next attempt asks `source` again.
  void set_address_source(std::shared_ptr<address_source> source) {
    std::lock_guard<std::mutex> lock(mutex_);
    source_ = std::move(source);
  }

  /// Starts connecting if nothing has yet (the first submit would). For a connection known to be needed
  /// soon, such as a cluster node that just took over slots.
  void connect() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (state_ != state::idle) return;
      state_ = state::connecting;
    }
    net::post(strand_, [self = this->shared_from_this()] { self->start_connect(); });
  }

  /// A command sent first on every connection (after AUTH and SELECT), e.g. SCRIPT LOAD. Its reply is
  /// checked only for errors, counted in `startup_errors`. Sent at once too if a connection is up.
  /// An identical command registered earlier is not added again.
  void add_startup_command(std::string command) override {
    bool send_now = false;
    bool probe = false;
    std::uint64_t generation = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (std::find(startup_.begin(), startup_.end(), command) != startup_.end()) return;
      startup_.push_back(command);
      send_now = state_ == state::connected;
      generation = generation_;
      probe = !scripts_ && command_label(command) == "SCRIPT LOAD";
      scripts_ = scripts_ || probe;
    }
    if (!send_now) return;
    auto* node = new startup_node(this->weak_from_this(), generation, startup_kind::optional, command_label(command));
    if (!submit(command, node)) delete node;
    if (!probe) return;
    auto* check = new startup_node(this->weak_from_this(), generation, startup_kind::permission_probe, evalsha_probe_label);
    if (!submit(evalsha_probe(), check)) delete check;
  }

  /// The outcome of async_connect's PING (see ready_node): `reply` null if it was never answered. Records a
  /// refused PING as a startup failure.
  error_code startup_result(const ::redisReply* reply) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (reply == nullptr) return stats_.last_error ? stats_.last_error : error_code(errc::unavailable);
    if (startup_failure_) return startup_failure_;  // a startup command's refusal comes first
    if (reply->type == REDIS_REPLY_ERROR) {
      const std::string_view text(reply->str, reply->len);
      stats_.last_error_message = "PING refused: " + std::string(text);
      return is_refusal(text) ? errc::permission_denied : errc::server_error;
    }
    return {};
  }

  /// Closes for good: pending commands complete with `operation_aborted` (here, on the caller's thread),
  /// later submits are refused, and the socket is closed on the strand. Idempotent.
  void close() {
    request_list lost;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (state_ == state::closed) return;
      state_ = state::closed;
      connected_.store(false, std::memory_order_release);
      ++generation_;
      stats_.failed_requests += pending_.size();
      lost = std::move(pending_);
      out_.clear();
    }
    net::post(strand_, [self = this->shared_from_this()] {
      error_code ignored;
      self->tcp_socket().close(ignored);
      self->resolver_.cancel();
      self->retry_timer_.cancel();
      self->watchdog_.cancel();
    });
    lost.fail_all(net::error::operation_aborted);
  }

  connection_snapshot snapshot() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    connection_snapshot s = stats_;
    s.connected = state_ == state::connected && !circuit_open_;
    s.circuit_open = circuit_open_;
    s.pending = pending_.size();
    return s;
  }

 private:
  enum class state : std::uint8_t { idle, connecting, connected, backing_off, closed };

  // critical: AUTH and SELECT (the connection is useless without them: an error drops it, and it is retried
  // with backoff). optional: the startup commands (an error is counted). permission_probe: EVALSHA of a
  // script that does not exist, sent after the first SCRIPT LOAD: Redis checks the ACL before looking the
  // script up, so NOSCRIPT means EVALSHA is allowed, NOPERM that every admission would be refused.
  enum class startup_kind : std::uint8_t { critical, optional, permission_probe };

  static constexpr std::string_view evalsha_probe_label = "EVALSHA (permission check)";
  static std::string evalsha_probe() {
    return encode_command({"EVALSHA", "0000000000000000000000000000000000000000", "0"});
  }

  // Checks the reply of a handshake or startup command.
  class startup_node final : public request_node {
   public:
    startup_node(std::weak_ptr<connection_core> core, std::uint64_t generation, startup_kind what,
                 std::string_view label)
        : core_(std::move(core)), label_(label), generation_(generation), kind_(what) {}

    void complete(const error_code& ec, const ::redisReply* reply) noexcept override {
      const bool refused = !ec && reply != nullptr && reply->type == REDIS_REPLY_ERROR;
      std::weak_ptr<connection_core> core = std::move(core_);
      std::string label = std::move(label_);
      const std::uint64_t generation = generation_;
      const startup_kind kind = kind_;
      std::string text;
      if (refused) {
        try {
          text.assign(reply->str, reply->len);
        } catch (...) {  // out of memory: the refusal still counts, without its text
        }
      }
      delete this;
      if (!refused) return;
      if (auto c = core.lock()) c->on_startup_error(generation, kind, label, text);  // on the strand
    }

   private:
    std::weak_ptr<connection_core> core_;
    std::string label_;
    std::uint64_t generation_;
    startup_kind kind_;
  };

  // The TCP socket under TLS or not. Strand only.
  socket_type& tcp_socket() noexcept {
#if defined(REIN_REDIS_TLS)
    if (tls_) return tls_->next_layer();
#endif
    return socket_;
  }

  // What a pending operation must keep alive: the TLS stream it runs on (a fresh one per connection; an
  // ssl::stream's operations refer to it until their handler runs), or nothing.
  std::shared_ptr<void> stream_keepalive() const {
#if defined(REIN_REDIS_TLS)
    return tls_;
#else
    return nullptr;
#endif
  }

  // Calls f with the stream commands and replies go through: the TLS stream or the socket. Strand only.
  template <class F>
  void with_stream(F&& f) {
#if defined(REIN_REDIS_TLS)
    if (tls_) {
      f(*tls_);
      return;
    }
#endif
    f(socket_);
  }

  std::string endpoint_text() const { return options_.host + ":" + std::to_string(options_.port); }

  static ::redisReader* make_reader() {
    ::redisReader* r = ::redisReaderCreate();
    if (r == nullptr) throw std::bad_alloc();
    return r;
  }

  template <class F>
  auto on_strand(F&& f) {
    return net::bind_executor(strand_, std::forward<F>(f));
  }

  bool stale(std::uint64_t generation) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return generation != generation_ || state_ == state::closed;
  }

  double uniform_locked() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

  // ---- Connecting (strand) ------------------------------------------------------------------------------

  void start_connect() {
    std::uint64_t generation = 0;
    std::shared_ptr<address_source> source;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (state_ == state::closed) return;
      state_ = state::connecting;
      generation = ++generation_;
      source = source_;
    }
    if (!source) return connect_to(generation, options_.host, options_.port);
    source->async_address([self = this->shared_from_this(), generation](const error_code& ec, const std::string& host,
                                                                        std::uint16_t port) {
      net::post(self->strand_, [self, generation, ec, host, port] {
        if (self->stale(generation)) return;
        if (ec) return self->fail(generation, ec);
        self->connect_to(generation, host, port);
      });
    });
  }

  void connect_to(std::uint64_t generation, const std::string& host, std::uint16_t port) {
#if defined(REIN_REDIS_TLS)
    if (tls_context_) start_tls_stream(host);
#endif
    auto self = this->shared_from_this();
    auto keep = stream_keepalive();
    retry_timer_.expires_after(options_.connect_timeout);
    retry_timer_.async_wait(on_strand([self, generation](const error_code& ec) {
      if (!ec) self->on_connect_timeout(generation);
    }));
    // An address needs no resolver: Asio resolves on one thread per execution context, first come first
    // served, so a slow name elsewhere (another node's, a user's) would otherwise delay this connection.
    error_code not_an_address;
    const auto address = net::ip::make_address(host, not_an_address);
    if (!not_an_address) {
      tcp_socket().async_connect(tcp::endpoint(address, port), on_strand([self, generation, keep](const error_code& e) {
                                   self->on_connected(generation, e);
                                 }));
      return;
    }
    resolver_.async_resolve(host, std::to_string(port),
                            on_strand([self, generation](const error_code& ec, typename resolver_type::results_type r) {
                              self->on_resolved(generation, ec, std::move(r));
                            }));
  }

#if defined(REIN_REDIS_TLS)
  // A fresh TLS stream for this attempt, naming the server for SNI and for the certificate check.
  // `host`: the address this attempt connects to (the configured one, or the one an address source gave).
  void start_tls_stream(const std::string& host) {
    tls_ = std::make_shared<tls_stream_type>(executor_, *tls_context_);
    const std::string& name = options_.tls.server_name.empty() ? host : options_.tls.server_name;
    error_code not_an_address;
    (void)net::ip::make_address(name, not_an_address);
    ::SSL* ssl = tls_->native_handle();
    if (not_an_address) (void)::SSL_set_tlsext_host_name(ssl, name.c_str());  // no SNI for an address (RFC 6066)
    if (!options_.tls.verify_peer) return;
    ::X509_VERIFY_PARAM* param = ::SSL_get0_param(ssl);
    ::X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    if (not_an_address) (void)::X509_VERIFY_PARAM_set1_host(param, name.c_str(), name.size());
    else (void)::X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str());
  }

  void on_handshake(std::uint64_t generation, const error_code& ec) {
    if (stale(generation)) return;
    if (!ec) return on_established(generation);
    // A refused certificate says why in its verification result; OpenSSL's handshake error says only
    // "certificate verify failed".
    error_code cause = ec;
    const long verdict = tls_ ? ::SSL_get_verify_result(tls_->native_handle()) : X509_V_OK;
    if (verdict != X509_V_OK) cause = error_code(static_cast<int>(verdict), tls_verify_category());
    fail(generation, cause, "TLS handshake with " + endpoint_text() + " failed: " + cause.message());
  }
#endif

  void on_connect_timeout(std::uint64_t generation) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (generation != generation_ || state_ != state::connecting) return;
    }
    const bool tls = options_.tls.enabled;
    fail(generation, net::error::timed_out,
         "connecting to " + endpoint_text() + (tls ? " (TCP and TLS handshake)" : "") + " took longer than connect_timeout");
  }

  void on_resolved(std::uint64_t generation, const error_code& ec, typename resolver_type::results_type results) {
    if (stale(generation)) return;
    if (ec) return fail(generation, ec);
    auto self = this->shared_from_this();
    auto keep = stream_keepalive();
    net::async_connect(tcp_socket(), results, on_strand([self, generation, keep](const error_code& e, const tcp::endpoint&) {
                         self->on_connected(generation, e);
                       }));
  }

  void on_connected(std::uint64_t generation, const error_code& ec) {
    if (stale(generation)) return;
    if (ec) return fail(generation, ec);
    error_code ignored;
    tcp_socket().set_option(tcp::no_delay(true), ignored);  // pipelined small writes must not wait for Nagle
#if defined(REIN_REDIS_TLS)
    if (tls_) {  // connect_timeout covers the handshake too
      auto self = this->shared_from_this();
      auto keep = stream_keepalive();
      tls_->async_handshake(net::ssl::stream_base::client, on_strand([self, generation, keep](const error_code& e) {
                              self->on_handshake(generation, e);
                            }));
      return;
    }
#endif
    on_established(generation);
  }

  // TCP (and TLS) up: queue the handshake commands in front of everything else and start reading.
  void on_established(std::uint64_t generation) {
    retry_timer_.cancel();
    ::redisReader* fresh = make_reader();  // a new connection starts a new reply stream
    ::redisReaderFree(std::exchange(reader_, fresh));

    request_list hello;
    std::string bytes;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (generation != generation_ || state_ != state::connecting) return;
      const auto now = clock::now();
      startup_failure_ = {};
      answered_ = false;
      const auto add = [&](std::string command, startup_kind what) {
        auto* node = new startup_node(this->weak_from_this(), generation, what,
                                      what == startup_kind::permission_probe ? std::string(evalsha_probe_label)
                                                                             : command_label(command));
        node->submitted_ = now;
        hello.push_back(node);
        bytes += command;
        ++stats_.requests;
      };
      if (!options_.password.empty()) {
        add(options_.username.empty() ? encode_command({"AUTH", options_.password})
                                      : encode_command({"AUTH", options_.username, options_.password}),
            startup_kind::critical);
      }
      if (options_.database != 0)
        add(encode_command({"SELECT", std::to_string(options_.database)}), startup_kind::critical);
      for (const std::string& command : startup_) add(command, startup_kind::optional);
      if (scripts_) add(evalsha_probe(), startup_kind::permission_probe);
      if (circuit_open_) {  // its reply (or any before it) closes the circuit; nothing else is queued meanwhile
        add(encode_command({"PING"}), startup_kind::optional);
        ++stats_.probes;
      }
      out_.insert(0, bytes);
      pending_.splice_front(hello);
      state_ = state::connected;
      connected_.store(!circuit_open_, std::memory_order_release);
      ++stats_.connects;
    }
    start_read(generation);
    flush();
  }

  void on_startup_error(std::uint64_t generation, startup_kind kind, const std::string& label, const std::string& text) {
    const bool refusal = is_refusal(text);
    if (kind == startup_kind::permission_probe && !refusal) return;  // NOSCRIPT: EVALSHA is allowed
    const error_code cause = refusal ? errc::permission_denied : errc::server_error;
    std::string message = label + " refused: " + text;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.startup_errors;
      // Replies from a connection already failed (e.g. NOAUTH behind a refused AUTH) say nothing new.
      if (generation != generation_) return;
      startup_failure_ = cause;
      if (kind != startup_kind::critical) stats_.last_error_message = message;
      // A refused AUTH or SELECT is an answer that fails the connection: its reply must not restart the
      // backoff, or a wrong secret reconnects at the base delay for ever.
      if (kind == startup_kind::critical) failures_ = failures_before_answer_;
    }
    if (kind == startup_kind::critical) fail(generation, cause, std::move(message));
  }

  // ---- Failing and backing off (strand) -----------------------------------------------------------------

  void fail(std::uint64_t generation, const error_code& cause, std::string message = {}) {
    request_list lost;
    std::chrono::nanoseconds delay{};
    std::uint64_t next_generation = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (generation != generation_ || state_ == state::closed || state_ == state::backing_off) return;
      if (state_ == state::connected) ++stats_.disconnects;
      else ++stats_.connect_failures;
      stats_.last_error = cause;
      if (message.empty()) {
        message = endpoint_text() + ": " + cause.message();
        // TLS 1.3 ends the client's handshake before the server checks the client's certificate: a server
        // that wants one and got none (or one it does not trust) closes the connection then.
        if (options_.tls.enabled && state_ == state::connected && !answered_ && closed_by_peer(cause))
          message += " right after the TLS handshake, before any reply (does the server require a client "
                     "certificate? see tls.certificate_file)";
      }
      stats_.last_error_message = std::move(message);
      if (cause == net::error::timed_out && !circuit_open_) {
        circuit_open_ = true;
        ++stats_.circuit_opens;
      }
      state_ = state::backing_off;
      connected_.store(false, std::memory_order_release);
      next_generation = ++generation_;
      stats_.failed_requests += pending_.size();
      lost = std::move(pending_);
      out_.clear();
      writing_ = false;
      flush_posted_ = false;
      watchdog_armed_ = false;
      ++failures_;
      delay = backoff_.delay(failures_, uniform_locked());
    }
    error_code ignored;
    tcp_socket().close(ignored);
    resolver_.cancel();
    watchdog_.cancel();
    auto self = this->shared_from_this();
    retry_timer_.expires_after(delay);
    retry_timer_.async_wait(on_strand([self, next_generation](const error_code& ec) {
      if (!ec) self->on_backoff_done(next_generation);
    }));
    lost.fail_all(errc::unavailable);
  }

  void on_backoff_done(std::uint64_t generation) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (generation != generation_ || state_ != state::backing_off) return;
    }
    start_connect();
  }

  // ---- Writing (strand) ---------------------------------------------------------------------------------

  // Hands everything queued to one async_write; commands submitted meanwhile wait for the next.
  void flush() {
    std::uint64_t generation = 0;
    bool arm = false;
    clock::time_point at{};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      flush_posted_ = false;
      if (state_ != state::connected || writing_ || out_.empty()) return;
      writing_buffer_.swap(out_);
      out_.clear();
      writing_ = true;
      generation = generation_;
      if (!watchdog_armed_ && !pending_.empty()) {
        watchdog_armed_ = true;
        arm = true;
        at = pending_.front()->submitted_ + options_.request_timeout;
      }
    }
    auto self = this->shared_from_this();
    auto keep = stream_keepalive();
    with_stream([&](auto& stream) {
      net::async_write(stream, net::buffer(writing_buffer_), on_strand([self, generation, keep](const error_code& ec, std::size_t) {
                         self->on_written(generation, ec);
                       }));
    });
    if (arm) arm_watchdog(generation, at);
  }

  void on_written(std::uint64_t generation, const error_code& ec) {
    if (stale(generation)) return;
    if (ec) return fail(generation, ec);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      writing_ = false;
    }
    flush();
  }

  // ---- Watching for a silent server (strand) ------------------------------------------------------------
  // One timer, armed for the oldest pending command's limit and re-armed only when it fires (never per
  // command): replies are FIFO, so the oldest pending command is always the one to watch.

  void arm_watchdog(std::uint64_t generation, clock::time_point at) {
    auto self = this->shared_from_this();
    watchdog_.expires_at(at);
    watchdog_.async_wait(on_strand([self, generation](const error_code& ec) {
      if (!ec) self->on_watchdog(generation);
    }));
  }

  void on_watchdog(std::uint64_t generation) {
    clock::time_point at{};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (generation != generation_ || state_ != state::connected) return;
      watchdog_armed_ = false;
      if (pending_.empty()) return;
      at = pending_.front()->submitted_ + options_.request_timeout;
      if (at > clock::now()) watchdog_armed_ = true;
    }
    if (at <= clock::now()) return fail(generation, net::error::timed_out);
    arm_watchdog(generation, at);
  }

  // ---- Reading (strand) ---------------------------------------------------------------------------------

  void start_read(std::uint64_t generation) {
    auto self = this->shared_from_this();
    auto keep = stream_keepalive();
    with_stream([&](auto& stream) {
      stream.async_read_some(net::buffer(read_buffer_), on_strand([self, generation, keep](const error_code& ec, std::size_t n) {
                               self->on_read(generation, ec, n);
                             }));
    });
  }

  void on_read(std::uint64_t generation, const error_code& ec, std::size_t n) {
    if (stale(generation)) return;
    if (ec) return fail(generation, ec);
    bool malformed = ::redisReaderFeed(reader_, read_buffer_.data(), n) != REDIS_OK;
    replies_.clear();
    while (!malformed) {
      void* r = nullptr;
      if (::redisReaderGetReply(reader_, &r) != REDIS_OK) malformed = true;
      else if (r == nullptr) break;
      else replies_.push_back(static_cast<::redisReply*>(r));
    }
    request_list answered;
    bool demoted = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (source_) demoted = std::any_of(replies_.begin(), replies_.end(), [](const ::redisReply* r) {
        return r->type == REDIS_REPLY_ERROR && std::string_view(r->str, r->len).starts_with("READONLY");
      });
      const auto now = clock::now();
      for (std::size_t i = 0; i < replies_.size() && !pending_.empty(); ++i) {
        request_node* node = pending_.pop_front();
        const auto rtt = std::chrono::duration_cast<std::chrono::nanoseconds>(now - node->submitted_);
        stats_.round_trip_last = rtt;
        stats_.round_trip_total += rtt;
        stats_.round_trip_max = std::max(stats_.round_trip_max, rtt);
        ++stats_.replies;
        answered.push_back(node);
      }
      if (!replies_.empty()) {
        if (!answered_) failures_before_answer_ = failures_;
        answered_ = true;
        failures_ = 0;  // the server answers: the next failure starts backoff afresh
        if (circuit_open_ && state_ == state::connected) {  // a probe (or the handshake before it) answered
          circuit_open_ = false;
          connected_.store(true, std::memory_order_release);
        }
      }
    }
    // More replies than commands: the stream is out of step (a push message, or a bug); start over.
    malformed = malformed || answered.size() < replies_.size();
    for (::redisReply* r : replies_) {
      if (request_node* node = answered.pop_front()) node->complete(error_code{}, r);
      ::freeReplyObject(r);
    }
    replies_.clear();
    if (malformed) return fail(generation, errc::protocol_error);
    if (demoted) return fail(generation, errc::unavailable);  // ask the source where the master went
    if (!stale(generation)) start_read(generation);
  }

  Executor executor_;
  net::strand<Executor> strand_;
  // Strand only:
  socket_type socket_;
  resolver_type resolver_;
  timer_type retry_timer_;  // connect timeout, then the backoff delay
  timer_type watchdog_;     // request_timeout of the oldest pending command
  const connection_options options_;
  const algo::backoff backoff_;
  std::array<char, std::size_t{16} * 1024> read_buffer_{};
  std::string writing_buffer_;
  std::vector<::redisReply*> replies_;
  ::redisReader* reader_;
#if defined(REIN_REDIS_TLS)
  std::shared_ptr<net::ssl::context> tls_context_;  // null without TLS; read-only after construction
  std::shared_ptr<tls_stream_type> tls_;            // this attempt's stream (each operation keeps its own)
#endif

  mutable std::mutex mutex_;
  // Under mutex_:
  std::minstd_rand rng_;
  state state_ = state::idle;
  std::uint64_t generation_ = 0;
  std::uint32_t failures_ = 0;  // failed attempts since the server last answered
  std::uint32_t failures_before_answer_ = 0;  // failures_ when the current connection's first reply came
  std::string out_;             // encoded commands not yet handed to a write
  request_list pending_;        // submitted, not answered, in the order their bytes go out
  std::vector<std::string> startup_;
  bool writing_ = false;
  bool flush_posted_ = false;
  bool watchdog_armed_ = false;
  bool circuit_open_ = false;  // see "The circuit" above
  bool scripts_ = false;       // a SCRIPT LOAD is among the startup commands: EVALSHA's ACL is checked too
  error_code startup_failure_;  // a refused startup command on the current connection (async_connect)
  bool answered_ = false;       // a reply came on the current connection
  std::shared_ptr<address_source> source_;  // when set, asked for the address before every attempt
  connection_snapshot stats_{};

  std::atomic<bool> connected_{false};
};

// Completes a user's async_execute: copies the reply, then posts the handler to its associated executor.
template <class Handler, class IoExecutor>
class execute_node final : public request_node {
 public:
  execute_node(Handler&& handler, const IoExecutor& io) : handler_(std::move(handler)), io_(io) {}

  void complete(const error_code& ec, const ::redisReply* r) noexcept override {
    struct invoker {
      Handler handler;
      error_code ec;
      reply value;
      void operator()() { std::move(handler)(ec, std::move(value)); }
    };
    auto ex = net::get_associated_executor(handler_, io_);
    reply value = (ec || r == nullptr) ? reply{} : reply::from_hiredis(*r);
    net::post(ex, invoker{std::move(handler_), ec, std::move(value)});
    delete this;
  }

 private:
  Handler handler_;
  IoExecutor io_;
};

// Completes a user's async_connect when its PING, queued behind the handshake and the startup commands,
// is answered (or never will be): the outcome is the connection's startup result.
template <class Handler, class IoExecutor, class Core>
class ready_node final : public request_node {
 public:
  ready_node(Handler&& handler, const IoExecutor& io, std::weak_ptr<Core> core)
      : handler_(std::move(handler)), io_(io), core_(std::move(core)) {}

  void complete(const error_code& ec, const ::redisReply* r) noexcept override {
    struct invoker {
      Handler handler;
      error_code ec;
      void operator()() { std::move(handler)(ec); }
    };
    error_code result = net::error::operation_aborted;
    if (ec != net::error::operation_aborted) {
      if (auto core = core_.lock()) {
        try {
          result = core->startup_result(ec ? nullptr : r);
        } catch (...) {  // out of memory for the message: the code alone
          result = errc::unavailable;
        }
      }
    }
    auto ex = net::get_associated_executor(handler_, io_);
    net::post(ex, invoker{std::move(handler_), result});
    delete this;
  }

 private:
  Handler handler_;
  IoExecutor io_;
  std::weak_ptr<Core> core_;
};

// Starts a user's async_execute: `submit(node)` hands the node to a connection or a cluster, which
// completes it; if it refuses (down or closed), the handler gets errc::unavailable, posted (never inline).
template <class IoExecutor, class Handler, class Submit>
void start_execute(Handler&& handler, const IoExecutor& io, Submit&& submit) {
  auto node = std::make_unique<execute_node<std::decay_t<Handler>, IoExecutor>>(std::forward<Handler>(handler), io);
  if (submit(static_cast<request_node*>(node.get()))) {
    node.release();
    return;
  }
  node.release()->complete(errc::unavailable, nullptr);
}

}  // namespace detail

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
  const connection_options& options() const noexcept { return core_->options(); }

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
