// The traits a throttle (rein/throttle.hpp) reads off each entry of its stage list: the stage, its weight,
// limiter, clock and handle, its kind (the concepts) and its rank in the admission order.
#pragma once

#include <rein/algo/adaptive_rate.hpp>
#include <rein/algo/all_of.hpp>
#include <rein/algo/token_bucket.hpp>
#include <rein/config.hpp>
#include <rein/keyed.hpp>
#include <rein/outcome.hpp>
#include <rein/permit.hpp>
#include <rein/throttle_charge.hpp>
#include <rein/try_result.hpp>
#include <rein/wait_stats.hpp>

#include <array>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>

namespace rein::detail {

template <class T>
inline constexpr bool is_unlimited_v = std::is_same_v<std::remove_cvref_t<T>, unlimited_t>;

// A list entry that holds no stage: rein::unlimited.
template <class T>
inline constexpr bool is_placeholder_v = is_unlimited_v<T>;

template <class T>
struct is_keyed : std::false_type {};
template <class L, class K, class M, class H, class E>
struct is_keyed<keyed<L, K, M, H, E>> : std::true_type {};

// The stage a list entry names, and the weight it charges.
template <class Entry>
struct stage_spec {
  using stage = Entry;
  using weight = by_requests_t;
  using argument = std::conditional_t<is_placeholder_v<Entry>, const Entry&, Entry&>;
};
template <class Stage, class Weight>
struct stage_spec<weighted_stage<Stage, Weight>> {
  using stage = Stage;
  using weight = Weight;
  using argument = weighted_stage<Stage, Weight>;
};

// The limiter type a stage's operations run on: a keyed registry's limiter, or the stage itself.
template <class T, bool = is_keyed<T>::value>
struct stage_limiter {
  using type = T;
};
template <class T>
struct stage_limiter<T, true> {
  using type = typename T::limiter_type;
};

// What the stage list stores of an entry: the stage and its weight.
template <class Entry>
using stage_ref = weighted_stage<std::conditional_t<is_placeholder_v<typename stage_spec<Entry>::stage>,
                                                    const typename stage_spec<Entry>::stage,
                                                    typename stage_spec<Entry>::stage>,
                                 typename stage_spec<Entry>::weight>;

template <class Entry>
stage_ref<Entry> make_stage_ref(typename stage_spec<Entry>::argument a) {
  if constexpr (std::is_same_v<std::remove_cvref_t<typename stage_spec<Entry>::argument>, stage_ref<Entry>>)
    return a;
  else
    return stage_ref<Entry>(a, by_requests_t{});
}

// When a rate stage could take n units, asked without taking them (a rate limiter's inspect, where it has
// one): the throttle takes its rates only if each could (ready), and waits in a key's rate line otherwise.
template <class TimePoint>
struct readiness {
  enum class kind : std::uint8_t { ready, at, never, exceeds, queued, unknown };
  kind what = kind::unknown;
  TimePoint when{};
};

template <class L, class TimePoint>
readiness<TimePoint> rate_readiness(const L& l, std::size_t n, TimePoint now) {
  using result = readiness<TimePoint>;
  using kind = typename result::kind;
  if constexpr (requires { typename L::limit_type; }) {
    return l.inspect([&](const typename L::limit_type& limit, const wait_stats& w) -> result {
      if (w.waiting != 0) return {kind::queued, {}};  // those on its own line go first
      if (n > static_cast<std::uint64_t>(limit.capacity())) return {kind::exceeds, {}};
      const std::optional<TimePoint> at = limit.ready_at(static_cast<std::int64_t>(n), now);
      if (!at) return {kind::never, {}};
      if (*at <= now) return {kind::ready, *at};
      return {kind::at, *at};
    });
  } else {
    return {kind::unknown, {}};
  }
}

// Whether a rate limit's refund gives back exactly what a take took, however late (a token bucket: the units
// rejoin the bucket, never above its capacity). A window's refund is exact only within the window the units
// were taken in (a later one would free room other calls hold), so the throttle refunds a window only in
// the instant of the take. A stage without a pure limit (the Redis bucket) is a token bucket.
template <class Limit>
struct refund_anytime : std::false_type {};
template <class Clock>
struct refund_anytime<algo::basic_token_bucket<Clock>> : std::true_type {};
template <class Clock>
struct refund_anytime<algo::basic_adaptive_rate<Clock>> : std::true_type {};
template <class... Limits>
struct refund_anytime<algo::all_of<Limits...>> : std::conjunction<refund_anytime<Limits>...> {};

template <class L>
constexpr bool refunds_anytime() {
  if constexpr (requires { typename L::limit_type; }) return refund_anytime<typename L::limit_type>::value;
  else return true;
}

// Stands in for the keyed handle of a stage that is global.
struct no_handle {
  explicit operator bool() const noexcept { return false; }
  void reset() noexcept {}
};

template <class Stage, bool = is_keyed<Stage>::value>
struct handle_of {
  using type = no_handle;
};
template <class Stage>
struct handle_of<Stage, true> {
  using type = typename Stage::handle;
};

template <class T, bool = is_placeholder_v<T>>
struct stage_clock {
  using type = typename stage_limiter<T>::type::clock_type;
};
template <class T>
struct stage_clock<T, true> {
  using type = void;
};

template <class... Clocks>
struct first_clock {
  using type = std::chrono::steady_clock;
};
template <class C, class... Rest>
struct first_clock<C, Rest...> {
  using type = std::conditional_t<std::is_void_v<C>, typename first_clock<Rest...>::type, C>;
};

/// A quota gate: holds nothing, closed while paused (rein::quota_gate).
template <class L>
concept throttle_gate = requires(L& l, const L& view, typename L::duration d, std::string_view field) {
  { view.is_paused() } -> std::convertible_to<bool>;
  l.pause_for(d);
  l.on_retry_after(field, d);
};

/// A concurrency limit: try_acquire(n) gives a permit (rein::semaphore, rein::adaptive_limiter).
template <class L>
concept throttle_concurrency = requires(L& l, std::size_t n) {
  { l.try_acquire(n) } -> std::convertible_to<permit>;
};

/// A rate limit: try_acquire(n) takes n units or nothing, refund(n) gives back (rein::token_bucket,
/// rein::sliding_window, rein::rate_limits, rein::adaptive_rate_limiter, the Redis shared bucket).
template <class L>
concept throttle_rate = requires(L& l, std::size_t n) {
  static_cast<bool>(l.try_acquire(n));
  l.refund(n);
};

/// An admission stage: decides a call at once, holding nothing, and learns from its outcome
/// (rein::admission_throttle).
template <class L>
concept throttle_admission_stage = requires(L& l, outcome result) {
  { l.try_acquire() } -> std::same_as<try_result>;
  l.record(result);
};

/// A rate limiter that reserves (rein::basic_rate_limiter of an algo::reservable_rate_limit): what
/// throttle::reserve asks of every rate stage.
template <class L>
concept throttle_reservable = requires(L& l, std::size_t n) {
  { l.reserve(n).time_to_act() } -> std::same_as<typename L::time_point>;
};

// What a throttle reservation keeps for each place: a rate stage's own reservation (empty when the charge
// is 0 there), nothing for the other kinds, nor for a rate stage that cannot reserve (throttle::reserve
// does not compile then).
struct no_reservation {};
template <class Limiter, bool Reserves>
struct reservation_slot {
  using type = no_reservation;
};
template <class Limiter>
struct reservation_slot<Limiter, true> {
  using type = std::optional<typename Limiter::reservation>;
};

// The kinds of stage, in the order the throttle admits them.
enum class stage_rank : std::uint8_t { admission, gate, per_key_concurrency, global_concurrency, rate, none };

template <class Entry>
constexpr stage_rank rank_of() {
  using stage = typename stage_spec<Entry>::stage;
  if constexpr (is_placeholder_v<stage>) {
    return stage_rank::none;
  } else {
    using limiter = typename stage_limiter<stage>::type;
    if constexpr (throttle_gate<limiter>) {
      return stage_rank::gate;
    } else if constexpr (throttle_concurrency<limiter>) {
      return is_keyed<stage>::value ? stage_rank::per_key_concurrency : stage_rank::global_concurrency;
    } else if constexpr (throttle_rate<limiter>) {
      return stage_rank::rate;
    } else if constexpr (throttle_admission_stage<limiter>) {
      static_assert(!is_keyed<stage>::value,
                    "rein::throttle: an admission stage (rein::admission_throttle) is global: list the admission "
                    "throttle itself, one per backend whose refusals it counts, not a rein::keyed registry of them");
      static_assert(std::is_same_v<typename stage_spec<Entry>::weight, by_requests_t>,
                    "rein::throttle: an admission stage (rein::admission_throttle) decides each call as one "
                    "request and takes no units: list it plainly, not through rein::by_tokens or rein::weighted");
      return is_keyed<stage>::value ? stage_rank::none : stage_rank::admission;
    } else {
      static_assert(throttle_gate<limiter> || throttle_concurrency<limiter> || throttle_rate<limiter>,
                    "rein::throttle: this stage is none of the kinds a throttle knows: a quota gate "
                    "(is_paused(), pause_for(d), on_retry_after(field, d)), a concurrency limiter (try_acquire(n) "
                    "returning a rein::permit) or a rate limiter (try_acquire(n) returning a rein::try_result, and "
                    "refund(n)) or an admission stage (try_acquire() returning a rein::try_result, and "
                    "record(outcome): rein::admission_throttle); the compiler's note names the stage's position "
                    "and type");
      return stage_rank::none;  // after the message, as if the place were empty: no further errors
    }
  }
}

template <std::size_t N>
constexpr bool in_admission_order(const std::array<stage_rank, N>& ranks) {
  stage_rank last = stage_rank::admission;
  for (stage_rank r : ranks) {
    if (r == stage_rank::none) continue;
    if (r < last) return false;
    last = r;
  }
  return true;
}

template <stage_rank R, std::size_t N>
constexpr std::size_t count_rank(const std::array<stage_rank, N>& ranks) {
  std::size_t n = 0;
  for (stage_rank r : ranks) n += r == R ? 1 : 0;
  return n;
}

// The positions of the stages of rank R, in list order.
template <stage_rank R, std::size_t Count, std::size_t N>
constexpr std::array<std::size_t, Count> positions(const std::array<stage_rank, N>& ranks) {
  std::array<std::size_t, Count> out{};
  std::size_t k = 0;
  for (std::size_t i = 0; i < N; ++i)
    if (ranks[i] == R) out[k++] = i;
  return out;
}

}  // namespace rein::detail
