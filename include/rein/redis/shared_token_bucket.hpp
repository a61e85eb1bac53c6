// One token bucket shared by many processes and machines: its state lives in Redis, updated by a Lua script.
#pragma once

#include <rein/algo/token_bucket.hpp>
#include <rein/config.hpp>
#include <rein/detail/clock_time.hpp>
#include <rein/detail/deadline_heap.hpp>
#include <rein/detail/op_queue.hpp>
#include <rein/detail/wait_op.hpp>
#include <rein/error.hpp>
#include <rein/null_mutex.hpp>
#include <rein/redis/connection.hpp>
#include <rein/redis/detail/sha1.hpp>
#include <rein/redis/error.hpp>
#include <rein/redis/reply.hpp>
#include <rein/try_result.hpp>
#include <rein/wait_stats.hpp>

#include <hiredis/hiredis.h>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/any_io_executor.hpp>
#include <asio/associated_allocator.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/basic_waitable_timer.hpp>
#include <asio/execution_context.hpp>
#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/wait_traits.hpp>
#else
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_allocator.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/basic_waitable_timer.hpp>
#include <boost/asio/execution_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/wait_traits.hpp>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace rein::redis {

/// What a shared_token_bucket does while Redis cannot be asked.
enum class failure_policy : std::uint8_t {
  /// Nothing is admitted: waiting and new acquires complete with errc::unavailable. For quotas that must
  /// never be exceeded (a provider suspends the account).
  fail_closed,
  /// Each process admits from a local, in-process rein::algo::token_bucket holding `fail_open_share` of the
  /// rate and of the capacity (e.g. 1/N for N replicas), so the fleet stays near the quota without Redis.
  /// For quotas where availability matters more than exactness.
  fail_open,
};

/// Options of a shared_token_bucket. Every process sharing a quota must use the same key, rate and capacity:
/// Redis stores how much is owed, and each call applies the caller's rate and capacity to it.
struct shared_token_bucket_options {
  std::string key;              ///< the Redis key holding the quota's state (one hash); not empty
  double rate = 0;              ///< tokens per second for everyone together, in (0, 1e9]
  std::int64_t capacity = 0;    ///< the burst: most tokens the bucket holds, in [1, 1e15]; capacity / rate <= 1e9 s
  /// What to do while Redis cannot be asked (see failure_policy).
  failure_policy on_failure = failure_policy::fail_closed;
  /// With fail_open: the local bucket's share of rate and capacity, in (0, 1] (its capacity is at least 1).
  double fail_open_share = 1.0;
  /// How many operations may wait their turn at once; one more completes with rein::errc::queue_full.
  /// Operations whose request is on the wire do not count. Default: unbounded.
  std::size_t max_waiters = std::numeric_limits<std::size_t>::max();
  /// Most admission requests this limiter has on the wire at once (pipelined on its connection), >= 1.
  /// 1 sends them one at a time.
  std::size_t max_in_flight = 64;
  /// After Redis was found unreachable, how long the failure policy applies before Redis is asked again
  /// (once the connection is back). Keeps a server that answers LOADING or BUSY from being hammered. >= 0.
  std::chrono::milliseconds recheck_interval{100};
};

/// A shared_token_bucket's counters and state, copied under its lock.
///
/// From rein::wait_stats: `waiting` counts every operation not yet completed (on the wire or waiting its
/// turn); wait times run from the acquire call to the grant, round trips included.
struct shared_token_bucket_snapshot : wait_stats {
  std::size_t in_flight = 0;          ///< admission requests awaiting Redis's reply
  bool degraded = false;              ///< Redis was unreachable at the last attempt: on_failure applies
  bool connected = false;             ///< the connection is up
  /// The bucket's tokens as of the last reply, plus refill since: an estimate, blind to other processes'
  /// takes since that reply. `capacity` before the first reply.
  double tokens = 0;
  std::uint64_t remote_allowed = 0;   ///< admissions Redis granted
  std::uint64_t remote_denied = 0;    ///< admissions Redis refused for now (the caller waited and asked again)
  std::uint64_t local_admitted = 0;   ///< admitted by the local bucket (fail_open, while degraded)
  std::uint64_t unavailable_total = 0;   ///< completed with errc::unavailable
  std::uint64_t server_errors = 0;    ///< error replies other than NOSCRIPT and the "unavailable" ones
  std::uint64_t script_loads = 0;     ///< NOSCRIPT replies, each answered by SCRIPT LOAD and a retry
  std::uint64_t refunds = 0;          ///< refund requests sent (refund(), or tokens a cancelled caller got)
  std::uint64_t round_trips = 0;      ///< admission replies received
  std::chrono::nanoseconds round_trip_last{0};   ///< request written to reply read, last admission
  std::chrono::nanoseconds round_trip_total{0};  ///< mean = round_trip_total / round_trips
  /// The longest admission round trip so far.
  std::chrono::nanoseconds round_trip_max{0};
  std::chrono::microseconds retry_after_last{0};  ///< the retry-after of the last denial, as Redis computed it
};

namespace detail {

/// The Lua script. One hash per quota: `at`, the server time of the last change (microseconds), and `debt`,
/// how far the bucket is below full, in microseconds of refill. This is GCRA (ITU-T I.371, the "virtual
/// scheduling" form: debt = TAT - now) written as a token bucket: tokens = (capacity * interval - debt) /
/// interval. A request for n is allowed when debt + n * interval <= capacity * interval. Only the server's
/// clock (TIME) is read, so clients' clock skew does not matter; Redis >= 5 replicates a script's effects
/// rather than the script, which is what makes TIME allowed (redis.replicate_commands for 3.2 and 4).
/// A negative n gives tokens back (never above full). The key expires when the bucket would be full again,
/// so idle quotas cost no memory.
///
/// ARGV: interval (microseconds per token), capacity (tokens), n. Returns {allowed (1/0), retry_after
/// (microseconds until n would be allowed; 0 if allowed), available (microseconds of refill in the bucket
/// after the decision: tokens * interval)}.
inline constexpr std::string_view token_bucket_script = R"lua(
if redis.replicate_commands then redis.replicate_commands() end
local interval = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local limit = capacity * interval
local debt = 0
local state = redis.call('HMGET', KEYS[1], 'at', 'debt')
if state[1] and state[2] then
  debt = tonumber(state[2]) - math.max(0, now - tonumber(state[1]))
  if debt < 0 then debt = 0 end
end
local after = debt + n * interval
if n > 0 and after > limit then
  return {0, math.ceil(after - limit), math.floor(limit - debt)}
end
if after <= 0 then
  redis.call('DEL', KEYS[1])
  return {1, 0, math.floor(limit)}
end
redis.call('HSET', KEYS[1], 'at', now, 'debt', after)
redis.call('PEXPIRE', KEYS[1], math.ceil(after / 1000) + 1)
return {1, 0, math.floor(limit - after)}
)lua";

/// What a reply to the script says.
struct verdict {
  enum class kind : std::uint8_t { allowed, denied, no_script, unavailable, server_error };
  kind what = kind::unavailable;
  double retry_after_us = 0;
  double available_us = 0;
  std::string message;  // the server's error text
};

inline bool starts_with_any(std::string_view text, std::initializer_list<std::string_view> prefixes) {
  return std::any_of(prefixes.begin(), prefixes.end(), [&](std::string_view p) { return text.starts_with(p); });
}

inline verdict read_verdict(const error_code& ec, const ::redisReply* r) {
  using kind = verdict::kind;
  if (ec || r == nullptr) return {kind::unavailable, 0, 0, {}};
  if (r->type == REDIS_REPLY_ERROR) {
    std::string text = r->str != nullptr ? std::string(r->str, r->len) : std::string();
    if (text.starts_with("NOSCRIPT")) return {kind::no_script, 0, 0, std::move(text)};
    // The server is up but cannot serve now: an outage for our purposes, not a bug.
    if (starts_with_any(text, {"LOADING", "BUSY", "MASTERDOWN", "READONLY", "TRYAGAIN", "CLUSTERDOWN", "OOM"}))
      return {kind::unavailable, 0, 0, std::move(text)};
    return {kind::server_error, 0, 0, std::move(text)};
  }
  const bool shaped = r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
                      std::all_of(r->element, r->element + 3, [](const ::redisReply* e) { return e->type == REDIS_REPLY_INTEGER; });
  if (!shaped) return {kind::server_error, 0, 0, "rein: unexpected reply to the token bucket script"};
  return {r->element[0]->integer == 1 ? kind::allowed : kind::denied, static_cast<double>(r->element[1]->integer),
          static_cast<double>(r->element[2]->integer), {}};
}

inline std::string format_number(double v) {
  std::array<char, 32> buffer{};
  const auto result = std::to_chars(buffer.data(), buffer.data() + buffer.size(), v);  // shortest round trip
  return std::string(buffer.data(), result.ptr);
}

inline shared_token_bucket_options validated(shared_token_bucket_options o) {
  const auto fail = [](const std::string& what) {
    throw std::invalid_argument("rein::redis::shared_token_bucket: " + what);
  };
  if (o.key.empty()) fail("key must not be empty");
  if (!(o.rate > 0 && o.rate <= 1e9)) fail("rate must be > 0, finite and at most 1e9 tokens per second, got " + format_number(o.rate));
  if (o.capacity < 1 || o.capacity > 1'000'000'000'000'000)
    fail("capacity must be in [1, 1e15] tokens, got " + std::to_string(o.capacity));
  if (static_cast<double>(o.capacity) / o.rate > 1e9)
    fail("capacity / rate (seconds to refill from empty) must be at most 1e9, got " +
         format_number(static_cast<double>(o.capacity) / o.rate));
  if (!(o.fail_open_share > 0 && o.fail_open_share <= 1))
    fail("fail_open_share must be in (0, 1], got " + format_number(o.fail_open_share));
  if (o.max_in_flight < 1) fail("max_in_flight must be >= 1, got 0");
  if (o.recheck_interval.count() < 0)
    fail("recheck_interval must be >= 0, got " + std::to_string(o.recheck_interval.count()) + "ms");
  return o;
}

// A parked or in-flight acquire. It reuses rein's wait_op as its node (links for op_queue and deadline_heap,
// count, stamp, status), and completes and cancels through its own small protocol below rather than
// rein::detail::wait_op_impl's, because a remote limiter needs errors of its own (errc::unavailable,
// server_error), to know whether a request is on the wire, and to refund a grant that is taken back.
//
// Status: `queued` while linked in the limiter's queue; whoever unlinks it under the lock sets `granted`
// (tokens taken) or `aborted` (`result` says why) and alone completes it. A grant is not final until the
// handler runs: the runner and a cancellation race to set `claimed`, and exactly one wins. A cancellation
// that wins refunds the tokens to Redis, so a caller cancelled after Redis said yes but before it resumed
// takes nothing, and its handler gets operation_aborted.
struct remote_op;

// The limiter core as its ops see it.
class remote_owner {
 public:
  /// Cancels `op` if queued; revokes it (and refunds its tokens) if granted but not yet claimed.
  virtual void cancel_remote(remote_op* op) noexcept = 0;
  /// n tokens granted to nobody (a revoked grant, a handler destroyed unrun): give them back to Redis.
  virtual void give_back(std::size_t n) noexcept = 0;
  /// Shared ownership, held by the runner of a granted op so the core outlives it.
  virtual std::shared_ptr<remote_owner> share() noexcept = 0;

 protected:
  ~remote_owner() = default;
};

struct remote_op : rein::detail::wait_op {
  using deliver_fn = void (*)(remote_op*, const void* io_executor, remote_owner* owner) noexcept;

  error_code result{};             // what the handler receives, unless granted
  std::uint64_t ticket = 0;        // its admission request, while probing
  bool probing = false;            // its admission request is on the wire
  std::atomic<bool> claimed{false};  // a grant was claimed by the runner or revoked by a cancellation
  deliver_fn deliver = nullptr;

  /// Wins the grant (true) or finds it already claimed.
  bool claim() noexcept { return !claimed.exchange(true, std::memory_order_acq_rel); }
};

// Installed in the handler's cancellation slot. Terminal, partial and total are all honoured: a queued op
// has had no effect, and a grant whose handler has not run is taken back (with a refund).
class remote_cancel_handler {
 public:
  remote_cancel_handler(remote_owner* owner, remote_op* op) noexcept : owner_(owner), op_(op) {}

  void operator()(net::cancellation_type_t type) const noexcept {
    if ((type & (net::cancellation_type::terminal | net::cancellation_type::partial |
                 net::cancellation_type::total)) == net::cancellation_type::none)
      return;
    // While queued the limiter holds the op; while granted the op's runner holds the limiter. Otherwise
    // the op is its runner's alone and the limiter may be gone.
    const auto s = op_->status.load(std::memory_order_acquire);
    if (s == rein::detail::wait_status::queued || s == rein::detail::wait_status::granted) owner_->cancel_remote(op_);
  }

 private:
  remote_owner* owner_;
  remote_op* op_;
};

// Ops unlinked under the lock, completed after it is released (through wait_op::next, free once unlinked).
class remote_ready {
 public:
  remote_ready() = default;
  remote_ready(const remote_ready&) = delete;
  remote_ready& operator=(const remote_ready&) = delete;

  void push(remote_op* op) noexcept {
    op->next = nullptr;
    if (tail_ != nullptr) tail_->next = op;
    else head_ = op;
    tail_ = op;
  }

  void complete_all(const void* io_executor, remote_owner* owner) noexcept {
    while (head_ != nullptr) {
      auto* op = static_cast<remote_op*>(head_);
      head_ = op->next;  // read first: the op may be freed on another thread right after
      op->deliver(op, io_executor, owner);
    }
    tail_ = nullptr;
  }

 private:
  rein::detail::wait_op* head_ = nullptr;
  rein::detail::wait_op* tail_ = nullptr;
};

// remote_op for one handler type: allocated with the handler's associated allocator, completed by posting
// a runner to the handler's associated executor (never in place), signature void(error_code). It skips the
// local ops' spare blocks and direct io_context post (wait_op.hpp): a Redis round trip dwarfs both.
template <class Handler, class IoExecutor>
class remote_op_impl final : public remote_op {
  using handler_allocator = net::associated_allocator_t<Handler>;
  using allocator_type = typename std::allocator_traits<handler_allocator>::template rebind_alloc<remote_op_impl>;
  using alloc_traits = std::allocator_traits<allocator_type>;

 public:
  /// `handler` may be an lvalue (an initiating function called with a named handler): it is copied.
  template <class H>
  static remote_op_impl* create(H&& handler, std::size_t n) {
    allocator_type alloc(net::get_associated_allocator(handler));
    remote_op_impl* p = alloc_traits::allocate(alloc, 1);
    try {
      return ::new (static_cast<void*>(p)) remote_op_impl(std::forward<H>(handler), n);
    } catch (...) {
      alloc_traits::deallocate(alloc, p, 1);
      throw;
    }
  }

  void connect_cancellation(remote_owner* owner) {
    auto slot = net::get_associated_cancellation_slot(handler_);
    if (slot.is_connected()) slot.template emplace<remote_cancel_handler>(owner, this);
  }

 private:
  template <class H>
  remote_op_impl(H&& handler, std::size_t n) : handler_(std::forward<H>(handler)) {
    count = n;
    deliver = &do_deliver;
  }

  static void destroy(remote_op_impl* op) noexcept { destroy(op, net::get_associated_allocator(op->handler_)); }

  // `handler_alloc` must not live in the op (it is destroyed first); after the handler was moved out, pass a
  // copy taken before.
  static void destroy(remote_op_impl* op, const handler_allocator& handler_alloc) noexcept {
    allocator_type alloc(handler_alloc);
    op->~remote_op_impl();
    alloc_traits::deallocate(alloc, op, 1);
  }

  // Owns the op: frees it when run, or when destroyed unrun (an execution context destroyed with the
  // completion queued), then giving a grant back.
  class runner {
   public:
    runner(remote_op_impl* op, std::shared_ptr<remote_owner> keep) noexcept : op_(op), keep_(std::move(keep)) {}
    runner(runner&& other) noexcept : op_(std::exchange(other.op_, nullptr)), keep_(std::move(other.keep_)) {}
    runner(const runner&) = delete;
    runner& operator=(const runner&) = delete;
    runner& operator=(runner&&) = delete;
    ~runner() {
      if (op_ == nullptr) return;
      if (keep_ && op_->claim()) keep_->give_back(op_->count);
      destroy(op_);
    }

    using allocator_type = handler_allocator;
    allocator_type get_allocator() const noexcept { return net::get_associated_allocator(op_->handler_); }

    const Handler& handler() const noexcept { return op_->handler_; }

    void operator()() {
      remote_op_impl* op = std::exchange(op_, nullptr);
      auto slot = net::get_associated_cancellation_slot(op->handler_);
      if (slot.is_connected()) slot.clear();  // no cancellation reaches the op from here on
      const handler_allocator alloc = net::get_associated_allocator(op->handler_);
      Handler handler(std::move(op->handler_));
      error_code ec = op->result;
      if (keep_ && !op->claim()) ec = net::error::operation_aborted;  // revoked first
      destroy(op, alloc);  // the op's handler was moved from: use the allocator copied before
      keep_.reset();
      std::move(handler)(ec);
    }

   private:
    remote_op_impl* op_;
    std::shared_ptr<remote_owner> keep_;  // set for a granted op only
  };

  static void do_deliver(remote_op* base, const void* io_executor, remote_owner* owner) noexcept {
    auto* op = static_cast<remote_op_impl*>(base);
    const bool granted = op->status.load(std::memory_order_acquire) == rein::detail::wait_status::granted;
    runner r(op, granted ? owner->share() : nullptr);
    try {
      auto ex = net::get_associated_executor(r.handler(), *static_cast<const IoExecutor*>(io_executor));
      net::post(ex, std::move(r));
    } catch (...) {
      // The post failed (no memory): the runner, destroyed unrun, gives a grant back and frees the op.
    }
  }

  Handler handler_;
};

// Requests to hand to the connection once the lock is released. Inline room for the usual few.
struct send {
  enum class kind : std::uint8_t { admission, refund, script_load };
  kind what;
  std::uint64_t seq;   // admission: its ticket
  std::int64_t n;      // admission: tokens wanted; refund: tokens given back
};

class send_list {
 public:
  void push(send s) {
    if (size_ < inline_.size()) inline_[size_] = s;
    else overflow_.push_back(s);
    ++size_;
  }
  bool empty() const noexcept { return size_ == 0; }
  std::size_t size() const noexcept { return size_; }
  const send& operator[](std::size_t i) const noexcept { return i < inline_.size() ? inline_[i] : overflow_[i - inline_.size()]; }
  void clear() noexcept {
    size_ = 0;
    overflow_.clear();
  }

 private:
  std::array<send, 4> inline_{};
  std::vector<send> overflow_;
  std::size_t size_ = 0;
};

// The limiter's machinery, held by shared_ptr: by the public object, by its timer wait, and by every
// request on the wire (so a reply arriving after the limiter is destroyed finds it alive, and does nothing
// but refund).
//
// Invariants, all under mutex_:
// - queue_ holds every operation not yet completed, in arrival order. Each is `probing` (its admission
//   request is on the wire, with a ticket) or idle (waiting its turn). Whoever unlinks an op under the lock
//   owns its completion (as in rein::detail::limiter_core); a late cancellation then finds it non-queued.
// - FIFO with head-of-line blocking: only the first idle op may be sent (or decided locally), so a request
//   for many tokens is not overtaken by later small ones. Requests already on the wire are decided by Redis
//   in the order it receives them.
// - tickets_ holds one entry per admission request on the wire, indexed by sequence number; replies may
//   arrive in any order (requests from several threads reach the connection in any order). A ticket whose
//   op completed first (cancelled, timed out, closed) is abandoned: if Redis granted it, the tokens are
//   refunded.
// - One timer, armed for the earliest of: the nearest deadline, and the moment the first idle op should be
//   tried (Redis's retry-after, or the local bucket's ready time while degraded). Never re-armed for a later
//   time; an early wake-up just recomputes.
template <class Executor, class Mutex, class Clock>
class shared_bucket_core final : public remote_owner,
                                 public std::enable_shared_from_this<shared_bucket_core<Executor, Mutex, Clock>> {
 public:
  using time_point = typename Clock::time_point;
  using duration = typename Clock::duration;
  using timer_type = net::basic_waitable_timer<Clock, net::wait_traits<Clock>, Executor>;
  using connection_type = connection_core<Executor>;
  using steady = std::chrono::steady_clock;

  shared_bucket_core(const Executor& ex, std::shared_ptr<connection_type> conn, shared_token_bucket_options o)
      : executor_(ex),
        timer_(ex),
        connection_(std::move(conn)),
        options_(validated(std::move(o))),
        interval_us_(1e6 / options_.rate),
        sha_(sha1_hex(token_bucket_script)),
        load_command_(encode_command({"SCRIPT", "LOAD", token_bucket_script})),
        take_one_command_(eval_command(1)) {
    if (options_.on_failure == failure_policy::fail_open) {
      const double share = options_.fail_open_share;
      const auto local_capacity =
          std::max<std::int64_t>(1, static_cast<std::int64_t>(std::floor(static_cast<double>(options_.capacity) * share)));
      local_.emplace(algo::token_bucket_options{.rate = options_.rate * share, .capacity = local_capacity}, Clock::now());
    }
    // "SCRIPT LOAD once": on this and every later connection, before any EVALSHA.
    connection_->add_startup_command(load_command_);
  }

  const Executor& get_executor() const noexcept { return executor_; }
  const shared_token_bucket_options& options() const noexcept { return options_; }
  const std::shared_ptr<connection_type>& connection() const noexcept { return connection_; }

  template <class Handler>
  void async_acquire(Handler&& handler, std::size_t n, time_point deadline) {
    using op_type = remote_op_impl<std::decay_t<Handler>, Executor>;
    op_type* op = op_type::create(std::forward<Handler>(handler), n);  // allocate before taking the lock
    remote_ready ready;
    send_list sends;
    {
      std::lock_guard<Mutex> lock(mutex_);
      // The slot is connected under the lock so that a grant racing with it cannot free the op first.
      if (admit_locked(op, deadline, ready, sends)) op->connect_cancellation(this);
    }
    finish(ready, sends);
  }

  void refund(std::size_t n) {
    if (n == 0) return;
    send_list sends;
    {
      std::lock_guard<Mutex> lock(mutex_);
      queue_refund_locked(static_cast<std::int64_t>(std::min<std::size_t>(n, static_cast<std::size_t>(options_.capacity))), sends);
    }
    run(sends);
  }

  void close() { fail_all(make_error_code(rein::errc::closed), false); }

  void shutdown() { fail_all(net::error::operation_aborted, true); }

  shared_token_bucket_snapshot snapshot() const {
    const bool up = connection_->connected();
    std::lock_guard<Mutex> lock(mutex_);
    shared_token_bucket_snapshot s = stats_;
    s.waiting = queue_.size();
    s.in_flight = in_flight_;
    s.degraded = degraded_;
    s.connected = up;
    s.tokens = tokens_estimate_locked(Clock::now());
    // Grants made at once count as zero waits (as in every rein limiter's histogram).
    if (s.acquired_total > s.wait.count()) s.wait.record(std::chrono::nanoseconds{0}, s.acquired_total - s.wait.count());
    return s;
  }

  // remote_owner
  void cancel_remote(remote_op* op) noexcept override {
    remote_ready ready;
    send_list sends;
    bool revoke = false;
    const std::size_t n = op->count;
    {
      std::lock_guard<Mutex> lock(mutex_);
      const auto status = op->status.load(std::memory_order_acquire);
      if (status == rein::detail::wait_status::queued) {
        ++stats_.cancelled_total;
        complete_locked(op, net::error::operation_aborted, ready);
        pump_locked(Clock::now(), ready, sends);  // it may have been the head blocking the line
      } else if (status == rein::detail::wait_status::granted && op->claim()) {
        // Granted, its handler not run yet: the runner will find the claim taken and report
        // operation_aborted (it runs on the executor this cancellation was emitted from, so not meanwhile).
        ++stats_.cancelled_total;
        revoke = true;
      }
    }
    if (revoke) give_back(n);
    finish(ready, sends);
  }

  void give_back(std::size_t n) noexcept override {
    try {
      refund(n);
    } catch (...) {
      // Best effort, as every refund: without memory for the request the tokens stay taken.
    }
  }

  std::shared_ptr<remote_owner> share() noexcept override { return this->shared_from_this(); }

  // A reply (or the failure to get one) for the admission request with ticket `seq`.
  void on_admission_reply(std::uint64_t seq, const verdict& v) {
    remote_ready ready;
    send_list sends;
    {
      std::lock_guard<Mutex> lock(mutex_);
      settle_locked(seq, v, Clock::now(), ready, sends);
      pump_locked(Clock::now(), ready, sends);
    }
    finish(ready, sends);
  }

  void on_refund_reply(bool ok) {
    if (ok) return;
    std::lock_guard<Mutex> lock(mutex_);
    ++stats_.server_errors;
  }

 private:
  struct ticket {
    remote_op* op;  // null once abandoned
    std::int64_t n;
    steady::time_point sent;
    std::uint8_t attempts;
    bool done;
  };

  // ---- Requests on the wire ------------------------------------------------------------------------------

  class admission_node final : public request_node {
   public:
    admission_node(std::shared_ptr<shared_bucket_core> core, std::uint64_t seq) noexcept
        : core_(std::move(core)), seq_(seq) {}
    void complete(const error_code& ec, const ::redisReply* reply) noexcept override {
      std::shared_ptr<shared_bucket_core> core = std::move(core_);
      const std::uint64_t seq = seq_;
      delete this;
      core->on_admission_reply(seq, read_verdict(ec, reply));
    }

   private:
    std::shared_ptr<shared_bucket_core> core_;
    std::uint64_t seq_;
  };

  // Refunds and script loads: fire and forget; only errors are counted.
  class side_node final : public request_node {
   public:
    explicit side_node(std::shared_ptr<shared_bucket_core> core) noexcept : core_(std::move(core)) {}
    void complete(const error_code& ec, const ::redisReply* reply) noexcept override {
      std::shared_ptr<shared_bucket_core> core = std::move(core_);
      const bool ok = ec || (reply != nullptr && reply->type != REDIS_REPLY_ERROR);  // a lost one is no error
      delete this;
      core->on_refund_reply(ok);
    }

   private:
    std::shared_ptr<shared_bucket_core> core_;
  };

  std::string eval_command(std::int64_t n) const {
    const std::string interval = format_number(interval_us_);
    const std::string capacity = std::to_string(options_.capacity);
    const std::string count = std::to_string(n);
    return encode_command({"EVALSHA", sha_, "1", options_.key, interval, capacity, count});
  }

  // Hands one request to the connection. False: the connection refused it (down or closed).
  bool submit(const send& s) {
    auto self = this->shared_from_this();
    if (s.what == send::kind::admission) {
      auto* node = new admission_node(std::move(self), s.seq);
      const bool ok = s.n == 1 ? connection_->submit(take_one_command_, node) : connection_->submit(eval_command(s.n), node);
      if (!ok) delete node;
      return ok;
    }
    auto* node = new side_node(std::move(self));
    const bool ok = s.what == send::kind::refund ? connection_->submit(eval_command(-s.n), node)
                                                 : connection_->submit(load_command_, node);
    if (!ok) delete node;
    return ok;
  }

  // Sends outside the lock. An admission the connection refuses is settled as `unavailable` at once, which
  // may send more: a loop, not recursion, so a long line failing at once cannot overflow the stack.
  void run(send_list& sends) {
    while (!sends.empty()) {
      send_list refused;
      for (std::size_t i = 0; i < sends.size(); ++i) {
        if (!submit(sends[i]) && sends[i].what == send::kind::admission) refused.push(sends[i]);
      }
      sends.clear();
      if (refused.empty()) return;
      remote_ready ready;
      {
        std::lock_guard<Mutex> lock(mutex_);
        const time_point now = Clock::now();
        for (std::size_t i = 0; i < refused.size(); ++i) settle_locked(refused[i].seq, verdict{}, now, ready, sends);
        pump_locked(now, ready, sends);
      }
      ready.complete_all(&executor_, this);
    }
  }

  void finish(remote_ready& ready, send_list& sends) {
    ready.complete_all(&executor_, this);
    run(sends);
  }

  // ---- Decisions, all under the lock ---------------------------------------------------------------------

  bool admit_locked(remote_op* op, time_point deadline, remote_ready& ready, send_list& sends) {
    const std::size_t n = op->count;
    const time_point now = Clock::now();
    if (closed_) return finish_locked(op, make_error_code(rein::errc::closed), ready), false;
    if (n > static_cast<std::size_t>(options_.capacity))
      return finish_locked(op, make_error_code(rein::errc::exceeds_capacity), ready), false;
    if (n == 0) {
      ++stats_.acquired_total;
      return finish_locked(op, error_code{}, ready), false;
    }
    if (deadline != time_point::max() && deadline <= now) {
      ++stats_.timed_out_total;
      ++stats_.rejected_total;
      return finish_locked(op, make_error_code(rein::errc::timed_out), ready), false;
    }
    op->stamp_ns = to_ns(now);
    op->seq = arrivals_++;  // equal deadlines expire in arrival order (deadline_heap)
    queue_.push_back(op);
    if (deadline != time_point::max()) {
      op->deadline_ns = to_ns(deadline);
      deadlines_.push(op);
    }
    pump_locked(now, ready, sends);
    if (op->status.load(std::memory_order_relaxed) != rein::detail::wait_status::queued) return false;
    if (!op->probing && idle_locked() > options_.max_waiters) {
      ++stats_.queue_full_total;
      ++stats_.rejected_total;
      complete_locked(op, make_error_code(rein::errc::queue_full), ready);
      return false;
    }
    return true;
  }

  // Applies a verdict to its ticket and, if still wanted, to its op.
  void settle_locked(std::uint64_t seq, const verdict& v, time_point now, remote_ready& ready,
                     send_list& sends) {
    using kind = verdict::kind;
    ticket& t = tickets_[static_cast<std::size_t>(seq - first_seq_)];
    if (v.what != kind::unavailable || !v.message.empty()) record_round_trip_locked(t);
    if (v.what == kind::no_script && t.attempts < 2 && t.op != nullptr) {
      // The server lost its scripts (SCRIPT FLUSH, a failover): load, then ask again, back to back.
      ++t.attempts;
      t.sent = steady::now();
      ++stats_.script_loads;
      sends.push({send::kind::script_load, 0, 0});
      sends.push({send::kind::admission, seq, t.n});
      return;
    }
    remote_op* op = t.op;
    const std::int64_t n = t.n;
    retire_locked(t);
    learn_locked(v, now);
    if (op == nullptr) {
      if (v.what == kind::allowed) queue_refund_locked(n, sends);
      return;
    }
    op->probing = false;
    --probing_;
    switch (v.what) {
      case kind::allowed:
        grant_locked(op, now, ready);
        return;
      case kind::denied:
        if (first_idle_locked() == op) {
          hold_until_ = std::max(hold_until_, now + ceil_duration(v.retry_after_us));
        }
        if (idle_locked() > options_.max_waiters) {
          ++stats_.queue_full_total;
          ++stats_.rejected_total;
          complete_locked(op, make_error_code(rein::errc::queue_full), ready);
        }
        return;
      case kind::unavailable:
        return;  // stays in line; pump applies the failure policy to it in FIFO order
      case kind::no_script:
      case kind::server_error:
        complete_locked(op, make_error_code(errc::server_error), ready);
        return;
    }
  }

  void record_round_trip_locked(const ticket& t) {
    const auto rtt = std::chrono::duration_cast<std::chrono::nanoseconds>(steady::now() - t.sent);
    ++stats_.round_trips;
    stats_.round_trip_last = rtt;
    stats_.round_trip_total += rtt;
    stats_.round_trip_max = std::max(stats_.round_trip_max, rtt);
  }

  void retire_locked(ticket& t) {
    t.done = true;
    t.op = nullptr;
    --in_flight_;
    while (!tickets_.empty() && tickets_.front().done) {
      tickets_.pop_front();
      ++first_seq_;
    }
  }

  void learn_locked(const verdict& v, time_point now) {
    using kind = verdict::kind;
    switch (v.what) {
      case kind::allowed:
      case kind::denied:
        degraded_ = false;
        have_reply_ = true;
        last_reply_at_ = now;
        available_us_ = v.available_us;
        if (v.what == kind::allowed) {
          ++stats_.remote_allowed;
          hold_until_ = time_point::min();
        } else {
          ++stats_.remote_denied;
          stats_.retry_after_last = std::chrono::microseconds(static_cast<std::int64_t>(v.retry_after_us));
        }
        return;
      case kind::unavailable:
        degraded_ = true;
        degraded_until_ = now + std::chrono::duration_cast<duration>(options_.recheck_interval);
        return;
      case kind::no_script:
      case kind::server_error:
        ++stats_.server_errors;
        return;
    }
  }

  void queue_refund_locked(std::int64_t n, send_list& sends) {
    ++stats_.refunds;
    sends.push({send::kind::refund, 0, n});
  }

  // Moves the line forward: expires deadlines, then serves idle ops from the first, in order, while it can.
  void pump_locked(time_point now, remote_ready& ready, send_list& sends) {
    expire_locked(now, ready);
    if (degraded_ && now >= degraded_until_ && connection_->connected()) degraded_ = false;
    rein::detail::wait_op* w = queue_.size() == probing_ ? nullptr : queue_.front();
    while (w != nullptr) {
      auto* op = static_cast<remote_op*>(w);
      rein::detail::wait_op* next = w->next;  // read first: op may be unlinked below
      if (!op->probing && !serve_locked(op, now, ready, sends)) break;
      w = next;
    }
    arm_timer_locked(now);
  }

  // Serves the first idle op. False: it must keep waiting (and so must everyone behind it).
  bool serve_locked(remote_op* op, time_point now, remote_ready& ready, send_list& sends) {
    if (!degraded_) return probe_locked(op, now, sends);
    if (options_.on_failure == failure_policy::fail_closed) {
      ++stats_.unavailable_total;
      complete_locked(op, make_error_code(errc::unavailable), ready);
      return true;
    }
    const auto result = local_->try_take(static_cast<std::int64_t>(op->count), now);
    if (result == algo::take_result::denied) return false;
    if (result == algo::take_result::exceeds_capacity) {
      ++stats_.unavailable_total;
      complete_locked(op, make_error_code(errc::unavailable), ready);
      return true;
    }
    ++stats_.local_admitted;
    grant_locked(op, now, ready);
    return true;
  }

  bool probe_locked(remote_op* op, time_point now, send_list& sends) {
    if (in_flight_ >= window_locked(now) || remote_ready_at_locked(op->count) > now) return false;
    op->probing = true;
    op->ticket = first_seq_ + tickets_.size();
    ++probing_;
    ++in_flight_;
    const auto n = static_cast<std::int64_t>(op->count);
    tickets_.push_back(ticket{op, n, steady::now(), 0, false});
    sends.push({send::kind::admission, op->ticket, n});
    return true;
  }

  // When the first idle op, wanting n, should be tried: after the last denial's retry-after, and once the
  // bucket, as last seen plus refill, holds n tokens.
  time_point remote_ready_at_locked(std::size_t n) const {
    if (!have_reply_) return hold_until_;
    const double missing_us = static_cast<double>(n) * interval_us_ - available_us_;
    const time_point refilled = missing_us <= 0 ? last_reply_at_ : last_reply_at_ + ceil_duration(missing_us);
    return std::max(hold_until_, refilled);
  }

  // How many requests may be on the wire: as many as the tokens the bucket is believed to hold (at least
  // one), so a nearly empty bucket is not asked 64 times for one token.
  std::size_t window_locked(time_point now) const {
    const double tokens = std::floor(tokens_estimate_locked(now));
    if (tokens >= static_cast<double>(options_.max_in_flight)) return options_.max_in_flight;
    return tokens < 1 ? 1 : static_cast<std::size_t>(tokens);
  }

  double tokens_estimate_locked(time_point now) const {
    const auto capacity = static_cast<double>(options_.capacity);
    if (!have_reply_) return capacity;
    const double elapsed_us = std::chrono::duration<double, std::micro>(std::max(now, last_reply_at_) - last_reply_at_).count();
    return std::min(capacity, (available_us_ + elapsed_us) / interval_us_);
  }

  remote_op* first_idle_locked() const {
    if (queue_.size() == probing_) return nullptr;
    for (rein::detail::wait_op* w = queue_.front(); w != nullptr; w = w->next) {
      if (!static_cast<remote_op*>(w)->probing) return static_cast<remote_op*>(w);
    }
    return nullptr;
  }

  std::size_t idle_locked() const noexcept { return queue_.size() - probing_; }

  void expire_locked(time_point now, remote_ready& ready) {
    while (!deadlines_.empty() && deadlines_.top()->deadline_ns <= to_ns(now)) {
      ++stats_.timed_out_total;
      ++stats_.rejected_total;
      complete_locked(static_cast<remote_op*>(deadlines_.top()), make_error_code(rein::errc::timed_out), ready);
    }
  }

  void grant_locked(remote_op* op, time_point now, remote_ready& ready) {
    const std::chrono::nanoseconds waited(to_ns(now) - op->stamp_ns);
    stats_.wait_total += waited;
    stats_.wait_max = std::max(stats_.wait_max, waited);
    stats_.wait.record(waited);
    ++stats_.acquired_total;
    complete_locked(op, error_code{}, ready);
  }

  // Unlinks a queued op (abandoning its ticket if its request is on the wire) and readies its completion.
  void complete_locked(remote_op* op, const error_code& ec, remote_ready& ready) {
    if (op->probing) {
      tickets_[static_cast<std::size_t>(op->ticket - first_seq_)].op = nullptr;
      op->probing = false;
      --probing_;
    }
    queue_.erase(op);
    if (op->deadline_ns != rein::detail::no_deadline) deadlines_.erase(op);
    finish_locked(op, ec, ready);
  }

  static void finish_locked(remote_op* op, const error_code& ec, remote_ready& ready) noexcept {
    op->result = ec;
    op->status.store(ec ? rein::detail::wait_status::aborted : rein::detail::wait_status::granted,
                     std::memory_order_release);
    ready.push(op);
  }

  void fail_all(const error_code& ec, bool shut_down) {
    remote_ready ready;
    {
      std::lock_guard<Mutex> lock(mutex_);
      closed_ = true;
      while (!queue_.empty()) complete_locked(static_cast<remote_op*>(queue_.front()), ec, ready);
      if (shut_down) {
        shut_down_ = true;
        timer_.cancel();
      }
    }
    ready.complete_all(&executor_, this);
  }

  // ---- The one timer -------------------------------------------------------------------------------------

  void arm_timer_locked(time_point now) {
    if (shut_down_) return;
    time_point wake = time_point::max();
    if (const remote_op* head = first_idle_locked()) {
      if (!degraded_) {
        const time_point at = remote_ready_at_locked(head->count);
        if (at > now) wake = at;  // otherwise it waits for a reply (the window is full), not for time
      } else if (local_) {
        wake = local_->ready_at(static_cast<std::int64_t>(head->count), now).value_or(time_point::max());
        if (degraded_until_ > now) wake = std::min(wake, degraded_until_);  // then ask Redis again
        if (wake <= now) wake = now + duration(1);
      }
    }
    if (!deadlines_.empty()) wake = std::min(wake, from_ns(deadlines_.top()->deadline_ns));
    if (wake == time_point::max()) return;
    if (timer_armed_ && timer_at_ <= wake) return;
    timer_armed_ = true;
    timer_at_ = wake;
    ++timer_generation_;
    timer_.expires_at(wake);
    timer_.async_wait(timer_handler{this->shared_from_this(), timer_generation_});
  }

  struct timer_handler {
    std::shared_ptr<shared_bucket_core> self;
    std::uint64_t generation;
    void operator()(const error_code&) const { self->on_timer(generation); }
  };

  void on_timer(std::uint64_t generation) {
    remote_ready ready;
    send_list sends;
    {
      std::lock_guard<Mutex> lock(mutex_);
      if (shut_down_ || generation != timer_generation_) return;  // superseded by a re-arm
      timer_armed_ = false;
      pump_locked(Clock::now(), ready, sends);
    }
    finish(ready, sends);
  }

  // ---- Time ----------------------------------------------------------------------------------------------

  static std::int64_t to_ns(time_point t) noexcept { return rein::detail::to_ns_saturated(t); }

  static time_point from_ns(std::int64_t ns) noexcept {
    return time_point(std::chrono::duration_cast<duration>(std::chrono::nanoseconds(ns)));
  }

  static duration ceil_duration(double microseconds) noexcept {
    return std::chrono::ceil<duration>(std::chrono::duration<double, std::micro>(microseconds));
  }

  Executor executor_;
  mutable Mutex mutex_;
  timer_type timer_;
  const std::shared_ptr<connection_type> connection_;
  const shared_token_bucket_options options_;
  const double interval_us_;
  const std::string sha_;
  const std::string load_command_;
  const std::string take_one_command_;
  std::optional<algo::basic_token_bucket<Clock>> local_;

  rein::detail::op_queue queue_;
  rein::detail::deadline_heap deadlines_;
  std::deque<ticket> tickets_;
  std::uint64_t first_seq_ = 0;  // sequence number of tickets_.front()
  std::uint32_t arrivals_ = 0;   // wraps, as wait_op::seq does
  std::size_t probing_ = 0;      // ops in queue_ whose request is on the wire
  std::size_t in_flight_ = 0;    // tickets not yet answered, abandoned ones included

  bool have_reply_ = false;
  time_point last_reply_at_{};
  double available_us_ = 0;      // the bucket's content at last_reply_at_, in microseconds of refill
  time_point hold_until_ = time_point::min();
  bool degraded_ = false;
  time_point degraded_until_{};

  shared_token_bucket_snapshot stats_{};
  time_point timer_at_{};
  std::uint64_t timer_generation_ = 0;
  bool timer_armed_ = false;
  bool closed_ = false;
  bool shut_down_ = false;
};

}  // namespace detail

/// A token bucket shared by every process that names the same Redis key: one quota for a whole fleet.
///
/// `co_await bucket.acquire(n)` inside `net::awaitable<>` returns once n tokens were taken from the shared
/// bucket. Each admission is one round trip: an EVALSHA of a Lua script that refills and takes atomically
/// on the server, by the server's clock (see detail::token_bucket_script: GCRA in token-bucket form, state in
/// one hash per quota, loaded with SCRIPT LOAD on every connection and reloaded on NOSCRIPT). Requests from
/// all the coroutines using a limiter are pipelined on one connection (up to `max_in_flight`), and several
/// limiters can share one connection.
///
/// Waiting is local: a denied caller waits in this process, FIFO with head-of-line blocking, for the
/// retry-after the script returned, on one timer per limiter; then the head asks again. Every reply also
/// says what is left in the bucket, so the next caller is held until the refill rather than sent to be
/// refused, and no more requests are put on the wire than the bucket is believed to hold tokens (at least
/// one). A fleet thus sends about one request per admission plus one per denial, never a stream of polls.
/// The bucket admits at most `capacity + rate * t` in any interval of length t, fleet-wide. Order holds
/// within a process; between processes, whoever asks first after a refill gets the token (no fairness
/// between processes is promised).
///
/// Rule from: the token bucket kept in Redis by a Lua script, GCRA as in ITU-T I.371 and redis-cell; the
/// waiter discipline is that of every rein limiter (FIFO, one timer).
///
/// Failures (see failure_policy): while Redis cannot be asked, `fail_closed` completes waiting and new
/// acquires with errc::unavailable and admits nothing; `fail_open` admits from a local bucket with
/// `fail_open_share` of the quota. The connection reconnects by itself (with backoff); admissions go back to
/// Redis once it is connected and `recheck_interval` has passed. No operation waits on Redis longer than
/// the connection's `request_timeout`, and none past its own deadline.
///
/// Differences from rein::token_bucket: `try_acquire` always refuses, since an answer needs a round trip
/// (it exists for generic code; use `async_acquire_until` with a deadline); a deadline that cannot be met
/// is found out only when it passes, not predicted; `set_rate` does not exist (every process passes its own
/// rate: change the options everywhere). Otherwise it is used like any rein rate limiter (same acquire
/// functions and completion signature `void(error_code)`), including inside rein::throttle.
///
/// @tparam Executor the I/O executor; completions default to it. With a shared connection, the connection's.
/// @tparam Mutex    std::mutex (default), or rein::null_mutex when everything runs on one thread.
/// @tparam Clock    the clock of deadlines and local waiting (std::chrono::steady_clock). Redis's clock
///                  decides the rate.
///
/// @par Thread Safety
/// With std::mutex, every member function may be called concurrently, except destruction.
///
/// @par Lifetime
/// Not copyable or movable. Destroying it completes every waiter with `operation_aborted`; tokens Redis
/// grants to requests still on the wire are refunded if the connection is still up. A connection passed in
/// must outlive the limiter or the limiter sees Redis as unavailable.
template <class Executor = net::any_io_executor, class Mutex = std::mutex, class Clock = std::chrono::steady_clock>
class basic_shared_token_bucket {
  using core_type = detail::shared_bucket_core<Executor, Mutex, Clock>;

 public:
  /// The executor that runs completion handlers without an associated executor of their own.
  using executor_type = Executor;
  /// The clock that times the rule and the deadlines.
  using clock_type = Clock;
  /// A point in time of `clock_type`.
  using time_point = typename Clock::time_point;
  /// A duration of `clock_type`.
  using duration = typename Clock::duration;
  /// The connection type it shares or owns.
  using connection_type = basic_connection<Executor>;

  /// The same limiter type on another executor (Asio's convention).
  template <class OtherExecutor>
  struct rebind_executor {
    /// The same limiter type on `OtherExecutor`.
    using other = basic_shared_token_bucket<OtherExecutor, Mutex, Clock>;
  };

  /// A limiter on an existing connection (shared with other limiters and users).
  /// @throws std::invalid_argument naming the field and value if an option is out of range.
  basic_shared_token_bucket(connection_type& shared, shared_token_bucket_options options)
      : core_(std::make_shared<core_type>(shared.get_executor(), shared.core(), std::move(options))) {}

  /// A limiter with a connection of its own, closed when the limiter is destroyed.
  basic_shared_token_bucket(const executor_type& ex, connection_options redis, shared_token_bucket_options options)
      : owned_(std::make_shared<typename connection_type::core_type>(ex, std::move(redis))),
        core_(std::make_shared<core_type>(ex, owned_, std::move(options))) {}

  /// A limiter with a connection of its own on `context`'s executor.
  template <class ExecutionContext>
    requires std::is_convertible_v<ExecutionContext&, net::execution_context&>
  basic_shared_token_bucket(ExecutionContext& context, connection_options redis, shared_token_bucket_options options)
      : basic_shared_token_bucket(context.get_executor(), std::move(redis), std::move(options)) {}

  basic_shared_token_bucket(const basic_shared_token_bucket&) = delete;
  basic_shared_token_bucket& operator=(const basic_shared_token_bucket&) = delete;

  /// Completes every waiter with `operation_aborted`; closes the connection if it is the limiter's own.
  ~basic_shared_token_bucket() {
    core_->shutdown();
    if (owned_) owned_->close();
  }

  /// The executor given at construction.
  executor_type get_executor() const noexcept { return core_->get_executor(); }

  /// The options in force (as validated at construction).
  const shared_token_bucket_options& options() const noexcept { return core_->options(); }

  /// Always false (try_status::busy, no retry hint), taking nothing: whether Redis admits needs a round
  /// trip, which a function that never waits cannot make (and a local guess would break the fleet-wide
  /// bound). It exists so that generic code written against rein's rate limiters compiles and takes its
  /// waiting path, e.g. rein::throttle's
  /// `if (!rate.try_acquire(1)) co_await rate.async_acquire_until(1, deadline, ...)`; a throttle's own
  /// try_acquire therefore refuses at a Redis rate stage. Use async_acquire_until with a deadline for
  /// "at most this long".
  try_result try_acquire(std::size_t = 1) const noexcept { return try_result(try_status::busy); }

  /// Waits for n tokens from the shared bucket. The initiating function; every Asio completion token works.
  ///
  /// @param n     tokens wanted, at most the capacity. 0 completes at once without asking Redis.
  /// @param token completion token; signature `void(error_code)`. Default: `deferred`.
  ///
  /// Errors: rein::errc::exceeds_capacity (n above the capacity, at once), rein::errc::queue_full
  /// (max_waiters reached, when it would have to wait), rein::errc::closed, errc::unavailable (Redis cannot
  /// be asked and on_failure is fail_closed; with fail_open, when n exceeds the local bucket's capacity),
  /// errc::server_error (an error reply, e.g. WRONGTYPE), `operation_aborted` (cancelled, or the limiter was
  /// destroyed). The handler is never invoked from inside this function.
  ///
  /// @par Per-Operation Cancellation
  /// terminal, partial and total: the operation completes at once with operation_aborted. If its request
  /// is on the wire and Redis grants it, the tokens are given back with a refund request (best effort: lost
  /// if the connection fails first).
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code)) Token = default_token_t>
  auto async_acquire(std::size_t n = 1, Token&& token = Token{}) {
    return async_acquire_until(n, time_point::max(), std::forward<Token>(token));
  }

  /// As async_acquire, failing with rein::errc::timed_out if not granted within `timeout`.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code)) Token = default_token_t>
  auto async_acquire_for(std::size_t n, duration timeout, Token&& token = Token{}) {
    return async_acquire_until(n, rein::detail::deadline_after<Clock>(timeout), std::forward<Token>(token));
  }

  /// As async_acquire, failing with rein::errc::timed_out if not granted by `deadline` (time_point::max():
  /// never), also when the request is on the wire at that moment. A deadline already past fails at once.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code)) Token = default_token_t>
  auto async_acquire_until(std::size_t n, time_point deadline, Token&& token = Token{}) {
    return net::async_initiate<Token, void(error_code)>(initiate_acquire{core_.get()}, token, n, deadline);
  }

  /// Waits for n tokens inside a coroutine: `co_await bucket.acquire();`. Always one round trip at least
  /// (there is no synchronous fast path). Throws rein::system_error with async_acquire's errors.
  net::awaitable<void> acquire(std::size_t n = 1) { return acquire_until(n, time_point::max()); }

  /// As acquire, throwing rein::errc::timed_out if not granted within `timeout`.
  net::awaitable<void> acquire_for(std::size_t n, duration timeout) {
    return acquire_until(n, rein::detail::deadline_after<Clock>(timeout));
  }

  /// As acquire, throwing rein::errc::timed_out if not granted by `deadline`.
  net::awaitable<void> acquire_until(std::size_t n, time_point deadline) {
    co_await async_acquire_until(n, deadline, net::use_awaitable);
  }

  /// Gives n tokens back to the shared bucket (the unused part of an estimate), never above full: one
  /// request, not awaited, best effort (lost if Redis is unavailable).
  void refund(std::size_t n) { core_->refund(n); }

  /// Completes every waiter with rein::errc::closed; later acquires fail the same way. The limiter's own
  /// connection is closed too (so `io_context::run()` can return); a shared one stays open.
  void close() {
    core_->close();
    if (owned_) owned_->close();
  }

  /// Counters and state, including round-trip latency, copied under the lock.
  shared_token_bucket_snapshot snapshot() const { return core_->snapshot(); }

  /// The counters of the connection this limiter uses.
  rein::redis::connection_snapshot connection_snapshot() const { return core_->connection()->snapshot(); }

 private:
  struct initiate_acquire {
    core_type* core;
    using executor_type = Executor;
    executor_type get_executor() const noexcept { return core->get_executor(); }

    template <class Handler>
    void operator()(Handler&& handler, std::size_t n, time_point deadline) const {
      core->async_acquire(std::forward<Handler>(handler), n, deadline);
    }
  };

  std::shared_ptr<typename connection_type::core_type> owned_;
  std::shared_ptr<core_type> core_;
};

/// The thread-safe shared token bucket on any I/O executor.
using shared_token_bucket = basic_shared_token_bucket<>;

}  // namespace rein::redis
