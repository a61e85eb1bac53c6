// The admission rule of rein::basic_rate_limiter (any rein::algo::rate_limit) as the wait line asks it,
// with the grant-time predictions that fail a deadline that cannot be met at once. Not API.
#pragma once

#include <rein/algo/all_of.hpp>
#include <rein/algo/rate_limit.hpp>
#include <rein/algo/sliding_window.hpp>
#include <rein/algo/token_bucket.hpp>
#include <rein/observer.hpp>
#include <rein/outcome.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>

namespace rein::detail {

// ---- Grant-time predictions, so that a deadline that cannot be met fails at once ------------------------
//
// Each returns a lower bound on the time a waiter for n, queued behind `ahead` units, is granted (nullopt:
// no bound known). A lower bound never fails a wait that could have succeeded; where it is exact (the token
// bucket, a window of single starts), a wait that would miss its deadline fails at once.

template <class Limit>
using grant_time = std::optional<typename Limit::time_point>;
template <class Limit>
using time_of = typename Limit::time_point;
template <class Clock>
using bucket_of = algo::basic_token_bucket<Clock>;
template <class Clock>
using window_of = algo::basic_sliding_window<Clock>;

template <class Limit>
grant_time<Limit> earliest_grant(const Limit& limit, std::uint64_t ahead, std::uint64_t n, time_of<Limit> now);
template <class Clock>
grant_time<bucket_of<Clock>> earliest_grant(const bucket_of<Clock>& bucket, std::uint64_t ahead, std::uint64_t n,
                                            time_of<bucket_of<Clock>> now);
template <class Clock>
grant_time<window_of<Clock>> earliest_grant(const window_of<Clock>& window, std::uint64_t ahead, std::uint64_t n,
                                            time_of<window_of<Clock>> now);
template <class... Limits>
grant_time<algo::all_of<Limits...>> earliest_grant(const algo::all_of<Limits...>& limits, std::uint64_t ahead,
                                                   std::uint64_t n, time_of<algo::all_of<Limits...>> now);

inline std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) noexcept {
  return a > std::numeric_limits<std::uint64_t>::max() - b ? std::numeric_limits<std::uint64_t>::max() : a + b;
}

// Any rate limit: takes only shrink availability, so nobody is granted before its own request fits alone.
template <class Limit>
grant_time<Limit> earliest_grant(const Limit& limit, std::uint64_t, std::uint64_t n, time_of<Limit> now) {
  return limit.ready_at(static_cast<std::int64_t>(n), now);
}

// A FIFO of waiters, each taking its tokens the instant they are there, never lets the bucket fill (the head
// wants at most the capacity and takes it on arrival). So the backlog drains at exactly the rate, as if the
// bucket had no cap: on a copy whose capacity holds the whole backlog, the backlog's ready time is exact.
template <class Clock>
grant_time<bucket_of<Clock>> earliest_grant(const bucket_of<Clock>& bucket, std::uint64_t ahead, std::uint64_t n,
                                            time_of<bucket_of<Clock>> now) {
  using bucket_type = bucket_of<Clock>;
  const std::uint64_t total = saturating_add(ahead, n);
  if (total > static_cast<std::uint64_t>(bucket_type::max_capacity)) {
    return bucket.ready_at(static_cast<std::int64_t>(n), now);
  }
  bucket_type backlog = bucket;
  backlog.set_capacity(std::max(static_cast<std::int64_t>(total), bucket.capacity()), now);
  return backlog.ready_at(static_cast<std::int64_t>(total), now);
}

// Count the backlog as single starts s_1, s_2, ... (splitting requests can only make them earlier). Start j
// needs start j - limit to have left the window, so s_j = s_r + q * window with j - 1 = q * limit + (r - 1),
// and s_r for r <= limit is the window's own ready_at(r).
template <class Clock>
grant_time<window_of<Clock>> earliest_grant(const window_of<Clock>& window, std::uint64_t ahead, std::uint64_t n,
                                            time_of<window_of<Clock>> now) {
  using time_point = typename Clock::time_point;
  const std::uint64_t total = saturating_add(ahead, n);
  if (total == 0) return window.ready_at(0, now);
  const std::uint64_t last = total - 1;
  const auto limit = static_cast<std::uint64_t>(window.limit());
  const std::optional<time_point> first = window.ready_at(static_cast<std::int64_t>(last % limit + 1), now);
  if (!first) return std::nullopt;
  const algo::detail::int128 ns = algo::detail::int128(algo::detail::to_ns(*first)) +
                                  algo::detail::int128(last / limit) * algo::detail::duration_ns(window.window());
  return algo::detail::from_ns<time_point>(ns);
}

// Every part's own bound holds for the whole: the latest of them.
template <class... Limits>
grant_time<algo::all_of<Limits...>> earliest_grant(const algo::all_of<Limits...>& limits, std::uint64_t ahead,
                                                   std::uint64_t n, time_of<algo::all_of<Limits...>> now) {
  using time_point = typename algo::all_of<Limits...>::time_point;
  std::optional<time_point> latest;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (([&] {
       const std::optional<time_point> part = earliest_grant(limits.template get<I>(), ahead, n, now);
       if (part && (!latest || *part > *latest)) latest = part;
     }()),
     ...);
  }(std::make_index_sequence<sizeof...(Limits)>{});
  return latest;
}

// ---- The policy: a pure rate limit seen through limiter_core's eyes -------------------------------------
//
// A queued waiter whose n is above a capacity lowered after it queued (the only way n > capacity reaches
// try_take) is served as a request for the whole capacity: granted when the limit is entirely free. The core
// cannot fail a single queued op, and leaving it would block the line for good.
template <algo::rate_limit Limit>
class rate_limit_policy {
 public:
  static constexpr bool needs_time = true;
  using time_point = typename Limit::time_point;

  explicit rate_limit_policy(Limit limit) : limit_(std::move(limit)) {}

  bool exceeds(std::size_t n) const noexcept { return n > static_cast<std::uint64_t>(limit_.capacity()); }

  bool try_take(std::size_t n, time_point now) {
    return limit_.try_take(clamped(n), now) == algo::take_result::allowed;
  }

  time_point ready_at(std::size_t n, time_point now) const {
    return limit_.ready_at(clamped(n), now).value_or(time_point::max());
  }

  // A rate limit's bound is never "unknown": no bound means the wait is beyond the clock's range at the
  // current rate, i.e. never.
  std::optional<time_point> predict(std::size_t ahead, std::size_t n, time_point now) const {
    return earliest_grant(limit_, ahead, n, now).value_or(time_point::max());
  }

  void on_release(std::size_t, std::chrono::nanoseconds, outcome, time_point) noexcept {}  // nothing is held

  // A grant taken back before its handler ran (a cancellation after the grant), at the instant of the grant
  // (the core checks), gives its units back, so that such a race (an `||`, a cancel_after) loses no token.
  void on_revoke(std::size_t n, time_point now) noexcept {
    try {
      limit_.refund(clamped(n), now);
    } catch (...) {  // refunds do not allocate; a limit that throws anyway keeps the units taken
    }
  }

  // The limit's rate (per second) or count, whichever it has; an adaptive rate also reports its cuts and its
  // floor and ceiling, and a limit change only when the whole part of the rate moves or a cut happens.
  observed_state observe(time_point) const noexcept {
    observed_state s;
    if constexpr (requires { limit_.rate(); }) s.limit = static_cast<double>(limit_.rate());
    else if constexpr (requires { limit_.limit(); }) s.limit = static_cast<double>(limit_.limit());
    s.level = s.limit;
    if constexpr (requires { limit_.decreases(); limit_.get_options().min_rate; }) {
      s.level = std::floor(s.limit);
      s.cuts = limit_.decreases();
      s.at_floor = s.limit <= limit_.get_options().min_rate;
      s.at_ceiling = s.limit >= limit_.get_options().max_rate;
    }
    return s;
  }

  Limit& limit() noexcept { return limit_; }
  const Limit& limit() const noexcept { return limit_; }

 private:
  std::int64_t clamped(std::size_t n) const noexcept {
    return static_cast<std::int64_t>(std::min<std::uint64_t>(n, static_cast<std::uint64_t>(limit_.capacity())));
  }

  Limit limit_;
};

}  // namespace rein::detail
