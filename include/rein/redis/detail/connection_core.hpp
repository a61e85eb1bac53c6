// The machinery of rein::redis::connection: one socket on a strand, pipelining, reconnection with backoff,
// the circuit, TLS, and the completion nodes of its doors. Not API.
#pragma once

#include <rein/redis/detail/connection_link.hpp>

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
  const connection_options& get_options() const noexcept { return options_; }

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

}  // namespace rein::redis::detail
