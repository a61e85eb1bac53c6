// A parked acquire: an intrusive node that owns the handler. Not API.
//
// Invariants (the whole waiter core rests on them):
// - An op is linked into its limiter's queue while `status == queued`, and only then. Whoever changes the
//   status away from `queued` does so under the limiter's lock and at the same time unlinks the op; that
//   party alone completes it ("whoever unlinks it owns its completion"), so a late cancellation finds a
//   non-queued status and does nothing.
// - A grant is not final until its handler runs. Between the grant and the run (the completion is posted),
//   exactly one of two parties wins the op's status with a compare-and-swap from `granted`: the runner
//   (to `delivered`: the handler gets the permit) or a cancellation (to `aborted`, under the limiter's lock:
//   the units go back to the limiter and the handler gets operation_aborted). A single-threaded limiter's
//   runner uses a plain read and write instead: there, a cancellation cannot run at the same time. Either
//   way nothing is lost and nothing is handed out twice. This is what lets a waiter cancelled after its
//   grant but before it resumes pass the permit on, as asyncio's and tokio's semaphores do.
// - Completion posts a runner to the handler's associated executor. The op stays allocated until the runner
//   runs there, clears the cancellation slot and frees the op, so a cancellation emitted meanwhile (from
//   that same executor, as Asio requires of emitters) still reads a live op. The one exception is a direct
//   handoff (line_options::direct_handoff, asked for by a release only): a granted op whose handler's
//   executor is running in this thread (running_here) is run in place, after the lock was released, unless
//   direct handoffs already nest direct_handoff_max_depth deep on this thread (then it is posted as usual).
// - A runner of a granted op holds the limiter core alive (shared ownership), so that it can hand the units
//   back when the limiter was destroyed meanwhile (then the handler gets operation_aborted, never a permit
//   to a dead limiter) or when the runner is destroyed unrun (an execution context destroyed with the
//   completion queued).
#pragma once

#include <rein/config.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/detail/permit_source.hpp>
#include <rein/detail/spare_allocator.hpp>
#include <rein/error.hpp>
#include <rein/permit.hpp>

#include REIN_ASIO_HEADER(associated_allocator.hpp)
#include REIN_ASIO_HEADER(associated_cancellation_slot.hpp)
#include REIN_ASIO_HEADER(associated_executor.hpp)
#include REIN_ASIO_HEADER(any_io_executor.hpp)
#include REIN_ASIO_HEADER(error.hpp)
#include REIN_ASIO_HEADER(io_context.hpp)
#include REIN_ASIO_HEADER(post.hpp)
#include REIN_ASIO_HEADER(strand.hpp)

#include <atomic>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <type_traits>
#include <typeinfo>
#include <utility>

namespace rein::detail {

/// net::post(ex, f), unwrapping an any_io_executor that holds an io_context's executor first: posting to
/// the wrapped executor means the same, and skips the polymorphic wrapper's property conversions and its
/// type-erased function (a third of a handoff's cost). The common case: a coroutine's executor.
/// The type is compared before target() is asked: before Asio 1.24, target<T>() casts whatever the wrapper
/// holds, so a strand would be taken for its inner executor and its handlers run off the strand.
template <class Executor, class Function>
void post_unwrapped(const Executor& ex, Function&& f) {
#if !defined(BOOST_ASIO_NO_TYPEID) && !defined(ASIO_NO_TYPEID)
  if constexpr (std::is_same_v<Executor, net::any_io_executor>) {
    if (ex && ex.target_type() == typeid(net::io_context::executor_type)) {
      const auto* io = ex.template target<net::io_context::executor_type>();
      const auto target = net::prefer(net::require(*io, net::execution::blocking.never),
                                      net::execution::allocator(net::get_associated_allocator(f)));
#if REIN_ASIO_VERSION < 102400
      net::execution::execute(target, std::forward<Function>(f));  // the member is private before Asio 1.24
#else
      target.execute(std::forward<Function>(f));
#endif
      return;
    }
  }
#endif
  net::post(ex, std::forward<Function>(f));
}

/// Whether `ex` is running in this thread, so that a handler bound to it may be run in place (dispatch
/// semantics): exact for an io_context's executor and for strands (their running_in_this_thread()); an
/// any_io_executor is asked through the io_context executor, or the strand of one, that it holds (checked by
/// type first, as in post_unwrapped); any other executor, or one that cannot tell, answers false (the handler
/// is posted).
template <class Executor>
bool running_here(const Executor& ex) noexcept {
  if constexpr (std::is_same_v<Executor, net::any_io_executor>) {
#if !defined(BOOST_ASIO_NO_TYPEID) && !defined(ASIO_NO_TYPEID)
    if (!ex) return false;
    if (ex.target_type() == typeid(net::io_context::executor_type))
      return ex.template target<net::io_context::executor_type>()->running_in_this_thread();
    if (ex.target_type() == typeid(net::strand<net::io_context::executor_type>))  // co_spawn(make_strand(io))
      return ex.template target<net::strand<net::io_context::executor_type>>()->running_in_this_thread();
#endif
    return (void)ex, false;
  } else if constexpr (requires { { ex.running_in_this_thread() } -> std::convertible_to<bool>; }) {
    return ex.running_in_this_thread();
  } else {
    return (void)ex, false;
  }
}

/// How deep direct handoffs may nest on one thread: a handler run in place that releases again grants the
/// next waiter in place too, so the chain is cut here (the next grant is posted) to bound the stack.
inline constexpr unsigned direct_handoff_max_depth = 4;

/// The direct handoffs running on this thread, one inside the other.
inline thread_local unsigned direct_handoff_depth = 0;

enum class wait_status : std::uint8_t {
  queued,            ///< linked in the queue
  granted,           ///< unlinked with a grant; the runner or a cancellation will claim it
  delivered,         ///< the runner claimed the grant: final
  aborted,           ///< cancelled (queued, or granted and revoked), or the limiter was destroyed
  closed,
  timed_out,
  queue_full,
  exceeds_capacity,
  failed,            ///< refused by a remote policy with an error of its own (remote_wait_op::failure)
  unavailable,       ///< refused by the policy (an open circuit)
  overloaded,        ///< shed by the line's sojourn rule
};

inline error_code to_error_code(wait_status s) noexcept {
  switch (s) {
    case wait_status::queued:
    case wait_status::granted:
    case wait_status::delivered: return {};
    case wait_status::aborted: return net::error::operation_aborted;
    case wait_status::closed: return errc::closed;
    case wait_status::timed_out: return errc::timed_out;
    case wait_status::queue_full: return errc::queue_full;
    case wait_status::exceeds_capacity: return errc::exceeds_capacity;
    case wait_status::failed: return net::error::operation_aborted;  // remote_wait_op carries the reason
    case wait_status::unavailable: return errc::upstream_unavailable;
    case wait_status::overloaded: return errc::overloaded;
  }
  return {};
}

inline constexpr std::int64_t no_deadline = std::numeric_limits<std::int64_t>::max();

class wait_owner;
struct wait_op;

/// The deadline of a waiting op, a node of the limiter's deadline heap (deadline_heap.hpp). Only an op
/// with a deadline has one, allocated in the same block just before it (basic_wait_op::create), so that an
/// op waiting without a deadline (most of them under contention) carries none of its 48 bytes.
struct deadline_node {
  deadline_node* child = nullptr;
  deadline_node* sibling = nullptr;
  deadline_node* back = nullptr;  // parent if first child, else left sibling
  wait_op* op = nullptr;
  std::int64_t deadline_ns = no_deadline;
  std::uint32_t seq = 0;  // arrival order (wrapping), so that equal deadlines expire first come, first out
};

/// The node of an op in a fair line (queue_order::fair, fair_schedule.hpp): a deadline node (used only if
/// the op has a deadline) and the op's start tag. Every op of a fair line has one, in the same block just
/// before the op, so that the ops of the other orders carry no tag.
struct fair_node {
  deadline_node node;  // first: a pointer to it is a pointer to the fair_node (both are standard-layout)
  double tag = 0.0;
  std::uint64_t key = 0;     // the hash of its key (line_place)
  std::uint32_t weight = 1;  // the key's weight
};

struct wait_op {
  // `keep` is a reference to the core, owned by the batch being completed: a granted op's runner copies it,
  // or takes it when `last` (the batch's final op), so that a handoff costs one reference, not three.
  // `direct`: a grant whose handler's executor runs in this thread may run in place (a direct handoff).
  using complete_fn = void (*)(wait_op*, const void* io_executor, wait_owner* owner, std::shared_ptr<wait_owner>& keep,
                               bool last, bool direct) noexcept;

  // FIFO links (op_queue).
  wait_op* next = nullptr;
  union {
    wait_op* prev = nullptr;
    // Once granted, and so out of the line, `prev` is free: it carries what the policy noted at the grant to
    // the permit (permit_source::release_permit), written by the grant after the op left the line. Sharing
    // keeps a parked op at 56 bytes.
    std::uint64_t note;
  };
  deadline_node* timer = nullptr;  // an op created with a deadline, or for a fair line, has one for its whole life
  std::int64_t stamp_ns = 0;       // enqueue time while queued, grant time once granted
  std::size_t count = 0;
  complete_fn complete = nullptr;
  std::atomic<wait_status> status{wait_status::queued};
  bool drain = false;         // waits in the drain line (async_drain) instead of the acquire line
  std::uint8_t priority = 0;  // the class in queue_order::priority
  std::uint8_t partition = 0;  // its partition's index (partition_table), 0 without partitions
  bool fair = false;           // its timer is a fair_node's (created for a fair line)

  /// The deadline in the clock's nanoseconds, no_deadline when none (also one too far to count).
  std::int64_t deadline_ns() const noexcept { return timer == nullptr ? no_deadline : timer->deadline_ns; }

  /// The node of an op created for a fair line: its start tag, key and weight (fair_schedule.hpp).
  fair_node& fair_state() noexcept { return *reinterpret_cast<fair_node*>(timer); }
  double fair_tag() const noexcept { return reinterpret_cast<const fair_node*>(timer)->tag; }
};

/// The node of a limiter whose admission is asynchronous (detail/remote_admission.hpp): a wait_op that can
/// be "in flight" (its admission request sent, the verdict not back yet) and can fail with an error of the
/// policy's own (a Redis bucket's unavailable or server_error). Local limiters' ops stay plain wait_ops, so
/// their size is unchanged.
struct remote_wait_op : wait_op {
  error_code failure{};      // with status `failed`: what the handler receives
  std::uint64_t ticket = 0;  // while in_flight: the policy's name for its request
  bool in_flight = false;    // its admission request is out; the verdict decides it
};

/// What the handler of an op that finished with `s` receives.
inline error_code result_of(const wait_op&, wait_status s) noexcept { return to_error_code(s); }
inline error_code result_of(const remote_wait_op& op, wait_status s) noexcept {
  return s == wait_status::failed ? op.failure : to_error_code(s);
}

/// The limiter core as its ops see it.
class wait_owner {
 public:
  /// Cancels `op` if it is still queued, or revokes its grant if the runner has not claimed it yet; does
  /// nothing otherwise. Called from the op's cancellation slot.
  virtual void cancel_wait(wait_op* op) noexcept = 0;

  /// The runner claimed a grant of n to a waiter of `partition`: true if the handler may have it; false if
  /// the limiter was shut down meanwhile (the handler then gets operation_aborted).
  virtual bool deliver(std::size_t n, std::chrono::nanoseconds stamp, std::uint8_t partition) noexcept = 0;

  /// A claimed grant of n will never reach its handler (the runner was destroyed unrun): take it back.
  virtual void abandon(std::size_t n, std::chrono::nanoseconds stamp, std::uint8_t partition) noexcept = 0;

  /// Where permits of `partition` report back; null for limiters without permits (rate limiters).
  virtual permit_source* source(std::uint8_t partition) noexcept = 0;

 protected:
  ~wait_owner() = default;
};

/// Installed in the handler's cancellation slot. All three cancellation types are honoured: a queued op has
/// had no side effect yet, and a grant whose handler has not run can still be taken back, so removing it is
/// terminal, partial and total cancellation at once.
class cancel_handler {
 public:
  cancel_handler(wait_owner* target, wait_op* op) noexcept : target_(target), op_(op) {}

  void operator()(net::cancellation_type_t type) const noexcept {
    if ((type & (net::cancellation_type::terminal | net::cancellation_type::partial |
                 net::cancellation_type::total)) == net::cancellation_type::none)
      return;
    // Any other status is final: the op is owned by its runner, and its limiter may even be gone. While the
    // status is queued or granted, the limiter is alive (it holds the op, or the op's runner holds it).
    const wait_status s = op_->status.load(std::memory_order_acquire);
    if (s != wait_status::queued && s != wait_status::granted) return;
    target_->cancel_wait(op_);
  }

 private:
  wait_owner* target_;
  wait_op* op_;
};

/// The block of an op created with a node (a deadline_node, or a fair line's fair_node): the node first,
/// then the op, in one allocation.
template <class Op, class Node>
struct node_block {
  Node node;
  alignas(Op) unsigned char op[sizeof(Op)];
};

/// Which node an op is created with (basic_wait_op::create).
enum class op_node : std::uint8_t {
  none,      ///< no deadline, not in a fair line: the op alone
  deadline,  ///< a deadline_node
  fair,      ///< a fair_node (a fair line's op, with a deadline or not)
};

/// The concrete op for one handler type and completion `Signature`: `void(error_code, rein::permit)` for
/// concurrency limiters, `void(error_code)` for rate limiters (and drain waits).
/// Concurrent is false for single-threaded limiters (rein::null_mutex), whose users promise that acquire,
/// release, cancellation and completions all happen on one thread or strand. Base is wait_op, or
/// remote_wait_op for a limiter whose admission is asynchronous (its ops fail with errors of their own).
template <class Handler, class IoExecutor, class Signature, bool Concurrent = true, class Base = wait_op>
class basic_wait_op final : public Base {
  static_assert(std::is_base_of_v<wait_op, Base>);
  static_assert(std::is_same_v<Signature, void(error_code, permit)> || std::is_same_v<Signature, void(error_code)>,
                "rein: an op completes with void(error_code, rein::permit) or void(error_code)");
  static constexpr bool with_permit = std::is_same_v<Signature, void(error_code, permit)>;
  using handler_allocator = net::associated_allocator_t<Handler>;
  // The handler's own allocator if it has one; otherwise a per-thread spare block (spare_allocator.hpp).
  template <class T>
  using allocator_for =
      std::conditional_t<std::is_same_v<handler_allocator, std::allocator<void>>, spare_allocator<T>,
                         typename std::allocator_traits<handler_allocator>::template rebind_alloc<T>>;
  using allocator_type = allocator_for<basic_wait_op>;
  using alloc_traits = std::allocator_traits<allocator_type>;
  // Named only where the op is complete.
  template <class Node>
  using block_type = node_block<basic_wait_op, Node>;

 public:
  /// Allocates with the handler's associated allocator (as Asio's own operations do), or, for a handler
  /// without one, from the thread's spare blocks (spare_allocator.hpp). `node`: whether the op gets a node
  /// (op->timer) in the same block: a deadline_node when it will wait with a deadline, a fair_node when its
  /// line is fair.
  /// `handler` may be an lvalue (an initiating function called with a named handler): it is copied.
  template <class H>
  static basic_wait_op* create(H&& handler, std::size_t n, op_node node) {
    if (node == op_node::deadline) return create_with<deadline_node>(std::forward<H>(handler), n);
    if (node == op_node::fair) return create_with<fair_node>(std::forward<H>(handler), n);
    allocator_type alloc(net::get_associated_allocator(handler));
    basic_wait_op* p = alloc_traits::allocate(alloc, 1);
    try {
      return ::new (static_cast<void*>(p)) basic_wait_op(std::forward<H>(handler), n);
    } catch (...) {
      alloc_traits::deallocate(alloc, p, 1);
      throw;
    }
  }

  /// Installs the cancellation handler if the handler's slot is connected.
  void connect_cancellation(wait_owner* target) {
    auto slot = net::get_associated_cancellation_slot(handler_);
    if (slot.is_connected()) slot.template emplace<cancel_handler>(target, this);
  }

  /// Removes it again (an initiation that failed after connecting).
  void disconnect_cancellation() noexcept {
    auto slot = net::get_associated_cancellation_slot(handler_);
    if (slot.is_connected()) slot.clear();
  }

  /// Frees an op that was never handed to anyone (its initiation failed): the handler is destroyed uncalled,
  /// as when an initiating function throws.
  void destroy() noexcept { destroy(this); }

 private:
  template <class H>
  basic_wait_op(H&& handler, std::size_t n) : handler_(std::forward<H>(handler)) {
    this->count = n;
    this->complete = &do_complete;
  }

  template <class Node, class H>
  static basic_wait_op* create_with(H&& handler, std::size_t n) {
    using block = block_type<Node>;
    using traits = std::allocator_traits<allocator_for<block>>;
    static_assert(std::is_standard_layout_v<block> && std::is_standard_layout_v<Node>);
    allocator_for<block> alloc(net::get_associated_allocator(handler));
    block* b = ::new (static_cast<void*>(traits::allocate(alloc, 1))) block;
    basic_wait_op* p;
    try {
      p = ::new (static_cast<void*>(b->op)) basic_wait_op(std::forward<H>(handler), n);
    } catch (...) {
      traits::deallocate(alloc, b, 1);
      throw;
    }
    deadline_node* d;
    if constexpr (std::is_same_v<Node, fair_node>) {
      d = &b->node.node;
      p->fair = true;
    } else {
      d = &b->node;
    }
    p->timer = d;
    d->op = p;
    return p;
  }

  // The node is the first member of a standard-layout block (and a deadline_node the first of a fair_node):
  // its address is the block's.
  template <class Node>
  static void deallocate_block(deadline_node* node, const handler_allocator& handler_alloc) noexcept {
    using block = block_type<Node>;
    allocator_for<block> alloc(handler_alloc);
    std::allocator_traits<allocator_for<block>>::deallocate(alloc, reinterpret_cast<block*>(node), 1);
  }

  static void destroy(basic_wait_op* op) noexcept { destroy(op, net::get_associated_allocator(op->handler_)); }

  // `handler_alloc` must not live in the op (it is destroyed first); after the handler was moved out, pass a
  // copy taken before.
  static void destroy(basic_wait_op* op, const handler_allocator& handler_alloc) noexcept {
    deadline_node* node = op->timer;
    const bool fair = op->fair;
    op->~basic_wait_op();
    if (node == nullptr) {
      allocator_type alloc(handler_alloc);
      alloc_traits::deallocate(alloc, op, 1);
    } else if (fair) {
      deallocate_block<fair_node>(node, handler_alloc);
    } else {
      deallocate_block<deadline_node>(node, handler_alloc);
    }
  }

  // Claims a grant for the runner (see the invariants at the top): true if the grant is the runner's. The
  // compare-and-swap, needed only when a cancellation may race, cost 4% of a contended handoff here.
  static bool claim(basic_wait_op* op) noexcept {
    if constexpr (Concurrent) {
      wait_status expected = wait_status::granted;
      return op->status.compare_exchange_strong(expected, wait_status::delivered, std::memory_order_acq_rel);
    } else {
      if (op->status.load(std::memory_order_relaxed) != wait_status::granted) return false;
      op->status.store(wait_status::delivered, std::memory_order_relaxed);
      return true;
    }
  }

  // Runs on the handler's associated executor. Owns the op: frees it when run or destroyed unrun.
  class runner {
   public:
    // `owner` is set for a granted op only; `keep` then holds it alive (null if the core is not owned by a
    // shared_ptr, which rein's limiters always do).
    runner(basic_wait_op* op, wait_owner* owner, std::shared_ptr<wait_owner> keep) noexcept
        : op_(op), owner_(owner), keep_(std::move(keep)), alloc_(net::get_associated_allocator(op->handler_)) {}
    runner(runner&& other) noexcept
        : op_(std::exchange(other.op_, nullptr)),
          owner_(other.owner_),
          keep_(std::move(other.keep_)),
          alloc_(other.alloc_) {}
    runner(const runner&) = delete;
    runner& operator=(const runner&) = delete;
    runner& operator=(runner&&) = delete;

    // Destroyed unrun: an execution context destroyed with the completion queued, or a failed post.
    ~runner() {
      if (op_ == nullptr) return;
      if (owner_ != nullptr && claim(op_))
        owner_->abandon(op_->count, std::chrono::nanoseconds(op_->stamp_ns), op_->partition);
      destroy(op_);
    }

    using allocator_type = handler_allocator;
    allocator_type get_allocator() const noexcept { return alloc_; }

    const Handler& handler() const noexcept { return op_->handler_; }

    void operator()() {
      basic_wait_op* op = std::exchange(op_, nullptr);
      auto slot = net::get_associated_cancellation_slot(op->handler_);
      if (slot.is_connected()) slot.clear();  // no cancellation reaches the op from here on
      Handler handler(std::move(op->handler_));
      wait_status status = op->status.load(std::memory_order_acquire);
      if (status == wait_status::granted && !claim(op)) status = wait_status::aborted;  // revoked first
      const std::size_t n = op->count;
      const std::chrono::nanoseconds stamp(op->stamp_ns);
      std::uint64_t note = 0;
      if constexpr (with_permit) {
        if (status == wait_status::granted) note = op->note;  // every grant of a permit line wrote it
      }
      const std::uint8_t partition = op->partition;
      error_code ec = result_of(static_cast<const Base&>(*op), status);
      destroy(op, alloc_);  // the op's handler was moved from: use the allocator copied before
      if (status == wait_status::granted && !owner_->deliver(n, stamp, partition)) ec = net::error::operation_aborted;
      if constexpr (with_permit) {
        permit p = !ec ? permit(owner_->source(partition), n, stamp, note) : permit();
        keep_.reset();
        std::move(handler)(ec, std::move(p));
      } else {
        keep_.reset();
        std::move(handler)(ec);
      }
    }

   private:
    basic_wait_op* op_;
    wait_owner* owner_;
    std::shared_ptr<wait_owner> keep_;
    [[no_unique_address]] handler_allocator alloc_;
  };

  // Never throws: if the post fails (no memory), the runner is destroyed unrun, which gives a grant back
  // and frees the op; the handler is then destroyed uncalled, as when its execution context goes away.
  // A direct handoff runs the runner here instead (see the invariants at the top); an exception thrown by
  // the handler is posted to its executor and rethrown there, so that it leaves that executor's run() as it
  // would have from a posted handler, not the release that granted it.
  static void do_complete(wait_op* base, const void* io_executor, wait_owner* owner, std::shared_ptr<wait_owner>& keep,
                          bool last, bool direct) noexcept {
    auto* op = static_cast<basic_wait_op*>(base);
    // A grant can still turn into `aborted` (revoked) concurrently, never the other way round.
    const bool granted = op->status.load(std::memory_order_acquire) == wait_status::granted;
    std::shared_ptr<wait_owner> ref;
    if (granted) ref = last ? std::move(keep) : keep;
    runner r(op, granted ? owner : nullptr, std::move(ref));
    try {
      const auto ex = net::get_associated_executor(r.handler(), *static_cast<const IoExecutor*>(io_executor));
      if (direct && granted && direct_handoff_depth < direct_handoff_max_depth && running_here(ex)) {
        run_in_place(r, ex);
        return;
      }
      post_unwrapped(ex, std::move(r));
    } catch (...) {
    }
  }

  template <class Executor>
  static void run_in_place(runner& r, const Executor& ex) noexcept {
    ++direct_handoff_depth;
    std::exception_ptr thrown;
    try {
      r();
    } catch (...) {
      thrown = std::current_exception();
    }
    --direct_handoff_depth;
    if (thrown) [[unlikely]] {
      try {
        net::post(ex, [thrown] { std::rethrow_exception(thrown); });
      } catch (...) {
      }
    }
  }

  Handler handler_;
};

}  // namespace rein::detail
