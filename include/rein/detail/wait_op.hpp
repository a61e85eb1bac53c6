// A parked acquire: an intrusive node that owns the handler. Not API.
//
// Invariants (the whole waiter core rests on them):
// - An op is linked into its limiter's queue while `status == queued`, and only then. Whoever changes the
//   status away from `queued` does so under the limiter's lock and at the same time unlinks the op; that
//   party alone completes it ("whoever unlinks it owns its completion"), so a late cancellation finds a
//   non-queued status and does nothing.
// - Completion never runs the handler in place: `complete` posts a runner to the handler's associated
//   executor. The op stays allocated until the runner runs there, clears the cancellation slot and frees the
//   op, so a cancellation emitted meanwhile (from that same executor, as Asio requires of emitters) still
//   reads a live op and sees it is no longer queued.
#pragma once

#include <rein/config.hpp>
#include <rein/detail/permit_source.hpp>
#include <rein/error.hpp>
#include <rein/permit.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/associated_allocator.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/error.hpp>
#include <asio/post.hpp>
#else
#include <boost/asio/associated_allocator.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/post.hpp>
#endif

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>

namespace rein::detail {

enum class wait_status : std::uint8_t { queued, granted, aborted, closed, timed_out, queue_full, exceeds_capacity };

inline error_code to_error_code(wait_status s) noexcept {
  switch (s) {
    case wait_status::queued:
    case wait_status::granted: return {};
    case wait_status::aborted: return net::error::operation_aborted;
    case wait_status::closed: return errc::closed;
    case wait_status::timed_out: return errc::timed_out;
    case wait_status::queue_full: return errc::queue_full;
    case wait_status::exceeds_capacity: return errc::exceeds_capacity;
  }
  return {};
}

inline constexpr std::int64_t no_deadline = std::numeric_limits<std::int64_t>::max();

struct wait_op {
  using complete_fn = void (*)(wait_op*, const void* io_executor, permit_source* source);

  // FIFO links (op_queue).
  wait_op* next = nullptr;
  wait_op* prev = nullptr;
  // Pairing-heap links (deadline_heap); used only when the op has a deadline.
  wait_op* heap_child = nullptr;
  wait_op* heap_sibling = nullptr;
  wait_op* heap_back = nullptr;  // parent if first child, else left sibling
  std::int64_t deadline_ns = no_deadline;
  std::int64_t stamp_ns = 0;  // enqueue time while queued, grant time once granted
  std::size_t count = 0;
  complete_fn complete = nullptr;
  std::atomic<wait_status> status{wait_status::queued};
};

/// Cancellation target: the limiter core, which unlinks under its lock.
class canceller {
 public:
  virtual void cancel_wait(wait_op* op) noexcept = 0;

 protected:
  ~canceller() = default;
};

/// Installed in the handler's cancellation slot. All three cancellation types are honoured: a queued op has
/// had no side effect yet, so removing it is terminal, partial and total cancellation at once.
class cancel_handler {
 public:
  cancel_handler(canceller* target, wait_op* op) noexcept : target_(target), op_(op) {}

  void operator()(net::cancellation_type_t type) const noexcept {
    if ((type & (net::cancellation_type::terminal | net::cancellation_type::partial |
                 net::cancellation_type::total)) == net::cancellation_type::none)
      return;
    // A non-queued op is already owned by someone else; its limiter may even be gone.
    if (op_->status.load(std::memory_order_acquire) != wait_status::queued) return;
    target_->cancel_wait(op_);
  }

 private:
  canceller* target_;
  wait_op* op_;
};

/// The concrete op for one handler type. WithPermit selects the completion signature:
/// `void(error_code, rein::permit)` for concurrency limiters, `void(error_code)` for rate limiters.
template <class Handler, class IoExecutor, bool WithPermit>
class wait_op_impl final : public wait_op {
  using handler_allocator = net::associated_allocator_t<Handler>;
  using allocator_type = typename std::allocator_traits<handler_allocator>::template rebind_alloc<wait_op_impl>;
  using alloc_traits = std::allocator_traits<allocator_type>;

 public:
  /// Allocates with the handler's associated allocator (as Asio's own operations do).
  static wait_op_impl* create(Handler&& handler, std::size_t n) {
    allocator_type alloc(net::get_associated_allocator(handler));
    wait_op_impl* p = alloc_traits::allocate(alloc, 1);
    try {
      return ::new (static_cast<void*>(p)) wait_op_impl(std::move(handler), n);
    } catch (...) {
      alloc_traits::deallocate(alloc, p, 1);
      throw;
    }
  }

  /// Installs the cancellation handler if the handler's slot is connected.
  void connect_cancellation(canceller* target) {
    auto slot = net::get_associated_cancellation_slot(handler_);
    if (slot.is_connected()) slot.template emplace<cancel_handler>(target, this);
  }

  /// Frees an op that was never handed to anyone (its initiation failed before it was queued).
  void destroy() noexcept { destroy(this); }

 private:
  wait_op_impl(Handler&& handler, std::size_t n) : handler_(std::move(handler)) {
    count = n;
    complete = &do_complete;
  }

  static void destroy(wait_op_impl* op) noexcept {
    allocator_type alloc(net::get_associated_allocator(op->handler_));
    op->~wait_op_impl();
    alloc_traits::deallocate(alloc, op, 1);
  }

  // Runs on the handler's associated executor. Owns the op: frees it when run or destroyed unrun
  // (an io_context destroyed with the completion still queued).
  class runner {
   public:
    runner(wait_op_impl* op, permit_source* source) noexcept : op_(op), source_(source) {}
    runner(runner&& other) noexcept : op_(std::exchange(other.op_, nullptr)), source_(other.source_) {}
    runner(const runner&) = delete;
    runner& operator=(const runner&) = delete;
    runner& operator=(runner&&) = delete;
    ~runner() {
      if (op_ != nullptr) destroy(op_);
    }

    using allocator_type = handler_allocator;
    allocator_type get_allocator() const noexcept { return net::get_associated_allocator(op_->handler_); }

    void operator()() {
      wait_op_impl* op = std::exchange(op_, nullptr);
      auto slot = net::get_associated_cancellation_slot(op->handler_);
      if (slot.is_connected()) slot.clear();
      Handler handler(std::move(op->handler_));
      const wait_status status = op->status.load(std::memory_order_relaxed);
      const std::size_t n = op->count;
      const std::chrono::nanoseconds stamp(op->stamp_ns);
      destroy(op);
      if constexpr (WithPermit) {
        permit p = status == wait_status::granted ? permit(source_, n, stamp) : permit();
        std::move(handler)(to_error_code(status), std::move(p));
      } else {
        (void)n;
        (void)stamp;
        std::move(handler)(to_error_code(status));
      }
    }

   private:
    wait_op_impl* op_;
    permit_source* source_;
  };

  static void do_complete(wait_op* base, const void* io_executor, permit_source* source) {
    auto* op = static_cast<wait_op_impl*>(base);
    auto ex = net::get_associated_executor(op->handler_, *static_cast<const IoExecutor*>(io_executor));
    net::post(ex, runner(op, source));
  }

  Handler handler_;
};

}  // namespace rein::detail
