// The doors of every limiter on the wait line, written once: try_acquire, async_acquire / _for / _until,
// acquire / _for / _until, and the drain doors. Not API.
//
// Each public limiter keeps its own documented member functions (the documentation users read: Doxygen
// does not show detail/) and forwards each to the one implementation here, so that the rules every door
// shares hold for every primitive alike:
// - one deadline computation (deadline_after in clock_time.hpp, saturating): a timeout too long to
//   represent, such as duration::max(), means no deadline;
// - the coroutine doors skip the synchronous try, and its lock, while others wait (it would fail: a waiter
//   is never overtaken), and a remote line has no synchronous try at all;
// - the initiations are named, as Asio's own I/O objects' are, so that async_initiate finds the I/O
//   executor;
// - a named limiter's coroutine doors throw rein::system_error whose what() names it
//   (`rein::semaphore "db": ...`).
#pragma once

#include <rein/config.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/detail/clock_time.hpp>
#include <rein/detail/line_place.hpp>
#include <rein/detail/invalid_option.hpp>
#include <rein/error.hpp>
#include <rein/permit.hpp>
#include <rein/try_result.hpp>

#include REIN_ASIO_HEADER(async_result.hpp)
#include REIN_ASIO_HEADER(awaitable.hpp)
#if !REIN_HAS_AWAIT_DEFERRED
#include REIN_ASIO_HEADER(use_awaitable.hpp)
#endif

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace rein::detail {

/// How a request for n is counted on the line: n itself, for every limiter but the quota gate (which
/// passes a ticket in its place: quota_gate_policy.hpp).
struct count_as_is {
  std::size_t try_count(std::size_t n) const noexcept { return n; }
  std::size_t wait_count(std::size_t n) const noexcept { return n; }
};

/// The doors of one limiter: a view of its line (`Core`, a limiter_core) made by each call of the public
/// object's doors(), so it follows the limiter when it is moved.
template <class Core, class Counter = count_as_is>
struct line_doors {
  using core_type = Core;
  using executor_type = typename Core::executor_type;
  using time_point = typename Core::time_point;
  using duration = typename Core::duration;
  using signature = typename Core::signature;
  /// What the coroutine doors return: a permit, or nothing for a rate rule.
  using result_type = std::conditional_t<Core::with_permit, permit, void>;
  /// What try_acquire returns: a permit that says why it is empty, or a result with a retry hint.
  using try_type = std::conditional_t<Core::with_permit, try_permit, try_result>;

  Core* core;
  std::string_view type;  ///< the public type's name, for messages ("rein::semaphore"); a static string
  [[no_unique_address]] Counter counter{};
  line_place place{};  ///< its class, partition, and fair key and weight (at_priority, partition, for_key)

  /// The deadline `timeout` from now (time_point::max() when too far to represent: none).
  static time_point deadline_after(duration timeout) { return detail::deadline_after<typename Core::clock_type>(timeout); }

  /// `at`: the instant to decide at, read by the caller from the limiter's clock; null reads the clock.
  try_type try_acquire(std::size_t n, const time_point* at = nullptr) const {
    std::chrono::nanoseconds stamp{};
    if constexpr (Core::with_permit) {
      std::uint64_t note = 0;
      const try_status status = core->try_acquire(counter.try_count(n), stamp, nullptr, place.partition, at, &note);
      if (status != try_status::acquired) return try_permit(status);
      return try_permit(core->make_permit(n, stamp, place.partition, note));
    } else {
      std::int64_t retry_ns = -1;
      const try_status status = core->try_acquire(counter.try_count(n), stamp, &retry_ns, 0, at);
      return try_result(status, retry_ns);
    }
  }

  template <class Token>
  auto async_acquire_until(std::size_t n, time_point deadline, Token&& token) const {
    return net::async_initiate<Token, signature>(initiate_acquire{core, counter, place}, token, n,
                                                 deadline);
  }

  template <class Token>
  auto async_acquire_for(std::size_t n, duration timeout, Token&& token) const {
    return async_acquire_until(n, deadline_after(timeout), std::forward<Token>(token));
  }

  net::awaitable<result_type> acquire_until(std::size_t n, time_point deadline) const {
    return wait(core, type, place, n, deadline, counter);  // the coroutine keeps copies: this view is a temporary
  }

  net::awaitable<result_type> acquire_for(std::size_t n, duration timeout) const {
    return wait(core, type, place, n, deadline_after(timeout), counter);
  }

  template <class Token>
  auto async_drain_until(time_point deadline, Token&& token) const
    requires Core::with_permit
  {
    return net::async_initiate<Token, void(error_code)>(initiate_drain{core}, token, deadline);
  }

  template <class Token>
  auto async_drain_for(duration timeout, Token&& token) const
    requires Core::with_permit
  {
    return async_drain_until(deadline_after(timeout), std::forward<Token>(token));
  }

 private:
  // The wait is awaited as a deferred operation where Asio allows it: the awaiting coroutine holds it in its
  // own frame, where use_awaitable makes one more coroutine frame for it (about a seventh of the instructions
  // of a contended handoff, and 176 bytes per parked waiter).
#if REIN_HAS_AWAIT_DEFERRED
  using wait_token = default_token_t;
#else
  using wait_token = net::use_awaitable_t<>;
#endif

  // The view comes apart into its fields, which travel in registers: a copy of the whole view goes through
  // the stack, where a compiler may reload it in wider words than it stored, stalling the store forwarding
  // (about a third of an uncontended acquire's own time on g++ 12).
  // The counter comes last: an empty one then takes no padding of its own in the frame (with g++ 12, 16
  // bytes more per parked waiter when it came before the place).
  static net::awaitable<result_type> wait(Core* line, std::string_view type_name, line_place where, std::size_t n,
                                          time_point deadline, Counter count) {
    if constexpr (!Core::remote) {
      // Behind other waiters the synchronous try would fail: skip it and its lock (a stale hint only costs
      // the fast path, never correctness: the waiting path grants at once what is free).
      if (!line->waiting_hint()) {
        std::chrono::nanoseconds stamp{};
        std::uint64_t note = 0;
        if (line->try_acquire(count.try_count(n), stamp, nullptr, where.partition, nullptr, &note) ==
            try_status::acquired) {
          if constexpr (Core::with_permit) co_return line->make_permit(n, stamp, where.partition, note);
          else co_return;
        }
      }
    }
    if (!line->shared_name()) co_return co_await wait_operation(line, where, n, deadline, count);
    // The name is held before the wait: a limiter destroyed meanwhile completes it with operation_aborted,
    // and its core may be gone when this coroutine resumes. It is worded only if the wait fails.
    const std::shared_ptr<const std::string> name = line->shared_name();
    try {
      co_return co_await wait_operation(line, where, n, deadline, count);
    } catch (const system_error& e) {
      throw system_error(e.code(), describe(type_name, *name));
    }
  }

  // The wait, made from the fields alone: a view kept as a local of wait() would sit in its frame beside
  // them for as long as the waiter is parked (16 bytes per parked waiter with g++ 12).
  static auto wait_operation(Core* line, line_place where, std::size_t n, time_point deadline, Counter count) {
    wait_token token{};
    return net::async_initiate<wait_token, signature>(initiate_acquire{line, count, where}, token, n, deadline);
  }

  struct initiate_acquire {
    Core* core;
    [[no_unique_address]] Counter counter;
    line_place place;
    using executor_type = typename Core::executor_type;
    executor_type get_executor() const noexcept { return core->get_executor(); }

    template <class Handler>
    void operator()(Handler&& handler, std::size_t n, time_point deadline) const {
      core->async_acquire(std::forward<Handler>(handler), counter.wait_count(n), deadline, place);
    }
  };

  struct initiate_drain {
    Core* core;
    using executor_type = typename Core::executor_type;
    executor_type get_executor() const noexcept { return core->get_executor(); }

    template <class Handler>
    void operator()(Handler&& handler, time_point deadline) const {
      core->async_drain(std::forward<Handler>(handler), deadline);
    }
  };
};

}  // namespace rein::detail
