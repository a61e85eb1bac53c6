// The server side of rate limits: each incoming Boost.Beast request passes a keyed token bucket and a
// global concurrency stage (a semaphore, or an adaptive limiter), and a refusal is a ready 429 or 503 with
// Retry-After and the IETF RateLimit fields.
// Optional: needs Boost.Beast (part of Boost), so it is not part of the standalone-Asio build.
#pragma once

#include <rein/adaptive_limiter.hpp>
#include <rein/config.hpp>
#include <rein/detail/invalid_option.hpp>
#include <rein/error.hpp>
#include <rein/keyed.hpp>
#include <rein/line_options.hpp>
#include <rein/permit.hpp>
#include <rein/queue_order.hpp>
#include <rein/semaphore.hpp>
#include <rein/token_bucket.hpp>
#include <rein/try_result.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/cancellation_type.hpp>
#include <boost/asio/compose.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace rein::beast {

namespace http = boost::beast::http;

/// Why a request was not admitted.
enum class refusal : std::uint8_t {
  none,         ///< admitted
  rate,         ///< its key's token bucket had no token within the wait bound: 429 Too Many Requests
  concurrency,  ///< no concurrency slot within the wait bound (load shedding): 503 Service Unavailable
  keys,         ///< a new key while `max_keys` keys are alive and busy (a key spray): 503
  closed,       ///< the admission was closed (shutting down): 503
  key_error,    ///< the key function threw: 500 Internal Server Error (a fault of the server's code)
  aborted,      ///< the admit was cancelled, or its admission destroyed (operation_aborted): nothing to send
};

/// A readable name for a refusal ("none", "rate", "concurrency", "keys", "closed", "key_error", "aborted").
constexpr const char* to_string(refusal r) noexcept {
  switch (r) {
    case refusal::none: return "none";
    case refusal::rate: return "rate";
    case refusal::concurrency: return "concurrency";
    case refusal::keys: return "keys";
    case refusal::closed: return "closed";
    case refusal::key_error: return "key_error";
    case refusal::aborted: return "aborted";
  }
  return "unknown";
}

/// Options of rein::beast::basic_admission. Write them with designated initializers:
/// `{.rate = 100, .burst = 20, .concurrency = 64, .max_wait = 50ms}`.
struct admission_options {
  /// Requests per second admitted per key (the token bucket's rate), in (0, 1e9].
  double rate = 0;
  /// Requests a key may send at once after an idle spell (the bucket's capacity), in [1, 1e15].
  std::int64_t burst = 0;
  /// Requests admitted and not yet answered, over all keys (the semaphore's permits), >= 1. Only for the
  /// default global stage, the semaphore the admission makes; with a global stage given to the constructor
  /// (an adaptive limiter) leave it 0: that stage has its own limit.
  std::size_t concurrency = 0;
  /// The order of requests waiting on the semaphore the admission makes: queue_order::fifo (default),
  /// lifo, or fair (each request waits as its key, `for_key(key)`, so that while keys wait each gets an
  /// equal share of the slots, whatever its arrival rate; see rein::queue_order::fair). priority is
  /// refused (a request names no class). With a global stage given to the constructor leave it fifo: that
  /// stage's own options choose its order, and the admission waits as the request's key when it is fair.
  queue_order order = queue_order::fifo;
  /// The longest a request waits for a token and a slot together, >= 0; 0 refuses at once. A request that
  /// the bucket cannot serve within it is refused at once, not after waiting (the bucket knows when its
  /// next token comes). nanoseconds::max(): no bound. Default: 0.
  std::chrono::nanoseconds max_wait{0};
  /// The Retry-After of a 503 (a concurrency, key or closed refusal, where no limiter knows when room comes
  /// back), >= 1 s; sent in whole seconds, rounded up. Default: 1 s.
  std::chrono::nanoseconds shed_retry_after = std::chrono::seconds{1};
  /// The policy's name in the RateLimit and RateLimit-Policy fields (an sf-string: printable ASCII without a
  /// double quote or a backslash), not empty. Default: "default".
  std::string policy = "default";
  /// The key of a request (a client address, an API key header, a route); called by admit(request) before
  /// anything is taken. Default: none, every request shares the key "" (one bucket for the server). A key
  /// from a field the client writes can be sprayed: `max_keys` then bounds memory, and the global stage the
  /// total in flight. It should return a key for every request (a fixed one for requests it cannot place):
  /// an exception from it is a fault of the server, answered with refusal::key_error (a 500), counted in
  /// key_errors(), with nothing taken. For a client address behind proxies see rein::beast::trusted_proxies.
  std::function<std::string(const http::request_header<>&)> key{};
  /// Most keys alive at once (rein::keyed_options::max_keys), >= 1. Default: 10,000.
  std::size_t max_keys = 10'000;
  /// Names the admission in error messages and its limiters' events. Default: none.
  std::string name{};
};

/// Delay-seconds as RFC 9110 section 10.2.3 writes them: whole seconds, rounded up, never negative
/// (saturating at the largest count of seconds a nanosecond duration holds).
inline std::int64_t delay_seconds(std::chrono::nanoseconds d) noexcept {
  constexpr std::int64_t second = 1'000'000'000;
  if (d.count() <= 0) return 0;
  return d.count() / second + (d.count() % second != 0 ? 1 : 0);
}

/// What the IETF fields (draft-ietf-httpapi-ratelimit-headers) say of a key's token bucket at one instant,
/// in the numbers the fields carry; rein::read_response reads them back (rate_limit_dialect::ietf).
///
/// A token bucket of `rate` per second and `burst` maps on the draft's window quota so: the window `w` is
/// the time the bucket takes to refill from empty, `ceil(burst / rate)` seconds (at least 1), and the quota
/// `q` what it refills in one window, `floor(rate * w)`, at least the burst (so q >= burst >= r: the
/// sustained rate, whose burst shows in r). A window longer than 1e12 s (a rate far below one token in
/// thirty thousand years) is written as 1e12 s. `r` is the whole tokens left after this request, and `t` the seconds until the next
/// whole token (rounded up; 0 when the bucket is full): until then at most r more are admitted, the
/// draft's promise for a window's remaining units.
struct rate_limit_state {
  std::int64_t quota = 0;           ///< q, requests per window
  std::int64_t window_seconds = 0;  ///< w, seconds
  std::int64_t remaining = 0;       ///< r, requests admitted now without waiting
  std::int64_t reset_seconds = 0;   ///< t, seconds until one more is

  /// `"<policy>";q=<quota>;w=<window>`, the RateLimit-Policy field's value.
  std::string policy_field(std::string_view policy) const {
    return quoted(policy) + ";q=" + std::to_string(quota) + ";w=" + std::to_string(window_seconds);
  }

  /// `"<policy>";r=<remaining>;t=<reset>`, the RateLimit field's value.
  std::string limit_field(std::string_view policy) const {
    return quoted(policy) + ";r=" + std::to_string(remaining) + ";t=" + std::to_string(reset_seconds);
  }

  /// Sets RateLimit-Policy and RateLimit on `fields` (a response, or its header), replacing any.
  template <class Fields>
  void set_fields(Fields& fields, std::string_view policy) const {
    fields.set("RateLimit-Policy", policy_field(policy));
    fields.set("RateLimit", limit_field(policy));
  }

  /// Equal when every number is.
  friend bool operator==(const rate_limit_state&, const rate_limit_state&) = default;

 private:
  static std::string quoted(std::string_view policy) { return '"' + std::string(policy) + '"'; }
};

/// The fields of a token bucket of `rate` and `burst` holding `tokens` (whole ones count), whose next
/// whole token comes `next_token` from now (ignored when it is full; see rein::beast::rate_limit_state).
inline rate_limit_state bucket_state(double rate, std::int64_t burst, double tokens,
                                     std::chrono::nanoseconds next_token) {
  rate_limit_state s;
  // In doubles and clamped before the casts: burst / rate may leave the range of int64 (a tiny rate).
  constexpr double longest_window = 1e12;
  const double window = std::clamp(std::ceil(static_cast<double>(burst) / rate), 1.0, longest_window);
  s.window_seconds = static_cast<std::int64_t>(window);
  // floor(rate * w) can round below the burst (rate 0.7, burst 63: w = 90, 62.99...), and w is at least
  // burst / rate, so the burst is the floor of q.
  s.quota = std::max(burst, static_cast<std::int64_t>(std::min(std::floor(rate * window), 1e18)));
  s.remaining = std::clamp<std::int64_t>(static_cast<std::int64_t>(std::floor(tokens)), 0, burst);
  s.reset_seconds = s.remaining >= burst ? 0 : delay_seconds(next_token);
  return s;
}

/// What rein::beast::basic_admission takes as its global stage: a concurrency limiter on `Clock` whose
/// permits are rein::permit (rein::basic_semaphore, rein::basic_adaptive_limiter), with try_acquire,
/// async_acquire_until, order, for_key and close.
template <class Global, class Clock>
concept global_stage = std::same_as<typename Global::clock_type, Clock> &&
                       requires(Global& g, std::string_view key) {
                         { g.try_acquire() } -> std::same_as<try_permit>;
                         { g.order() } -> std::same_as<queue_order>;
                         g.for_key(key).try_acquire();
                         g.close();
                       };

template <class Clock = std::chrono::steady_clock, class Global = basic_semaphore<net::any_io_executor, Clock>>
class basic_admission;

/// What admit() decided: admitted, holding a concurrency slot until destroyed; or refused, with the
/// response to send.
class admission_result {
 public:
  /// True if admitted.
  explicit operator bool() const noexcept { return why_ == refusal::none; }
  /// none if admitted, else why not.
  refusal why() const noexcept { return why_; }
  /// The concurrency slot of an admitted request: given back when this result (or the permit moved out of
  /// it) is destroyed or released. Empty for a refusal.
  rein::permit& permit() noexcept { return permit_; }
  /// The key's bucket after this decision; nullopt for a key or closed refusal (no bucket was asked). Set
  /// it on a success response too with `result.state()->set_fields(response, policy)`.
  const std::optional<rate_limit_state>& state() const noexcept { return state_; }
  /// How long admit() waited, on the admission's clock.
  std::chrono::nanoseconds waited() const noexcept { return waited_; }
  /// A refusal's response: 429 (rate) or 503 (the others) with Retry-After (delay-seconds, rounded up),
  /// RateLimit-Policy and RateLimit (when the bucket was asked), `Content-Type: text/plain`, a one-line
  /// body, the request's HTTP version and keep-alive, payload prepared. Empty (a 200 with no fields) if
  /// admitted.
  http::response<http::string_body>& response() noexcept { return response_; }

 private:
  template <class Clock, class Global>
  friend class basic_admission;

  refusal why_ = refusal::aborted;  // until admit() or refuse() decides: an aborted result is no admission
  rein::permit permit_{};
  std::optional<rate_limit_state> state_{};
  std::chrono::nanoseconds waited_{};
  http::response<http::string_body> response_{};
};

/// A refusal's response for a request of HTTP `version` (11 for 1.1) and `keep_alive`: the status of `why`
/// (429 for refusal::rate, 500 for refusal::key_error, 503 otherwise), Retry-After of `retry_after` in
/// delay-seconds (rounded up, at least 1: a 0 would invite an immediate retry; none on a 500, which says
/// nothing of when to come back), the IETF fields of `state` under `policy` when given.
inline http::response<http::string_body> refusal_response(refusal why, unsigned version, bool keep_alive,
                                                          std::chrono::nanoseconds retry_after,
                                                          const std::optional<rate_limit_state>& state,
                                                          std::string_view policy) {
  const bool rate = why == refusal::rate;
  const bool fault = why == refusal::key_error;
  http::response<http::string_body> r{rate    ? http::status::too_many_requests
                                      : fault ? http::status::internal_server_error
                                              : http::status::service_unavailable,
                                      version};
  if (!fault) r.set(http::field::retry_after, std::to_string(std::max<std::int64_t>(1, delay_seconds(retry_after))));
  if (state) state->set_fields(r, policy);
  r.set(http::field::content_type, "text/plain");
  r.keep_alive(keep_alive);
  r.body() = rate ? "Too Many Requests\n" : fault ? "Internal Server Error\n" : "Service Unavailable\n";
  r.prepare_payload();
  return r;
}

/// Admits incoming HTTP requests through a token bucket per key (rein::keyed<rein::basic_token_bucket>) and
/// a global concurrency stage over all keys (a semaphore of `concurrency` slots, or an adaptive limiter
/// given to the constructor), waiting up to `max_wait` or refusing at once, and prepares each refusal's
/// response from the limiters' state at the instant of the decision. In a Beast session coroutine:
///
/// ```
/// rein::beast::admission_result admitted;
/// if (request.find("X-API-Key") == request.end())
///   admitted = co_await admission.admit(request, proxies.client(request, peer).key());
/// else admitted = co_await admission.admit(request);
/// if (!admitted) {
///   co_await http::async_write(stream, admitted.response(), net::use_awaitable);
///   continue;
/// }
/// ```
/// (From examples/ingress.cpp, which tests/beast/ingress.cpp drives with ab.)
///
/// Order: the key's bucket first, then the global stage, so that a request refused for concurrency gives
/// its token back (`refund`) and a request waiting for a token holds no slot. Both waits share one
/// deadline, `max_wait` after admit() began. When the global stage's line is in queue_order::fair, a
/// request waits there as its key (`for_key(key)`), so a tenant flooding the server waits behind its own
/// backlog, not in front of the others.
///
/// With an adaptive global stage (rein::beast::adaptive_admission), report how each admitted request went
/// through its permit, `admitted.permit().complete(rein::outcome::success)` when served (or congestion
/// when the work timed out or was shed further in): the limit moves with the service time from the grant
/// to the report; a permit released without an outcome teaches it nothing.
///
/// @tparam Clock  the clock of the buckets and deadlines (std::chrono::steady_clock;
///                rein::testing::manual_clock in tests).
/// @tparam Global the global stage (rein::beast::global_stage): rein::basic_semaphore (the default, made
///                from `concurrency` and `order`) or rein::basic_adaptive_limiter, on any_io_executor and
///                `Clock`.
///
/// @par Thread Safety
/// Every member function may be called concurrently (the limiters use std::mutex), except destruction,
/// which must not race with admit() operations. Results may be destroyed on any thread.
///
/// @par Lifetime
/// Not copyable or movable (admit() operations point at it). Destroying it completes waiting admit()
/// operations with operation_aborted; permits already handed out may outlive it.
template <class Clock, class Global>
class basic_admission {
  static_assert(global_stage<Global, Clock>,
                "rein::beast::basic_admission: Global must be a concurrency limiter on Clock (global_stage)");

 public:
  /// The executor that runs completion handlers without an associated executor of their own.
  using executor_type = net::any_io_executor;
  /// The clock of the buckets and deadlines.
  using clock_type = Clock;
  /// The per-key rate limiter.
  using bucket_type = basic_token_bucket<executor_type, Clock>;
  /// The global concurrency stage.
  using global_type = Global;
  /// The global stage's type, by its name from when it was always a semaphore.
  using semaphore_type = Global;

  /// Makes the limiters, the global stage a semaphore of `options.concurrency` slots in `options.order`;
  /// nothing runs until the first admit().
  /// @throws std::invalid_argument naming the type ("rein::beast::admission"), the field and the value when
  ///         an option is out of range (rate, burst, concurrency, order, max_wait, shed_retry_after, policy,
  ///         max_keys).
  basic_admission(const executor_type& ex, admission_options options)
    requires std::is_constructible_v<Global, const executor_type&, std::size_t, line_options>
      : options_(checked(std::move(options), true)),
        buckets_(make_buckets(ex, options_)),
        slots_(ex, options_.concurrency, line_options{.name = options_.name, .order = options_.order}) {}

  /// Makes the buckets and takes `global` as the global stage (an adaptive limiter, or a semaphore made with
  /// options the admission does not offer). Its own options choose its limit and order; `concurrency` must
  /// be 0 and `order` fifo.
  /// @throws std::invalid_argument as the other constructor, and for a `concurrency` or `order` set.
  basic_admission(const executor_type& ex, admission_options options, Global global)
      : options_(checked(std::move(options), false)), buckets_(make_buckets(ex, options_)), slots_(std::move(global)) {}

  /// The same on an execution context (an io_context), as every rein limiter takes one.
  template <class ExecutionContext>
    requires std::is_convertible_v<ExecutionContext&, net::execution_context&> &&
             std::is_constructible_v<Global, const executor_type&, std::size_t, line_options>
  basic_admission(ExecutionContext& context, admission_options options)
      : basic_admission(executor_type(context.get_executor()), std::move(options)) {}

  /// The same on an execution context (an io_context), with `global` as the global stage.
  template <class ExecutionContext>
    requires std::is_convertible_v<ExecutionContext&, net::execution_context&>
  basic_admission(ExecutionContext& context, admission_options options, Global global)
      : basic_admission(executor_type(context.get_executor()), std::move(options), std::move(global)) {}

  basic_admission(const basic_admission&) = delete;
  basic_admission& operator=(const basic_admission&) = delete;

  /// Completes waiting admit() operations with operation_aborted (through their executors).
  ~basic_admission() { *alive_ = false; }

  /// The executor given at construction.
  executor_type get_executor() const noexcept { return buckets_.get_executor(); }

  /// The options in force.
  const admission_options& get_options() const noexcept { return options_; }

  /// Admits `request` under the key `get_options().key(request)` (or "" without a key function). The
  /// initiating function; every completion token works; signature `void(error_code, admission_result)`.
  ///
  /// A refusal is not an error: it completes with success and a result whose response() is ready to send.
  /// Errors: `net::error::operation_aborted` (cancelled, or the admission was destroyed), with nothing held.
  /// The key function is called here, before anything is taken; if it throws, the exception is swallowed
  /// and counted (key_errors()), and the request is refused with refusal::key_error (a 500).
  /// The handler is never invoked from inside this function: it goes through its associated executor.
  ///
  /// @par Per-Operation Cancellation
  /// terminal, partial and total, as the limiters' own waits: a waiting admit() is removed and completes
  /// with operation_aborted; a token it had taken goes back to its bucket.
  template <class Body, class Fields,
            REIN_COMPLETION_TOKEN_FOR(void(error_code, admission_result)) Token = default_token_t>
  auto async_admit(const http::request<Body, Fields>& request, Token&& token = Token{}) {
    std::optional<std::string> key = key_of(request);
    return net::async_compose<Token, void(error_code, admission_result)>(
        op{this, alive_, key ? std::move(*key) : std::string(), !key, request.version(), request.keep_alive()}, token,
        get_executor());
  }

  /// As async_admit(request, token) under the key `key` (a client address the session knows, say from
  /// rein::beast::trusted_proxies), without calling the key function.
  template <class Body, class Fields,
            REIN_COMPLETION_TOKEN_FOR(void(error_code, admission_result)) Token = default_token_t>
  auto async_admit(const http::request<Body, Fields>& request, std::string_view key, Token&& token = Token{}) {
    return net::async_compose<Token, void(error_code, admission_result)>(
        op{this, alive_, std::string(key), false, request.version(), request.keep_alive()}, token, get_executor());
  }

  /// Admits `request` inside a coroutine: `auto admitted = co_await admission.admit(request);`. As
  /// async_admit; throws rein::system_error for its errors (operation_aborted).
  template <class Body, class Fields>
  net::awaitable<admission_result> admit(const http::request<Body, Fields>& request) {
    return async_admit(request, net::use_awaitable);
  }

  /// As admit(request) under the key `key`.
  template <class Body, class Fields>
  net::awaitable<admission_result> admit(const http::request<Body, Fields>& request, std::string_view key) {
    return async_admit(request, key, net::use_awaitable);
  }

  /// The IETF fields of `key`'s bucket now, for a response to an admitted request that did not keep its
  /// result; a key with no live bucket reads as a full one.
  rate_limit_state state(std::string_view key) {
    if (auto bucket = buckets_.find(key)) return state_of(*bucket, Clock::now());
    return bucket_state(options_.rate, options_.burst, static_cast<double>(options_.burst), {});
  }

  /// Requests whose key function threw (each refused with refusal::key_error), since construction.
  std::uint64_t key_errors() const noexcept { return key_errors_.load(std::memory_order_relaxed); }

  /// Refuses every waiting and later admit() with refusal::closed (a 503), as a server that shuts down
  /// does; requests already admitted keep their slots.
  void close() { slots_.close(); }

  /// The per-key buckets (for metrics: `for_each_snapshot`).
  keyed<bucket_type>& buckets() noexcept { return buckets_; }
  /// The global stage (for metrics, and for `async_drain` at shutdown).
  Global& slots() noexcept { return slots_; }

 private:
  using time_point = typename Clock::time_point;

  static admission_options checked(admission_options o, bool makes_semaphore) {
    const std::string who = detail::describe("rein::beast::admission", o.name);
    if (!(o.rate > 0 && o.rate <= 1e9))
      detail::throw_invalid(who, "rate must be in (0, 1e9] per second", detail::show(o.rate));
    if (o.burst < 1 || o.burst > 1'000'000'000'000'000)
      detail::throw_invalid(who, "burst must be in [1, 1e15]", detail::show(o.burst));
    if (makes_semaphore && o.concurrency < 1)
      detail::throw_invalid(who, "concurrency must be >= 1", detail::show(o.concurrency));
    if (!makes_semaphore && o.concurrency != 0)
      detail::throw_invalid(who, "concurrency must be 0 with a global stage given (it has its own limit)",
                            detail::show(o.concurrency));
    if (makes_semaphore && o.order == queue_order::priority)
      detail::throw_invalid(who, "order must be fifo, lifo or fair (a request names no class)", to_string(o.order));
    if (!makes_semaphore && o.order != queue_order::fifo)
      detail::throw_invalid(who, "order must be fifo with a global stage given (its options choose its order)",
                            to_string(o.order));
    if (o.max_wait.count() < 0) detail::throw_invalid(who, "max_wait must be >= 0", detail::show(o.max_wait));
    if (o.shed_retry_after < std::chrono::seconds{1})
      detail::throw_invalid(who, "shed_retry_after must be >= 1 s", detail::show(o.shed_retry_after));
    if (o.max_keys < 1) detail::throw_invalid(who, "max_keys must be >= 1", detail::show(o.max_keys));
    const bool printable = std::all_of(o.policy.begin(), o.policy.end(),
                                       [](char c) { return c >= 0x20 && c <= 0x7e && c != '"' && c != '\\'; });
    if (o.policy.empty() || !printable)
      detail::throw_invalid(who, "policy must be printable ASCII without '\"' or '\\', not empty",
                            '"' + o.policy + '"');
    return o;
  }

  static keyed<bucket_type> make_buckets(const executor_type& ex, const admission_options& o) {
    return keyed<bucket_type>(ex, token_bucket_options{.rate = o.rate, .capacity = o.burst},
                              line_options{.name = o.name}, keyed_options{.max_keys = o.max_keys, .name = o.name});
  }

  // `started + wait`, saturating: a bound too long to represent (nanoseconds::max()) means none.
  static time_point deadline_after(time_point started, std::chrono::nanoseconds wait) {
    const auto room = time_point::max() - started;
    if (wait >= room) return time_point::max();
    return started + std::chrono::duration_cast<typename Clock::duration>(wait);
  }

  // The key, or nullopt (counted) when the key function threw: a 500 for that request, not an exception
  // out of a session's loop, whose handling would otherwise be every server's to write.
  template <class Body, class Fields>
  std::optional<std::string> key_of(const http::request<Body, Fields>& request) noexcept {
    if (!options_.key) return std::string();
    try {
      return options_.key(request);
    } catch (...) {
      key_errors_.fetch_add(1, std::memory_order_relaxed);
      return std::nullopt;
    }
  }

  // The global stage tried at once, as `key` in a fair line (each key its share), plainly otherwise.
  try_permit try_global(std::string_view key) {
    if (slots_.order() == queue_order::fair) return slots_.for_key(key).try_acquire();
    return slots_.try_acquire();
  }

  template <class Handler>
  void wait_global(std::string_view key, time_point deadline, Handler&& handler) {
    if (slots_.order() == queue_order::fair)
      return slots_.for_key(key).async_acquire_until(1, deadline, std::forward<Handler>(handler));
    slots_.async_acquire_until(1, deadline, std::forward<Handler>(handler));
  }

  rate_limit_state state_of(const bucket_type& bucket, time_point now) const {
    return bucket.inspect([&](const typename bucket_type::limit_type& b, const wait_stats&) {
      const double tokens = b.tokens(now);
      const auto whole = static_cast<std::int64_t>(std::max(0.0, std::floor(tokens)));
      const auto next = whole < b.capacity() ? b.ready_at(whole + 1, now) : std::nullopt;
      // No next token within the clock's range (a tiny rate): as far off as a delay can say, not "now".
      const auto until = next                    ? std::chrono::duration_cast<std::chrono::nanoseconds>(*next - now)
                         : whole < b.capacity() ? std::chrono::nanoseconds::max()
                                                : std::chrono::nanoseconds{0};
      return bucket_state(b.rate(), b.capacity(), tokens, until);
    });
  }

  // One admit(): the key's bucket, then a slot, each tried at once and then, within the deadline, waited
  // for. `stage` says which completion a resumption is.
  struct op {
    basic_admission* self;
    std::shared_ptr<const bool> alive;  // false once `self` is gone: an aborted wait then refunds nothing
    std::string key;
    bool key_failed;  // the key function threw: refused with key_error, nothing taken
    unsigned version;
    bool keep_alive;
    enum class stage : std::uint8_t { start, bucket, slot, done } at = stage::start;
    time_point started{};
    time_point deadline{};
    typename keyed<bucket_type>::handle bucket{};
    admission_result result{};

    // The rate limiter's completion, and the first call.
    template <class Self>
    void operator()(Self& s, error_code ec = {}) {
      if (at == stage::done) return s.complete(error_code{}, std::move(result));
      if (at == stage::start) return start(s);
      // A bucket wait ended.
      if (ec == net::error::operation_aborted) return s.complete(ec, admission_result{});
      if (ec) return refuse(s, refusal::rate, Clock::now());
      take_slot(s, Clock::now());
    }

    // The global stage's completion.
    template <class Self>
    void operator()(Self& s, error_code ec, rein::permit p) {
      if (ec && *alive) bucket->refund(1);  // the request was not served: its token was not used
      if (ec == net::error::operation_aborted) return s.complete(ec, admission_result{});
      if (ec == errc::closed) return refuse(s, refusal::closed, Clock::now());
      if (ec) return refuse(s, refusal::concurrency, Clock::now());
      admit(s, std::move(p), Clock::now());
    }

    template <class Self>
    void start(Self& s) {
      // async_compose passes on terminal cancellation only; the limiters' waits honour all three kinds.
      s.reset_cancellation_state(net::enable_total_cancellation());
      started = Clock::now();
      deadline = deadline_after(started, self->options_.max_wait);
      if (key_failed) return refuse(s, refusal::key_error, started);
      error_code ec;
      bucket = self->buckets_.get(key, ec);
      if (ec) return refuse(s, refusal::keys, started);
      const try_result taken = bucket->try_acquire_at(1, started);
      if (taken) return take_slot(s, started);
      const auto wait = taken.retry_after();
      if (self->options_.max_wait.count() == 0 || !wait || *wait > self->options_.max_wait)
        return refuse(s, refusal::rate, started, wait);
      at = stage::bucket;
      bucket->async_acquire_until(1, deadline, std::move(s));
    }

    template <class Self>
    void take_slot(Self& s, time_point now) {
      try_permit p = self->try_global(key);
      if (p) return admit(s, std::move(p), now);
      const bool closed = p.status() == try_status::closed;
      // exceeds_capacity and unavailable (an adaptive stage's open circuit) will not pass by waiting.
      if (closed || now >= deadline || p.status() != try_status::busy) {
        bucket->refund(1);
        return refuse(s, closed ? refusal::closed : refusal::concurrency, now);
      }
      at = stage::slot;
      self->wait_global(key, deadline, std::move(s));
    }

    template <class Self>
    void admit(Self& s, rein::permit p, time_point now) {
      result.why_ = refusal::none;
      result.permit_ = std::move(p);
      result.state_ = self->state_of(*bucket, now);
      finish(s, now);
    }

    // A refusal; `wait` is the bucket's own retry_after when it said one.
    template <class Self>
    void refuse(Self& s, refusal why, time_point now, std::optional<std::chrono::nanoseconds> wait = std::nullopt) {
      result.why_ = why;
      std::chrono::nanoseconds retry = self->options_.shed_retry_after;
      if (bucket && why != refusal::closed) {
        result.state_ = self->state_of(*bucket, now);
        if (why == refusal::rate) retry = wait ? *wait : std::chrono::seconds{result.state_->reset_seconds};
      }
      result.response_ = refusal_response(why, version, keep_alive, retry, result.state_, self->options_.policy);
      finish(s, now);
    }

    // Completes through the handler's executor, never inside async_admit itself.
    template <class Self>
    void finish(Self& s, time_point now) {
      result.waited_ = std::chrono::duration_cast<std::chrono::nanoseconds>(now - started);
      const bool immediate = at == stage::start;
      at = stage::done;
      bucket.reset();
      if (immediate) return net::post(std::move(s));
      s.complete(error_code{}, std::move(result));
    }
  };

  admission_options options_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  std::atomic<std::uint64_t> key_errors_{0};
  keyed<bucket_type> buckets_;
  Global slots_;
};

/// The admission on std::chrono::steady_clock, its global stage a semaphore.
using admission = basic_admission<>;

/// An admission whose global stage is an adaptive limiter (rein::basic_adaptive_limiter<Algorithm>, e.g.
/// algo::aimd or algo::gradient), made by the caller and given to the constructor:
/// `rein::beast::adaptive_admission<rein::algo::aimd> a(io, {.rate = 100, .burst = 10},
/// rein::aimd_limiter(io, {.initial_limit = 16, .max_limit = 256}, {.order = rein::queue_order::fair}));`
template <class Algorithm, class Clock = std::chrono::steady_clock>
using adaptive_admission = basic_admission<Clock, basic_adaptive_limiter<Algorithm, net::any_io_executor, Clock>>;

}  // namespace rein::beast
