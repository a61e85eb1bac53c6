// What a throttle (rein/throttle.hpp) does to its stages: the steps of its admission machine
// (detail/throttle_admission.hpp) done on the stage tuple, the waits of its waiting path, a guard's feedback
// to the stages, and the counters of its snapshot. The throttle's doors drive it; its guards report through
// it. Not API.
#pragma once

#include <rein/config.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/detail/clock_time.hpp>
#include <rein/detail/line_place.hpp>
#include <rein/detail/spawned_operation.hpp>
#include <rein/detail/throttle_admission.hpp>
#include <rein/detail/throttle_stages.hpp>
#include <rein/error.hpp>
#include <rein/keyed.hpp>
#include <rein/observer.hpp>
#include <rein/outcome.hpp>
#include <rein/permit.hpp>
#include <rein/queue_order.hpp>
#include <rein/rate_limit_headers.hpp>
#include <rein/reservation.hpp>
#include <rein/throttle_charge.hpp>
#include <rein/throttle_guard.hpp>
#include <rein/throttle_options.hpp>
#include <rein/throttle_snapshot.hpp>
#include <rein/try_result.hpp>
#include <rein/wait_stats.hpp>

#include REIN_ASIO_HEADER(awaitable.hpp)
#include REIN_ASIO_HEADER(bind_cancellation_slot.hpp)
#include REIN_ASIO_HEADER(cancellation_signal.hpp)
#include REIN_ASIO_HEADER(cancellation_state.hpp)
#include REIN_ASIO_HEADER(error.hpp)
#include REIN_ASIO_HEADER(this_coro.hpp)
#include REIN_ASIO_HEADER(use_awaitable.hpp)

#include <algorithm>
#include <array>
#include <atomic>
#include <bitset>
#include <cassert>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

namespace rein {

template <class... Stages>
class throttle;

namespace detail {

// The stages of rein::throttle<Stages...>, and all it does to them. Its guards hold a pointer to it (through
// throttle_life), which the throttle clears when it is destroyed.
template <class... Stages>
class throttle_stage_ops {
  using specs = std::tuple<stage_spec<Stages>...>;
  using rank = stage_rank;

 public:
  // The types the throttle and its guards name.
  static constexpr std::size_t stage_count = sizeof...(Stages);
  template <std::size_t I>
  using stage_type = typename std::tuple_element_t<I, specs>::stage;
  template <std::size_t I>
  using limiter_type = typename stage_limiter<stage_type<I>>::type;
  using clock_type = typename first_clock<typename stage_clock<typename stage_spec<Stages>::stage>::type...>::type;
  using time_point = typename clock_type::time_point;
  using duration = typename clock_type::duration;
  using guard = throttle_guard<throttle<Stages...>>;

 private:
  static constexpr std::array<rank, stage_count> ranks_{rank_of<Stages>()...};
  static constexpr std::array<bool, stage_count> keyed_{is_keyed<typename stage_spec<Stages>::stage>::value...};

  static_assert(in_admission_order(ranks_),
                "rein::throttle: list the stages in admission order: admission throttles, then quota gates, "
                "then per-key concurrency limiters, then global concurrency limiters, then rate limiters (rates "
                "are taken last, at the moment of sending)");
  static constexpr std::array<bool, stage_count> placeholder_{
      is_placeholder_v<typename stage_spec<Stages>::stage>...};
  static_assert(std::find(placeholder_.begin(), placeholder_.end(), false) != placeholder_.end(),
                "rein::throttle: the stage list is empty; to name a throttle's type where its stages cannot be "
                "deduced (a class member), write rein::throttle_for<decltype(stage)...> with the stages in "
                "admission order");

  // Whether a stage may charge charge::tokens: a rein::by_tokens one, or a rein::weighted one (its weight is
  // any function of the charge). Without one, a charge's tokens would be charged nowhere.
  static constexpr bool reads_tokens_ =
      (!std::is_same_v<typename stage_spec<Stages>::weight, by_requests_t> || ...);

  static_assert(stage_count <= 64, "rein::throttle: at most 64 stages");
  // The places that hold a stage: an admission that took them all took every stage.
  static constexpr std::bitset<stage_count> every_stage_{[] {
    unsigned long long bits = 0;
    for (std::size_t i = 0; i < stage_count; ++i)
      if (!placeholder_[i]) bits |= 1ULL << i;
    return bits;
  }()};

  template <rank R>
  static constexpr auto at_rank = positions<R, count_rank<R>(ranks_)>(ranks_);
  // The first stage with an executor (an admission stage has none).
  static constexpr std::size_t first_stage_ = [] {
    std::size_t i = 0;
    while (i + 1 < stage_count && (placeholder_[i] || ranks_[i] == rank::admission)) ++i;
    return i;
  }();

 public:
  // A throttle reservation's own reservation at each rate stage (rein::throttle_reservation).
  template <std::size_t I>
  static constexpr bool reserves_at = ranks_[I] == rank::rate && throttle_reservable<limiter_type<I>>;
  template <class Seq>
  struct reservations_of;
  template <std::size_t... I>
  struct reservations_of<std::index_sequence<I...>> {
    using type = std::tuple<typename reservation_slot<limiter_type<I>, reserves_at<I>>::type...>;
  };
  using rate_reservations = typename reservations_of<std::make_index_sequence<stage_count>>::type;

  // What a guard holds for each stage.
  struct holdings {
    /// Each keyed stage's limiter for the caller's key, pinned.
    std::tuple<typename handle_of<typename stage_spec<Stages>::stage>::type...> handles{};
    /// Each concurrency stage's permit.
    std::array<permit, stage_count> permits{};
    /// The units taken from each rate stage.
    std::array<std::size_t, stage_count> units{};
    /// Each stage this acquire has taken at least once (a second take is a re-take); cleared at admission.
    std::bitset<stage_count> taken{};
    /// Each hinted rate stage's admission_counts::admitted (for a keyed stage, its key's) just after this
    /// admission added its own: complete(response) counts off the units admitted since, still in flight.
    std::array<std::uint64_t, stage_count> admitted_mark{};
    /// The units this admission added there (what its end adds to admission_counts::ended).
    std::array<std::uint64_t, stage_count> admitted_units{};
    /// A throttle reservation's wait (throttle::reserve): its admission stages decided at the reserve and
    /// not asked again, and the rate stages whose reservation there is still engaged hold its units as a
    /// claim, kept only while the admission goes on without waiting (see hand_reserved). One pointer: the
    /// guard lives in the frame of every acquire, which Asio recycles only up to about 1 KB.
    rate_reservations* reserved = nullptr;
  };

  // The stage list's order, for the admission machine.
  struct layout {
    static constexpr std::array<rank, stage_count> ranks = ranks_;
    static constexpr std::array<bool, stage_count> keyed = keyed_;
  };
  using admission = throttle_admission<layout>;
  using step = admission_step;
  using event = admission_event;
  using readiness_type = readiness<time_point>;

  // A waiting acquire's deadline and cancellation (the machine says where it is).
  struct run_ctx {
    time_point deadline;
    throttle_cancellation* cancellation;
    std::string_view key;  // the caller's key, in the frame of the coroutine that waits (a copy)
    // acquire's waiting path: the awaiting coroutine's cancellation state, if it throws when cancelled (the
    // default); none otherwise.
    net::cancellation_state awaiting{};
  };

  // Validates the options (see throttle's constructor for what it throws).
  explicit throttle_stage_ops(typename stage_spec<Stages>::argument... stages, throttle_options options)
      : refs_(make_stage_ref<Stages>(stages)...), options_(validated(std::move(options))) {
    // A weight nobody would ask for is a mistake to say now, not a silent fifo.
    if (options_.key_weight && !has_fair_stage())
      throw std::invalid_argument("rein::throttle: key_weight needs a global stage whose order is queue_order::fair, "
                                  "got none");
  }

  throttle_stage_ops(const throttle_stage_ops&) = delete;
  throttle_stage_ops& operator=(const throttle_stage_ops&) = delete;

  template <std::size_t I>
  stage_type<I>& stage() const noexcept {
    return std::get<I>(refs_).stage();
  }
  const throttle_options& options() const noexcept { return options_; }
  duration default_pause() const noexcept { return std::chrono::duration_cast<duration>(options_.default_pause); }

  // The executor completions default to: the first stage's (past the admission stages, which have none).
  auto executor() const noexcept {
    static_assert(ranks_[first_stage_] != rank::admission,
                  "rein::throttle: a throttle of admission stages alone has no executor for its waiting doors: "
                  "use its try_acquire, or list a stage that has one (a gate, a concurrency or a rate limiter)");
    return std::get<first_stage_>(refs_).stage().get_executor();
  }

  // The counters (throttle::snapshot).
  throttle_snapshot snapshot() const {
    throttle_snapshot s;
    std::uint64_t full = 0;  // admissions that took every stage
    const std::uint64_t finished = finished_.load(std::memory_order_relaxed);
    {
      // Under the lock every timed admission is in waited_ and in admitted_ or partial_: the rest waited
      // no time.
      const std::lock_guard<std::mutex> lock(wait_mutex_);
      full = admitted_.load(std::memory_order_relaxed);
      s.admitted_total = full + partial_.load(std::memory_order_relaxed);
      s.wait = waited_;
    }
    s.wait.record(std::chrono::nanoseconds::zero(), s.admitted_total - s.wait.count());
    s.waiting = waiting_.load(std::memory_order_relaxed);
    s.acquired_total = s.admitted_total;
    s.in_flight = static_cast<std::size_t>(s.admitted_total > finished ? s.admitted_total - finished : 0);
    s.timed_out_total = failures_[0].load(std::memory_order_relaxed);
    s.queue_full_total = failures_[1].load(std::memory_order_relaxed);
    s.closed_total = failures_[2].load(std::memory_order_relaxed);
    s.exceeds_capacity_total = failures_[3].load(std::memory_order_relaxed);
    s.cancelled_total = failures_[4].load(std::memory_order_relaxed);
    s.unavailable_total = failures_[5].load(std::memory_order_relaxed);
    s.overloaded_total = failures_[6].load(std::memory_order_relaxed);
    s.rejected_gate = refused_[0].load(std::memory_order_relaxed);
    s.rejected_rate = refused_[1].load(std::memory_order_relaxed);
    s.rejected_per_key = refused_[2].load(std::memory_order_relaxed);
    s.rejected_global = refused_[3].load(std::memory_order_relaxed);
    s.rejected_admission = refused_[4].load(std::memory_order_relaxed);
    s.failed_total = failed_.load(std::memory_order_relaxed);
    s.rejections_reported = rejections_.load(std::memory_order_relaxed);
    s.for_each_rejected([&s](reject_reason, std::uint64_t n) { s.rejected_total += n; });
    s.stages.reserve(stage_count);
    for (std::size_t i = 0; i < stage_count; ++i) {
      s.stages.push_back(stage_counts(i, full));
      s.readmitted_total += s.stages.back().readmitted;
      s.given_back_total += s.stages.back().given_back;
    }
    return s;
  }

  // --- for the throttle's doors ---

  // A charge's tokens with no stage to charge them is a mistake to say now, not a silent charge of requests.
  static void check_charge(const rein::charge& c) {
    if constexpr (!reads_tokens_) {
      if (c.tokens != 0)
        throw std::invalid_argument("rein::throttle: a charge of " + std::to_string(c.tokens) +
                                    " tokens needs a stage that charges tokens: wrap the stage that counts them in "
                                    "rein::by_tokens (or rein::weighted), or leave charge::tokens 0");
    }
  }

  static constexpr throttle_stage kind_of(std::size_t i) noexcept {
    if (i >= stage_count) return throttle_stage::none;
    switch (ranks_[i]) {
      case rank::gate: return throttle_stage::gate;
      case rank::per_key_concurrency: return throttle_stage::per_key;
      case rank::global_concurrency: return throttle_stage::global;
      case rank::rate: return throttle_stage::rate;
      case rank::admission: return throttle_stage::admission;
      case rank::none: break;
    }
    return throttle_stage::none;
  }

  throttle_error failure(const error_code& ec, std::size_t stage, const std::string& key) const {
    return throttle_failure(ec, options_.name, stage, kind_of(stage), key);
  }

  // Whether the throttle was destroyed while `g`'s caller waited. Read on the waiting path before anything of
  // the throttle's is touched after a resumption (each take, each ask of a key's rate, the rates' take and
  // the gates' last check of the machine's steps): the stages, if they live on, may still grant.
  static bool gone(const guard& g) noexcept { return g.life_->owner.load(std::memory_order_acquire) == nullptr; }

  // A cancellation of async_acquire that came when no wait was pending (before the coroutine first ran, or
  // while a stage's grant was on its way) ends the operation now, or before its next wait.
  template <bool Bound>
  static void check_cancelled(const run_ctx& x) {
    if constexpr (Bound) {
      if (x.cancellation && x.cancellation->requested.load(std::memory_order_relaxed)) throw_aborted();
    }
  }

  // The steps of the machine that never wait, until it asks for a wait, admits or fails. The first try
  // decides at `now` (one reading for the whole try). On the waiting path (`x`; with none, only the first
  // try runs) each later step that reads a stage (a take, the rates' take, the ask of a key's rate, the
  // gates' check) first ends a caller whose throttle is gone, and reads the clock; a take also ends one
  // whose awaiting coroutine was cancelled (past that, the grant won).
  step steps(admission& m, step s, guard& g, std::string_view key, time_point now, run_ctx* x = nullptr) {
    for (;;) {
      if (x == nullptr) {
        if (!m.trying()) return s;
      } else if (s == step::take || s == step::take_rates || s == step::ask_ready || s == step::check_gates) {
        stop_if_gone(g);
        if (s == step::take && x->awaiting.cancelled() != net::cancellation_type::none) throw_aborted();
        now = clock_type::now();
      }
      event e = event::took;
      std::size_t where = npos;
      try_status why = try_status::busy;
      switch (s) {
        case step::ask_admission: where = try_admission(g, now); break;
        case step::pin: where = try_pin(g.held_, key); break;
        case step::try_first: where = try_first(g, now); break;
        case step::take: visit(m.stage(), [&](auto I) { e = try_stage<I()>(g, now); }); break;
        case step::take_rates: where = take_rates(g, m.held_rate(), now, &why); break;
        case step::ask_ready: e = ask_ready(m.stage(), g, why); break;
        case step::release_global: release_global(g.held_); break;
        case step::refund_rates: refund_rates(g.held_); break;
        case step::check_gates: e = gates_open(g) ? event::open : event::paused; break;
        default: return s;  // a wait, done or fail
      }
      if (where != npos) e = event::refused;
      s = m.resume(e, where, why);
    }
  }

  // --- reservations (throttle::reserve) ---

  // What a reserve did: acquired (the binding rate stages reserved, to act at `at`), or why not and where.
  struct reserve_outcome {
    try_status status = try_status::acquired;
    error_code error{};
    std::size_t stage = npos;
    time_point at{};
  };

  // Reserves `g`'s charge for `key` into `r`: every admission stage decides now (it counts the request, as
  // on any door), each keyed stage is pinned, no gate may be paused, then the rate stages are looked at and
  // only the binding ones reserved (see reserve_rates). Not acquired: nothing reserved.
  reserve_outcome reserve(guard& g, std::string_view key, rate_reservations& r) {
    static_assert(every_rate_reserves(),
                  "rein::throttle::reserve: every rate stage must reserve: a rein::basic_rate_limiter of a token "
                  "bucket, a fixed or sliding window, or rein::rate_limits of those (its reserve(n)); "
                  "this throttle lists a rate stage that cannot (an adaptive rate, the Redis bucket, a limit "
                  "without reservations): use acquire, or list that stage in a throttle of its own");
    const time_point now = clock_type::now();
    if (const std::size_t i = try_admission(g, now); i != npos)
      return {try_status::busy, make_error_code(errc::admission_refused), i, {}};
    if (const std::size_t i = try_pin(g.held_, key); i != npos)
      return {try_status::busy, make_error_code(errc::queue_full), i, {}};
    for (std::size_t i : at_rank<rank::gate>) {
      bool paused = false;
      visit(i, [&](auto I) {
        if constexpr (ranks_[I()] == rank::gate) paused = limiter<I()>(g.held_).is_paused();
      });
      if (paused) return {try_status::busy, error_code(net::error::would_block), i, {}};
    }
    return reserve_rates(g, r, now);
  }

  // A reservation's wait until its time to act, on `timer` (the reservation's own: see
  // throttle_reservation's state), cancelled through the caller's slot as any step's wait.
  template <class Timer>
  static net::awaitable<void> wait_reserved(Timer& timer, run_ctx& x) {
    co_await timer.async_wait(token<true>(x));
  }

  // Cancels every rate stage's reservation in `r` (each by its limit's rule) and forgets them.
  static void cancel_reserved(rate_reservations& r) {
    for_each_rate([&](auto I) {
      if constexpr (reserves_at<I()>) {
        if (auto& slot = std::get<I()>(r)) {
          slot->cancel();
          slot.reset();
        }
      }
    });
  }

  // Hands a reservation's units to `g` at its time to act, for the waiting path's admission (run<true>):
  // the reserved stages' units are a claim, as step 3's line grant is (throttle_admission), taken by no
  // other step and kept only while the admission goes on without waiting. Before its first wait of any
  // kind (a paused gate, a permit's line, a rate's line) the claim is let go (drop_claim), and the call goes
  // on as an acquire (its rates taken at step 5 when it can send); an admission spends it (spend_claim).
  void hand_reserved(guard& g, rate_reservations& r) const noexcept {
    g.held_.reserved = &r;
    for_each_rate([&](auto I) {
      if constexpr (reserves_at<I()>) {
        if (std::get<I()>(r)) g.held_.units[I()] = units_of<I()>(g.charge_);
      }
    });
  }

  // Lets every reservation still in `r` go as a claim is let go (below), and forgets them.
  static void let_go_reserved(rate_reservations& r) noexcept {
    holdings h;
    h.reserved = &r;
    drop_claim(h);
  }

  // Whether stage i's units are a reservation's claim (see hand_reserved).
  static bool claimed(const holdings& h, std::size_t i) noexcept {
    bool engaged = false;
    if (h.reserved) {
      visit(i, [&](auto I) {
        if constexpr (reserves_at<I()>) engaged = std::get<I()>(*h.reserved).has_value();
      });
    }
    return engaged;
  }

  // Lets a claim go (see hand_reserved): each reservation by its limit's cancel rule while it stands (at its
  // time to act, all of it), refunded after; no stage counted it as taken, so none counts a give-back.
  static void drop_claim(holdings& h) noexcept {
    if (!h.reserved) return;
    for_each_rate([&](auto I) {
      if constexpr (reserves_at<I()>) {
        if (auto& slot = std::get<I()>(*h.reserved)) {
          h.units[I()] = 0;
          try {
            reservation_access::let_go(*slot);
          } catch (...) {  // as refund_rates: giving units back only adds; losing some under exhaustion is harmless
          }
          slot.reset();
        }
      }
    });
  }

  // An admission's claim becomes its units (see hand_reserved): each reservation leaves its limiter's book
  // spent (refund and reconcile then treat the units as any admission's) and counts as the stage's grant.
  static void spend_claim(guard& g) noexcept {
    for_each_rate([&](auto I) {
      if constexpr (reserves_at<I()>) {
        if (auto& slot = std::get<I()>(*g.held_.reserved)) {
          reservation_access::spend(*slot);
          slot.reset();
          note_take(g, I());
        }
      }
    });
  }

  // The waiting path: the machine's steps from `s` (see throttle_admission for the steps and rein::throttle's
  // comment for why), until it admits (returns) or fails (throws).
  template <bool Bound>
  net::awaitable<void> pass(admission& m, step s, guard& g, run_ctx& x) {
    if constexpr (!Bound) {
      if (co_await net::this_coro::throw_if_cancelled()) x.awaiting = co_await net::this_coro::cancellation_state;
    }
    for (;;) {
      s = steps(m, s, g, x.key, {}, &x);
      if (s == step::done) co_return;
      if (s == step::fail) throw system_error(m.error());
      check_cancelled<Bound>(x);
      assert(s == step::wait_line && "the machine's only wait is on a stage's own line");
      // The stage in a local that lives across the wait: g++ 12 built this loop wrongly without one (a crash
      // on resumption, at -O0 and -O3 alike; clang's build and an ASan one ran fine).
      const std::size_t at = m.stage();
      drop_claim(g.held_);  // a reservation's units are never held across a wait
      co_await wait_at<Bound>(at, g, x);
      if (ranks_[at] == rank::gate) note_take(g, at);  // a gate's wait: awaited without a frame of ours
      s = m.resume(event::took);
    }
  }

  // Every permit's service time counts from `now`, the moment of sending (the reading the last stages
  // decided at): a permit held while its caller waited at a later stage would otherwise teach an adaptive
  // limiter that wait as latency.
  // `asked`: when the acquire was called (now, for an admission made at once: a zero wait).
  void admit(guard& g, time_point now, time_point asked) noexcept {
    g.admitted_ = true;
    g.admitted_at_ = now;
    if (g.held_.reserved) spend_claim(g);
    g.held_.reserved = nullptr;
    const bool full = g.held_.taken == every_stage_;
    if (!full) count_partly(g.held_.taken);
    std::atomic<std::uint64_t>& admissions = full ? admitted_ : partial_;
    g.held_.taken.reset();
    mark_admitted(g.held_);
    const std::chrono::nanoseconds sent(to_ns_saturated(g.admitted_at_));
    for (permit& p : g.held_.permits)
      if (p) permit_access::restamp(p, sent);
    if (now <= asked) {
      admissions.fetch_add(1, std::memory_order_relaxed);  // a zero wait: snapshot() counts it from these
      return;
    }
    const std::lock_guard<std::mutex> lock(wait_mutex_);
    waited_.record(std::chrono::duration_cast<std::chrono::nanoseconds>(now - asked));
    admissions.fetch_add(1, std::memory_order_relaxed);
  }

  // An acquire that ends without admission: everything back, and each stage it took counted abandoned.
  void abandon(holdings& h) noexcept {
    give_back(h);
    if (h.taken.none()) return;  // a completed guard's, or one refused before any stage
    for (std::size_t i = 0; i < stage_count; ++i)
      if (h.taken[i]) tallies_[i].abandoned.fetch_add(1, std::memory_order_relaxed);
    h.taken.reset();
  }

  void unpin(holdings& h) noexcept {
    std::apply([](auto&... handle) { (handle.reset(), ...); }, h.handles);
  }

  // Counts a caller as waiting while it is on the waiting path (however that path ends, the destruction of
  // its frame after the throttle's included).
  class waiting_scope {
   public:
    explicit waiting_scope(const std::shared_ptr<throttle_life<throttle_stage_ops>>& life) noexcept : life_(life) {
      life_->owner.load(std::memory_order_relaxed)->waiting_.fetch_add(1, std::memory_order_relaxed);
    }
    waiting_scope(const waiting_scope&) = delete;
    waiting_scope& operator=(const waiting_scope&) = delete;
    ~waiting_scope() {
      if (throttle_stage_ops* t = life_->owner.load(std::memory_order_acquire))
        t->waiting_.fetch_sub(1, std::memory_order_relaxed);
    }

   private:
    std::shared_ptr<throttle_life<throttle_stage_ops>> life_;
  };

  // A refusal at once at a stage of kind `s` (try_acquire's, or an admission stage's on either door).
  void count_refusal(throttle_stage s) noexcept {
    if (s == throttle_stage::none) return;
    refused_[static_cast<std::size_t>(s) - 1].fetch_add(1, std::memory_order_relaxed);
    if (options_.observer) {
      constexpr reject_reason reasons[] = {reject_reason::gate, reject_reason::rate, reject_reason::per_key,
                                           reject_reason::global, reject_reason::admission};
      notify(reasons[static_cast<std::size_t>(s) - 1]);
    }
  }
  void count_rejection() noexcept { rejections_.fetch_add(1, std::memory_order_relaxed); }

  // A waiting acquire that failed: in failed_total, and by its error.
  void count_failed(const error_code& ec) noexcept {
    failed_.fetch_add(1, std::memory_order_relaxed);
    count_failure(ec);
  }

  // --- for the guards: an admitted call's feedback ---

  // An admitted guard's outcome, to every stage that learns from it; rate units stay spent. A rejection's
  // congestion reaches the global stages as throttle_options::rejections says.
  // `work`: the caller's checked work hint for the concurrency stages' permits, or none (detail::no_work).
  template <class Work = detail::no_work>
  void finish(guard& g, outcome result, bool rejection = false, duration pause = duration::zero(),
              Work work = {}) noexcept {
    holdings& h = g.held_;
    // The scalars by value (with [&], GCC stopped inlining the fold once it took `work`); `this` as `self`, which
    // clang's -Wunused-lambda-capture does not misread in a generic lambda.
    [self = this, &g, &h, result, rejection, pause, work]<std::size_t... I>(std::index_sequence<I...>) {
      (self->template finish_one<I>(g, h,
                                    rejection && !self->template learns_rejections<I>() ? outcome::ignored : result,
                                    rejection && self->template learns_rejections<I>(), pause, work),
       ...);
    }(std::make_index_sequence<stage_count>{});
    finished_.fetch_add(1, std::memory_order_relaxed);
  }

  // Pauses every gate of the call; returns how long from now the longest of them stays closed (zero without
  // gates: nothing then stops the sending, so the adaptive rates are told no pause).
  template <class Pause>
  duration pause(holdings& h, const Pause& how) {
    const time_point now = clock_type::now();
    time_point until = now;
    [&]<std::size_t... I>(std::index_sequence<I...>) { (pause_one<I>(h, how, until), ...); }(
        std::make_index_sequence<stage_count>{});
    return until - now;
  }

  void settle(holdings& h, const rein::charge& actual, time_point admitted_at) {
    [&]<std::size_t... I>(std::index_sequence<I...>) { (settle_one<I>(h, actual, admitted_at), ...); }(
        std::make_index_sequence<stage_count>{});
  }

  void apply_hints(holdings& h, const upstream_response& response) {
    [&]<std::size_t... I>(std::index_sequence<I...>) { (hint_one<I>(h, response), ...); }(
        std::make_index_sequence<stage_count>{});
  }

 private:
  static constexpr std::size_t npos = guard::npos;

  // The counts of the stage at i, given the admissions that took every stage (a place left empty counts
  // nothing). Each term only grows, so each count does from one snapshot to the next (a Prometheus counter);
  // a difference of two counters read a moment apart would not.
  throttle_stage_counts stage_counts(std::size_t i, std::uint64_t full) const noexcept {
    throttle_stage_counts c;
    c.position = i;
    c.kind = kind_of(i);
    if (placeholder_[i]) return c;
    const stage_tally& t = tallies_[i];
    c.admitted = full + t.partly.load(std::memory_order_relaxed);
    c.readmitted = t.readmitted.load(std::memory_order_relaxed);
    c.abandoned = t.abandoned.load(std::memory_order_relaxed);
    c.reconciled = t.reconciled.load(std::memory_order_relaxed);
    c.given_back = t.given_back.load(std::memory_order_relaxed);
    return c;
  }

  static throttle_options validated(throttle_options o) {
    if (o.default_pause <= std::chrono::nanoseconds::zero())
      throw std::invalid_argument("rein::throttle: default_pause must be > 0, got " +
                                  std::to_string(o.default_pause.count()) + " ns");
    return o;
  }

  static constexpr bool every_rate_reserves() {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return ((ranks_[I] != rank::rate || reserves_at<I>) && ...);
    }(std::make_index_sequence<stage_count>{});
  }

  // Runs f(integral_constant<I>) for every rate stage, in list order.
  template <class F>
  static void for_each_rate(F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((ranks_[I] == rank::rate ? void(f(std::integral_constant<std::size_t, I>{})) : void()), ...);
    }(std::make_index_sequence<stage_count>{});
  }

  // The rate stages at reserve, in a few rounds: look at every stage, taking nothing (one whose line has
  // callers, a charge beyond its capacity or its range: not ok); T is the latest time any is ready. (A
  // closed stage is found by its reserve when it binds, else by the wait, as an acquire finds it: looking
  // for it by a reserve(0) would ask an all_of for what its parts cannot agree on.) Then reserve (its plain reserve(n), FIFO behind its own debt) only the stages ready at T, the
  // binding ones; those ready earlier are taken by the wait at its admission, as the permits are, so that no
  // stage counts the call before it can send, nor holds units ahead of its own time for it. A binding stage
  // that answers a later time than T (a take by another thread since the look; a T that the clock has
  // passed since is answered with the clock's time, which binds as well): what was reserved is cancelled,
  // and the stages are looked at again (busy after the last round, nothing reserved).
  reserve_outcome reserve_rates(guard& g, rate_reservations& r, time_point now) {
    using kind = typename readiness_type::kind;
    for (int round = 0; round < 4; ++round) {
      if (round != 0) now = clock_type::now();
      reserve_outcome out;
      std::array<time_point, stage_count> ready{};
      time_point at = now;
      for_each_rate([&](auto I) {
        if constexpr (reserves_at<I()>) {
          const std::size_t n = units_of<I()>(g.charge_);
          if (out.stage != npos || n == 0) return;
          const readiness_type k = rate_readiness(limiter<I()>(g.held_), n, now);
          try_status why = try_status::acquired;
          if (k.what == kind::exceeds) why = try_status::exceeds_capacity;
          else if (k.what != kind::ready && k.what != kind::at) why = try_status::busy;  // queued, never
          if (why != try_status::acquired) {
            out = {why, reserve_error(why), I(), {}};
            return;
          }
          ready[I()] = std::max(now, k.when);
          at = std::max(at, ready[I()]);
        }
      });
      if (out.stage != npos) return out;
      bool moved = false;
      time_point latest = at;
      try {
        for_each_rate([&](auto I) {
          if constexpr (reserves_at<I()>) {
            const std::size_t n = units_of<I()>(g.charge_);
            if (out.stage != npos || moved || n == 0 || ready[I()] != at) return;
            auto& slot = std::get<I()>(r);
            slot.emplace(limiter<I()>(g.held_).reserve(n));
            if (slot->ok() && slot->time_to_act() <= std::max(at, clock_type::now())) {
              latest = std::max(latest, slot->time_to_act());
              return;
            }
            const try_status why = slot->ok() ? try_status::busy : slot->status();
            if (why == try_status::busy) moved = true;  // a race: look again
            else out = {why, reserve_error(why), I(), {}};
          }
        });
      } catch (...) {  // a book of reservations that could not grow: nothing stays reserved
        cancel_reserved(r);
        throw;
      }
      if (out.stage == npos && !moved) {
        out.at = latest;
        return out;
      }
      cancel_reserved(r);
      if (out.stage != npos) return out;
    }
    constexpr auto rates = at_rank<rank::rate>;  // not empty: without rates the first round returns
    return {try_status::busy, error_code(net::error::would_block), rates.empty() ? npos : rates[0], {}};
  }

  static error_code reserve_error(try_status why) noexcept {
    switch (why) {
      case try_status::closed: return make_error_code(errc::closed);
      case try_status::exceeds_capacity: return make_error_code(errc::exceeds_capacity);
      default: return error_code(net::error::would_block);
    }
  }

  // Runs f(integral_constant<I>) for the stage at runtime position i.
  template <class F>
  static void visit(std::size_t i, F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((i == I ? void(f(std::integral_constant<std::size_t, I>{})) : void()), ...);
    }(std::make_index_sequence<stage_count>{});
  }

  template <std::size_t I>
  limiter_type<I>& limiter(holdings& h) const noexcept {
    if constexpr (keyed_[I]) return *std::get<I>(h.handles);
    else return std::get<I>(refs_).stage();
  }

  template <std::size_t I>
  std::size_t units_of(const rein::charge& c) const {
    if constexpr (ranks_[I] == rank::gate || ranks_[I] == rank::admission) return 1;  // asked once a call
    else return std::get<I>(refs_).units(c);
  }

  // --- synchronous steps ---
  // One clock reading serves the gates and rates of an admission: a limiter that can decide at a given
  // instant (try_acquire_at) is given it instead of reading the clock itself.
  template <class L>
  static auto try_take_at(L& l, std::size_t n, time_point now) {
    if constexpr (requires { l.try_acquire_at(n, now); }) return l.try_acquire_at(n, now);
    else return l.try_acquire(n);
  }

  // Tries the stage at position I at `now`, recording what it took in `g`.
  template <std::size_t I>
  event try_stage(guard& g, time_point now) {
    if constexpr (ranks_[I] == rank::none) {
      return event::passed;
    } else {
      const std::size_t n = units_of<I>(g.charge_);
      if (n == 0) return event::passed;
      auto& l = limiter<I>(g.held_);
      if constexpr (ranks_[I] == rank::admission) {
        if (!static_cast<bool>(l.try_acquire())) return event::refused;  // holds nothing: nothing to give back
        note_take(g, I);
        return event::took;
      } else if constexpr (ranks_[I] == rank::gate) {
        if (!static_cast<bool>(try_take_at(l, 1, now))) return event::refused;  // behind its waiters and jitter
        note_take(g, I);
        return event::took;
      } else if constexpr (ranks_[I] == rank::rate) {
        return try_rate<I>(g, now) == try_status::acquired ? event::took : event::refused;
      } else {
        permit p = l.try_acquire(n);
        if (!p) return event::refused;
        g.held_.permits[I] = std::move(p);
        note_take(g, I);
        return event::took;
      }
    }
  }

  // Takes the rate stage's units now; why not if it cannot (a closed limiter says so, and is no "busy").
  template <std::size_t I>
  try_status try_rate(guard& g, time_point now) {
    const std::size_t n = units_of<I>(g.charge_);
    if (n == 0) return try_status::acquired;
    const auto r = try_take_at(limiter<I>(g.held_), n, now);
    if (!static_cast<bool>(r)) {
      if constexpr (requires { r.status(); }) return r.status() == try_status::acquired ? try_status::busy : r.status();
      else return try_status::busy;
    }
    g.held_.units[I] = n;
    note_take(g, I);
    return try_status::acquired;
  }

  // Step 6: whether a gate paused since the caller passed it (its own line does not matter any more).
  bool gates_open(guard& g) {
    bool open = true;
    for (std::size_t i : at_rank<rank::gate>)
      visit(i, [&](auto I) {
        if constexpr (ranks_[I()] == rank::gate) open = open && !limiter<I()>(g.held_).is_paused();
      });
    return open;
  }

  // Whether a rate stage could take the caller's units now, without taking them.
  template <std::size_t I>
  typename readiness<time_point>::kind readiness_of(guard& g, time_point now) {
    return rate_readiness(limiter<I>(g.held_), units_of<I>(g.charge_), now).what;
  }

  // Takes every rate stage's units (all or nothing) but `held`, whose units the caller already has. Asks
  // first and takes only if every stage could give, so that a refusal rarely needs a refund (a sliding
  // window's refund cannot undo a take exactly). Returns the position of a stage that had no room (and then
  // holds no rate units at all, `held`'s included), or npos.
  std::size_t take_rates(guard& g, std::size_t held, time_point now, try_status* why = nullptr) {
    constexpr auto rates = at_rank<rank::rate>;
    if constexpr (rates.size() > 1) {
      for (std::size_t i : rates) {
        if (i == held || claimed(g.held_, i)) continue;
        bool ready = true;
        visit(i, [&](auto I) {
          if constexpr (ranks_[I()] == rank::rate) {
            using kind = typename readiness<time_point>::kind;
            if (units_of<I()>(g.charge_) == 0) return;
            const kind k = readiness_of<I()>(g, now);
            ready = k == kind::ready || k == kind::unknown;
          }
        });
        if (!ready) {
          refund_rates(g.held_);
          return i;
        }
      }
    }
    for (std::size_t i : rates) {
      if (i == held || claimed(g.held_, i)) continue;  // a reservation's claim: its units are held
      try_status status = try_status::acquired;
      visit(i, [&](auto I) {
        if constexpr (ranks_[I()] == rank::rate) status = try_rate<I()>(g, now);
      });
      if (status != try_status::acquired) {
        if (why != nullptr) *why = status;
        refund_rates(g.held_);
        return i;
      }
    }
    return npos;
  }

  // The first try (see throttle_admission): every gate and concurrency stage at `now` in list order, unrolled
  // at compile time (the fast path dispatches on no runtime position), then the rates; the position of the
  // stage that refused, or npos. What was taken stays in g (its owner gives it back).
  std::size_t try_first(guard& g, time_point now) {
    std::size_t refused = npos;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (void)(((ranks_[I] == rank::rate || ranks_[I] == rank::admission || try_stage<I>(g, now) != event::refused) ||
              (refused = I, false)) &&
             ...);
    }(std::make_index_sequence<stage_count>{});
    return refused != npos ? refused : take_rates(g, npos, now);
  }

  // Asks every admission stage, in list order, before anything is pinned or taken: the position of the one
  // that refused, or npos.
  std::size_t try_admission(guard& g, time_point now) {
    std::size_t refused = npos;
    if (g.held_.reserved) return npos;  // a reservation's wait: decided (and counted) at its reserve
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (void)(((ranks_[I] != rank::admission || try_stage<I>(g, now) != event::refused) || (refused = I, false)) &&
             ...);
    }(std::make_index_sequence<stage_count>{});
    return refused;
  }

  // Pins each keyed stage's limiter for `key`: the position of a stage that could not make the key (too many
  // keys), or npos.
  std::size_t try_pin(holdings& h, std::string_view key) {
    std::size_t refused = npos;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (void)((pin_one<I>(h, key, &refused)) && ...);
    }(std::make_index_sequence<stage_count>{});
    return refused;
  }

  // The key as the registry of stage I takes it: the view itself when it looks string keys up without
  // copying them (rein::keyed's default), else a copy.
  template <std::size_t I>
  static decltype(auto) key_for(std::string_view key) {
    using registry = stage_type<I>;
    if constexpr (std::is_same_v<typename registry::key_view, std::string_view>) return key;
    else return typename registry::key_type(key);
  }

  // Pins the stage at I (a keyed one) for `key`; a key the registry cannot make is refused.
  template <std::size_t I>
  bool pin_one(holdings& h, std::string_view key, std::size_t* refused) {
    if constexpr (keyed_[I]) {
      error_code ec;
      std::get<I>(h.handles) = std::get<I>(refs_).stage().get(key_for<I>(key), ec);
      if (ec) {
        *refused = I;
        return false;
      }
    }
    return true;
  }

  void refund_rates(holdings& h) noexcept {
    drop_claim(h);  // a reservation's units go back by its rule (the claim is never held across a wait)
    for (std::size_t i : at_rank<rank::rate>) {
      visit(i, [&](auto I) {
        if constexpr (ranks_[I()] == rank::rate) {
          const std::size_t n = std::exchange(h.units[I()], 0);
          if (n == 0) return;
          tallies_[I()].given_back.fetch_add(1, std::memory_order_relaxed);
          try {
            limiter<I()>(h).refund(n);  // a take of this instant or of a moment ago: see refund_anytime
          } catch (...) {  // a refund only adds units back; losing one under memory exhaustion is harmless
          }
        }
      });
    }
  }

  // Gives back the permit of the stage at i, if held, counted as a give-back.
  void release_permit(holdings& h, std::size_t i) noexcept {
    if (!h.permits[i]) return;
    h.permits[i].release();
    tallies_[i].given_back.fetch_add(1, std::memory_order_relaxed);
  }

  void release_global(holdings& h) noexcept {
    for (std::size_t i : at_rank<rank::global_concurrency>) release_permit(h, i);
  }

  void release_permits(holdings& h) noexcept {
    for (std::size_t i = 0; i < stage_count; ++i) release_permit(h, i);
  }

  // A guard not admitted: everything back, rate units refunded.
  void give_back(holdings& h) noexcept {
    refund_rates(h);
    release_permits(h);
  }

  // An admission that did not take every stage (a stage charged 0 there): `partly` for those it did.
  REIN_NOINLINE void count_partly(const std::bitset<stage_count>& taken) noexcept {
    for (std::size_t i = 0; i < stage_count; ++i)
      if (taken[i]) tallies_[i].partly.fetch_add(1, std::memory_order_relaxed);
  }

  // A take at the stage at i: the first of this acquire, or a re-take. Static: read after a resumption, when
  // the throttle may be gone (its owner pointer then says so).
  static void note_take(guard& g, std::size_t i) noexcept {
    auto bit = g.held_.taken[i];
    if (!bit) {
      bit = true;
      return;
    }
    if (throttle_stage_ops* t = g.life_->owner.load(std::memory_order_acquire))
      t->tallies_[i].readmitted.fetch_add(1, std::memory_order_relaxed);
  }

  // A take given back after a resumption (the throttle may be gone).
  static void note_given_back(guard& g, std::size_t i) noexcept {
    if (throttle_stage_ops* t = g.life_->owner.load(std::memory_order_acquire))
      t->tallies_[i].given_back.fetch_add(1, std::memory_order_relaxed);
  }

  // Whether the stage at I learns from a rejection (rein::rejection_feedback).
  template <std::size_t I>
  bool learns_rejections() const noexcept {
    if constexpr (keyed_[I] || ranks_[I] == rank::admission) {  // an admission stage counts every refusal
      return true;
    } else {
      constexpr rank keyed_kind = ranks_[I] == rank::rate ? rank::rate : rank::per_key_concurrency;
      constexpr bool has_keyed_kind = [] {
        for (std::size_t i = 0; i < stage_count; ++i)
          if (keyed_[i] && ranks_[i] == keyed_kind) return true;
        return false;
      }();
      switch (options_.rejections) {
        case rejection_feedback::per_key: return false;
        case rejection_feedback::everywhere: return true;
        case rejection_feedback::automatic: break;
      }
      return !has_keyed_kind;
    }
  }

  template <std::size_t I, class Work>
  void finish_one(guard& g, holdings& h, outcome result, bool refused, duration pause, Work work) noexcept {
    if constexpr (ranks_[I] == rank::admission) {
      try {  // the outcome of the call it admitted: a refusal (a 429) is congestion, as any stage hears it
        limiter<I>(h).record(result);
      } catch (...) {  // feedback is advice
      }
    } else if constexpr (ranks_[I] == rank::per_key_concurrency || ranks_[I] == rank::global_concurrency) {
      detail::permit_access::complete(h.permits[I], result, work);
    } else if constexpr (ranks_[I] == rank::rate) {
      h.units[I] = 0;
      end_admission<I>(h);
      auto& l = limiter<I>(h);
      try {  // a rate that learns from pauses is told the gates' one; others only the outcome
        if constexpr (requires { l.record(result, g.admitted_at_, pause); }) l.record(result, g.admitted_at_, pause);
        else if constexpr (requires { l.record(result, g.admitted_at_); }) l.record(result, g.admitted_at_);
        // A rate that paces at a quota learns from a refusal that a send arrived early (a pacing margin).
        if constexpr (requires { l.refused(g.admitted_at_); }) {
          if (refused) l.refused(g.admitted_at_);
        }
      } catch (...) {  // feedback is advice: a limit that cannot take it keeps its rate
      }
    }
  }

  template <std::size_t I, class Pause>
  void pause_one(holdings& h, const Pause& how, time_point& until) {
    if constexpr (ranks_[I] == rank::gate) {
      auto& gate = limiter<I>(h);
      if constexpr (std::is_convertible_v<Pause, std::string_view>) until = std::max(until, gate.on_retry_after(how, default_pause()));
      else until = std::max(until, gate.pause_for(how));
    }
  }

  template <std::size_t I>
  void settle_one(holdings& h, const rein::charge& actual, time_point admitted_at) {
    if constexpr (ranks_[I] == rank::rate) {
      const std::size_t was = h.units[I];
      const std::size_t now = units_of<I>(actual);
      auto& l = limiter<I>(h);
      if (now < was) {
        // A window's late refund would free room that other calls hold: given back only in the instant of
        // the admission (the units then stay spent, never an overrun).
        if (refunds_anytime<limiter_type<I>>() || clock_type::now() == admitted_at) l.refund(was - now);
      } else if (now > was) {
        if constexpr (requires { l.charge(now - was); }) {
          l.charge(now - was);
        } else {
          if (!static_cast<bool>(l.try_acquire(now - was))) return;
          tallies_[I].reconciled.fetch_add(1, std::memory_order_relaxed);
        }
      }
      h.units[I] = now;
    }
  }

  // Whether complete(response) lowers the rate stage at I: it counts requests or tokens (a rein::weighted
  // stage's unit is its own, no provider's) and its limiter takes an upstream's remaining count.
  template <std::size_t I>
  static constexpr bool takes_hints() {
    if constexpr (ranks_[I] != rank::rate) {
      return false;
    } else {
      using weight = typename std::tuple_element_t<I, specs>::weight;
      return (std::is_same_v<weight, by_requests_t> || std::is_same_v<weight, by_tokens_t>) &&
             requires(limiter_type<I>& l) { l.limit_remaining(std::int64_t{}, std::chrono::nanoseconds{}); };
    }
  }

  // What the hinted rate stage at I admitted and saw end: its key's counts (kept with the key's limiter, so
  // that they live exactly as long), or the stage's own.
  template <std::size_t I>
  admission_counts& admissions(holdings& h) noexcept {
    if constexpr (keyed_[I]) return std::get<I>(h.handles).admissions();
    else return tallies_[I].admissions;
  }

  // At admission: each hinted rate stage's count, this guard's units added (one atomic add, no lock).
  void mark_admitted(holdings& h) noexcept {
    [&]<std::size_t... I>(std::index_sequence<I...>) { (mark_one<I>(h), ...); }(
        std::make_index_sequence<stage_count>{});
  }

  template <std::size_t I>
  void mark_one(holdings& h) noexcept {
    if constexpr (takes_hints<I>()) {
      std::atomic<std::uint64_t>& count = admissions<I>(h).admitted;
      const std::uint64_t n = h.units[I];
      h.admitted_units[I] = n;
      h.admitted_mark[I] = n == 0 ? count.load(std::memory_order_relaxed)
                                  : count.fetch_add(n, std::memory_order_relaxed) + n;
    }
  }

  // At the end of an admitted call: its units leave the hinted stages' in-flight count. Release: a hint that
  // reads this end also reads the admission before it (else in flight could read below the truth).
  template <std::size_t I>
  void end_admission(holdings& h) noexcept {
    if constexpr (takes_hints<I>()) {
      if (const std::uint64_t n = std::exchange(h.admitted_units[I], 0); n != 0)
        admissions<I>(h).ended.fetch_add(n, std::memory_order_release);
    }
  }

  // The units of the hinted stage at I that the upstream had not counted when it answered this guard's
  // call: those admitted after it and still in flight. Neither count alone says which calls are both, so
  // the smaller is taken: exact when every call admitted before this one has ended, or none admitted after
  // it has; otherwise more, never less. An end read without its admission (another thread's, a moment
  // apart) wraps the in-flight figure to a huge one, and the admissions since decide.
  template <std::size_t I>
  std::uint64_t in_flight_since(holdings& h) noexcept {
    const admission_counts& c = admissions<I>(h);
    const std::uint64_t ended = c.ended.load(std::memory_order_acquire);
    const std::uint64_t admitted = c.admitted.load(std::memory_order_relaxed);
    const std::uint64_t since = admitted - h.admitted_mark[I];
    const std::uint64_t others_in_flight = admitted - ended - h.admitted_units[I];
    return std::min(since, others_in_flight);
  }

  // An upstream's remaining count less `later` units it had not counted when it answered, and which are on
  // their way. Never below 0; a count <= 0 stays as it is.
  static std::int64_t less_admitted(std::int64_t remaining, std::uint64_t later) noexcept {
    if (remaining <= 0) return remaining;
    if (later >= static_cast<std::uint64_t>(remaining)) return 0;
    return remaining - static_cast<std::int64_t>(later);
  }

  template <std::size_t I>
  void hint_one(holdings& h, const upstream_response& response) {
    if constexpr (takes_hints<I>()) {
      using weight = typename std::tuple_element_t<I, specs>::weight;
      rate_limit_hint hint = std::is_same_v<weight, by_requests_t> ? response.requests : response.tokens;
      if (hint.remaining) hint.remaining = less_admitted(*hint.remaining, in_flight_since<I>(h));
      rein::limit_remaining(limiter<I>(h), hint);
    }
  }

  // --- waiting steps ---
  template <bool Bound>
  static auto token(const run_ctx& x) {
    if constexpr (Bound)
      return net::bind_cancellation_slot(x.cancellation ? x.cancellation->signal.slot() : net::cancellation_slot(),
                                         net::use_awaitable);
    else
      return net::use_awaitable;
  }

  [[noreturn]] static void throw_aborted() { throw system_error(error_code(net::error::operation_aborted)); }

  static void stop_if_gone(const guard& g) {
    if (gone(g)) throw_aborted();
  }

  // Waits on the stage's own line until it grants, taking the units (a concurrency or rate stage; a gate is
  // waited on in wait_at). A global stage in fair order is waited on as the caller's key.
  template <bool Bound, std::size_t I>
  net::awaitable<void> wait_stage(guard& g, run_ctx& x) {
    if constexpr (ranks_[I] != rank::none && ranks_[I] != rank::gate && ranks_[I] != rank::admission) {
      auto& l = limiter<I>(g.held_);
      const std::size_t n = units_of<I>(g.charge_);
      if constexpr (ranks_[I] == rank::rate) {
        co_await acquire_on_line<Bound, I>(l, n, x);
        if (gone(g)) {  // nobody would refund them: the stage (it lives on) takes them back now
          l.refund(n);
          throw_aborted();
        }
        g.held_.units[I] = n;
      } else {
        g.held_.permits[I] = co_await acquire_on_line<Bound, I>(l, n, x);
      }
      note_take(g, I);
    }
  }

  // The wait on a concurrency or rate stage's own line: as the caller's key on a global stage in fair order.
  template <bool Bound, std::size_t I, class L>
  auto acquire_on_line(L& l, std::size_t n, run_ctx& x) {
    if constexpr (fair_capable<I>) {
      if (l.order() == queue_order::fair)
        return l.for_key(x.key, weight_of(x.key)).async_acquire_until(n, x.deadline, token<Bound>(x));
    }
    return l.async_acquire_until(n, x.deadline, token<Bound>(x));
  }

  // Whether the stage at I is global and can serve its line in fair order (queue_order::fair).
  template <std::size_t I>
  static constexpr bool fair_capable = !keyed_[I] && requires(const stage_type<I>& l) {
    l.for_key(std::string_view{}, 1u);
    { l.order() } -> std::same_as<queue_order>;
  };

  // Whether a global stage serves its line in fair order (where key_weight is asked).
  bool has_fair_stage() const noexcept {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return (fair_stage_at<I>() || ...);
    }(std::make_index_sequence<stage_count>{});
  }

  template <std::size_t I>
  bool fair_stage_at() const noexcept {
    if constexpr (ranks_[I] != rank::none && ranks_[I] != rank::gate && ranks_[I] != rank::admission &&
                  fair_capable<I>) {
      return std::get<I>(refs_).stage().order() == queue_order::fair;
    } else {
      return false;
    }
  }

  // throttle_options::key_weight's answer, brought into for_key's range; a throw counts as 1 (a wait must
  // not end in an exception that is not its error).
  std::uint32_t weight_of(std::string_view key) const noexcept {
    std::uint32_t w = 1;
    if (options_.key_weight) {
      try {
        w = options_.key_weight(key);
      } catch (...) {
      }
    }
    return std::clamp<std::uint32_t>(w, 1, max_fair_weight);
  }

  template <bool Bound>
  net::awaitable<void> wait_at(std::size_t i, guard& g, run_ctx& x) {
    net::awaitable<void> a;
    visit(i, [&](auto I) {
      if constexpr (ranks_[I()] == rank::gate)  // a gate's wait records nothing: awaited without a frame of ours
        a = limiter<I()>(g.held_).async_acquire_until(units_of<I()>(g.charge_), x.deadline, token<Bound>(x));
      else
        a = wait_stage<Bound, I()>(g, x);
    });
    return a;
  }

  // Whether the key's rate at i could take the caller's units now, with nobody waiting on its line, taking
  // nothing (step 3 then waits in that line). A charge of 0 there is ready.
  event ask_ready(std::size_t i, guard& g, try_status& why) {
    using kind = typename readiness_type::kind;
    event e = event::ready;
    visit(i, [&](auto I) {
      if constexpr (ranks_[I()] == rank::rate) {
        const std::size_t n = units_of<I()>(g.charge_);
        if (n == 0 || claimed(g.held_, I())) return;  // a reservation's claim: its units are held
        const kind k = rate_readiness(limiter<I()>(g.held_), n, clock_type::now()).what;
        if (k == kind::ready || k == kind::unknown) return;  // unknown: step 5's take decides (as take_rates)
        why = try_status::exceeds_capacity;
        e = k == kind::exceeds ? event::refused : event::not_ready;
      }
    });
    return e;
  }

  // A waiting acquire that failed, by its error (others count in failed_total only).
  void count_failure(const error_code& ec) noexcept {
    std::size_t slot = 7;
    reject_reason why = reject_reason::cancelled;
    if (ec == errc::timed_out) slot = 0, why = reject_reason::timed_out;
    else if (ec == errc::queue_full) slot = 1, why = reject_reason::queue_full;
    else if (ec == errc::closed) slot = 2, why = reject_reason::closed;
    else if (ec == errc::exceeds_capacity) slot = 3, why = reject_reason::exceeds_capacity;
    else if (ec == errc::upstream_unavailable) slot = 5, why = reject_reason::unavailable;
    else if (ec == errc::overloaded) slot = 6, why = reject_reason::overloaded;
    else if (ec == errc::admission_refused) return count_refusal(throttle_stage::admission);
    else if (ec == error_code(net::error::operation_aborted)) slot = 4;
    if (slot == 7) return;
    failures_[slot].fetch_add(1, std::memory_order_relaxed);
    if (options_.observer) notify(why);
  }

  void notify(reject_reason why) const noexcept {
    limiter_event e;
    e.kind = event_kind::rejected;
    e.reason = why;
    e.name = options_.name;
    try {
      options_.observer(e);
    } catch (...) {
    }
  }
  std::tuple<stage_ref<Stages>...> refs_;
  throttle_options options_;
  std::atomic<std::uint64_t> admitted_{0};  // admissions that took every stage
  std::atomic<std::uint64_t> partial_{0};   // the others (a stage charged 0 there)
  std::atomic<std::uint64_t> refused_[5] = {};  // by throttle_stage: gate, rate, per_key, global, admission
  std::atomic<std::uint64_t> failed_{0};
  // timed_out, queue_full, closed, exceeds_capacity, cancelled, unavailable, overloaded
  std::atomic<std::uint64_t> failures_[7] = {};
  std::atomic<std::uint64_t> finished_{0};
  std::atomic<std::uint64_t> rejections_{0};
  std::atomic<std::size_t> waiting_{0};
  // What the throttle did at each stage (throttle_stage_counts; `admitted` is admitted_ plus `partly`).
  struct stage_tally {
    std::atomic<std::uint64_t> partly{0};  // admissions that took this stage but not every one
    std::atomic<std::uint64_t> readmitted{0};
    std::atomic<std::uint64_t> abandoned{0};
    std::atomic<std::uint64_t> reconciled{0};
    std::atomic<std::uint64_t> given_back{0};
    admission_counts admissions;  // a global hinted rate stage's (a keyed one's live with its key)
  };
  std::array<stage_tally, stage_count> tallies_{};
  mutable std::mutex wait_mutex_;
  duration_histogram waited_;  // the timed waits (guards admitted after waiting some time); the rest are zeros
};

}  // namespace detail
}  // namespace rein
