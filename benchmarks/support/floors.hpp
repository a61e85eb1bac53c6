// Floors that benchmarks of awaitable primitives compare against: what the same coroutine costs without the
// primitive.
//
// - ready_now(v): `co_await`-ing a nested awaitable that returns at once. This is the least a coroutine
//   fast path such as `co_await sem.acquire()` can cost: one nested coroutine frame (from Asio's recycling
//   allocator), entered and left without suspending through the scheduler.
// - post_round_trip(): `co_await net::post(net::use_awaitable)`, one trip through the scheduler, the least
//   any completion that goes through an executor costs.
// - park_lot: parks coroutines on nothing: the completion handler is kept in storage reserved beforehand, so a
//   parked waiter costs its coroutine frames and no other heap memory. The memory floor of "N waiters".
// - handoff_floor: the least a semaphore that parks coroutines costs per handoff: a count and a ring of
//   parked handlers, release() posting the oldest one's completion. The floor of a contended handoff.
#pragma once

#include <rein/config.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/any_io_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>
#else
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#endif

#include <array>
#include <cstddef>
#include <memory>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <utility>

namespace rein_bench {

namespace net = rein::net;

/// A nested awaitable that completes at once with `value`.
template <class T>
net::awaitable<T> ready_now(T value) {
  co_return value;
}

/// One scheduler round trip of the calling coroutine.
inline auto post_round_trip() { return net::post(net::use_awaitable); }

/// Parks up to `capacity` coroutines on nothing; see the file comment.
///
/// `co_await lot.park<Result>()` (signature `void(error_code, Result)`, as a rein acquire has) suspends the coroutine until the lot is cleared; clearing destroys the parked
/// handlers, which destroys the parked coroutines without resuming them (Asio posts that destruction to their
/// executor, so run it afterwards). The frames mirror a typical waiting fast path: a nested coroutine that
/// co_awaits an async operation, as `co_await sem.acquire()` does when it must wait.
class park_lot {
 public:
  static constexpr std::size_t slot_bytes = 64;

  explicit park_lot(std::size_t capacity) : slots_(std::make_unique<slot[]>(capacity)), capacity_(capacity) {}
  park_lot(const park_lot&) = delete;
  park_lot& operator=(const park_lot&) = delete;
  ~park_lot() { clear(); }

  std::size_t size() const noexcept { return size_; }

  /// Suspends until clear(): a nested coroutine frame plus the async operation's frame, nothing else.
  template <class Result>
  net::awaitable<Result> park() {
    co_return co_await async_park<Result>();
  }

  /// The async operation alone (no frame of its own), completing with `void(error_code, Result)`; `args`
  /// are kept in the operation's frame, as an initiating function's arguments are (they let a benchmark
  /// mirror the frames of the primitive it measures).
  template <class Result, class... Args>
  auto async_park(Args... args) {
    return net::async_initiate<const net::use_awaitable_t<>&, void(rein::error_code, Result)>(
        initiation{this}, net::use_awaitable, std::move(args)...);
  }

  /// Destroys every parked handler (and so its coroutine).
  void clear() noexcept {
    for (std::size_t i = 0; i < size_; ++i) slots_[i].destroy(slots_[i].storage);
    size_ = 0;
  }

 private:
  struct slot {
    alignas(std::max_align_t) unsigned char storage[slot_bytes];
    void (*destroy)(void*) = nullptr;
  };

  struct initiation {
    park_lot* lot;
    template <class Handler, class... Args>
    void operator()(Handler&& handler, const Args&...) const {
      lot->keep(std::forward<Handler>(handler));
    }
  };

  template <class Handler>
  void keep(Handler&& handler) {
    using stored = std::decay_t<Handler>;
    static_assert(sizeof(stored) <= slot_bytes && alignof(stored) <= alignof(std::max_align_t),
                  "park_lot: the handler does not fit its slot");
    if (size_ == capacity_) throw std::length_error("rein_bench::park_lot: full");
    slot& s = slots_[size_++];
    ::new (static_cast<void*>(s.storage)) stored(std::forward<Handler>(handler));
    s.destroy = [](void* p) { std::launder(static_cast<stored*>(p))->~stored(); };
  }

  std::unique_ptr<slot[]> slots_;
  std::size_t capacity_;
  std::size_t size_ = 0;
};

/// The least a semaphore that parks coroutines can do per handoff, with nothing a user relies on beyond
/// that: a count, and a first-in-first-out ring of parked completion handlers in storage reserved
/// beforehand; release() hands its permit to the oldest waiter by posting that waiter's completion to its
/// executor. No cancellation, deadline, statistic, order other than arrival, allocation or thread safety.
/// `acquire()` is a nested coroutine awaiting the operation as rein's `acquire()` does (deferred where
/// Asio awaits it without a frame of its own); it returns nothing, where rein's returns a permit (see the
/// floor that returns one, benchmarks/semaphore.cpp).
class handoff_floor {
 public:
  static constexpr std::size_t capacity = 256;  // waiters parked at once
  static constexpr std::size_t slot_bytes = 64;

  handoff_floor(const net::any_io_executor&, std::size_t permits) : available_(permits) {}
  handoff_floor(const handoff_floor&) = delete;
  handoff_floor& operator=(const handoff_floor&) = delete;
  ~handoff_floor() {
    for (; head_ != tail_; ++head_) slot_at(head_).destroy(slot_at(head_).storage);
  }

  net::awaitable<void> acquire() {
    if (available_ > 0) {
      --available_;
      co_return;
    }
#if REIN_HAS_AWAIT_DEFERRED
    co_await net::async_initiate<const rein::default_token_t&, void()>(initiation{this}, rein::default_token_t{});
#else
    co_await net::async_initiate<const net::use_awaitable_t<>&, void()>(initiation{this}, net::use_awaitable);
#endif
  }

  void release() {
    if (head_ == tail_) {
      ++available_;
      return;
    }
    slot& s = slot_at(head_++);
    s.post(s.storage);
  }

 private:
  struct slot {
    alignas(std::max_align_t) unsigned char storage[slot_bytes];
    void (*post)(void*) = nullptr;     // moves the handler out, destroys it here, posts its completion
    void (*destroy)(void*) = nullptr;  // destroys it without completing
  };

  struct initiation {
    handoff_floor* self;
    template <class Handler>
    void operator()(Handler&& handler) const {
      self->park(std::forward<Handler>(handler));
    }
  };

  slot& slot_at(std::size_t i) noexcept { return ring_[i % capacity]; }

  template <class Handler>
  void park(Handler&& handler) {
    using stored = std::decay_t<Handler>;
    static_assert(sizeof(stored) <= slot_bytes && alignof(stored) <= alignof(std::max_align_t),
                  "handoff_floor: the handler does not fit its slot");
    if (tail_ - head_ == capacity) throw std::length_error("rein_bench::handoff_floor: full");
    slot& s = slot_at(tail_++);
    ::new (static_cast<void*>(s.storage)) stored(std::forward<Handler>(handler));
    s.post = [](void* p) {
      stored* parked = std::launder(static_cast<stored*>(p));
      stored h(std::move(*parked));
      parked->~stored();
      net::post(std::move(h));
    };
    s.destroy = [](void* p) { std::launder(static_cast<stored*>(p))->~stored(); };
  }

  std::array<slot, capacity> ring_{};
  std::size_t head_ = 0;
  std::size_t tail_ = 0;
  std::size_t available_;
};

}  // namespace rein_bench
