// A metered API provider on loopback for the integration tests: a Boost.Beast HTTP/1.1 server (keep-alive)
// that admits requests under a quota of requests and tokens per period, answers 200, 429 or a random 503
// after a service latency (longer past a concurrency capacity, if it has one), and announces its quota in
// one provider's header dialect (OpenAI, Anthropic, GitHub, the IETF draft, or none). The quota arithmetic is a pure struct (provider_quota, time as an
// argument) so that it can be tested without sockets. Boost.Asio only (Beast needs it).
#pragma once

#if defined(REIN_STANDALONE_ASIO)
#error "provider_emulator.hpp needs Boost.Beast, hence Boost.Asio"
#endif

#include "loopback_listener.hpp"

#include <rein/config.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <iomanip>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rein_test {

namespace net = rein::net;

// ---- the quota, pure ---------------------------------------------------------------------------------

/// How a budget refills.
enum class quota_model {
  token_bucket,  ///< continuously, per_period units per period (OpenAI, Anthropic)
  fixed_window,  ///< all at once at every window start, origin + k * period (GitHub, the IETF draft)
};

/// One budget's limit (requests, or tokens).
struct budget_limit {
  std::int64_t per_period = 0;  ///< units admitted per period; 0: this budget does not limit
  /// Token bucket only: the bucket holds burst + 1 units, as nginx's limit_req burst (0 refuses an arrival of
  /// cost 1 sooner than 1/rate after the previous accepted one). Default: it holds per_period units, a whole
  /// period's worth, as OpenAI's buckets do.
  std::optional<std::int64_t> burst{};
};

/// What a budget says at an instant: the numbers its headers carry.
struct budget_state {
  std::int64_t limit = 0;      ///< units per period
  std::int64_t remaining = 0;  ///< units admissible at once
  std::int64_t used = 0;       ///< fixed window: units taken in this window; token bucket: capacity - remaining
  std::chrono::nanoseconds reset_after{0};        ///< until the bucket is full again, or the window ends
  std::chrono::steady_clock::time_point reset_at{};  ///< the same instant
};

/// One budget's state and arithmetic, exact in integer nanoseconds. A token bucket keeps the instant at which
/// it is full again: its backlog (that instant less now) times the rate is what it lacks.
class quota_budget {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  using nanoseconds = std::chrono::nanoseconds;

  /// Throws std::invalid_argument for a period <= 0, negative counts, or a capacity whose product with the
  /// period in nanoseconds could overflow (about 7.6e7 units for a minute).
  quota_budget(quota_model model, nanoseconds period, budget_limit limit, time_point origin)
      : model_(model), period_(period), limit_(limit), origin_(origin), full_at_(origin) {
    if (period_ <= nanoseconds::zero()) throw std::invalid_argument("quota: period must be positive");
    if (limit_.per_period < 0 || limit_.burst.value_or(0) < 0) throw std::invalid_argument("quota: negative count");
    if (capacity() > std::numeric_limits<std::int64_t>::max() / 2 / period_.count())
      throw std::invalid_argument("quota: capacity times period overflows");
  }

  bool limited() const noexcept { return limit_.per_period > 0; }

  /// The most units it can admit at once.
  std::int64_t capacity() const noexcept {
    if (model_ == quota_model::fixed_window || !limit_.burst) return limit_.per_period;
    return *limit_.burst + 1;
  }

  /// How long from `now` until `cost` units fit: zero if they fit now, nullopt if they never will (more than
  /// the capacity).
  std::optional<nanoseconds> wait_for(std::int64_t cost, time_point now) const {
    if (!limited() || cost == 0) return nanoseconds::zero();
    if (cost > capacity()) return std::nullopt;
    if (model_ == quota_model::fixed_window) {
      if (used_in(now) + cost <= limit_.per_period) return nanoseconds::zero();
      return window_end(now) - now;
    }
    // Fits once the backlog times the rate leaves room for `cost`: backlog <= (capacity - cost) / rate.
    const nanoseconds slack{(capacity() - cost) * period_.count() / limit_.per_period};
    return std::max(backlog(now) - slack, nanoseconds::zero());
  }

  /// Takes `cost` units at `now`. Precondition: wait_for(cost, now) == 0.
  void charge(std::int64_t cost, time_point now) {
    if (!limited()) return;
    if (model_ == quota_model::token_bucket) {
      full_at_ = now + backlog(now) + drain_time(cost);
      return;
    }
    if (window(now) != window_) {
      window_ = window(now);
      used_ = 0;
    }
    used_ += cost;
  }

  budget_state state(time_point now) const {
    budget_state s;
    s.limit = limit_.per_period;
    if (model_ == quota_model::fixed_window) {
      s.used = used_in(now);
      s.remaining = limit_.per_period - s.used;
      s.reset_at = window_end(now);
    } else {
      const std::int64_t lacking = backlog(now).count() * limit_.per_period;  // in units times period
      s.remaining = std::max<std::int64_t>((capacity() * period_.count() - lacking) / period_.count(), 0);
      s.used = capacity() - s.remaining;
      s.reset_at = now + backlog(now);
    }
    s.reset_after = s.reset_at - now;
    return s;
  }

 private:
  nanoseconds backlog(time_point now) const { return std::max(full_at_ - now, nanoseconds::zero()); }

  // What `cost` units add to the backlog, rounded up so that the bucket never admits more than its rate.
  nanoseconds drain_time(std::int64_t cost) const {
    return nanoseconds{(cost * period_.count() + limit_.per_period - 1) / limit_.per_period};
  }

  // The index of the window holding `now` (floor division: an instant before the origin is in window -1).
  std::int64_t window(time_point now) const {
    const std::int64_t since = (now - origin_).count();
    return since / period_.count() - (since % period_.count() < 0 ? 1 : 0);
  }

  time_point window_end(time_point now) const { return origin_ + (window(now) + 1) * period_; }
  std::int64_t used_in(time_point now) const { return window(now) == window_ ? used_ : 0; }

  quota_model model_;
  nanoseconds period_;
  budget_limit limit_;
  time_point origin_;
  time_point full_at_;  // token bucket: the instant it is full again
  std::int64_t window_ = std::numeric_limits<std::int64_t>::min();  // fixed window: the one used_ counts
  std::int64_t used_ = 0;
};

struct quota_options {
  quota_model model = quota_model::token_bucket;
  std::chrono::nanoseconds period = std::chrono::seconds{1};
  budget_limit requests{};  ///< each request costs 1
  budget_limit tokens{};    ///< each request costs its tokens
};

struct quota_decision {
  bool accepted = false;
  /// Refused: how long until the request would fit; nullopt if it never will (its cost exceeds a capacity).
  std::optional<std::chrono::nanoseconds> retry_after{};
};

/// A provider's quota: a request is admitted only if both budgets have room, and then charged to both.
class provider_quota {
 public:
  using time_point = std::chrono::steady_clock::time_point;

  /// `origin`: where the fixed windows start (origin + k * period); a token bucket starts full there.
  provider_quota(const quota_options& options, time_point origin)
      : requests_(options.model, options.period, options.requests, origin),
        tokens_(options.model, options.period, options.tokens, origin) {}

  /// One request of `tokens` (>= 0) tokens at `now`.
  quota_decision admit(std::int64_t tokens, time_point now) {
    const auto for_requests = requests_.wait_for(1, now);
    const auto for_tokens = tokens_.wait_for(tokens, now);
    if (!for_requests || !for_tokens) return {};
    const std::chrono::nanoseconds wait = std::max(*for_requests, *for_tokens);
    if (wait > std::chrono::nanoseconds::zero()) return {false, wait};
    requests_.charge(1, now);
    tokens_.charge(tokens, now);
    return {true, std::nullopt};
  }

  const quota_budget& requests() const noexcept { return requests_; }
  const quota_budget& tokens() const noexcept { return tokens_; }

 private:
  quota_budget requests_;
  quota_budget tokens_;
};

// ---- header values -----------------------------------------------------------------------------------

namespace detail {

// value / 10^digits in decimal, the fraction's trailing zeros dropped: (1500, 3) is "1.5", (2000, 3) is "2".
inline std::string trimmed_decimal(std::int64_t value, int digits) {
  std::int64_t scale = 1;
  for (int i = 0; i < digits; ++i) scale *= 10;
  std::string text = std::to_string(value / scale);
  if (value % scale == 0) return text;
  std::string fraction = std::to_string(value % scale);
  fraction.insert(0, static_cast<std::size_t>(digits) - fraction.size(), '0');
  fraction.erase(fraction.find_last_not_of('0') + 1);
  return text + '.' + fraction;
}

}  // namespace detail

/// A duration as Go's time.Duration.String writes it, as OpenAI's reset headers do: "0s", "20ms", "1.5s",
/// "6m0s", "1h2m3.5s", "250µs" (U+00B5), "7ns". Negative durations are written as "0s".
inline std::string go_duration(std::chrono::nanoseconds d) {
  const std::int64_t ns = std::max<std::int64_t>(d.count(), 0);
  constexpr std::int64_t second = 1'000'000'000;
  if (ns == 0) return "0s";
  if (ns < 1'000) return std::to_string(ns) + "ns";
  if (ns < 1'000'000) return detail::trimmed_decimal(ns, 3) + "\xC2\xB5s";
  if (ns < second) return detail::trimmed_decimal(ns, 6) + "ms";
  std::string text = detail::trimmed_decimal(ns % (60 * second), 9) + "s";
  const std::int64_t minutes = ns / (60 * second);
  if (minutes == 0) return text;
  text = std::to_string(minutes % 60) + "m" + text;
  if (minutes < 60) return text;
  return std::to_string(minutes / 60) + "h" + text;
}

/// An instant as RFC 3339 UTC with milliseconds, as Anthropic's reset headers: "2026-12-06T01:02:03.250Z".
/// Rounded up to the millisecond, so that a reset is never announced earlier than it happens.
inline std::string rfc3339_milliseconds(std::chrono::system_clock::time_point at) {
  using namespace std::chrono;
  const auto ms = ceil<milliseconds>(at);
  const auto day = floor<days>(ms);
  const year_month_day date{day};
  const hh_mm_ss<milliseconds> time{ms - day};
  std::ostringstream text;
  text << std::setfill('0') << std::setw(4) << static_cast<int>(date.year()) << '-' << std::setw(2)
       << static_cast<unsigned>(date.month()) << '-' << std::setw(2) << static_cast<unsigned>(date.day()) << 'T'
       << std::setw(2) << time.hours().count() << ':' << std::setw(2) << time.minutes().count() << ':'
       << std::setw(2) << time.seconds().count() << '.' << std::setw(3) << time.subseconds().count() << 'Z';
  return text.str();
}

/// Whole seconds, rounded up (Retry-After, the IETF draft's t).
inline std::int64_t ceil_seconds(std::chrono::nanoseconds d) {
  return std::chrono::ceil<std::chrono::seconds>(std::max(d, std::chrono::nanoseconds::zero())).count();
}

// ---- the server --------------------------------------------------------------------------------------

/// Which provider's rate-limit headers the emulator sends, and so how its quota refills.
enum class quota_dialect {
  openai,     ///< token buckets; x-ratelimit-{limit,remaining,reset}-{requests,tokens}, reset a Go duration
  anthropic,  ///< token buckets; anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}, reset RFC 3339
  github,     ///< fixed windows; x-ratelimit-{limit,remaining,used,reset}, reset in epoch seconds (requests)
  ietf,       ///< fixed windows; RateLimit-Policy and RateLimit (draft-ietf-httpapi-ratelimit-headers)
  none,       ///< token buckets; no rate-limit headers
};

constexpr quota_model model_of(quota_dialect dialect) noexcept {
  return dialect == quota_dialect::github || dialect == quota_dialect::ietf ? quota_model::fixed_window
                                                                             : quota_model::token_bucket;
}

/// Service time before each answer: uniform in [low, high]; low == high is a fixed latency.
struct latency_range {
  std::chrono::nanoseconds low{0};
  std::chrono::nanoseconds high{0};
};

struct provider_options {
  quota_dialect dialect = quota_dialect::openai;
  std::chrono::nanoseconds period = std::chrono::seconds{1};  ///< whole seconds for github and ietf
  budget_limit requests{};  ///< requests per period (each request costs 1)
  budget_limit tokens{};    ///< tokens per period (a request costs its `x-tokens` header, default 1)
  bool retry_after = true;  ///< a 429 carries Retry-After: whole seconds until the request would fit
  double failure_share = 0;  ///< share of requests answered 503, drawn before the quota (they charge nothing)
  latency_range latency{};   ///< the delay before each answer, on an Asio timer
  /// Not 0: the delay before each answer is the request's `x-tokens` times this instead (`latency` unused):
  /// a payload the client chose and knows, whose size the service time follows (an LLM answer's tokens).
  std::chrono::nanoseconds latency_per_token{0};
  std::uint64_t seed = 1;    ///< of the 503 draws and the latencies
  /// Requests served at once (its workers, an LLM server's batch slots); 0: any number. A request that finds
  /// every worker busy waits for one, first come first served, and then takes its drawn latency: a server
  /// that queues what it cannot serve at once, so that a client sending more at once gains no throughput and
  /// only waits longer (the latency it sees grows with the queue, which is what a limiter can learn from).
  std::size_t capacity = 0;
  /// More requests in the server than this (waiting for a worker or served, itself included): answered 503
  /// after its drawn latency, without a worker, an overload; 0: never. Counted apart from the random 503s
  /// (overloaded()).
  std::size_t hard_cap = 0;
};

/// The emulated provider: listens on 127.0.0.1 at a free port from the constructor on, on a thread of its
/// own, until the destructor. Every request (any method, any target) is answered, in this order:
/// 400 if `x-tokens` is not a non-negative integer; 503 past the hard cap; 503 for a random share; 429 if the
/// quota refuses it (with Retry-After if configured and the request can ever fit); else 200 with
/// `x-usage-tokens: <cost>`. A request is in the server from when it has been read until its answer is sent.
/// The quota is decided when the request has been read, on steady_clock; the latency comes after. Every
/// answer but the 400 carries the dialect's headers, as of that decision.
class provider_emulator {
 public:
  using clock = std::chrono::steady_clock;

  /// Throws std::invalid_argument for options it cannot emulate, and Asio's system_error if it cannot listen.
  explicit provider_emulator(provider_options options = {})
      : options_(checked(options)),
        anchor_(anchor_at_window_start(options_.period)),
        quota_({model_of(options_.dialect), options_.period, options_.requests, options_.tokens}, anchor_.steady),
        failures_(options_.seed),
        latencies_(options_.seed ^ 0x9E3779B97F4A7C15ULL) {
    listener_.start([this](tcp::socket socket) {
      boost::system::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      net::co_spawn(listener_.io(), serve(std::move(socket)), net::detached);
    });
  }

  provider_emulator(const provider_emulator&) = delete;
  provider_emulator& operator=(const provider_emulator&) = delete;

  unsigned short port() const noexcept { return listener_.port(); }
  /// "http://127.0.0.1:<port><path>"
  std::string url(std::string_view path) const { return listener_.url(path); }

  std::uint64_t accepted() const noexcept { return accepted_.load(); }  ///< answered 200
  std::uint64_t refused() const noexcept { return refused_.load(); }    ///< answered 429
  std::uint64_t failed() const noexcept { return failed_.load(); }      ///< answered 503
  std::uint64_t bad_requests() const noexcept { return bad_.load(); }   ///< answered 400
  std::uint64_t tokens_accepted() const noexcept { return tokens_.load(); }  ///< tokens of the 200s
  std::uint64_t overloaded() const noexcept { return overloaded_.load(); }   ///< 503s past the hard cap
  std::size_t in_server() const noexcept { return inside_.load(); }  ///< requests in the server now
  std::size_t peak_in_server() const noexcept { return peak_.load(); }  ///< the most in the server at once

  /// When each 200 was decided, in order (the instant its quota was charged).
  std::vector<clock::time_point> accepted_times() const {
    const std::lock_guard lock(mutex_);
    return accepted_times_;
  }

  /// How many 200s were decided in [from, to).
  std::size_t accepted_between(clock::time_point from, clock::time_point to) const {
    const std::lock_guard lock(mutex_);
    return static_cast<std::size_t>(std::count_if(accepted_times_.begin(), accepted_times_.end(),
                                                  [&](clock::time_point t) { return t >= from && t < to; }));
  }

  /// The system_clock instant of a steady_clock one, as the headers state it.
  std::chrono::system_clock::time_point to_system(clock::time_point at) const {
    return anchor_.system + std::chrono::duration_cast<std::chrono::system_clock::duration>(at - anchor_.steady);
  }

 private:
  using tcp = net::ip::tcp;
  using request = boost::beast::http::request<boost::beast::http::string_body>;
  using response = boost::beast::http::response<boost::beast::http::string_body>;

  // One instant on both clocks, at a multiple of the period since the epoch: the fixed windows start there,
  // so that their ends are whole epoch seconds when the period is whole seconds.
  struct clock_anchor {
    clock::time_point steady;
    std::chrono::system_clock::time_point system;
  };

  static clock_anchor anchor_at_window_start(std::chrono::nanoseconds period) {
    const auto system_now = std::chrono::system_clock::now();
    const auto steady_now = clock::now();
    const auto into = std::chrono::duration_cast<std::chrono::nanoseconds>(system_now.time_since_epoch()) % period;
    return {steady_now - into, system_now - std::chrono::duration_cast<std::chrono::system_clock::duration>(into)};
  }

  static provider_options checked(provider_options o) {
    if (o.period <= std::chrono::nanoseconds::zero()) throw std::invalid_argument("provider: period must be positive");
    if (model_of(o.dialect) == quota_model::fixed_window && o.period % std::chrono::seconds{1} != o.period.zero())
      throw std::invalid_argument("provider: github and ietf windows must be whole seconds");
    if (o.failure_share < 0 || o.failure_share > 1) throw std::invalid_argument("provider: failure_share not in [0, 1]");
    if (o.latency.low < o.latency.low.zero() || o.latency.high < o.latency.low)
      throw std::invalid_argument("provider: latency needs 0 <= low <= high");
    if (o.latency_per_token < o.latency_per_token.zero()) throw std::invalid_argument("provider: latency_per_token < 0");
    return o;
  }

  // One keep-alive connection: requests are answered in order, each after its latency.
  net::awaitable<void> serve(tcp::socket socket) {
    namespace http = boost::beast::http;
    boost::beast::tcp_stream stream(std::move(socket));
    boost::beast::flat_buffer buffer;
    net::steady_timer service(co_await net::this_coro::executor);
    for (;;) {
      request in;
      auto [read_error, read] = co_await http::async_read(stream, buffer, in, net::as_tuple(net::use_awaitable));
      if (read_error) break;
      const std::size_t inside = ++inside_;  // this thread's only writer; atomic for the readers
      if (inside > peak_.load()) peak_ = inside;
      response out = answer(in, inside);
      const bool worker = options_.capacity != 0 && !overload(inside);
      if (worker) co_await take_worker();
      if (const std::chrono::nanoseconds latency = latency_of(in); latency > latency.zero()) {
        service.expires_after(latency);
        co_await service.async_wait(net::as_tuple(net::use_awaitable));
      }
      if (worker) release_worker();
      --inside_;
      auto [write_error, written] = co_await http::async_write(stream, out, net::as_tuple(net::use_awaitable));
      if (write_error || !out.keep_alive()) break;
    }
    boost::beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
  }

  bool overload(std::size_t inside) const noexcept { return options_.hard_cap != 0 && inside > options_.hard_cap; }

  // Waits until a worker is free, first come first served.
  net::awaitable<void> take_worker() {
    if (busy_ < options_.capacity && waiting_.empty()) {
      ++busy_;
      co_return;
    }
    net::steady_timer turn(co_await net::this_coro::executor, clock::time_point::max());
    waiting_.push_back(&turn);
    co_await turn.async_wait(net::as_tuple(net::use_awaitable));  // release_worker() hands its worker over
  }

  void release_worker() {
    if (waiting_.empty()) {
      --busy_;
      return;
    }
    waiting_.front()->cancel();
    waiting_.pop_front();
  }

  response answer(const request& in, std::size_t inside) {
    namespace http = boost::beast::http;
    response out{http::status::ok, in.version()};
    out.keep_alive(in.keep_alive());
    out.set(http::field::content_type, "application/json");
    const std::optional<std::int64_t> cost = tokens_of(in);
    const clock::time_point now = clock::now();
    if (!cost) {
      ++bad_;
      return finish(std::move(out), http::status::bad_request, R"({"error":"x-tokens is not a count"})");
    }
    if (overload(inside)) {
      ++overloaded_;
      announce(out, now);
      return finish(std::move(out), http::status::service_unavailable, R"({"error":"overloaded"})");
    }
    if (options_.failure_share > 0 && std::bernoulli_distribution(options_.failure_share)(failures_)) {
      ++failed_;
      announce(out, now);
      return finish(std::move(out), http::status::service_unavailable, R"({"error":"unavailable"})");
    }
    const quota_decision decision = quota_.admit(*cost, now);
    announce(out, now);
    if (!decision.accepted) {
      ++refused_;
      if (options_.retry_after && decision.retry_after)
        out.set(http::field::retry_after, std::to_string(ceil_seconds(*decision.retry_after)));
      return finish(std::move(out), http::status::too_many_requests, R"({"error":"rate_limited"})");
    }
    record_accepted(*cost, now);
    out.set("x-usage-tokens", std::to_string(*cost));
    return finish(std::move(out), http::status::ok, R"({"ok":true})");
  }

  static response finish(response out, boost::beast::http::status status, std::string_view body) {
    out.result(status);
    out.body() = std::string(body);
    out.prepare_payload();
    return out;
  }

  // The request's `x-tokens` (default 1), or nullopt if it is not a non-negative integer.
  static std::optional<std::int64_t> tokens_of(const request& in) {
    const auto field = in.find("x-tokens");
    if (field == in.end()) return 1;
    const auto value = field->value();
    std::int64_t tokens = -1;
    const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), tokens);
    if (error != std::errc{} || end != value.data() + value.size() || tokens < 0) return std::nullopt;
    return tokens;
  }

  void record_accepted(std::int64_t cost, clock::time_point now) {
    {
      const std::lock_guard lock(mutex_);
      accepted_times_.push_back(now);
    }
    tokens_ += static_cast<std::uint64_t>(cost);
    ++accepted_;
  }

  // The request's delay: its tokens' with latency_per_token, else drawn.
  std::chrono::nanoseconds latency_of(const request& in) {
    if (options_.latency_per_token == options_.latency_per_token.zero()) return draw_latency();
    return options_.latency_per_token * tokens_of(in).value_or(0);
  }

  std::chrono::nanoseconds draw_latency() {
    const latency_range& l = options_.latency;
    if (l.low == l.high) return l.low;
    return std::chrono::nanoseconds{std::uniform_int_distribution<std::int64_t>(l.low.count(), l.high.count())(latencies_)};
  }

  void announce(response& out, clock::time_point now) const {
    switch (options_.dialect) {
      case quota_dialect::openai:
        openai_headers(out, "requests", quota_.requests(), now);
        openai_headers(out, "tokens", quota_.tokens(), now);
        break;
      case quota_dialect::anthropic:
        anthropic_headers(out, "requests", quota_.requests(), now);
        anthropic_headers(out, "tokens", quota_.tokens(), now);
        break;
      case quota_dialect::github: github_headers(out, quota_.requests(), now); break;
      case quota_dialect::ietf: ietf_headers(out, now); break;
      case quota_dialect::none: break;
    }
  }

  static void openai_headers(response& out, const std::string& name, const quota_budget& budget, clock::time_point now) {
    if (!budget.limited()) return;
    const budget_state s = budget.state(now);
    out.set("x-ratelimit-limit-" + name, std::to_string(s.limit));
    out.set("x-ratelimit-remaining-" + name, std::to_string(s.remaining));
    out.set("x-ratelimit-reset-" + name, go_duration(s.reset_after));
  }

  void anthropic_headers(response& out, const std::string& name, const quota_budget& budget, clock::time_point now) const {
    if (!budget.limited()) return;
    const budget_state s = budget.state(now);
    out.set("anthropic-ratelimit-" + name + "-limit", std::to_string(s.limit));
    out.set("anthropic-ratelimit-" + name + "-remaining", std::to_string(s.remaining));
    out.set("anthropic-ratelimit-" + name + "-reset", rfc3339_milliseconds(to_system(s.reset_at)));
  }

  // GitHub has one count per resource: the requests.
  void github_headers(response& out, const quota_budget& budget, clock::time_point now) const {
    if (!budget.limited()) return;
    const budget_state s = budget.state(now);
    const auto reset = std::chrono::floor<std::chrono::seconds>(to_system(s.reset_at));  // exact: whole seconds
    out.set("x-ratelimit-limit", std::to_string(s.limit));
    out.set("x-ratelimit-remaining", std::to_string(s.remaining));
    out.set("x-ratelimit-used", std::to_string(s.used));
    out.set("x-ratelimit-reset", std::to_string(reset.time_since_epoch().count()));
  }

  // Structured-field lists: the requests as policy "default", the tokens as policy "tokens".
  void ietf_headers(response& out, clock::time_point now) const {
    std::string policies, limits;
    const auto add = [&](std::string_view name, const quota_budget& budget) {
      if (!budget.limited()) return;
      const budget_state s = budget.state(now);
      const std::string separator = policies.empty() ? "" : ", ";
      const std::string key = separator + '"' + std::string(name) + '"';
      policies += key + ";q=" + std::to_string(s.limit) + ";w=" + std::to_string(ceil_seconds(options_.period));
      limits += key + ";r=" + std::to_string(s.remaining) + ";t=" + std::to_string(ceil_seconds(s.reset_after));
    };
    add("default", quota_.requests());
    add("tokens", quota_.tokens());
    if (policies.empty()) return;
    out.set("RateLimit-Policy", policies);
    out.set("RateLimit", limits);
  }

  provider_options options_;
  clock_anchor anchor_;
  provider_quota quota_;           // the server thread's only
  std::mt19937_64 failures_;       // the server thread's only
  std::mt19937_64 latencies_;      // the server thread's only
  std::atomic<std::uint64_t> accepted_{0}, refused_{0}, failed_{0}, bad_{0}, tokens_{0}, overloaded_{0};
  std::atomic<std::size_t> inside_{0}, peak_{0};  // written by the server thread only
  std::size_t busy_ = 0;                          // workers serving: the server thread's only
  std::deque<net::steady_timer*> waiting_;        // requests waiting for a worker: the server thread's only
  mutable std::mutex mutex_;
  std::vector<clock::time_point> accepted_times_;  // under mutex_
  loopback_listener listener_;  // last: its thread stops before the members above are destroyed
};

}  // namespace rein_test
