// What a throttle hands out (rein/throttle.hpp): the guard that holds everything one call took, and reports
// the call's outcome to the stages.
#pragma once

#include <rein/completion_hint.hpp>
#include <rein/config.hpp>
#include <rein/detail/permit_source.hpp>
#include <rein/outcome.hpp>
#include <rein/rate_limit_headers.hpp>
#include <rein/throttle_charge.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>

namespace rein {
namespace detail {

// Whether a throttle still lives, shared with the guards it hands out: `owner` is the part of the throttle
// its guards report to (detail::throttle_stage_ops), cleared by the throttle's destructor, so that a guard
// that outlives it (in a coroutine frame the io_context destroys after the throttle) lets go of what it holds
// without touching the throttle or its stages.
template <class Owner>
struct throttle_life {
  explicit throttle_life(Owner* o) noexcept : owner(o) {}
  std::atomic<Owner*> owner;
};

}  // namespace detail

/// What a throttle hands out: everything one call holds (the permits of the concurrency stages, the units
/// taken from the rate stages, the keys' limiters pinned), so that the outcome reaches every stage that
/// learns from it and a 429 pauses the key's gates for everyone.
///
/// RAII: destroying it without an outcome releases everything and reports `outcome::ignored` (a caller
/// cancelled mid-call loses nothing and teaches the adaptive limiters nothing; an admission stage counts it
/// as an accept, since the call may have been sent: report a client-side timeout as congestion); the units
/// taken from rate stages stay spent (the call may have been sent). Move-only; empty when
/// default-constructed, moved from, completed, or refused (then rejected_at(), rejected_stage() and error()
/// say where and why).
///
/// @par Thread Safety
/// One guard is used by one caller at a time; distinct guards from any threads.
///
/// @par Lifetime
/// A guard may outlive its throttle and the throttle's stages (a coroutine frame that the io_context
/// destroys after them, in the usual declaration order: io_context, stages, throttle). Once the throttle is
/// gone, the guard is inert: destroying it, complete(), reject() and reconcile() release its permits and
/// pins and touch neither the throttle nor its stages (the outcome reaches nobody). It must not be used
/// concurrently with the throttle's destruction.
template <class Throttle>
class throttle_guard {
 public:
  /// A duration of the throttle's clock.
  using duration = typename Throttle::duration;
  /// A point in time of the throttle's clock.
  using time_point = typename Throttle::time_point;
  /// rejected_stage() of a guard that was not refused.
  static constexpr std::size_t npos = std::numeric_limits<std::size_t>::max();

  throttle_guard() noexcept = default;
  /// Takes over `other`'s stages; `other` becomes empty (it gives nothing back).
  throttle_guard(throttle_guard&& other) noexcept { take(other); }
  /// Gives back what this guard holds (as its destructor would), then takes over `other`'s stages.
  throttle_guard& operator=(throttle_guard&& other) noexcept {
    if (this != &other) {
      reset();
      take(other);
    }
    return *this;
  }
  throttle_guard(const throttle_guard&) = delete;
  throttle_guard& operator=(const throttle_guard&) = delete;
  ~throttle_guard() { reset(); }

  /// True when the call may go ahead (every stage admitted it) and no outcome has been reported yet.
  explicit operator bool() const noexcept { return admitted_; }

  /// The kind of the stage that refused (try_acquire) or failed (a waiting acquire); throttle_stage::none
  /// for an admitted guard.
  throttle_stage rejected_at() const noexcept { return rejected_at_; }

  /// The position in the throttle's stage list of the stage that refused or failed; npos if none did.
  std::size_t rejected_stage() const noexcept { return rejected_stage_; }

  /// Why a waiting acquire failed (errc::timed_out, errc::closed, errc::queue_full,
  /// errc::exceeds_capacity, errc::admission_refused, errc::overloaded, errc::upstream_unavailable,
  /// operation_aborted); empty for an admitted guard and for a try_acquire refusal.
  error_code error() const noexcept { return error_; }

  /// The charge this guard holds (as acquired, or as reconciled).
  const rein::charge& charged() const noexcept { return charge_; }

  /// When every stage admitted the call (the throttle's clock): the instant its rate units were taken.
  time_point admitted_at() const noexcept { return admitted_at_; }

  /// Reports how the call went and releases everything: the outcome reaches every concurrency stage (an
  /// adaptive limiter learns from it) and every rate stage that learns (rein::adaptive_rate_limiter's
  /// record, with the admission instant as the send time). Does nothing on an empty guard.
  void complete(outcome result) noexcept { complete_as(result, false); }

  /// As complete(outcome), with what the caller knows of the call besides (rein::completion_hint):
  /// `hint.work` reaches the concurrency stages' permits (an adaptive limiter judges the call's latency per
  /// unit of work, permit::complete(outcome, completion_hint)); rate stages ignore it.
  /// `guard.complete(outcome::success, {.work = tokens})`. On an empty guard it only checks the hint.
  /// @throws std::invalid_argument if `hint.work` is negative, NaN or infinite
  ///   ("rein::completion_hint: work must be >= 0 and finite, got <value>"); checked before anything is
  ///   given back, so the guard still holds everything and gives it back later, once, as usual.
  void complete(outcome result, const completion_hint& hint) {
    detail::check_hint(hint);
    complete_as(result, false, duration::zero(), hint.work);
  }

  /// As complete_http(status), with a completion_hint as complete(outcome, completion_hint) takes it.
  /// @throws std::invalid_argument as complete(outcome, completion_hint), before anything is given back.
  void complete_http(int status, const completion_hint& hint) {
    detail::check_hint(hint);
    complete_as(classify_http_status(status), status == 429, duration::zero(), hint.work);
  }

  /// Reports an HTTP status through rein::classify_http_status and releases everything. A 429 is congestion
  /// learned as a rejection is (throttle_options::rejections: by the key's stages, and by the global ones
  /// only where no keyed stage of their kind exists), but pauses nothing: reject() with the Retry-After
  /// also pauses the key's gates.
  void complete_http(int status) noexcept { complete_as(classify_http_status(status), status == 429); }

  /// The upstream said "too many requests" (429, or 503 with Retry-After): pauses the key's gates (and any
  /// global gate) for everyone for `retry_after` (the throttle's default_pause when absent), counts as
  /// congestion at the key's stages (and at the global ones as throttle_options::rejections says: by
  /// default only where no keyed stage of their kind exists), releases. The pause starts before the permits
  /// go back, so the caller next in line for this key sees it and waits at the gate instead of sending into
  /// the pause. Does nothing on an empty guard.
  /// One rule for every pause in rein (quota_gate::pause_for, a Retry-After of `0` or a date already past):
  /// a `retry_after` of zero or less is a wait already over and pauses nothing (the call still counts as
  /// congestion); only an absent one (nullopt, or a field that does not parse) pauses for default_pause.
  void reject(std::optional<duration> retry_after = std::nullopt) {
    stage_ops* owner = live_owner();
    if (owner == nullptr) return;
    complete_rejected(*owner, owner->pause(held_, retry_after.value_or(owner->default_pause())));
  }

  /// As reject(), from the raw Retry-After field value (delta-seconds or an HTTP-date, RFC 9110 section
  /// 10.2.3; parsed by rein::parse_retry_after; absent or garbage means the default pause).
  void reject(std::string_view retry_after_value) {
    stage_ops* owner = live_owner();
    if (owner == nullptr) return;
    complete_rejected(*owner, owner->pause(held_, retry_after_value));
  }

  /// Reports the upstream's answer as rein::read_response reads it (rein/rate_limit_headers.hpp from a status
  /// and headers; rein/beast.hpp from a Boost.Beast response): a 429, or a 503 with Retry-After, pauses and
  /// counts as reject(retry_after) does; anything else completes with its outcome. Either way the
  /// provider's `x-ratelimit-remaining-*` / `-reset-*` hints first lower the rate stages that count the same
  /// unit (`requests` for stages charged by requests, `tokens` for rein::by_tokens ones; never raised, see
  /// rein::limit_remaining), so the local budget never trusts itself over the provider's count.
  ///
  /// The calls in flight: the upstream's `remaining` counts what it had admitted when it answered this
  /// call, not the calls the stage admitted after this one that are still on their way (they left after
  /// it, so the upstream had not seen them, and it will count them). Each hinted stage therefore applies
  /// `remaining - k`, never below 0, where k is the units it admitted after this guard's admission and not
  /// yet ended (for a keyed stage, to this guard's key): with k calls of one unit in flight behind this
  /// one, r left means r - k more until the reset. A call admitted after this one but ended before it is
  /// taken as counted (the upstream answered it first, so most likely counted it first; one that did not
  /// gets one call more than it allows per such reordering). Which calls are both admitted after this one and
  /// in flight is not kept, only how many were admitted since and how many are in flight: k is the
  /// smaller, exact when every call admitted before this one has ended (or none after it has), else
  /// larger, so the stage admits fewer than the upstream allows, never more. Units count as charged at
  /// admission (a reconcile does not change them); a caller that took units and gave them back without
  /// being admitted is not counted. The counts are kept per stage by this throttle, and per key with a
  /// keyed stage's limiter (shared by every throttle that lists the registry): two atomic adds per hinted
  /// stage and call, no lock, no allocation.
  /// This is what a client with several connections needs to honour the IETF fields without overshooting
  /// by its own calls in flight (draft-ietf-httpapi-ratelimit-headers: `r` is the quota units remaining at
  /// the server when it answers).
  void complete(const upstream_response& response) {
    stage_ops* owner = live_owner();
    if (owner == nullptr) return;
    owner->apply_hints(held_, response);
    if (response.too_many_requests) {
      std::optional<duration> pause;
      if (response.retry_after) pause = std::chrono::duration_cast<duration>(*response.retry_after);
      reject(pause);
    } else {
      complete(response.result);
    }
  }

  /// Settles the charge once the call's real cost is known (an LLM answer's usage): each rate stage whose
  /// share was over-estimated gets the difference back (`refund`), and each one under-estimated is charged
  /// the difference as debt (`charge(n)` where the stage has it: the bucket goes below zero and the next
  /// callers wait until it is repaid, never a silent overrun; a stage without it is asked for the
  /// difference with try_acquire, and what it cannot give is not charged). A window (sliding or fixed) gets
  /// an over-estimate back only in the instant of the admission: later, a window's refund would free room
  /// that other calls hold, so the units stay spent (never an overrun). Concurrency stages keep their
  /// permits. Call it before complete() or reject(); on an empty guard it does nothing.
  /// @throws std::invalid_argument if `actual.tokens` is not 0 and no stage charges tokens (as acquire).
  void reconcile(const rein::charge& actual) {
    stage_ops::check_charge(actual);
    stage_ops* owner = live_owner();
    if (owner == nullptr) return;
    owner->settle(held_, actual, admitted_at_);
    charge_ = actual;
  }

 private:
  friend Throttle;
  // The part of the throttle that works its stages, which the guard reports to (it lives as long as the throttle).
  using stage_ops = typename Throttle::stage_ops;
  friend stage_ops;
  using holdings = typename Throttle::holdings;

  using life = detail::throttle_life<stage_ops>;

  throttle_guard(std::shared_ptr<life> l, const rein::charge& c) noexcept : life_(std::move(l)), charge_(c) {}

  // The stage operations of an admitted guard's throttle, or nullptr. A guard admitted by a throttle that is
  // gone (a coroutine frame the io_context destroys after the throttle and its stages) lets go of what it
  // holds, touching neither: its permits and pins are safe on their own.
  stage_ops* live_owner() noexcept {
    if (!admitted_) return nullptr;
    if (stage_ops* owner = life_->owner.load(std::memory_order_acquire)) return owner;
    orphan();
    return nullptr;
  }

  void orphan() noexcept {
    admitted_ = false;
    life_.reset();
    held_ = holdings{};
  }

  // `work`: the caller's checked work hint (std::optional<double>), or none (detail::no_work).
  template <class Work = detail::no_work>
  void complete_as(outcome result, bool rejection, duration pause = duration::zero(), Work work = {}) noexcept {
    stage_ops* owner = live_owner();
    if (owner == nullptr) return;
    owner->finish(*this, result, rejection, pause, work);
    admitted_ = false;
    owner->unpin(held_);
    life_.reset();  // holds nothing any more: the destructor need not look (nor count it abandoned)
  }

  // Counted as a rejection; congestion to the stages that throttle_options::rejections names, with the pause
  // the gates applied (an adaptive rate restarts its curve when it ends).
  void complete_rejected(stage_ops& owner, duration pause) noexcept {
    owner.count_rejection();
    complete_as(outcome::congestion, true, pause);
  }

  void take(throttle_guard& other) noexcept {
    life_ = std::move(other.life_);
    held_ = std::move(other.held_);  // leaves other's handles and permits empty
    other.held_.units = {};
    charge_ = other.charge_;
    admitted_at_ = other.admitted_at_;
    admitted_ = std::exchange(other.admitted_, false);
    rejected_at_ = std::exchange(other.rejected_at_, throttle_stage::none);
    rejected_stage_ = std::exchange(other.rejected_stage_, npos);
    error_ = std::exchange(other.error_, error_code());
  }

  // Not admitted: whatever was taken goes back, rate units included. Admitted: permits report ignored.
  void reset() noexcept {
    if (life_ == nullptr) return;
    stage_ops* owner = life_->owner.load(std::memory_order_acquire);
    if (owner == nullptr) return orphan();
    if (admitted_) {
      owner->finish(*this, outcome::ignored);
      admitted_ = false;
    } else {
      owner->abandon(held_);
    }
    owner->unpin(held_);
    life_.reset();
  }

  std::shared_ptr<life> life_;
  holdings held_{};
  rein::charge charge_{};
  time_point admitted_at_{};
  bool admitted_ = false;
  throttle_stage rejected_at_ = throttle_stage::none;
  std::size_t rejected_stage_ = npos;
  error_code error_{};
};

}  // namespace rein
