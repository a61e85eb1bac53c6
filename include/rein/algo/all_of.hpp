// Several pure rate limits checked together: a request takes from every one of them or from none.
#pragma once

#include <rein/algo/rate_limit.hpp>

#include <algorithm>
#include <array>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>

namespace rein::algo {

/// Several rate limits enforced together, all or nothing: "10 per second and 1,000 per hour", or the
/// LLM APIs' pair "requests per minute and tokens per minute", where one call charges 1 to the first and
/// its estimated token count to the second.
///
/// A request is admitted only when every part admits it at the same instant, and then takes from every
/// part; otherwise it takes from none (a part that would admit is not charged for a request another part
/// denies). The earliest time a request fits is the latest of the parts' earliest times, which is exact
/// because each part's availability only grows with time. `all_of` is itself a `rate_limit`, so it nests
/// and the async layer can drive it like a single limit; when every part takes a `charge`, so does it.
///
/// @code
/// rein::algo::all_of limits{
///     rein::algo::token_bucket({.rate = 10, .capacity = 10}, now),
///     rein::algo::sliding_window({.limit = 1000, .window = std::chrono::hours(1)}, now)};
/// if (limits.try_take(1, now) == rein::algo::take_result::allowed) send();
/// @endcode
///
/// @par Time
/// The parts share one clock. The stamp used for all parts is `max(t, last_time())`, where `last_time()`
/// is the latest of the parts', so every part judges the request at the same instant.
///
/// @par Thread Safety
/// A plain value: distinct objects are independent; one object must not be used concurrently.
///
/// @tparam Limits models of `rate_limit` with the same `time_point` type.
template <rate_limit... Limits>
  requires(sizeof...(Limits) >= 1)
class all_of {
  using first = std::tuple_element_t<0, std::tuple<Limits...>>;

 public:
  /// The clock of every part (they must share one).
  using clock = typename first::clock;
  /// A point in time of `clock`.
  using time_point = typename first::time_point;
  /// A duration of `clock`.
  using duration = typename first::duration;
  static_assert((std::is_same_v<typename Limits::time_point, time_point> && ...),
                "rein::algo::all_of: all limits must use the same time_point type");

  /// How many limits there are.
  static constexpr std::size_t size = sizeof...(Limits);
  /// One count per limit, in the order given: `{1, estimated_tokens}`.
  using counts = std::array<std::int64_t, size>;

  /// Takes ownership of the limits, in this order.
  explicit all_of(Limits... parts) : parts_(std::move(parts)...) {}

  /// Takes n from every limit at time t, or nothing.
  /// @returns `exceeds_capacity` if n exceeds any limit's capacity, else `denied` if any limit has no
  /// room now, else `allowed`. Only `allowed` changes the state.
  /// @throws std::invalid_argument if n < 0.
  take_result try_take(std::int64_t n, time_point t) { return try_take(same(n), t); }

  /// Takes `n[i]` from limit i at time t, for every i, or nothing; results as `try_take(n, t)`.
  /// @throws std::invalid_argument if any count is < 0.
  take_result try_take(const counts& n, time_point t) {
    if (exceeds(n)) return take_result::exceeds_capacity;
    const time_point now = clamp(t);
    if (ready_at(n, now) != now) return take_result::denied;
    each([&](auto& part, std::size_t i) {
      [[maybe_unused]] const take_result taken = part.try_take(n[i], now);
      assert(taken == take_result::allowed);
    });
    return take_result::allowed;
  }

  /// The earliest time, not before `max(t, last_time())`, at which every limit has room for n: the
  /// latest of the parts' `ready_at`. Reads only.
  /// @returns that time, or `std::nullopt` (never) if any part says never.
  /// @throws std::invalid_argument if n < 0.
  std::optional<time_point> ready_at(std::int64_t n, time_point t) const { return ready_at(same(n), t); }

  /// The earliest time at which limit i has room for `n[i]`, for every i at once; see `ready_at(n, t)`.
  std::optional<time_point> ready_at(const counts& n, time_point t) const {
    const time_point now = clamp(t);
    std::optional<time_point> latest = now;
    each([&](const auto& part, std::size_t i) {
      const std::optional<time_point> ready = part.ready_at(n[i], now);
      if (latest && ready) latest = std::max(*latest, *ready);
      else latest.reset();
    });
    return latest;
  }

  /// Gives n back to every limit at time t (see each limit's `refund`).
  /// @throws std::invalid_argument if n < 0.
  void refund(std::int64_t n, time_point t) { refund(same(n), t); }

  /// Gives `n[i]` back to limit i at time t, for every i.
  /// @throws std::invalid_argument if any count is < 0.
  void refund(const counts& n, time_point t) {
    const time_point now = clamp(t);
    each([&](auto& part, std::size_t i) { part.refund(n[i], now); });
  }

  /// Charges n to every limit at time t, into debt where a limit has no room (see each limit's `charge`):
  /// a cost found after the fact. Present when every part is a `chargeable_rate_limit`.
  /// @throws std::invalid_argument if n < 0, charging nothing.
  void charge(std::int64_t n, time_point t)
    requires(chargeable_rate_limit<Limits> && ...)
  {
    charge(same(n), t);
  }

  /// Charges `n[i]` to limit i at time t, for every i: e.g. `{0, actual - estimate}` for the tokens an LLM
  /// call used above its estimate, with nothing more on the requests limit.
  /// @throws std::invalid_argument if any count is < 0, charging nothing.
  void charge(const counts& n, time_point t)
    requires(chargeable_rate_limit<Limits> && ...)
  {
    for (const std::int64_t count : n) detail::check_request("rein::algo::all_of", count);
    const time_point now = clamp(t);
    each([&](auto& part, std::size_t i) { part.charge(n[i], now); });
  }

  /// Reserves n on every limit at t, all acting at one time: the latest of the parts' times (each part's
  /// `reserve` with that time as its `not_before`, so a part that would be ready earlier counts the n as
  /// used then, e.g. a window records its starts at that time). Present when every part is a
  /// `reservable_rate_limit`.
  /// @returns that time; or `std::nullopt`, with nothing taken anywhere, if n exceeds a part's capacity or a
  /// part cannot reserve (its time or debt beyond its range).
  /// @throws std::invalid_argument if n < 0.
  std::optional<time_point> reserve(std::int64_t n, time_point t)
    requires(reservable_rate_limit<Limits> && ...)
  {
    return reserve(n, t, time_point::min());
  }

  /// As `reserve(n, t)`, acting no earlier than `not_before`.
  ///
  /// Every part's time is its `ready_at(n, ·)` or the bound it is given, whichever is later, so the time
  /// is known before anything is taken. A part may still fail to reserve (a debt or a count beyond its
  /// bound, or std::bad_alloc from a window's log); then the result is `std::nullopt` (or the exception)
  /// and nothing is taken: the parts that are plain values (trivially copyable: token bucket, fixed window)
  /// reserve first and are restored as they were, and the others (a sliding window's log) reserve after
  /// them, so that with at most one such part the part that fails took nothing itself. With two or more,
  /// those that had reserved give the n back by their cancel rule, as the latest reservation (a sliding
  /// window's cancel gives all back, but stamps the starts its reservation pushed out of a full log at the
  /// newest of them: see its `cancel_reservation`).
  std::optional<time_point> reserve(std::int64_t n, time_point t, time_point not_before)
    requires(reservable_rate_limit<Limits> && ...)
  {
    detail::check_request("rein::algo::all_of", n);
    if (n > capacity()) return std::nullopt;
    const time_point now = clamp(t);
    const std::optional<time_point> ready = ready_at(n, now);
    if (!ready) return std::nullopt;
    const time_point at = std::max(*ready, not_before);
    // Nothing to reserve: a part's own reserve(0) may answer the end of its debt, which its ready_at(0)
    // does not wait for, and the parts would disagree on the time.
    if (n == 0) return at;
    std::tuple<std::optional<Limits>...> saved;  // the restorable parts before their reserve
    std::array<bool, size> done{};
    bool failed = false;
    // One pass over the restorable parts, then one over the others.
    auto pass = [&](bool restorable_pass) {
      each_with(saved, [&](auto& part, auto& copy, std::size_t i) {
        if (failed || restorable<std::remove_cvref_t<decltype(part)>> != restorable_pass) return;
        if constexpr (restorable<std::remove_cvref_t<decltype(part)>>) copy.emplace(part);
        const std::optional<time_point> mine = part.reserve(n, now, at);
        done[i] = mine.has_value();
        failed = !mine;
        assert(!mine || *mine == at);
      });
    };
    auto undo = [&] {
      each_with(saved, [&](auto& part, auto& copy, std::size_t i) {
        if constexpr (restorable<std::remove_cvref_t<decltype(part)>>) {
          if (copy) part = *copy;
        } else if (done[i]) {
          part.cancel_reservation(n, at, {}, now);
        }
      });
    };
    try {
      pass(true);
      pass(false);
      if (!failed) return at;
    } catch (...) {
      undo();
      throw;
    }
    undo();
    return std::nullopt;
  }

  /// Gives back at t, on every part by its own rule, what a cancelled reservation of n acting at `at` may
  /// return while the reservations `standing` still stand (see `reservable_rate_limit`). Present when
  /// every part is a `reservable_rate_limit`.
  /// @returns the least any part gave back: units that came back on every part.
  /// @throws std::invalid_argument if n < 0.
  std::int64_t cancel_reservation(std::int64_t n, time_point at, std::span<const standing_reservation<time_point>> standing,
                                  time_point t)
    requires(reservable_rate_limit<Limits> && ...)
  {
    detail::check_request("rein::algo::all_of", n);
    const time_point now = clamp(t);
    std::int64_t least = n;
    each([&](auto& part, std::size_t) { least = std::min(least, part.cancel_reservation(n, at, standing, now)); });
    return least;
  }

  /// As `refund(n, t)` while the reservations `standing` (sorted by time) stand: every part gives back by
  /// its own refund for standing reservations. Present when every part is a `reservable_rate_limit`.
  /// @returns the least any part gave back.
  /// @throws std::invalid_argument if n < 0.
  std::int64_t refund(std::int64_t n, std::span<const standing_reservation<time_point>> standing, time_point t)
    requires(reservable_rate_limit<Limits> && ...)
  {
    detail::check_request("rein::algo::all_of", n);
    const time_point now = clamp(t);
    std::int64_t least = n;
    each([&](auto& part, std::size_t) { least = std::min(least, part.refund(n, standing, now)); });
    return least;
  }

  /// The largest n a single request may ask of every limit: the smallest capacity.
  std::int64_t capacity() const noexcept {
    std::int64_t smallest = std::get<0>(parts_).capacity();
    each([&](const auto& part, std::size_t) { smallest = std::min(smallest, part.capacity()); });
    return smallest;
  }

  /// The latest `last_time()` of the parts; earlier stamps are treated as this one.
  time_point last_time() const noexcept {
    time_point latest = std::get<0>(parts_).last_time();
    each([&](const auto& part, std::size_t) { latest = std::max(latest, part.last_time()); });
    return latest;
  }

  /// Limit I, e.g. to change its rate or read its tokens. Changing it directly is fine: `all_of` keeps no
  /// state of its own.
  template <std::size_t I>
  auto& get() noexcept {
    return std::get<I>(parts_);
  }

  /// Limit I, read only.
  template <std::size_t I>
  const auto& get() const noexcept {
    return std::get<I>(parts_);
  }

 private:
  static counts same(std::int64_t n) noexcept {
    counts all;
    all.fill(n);
    return all;
  }

  // A part that all_of::reserve restores from a copy when another part cannot reserve.
  template <class L>
  static constexpr bool restorable = std::is_trivially_copyable_v<L> && std::is_copy_assignable_v<L>;

  // Calls f(part, std::get<I>(other), I) for every part I, in order.
  template <class Other, class F>
  void each_with(Other& other, F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (f(std::get<I>(parts_), std::get<I>(other), I), ...);
    }(std::make_index_sequence<size>{});
  }

  // Calls f(part, index) for every part, in order.
  template <class F>
  void each(F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) { (f(std::get<I>(parts_), I), ...); }(std::make_index_sequence<size>{});
  }

  template <class F>
  void each(F&& f) const {
    [&]<std::size_t... I>(std::index_sequence<I...>) { (f(std::get<I>(parts_), I), ...); }(std::make_index_sequence<size>{});
  }

  bool exceeds(const counts& n) const {
    bool any = false;
    each([&](const auto& part, std::size_t i) {
      detail::check_request("rein::algo::all_of", n[i]);
      any = any || n[i] > part.capacity();
    });
    return any;
  }

  time_point clamp(time_point t) const noexcept { return std::max(t, last_time()); }

  std::tuple<Limits...> parts_;
};

}  // namespace rein::algo
