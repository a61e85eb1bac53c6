// An awaitable counting semaphore: bounds how many calls are in flight.
#pragma once

#include <rein/config.hpp>
#include <rein/detail/acquire_doors.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/detail/clock_time.hpp>
#include <rein/detail/core_owner.hpp>
#include <rein/detail/format.hpp>
#include <rein/detail/limiter_core.hpp>
#include <rein/detail/line_setup.hpp>
#include <rein/detail/semaphore_policy.hpp>
#include <rein/error.hpp>
#include <rein/impl/line_instantiations.hpp>
#include <rein/lease_view.hpp>
#include <rein/line_options.hpp>
#include <rein/line_view.hpp>
#include <rein/null_mutex.hpp>
#include <rein/observer.hpp>
#include <rein/partition.hpp>
#include <rein/permit.hpp>
#include <rein/queue_order.hpp>
#include <rein/try_result.hpp>
#include <rein/wait_stats.hpp>

#include REIN_ASIO_HEADER(any_io_executor.hpp)
#include REIN_ASIO_HEADER(async_result.hpp)
#include REIN_ASIO_HEADER(awaitable.hpp)
#include REIN_ASIO_HEADER(execution_context.hpp)
#include REIN_ASIO_HEADER(redirect_error.hpp)
#include REIN_ASIO_HEADER(use_awaitable.hpp)

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
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

namespace rein {

/// A semaphore's state, copied out under its lock.
struct semaphore_snapshot : wait_stats {
  std::size_t permits = 0;    ///< total permits (initial plus add_permits)
  std::size_t available = 0;  ///< free now
  std::size_t in_flight = 0;  ///< held now, including grants not yet delivered (above `permits` for a
                              ///< while after forget: holders keep what they have)
  double limit = 0.0;         ///< permits, as every limiter's `limit`
  double utilisation = 0.0;   ///< in_flight / max(1, permits)
  std::vector<partition_snapshot> partitions{};  ///< with line_options::partitions: the rest, then each partition
  std::uint64_t leases_expired_total = 0;  ///< leases (with_lease) that ran out before their permits came back:
                                           ///< their slots were taken back
};

/// One line: `in_flight=3 limit=4 utilisation=0.75 available=1 waiting=0 acquired=10 rejected=0 wait[...]`.
inline std::ostream& operator<<(std::ostream& os, const semaphore_snapshot& s) {
  os << "in_flight=" << s.in_flight << " limit=" << s.permits << " utilisation=";
  detail::write_number(os, s.utilisation);
  os << " available=" << s.available << ' ';
  detail::write_wait_stats(os, s);
  return os;
}

/// An awaitable counting semaphore that bounds how many calls are in flight.
///
/// `co_await sem.acquire(n)` inside `net::awaitable<>` yields a rein::permit for n permits, given back when the permit
/// is destroyed or released. Waiting is FIFO with head-of-line blocking (newest first with `order = queue_order::lifo`,
/// by class with `queue_order::priority`, see rein::queue_order): a request for many permits is not overtaken by
/// later small ones (as in Go's x/sync/semaphore and tokio's Semaphore), and a permit released while others wait
/// goes straight to the head waiter, so a `try_acquire` in between cannot steal it. With line_options::partitions,
/// a partition below its guaranteed share is served ahead of the head, and these rules hold within each
/// partition (see rein::partition).
///
/// @tparam Executor the I/O executor; completions default to it.
/// @tparam Clock    the clock of deadlines (std::chrono::steady_clock; rein::testing::manual_clock in tests).
/// @tparam Mutex    std::mutex (default) makes it safe to use from many threads and strands;
///                  rein::null_mutex gives the single-threaded variant (one thread or strand only).
///                  The order <Executor, Clock, Mutex> is that of every rein limiter.
///
/// @par Thread Safety
/// With std::mutex, every member function may be called concurrently, except destruction (which, as for
/// Asio's I/O objects, must not race with its own operations, their cancellation signals included).
/// With null_mutex, all use must happen on one thread or strand.
///
/// @par Fast path
/// With std::mutex (any Mutex but null_mutex), while nobody waits the free permits sit in one atomic
/// word, so an uncontended try_acquire, acquire and release are each one compare-and-swap and take no lock
/// (the state word of Go's sync.Mutex and of tokio's Semaphore). Whenever the lock is taken (a waiter, a
/// snapshot, add_permits, forget, close), the word is folded back first, so every rule above holds as with
/// the lock alone: a waiter is never overtaken, and the counters are exact.
/// While a leased permit (with_lease) is out and its lease live, the word stays closed: calls take the lock.
///
/// @par Lifetime
/// Movable, not copyable. Destroying it completes every waiter with `net::error::operation_aborted`, also
/// one whose permits were granted but whose handler has not run yet (it never receives a permit to a
/// destroyed semaphore). Permits may outlive it (as tokio's `OwnedSemaphorePermit` may): giving one back
/// later is safe and changes nothing any more.
template <class Executor = net::any_io_executor, class Clock = std::chrono::steady_clock, class Mutex = std::mutex>
class basic_semaphore {
  using core_type = detail::limiter_core<detail::semaphore_policy, Executor, Clock, Mutex, void(error_code, permit)>;

 public:
  /// The executor that runs completion handlers without an associated executor of their own.
  using executor_type = Executor;
  /// The clock that times the rule and the deadlines.
  using clock_type = Clock;
  /// A point in time of `clock_type`.
  using time_point = typename Clock::time_point;
  /// A duration of `clock_type`.
  using duration = typename Clock::duration;

  /// The semaphore type when rebound to another executor.
  template <class OtherExecutor>
  struct rebind_executor {
    /// The same limiter type on `OtherExecutor`.
    using other = basic_semaphore<OtherExecutor, Clock, Mutex>;
  };

  /// The rule it takes: its permits.
  using rule_type = std::size_t;

  /// Constructs a semaphore with `permits` free permits, completing operations on `ex` by default; `line`
  /// is its waiting line's (rein::line_options: all of them apply, partitions included).
  /// @throws std::invalid_argument naming the type, the field and the value for an invalid line option.
  basic_semaphore(const executor_type& ex, std::size_t permits, line_options line = {});

  /// Constructs a semaphore on an execution context (an io_context) with `permits` free permits.
  template <class ExecutionContext>
    requires std::is_convertible_v<ExecutionContext&, net::execution_context&>
  basic_semaphore(ExecutionContext& context, std::size_t permits, line_options line = {})
      : basic_semaphore(context.get_executor(), permits, std::move(line)) {}

  basic_semaphore(const basic_semaphore&) = delete;
  basic_semaphore& operator=(const basic_semaphore&) = delete;

  /// Moves the limiter: waiters, permits and state stay with it (permits point at its shared state, not at
  /// this object). The moved-from object may only be destroyed or assigned to.
  basic_semaphore(basic_semaphore&&) noexcept = default;

  /// Destroys this limiter's state as the destructor does, then takes `other`'s.
  basic_semaphore& operator=(basic_semaphore&&) noexcept = default;

  /// Completes every waiter with `net::error::operation_aborted`.
  ~basic_semaphore() = default;

  /// The executor given at construction.
  executor_type get_executor() const noexcept { return core_->get_executor(); }

  /// The name given in the options (empty if none).
  const std::string& name() const noexcept { return core_->name(); }

  /// Takes n permits now if they are free and nobody waits; otherwise returns an empty permit whose
  /// status() says why: try_status::busy (not free, or others wait), closed (after close()),
  /// exceeds_capacity (n above a non-zero total). Never waits, never allocates.
  try_permit try_acquire(std::size_t n = 1) { return doors().try_acquire(n); }

  /// Waits for n permits. The initiating function; every Asio completion token works.
  ///
  /// @param n     permits wanted; must not exceed the total. n == 0 is a request like any other that takes
  ///              nothing: granted in its turn (at once when nobody waits), with a permit of count 0.
  /// @param token completion token; signature `void(error_code, rein::permit)`. Default: `deferred`.
  ///
  /// Errors: errc::exceeds_capacity (n above a non-zero total, at once; a semaphore made with 0 permits is a
  /// gate: its waiters wait for add_permits), errc::queue_full (max_waiters reached,
  /// at once), errc::closed, errc::overloaded (shed by the line's sojourn rule, when set),
  /// `net::error::operation_aborted` (cancelled, or the semaphore was destroyed).
  /// The handler is never invoked from inside this function, nor from inside a release unless
  /// line_options::direct_handoff is set: it goes through its associated executor. While it waits, the
  /// operation counts as outstanding work on the semaphore's executor (`run()` does not return under it), as
  /// any pending Asio operation does.
  ///
  /// @par Per-Operation Cancellation
  /// terminal, partial and total: a waiting operation is removed and completes with operation_aborted. A
  /// cancellation that arrives after the permits were granted but before the handler runs takes the grant
  /// back (the permits go to the next waiter, the handler gets operation_aborted), as asyncio's and tokio's
  /// semaphores do; once the handler runs, it holds the permit. No permit is lost or handed out twice.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, permit)) Token = default_token_t>
  auto async_acquire(std::size_t n = 1, Token&& token = Token{}) {
    return doors().async_acquire_until(n, time_point::max(), std::forward<Token>(token));
  }

  /// As async_acquire, failing with errc::timed_out if not granted within `timeout` (a timeout too long to
  /// represent, such as duration::max(), means none).
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, permit)) Token = default_token_t>
  auto async_acquire_for(std::size_t n, duration timeout, Token&& token = Token{}) {
    return doors().async_acquire_for(n, timeout, std::forward<Token>(token));
  }

  /// As async_acquire, failing with errc::timed_out if not granted by `deadline` (time_point::max(): never).
  /// A deadline already past fails at once unless the permits are free right now.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, permit)) Token = default_token_t>
  auto async_acquire_until(std::size_t n, time_point deadline, Token&& token = Token{}) {
    return doors().async_acquire_until(n, deadline, std::forward<Token>(token));
  }

  /// Waits for n permits inside a coroutine: `auto p = co_await sem.acquire();`.
  ///
  /// When the permits are free and nobody waits, it completes without suspending through the scheduler (the
  /// cost of a nested `co_await` plus, with std::mutex, one compare-and-swap: see "Fast path" above).
  /// Otherwise it waits as async_acquire does. Throws
  /// `rein::system_error` with the errors listed for async_acquire.
  net::awaitable<permit> acquire(std::size_t n = 1) { return doors().acquire_until(n, time_point::max()); }

  /// As acquire, throwing errc::timed_out if not granted within `timeout` (a timeout too long to represent,
  /// such as duration::max(), means none).
  net::awaitable<permit> acquire_for(std::size_t n, duration timeout) { return doors().acquire_for(n, timeout); }

  /// As acquire, throwing errc::timed_out if not granted by `deadline`. Behind other waiters it does not
  /// try first (that would fail, and cost a lock).
  net::awaitable<permit> acquire_until(std::size_t n, time_point deadline) { return doors().acquire_until(n, deadline); }

  /// The order in which its line serves waiters (line_options::order).
  queue_order order() const noexcept { return core_->order(); }

  /// This limiter's acquire doors at priority class `c` (0 the most urgent; a plain acquire is class 0), for
  /// a limiter whose options chose `order = queue_order::priority`: `co_await lim.at_priority(2).acquire()`.
  /// See rein::line_view and queue_order::priority. Throws std::invalid_argument naming the limiter if
  /// its options chose another order (the class would be ignored).
  auto at_priority(std::uint8_t c) const { return detail::at_priority(doors(), c); }

  /// This limiter's acquire doors for the key `key` (a tenant, a host) at `weight` (1 to 1,000,000), for a
  /// limiter whose options chose `order = queue_order::fair`: `co_await lim.for_key(tenant, 2).acquire()`.
  /// While keys wait, each is served its weight's share of the units granted, whatever its arrival rate; a
  /// plain acquire is the key "" at weight 1. See rein::line_view and queue_order::fair for the rule and its
  /// bound. Throws std::invalid_argument naming the limiter if its options chose another order, or if the
  /// weight is out of range.
  auto for_key(std::string_view key, std::uint32_t weight = 1) const { return detail::for_key(doors(), key, weight); }

  /// This limiter's acquire doors in the partition called `name` (line_options::partitions), with try_acquire:
  /// `co_await sem.partition("live").acquire()`. Its grants count against that partition's guaranteed share
  /// (see rein::partition); a plain acquire belongs to the unnamed rest. See rein::line_view. Throws
  /// std::invalid_argument naming the limiter and the name if no partition is called so.
  auto partition(std::string_view name) const { return detail::in_partition(doors(), name); }

  /// This semaphore's acquire doors whose permits are leased for `lease` (Redisson's expirable permits):
  /// `co_await sem.with_lease(30s).acquire(n)`. A permit not given back within its lease comes back by
  /// itself (waiters are granted as at a release; counted in snapshot().leases_expired_total; reported as
  /// event_kind::lease_expired), and is inert from then on: giving it back later gives nothing. A permit
  /// given back in time cancels its lease. A view, as at_priority and partition are, so that every door
  /// (try, async with any token, coroutine, with a timeout or deadline) takes the lease alike; see
  /// rein::lease_view for the rules (when a lease starts, split permits, drains, destruction).
  ///
  /// @param lease how long each permit may be held, in the clock's units (`30s` converts); > 0. A lease too
  ///              long to count in nanoseconds from now never ends.
  /// @throws std::invalid_argument naming the semaphore, the field and the value if lease <= 0.
  auto with_lease(duration lease) const { return detail::with_lease(doors(), lease); }

  /// Adds n permits (raises the total); waiters that now fit are granted in the line's order. After forget, the
  /// added permits first cancel what holders still owe. When a semaphore with no permits (a gate) opens,
  /// a waiter that asks for more than the new total completes with errc::exceeds_capacity at once, as an
  /// acquire made now would (and as after set_permits); it would otherwise block the line behind it.
  ///
  /// @throws std::invalid_argument if the total would exceed std::size_t's range (nothing changes).
  void add_permits(std::size_t n) {
    core_->update_and_refuse([n](detail::semaphore_policy& p, auto) {
      if (n > std::numeric_limits<std::size_t>::max() - p.permits)
        throw std::invalid_argument("rein::basic_semaphore: add_permits(n) would overflow the total of " +
                                    std::to_string(p.permits) + " permits, got n = " + std::to_string(n));
      const bool was_gate = p.permits == 0;
      p.add(n);
      return was_gate && n != 0;  // a gate that opens to less than a waiter asks: that waiter fails
    });
  }

  /// Lowers the total by n permits (tokio's `forget_permits`, Go's proposed `Shrink`): free permits are
  /// removed at once; the rest come off as holders give theirs back, so holders keep what they have and no
  /// new grant is made until fewer than the new total are in flight. A waiter that now asks for more than
  /// the new total completes at once with errc::exceeds_capacity (unless the total is 0: a semaphore with no
  /// permits is a gate that add_permits opens).
  ///
  /// @throws std::invalid_argument if n exceeds the total (nothing changes).
  void forget(std::size_t n) {
    core_->update_and_refuse([n](detail::semaphore_policy& p, auto) {
      if (n > p.permits)
        throw std::invalid_argument("rein::basic_semaphore: forget(n) needs n <= the total of " +
                                    std::to_string(p.permits) + " permits, got n = " + std::to_string(n));
      p.forget(n);
    });
  }

  /// Sets the total to `total` permits: add_permits(total - permits()) when it grows, forget(permits() -
  /// total) when it shrinks (with that function's effect on holders and waiters), atomically.
  void set_permits(std::size_t total) {
    core_->update_and_refuse([total](detail::semaphore_policy& p, auto) {
      if (total < p.permits) p.forget(p.permits - total);
      else p.add(total - p.permits);
    });
  }

  /// The total number of permits (initial, plus add_permits, minus forget).
  std::size_t permits() const {
    return core_->inspect([](const detail::semaphore_policy& p, const wait_stats&) { return p.permits; });
  }

  /// Completes every waiter with errc::closed; later acquires fail the same way and try_acquire returns an
  /// empty permit. Permits already held stay valid and are given back as usual.
  void close() { core_->close(); }

  /// Waits until every permit this semaphore handed out has come back: completes at once if none is out
  /// (what tokio users write as `close()` then `acquire_many(total)`, and Go's `sync.WaitGroup.Wait`).
  /// With close() first, it is how a service stops without cutting calls in flight:
  /// `limiter.close(); co_await limiter.async_drain_for(30s, net::use_awaitable);`. Without close(), new
  /// grants may follow; it completes at a moment when none is out.
  ///
  /// @param token completion token; signature `void(error_code)`. Default: `deferred`.
  ///
  /// Errors: `net::error::operation_aborted` (cancelled, or the semaphore was destroyed). close() does not end
  /// it. While it waits, it counts as outstanding work on the executor, as any pending Asio operation does.
  ///
  /// @par Per-Operation Cancellation
  /// terminal, partial and total: the wait is removed and completes with operation_aborted.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code)) Token = default_token_t>
  auto async_drain(Token&& token = Token{}) {
    return doors().async_drain_until(time_point::max(), std::forward<Token>(token));
  }

  /// As async_drain, failing with errc::timed_out if permits are still out after `timeout` (a timeout too
  /// long to represent means none).
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code)) Token = default_token_t>
  auto async_drain_for(duration timeout, Token&& token = Token{}) {
    return doors().async_drain_for(timeout, std::forward<Token>(token));
  }

  /// As async_drain, failing with errc::timed_out if permits are still out at `deadline`.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code)) Token = default_token_t>
  auto async_drain_until(time_point deadline, Token&& token = Token{}) {
    return doors().async_drain_until(deadline, std::forward<Token>(token));
  }

  /// Permits free now.
  std::size_t available() const {
    return core_->inspect([](const detail::semaphore_policy& p, const wait_stats&) { return p.available; });
  }

  /// Counters and state, copied under the lock in O(1) (O(partitions) with partitions).
  semaphore_snapshot snapshot() const;

 private:
  // Every door is written once, in detail/acquire_doors.hpp.
  detail::line_doors<core_type> doors() const noexcept { return {core_.get(), "rein::semaphore"}; }

  detail::core_owner<core_type> core_;
};

// Members defined outside the class, so that REIN_SEPARATE_COMPILATION compiles them in one unit only: a
// unit that declares the class extern then neither instantiates them nor copies them in (config.hpp).
template <class Executor, class Clock, class Mutex>
REIN_SEPARATE_INLINE basic_semaphore<Executor, Clock, Mutex>::basic_semaphore(const executor_type& ex,
                                                                              std::size_t permits,
                                                                              line_options line)
    : core_(ex, detail::line_of("rein::semaphore", std::move(line), {.partitions = true}), permits) {}

template <class Executor, class Clock, class Mutex>
REIN_SEPARATE_INLINE semaphore_snapshot basic_semaphore<Executor, Clock, Mutex>::snapshot() const {
  return core_->inspect(
      [](const detail::semaphore_policy& p, const wait_stats& w, const detail::partition_table& parts) {
        semaphore_snapshot s;
        static_cast<wait_stats&>(s) = w;
        s.permits = p.permits;
        s.available = p.available;
        s.leases_expired_total = p.leases_expired;
        s.in_flight = p.in_flight();
        s.limit = static_cast<double>(p.permits);
        s.utilisation = static_cast<double>(s.in_flight) / std::max(1.0, s.limit);
        if (!parts.empty()) s.partitions = parts.snapshot(p.partition_limit());
        return s;
      });
}

/// The thread-safe semaphore on any I/O executor.
using semaphore = basic_semaphore<>;

/// The single-threaded semaphore: no locking; use from one thread or strand only.
using single_thread_semaphore = basic_semaphore<net::any_io_executor, std::chrono::steady_clock, null_mutex>;

/// The instantiations behind `semaphore`, compiled once with REIN_SEPARATE_COMPILATION (rein/config.hpp).
#define REIN_DETAIL_SEMAPHORE_INSTANTIATIONS(kind)                                                              \
  REIN_DETAIL_LINE_INSTANTIATIONS(kind, detail::limiter_core<detail::semaphore_policy, net::any_io_executor,   \
                                                            std::chrono::steady_clock, std::mutex,             \
                                                            void(error_code, permit)>)                         \
  kind template class basic_semaphore<>;

#if defined(REIN_SEPARATE_COMPILATION)
REIN_DETAIL_SEMAPHORE_INSTANTIATIONS(extern)
#if defined(REIN_DETAIL_KEYED_INSTANTIATION)  // rein/keyed.hpp came first
REIN_DETAIL_KEYED_INSTANTIATION(extern, semaphore)
#endif
#endif

}  // namespace rein
