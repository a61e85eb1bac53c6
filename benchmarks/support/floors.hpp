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
#pragma once

#include <rein/config.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>
#else
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#endif

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

}  // namespace rein_bench
