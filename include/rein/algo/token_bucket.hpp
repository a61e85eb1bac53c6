// The token bucket as a pure value type: exact integer arithmetic, time passed in by the caller.
#pragma once

#include <rein/algo/rate_limit.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>

namespace rein::algo {

/// Warm-up of a token bucket: a cold bucket refills slower than its rate and speeds up as it is used (Guava's
/// `SmoothWarmingUp`, the shape of `RateLimiter.create(permitsPerSecond, warmupPeriod)`). Off by default.
///
/// The rule. The bucket keeps a coldness c, in nanoseconds, in [0, period]; a new bucket is cold (c = period,
/// as Guava's starts). Time the bucket spends full (its tokens unused: idle) adds to c, one for one, so an
/// idle bucket is cold again after `period`; each token taken (a take, a reservation, a charge) removes
/// P / M of it, where M = P x rate x (f + 5) / (2 (f + 1)) is Guava's maxPermits (f = `cold_factor`, P =
/// `period`; M = P x rate for f = 3, so one token is 1 / rate seconds of coldness), rounded down to the
/// nanosecond; a refund puts it back. Below the threshold T = P (f + 1) / (f + 5) (Guava's thresholdPermits:
/// P / 2 for f = 3) the refill rate is the stable `rate`; above it the interval between tokens grows
/// linearly in c, to f / rate at c = P: the refill rate is
///
///     rate x (P - T) / ((P - T) + (f - 1) x (c - T)).
///
/// So a bucket used at full speed from cold reaches its stable rate after `period` (the area under
/// Guava's trapezoid; whole tokens make it a little less: 9.9 s of a 10 s warm-up at 10 per second), and
/// goes on at it. Unlike Guava, the bucket's `capacity` is still a burst: a cold bucket still hands out
/// what it holds at once, and warm-up governs only how fast it refills (capacity 1 gives Guava's
/// behaviour, which has no burst).
///
/// The refill rate changes only when the state changes (a take, reservation, charge, refund or setter),
/// so `ready_at` stays exact; it is re-expressed in the bucket's integer units as `set_rate` does,
/// dropping less than 1e-9 token each time. `reserve` times a reservation at the rate before the
/// reservation warms the bucket: never early, but a later reservation behind a deep debt, repaid at the
/// warmer rate, may be given an earlier time than the one before it. With warm-up off (`period` 0) none of this runs and the
/// bucket's arithmetic is exactly that of the plain bucket.
struct token_bucket_warmup {
  /// How long a bucket used at full speed takes to go from its cold rate to its stable one, and how long
  /// an idle one takes to go back; in nanoseconds, >= 0. 0 (the default): no warm-up.
  std::chrono::nanoseconds period{};
  /// The cold rate is rate / cold_factor; in [1, 1000]. Default 3, Guava's `coldFactor`.
  double cold_factor = 3.0;
};

/// Construction options of `basic_token_bucket` (and of the async `rein::token_bucket`).
///
/// Write them with designated initializers: `{.rate = 10, .capacity = 3}`, `{.rate = 1, .capacity = 10,
/// .initial_tokens = 0}`.
struct token_bucket_options {
  double rate = 0;                                ///< tokens per second, in (0, 1e9]
  std::int64_t capacity = 0;                      ///< the burst: most tokens the bucket holds, in [1, 1e15]
  std::optional<std::int64_t> initial_tokens{};   ///< tokens at construction, in [0, capacity]; default full
  token_bucket_warmup warmup{};                   ///< a cold bucket refills slower (Guava); default off
};

/// A token bucket: tokens flow in at `rate` per second up to `capacity`; a request for n tokens is admitted
/// when n are there and takes them.
///
/// The peer is Go's `golang.org/x/time/rate.Limiter` (`AllowN`, `ReserveN`, `SetLimitAt`, `SetBurstAt`, all
/// with an explicit time), without its floating-point drift: here no amount or pattern of polling changes
/// how many tokens arrive between two instants. Refill is lazy and tokens can be refunded.
///
/// Units: time is `Clock::time_point`, computed internally in whole nanoseconds; rates are tokens per
/// second; counts are whole tokens.
///
/// @par Exactness
/// The rate is held as a fraction p/q tokens per second: the simplest one (first continued-fraction
/// convergent) within 2^-50 relative of the given double, with q <= 2^40 and p <= 2^62. So 0.2 is exactly
/// 1/5 and `1 / 1.3` exactly 10/13. Tokens are counted in units of 1/(q * 1e9) token, of which exactly p
/// arrive per nanosecond, so refill is integer addition: the tokens credited over [t0, t2] are the same
/// whether or not anyone looked at t1, and `ready_at` is the exact nanosecond (rounded up to the clock's
/// tick) at which the tokens are there. Only `set_rate` rounds, dropping less than one unit (at most 1e-9
/// token) in favour of the limit. Rates below 2^-40 per second (one token per 35,000 years) are held as
/// 2^-40: any wait for a missing token is beyond the clock's range (`std::nullopt`) either way.
///
/// @par Time
/// Time is clamped to be monotonic: a stamp earlier than `last_time()` is treated as `last_time()`. Any
/// reading is a valid stamp, `time_point::min()` and `max()` included (see rein::algo::rate_limit).
/// Nothing happens between calls; there is no background tick.
///
/// @par Thread Safety
/// A plain value: distinct objects are independent; one object must not be used concurrently.
///
/// @tparam Clock a Chrono clock whose tick is a nanosecond or coarser (default `std::chrono::steady_clock`).
template <class Clock = std::chrono::steady_clock>
class basic_token_bucket {
  static_assert(detail::tick_at_least_a_nanosecond<Clock>, "rein::algo: the clock's tick must be >= 1 ns");

 public:
  /// The clock that times the rule.
  using clock = Clock;
  /// A point in time of `clock`.
  using time_point = typename Clock::time_point;
  /// A duration of `clock`.
  using duration = typename Clock::duration;
  /// The options type, as the constructor takes them.
  using options = token_bucket_options;

  static constexpr double max_rate = 1e9;                          ///< tokens per second
  static constexpr std::int64_t max_capacity = 1'000'000'000'000'000;  ///< 1e15 tokens

  /// Makes a bucket holding `o.initial_tokens` (default: full) at time `now`.
  ///
  /// @throws std::invalid_argument if the rate is not in (0, 1e9] (NaN and infinities included), the
  /// capacity not in [1, 1e15], the initial tokens not in [0, capacity], `warmup.period` < 0 or
  /// `warmup.cold_factor` not in [1, 1000]; the message names the field and the value.
  basic_token_bucket(const options& o, time_point now)
      : rate_(checked_rate(o.rate)),
        fraction_(to_fraction(o.rate)),
        capacity_(checked_capacity(o.capacity)),
        last_ns_(detail::to_ns(now)),
        warmup_(checked_warmup(o.warmup)),
        cold_ns_(warmup_.period.count()) {
    const std::int64_t initial = o.initial_tokens.value_or(capacity_);
    if (initial < 0 || initial > capacity_) {
      detail::throw_invalid(type_name, "initial_tokens must be in [0, capacity]", detail::show(initial));
    }
    if (warming()) {  // a new bucket is cold, as Guava's is
      current_rate_ = warm_rate();
      fraction_ = to_fraction(current_rate_);
    }
    units_ = initial * unit();
  }

  /// Takes n tokens at time t if n are there.
  ///
  /// @returns `allowed` (tokens taken), `denied` (too few tokens now), or `exceeds_capacity`
  /// (n > capacity()). Only `allowed` changes the state. n = 0 is always `allowed` and changes nothing.
  /// @throws std::invalid_argument if n < 0.
  take_result try_take(std::int64_t n, time_point t) {
    detail::check_request(type_name, n);
    if (n > capacity_) return take_result::exceeds_capacity;
    if (n == 0) return take_result::allowed;
    const std::int64_t now = clamp(t);
    const int128 available = units_at(now);
    if (available < n * unit() || n > capped(now)) return take_result::denied;
    commit(available - n * unit(), now, n);
    spend_cap(n, now);
    return take_result::allowed;
  }

  /// The earliest time, not before `max(t, last_time())`, at which n tokens will be there, assuming no
  /// other change in between. Reads only.
  ///
  /// @returns the time, rounded up to the clock's tick, from which `try_take(n, ·)` is `allowed`; or
  /// `std::nullopt` (never) if n > capacity() or the time lies beyond the range of the clock.
  /// @throws std::invalid_argument if n < 0.
  std::optional<time_point> ready_at(std::int64_t n, time_point t) const {
    detail::check_request(type_name, n);
    if (n > capacity_) return std::nullopt;
    const std::int64_t now = clamp(t);
    const int128 missing = n == 0 ? 0 : n * unit() - units_at(now);
    const int128 ready = now + wait_ns(missing);
    // A provider's cap (limit_remaining) that the n do not fit under holds them until it ends.
    return detail::from_ns<time_point>(n > capped(now) && ready < cap_until_ns_ ? int128(cap_until_ns_) : ready);
  }

  /// Takes n tokens at t even if that leaves the bucket in debt, and says when the reservation is good:
  /// the instant the balance is back to zero (Go's `ReserveN`). Later requests queue behind the debt, so
  /// successive reservations are granted in FIFO order, each as early as the rate allows.
  ///
  /// A reservation that will not be used should be handed back with `refund(n, t)`. The async layer's
  /// waiters do not reserve (a queued waiter must cost nothing until granted); `rein::token_bucket::reserve`
  /// is built on this, with Go's model and its cancel rule (rein::basic_token_reservation). It is also the
  /// model of a FIFO's grant times.
  ///
  /// @returns the time from which the n tokens are the caller's; `std::nullopt` with nothing taken if
  /// n > capacity(), if that time lies beyond the clock's range, or if the debt would pass max_capacity.
  /// @throws std::invalid_argument if n < 0.
  std::optional<time_point> reserve(std::int64_t n, time_point t) { return reserve(n, t, time_point::min()); }

  /// As `reserve(n, t)`, for a caller who will not act before `not_before` (an `all_of` whose other parts
  /// are ready later): the time returned is the later of the two. Tokens that would have overflowed the
  /// full bucket while the n wait for their holder are taken too, so that from `not_before` on the bucket
  /// holds exactly what it would had the n been taken then (never a burst above the capacity when the
  /// holder acts). With warm-up that overflow is counted at the rate before the reservation.
  std::optional<time_point> reserve(std::int64_t n, time_point t, time_point not_before) {
    detail::check_request(type_name, n);
    if (n > capacity_) return std::nullopt;
    const std::int64_t now = clamp(t);
    const int128 units = units_at(now);
    const int128 at_rate = now + wait_ns(n * unit() - units);
    const bool over_cap = n > capped(now);
    const int128 ready = over_cap && at_rate < cap_until_ns_ ? int128(cap_until_ns_) : at_rate;
    const std::int64_t held = detail::to_ns(not_before);
    // The tokens that would arrive above the capacity between now and `held`, were the n not yet taken.
    const int128 overflow = held > ready ? std::max<int128>(0, units + (int128(held) - now) * fraction_.tokens - full()) : 0;
    const int128 after = units - n * unit() - overflow;
    if (after < -max_capacity * unit()) return std::nullopt;
    const auto at = detail::from_ns<time_point>(std::max<int128>(ready, held));
    if (at) {
      commit(after, now, n);
      if (!over_cap) spend_cap(n, now);
    }
    return at;
  }

  /// Gives back at t what a cancelled reservation of n tokens acting at `at` may return while the
  /// reservations `standing` (sorted by time, without this one) still stand; see `reservable_rate_limit`.
  ///
  /// The rule. Let B(s) be the balance projected at the current refill rate (its debt repaid as time
  /// passes), read rounded up to a whole token (so a fraction is kept rather than lent), and P(s) the
  /// tokens of the standing reservations acting at s or later. While they stand, a real bucket holds B(s) +
  /// P(s): their tokens are in it until they act. So the refund x is the largest in [0, n] with B(s) + x +
  /// P(s) <= capacity at t and at every standing reservation's time (between two such times B rises and P
  /// stays, so those are the worst instants). Then no one can ever act in a standing reservation's tokens,
  /// whatever the rate of later calls, and everything that does not stand in their way comes back. Nothing
  /// comes back once `at` is before t (the tokens are spent). The projection holds at the rate of the
  /// moment: a rate changed later moves B for everyone, while reservations keep their times (as Go's
  /// `SetLimit` says of its reservations).
  ///
  /// Go's `Reservation.CancelAt` keeps back the tokens "reserved after" this one counted as time instead,
  /// and its refunds were reported wrong (golang/go#56924, #69419): it keeps back every token reserved
  /// after even when the capacity leaves room for them (capacity 3, rate 1/s, empty: reserve 2 then 1;
  /// cancelling the 2 gives back 1 in Go, 2 here), and after a rate increase it can give back tokens a later
  /// reservation still needs. As in Go, tokens kept back for a later reservation stay spent even if that
  /// one is cancelled afterwards: cancel the latest first to get everything back.
  /// @returns the tokens given back.
  /// @throws std::invalid_argument if n < 0.
  std::int64_t cancel_reservation(std::int64_t n, time_point at, std::span<const standing_reservation<time_point>> standing,
                                  time_point t) {
    detail::check_request(type_name, n);
    const std::int64_t now = clamp(t);
    if (detail::to_ns(at) < now) return 0;
    return give_back(n, standing, t);
  }

  /// As `refund(n, t)` while the reservations `standing` (sorted by time) stand: gives back only what
  /// leaves them their tokens, by the rule of `cancel_reservation`. A plain refund could fill the bucket
  /// with tokens a standing reservation counts on, and a newcomer would act in them. The async layer
  /// refunds this way.
  /// @returns the tokens given back.
  /// @throws std::invalid_argument if n < 0.
  std::int64_t refund(std::int64_t n, std::span<const standing_reservation<time_point>> standing, time_point t) {
    detail::check_request(type_name, n);
    return give_back(n, standing, t);
  }

 private:
  // What cancel_reservation and refund give back at t: the largest x in [0, n] with B(s) + x + P(s) <=
  // capacity at t and at every standing reservation's time.
  std::int64_t give_back(std::int64_t n, std::span<const standing_reservation<time_point>> standing, time_point t) {
    const std::int64_t now = clamp(t);
    // B(s) + P(s) <= capacity, walking back from the latest standing reservation; the sums stay far from
    // overflow (the standing tokens sit in the debt, at most 1e15 tokens, plus one capacity).
    auto room = [this](std::int64_t later, std::int64_t s) { return capacity_ - later - tokens_rounded_up_ns(s); };
    std::int64_t back = n, later = 0;
    for (auto e = standing.rbegin(); e != standing.rend(); ++e) {
      const std::int64_t s = detail::to_ns(e->at);
      if (s < now) break;  // acted: no longer in the bucket
      later += e->n;
      back = std::min(back, room(later, std::max(s, now)));
    }
    back = std::max<std::int64_t>(0, std::min(back, room(later, now)));
    refund(back, t);
    return back;
  }

 public:
  /// Takes n tokens at t whatever is there, leaving the bucket in debt if it holds fewer: the charge for
  /// work already done, such as the part of a call's cost above its estimate (an LLM call that used more
  /// tokens than it reserved). Unlike `try_take` it never refuses, and unlike a silent overrun it makes
  /// later requests wait until the rate has repaid the debt: `ready_at(m, ·)` and `try_take(m, ·)` see the
  /// negative balance, so the tokens spent over any interval still match what the rate allowed, only later.
  ///
  /// n may exceed the capacity. The debt is bounded so that nothing overflows: the balance never goes below
  /// `-max_capacity` (1e15) tokens, and a charge that would go further leaves it there (it then costs less
  /// than n; at a rate of 1e9 tokens per second that debt is already 11.6 days of refill).
  /// Source: Go's `rate.Limiter.ReserveN`, which may also take the balance below zero, without its
  /// refusal of n above the burst.
  /// @throws std::invalid_argument if n < 0 (nothing changes).
  void charge(std::int64_t n, time_point t) {
    detail::check_request(type_name, n);
    const std::int64_t now = clamp(t);
    const int128 units = units_at(now);
    const int128 floor = -max_capacity * unit();
    // Compare before multiplying: n * unit() could pass 2^127 for n near 2^63.
    commit(n >= detail::ceil_div(units - floor, unit()) ? floor : units - n * unit(), now, n);
    spend_cap(n, now);
  }

  /// Caps what the bucket admits from t until `t + reset_after` at `remaining` tokens: an upstream's own count
  /// of a window ("`remaining` more until the reset": GitHub's `x-ratelimit-remaining` / `-reset`, the IETF
  /// RateLimit fields) correcting a local bucket that believes it has more. Until the reset, a request is
  /// admitted only if the bucket has the tokens *and* it fits under what is left of the cap; at the reset the
  /// cap ends and the bucket goes on from its own balance (it does not lend tokens against the next window,
  /// and it is not put in debt for the refill it would have had meanwhile, which would make it wait past the
  /// provider's reset). `reset_after` = 0 lowers the balance to `remaining` at once instead (a count that
  /// holds now: a provider whose bucket refills continuously, such as OpenAI's and Anthropic's).
  ///
  /// It never raises what the bucket admits: a hint that allows more than the balance plus what the rate adds
  /// until the reset changes nothing, and while a cap is in force a hint can only lower it (to its count,
  /// keeping the later of the two resets). Takes, reservations and charges before the reset count against
  /// the cap; refunds give back to it, never above the count it was set to.
  ///
  /// @param remaining   units the provider will still admit before its reset, >= 0
  /// @param reset_after time from t until the provider's count resets, >= 0 (a reset already past is 0)
  /// @returns true if the bucket now admits less, false if the hint changed nothing.
  /// @throws std::invalid_argument if remaining < 0 or reset_after < 0 (nothing changes).
  bool limit_remaining(std::int64_t remaining, std::chrono::nanoseconds reset_after, time_point t) {
    if (remaining < 0) detail::throw_invalid(type_name, "remaining must be >= 0", detail::show(remaining));
    if (reset_after.count() < 0) {
      detail::throw_invalid(type_name, "reset_after must be >= 0", detail::show(reset_after.count()) + " ns");
    }
    const std::int64_t now = clamp(t);
    const int128 units = units_at(now);
    if (reset_after.count() == 0) {
      if (remaining >= capacity_ || remaining * unit() >= units) return false;
      commit(remaining * unit(), now);
      return true;
    }
    // What the bucket alone would admit until the reset: its balance plus the rate's refill, at most. In
    // whole tokens first, so that remaining * unit() below cannot overflow.
    const int128 arrived = int128(reset_after.count()) * fraction_.tokens;
    if (remaining > capacity_ + arrived / unit() || int128(remaining) * unit() >= units + arrived) return false;
    const int128 end = int128(now) + reset_after.count();
    const std::int64_t until = end > std::numeric_limits<std::int64_t>::max() ? std::numeric_limits<std::int64_t>::max()
                                                                              : static_cast<std::int64_t>(end);
    if (now < cap_until_ns_) {
      // A cap in force: a hint can only lower it (another reset's count, or one that arrived out of order,
      // cannot be told apart from this one's, so the lower count and the later end are kept).
      if (remaining >= cap_left_) return false;
      cap_left_ = remaining;
      cap_given_ = std::min(cap_given_, remaining);
      cap_until_ns_ = std::max(cap_until_ns_, until);
    } else {
      cap_until_ns_ = until;
      cap_left_ = cap_given_ = remaining;
    }
    commit(units, now);
    return true;
  }

  /// The tokens in the bucket at t (fractional; negative while reservations are in debt). Reads only.
  ///
  /// A double, for display and snapshots: decisions are exact, this reading is rounded to a double.
  double tokens(time_point t) const {
    const int128 units = units_at(clamp(t));
    const int128 whole = detail::floor_div(units, unit());
    return static_cast<double>(whole) + static_cast<double>(units - whole * unit()) / static_cast<double>(unit());
  }

  /// The tokens in the bucket at t rounded up to a whole token (negative while in debt): the exact reading
  /// that `tokens(t)` rounds to a double. Reads only.
  std::int64_t tokens_rounded_up(time_point t) const { return tokens_rounded_up_ns(clamp(t)); }

  /// Gives back n tokens at t (the unused part of an estimate, or a reservation not used); the bucket
  /// never goes above capacity.
  /// @throws std::invalid_argument if n < 0.
  void refund(std::int64_t n, time_point t) {
    detail::check_request(type_name, n);
    const std::int64_t now = clamp(t);
    const int128 units = units_at(now);
    const int128 room = full() - units;
    commit(n >= detail::ceil_div(room, unit()) ? full() : units + n * unit(), now, -n);
    if (now < cap_until_ns_) cap_left_ = cap_left_ + std::min(n, cap_given_ - std::min(cap_left_, cap_given_));
  }

  /// Changes the rate from time t on: tokens up to t arrive at the old rate, later ones at the new one
  /// (Go's `SetLimitAt`). With warm-up, this is the stable rate; the coldness stays as it is.
  /// @throws std::invalid_argument as the constructor, and leaves the bucket unchanged.
  void set_rate(double rate, time_point t) {
    const fraction next = to_fraction(checked_rate(rate));
    const std::int64_t now = clamp(t);
    const int128 units = units_at(now);
    rate_ = rate;
    if (warming()) {
      commit(units, now);  // re-rates from the coldness and the new stable rate
      return;
    }
    commit(in_unit_of(next, units), now);
    fraction_ = next;
  }

  /// Changes the capacity from time t on; tokens above the new capacity are dropped, and a larger
  /// capacity fills at the rate from the current balance (Go's `SetBurstAt`).
  /// @throws std::invalid_argument as the constructor, and leaves the bucket unchanged.
  void set_capacity(std::int64_t capacity, time_point t) {
    checked_capacity(capacity);
    const std::int64_t now = clamp(t);
    commit(units_at(now), now);  // under the old capacity: a warm-up's idle time is the time it was full
    capacity_ = capacity;
    units_ = std::min(units_, full());
  }

  /// The rate as given, in tokens per second (with warm-up: the stable rate, reached when warm).
  double rate() const noexcept { return rate_; }
  /// The rate at which the bucket refills from `last_time()` on, in tokens per second: `rate()` without
  /// warm-up, between rate() / cold_factor and rate() with it.
  double current_rate() const noexcept { return warming() ? current_rate_ : rate_; }
  /// The warm-up's coldness at `last_time()`, in [0, warmup.period] (see token_bucket_warmup); 0 without
  /// warm-up.
  std::chrono::nanoseconds coldness() const noexcept { return std::chrono::nanoseconds(warming() ? cold_ns_ : 0); }
  /// The capacity (burst) in tokens: the largest n a single request may ask for.
  std::int64_t capacity() const noexcept { return capacity_; }
  /// The latest time at which the state changed (an allowed take, a reservation, a charge, a refund, a
  /// lowering by `limit_remaining` or a setter; never a read or a rejected request); earlier stamps are
  /// treated as this one.
  time_point last_time() const noexcept { return time_point(std::chrono::ceil<duration>(std::chrono::nanoseconds(last_ns_))); }

 private:
  using int128 = detail::int128;
  static constexpr const char* type_name = "rein::algo::token_bucket";

  // The rate is `tokens / per_seconds` tokens per second.
  struct fraction {
    std::int64_t tokens;
    std::int64_t per_seconds;
  };

  static double checked_rate(double rate) {
    if (!(rate > 0 && rate <= max_rate)) {
      detail::throw_invalid(type_name, "rate must be > 0, finite and at most 1e9 tokens per second", detail::show(rate));
    }
    return rate;
  }

  static std::int64_t checked_capacity(std::int64_t capacity) {
    if (capacity < 1 || capacity > max_capacity) {
      detail::throw_invalid(type_name, "capacity must be in [1, 1e15] tokens", detail::show(capacity));
    }
    return capacity;
  }

  static token_bucket_warmup checked_warmup(const token_bucket_warmup& w) {
    if (w.period.count() < 0) detail::throw_invalid(type_name, "warmup.period must be >= 0", detail::show(w.period));
    if (!(w.cold_factor >= 1 && w.cold_factor <= 1000)) {
      detail::throw_invalid(type_name, "warmup.cold_factor must be in [1, 1000]", detail::show(w.cold_factor));
    }
    return w;
  }

  // The first continued-fraction convergent of `rate` within 2^-50 relative (so decimal rates get their
  // obvious fraction), else the last one with a denominator <= 2^40 and a numerator <= 2^62, which keeps
  // every product in `int128`. The expansion runs on the double's exact value m / 2^k.
  static fraction to_fraction(double rate) {
    constexpr detail::uint128 max_denominator = detail::uint128(1) << 40;
    constexpr detail::uint128 max_numerator = detail::uint128(1) << 62;
    if (rate < std::ldexp(1.0, -40)) return {1, static_cast<std::int64_t>(max_denominator)};
    int exponent = 0;
    // rate = mantissa * 2^exponent with mantissa in [0.5, 1), and exponent <= 30 since rate <= 1e9.
    const double mantissa = std::frexp(rate, &exponent);
    detail::uint128 p = static_cast<detail::uint128>(std::ldexp(mantissa, 53));
    detail::uint128 q = detail::uint128(1) << (53 - exponent);
    detail::uint128 h = 1, h_before = 0, k = 0, k_before = 1;  // convergents h/k, seeded as h(-1)/k(-1)
    while (true) {
      const detail::uint128 a = p / q;
      if (k != 0 && a > (max_denominator - k_before) / k) break;
      const detail::uint128 h_next = a * h + h_before, k_next = a * k + k_before;
      if (h_next > max_numerator) break;
      h_before = h, k_before = k, h = h_next, k = k_next;
      const double value = static_cast<double>(h) / static_cast<double>(k);
      if (h != 0 && std::fabs(value - rate) <= rate * std::ldexp(1.0, -50)) break;
      const detail::uint128 r = p % q;
      if (r == 0) break;
      p = q, q = r;
    }
    return {static_cast<std::int64_t>(h), static_cast<std::int64_t>(k)};
  }

  static int128 unit_of(fraction f) noexcept { return int128(f.per_seconds) * detail::ns_per_second; }
  // Units per token; exactly fraction_.tokens units arrive per nanosecond.
  int128 unit() const noexcept { return unit_of(fraction_); }
  int128 full() const noexcept { return capacity_ * unit(); }

  std::int64_t clamp(time_point t) const noexcept {
    const std::int64_t ns = detail::to_ns(t);
    return ns < last_ns_ ? last_ns_ : ns;
  }

  // The balance at `now` (>= last_ns_): refill is linear and stops at full. The product cannot overflow
  // (elapsed < 2^64 ns, p <= 2^62 units per ns, int128 holds 2^127), so the hot path needs no division.
  int128 units_at(std::int64_t now) const noexcept {
    if (units_ >= full()) return units_;
    const int128 elapsed = int128(now) - last_ns_;
    const int128 room = full() - units_;
    const int128 arrived = elapsed * fraction_.tokens;
    if (arrived >= room) return full();
    return units_ + arrived;
  }

  std::int64_t tokens_rounded_up_ns(std::int64_t now) const noexcept {
    return static_cast<std::int64_t>(detail::ceil_div(units_at(now), unit()));
  }

  // Nanoseconds until `missing` units have arrived (0 if none are missing).
  int128 wait_ns(int128 missing) const noexcept { return missing <= 0 ? 0 : detail::ceil_div(missing, fraction_.tokens); }

  // The balance at `now`, in another unit, rounded down so that a change of rate never adds tokens.
  int128 in_unit_of(fraction next, int128 units) const noexcept {
    const int128 whole = detail::floor_div(units, unit());
    const int128 rest = units - whole * unit();
    return whole * unit_of(next) + detail::floor_div(rest * next.per_seconds, fraction_.per_seconds);
  }

  // Records the balance at `now`. With warm-up, `taken` tokens (negative: refunded) and the time since the
  // last change that the bucket spent full move the coldness, and the refill rate follows it.
  void commit(int128 units, std::int64_t now, std::int64_t taken = 0) noexcept {
    if (warming()) cool(now, taken);
    units_ = units;
    last_ns_ = now;
    if (warming()) rerate();
  }

  // --- warm-up (token_bucket_warmup) ---

  bool warming() const noexcept { return warmup_.period.count() != 0; }

  // Idle time (the bucket full) since last_ns_ cools; tokens taken warm, tokens refunded cool back.
  void cool(std::int64_t now, std::int64_t taken) noexcept {
    const int128 period = warmup_.period.count();
    const int128 elapsed = int128(now) - last_ns_;
    const int128 filling = units_ >= full() ? 0 : wait_ns(full() - units_);
    // Capped before the tokens count, as Guava caps its stored permits before a take spends them.
    int128 cold = std::min(period, cold_ns_ + (elapsed > filling ? elapsed - filling : 0));
    const int128 worth = coldness_of(taken < 0 ? -int128(taken) : int128(taken));
    cold = taken < 0 ? cold + worth : cold - worth;
    cold_ns_ = static_cast<std::int64_t>(std::clamp(cold, int128(0), period));
  }

  // The coldness n tokens are worth: P / M each (M, Guava's maxPermits, is P x rate x (f + 5) / (2 (f + 1))),
  // rounded down; at most the period.
  int128 coldness_of(int128 n) const noexcept {
    const double f = warmup_.cold_factor;
    const double ns = static_cast<double>(n) * 1e9 / (rate_ * ((f + 5) / (2 * (f + 1))));
    const double period = static_cast<double>(warmup_.period.count());
    return ns >= period ? int128(warmup_.period.count()) : int128(std::floor(ns));
  }

  // The refill rate at the coldness: stable up to the threshold T, then 1 / rate grows linearly to f / rate
  // at the period P. One division of exact integers (for whole-number rates), so decimal steps stay exact.
  double warm_rate() const noexcept {
    const double f = warmup_.cold_factor;
    const double period = static_cast<double>(warmup_.period.count());
    const double threshold = period * (f + 1) / (f + 5);
    const double excess = static_cast<double>(cold_ns_) - threshold;
    if (excess <= 0) return rate_;
    const double span = period - threshold;
    return rate_ * span / (span + (f - 1) * excess);
  }

  void rerate() noexcept {
    const double next_rate = warm_rate();
    if (next_rate == current_rate_) return;
    const fraction next = to_fraction(next_rate);
    units_ = in_unit_of(next, units_);
    fraction_ = next;
    current_rate_ = next_rate;
  }

  // What a provider's cap still allows at `now` (limit_remaining); unlimited when none is in force.
  std::int64_t capped(std::int64_t now) const noexcept {
    return now < cap_until_ns_ ? cap_left_ : std::numeric_limits<std::int64_t>::max();
  }

  void spend_cap(std::int64_t n, std::int64_t now) noexcept {
    if (now < cap_until_ns_) cap_left_ = cap_left_ < std::numeric_limits<std::int64_t>::min() + n ? cap_left_ : cap_left_ - n;
  }

  double rate_;
  fraction fraction_;
  std::int64_t capacity_;
  std::int64_t last_ns_;
  int128 units_ = 0;  // tokens x unit(); negative while reservations are in debt
  // A provider's cap (limit_remaining): at most cap_left_ more tokens before cap_until_ns_.
  std::int64_t cap_until_ns_ = std::numeric_limits<std::int64_t>::min();
  std::int64_t cap_left_ = 0;
  std::int64_t cap_given_ = 0;  // the count the cap was set to: refunds never lift it above
  token_bucket_warmup warmup_;
  std::int64_t cold_ns_;       // the warm-up's coldness at last_ns_, in [0, warmup_.period]
  double current_rate_ = 0;    // with warm-up: the refill rate fraction_ holds
};

/// The token bucket on `std::chrono::steady_clock`.
using token_bucket = basic_token_bucket<>;

}  // namespace rein::algo
