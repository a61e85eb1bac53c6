// The throttle guard: quota gate, then rate, then per-key and global concurrency, around one outbound call.
#pragma once

#include <rein/config.hpp>
#include <rein/detail/clock_time.hpp>
#include <rein/detail/format.hpp>
#include <rein/error.hpp>
#include <rein/keyed.hpp>
#include <rein/observer.hpp>
#include <rein/outcome.hpp>
#include <rein/permit.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/associator.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/error.hpp>
#include <asio/use_awaitable.hpp>
#else
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/associator.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/use_awaitable.hpp>
#endif

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace rein {

/// Marks a throttle stage that is not used: `rein::throttle t(rein::unlimited, rate, global, per_host);`.
struct unlimited_t {
  /// Constructible only explicitly (use the constant rein::unlimited).
  explicit constexpr unlimited_t(int) noexcept {}
};
inline constexpr unlimited_t unlimited{0};

/// The stages of a throttle, in the order a caller passes them.
enum class throttle_stage : std::uint8_t {
  none,     ///< not rejected
  gate,     ///< the key's quota gate is paused (a 429 said so)
  rate,     ///< no rate token now
  per_key,  ///< the key's concurrency limit is reached (or the key could not be made: too many keys)
  global,   ///< the global concurrency limit is reached
};

/// Options of a throttle.
struct throttle_options {
  /// The pause applied by `guard.reject()` when the upstream gave no usable Retry-After (1 to 5 s is
  /// usual). Must be > 0.
  std::chrono::nanoseconds default_pause{std::chrono::seconds(1)};
  /// Names the throttle in events, metrics and error messages. Default: none.
  std::string name{};
  /// Called with every rejection (reason gate, rate, per_key or global for a try_acquire refused at that
  /// stage; timed_out, queue_full, closed, exceeds_capacity or cancelled for a waiting acquire that failed),
  /// on the caller's thread, never under a lock; see rein::limiter_observer. Each stage's limiter has its own
  /// observer too. Default: none (no cost).
  limiter_observer observer{};
};

/// Counters of a throttle (each stage's own limiter has its own snapshot too), read without a lock: each
/// counter is exact, two counters may be a moment apart.
struct throttle_snapshot {
  std::uint64_t acquired_total = 0;          ///< guards handed out (as every limiter's acquired_total)
  std::uint64_t admitted_total = 0;          ///< the same (the former name)
  std::size_t in_flight = 0;                 ///< admitted guards not yet completed or destroyed
  std::uint64_t rejected_total = 0;          ///< the sum of the reasons for_each_rejected() lists
  std::uint64_t rejected_gate = 0;           ///< try_acquire refused at the gate
  std::uint64_t rejected_rate = 0;           ///< try_acquire refused at the rate stage
  std::uint64_t rejected_per_key = 0;        ///< try_acquire refused at the per-key stage
  std::uint64_t rejected_global = 0;         ///< try_acquire refused at the global stage
  std::uint64_t timed_out_total = 0;         ///< waiting acquires that failed with errc::timed_out
  std::uint64_t queue_full_total = 0;        ///< ... with errc::queue_full (a stage's line, or too many keys)
  std::uint64_t closed_total = 0;            ///< ... with errc::closed
  std::uint64_t exceeds_capacity_total = 0;  ///< ... with errc::exceeds_capacity
  std::uint64_t cancelled_total = 0;         ///< ... with operation_aborted (not a rejection)
  std::uint64_t failed_total = 0;            ///< waiting acquires that failed (any error, cancellation included)
  std::uint64_t rejections_reported = 0;     ///< guard.reject() calls (upstream 429s)

  /// Calls f(reject_reason, std::uint64_t count) for each reason summed in rejected_total.
  template <class F>
  void for_each_rejected(F&& f) const {
    f(reject_reason::gate, rejected_gate);
    f(reject_reason::rate, rejected_rate);
    f(reject_reason::per_key, rejected_per_key);
    f(reject_reason::global, rejected_global);
    f(reject_reason::timed_out, timed_out_total);
    f(reject_reason::queue_full, queue_full_total);
    f(reject_reason::closed, closed_total);
    f(reject_reason::exceeds_capacity, exceeds_capacity_total);
  }
};

/// One line: `acquired=100 in_flight=4 rejected=7 (rate=5 timed_out=2) cancelled=0 failed=2 reported=1`.
inline std::ostream& operator<<(std::ostream& os, const throttle_snapshot& s) {
  os << "acquired=" << s.acquired_total << " in_flight=" << s.in_flight << ' ';
  detail::write_rejected(os, s);
  os << " cancelled=" << s.cancelled_total << " failed=" << s.failed_total << " reported=" << s.rejections_reported;
  return os;
}

namespace detail {

template <class T>
inline constexpr bool is_unlimited_v = std::is_same_v<std::remove_cvref_t<T>, unlimited_t>;

template <class T>
struct is_keyed : std::false_type {};
template <class L, class K, class M, class H, class E>
struct is_keyed<keyed<L, K, M, H, E>> : std::true_type {};

// The limiter type a stage's operations run on: a keyed registry's limiter, or the stage itself.
template <class T, class = void>
struct stage_limiter {
  using type = T;
};
template <class T>
struct stage_limiter<T, std::enable_if_t<is_keyed<T>::value>> {
  using type = typename T::limiter_type;
};

template <class T, bool = is_unlimited_v<T>>
struct stage_clock {
  using type = typename stage_limiter<T>::type::clock_type;
};
template <class T>
struct stage_clock<T, true> {
  using type = void;
};

// Stands in for the keyed handle of a stage that is not used.
struct no_handle {
  explicit operator bool() const noexcept { return false; }
  void reset() noexcept {}
};

// The handle a guard keeps to pin a keyed stage's limiter (rein::keyed::handle), or no_handle.
template <class Keyed, bool = is_unlimited_v<Keyed>>
struct handle_of {
  using type = typename Keyed::handle;
};
template <class Keyed>
struct handle_of<Keyed, true> {
  using type = no_handle;
};

template <class... Clocks>
struct first_clock {
  using type = std::chrono::steady_clock;
};
template <class C, class... Rest>
struct first_clock<C, Rest...> {
  using type = std::conditional_t<std::is_void_v<C>, typename first_clock<Rest...>::type, C>;
};

// Every stage takes a count (acquire(n)); the throttle charges 1 at each.
template <class L>
bool try_one(L& limiter) {
  return static_cast<bool>(limiter.try_acquire(std::size_t{1}));
}

template <class L>
auto try_one_permit(L& limiter) {
  return limiter.try_acquire(std::size_t{1});
}

// What a cancellation of async_acquire reaches: the stage being waited on (bound to `signal`), and the stages
// not yet started (`requested`). Shared by the initiation, its coroutine and the canceller in the caller's slot.
// Touched only on the handler's executor, where the coroutine runs and where Asio has the caller emit.
struct throttle_cancellation {
  net::cancellation_signal signal;
  std::atomic<bool> requested{false};
};

// Installed in the caller's cancellation slot at initiation, so that a cancellation emitted before the spawned
// coroutine first runs is not lost (co_spawn's own state would see only a terminal one, and only until the
// coroutine resets it). Every type is forwarded as it came: each stage honours terminal, partial and total.
struct throttle_canceller {
  explicit throttle_canceller(std::shared_ptr<throttle_cancellation> s) noexcept : state(std::move(s)) {}

  std::shared_ptr<throttle_cancellation> state;

  void operator()(net::cancellation_type_t type) const {
    if ((type & (net::cancellation_type::terminal | net::cancellation_type::partial | net::cancellation_type::total)) ==
        net::cancellation_type::none)
      return;
    state->requested.store(true, std::memory_order_relaxed);
    state->signal.emit(type);
  }
};

// Waits for one unit of a stage.
template <class L, class TimePoint, class Token>
auto wait_one(L& limiter, TimePoint deadline, Token token) {
  return limiter.async_acquire_until(std::size_t{1}, deadline, std::move(token));
}

// Makes a co_spawn completion (exception_ptr, pair<error_code, Guard>) into the (error_code, Guard) a caller
// of async_acquire expects, keeping the handler's executor and allocator. Its cancellation slot is not shown to
// co_spawn (the throttle_canceller serves it); it is cleared before the handler runs, as Asio's operations do.
//
// run() reports its errors as error codes; a rein::system_error that still reaches here means that run() took
// nothing, and it becomes an error code too, as the completion signature promises. Any other exception
// (bad_alloc) is rethrown out of the handler, as co_spawn with `detached` would.
template <class Handler>
struct spawn_adapter {
  Handler handler;
  std::shared_ptr<throttle_cancellation> cancellation;

  using cancellation_slot_type = net::cancellation_slot;
  cancellation_slot_type get_cancellation_slot() const noexcept { return {}; }

  template <class Guard>
  void operator()(std::exception_ptr e, std::pair<error_code, Guard> result) {
    if (cancellation) net::get_associated_cancellation_slot(handler).clear();
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const system_error& error) {
        result.first = error.code();
      }
    }
    std::move(handler)(result.first, std::move(result.second));
  }
};

// Whether a key's gate would stop a caller now. A quota gate says so directly (is_paused); for any other gate
// limiter, a try_acquire that fails says the same (it consumes nothing when it succeeds: a gate holds nothing).
template <class Gate>
bool gate_closed(Gate& gate) {
  if constexpr (requires { { gate.is_paused() } -> std::convertible_to<bool>; }) return gate.is_paused();
  else return !try_one(gate);
}

}  // namespace detail
}  // namespace rein

/// @cond
template <template <class, class> class Associator, class Handler, class DefaultCandidate>
struct REIN_ASIO_NAMESPACE::associator<Associator, rein::detail::spawn_adapter<Handler>, DefaultCandidate>
    : Associator<Handler, DefaultCandidate> {
  static typename Associator<Handler, DefaultCandidate>::type get(const rein::detail::spawn_adapter<Handler>& h,
                                                                  const DefaultCandidate& c = DefaultCandidate()) noexcept {
    return Associator<Handler, DefaultCandidate>::get(h.handler, c);
  }
};
/// @endcond

namespace rein {

template <class Gates, class Rate, class Global, class PerKey>
class throttle;

/// What a throttle hands out: everything one call holds (a per-key and a global permit), and the key's gate
/// so that a 429 can pause the key for everyone.
///
/// RAII: destroying it without an outcome releases everything and reports `outcome::ignored` (a caller
/// cancelled mid-call loses nothing and teaches the adaptive limiters nothing). Move-only; empty when
/// default-constructed, moved from, completed, or refused by try_acquire (then rejected_at() says where).
///
/// @par Thread Safety
/// One guard is used by one caller at a time; distinct guards from any threads.
template <class Throttle>
class throttle_guard {
 public:
  /// A duration of `clock_type`.
  using duration = typename Throttle::duration;

  throttle_guard() noexcept = default;
  /// Takes over `other`'s stages; `other` becomes empty (it gives nothing back).
  throttle_guard(throttle_guard&& other) noexcept { take(other); }
  /// Gives back what this guard holds (as its destructor would), then takes over `other`'s stages.
  throttle_guard& operator=(throttle_guard&& other) noexcept {
    if (this != &other) {
      reset();
      take(other);
    }
    return *this;
  }
  throttle_guard(const throttle_guard&) = delete;
  throttle_guard& operator=(const throttle_guard&) = delete;
  ~throttle_guard() { reset(); }

  /// True when the call may go ahead (every stage admitted it) and no outcome has been reported yet.
  explicit operator bool() const noexcept { return admitted_; }

  /// Where try_acquire refused (throttle_stage::none for an admitted guard).
  throttle_stage rejected_at() const noexcept { return rejected_at_; }

  /// Reports how the call went (feeds adaptive limiters at every stage) and releases everything. Does
  /// nothing on an empty guard.
  void complete(outcome result) noexcept {
    key_permit_.complete(result);
    global_permit_.complete(result);
    if (admitted_) owner_->count_finished();
    admitted_ = false;
    unpin();
  }

  /// Reports an HTTP status through rein::classify_http_status and releases everything.
  void complete_http(int status) noexcept { complete(classify_http_status(status)); }

  /// The upstream said "too many requests" (429, or 503 with Retry-After): pauses this key's gate for
  /// everyone for `retry_after` (the throttle's default_pause when absent), counts as congestion, releases.
  /// The pause starts before the permits go back, so the caller next in line for this key sees it and waits
  /// at the gate instead of sending into the pause. Does nothing on an empty guard.
  /// A `retry_after` of zero pauses not at all (the upstream said "go ahead"); a negative one says nothing
  /// usable and pauses for default_pause, as an unparseable Retry-After field does (quota_gate's
  /// on_retry_after).
  void reject(std::optional<duration> retry_after = std::nullopt) {
    if (!admitted_) return;
    if constexpr (Throttle::has_gates) {
      if (retry_after && *retry_after < duration::zero()) retry_after.reset();
      if (gate_) gate_->pause_for(retry_after.value_or(owner_->default_pause()));
    }
    owner_->count_rejection();
    complete(outcome::congestion);
  }

  /// As reject(), from the raw Retry-After field value (delta-seconds or an HTTP-date, RFC 9110 section
  /// 10.2.3; parsed by rein::parse_retry_after; absent or garbage means the default pause).
  void reject(std::string_view retry_after_value) {
    if (!admitted_) return;
    if constexpr (Throttle::has_gates) {
      if (gate_) gate_->on_retry_after(retry_after_value, owner_->default_pause());
    }
    owner_->count_rejection();
    complete(outcome::congestion);
  }

 private:
  friend Throttle;
  using gate_handle = typename Throttle::gate_handle;
  using key_handle = typename Throttle::key_handle;

  explicit throttle_guard(Throttle* owner) noexcept : owner_(owner) {}

  void take(throttle_guard& other) noexcept {
    owner_ = std::exchange(other.owner_, nullptr);
    gate_ = std::move(other.gate_);
    key_ = std::move(other.key_);
    key_permit_ = std::move(other.key_permit_);
    global_permit_ = std::move(other.global_permit_);
    rate_tokens_ = std::exchange(other.rate_tokens_, 0);
    admitted_ = std::exchange(other.admitted_, false);
    rejected_at_ = std::exchange(other.rejected_at_, throttle_stage::none);
  }

  // Not admitted: whatever was taken goes back, rate tokens included. Admitted: permits report ignored.
  void reset() noexcept {
    if (!admitted_ && rate_tokens_ != 0 && owner_ != nullptr) owner_->refund_rate(rate_tokens_);
    rate_tokens_ = 0;
    key_permit_.release();
    global_permit_.release();
    unpin();
    if (admitted_) owner_->count_finished();
    admitted_ = false;
  }

  // The key's limiters stay pinned (not evictable) until their permits are back: a release still runs inside
  // the key's limiter when its permit count drops to zero, and an eviction must not destroy it meanwhile.
  void unpin() noexcept {
    key_.reset();
    gate_.reset();
  }

  Throttle* owner_ = nullptr;
  gate_handle gate_{};
  key_handle key_{};
  permit key_permit_{};
  permit global_permit_{};
  std::size_t rate_tokens_ = 0;
  bool admitted_ = false;
  throttle_stage rejected_at_ = throttle_stage::none;
};

/// Composes a quota gate per key, a rate limiter, a per-key concurrency limiter and a global concurrency
/// limiter around each outbound call:
///
/// ```
/// rein::keyed<rein::quota_gate> gates(io);                      // a 429 pauses that host for every caller
/// rein::token_bucket rate(io, {.rate = 100, .capacity = 20});   // 100 starts per second, bursts of 20
/// rein::tuned_aimd_limiter global(io);                          // calls in flight, limit found by feedback
/// rein::keyed<rein::semaphore> per_host(io, {}, std::size_t{4});  // at most 4 in flight per host
/// rein::throttle throttle(gates, rate, global, per_host);
///
/// auto guard = co_await throttle.acquire(host);               // gate, rate, per-host, global
/// auto response = co_await http_get(host, "/v1/items");       // your call
/// if (response.status == 429) {
///   guard.reject(response.retry_after);                       // pause the host, count congestion
/// } else {
///   guard.complete_http(response.status);                     // success feeds the adaptive limit
/// }
/// ```
/// (From examples/quick_tour.cpp, a complete program, less its counters.)
///
/// Any stage may be `rein::unlimited`. The throttle refers to the stages (it does not own them): they must
/// outlive it, and each stays usable on its own (snapshots, set_rate, pause_for).
///
/// Order of the stages, and why:
/// 1. the key's gate: while a 429 pause runs, nothing of that key proceeds or takes anything;
/// 2. the rate: a rate wait never holds a concurrency slot;
/// 3. the per-key permit, then 4. the global permit. rein takes the
///    per-key permit first, because a caller waiting for a busy key while holding a global slot would let one
///    slow key's backlog hold the global slots other keys need. With every caller taking at most one key
///    permit and then the global one, the order is the same for all, so no order of calls can deadlock.
/// 5. the gate again: a pause that began while the caller waited at stages 2 to 4 (a 429 answered to a call
///    of the same key) sends it back to the gate, giving its permits back (its rate token is kept), so the
///    callers queued for a key do not take turns discovering its limit.
/// A stage that fails, times out or is cancelled gives back everything earlier stages took, rate tokens
/// included (refunded), so a refused request consumes nothing anywhere. try_acquire, which never waits,
/// takes the rate last, after both permits: a refusal there then never touches the rate limiter at all.
///
/// @tparam Gates  rein::keyed<rein::quota_gate> (or any keyed limiter with pause_for), or rein::unlimited_t.
/// @tparam Rate   any rein rate limiter (token_bucket, sliding_window, rate_limits, adaptive_rate_limiter,
///                redis shared bucket...) with async_acquire_until(n, deadline, token), try_acquire(n) and
///                refund(n); or rein::unlimited_t.
/// @tparam Global a concurrency limiter completing with a rein::permit (semaphore, adaptive_limiter), or
///                rein::unlimited_t.
/// @tparam PerKey rein::keyed<a concurrency limiter>, or rein::unlimited_t.
///
/// @par Thread Safety
/// Safe from many threads when the stages are (rein's default, std::mutex, variants are).
template <class Gates, class Rate, class Global, class PerKey>
class throttle {
 public:
  /// Whether the stage is used (not rein::unlimited): the quota gates.
  static constexpr bool has_gates = !detail::is_unlimited_v<Gates>;
  /// Whether the stage is used (not rein::unlimited): the rate limiter.
  static constexpr bool has_rate = !detail::is_unlimited_v<Rate>;
  /// Whether the stage is used (not rein::unlimited): the global concurrency limiter.
  static constexpr bool has_global = !detail::is_unlimited_v<Global>;
  /// Whether the stage is used (not rein::unlimited): the per-key concurrency limiters.
  static constexpr bool has_per_key = !detail::is_unlimited_v<PerKey>;

  /// The stages' clock (the first stage that has one; they must agree), which times the deadlines.
  using clock_type = typename detail::first_clock<typename detail::stage_clock<Gates>::type,
                                                  typename detail::stage_clock<Rate>::type,
                                                  typename detail::stage_clock<Global>::type,
                                                  typename detail::stage_clock<PerKey>::type>::type;
  /// A point in time of `clock_type`.
  using time_point = typename clock_type::time_point;
  /// A duration of `clock_type`.
  using duration = typename clock_type::duration;
  /// The key of the per-key stages (a host, a tenant).
  using key_type = std::string;
  /// What acquire() gives: the stages taken, given back when it is destroyed.
  using guard = throttle_guard<throttle>;

  /// The gate handle a guard keeps (pins the key's gate while the call runs, for reject()).
  using gate_handle = typename detail::handle_of<Gates>::type;
  /// The per-key handle a guard keeps (pins the key's limiter until its permit is back).
  using key_handle = typename detail::handle_of<PerKey>::type;

  /// Composes the stages (references; they must outlive the throttle). Pass rein::unlimited for a stage not
  /// used. @throws std::invalid_argument if options.default_pause <= 0.
  throttle(Gates& gates, Rate& rate, Global& global, PerKey& per_key, throttle_options options = {})
      : gates_(&gates), rate_(&rate), global_(&global), per_key_(&per_key), options_(validated(options)) {}

  throttle(const throttle&) = delete;
  throttle& operator=(const throttle&) = delete;

  /// Passes every stage for `key` inside a coroutine: `auto guard = co_await throttle.acquire(host);`.
  ///
  /// Stages that can admit at once do so without suspending; each stage that must wait waits through its
  /// own limiter (FIFO there). Cancelling the awaiting coroutine (any cancellation type) cancels the stage it
  /// is in and gives back what earlier stages took. Throws rein::system_error: errc::timed_out, errc::closed,
  /// errc::queue_full (a stage's waiting line is full, or too many keys), errc::exceeds_capacity,
  /// operation_aborted.
  net::awaitable<guard> acquire(std::string_view key) { return acquire_until(key, time_point::max()); }

  /// As acquire(key), failing with errc::timed_out unless every stage admits within `timeout` (one deadline
  /// covers all stages).
  net::awaitable<guard> acquire_for(std::string_view key, duration timeout) {
    return acquire_until(key, detail::deadline_after<clock_type>(timeout));
  }

  /// As acquire(key), failing with errc::timed_out unless every stage admits by `deadline`.
  net::awaitable<guard> acquire_until(std::string_view key, time_point deadline) {
    auto [ec, g] = co_await run<false>(std::string(key), deadline, nullptr);
    if (ec)
      throw system_error(ec, options_.name.empty() ? std::string("rein::throttle::acquire")
                                                   : "rein::throttle \"" + options_.name + "\"::acquire");
    co_return std::move(g);
  }

  /// The initiating function: every Asio completion token works; signature `void(error_code, guard)`.
  ///
  /// @par Per-Operation Cancellation
  /// terminal, partial and total: the stage being waited on is cancelled and the operation completes with
  /// operation_aborted; what earlier stages took is given back. A cancellation emitted before the operation
  /// has started (it starts on the handler's executor) ends it before it takes anything. If a stage's grant
  /// raced with the cancellation and won, the operation still fails at the next stage that would wait, or
  /// completes admitted if no stage has to wait any more (the grant won).
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, guard)) Token = default_token_t>
  auto async_acquire(std::string key, Token&& token = Token{}) {
    return async_acquire_until(std::move(key), time_point::max(), std::forward<Token>(token));
  }

  /// As async_acquire, failing with errc::timed_out unless every stage admits within `timeout`.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, guard)) Token = default_token_t>
  auto async_acquire_for(std::string key, duration timeout, Token&& token = Token{}) {
    return async_acquire_until(std::move(key), detail::deadline_after<clock_type>(timeout),
                               std::forward<Token>(token));
  }

  /// As async_acquire, with one deadline for all stages.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, guard)) Token = default_token_t>
  auto async_acquire_until(std::string key, time_point deadline, Token&& token = Token{}) {
    return net::async_initiate<Token, void(error_code, guard)>(initiate_acquire{this}, token, std::move(key), deadline);
  }

  /// Passes every stage now or not at all: an admitted guard, or an empty one whose rejected_at() names the
  /// stage that refused. A refused request consumes nothing at any stage (rate tokens are refunded). Never
  /// waits; a gate that is paused refuses.
  guard try_acquire(std::string_view key) {
    guard g(this);
    throttle_stage refused = try_stages(key, g);
    if (refused == throttle_stage::none) {
      g.admitted_ = true;
      g.rate_tokens_ = 0;
      admitted_.fetch_add(1, std::memory_order_relaxed);
      return g;
    }
    count_refusal(refused);
    guard empty;
    empty.rejected_at_ = refused;
    return empty;  // g's destructor gives back what the earlier stages took
  }

  /// The pause reject() applies when the upstream gave no usable Retry-After.
  duration default_pause() const noexcept { return std::chrono::duration_cast<duration>(options_.default_pause); }

  /// The name given in the options (empty if none).
  const std::string& name() const noexcept { return options_.name; }

  /// Counters, read without blocking anyone.
  throttle_snapshot snapshot() const noexcept {
    throttle_snapshot s;
    const std::uint64_t finished = finished_.load(std::memory_order_relaxed);
    s.admitted_total = admitted_.load(std::memory_order_relaxed);
    s.acquired_total = s.admitted_total;
    s.in_flight = static_cast<std::size_t>(s.admitted_total > finished ? s.admitted_total - finished : 0);
    s.timed_out_total = failures_[0].load(std::memory_order_relaxed);
    s.queue_full_total = failures_[1].load(std::memory_order_relaxed);
    s.closed_total = failures_[2].load(std::memory_order_relaxed);
    s.exceeds_capacity_total = failures_[3].load(std::memory_order_relaxed);
    s.cancelled_total = failures_[4].load(std::memory_order_relaxed);
    s.rejected_gate = refused_[0].load(std::memory_order_relaxed);
    s.rejected_rate = refused_[1].load(std::memory_order_relaxed);
    s.rejected_per_key = refused_[2].load(std::memory_order_relaxed);
    s.rejected_global = refused_[3].load(std::memory_order_relaxed);
    s.failed_total = failed_.load(std::memory_order_relaxed);
    s.rejections_reported = rejections_.load(std::memory_order_relaxed);
    s.for_each_rejected([&s](reject_reason, std::uint64_t n) { s.rejected_total += n; });
    return s;
  }

 private:
  friend guard;

  static throttle_options validated(const throttle_options& o) {
    if (o.default_pause <= std::chrono::nanoseconds::zero())
      throw std::invalid_argument("rein::throttle: default_pause must be > 0, got " +
                                  std::to_string(o.default_pause.count()) + " ns");
    return o;
  }

  // Never waits, so the order of taking cannot hold anyone up: the rate goes last, and a refusal by a
  // concurrency stage then costs the rate limiter nothing (not even a refund, which a sliding window or a
  // shared bucket may not undo exactly).
  throttle_stage try_stages(std::string_view key, guard& g) {
    if constexpr (has_gates) {
      error_code ec;
      g.gate_ = gates_->get(std::string(key), ec);
      if (ec || !detail::try_one(*g.gate_)) return throttle_stage::gate;
    }
    if constexpr (has_per_key) {
      error_code ec;
      g.key_ = per_key_->get(std::string(key), ec);
      if (ec) return throttle_stage::per_key;
      g.key_permit_ = detail::try_one_permit(*g.key_);
      if (!g.key_permit_) return throttle_stage::per_key;
    }
    if constexpr (has_global) {
      g.global_permit_ = detail::try_one_permit(*global_);
      if (!g.global_permit_) return throttle_stage::global;
    }
    if constexpr (has_rate) {
      if (!detail::try_one(*rate_)) return throttle_stage::rate;
    }
    return throttle_stage::none;
  }

  // The stages in order; errors come back as an error code so that both doors (acquire and async_acquire)
  // can report them their own way. Each stage tries synchronously first and waits only when it must.
  // Bound: async_acquire's coroutine, whose stage waits are bound to `cancellation` (the caller's slot, through
  // a throttle_canceller; null if the caller's slot is not connected). Otherwise the waits see the awaiting
  // coroutine's own cancellation state, as any co_await does.
  template <bool Bound>
  net::awaitable<std::pair<error_code, guard>> run(std::string key, time_point deadline,
                                                   std::shared_ptr<detail::throttle_cancellation> cancellation) {
    auto wait = [&](auto& limiter) {
      if constexpr (Bound) {
        auto slot = cancellation ? cancellation->signal.slot() : net::cancellation_slot();
        return detail::wait_one(limiter, deadline, net::bind_cancellation_slot(slot, net::use_awaitable));
      } else {
        return detail::wait_one(limiter, deadline, net::use_awaitable);
      }
    };
    // A cancellation of async_acquire that came when no wait was pending (before this coroutine first ran, or
    // while a stage's grant was on its way) ends the operation now, or before its next wait.
    auto cancelled = [&] { return Bound && cancellation && cancellation->requested.load(std::memory_order_relaxed); };
    guard g(this);
    error_code failure;
    try {
      if (cancelled()) throw system_error(error_code(net::error::operation_aborted));
      if constexpr (has_gates) g.gate_ = gates_->get(key);  // pinned until the guard is done
      if constexpr (has_per_key) g.key_ = per_key_->get(key);
      for (;;) {
        if constexpr (has_gates) {
          if (!detail::try_one(*g.gate_)) {
            if (cancelled()) throw system_error(error_code(net::error::operation_aborted));
            co_await wait(*g.gate_);
          }
        }
        if constexpr (has_rate) {
          if (g.rate_tokens_ == 0) {
            if (!detail::try_one(*rate_)) {
              if (cancelled()) throw system_error(error_code(net::error::operation_aborted));
              co_await wait(*rate_);
            }
            g.rate_tokens_ = 1;
          }
        }
        if constexpr (has_per_key) {
          g.key_permit_ = detail::try_one_permit(*g.key_);
          if (!g.key_permit_) {
            if (cancelled()) throw system_error(error_code(net::error::operation_aborted));
            g.key_permit_ = co_await wait(*g.key_);
          }
        }
        if constexpr (has_global) {
          g.global_permit_ = detail::try_one_permit(*global_);
          if (!g.global_permit_) {
            if (cancelled()) throw system_error(error_code(net::error::operation_aborted));
            g.global_permit_ = co_await wait(*global_);
          }
        }
        if constexpr (!has_gates) break;
        else if (!detail::gate_closed(*g.gate_)) break;
        // Paused while this caller waited: back to the gate, holding no slot meanwhile.
        g.key_permit_.release();
        g.global_permit_.release();
      }
    } catch (const system_error& e) {
      failure = e.code();
    }
    if (failure) {
      failed_.fetch_add(1, std::memory_order_relaxed);
      count_failure(failure);
      co_return std::pair<error_code, guard>(failure, guard());  // g gives back what it took
    }
    g.admitted_ = true;
    g.rate_tokens_ = 0;
    admitted_.fetch_add(1, std::memory_order_relaxed);
    co_return std::pair<error_code, guard>(error_code(), std::move(g));
  }

  // The executor completions default to: the first stage's.
  auto executor() const noexcept {
    if constexpr (has_gates) return gates_->get_executor();
    else if constexpr (has_rate) return rate_->get_executor();
    else if constexpr (has_global) return global_->get_executor();
    else return per_key_->get_executor();
  }

  // A named initiation (as Asio's own I/O objects use), whose executor is the default for completions.
  struct initiate_acquire {
    throttle* self;

    using executor_type = decltype(std::declval<const throttle&>().executor());
    executor_type get_executor() const noexcept { return self->executor(); }

    // The stages run in a coroutine spawned on the handler's associated executor (the first stage's executor
    // by default), so that a strand's handler and its cancellation are serialised with them. An associated
    // executor a coroutine cannot run on (use_future's, with standalone Asio) leaves them on the first stage's
    // executor. The handler runs through its own executor, never inside this call (co_spawn posts if the
    // stages admit at once).
    template <class Handler>
    void operator()(Handler&& handler, std::string key, time_point deadline) const {
      auto ex = net::get_associated_executor(handler, self->executor());
      std::shared_ptr<detail::throttle_cancellation> cancellation;
      auto slot = net::get_associated_cancellation_slot(handler);
      if (slot.is_connected()) {
        cancellation = std::make_shared<detail::throttle_cancellation>();
        slot.template emplace<detail::throttle_canceller>(cancellation);
      }
      try {
        auto stages = self->template run<true>(std::move(key), deadline, cancellation);
        detail::spawn_adapter<std::decay_t<Handler>> adapter{std::forward<Handler>(handler), cancellation};
        if constexpr (std::is_convertible_v<decltype(ex), net::any_io_executor>)
          net::co_spawn(std::move(ex), std::move(stages), std::move(adapter));
        else
          net::co_spawn(self->executor(), std::move(stages), std::move(adapter));
      } catch (...) {
        if (cancellation) slot.clear();  // nothing started: the caller's slot is as it was
        throw;
      }
    }
  };

  void refund_rate(std::size_t n) noexcept {
    if constexpr (has_rate) {
      try {
        rate_->refund(n);
      } catch (...) {  // a refund only adds tokens back; losing one under memory exhaustion is harmless
      }
    }
  }

  void count_refusal(throttle_stage s) noexcept {
    refused_[static_cast<std::size_t>(s) - 1].fetch_add(1, std::memory_order_relaxed);
    if (options_.observer) {
      constexpr reject_reason reasons[] = {reject_reason::gate, reject_reason::rate, reject_reason::per_key,
                                           reject_reason::global};
      notify(reasons[static_cast<std::size_t>(s) - 1]);
    }
  }
  void count_rejection() noexcept { rejections_.fetch_add(1, std::memory_order_relaxed); }
  void count_finished() noexcept { finished_.fetch_add(1, std::memory_order_relaxed); }

  // A waiting acquire that failed, by its error (others count in failed_total only).
  void count_failure(const error_code& ec) noexcept {
    std::size_t slot = 5;
    reject_reason why = reject_reason::cancelled;
    if (ec == errc::timed_out) slot = 0, why = reject_reason::timed_out;
    else if (ec == errc::queue_full) slot = 1, why = reject_reason::queue_full;
    else if (ec == errc::closed) slot = 2, why = reject_reason::closed;
    else if (ec == errc::exceeds_capacity) slot = 3, why = reject_reason::exceeds_capacity;
    else if (ec == error_code(net::error::operation_aborted)) slot = 4;
    if (slot == 5) return;
    failures_[slot].fetch_add(1, std::memory_order_relaxed);
    if (options_.observer) notify(why);
  }

  void notify(reject_reason why) const noexcept {
    limiter_event e;
    e.kind = event_kind::rejected;
    e.reason = why;
    e.name = options_.name;
    try {
      options_.observer(e);
    } catch (...) {
    }
  }

  Gates* gates_;
  Rate* rate_;
  Global* global_;
  PerKey* per_key_;
  throttle_options options_;
  std::atomic<std::uint64_t> admitted_{0};
  std::atomic<std::uint64_t> refused_[4] = {};
  std::atomic<std::uint64_t> failed_{0};
  std::atomic<std::uint64_t> failures_[5] = {};  // timed_out, queue_full, closed, exceeds_capacity, cancelled
  std::atomic<std::uint64_t> finished_{0};
  std::atomic<std::uint64_t> rejections_{0};
};

/// `rein::throttle t(gates, rate, global, per_host);` deduces the stage types; pass rein::unlimited for a
/// stage not used. (A class template, not a basic_X alias: the stage types are the parameters, and clang 14
/// cannot deduce through alias templates.)
template <class Gates, class Rate, class Global, class PerKey>
throttle(Gates&, Rate&, Global&, PerKey&, throttle_options = {}) -> throttle<Gates, Rate, Global, PerKey>;

}  // namespace rein
