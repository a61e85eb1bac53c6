// The throttle: any list of stages (quota gates, concurrency limits, rate limits; global or per key) passed
// around one outbound call, each charged its own share of the call, rates taken at the moment of sending.
#pragma once

#include <rein/config.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/detail/clock_time.hpp>
#include <rein/detail/format.hpp>
#include <rein/detail/spawned_operation.hpp>
#include <rein/detail/throttle_admission.hpp>
#include <rein/detail/throttle_stage_ops.hpp>
#include <rein/detail/throttle_stages.hpp>
#include <rein/error.hpp>
#include <rein/throttle_charge.hpp>
#include <rein/throttle_guard.hpp>
#include <rein/throttle_options.hpp>
#include <rein/throttle_reservation.hpp>
#include <rein/throttle_snapshot.hpp>

#include REIN_ASIO_HEADER(associated_cancellation_slot.hpp)
#include REIN_ASIO_HEADER(associated_executor.hpp)
#include REIN_ASIO_HEADER(async_result.hpp)
#include REIN_ASIO_HEADER(awaitable.hpp)
#include REIN_ASIO_HEADER(co_spawn.hpp)
#include REIN_ASIO_HEADER(error.hpp)

#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace rein {

/// Passes each outbound call through a list of stages (quota gates, concurrency limits, rate limits, each
/// global or per key) and hands out a guard that holds what the call took:
///
/// ```
/// rein::keyed<rein::quota_gate> gates(io, {});                    // a 429 pauses that host for all
/// rein::keyed<rein::semaphore> per_host(io, 4);                   // at most 4 in flight per host
/// rein::tuned_aimd_limiter global(io);                            // in flight overall, found by feedback
/// rein::keyed<rein::token_bucket> rate(io, {.rate = 40, .capacity = 5});
/// rein::throttle throttle(gates, per_host, global, rate);         // in admission order; 40/s per host
///
/// auto guard = co_await throttle.acquire(host);                   // waits until every stage has room
/// auto response = co_await http_get(host, "/v1/items");           // your call
/// if (response.status == 429) {
///   guard.reject(response.retry_after);                           // pause the host, count congestion
/// } else {
///   guard.complete_http(response.status);                         // success feeds the adaptive limit
/// }
/// ```
/// (From examples/quick_tour.cpp, a complete program, less its counters.)
///
/// A stage is a limiter or a rein::keyed of limiters (one per key; the caller's key picks it), of one of
/// three kinds, recognised by what it can do: a quota gate (rein::quota_gate), a concurrency limiter (its
/// try_acquire gives a permit: semaphore, adaptive limiters) or a rate limiter (try_acquire and refund:
/// token_bucket, sliding_window, rate_limits, adaptive_rate_limiter, the Redis shared bucket). A fourth
/// kind, global only, goes first: an admission stage (rein::admission_throttle, whose try_acquire() decides
/// at once and whose record(outcome) hears each admitted call's outcome; it counts requests, so a weight on
/// it does not compile). A call's
/// charge (rein::charge) says how much each stage takes: `requests` by default, `tokens` for a stage
/// wrapped in rein::by_tokens, any function of the charge with rein::weighted. The throttle refers to the
/// stages (it does not own them): they must outlive it, and each stays usable on its own.
///
/// The stages are listed in admission order: admission stages, gates, per-key concurrency, global
/// concurrency, rates (a list in another order does not compile). What a caller does, and why:
/// 0. Every admission stage decides the call, before anything is pinned or taken: a refusal fails it at
///    once, on every door, holding nothing (the call would only have been refused by an overloaded backend).
///    The guard's outcome is its feedback; an acquire that ends without admission tells it nothing.
/// 1. It waits at every gate until none is paused: while a 429 pause runs, nothing of that key proceeds or
///    takes anything.
/// 2. It takes its key's concurrency permits, waiting if it must. A caller waiting here holds nothing any
///    other key needs.
/// 3. It waits until its key's rates could take its charge. A key's rate with room now and nobody waiting
///    is only looked at; otherwise the caller gives its global slots back and waits in that rate's own line
///    (its order, FIFO by default). The grant takes the units, which the caller keeps only while it goes on
///    to admission without waiting (in the instant of the grant): before any other wait (another key's
///    rate, a global permit) it refunds them. So a caller waiting for its own key holds no global slot, and
///    no caller holds a key's rate units while it waits.
/// 4. It takes the global concurrency permits, waiting if it must.
/// 5. It takes every rate's units at once, all or nothing, and is admitted in the same instant. So the rate
///    that any upstream sees, counted at the moment each call is sent, never exceeds any rate stage's bound:
///    at most `burst + rate x window` admissions in every window. (Units a line granted, at step 3 or here,
///    were taken at the grant: the bound holds at the grants, and a call is sent when its handler runs, so
///    an executor that runs it late sends it that much later. A fixed window's units that such a late
///    caller gives back to wait elsewhere go back into the window it resumed in, which may be a later one
///    than they were taken in: one unit per such caller.) If a global rate has no room, the caller
///    waits for it on that limiter's line, keeping its global slot (everyone needs that rate: holding the
///    slot delays nobody behind another key's backlog); if its key's rate has no room any more, it returns
///    to step 3, where it gives the global slots back if it must wait.
/// 6. A gate paused meanwhile (a 429 answered to a call of the same key) sends it back to step 1: the rate
///    units go back (refunded in the instant they were taken) and so do the global slots.
/// A caller whose first try is refused goes on from what that try took (the gates it passed, the permits
/// it holds): it gives back only what blocks others (its global slots, if it must wait for its key's rate).
/// Permits are taken in one order by every caller (key, then global) and rate units are never held while
/// waiting for anything but a global rate, so no order of calls can deadlock (two keyed rates, or two
/// throttles listing the same keyed rates in opposite orders, included). A stage that fails, times out
/// or is cancelled gives back everything earlier stages took, so a refused request consumes nothing.
/// tests/async/throttle_model.cpp checks these properties on every interleaving of a small scope, and on
/// random schedules at scale.
///
/// What the promises assume: they hold within one throttle. Two throttles sharing concurrency stages must
/// list them in the same relative order (else two callers can each hold what the other waits for), and a
/// global rate shared with another throttle is waited for with this throttle's global slots held, so there
/// a backlog at that rate delays this throttle's other upstreams. A key's rate is waited for in its own
/// line, on the limiter's one timer: a refund, set_rate, charge or close meanwhile counts at once. A sliding
/// window's refund forgets its oldest start, not the one just taken, so the
/// give-backs of steps 5 and 6 leave it a start that slides out with the window (never an overrun).
///
/// Order: callers of one key waiting for its rate are admitted in the order of that rate's line (its
/// options' order: arrival order by default; lifo, or priority and fair order, whose class and key the
/// throttle leaves at the default, as the line says), each at the instant the rate allows: 40 callers of a
/// key limited to 100/s with a burst of 1 are admitted in arrival order, exactly 10 ms apart (on the manual
/// clock; in real time each also waits for its handler to run). That holds while
/// nothing after the key's rate makes them wait: a caller granted its key's rate that must then wait for a
/// global permit, a global rate or another keyed rate (a key's tokens after its requests) refunds the units
/// and rejoins the key's line later, behind those who came after it. The throttle as a whole is not first
/// come, first served: each stage's own line is, but a caller that gives its global slots back at step 5 or
/// 6 rejoins a line behind those who came later, and callers of different keys pass the per-key stages
/// independently. Likewise a stage's own snapshot counts every pass through it: its acquired_total includes
/// the permits a caller took, gave back at step 5 or 6 and took again, and a key's rate units granted at step
/// 3 and refunded before a wait elsewhere, so it can exceed the throttle's acquired_total (one per guard
/// handed out). The throttle's
/// snapshot().stages says which of a stage's grants were admissions, re-takes or abandoned, with the rule
/// that adds them up to the stage's own count (rein::throttle_snapshot).
///
/// To learn the wait before committing to it, `reserve(key, c)` says when every rate stage could take the
/// charge and reserves the units of the stages that need that time; its wait then admits the call as an
/// acquire (rein::throttle_reservation, Go's `ReserveN` for the whole throttle); cancelling it gives the
/// units back.
///
/// @par Errors
/// A waiting acquire fails with errc::timed_out (one deadline covers every stage), errc::closed,
/// errc::queue_full (a stage's waiting line is full, or too many keys), errc::exceeds_capacity (a charge no
/// stage can ever give), errc::upstream_unavailable (an adaptive stage's open circuit),
/// errc::admission_refused (an admission stage's refusal, at once) or operation_aborted; the coroutine doors
/// throw rein::throttle_error, which names
/// the stage and the key, and the completion-token doors give an empty guard whose rejected_stage(),
/// rejected_at() and error() say the same. The snapshot counts failures by reason.
///
/// @tparam Stages the stage list: limiters, rein::keyed<limiter> registries, rein::weighted_stage (from
///                rein::by_tokens or rein::weighted), or rein::unlimited_t for a place left empty.
///
/// @par Thread Safety
/// Safe from many threads when the stages are (rein's default, std::mutex, variants are).
///
/// @par Lifetime
/// The stages must outlive the throttle (it refers to them). Guards, and callers still waiting in a
/// coroutine frame or an operation, may outlive both: when the io_context destroys them after the throttle
/// and its stages, they release what they hold and touch neither (see throttle_guard). Like every Asio I/O
/// object, the stages must be destroyed before their io_context.
template <class... Stages>
class throttle {
  // The stages and all the throttle does to them (the admission machine's steps, the waits, the feedback,
  // the counters); this class holds the doors.
  using stage_ops = detail::throttle_stage_ops<Stages...>;

 public:
  /// How many entries the stage list has (rein::unlimited places included).
  static constexpr std::size_t stage_count = sizeof...(Stages);
  /// The stage at position I: a limiter, or a rein::keyed of limiters.
  template <std::size_t I>
  using stage_type = typename stage_ops::template stage_type<I>;
  /// The limiter type the stage at position I runs on (a keyed stage's limiter_type).
  template <std::size_t I>
  using limiter_type = typename stage_ops::template limiter_type<I>;

  /// The stages' clock (the first stage that has one; they must agree), which times the deadlines.
  using clock_type = typename stage_ops::clock_type;
  /// A point in time of `clock_type`.
  using time_point = typename clock_type::time_point;
  /// A duration of `clock_type`.
  using duration = typename clock_type::duration;
  /// The key of the per-key stages (a host, a tenant, a model).
  using key_type = std::string;
  /// What acquire() gives: the stages taken, given back when it is destroyed.
  using guard = throttle_guard<throttle>;
  /// What a guard holds for each stage. Not API.
  using holdings = typename stage_ops::holdings;
  /// What reserve() returns (rein::throttle_reservation).
  using reservation = throttle_reservation<throttle>;

  /// Composes the stages, listed in admission order (references; they must outlive the throttle).
  /// @throws std::invalid_argument if options.default_pause <= 0, or if options.key_weight is set and no
  ///         global stage serves its line in queue_order::fair.
  explicit throttle(typename detail::stage_spec<Stages>::argument... stages, throttle_options options = {})
      : ops_(std::forward<typename detail::stage_spec<Stages>::argument>(stages)..., std::move(options)) {}

  throttle(const throttle&) = delete;
  throttle& operator=(const throttle&) = delete;

  /// Guards still out (in coroutine frames not yet destroyed, say) become inert: destroying one releases its
  /// permits and pins and touches nothing else.
  ~throttle() { life_->owner.store(nullptr, std::memory_order_release); }

  /// Passes every stage for `key`, charged `c`, inside a coroutine: `auto guard = co_await
  /// throttle.acquire(host);`.
  ///
  /// Stages that can admit at once do so without suspending; a stage that must wait waits through its own
  /// limiter (FIFO there). Cancelling the awaiting coroutine cancels the stage it is in and gives back what
  /// earlier stages took: a terminal cancellation by default, partial and total too once the caller widens
  /// its filter (`co_await net::this_coro::reset_cancellation_state(net::enable_total_cancellation())`), as
  /// for any awaitable operation. Throws rein::throttle_error (see the class's Errors).
  ///
  /// Throws std::invalid_argument, before taking anything, if `c.tokens` is not 0 and no stage charges
  /// tokens (none is wrapped in rein::by_tokens or rein::weighted): the tokens would be charged nowhere and
  /// each call only its requests. Checked as the acquire starts, not at compile time: which stages charge
  /// tokens is known from the throttle's type, but a charge's tokens only from its value. The other doors
  /// (acquire_for, acquire_until, async_acquire, try_acquire) and guard.reconcile() check the same.
  net::awaitable<guard> acquire(std::string_view key, rein::charge c = {}) {
    return acquire_until(key, c, time_point::max());
  }

  /// As acquire(key), failing with errc::timed_out unless every stage admits within `timeout`.
  net::awaitable<guard> acquire_for(std::string_view key, duration timeout) {
    return acquire_until(key, rein::charge{}, detail::deadline_after<clock_type>(timeout));
  }
  /// As acquire(key, c), failing with errc::timed_out unless every stage admits within `timeout`.
  net::awaitable<guard> acquire_for(std::string_view key, rein::charge c, duration timeout) {
    return acquire_until(key, c, detail::deadline_after<clock_type>(timeout));
  }

  /// As acquire(key), failing with errc::timed_out unless every stage admits by `deadline`.
  net::awaitable<guard> acquire_until(std::string_view key, time_point deadline) {
    return acquire_until(key, rein::charge{}, deadline);
  }
  /// As acquire(key, c), failing with errc::timed_out unless every stage admits by `deadline`.
  ///
  /// The fast path (every stage admits at once) runs inside this one coroutine: no other coroutine, no
  /// allocation beyond Asio's recycled frame of this one, and no copy of `key` (keyed stages look it up as a
  /// view). Only a caller that must wait copies the key, once, so that the waits never depend on the
  /// caller's string.
  net::awaitable<guard> acquire_until(std::string_view key, rein::charge c, time_point deadline) {
    stage_ops::check_charge(c);
    guard g(life_, c);
    run_ctx x{deadline, nullptr, {}};
    admission m(true);
    // The key, once it must wait; a pointer, not a string: the guard and this frame stay within the size
    // Asio recycles frames up to (about 1 KB), so that the fast path allocates nothing.
    std::unique_ptr<std::string> copy;
    error_code failed;
    const time_point asked = clock_type::now();
    time_point now = asked;
    try {
      const step s = ops_.steps(m, m.resume(event::start), g, key, now);
      if (s == step::fail) {
        failed = m.error();
      } else if (s != step::done) {
        copy = std::make_unique<std::string>(key);
        key = *copy;
        x.key = *copy;
        const waiting_scope waiting(life_);
        co_await ops_.template pass<false>(m, s, g, x);
        now = clock_type::now();
      }
    } catch (const system_error& e) {
      failed = e.code();
      m.fail();
    }
    if (stage_ops::gone(g)) {  // destroyed while this caller waited: its stages' waits were aborted
      throw detail::throttle_failure(error_code(net::error::operation_aborted), {}, m.at(),
                                     stage_ops::kind_of(m.at()), copy ? *copy : std::string());
    }
    if (failed) {
      ops_.count_failed(failed);
      throw ops_.failure(failed, m.at(), std::string(key));  // g gives back what it took
    }
    ops_.admit(g, now, asked);
    co_return std::move(g);
  }

  /// The initiating function: every Asio completion token works; signature `void(error_code, guard)`. On
  /// failure the guard is empty and says where (rejected_stage(), rejected_at(), error()).
  ///
  /// @par Per-Operation Cancellation
  /// terminal, partial and total: the stage being waited on is cancelled and the operation completes with
  /// operation_aborted; what earlier stages took is given back. A cancellation emitted before the operation
  /// has started (it starts on the handler's executor) ends it before it takes anything. If a stage's grant
  /// raced with the cancellation and won, the operation still fails at the next stage that would wait, or
  /// completes admitted if no stage has to wait any more (the grant won).
  ///
  /// @throws std::invalid_argument from the initiation if `c.tokens` is not 0 and no stage charges tokens
  /// (see acquire).
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, guard)) Token = default_token_t>
  auto async_acquire(std::string key, Token&& token = Token{}) {
    return async_acquire_until(std::move(key), rein::charge{}, time_point::max(), std::forward<Token>(token));
  }
  /// As async_acquire(key), charged `c`.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, guard)) Token = default_token_t>
  auto async_acquire(std::string key, rein::charge c, Token&& token = Token{}) {
    return async_acquire_until(std::move(key), c, time_point::max(), std::forward<Token>(token));
  }

  /// As async_acquire, failing with errc::timed_out unless every stage admits within `timeout`.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, guard)) Token = default_token_t>
  auto async_acquire_for(std::string key, duration timeout, Token&& token = Token{}) {
    return async_acquire_until(std::move(key), rein::charge{}, detail::deadline_after<clock_type>(timeout),
                               std::forward<Token>(token));
  }
  /// As async_acquire_for(key, timeout), charged `c`.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, guard)) Token = default_token_t>
  auto async_acquire_for(std::string key, rein::charge c, duration timeout, Token&& token = Token{}) {
    return async_acquire_until(std::move(key), c, detail::deadline_after<clock_type>(timeout),
                               std::forward<Token>(token));
  }

  /// As async_acquire, with one deadline for all stages.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, guard)) Token = default_token_t>
  auto async_acquire_until(std::string key, time_point deadline, Token&& token = Token{}) {
    return async_acquire_until(std::move(key), rein::charge{}, deadline, std::forward<Token>(token));
  }
  /// As async_acquire_until(key, deadline), charged `c`.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, guard)) Token = default_token_t>
  auto async_acquire_until(std::string key, rein::charge c, time_point deadline, Token&& token = Token{}) {
    return net::async_initiate<Token, void(error_code, guard)>(initiate_acquire{this}, token, std::move(key), c,
                                                               deadline);
  }

  /// Passes every stage now or not at all: an admitted guard, or an empty one whose rejected_at() and
  /// rejected_stage() name the stage that refused. A refused request consumes nothing at any stage but an
  /// admission stage, which counts every request it is asked (the SRE rule, rein::admission_throttle). Never
  /// waits; a gate that is paused refuses.
  /// @throws std::invalid_argument if `c.tokens` is not 0 and no stage charges tokens (see acquire).
  guard try_acquire(std::string_view key, rein::charge c = {}) {
    stage_ops::check_charge(c);
    guard g(life_, c);
    const time_point now = clock_type::now();
    admission m(false);
    if (ops_.steps(m, m.resume(event::start), g, key, now) == step::done) {
      ops_.admit(g, now, now);
      return g;
    }
    const std::size_t refused = m.at();
    ops_.count_refusal(stage_ops::kind_of(refused));
    // g itself becomes the empty guard (one object in every path, so that it is returned in place).
    ops_.abandon(g.held_);
    ops_.unpin(g.held_);
    g.life_.reset();
    g.charge_ = {};
    g.rejected_at_ = stage_ops::kind_of(refused);
    g.rejected_stage_ = refused;
    return g;
  }

  /// Says when every rate stage could take the charge `c` for `key` (the latest time any needs) and
  /// reserves it at the stages that need that time (rein::throttle_reservation, the throttle's Go
  /// `ReserveN`): then `co_await r.wait()` for the guard (the call admitted as an acquire from
  /// time_to_act() on), or `r.cancel()` to give the units back. Never waits.
  ///
  /// Not ok, holding nothing, when an admission stage refuses, a gate is paused, the key cannot be made, or
  /// a rate stage cannot reserve (someone waits on its line, it is closed, the charge exceeds its
  /// capacity); see rein::throttle_reservation. Compiles only when every rate stage reserves (a
  /// rein::basic_rate_limiter of a token bucket, a window, or rein::rate_limits of those).
  /// @throws std::invalid_argument if `c.tokens` is not 0 and no stage charges tokens (see acquire).
  /// @throws std::bad_alloc (the reservation's state, a key's entry, a limiter's book of reservations).
  reservation reserve(std::string_view key, rein::charge c = {}) {
    stage_ops::check_charge(c);
    auto s = std::make_shared<typename reservation::state>(this, executor(), ops_.options().name, key, c);
    s->g = guard(life_, c);
    const typename stage_ops::reserve_outcome r = ops_.reserve(s->g, key, s->rates);
    if (r.status == try_status::acquired) {
      s->at = r.at;
    } else {
      s->g = guard();  // gives back the pins (and counts the admission stages' decision abandoned)
      s->error = r.error;
      s->rejected_stage = r.stage;
      s->rejected_at = stage_ops::kind_of(r.stage);
    }
    s->status = r.status;
    return reservation(std::move(s));
  }

  /// The pause reject() applies when the upstream gave no usable Retry-After.
  duration default_pause() const noexcept { return ops_.default_pause(); }

  /// The name given in the options (empty if none).
  const std::string& name() const noexcept { return ops_.options().name; }

  /// The stage at position I (a limiter or a keyed registry), as given to the constructor.
  template <std::size_t I>
  stage_type<I>& stage() const noexcept {
    return ops_.template stage<I>();
  }

  /// Counters, read without blocking any admission made at once (the wait histogram is copied under a
  /// lock that only admissions after waiting take). @throws std::bad_alloc (the list of stages' counts).
  throttle_snapshot snapshot() const { return ops_.snapshot(); }

 private:
  friend guard;
  friend reservation;
  // The executor completions default to (the first stage's).
  using executor_type = decltype(std::declval<const stage_ops&>().executor());
  using admission = typename stage_ops::admission;
  using step = detail::admission_step;
  using event = detail::admission_event;
  using run_ctx = typename stage_ops::run_ctx;
  using waiting_scope = typename stage_ops::waiting_scope;

  // Both doors' body; errors come back as an error code (and the empty guard says where).
  // Bound: async_acquire's coroutine, whose stage waits are bound to `cancellation` (the caller's slot, through
  // a throttle_canceller; null if the caller's slot is not connected). Otherwise the waits see the awaiting
  // coroutine's own cancellation state, as any co_await does.
  //
  // `asked`: when the operation was initiated (at its call; at its launch, for a deferred token). A wait is
  // timed from there, the coroutine's start on its executor included; an admission at once is a zero wait,
  // as a limiter's grant at once is.
  // `g`: a new guard (its charge), or a reservation's (its reserved units a claim: see hand_reserved).
  template <bool Bound>
  net::awaitable<std::pair<error_code, guard>> run(std::string key, guard g, time_point deadline,
                                                   std::shared_ptr<detail::throttle_cancellation> cancellation,
                                                   time_point asked) {
    run_ctx x{deadline, cancellation.get(), key};
    admission m(true);
    error_code failed;
    time_point now = clock_type::now();
    time_point waited_from = now;
    try {
      stage_ops::template check_cancelled<Bound>(x);
      const step s = ops_.steps(m, m.resume(event::start), g, key, now);
      if (s == step::fail) {
        failed = m.error();
      } else if (s != step::done) {
        waited_from = asked;
        const waiting_scope waiting(life_);
        co_await ops_.template pass<Bound>(m, s, g, x);
        now = clock_type::now();
      }
    } catch (const system_error& e) {
      failed = e.code();
      m.fail();
    } catch (const std::bad_alloc&) {  // a new key's entry, a wait's frame: the handler still gets its one call
      failed = make_error_code(std::errc::not_enough_memory);
      m.fail();
    }
    if (stage_ops::gone(g))  // destroyed while this caller waited: its stages' waits were aborted
      failed = error_code(net::error::operation_aborted);
    else if (failed)
      ops_.count_failed(failed);
    if (failed) {
      guard empty;
      empty.rejected_at_ = stage_ops::kind_of(m.at());
      empty.rejected_stage_ = m.at();
      empty.error_ = failed;
      co_return std::pair<error_code, guard>(failed, std::move(empty));  // g gives back what it took
    }
    ops_.admit(g, now, waited_from);
    co_return std::pair<error_code, guard>(error_code(), std::move(g));
  }


  // A named initiation (as Asio's own I/O objects use), whose executor is the default for completions.
  struct initiate_acquire {
    throttle* self;

    using executor_type = decltype(std::declval<const throttle&>().executor());
    executor_type get_executor() const noexcept { return self->executor(); }

    // The stages run in a coroutine spawned on the handler's associated executor (the first stage's executor
    // by default), so that a strand's handler and its cancellation are serialised with them. An associated
    // executor a coroutine cannot run on (use_future's, with standalone Asio) leaves them on the first stage's
    // executor. The handler runs through its own executor, never inside this call (co_spawn posts if the
    // stages admit at once).
    template <class Handler>
    void operator()(Handler&& handler, std::string key, rein::charge c, time_point deadline) const {
      stage_ops::check_charge(c);  // thrown by the initiation, before anything started
      spawn(std::forward<Handler>(handler), self->executor(), true, [&](auto cancellation) {
        return self->template run<true>(std::move(key), guard(self->life_, c), deadline, std::move(cancellation),
                                        clock_type::now());
      });
    }
  };

  // Runs the coroutine `start(cancellation)` makes for `handler`, on the handler's associated executor (else
  // `fallback`: see initiate_acquire). `connect`: the handler's cancellation slot, if connected, is connected
  // to the coroutine's waits (through `cancellation`, null otherwise).
  template <class Handler, class Executor, class Start>
  static void spawn(Handler&& handler, const Executor& fallback, bool connect, Start&& start) {
    auto ex = net::get_associated_executor(handler, fallback);
    std::shared_ptr<detail::throttle_cancellation> cancellation;
    auto slot = net::get_associated_cancellation_slot(handler);
    if (connect && slot.is_connected()) {
      cancellation = std::make_shared<detail::throttle_cancellation>();
      slot.template emplace<detail::throttle_canceller>(cancellation);
    }
    try {
      auto stages = std::forward<Start>(start)(cancellation);
      detail::spawn_adapter<std::decay_t<Handler>> adapter{std::forward<Handler>(handler), cancellation};
      if constexpr (std::is_convertible_v<decltype(ex), net::any_io_executor>)
        net::co_spawn(std::move(ex), std::move(stages), std::move(adapter));
      else
        net::co_spawn(fallback, std::move(stages), std::move(adapter));
    } catch (...) {
      if (cancellation) slot.clear();  // nothing started: the caller's slot is as it was
      throw;
    }
  }

  // A reservation's wait (throttle_reservation::async_wait): until the time to act, then the waiting path
  // with the reserved units as a claim (see stage_ops::hand_reserved); a failure gives them back.
  // `called`: when the wait was initiated.
  static net::awaitable<std::pair<error_code, guard>> run_reserved(
      std::shared_ptr<typename reservation::state> s, std::shared_ptr<detail::throttle_cancellation> cancellation,
      time_point called) {
    run_ctx x{time_point::max(), cancellation.get(), s->key};
    error_code failed;
    try {
      stage_ops::template check_cancelled<true>(x);
      if (!s->cancelled) {
        s->timer = std::make_unique<typename decltype(s->timer)::element_type>(s->executor, s->at);
        co_await stage_ops::wait_reserved(*s->timer, x);
      }
      if (s->cancelled || stage_ops::gone(s->g)) failed = net::error::operation_aborted;
    } catch (const system_error& e) {
      failed = e.code();
    }
    if (failed) {
      stage_ops::let_go_reserved(s->rates);  // as a claim: a refund once time_to_act() has passed
      if (!stage_ops::gone(s->g)) s->owner->ops_.count_failed(failed);
      s->g = guard();
      guard empty;
      empty.error_ = failed;
      co_return std::pair<error_code, guard>(failed, std::move(empty));
    }
    throttle& self = *s->owner;
    self.ops_.hand_reserved(s->g, s->rates);
    s->handed = true;
    std::pair<error_code, guard> result = co_await self.template run<true>(
        s->key, std::move(s->g), time_point::max(), std::move(cancellation), std::max(called, s->at));
    // A failed admission let its claim go already unless it failed before any step (its coroutine
    // cancelled, the throttle gone): what is left goes back as a claim does.
    if (result.first) stage_ops::let_go_reserved(s->rates);
    else s->rates = {};  // the guard's now: spent, as an acquire's
    co_return result;
  }

  // The initiation of a reservation's wait: as initiate_acquire's, on the executor the throttle had then.
  struct initiate_reserved {
    std::shared_ptr<typename reservation::state> s;

    using executor_type = typename throttle::executor_type;
    executor_type get_executor() const noexcept { return s->executor; }

    template <class Handler>
    void operator()(Handler&& handler) const {
      error_code now_error;
      if (s->status != try_status::acquired) now_error = s->error;
      else if (s->waited) now_error = net::error::already_started;
      else if (s->cancelled || stage_ops::gone(s->g)) now_error = net::error::operation_aborted;
      if (!now_error) s->waited = true;
      spawn(std::forward<Handler>(handler), s->executor, !now_error, [&](auto cancellation) {
        return now_error ? failed_at_once(now_error, s) : run_reserved(s, std::move(cancellation), clock_type::now());
      });
    }
  };

  // A reservation's wait that fails before it starts (not ok, cancelled, waited already): its error, said
  // as a refused guard says it.
  static net::awaitable<std::pair<error_code, guard>> failed_at_once(error_code ec,
                                                                     std::shared_ptr<typename reservation::state> s) {
    guard empty;
    empty.error_ = ec;
    empty.rejected_at_ = s->rejected_at;
    empty.rejected_stage_ = s->rejected_stage;
    co_return std::pair<error_code, guard>(ec, std::move(empty));
  }

  auto executor() const noexcept { return ops_.executor(); }

  stage_ops ops_;
  std::shared_ptr<detail::throttle_life<stage_ops>> life_ = std::make_shared<detail::throttle_life<stage_ops>>(&ops_);
};

/// `rein::throttle t(gates, per_host, global, rate);` deduces the stage types (a class template, not a
/// basic_X alias: the stage types are the parameters, and clang 14 cannot deduce through alias templates).
template <class... S>
throttle(S&&...) -> throttle<std::remove_cvref_t<S>...>;
/// The same with options last: `rein::throttle t(gates, per_host, global, rate, {.name = "outbound"});`.
template <class S1>
throttle(S1&&, throttle_options) -> throttle<std::remove_cvref_t<S1>>;
/// @copydoc throttle(S1&&, throttle_options)
template <class S1, class S2>
throttle(S1&&, S2&&, throttle_options) -> throttle<std::remove_cvref_t<S1>, std::remove_cvref_t<S2>>;
/// @copydoc throttle(S1&&, throttle_options)
template <class S1, class S2, class S3>
throttle(S1&&, S2&&, S3&&, throttle_options)
    -> throttle<std::remove_cvref_t<S1>, std::remove_cvref_t<S2>, std::remove_cvref_t<S3>>;
/// @copydoc throttle(S1&&, throttle_options)
template <class S1, class S2, class S3, class S4>
throttle(S1&&, S2&&, S3&&, S4&&, throttle_options)
    -> throttle<std::remove_cvref_t<S1>, std::remove_cvref_t<S2>, std::remove_cvref_t<S3>, std::remove_cvref_t<S4>>;
/// @copydoc throttle(S1&&, throttle_options)
template <class S1, class S2, class S3, class S4, class S5>
throttle(S1&&, S2&&, S3&&, S4&&, S5&&, throttle_options)
    -> throttle<std::remove_cvref_t<S1>, std::remove_cvref_t<S2>, std::remove_cvref_t<S3>, std::remove_cvref_t<S4>,
                std::remove_cvref_t<S5>>;
/// @copydoc throttle(S1&&, throttle_options)
template <class S1, class S2, class S3, class S4, class S5, class S6>
throttle(S1&&, S2&&, S3&&, S4&&, S5&&, S6&&, throttle_options)
    -> throttle<std::remove_cvref_t<S1>, std::remove_cvref_t<S2>, std::remove_cvref_t<S3>, std::remove_cvref_t<S4>,
                std::remove_cvref_t<S5>, std::remove_cvref_t<S6>>;

/// The throttle of a stage list, named where its stages cannot be deduced: a class member, a return type.
/// The same type `rein::throttle t(stages...)` deduces: each entry is the type of a constructor argument
/// (a limiter, a rein::keyed registry, `decltype(rein::by_tokens(x))`, rein::unlimited_t), references and
/// const dropped, so `decltype` of the members names it without spelling any stage's type:
///
/// ```
/// struct upstream {
///   explicit upstream(net::io_context& io) : global(io, 4), rpm(io, {.rate = 10, .capacity = 10}),
///                                            tpm(io, {.rate = 1'000, .capacity = 10'000}) {}
///
///   rein::semaphore global;
///   rein::token_bucket rpm;
///   rein::token_bucket tpm;
///   rein::throttle_for<decltype(global), decltype(rpm), decltype(rein::by_tokens(tpm))> throttle{
///       global, rpm, rein::by_tokens(tpm)};
/// };
/// ```
/// (From tests/async/throttle_misuse.cpp, which compiles and runs it.) The members are listed in admission
/// order and declared before the throttle (they are built first). A stage given by rein::weighted with a
/// lambda cannot be named so (each lambda is its own type): give it a named function object instead.
template <class... Stages>
using throttle_for = throttle<std::remove_cvref_t<Stages>...>;

}  // namespace rein

#if !defined(REIN_SEPARATE_COMPILATION)
#include <rein/impl/throttle.ipp>
#endif
