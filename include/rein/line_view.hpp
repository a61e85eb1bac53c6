// The doors of a limiter at one priority class, partition or fair key: what `limiter.at_priority(c)`,
// `limiter.partition(name)` and `limiter.for_key(key, weight)` return.
#pragma once

#include <rein/config.hpp>
#include <rein/detail/acquire_doors.hpp>
#include <rein/detail/invalid_option.hpp>
#include <rein/detail/line_place.hpp>
#include <rein/lease_view.hpp>
#include <rein/queue_order.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

namespace rein {

/// A limiter's acquire doors at one priority class, partition or fair key: made by `at_priority(c)` of a
/// limiter whose options chose `order = queue_order::priority`, by `partition(name)` of a limiter whose
/// options gave `partitions`, or by `for_key(key, weight)` of a limiter whose options chose
/// `order = queue_order::fair`, and used as the limiter's own doors are (the forms that take a count n):
///
///     auto batch = limiter.at_priority(2);               // class 2: yields to classes 0 and 1
///     auto permit = co_await batch.acquire();            // a plain limiter.acquire() is class 0
///     auto live = co_await limiter.partition("live").acquire();   // counts against live's share
///     auto mine = co_await limiter.for_key(tenant, 2).acquire();  // twice the share of a weight-1 key
///
/// Each acquire waits in the limiter's one line: placed by the key `arrival + c * priority_aging` (see
/// queue_order::priority for the bound this gives) or by its key's start tag (see queue_order::fair), and
/// served ahead of the line while its partition is below its guarantee (see rein::partition). Everything
/// else is the limiter's own: its completion signature, errors, deadlines, per-operation cancellation and
/// thread safety, as documented for its try_acquire, async_acquire and acquire. A view is a few words and refers to the limiter's state, as a permit does:
/// make one per call, or keep it while that state lives (until the limiter is destroyed or assigned to;
/// moving a limiter moves its state, and the view follows).
///
/// @tparam Doors the limiter's doors (an implementation type: name the view with `auto`).
template <class Doors>
class line_view {
 public:
  /// The executor that runs completion handlers without an associated executor of their own.
  using executor_type = typename Doors::executor_type;
  /// A point in time of the limiter's clock.
  using time_point = typename Doors::time_point;
  /// A duration of the limiter's clock.
  using duration = typename Doors::duration;
  /// What acquire returns: rein::permit for a concurrency limiter, nothing for a rate limiter.
  using result_type = typename Doors::result_type;

  /// The view of `doors`, whose fields name the class and partition (made by the limiters' at_priority
  /// and partition).
  explicit line_view(Doors doors) noexcept : doors_(doors) {}

  /// The class: 0 is served first.
  std::uint8_t priority() const noexcept { return doors_.place.priority; }

  /// The same doors at class `c` (see the limiter's at_priority; throws the same way).
  line_view at_priority(std::uint8_t c) const;

  /// The same doors for fair key `key` at `weight` (see the limiter's for_key; throws the same way).
  line_view for_key(std::string_view key, std::uint32_t weight = 1) const;

  /// The same doors whose permits are leased for `lease`, for a semaphore's view only
  /// (`sem.partition("live").with_lease(30s)`): see basic_semaphore::with_lease and rein::lease_view;
  /// throws the same way.
  template <class D = Doors>
    requires D::core_type::leasable
  auto with_lease(duration lease) const {
    return detail::with_lease(doors_, lease);
  }

  /// As the limiter's try_acquire, in this view's partition: what it returns says why it failed.
  auto try_acquire(std::size_t n = 1) const { return doors_.try_acquire(n); }

  /// As the limiter's async_acquire, at this class and partition. Every Asio completion token works.
  template <REIN_COMPLETION_TOKEN_FOR(typename Doors::signature) Token = default_token_t>
  auto async_acquire(std::size_t n = 1, Token&& token = Token{}) const {
    return doors_.async_acquire_until(n, time_point::max(), std::forward<Token>(token));
  }

  /// As the limiter's async_acquire_for (errc::timed_out after `timeout`), at this class and partition.
  template <REIN_COMPLETION_TOKEN_FOR(typename Doors::signature) Token = default_token_t>
  auto async_acquire_for(std::size_t n, duration timeout, Token&& token = Token{}) const {
    return doors_.async_acquire_for(n, timeout, std::forward<Token>(token));
  }

  /// As the limiter's async_acquire_until (errc::timed_out at `deadline`), at this class and partition.
  template <REIN_COMPLETION_TOKEN_FOR(typename Doors::signature) Token = default_token_t>
  auto async_acquire_until(std::size_t n, time_point deadline, Token&& token = Token{}) const {
    return doors_.async_acquire_until(n, deadline, std::forward<Token>(token));
  }

  /// As the limiter's acquire, at this class and partition: `auto p = co_await view.acquire();`.
  net::awaitable<result_type> acquire(std::size_t n = 1) const { return doors_.acquire_until(n, time_point::max()); }

  /// As the limiter's acquire_for, at this class and partition.
  net::awaitable<result_type> acquire_for(std::size_t n, duration timeout) const {
    return doors_.acquire_for(n, timeout);
  }

  /// As the limiter's acquire_until, at this class and partition.
  net::awaitable<result_type> acquire_until(std::size_t n, time_point deadline) const {
    return doors_.acquire_until(n, deadline);
  }

 private:
  Doors doors_;
};

namespace detail {

/// `doors` at class `priority`; throws std::invalid_argument unless the line is in priority order (a class
/// would be ignored in the other orders).
template <class Doors>
line_view<Doors> at_priority(Doors doors, std::uint8_t priority) {
  const queue_order order = doors.core->order();
  if (order != queue_order::priority)
    throw_invalid(describe(doors.type, doors.core->name()), "at_priority needs line_options.order = queue_order::priority",
                  to_string(order));
  doors.place.priority = priority;
  return line_view<Doors>(doors);
}

/// `doors` in the partition called `name`; throws std::invalid_argument if the line has no such partition.
template <class Doors>
line_view<Doors> in_partition(Doors doors, std::string_view name) {
  const auto index = doors.core->find_partition(name);
  if (!index) {
    const std::string rule = doors.core->has_partitions() ? "partition(name) needs a name given in line_options.partitions"
                                                          : "partition(name) needs line_options.partitions, which is empty";
    throw_invalid(describe(doors.type, doors.core->name()), rule, '"' + std::string(name) + '"');
  }
  doors.place.partition = *index;
  return line_view<Doors>(doors);
}

/// `doors` for the fair key `key` at `weight`; throws std::invalid_argument unless the line is in fair order
/// and the weight is in [1, max_fair_weight].
template <class Doors>
line_view<Doors> for_key(Doors doors, std::string_view key, std::uint32_t weight) {
  const queue_order order = doors.core->order();
  if (order != queue_order::fair)
    throw_invalid(describe(doors.type, doors.core->name()), "for_key needs line_options.order = queue_order::fair",
                  to_string(order));
  if (weight == 0 || weight > max_fair_weight)
    throw_invalid(describe(doors.type, doors.core->name()), "for_key's weight must be in [1, 1000000]", show(weight));
  // The limiter's own doors are the key "": its hash is 0 (a key hashed to 0 shares their turn).
  doors.place.key = key.empty() ? 0 : std::hash<std::string_view>{}(key);
  doors.place.weight = weight;
  return line_view<Doors>(doors);
}

}  // namespace detail

template <class Doors>
line_view<Doors> line_view<Doors>::at_priority(std::uint8_t c) const {
  return detail::at_priority(doors_, c);
}

template <class Doors>
line_view<Doors> line_view<Doors>::for_key(std::string_view key, std::uint32_t weight) const {
  return detail::for_key(doors_, key, weight);
}

}  // namespace rein
