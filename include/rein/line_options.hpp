// The options of a limiter's waiting line: what every rein limiter takes after its rule.
#pragma once

#include <rein/algo/codel.hpp>
#include <rein/detail/clock_time.hpp>
#include <rein/observer.hpp>
#include <rein/partition.hpp>
#include <rein/queue_order.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace rein {

/// The resolution of the clock that line_options::coarse_wait_clock times waits on, as the kernel reports it
/// (clock_getres of CLOCK_MONOTONIC_COARSE); steady_clock's own period where there is none.
inline std::chrono::nanoseconds coarse_wait_resolution() noexcept { return detail::coarse_steady_resolution(); }

/// The options of a limiter's waiting line, the same for every rein limiter. Every limiter constructs as
/// `T(executor, rule, line_options = {})`, the rule being what its algorithm decides by (a bucket's rate
/// and capacity, a semaphore's permits, an adaptive algorithm's options); an execution context (an
/// io_context) may stand for the executor. Write them with designated initializers, in this order:
///
/// ```
/// rein::semaphore db(io, 4, {.name = "db", .max_waiters = 64});
/// rein::token_bucket api(io, {.rate = 10, .capacity = 3}, {.name = "api", .order = rein::queue_order::lifo});
/// ```
/// (From tests/async/wait_core.cpp, which compiles and runs it.)
///
/// The limiter checks them at construction and throws std::invalid_argument naming its type (and name),
/// the field and the value: `rein::token_bucket "api": priority_aging must be >= 0, got -1 ns`. A field a
/// line cannot honour is refused the same way rather than ignored where ignoring it would change what the
/// caller asked for: an order other than fifo on the quota gate and the Redis limiters, evict_oldest on the
/// Redis limiters, partitions on a limiter that hands out no permits. Fields that only save or spend time
/// (measure_wait, coarse_wait_clock, direct_handoff, wake_jitter) are accepted everywhere and say where
/// they have an effect.
struct line_options {
  /// Names the limiter in events, metrics (the collector's default registration name) and error messages
  /// (`rein::semaphore "db": ...`). Default: none.
  std::string name{};

  /// How many operations may wait at once; one more completes at once with errc::queue_full (backpressure
  /// instead of unbounded memory). A Redis limiter's operations whose request is on the wire do not count.
  /// Any value; 0: nobody waits (an acquire that cannot be granted at once fails). Default: unbounded.
  std::size_t max_waiters = std::numeric_limits<std::size_t>::max();

  /// Called outside the lock with rejections (queue_full, timed_out, exceeds_capacity, closed, cancelled,
  /// and a type's own: unavailable, upstream_unavailable), limit changes and the type's own transitions
  /// (floor and ceiling, circuit, pause); see rein::limiter_observer. Default: none (no cost).
  limiter_observer observer{};

  /// Which waiter is served first: queue_order::fifo (default), lifo (newest first), priority (classes
  /// with aging, see `at_priority`) or fair (shares between keys, see `for_key`); see rein::queue_order.
  /// The quota gate and the Redis limiters serve in fifo order only and refuse the others.
  queue_order order = queue_order::fifo;

  /// What a full line does with one more waiter: refuse it (default) or evict the longest waiter, both with
  /// errc::queue_full; see rein::queue_full_policy. The Redis limiters refuse evict_oldest (their requests
  /// are pipelined in order).
  queue_full_policy when_full = queue_full_policy::reject_newest;

  /// queue_order::priority only (ignored in the other orders): the arrival-time handicap of one class,
  /// >= 0. A class-c waiter is placed as if it had arrived c x priority_aging later, so it is served before
  /// every class-0 waiter arriving more than c x priority_aging after it. Default: 1 s; 0: arrival order;
  /// nanoseconds::max(): strict priority.
  std::chrono::nanoseconds priority_aging = default_priority_aging;

  /// Splits the limit into partitions with guaranteed shares (`{{"live", 0.7}, {"batch", 0.3}}`), which
  /// acquires name through `partition(name)`; see rein::partition for the rule and the checks. Only the
  /// limiters that hand out permits against a limit in permits have them: rein::semaphore and
  /// rein::adaptive_limiter (whose guarantees follow the limit as it moves); the others refuse a non-empty
  /// list. Any order. Default: none.
  std::vector<partition> partitions{};

  /// Whether waits are timed for snapshot().wait_total, wait_max and the wait histogram. Timing costs two
  /// clock reads per acquire that has to wait (none when granted at once); the semaphore table of
  /// docs/benchmarks.md gives their cost next to a contended handoff. false: those fields stay zero, and a
  /// semaphore, the one line whose rule reads no clock, reads it only for deadlines. A line whose rule
  /// reads the clock anyway (the rate limiters, the adaptive limiter, whose latency runs from the grant, the
  /// quota gate, the Redis limiters) always times its waits. Any order. Default: true.
  bool measure_wait = true;

  /// Whether waits are timed on the kernel's coarse monotonic clock (Linux's CLOCK_MONOTONIC_COARSE, the
  /// time of the last tick of the clock std::chrono::steady_clock reads) instead of Clock::now(). Its reads
  /// cost a fraction of a precise read's, which takes wait timing from a tenth or more of a contended
  /// handoff to a few percent (docs/benchmarks.md, "Timing the waits"), at the tick's resolution,
  /// rein::coarse_wait_resolution() (1 to 10 ms, by the kernel's tick rate): each wait reads as a whole
  /// number of ticks, off by less than one; over many waits the errors cancel out, so wait_total and the
  /// mean stay unbiased, while the histogram's buckets below a tick mean nothing. Only on a line whose rule
  /// reads no clock (a semaphore's), with Clock = std::chrono::steady_clock on Linux, measure_wait on, and
  /// an order other than queue_order::priority (whose aging needs each arrival's exact instant); otherwise
  /// ignored. Deadlines are always timed on Clock. Default: false.
  bool coarse_wait_clock = false;

  /// Whether a release hands its permits to a waiter directly (dispatch instead of post): when the
  /// waiter's handler would run on the executor the releasing code is running on (its associated
  /// executor's running_in_this_thread(): an io_context's executor, a strand, or an any_io_executor
  /// holding an io_context's executor), the handler runs inside the release, after the limiter's lock is
  /// released, instead of going through the scheduler, so a contended handoff costs one scheduler round
  /// trip instead of two (docs/benchmarks.md). The ordering changes: the waiter may run before the code
  /// after `release()` or the permit's destruction, and a coroutine waiting in `co_await acquire()` resumes
  /// there. A handler that releases in turn hands off directly again, up to a small depth per thread, past
  /// which grants are posted, so the stack stays bounded. Grants to handlers bound to other executors or
  /// threads, grants made by anything but a release of a permit (an acquire, a timer, a limit change) and
  /// every failure are posted as without it; a limiter that hands out no permits (a rate limiter, the
  /// quota gate) has no releases, so there it changes nothing. An exception thrown by a handler run in
  /// place is rethrown from its executor's run(), as from a posted handler. Default: false.
  bool direct_handoff = false;

  /// Jittered wake-ups, >= 0: the timer that grants the head waiter when the rule has room fires a random
  /// delay in [0, wake_jitter] after that instant (drawn once per instant, from `jitter_seed`), so that
  /// replicas waiting on one shared quota do not all ask at the same tick (governor's
  /// `until_ready_with_jitter`). Units are taken at the grant, so the rule's bound holds; each jittered
  /// wake-up leaves the rule's room unused for that long. A grant that something else triggers (a release,
  /// a refund, a limit change) is not delayed, nor is a deadline. Only a rule that names an instant when
  /// the head will fit (the rate limiters, the quota gate's pause) has such a timer; on a semaphore's line
  /// it changes nothing. Default: 0, none.
  std::chrono::nanoseconds wake_jitter{};

  /// The seed of the wake-up jitter's draws: give each replica its own (its host name's hash, its PID).
  /// Default: 0.
  std::uint64_t jitter_seed = 0;

  /// Shedding by queueing time (CoDel): while the line has stood for a whole `sojourn.interval` (never
  /// empty, no grant that had waited `sojourn.target` or less), a waiter that has waited more than
  /// 2 x target fails with errc::overloaded instead of being granted; see rein::algo::basic_codel for the
  /// rule and its bound, and algo::codel_options for the checks (target >= 0, interval > 0 when target is
  /// set). fifo order only (std::invalid_argument otherwise: only the head is judged, and in the other
  /// orders older waiters could wait behind a younger head for ever); with it the line makes its timer when
  /// someone first waits, and times waits on Clock (coarse_wait_clock is ignored). Concurrency limiters only
  /// (rein::semaphore, rein::adaptive_limiter): the rate limiters, the windows and the quota gate refuse it
  /// (their waiters wait for the rule's own pacing, which the rule would read as a standing queue), and so
  /// do the Redis limiters (their waiting is Redis's). Default: off (target 0).
  algo::codel_options sojourn{};
};

}  // namespace rein
