// A throttle's admission as a step machine without I/O: it says which stage to try, wait on or give back
// next, and hears what happened; the caller of the machine (the throttle's stage operations,
// detail/throttle_stage_ops.hpp, or a model of the stages in a test) does each step. It holds no executor, no
// timer and no stage, only positions in the stage list.
//
// The steps, for a throttle whose stages are listed in admission order (admission stages, gates, per-key
// concurrency, global concurrency, rates; see rein::throttle for why):
// - Before anything is taken or pinned, every admission stage decides the call at once: a refusal ends the
//   admission there, holding nothing, on both paths (a waiting acquire fails with errc::admission_refused).
// - The first try, at one instant: pin every keyed stage's limiter for the key, try every gate and
//   concurrency stage in list order, then take every rate's units at once (all or nothing), stopping at the
//   first refusal. try_acquire ends there.
// - A waiting acquire goes on from what that try took (the gates it passed, the permits it holds):
//   1. every gate (the ones the first try passed are not asked again in the same round), waiting on a gate
//      that is paused;
//   2. every per-key concurrency stage not held, waiting on its line;
//   3. every per-key rate, until it could take the charge: one that could now is only looked at (nothing
//      taken); one that cannot (no room yet, or callers of the key already waiting there) is waited on in
//      its own line, FIFO by arrival (or in the order its options chose), the global slots given back
//      first. Its grant takes the units: the caller's *claim*, which it keeps only while it goes on
//      without waiting (the other keyed rates looked at again, then steps 4 and 5), in the same resumption;
//      before any other wait the claim is refunded (a wait at another key's rate, a global permit's line);
//   4. every global concurrency stage not held, waiting on its line;
//   5. every rate's units at once (the claim's are already taken, at the line's grant, in this instant):
//      if a global rate has no room, everything is refunded and it waits on that rate's line keeping the
//      global slots, and takes the others with its units held; if a key's rate has none, back to 3, which
//      waits in that rate's line (a rate that cannot say whether it could take the charge without taking
//      it, a user's own rate limiter, is looked at as ready at 3 and found short only here);
//   6. a gate paused meanwhile: the rate units and the global slots back, and back to 1.
// Why no schedule deadlocks: rate units are held across a wait only at a global rate (5), whose line every
// caller waits on last, holding only permits; a claim is held by a caller that does not wait (it is
// refunded before any wait), so at most one claim per caller exists at a time and none is ever waited
// for by its holder; permits are taken in one order (key, then global). A caller that must refund its
// claim to wait elsewhere rejoins its key's line behind those already there (its place is not kept).
#pragma once

#include <rein/detail/throttle_stages.hpp>
#include <rein/error.hpp>
#include <rein/try_result.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

// A resumption point of throttle_admission::resume: the step is returned, and the next resume goes on from here.
#define REIN_ADMISSION_YIELD(point, step) \
  do {                                     \
    point_ = point;                        \
    return step;                           \
    case point:;                           \
  } while (false)

// Takes the k_-th stage of `kind` now, or waits on its line if it refuses; remembers what it took.
#define REIN_ADMISSION_TAKE(kind, point, wait_point)                                           \
  do {                                                                                         \
    stage_ = kind.at[k_];                                                                      \
    REIN_ADMISSION_YIELD(point, admission_step::take);                                         \
    at_ = stage_;                                                                              \
    if (e == admission_event::refused) REIN_ADMISSION_YIELD(wait_point, admission_step::wait_line); \
    if (e == admission_event::took) held_ |= std::uint64_t{1} << stage_;                         \
  } while (false)

namespace rein::detail {

// What the machine asks for next. The stage a step is about is the machine's stage().
enum class admission_step : std::uint8_t {
  ask_admission,    // every admission stage in list order, never waiting: took, or refused with the stage
  pin,              // pin each keyed stage's limiter for the key: took, or refused with the stage that could not
  try_first,        // every gate and concurrency stage in list order, then every rate's units (all or nothing),
                    // at one instant, stopping at the first refusal: took, or refused with the stage
  take,             // take stage() now: took, passed (charged 0 there: nothing taken) or refused
  take_rates,       // every rate's units but held_rate()'s, all or nothing: took, or refused with the stage and why
  ask_ready,        // could the key's rate at stage() take the charge now (taking nothing), with nobody waiting
                    // on its line? ready, not_ready, or refused (why: exceeds_capacity)
  wait_line,        // wait on stage()'s own line until it grants (taking its units): took
  release_global,   // give back the global concurrency permits: took
  refund_rates,     // refund every rate's units (a claim's included): took
  check_gates,      // is every gate still open? open or paused
  done,             // admitted
  fail,             // ended without admission at at(): error() says why (none: try_acquire's refusal)
};

// What the driver says of the step it did (or `start`, for the first resume).
enum class admission_event : std::uint8_t { start, took, passed, refused, ready, not_ready, open, paused };

// The order of a throttle's stages, for the machine: Layout::ranks and Layout::keyed, one entry per place.
template <class Layout>
class throttle_admission {
 public:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
  static constexpr std::size_t size = Layout::ranks.size();
  static_assert(size <= 64, "rein::throttle: at most 64 stages");

  // `waits`: a waiting acquire (false: try_acquire, which ends at the first refusal).
  explicit throttle_admission(bool waits) noexcept : waits_(waits) {}

  // The next step, given what the last one did (`stage` and `why`: a refusal's, where it says).
  admission_step resume(admission_event e, std::size_t stage = npos, try_status why = try_status::busy) noexcept {
    switch (point_) {
      case 0:
        if (admission_mask_ != 0) {
          REIN_ADMISSION_YIELD(3, admission_step::ask_admission);
          if (e == admission_event::refused) {  // refused at once: nothing taken, nothing to wait for
            at_ = position(stage);
            return failed(waits_ ? errc::admission_refused : errc{});
          }
        }
        REIN_ADMISSION_YIELD(1, admission_step::pin);
        if (e == admission_event::refused) {
          at_ = position(stage);
          return failed(waits_ ? errc::queue_full : errc{});
        }
        REIN_ADMISSION_YIELD(2, admission_step::try_first);
        if (e == admission_event::took) return finished(admission_step::done);
        if (!waits_) {
          at_ = position(stage);
          return failed(errc{});
        }
        // What the first try took: every gate and permit before the stage that refused (a stage charged 0
        // there holds nothing, and is not asked again either).
        held_ = (gates_.mask | per_key_.mask | global_.mask) & ((std::uint64_t{1} << stage) - 1);
        trying_ = false;
        for (;;) {
          for (k_ = 0; k_ < gates_.count; ++k_) {  // 1.
            if (!to_gates_ || (first_ && holds(gates_.at[k_]))) continue;
            REIN_ADMISSION_TAKE(gates_, 4, 5);
          }
          for (k_ = 0; k_ < per_key_.count; ++k_) {  // 2.
            if (holds(per_key_.at[k_])) continue;
            REIN_ADMISSION_TAKE(per_key_, 6, 7);
          }
          first_ = false;
          to_gates_ = true;
          for (k_ = 0; k_ < key_rates_.count;) {  // 3.
            stage_ = at_ = key_rates_.at[k_];
            if (stage_ == claim_) {
              ++k_;
              continue;
            }
            if (stage_ != must_wait_) {  // refused at step 5: waited on without asking again
              REIN_ADMISSION_YIELD(8, admission_step::ask_ready);
              if (e == admission_event::ready) {
                ++k_;
                continue;
              }
              if (e == admission_event::refused) return failed(errc::exceeds_capacity);
            }
            if (claim_ != none) {  // never held across a wait
              REIN_ADMISSION_YIELD(18, admission_step::refund_rates);
              claim_ = none;
            }
            if ((held_ & global_.mask) != 0) {
              REIN_ADMISSION_YIELD(9, admission_step::release_global);
              held_ &= ~global_.mask;
            }
            stage_ = key_rates_.at[k_];
            REIN_ADMISSION_YIELD(10, admission_step::wait_line);
            claim_ = stage_;
            must_wait_ = none;
            k_ = 0;  // the other keyed rates are looked at again, at this instant
          }
          for (k_ = 0; k_ < global_.count; ++k_) {  // 4.
            if (holds(global_.at[k_])) continue;
            stage_ = global_.at[k_];
            REIN_ADMISSION_YIELD(11, admission_step::take);
            at_ = stage_;
            if (e == admission_event::refused) {
              if (claim_ != none) {
                REIN_ADMISSION_YIELD(19, admission_step::refund_rates);
                claim_ = none;
                stage_ = at_;
              }
              REIN_ADMISSION_YIELD(12, admission_step::wait_line);
            }
            if (e == admission_event::took) held_ |= std::uint64_t{1} << stage_;
          }
          held_rate_ = std::exchange(claim_, none);
          for (;;) {  // 5.
            REIN_ADMISSION_YIELD(13, admission_step::take_rates);
            if (e == admission_event::took) break;
            held_rate_ = none;
            stage_ = at_ = position(stage);
            if (why == try_status::closed) return failed(errc::closed);
            if (why == try_status::exceeds_capacity) return failed(errc::exceeds_capacity);
            if (Layout::keyed[stage_]) {  // back to 3, to wait in that rate's line
              must_wait_ = stage_;
              break;
            }
            REIN_ADMISSION_YIELD(14, admission_step::wait_line);
            held_rate_ = stage_;
          }
          if (e != admission_event::took) {
            to_gates_ = false;
            continue;
          }
          REIN_ADMISSION_YIELD(15, admission_step::check_gates);  // 6.
          if (e == admission_event::open) return finished(admission_step::done);
          REIN_ADMISSION_YIELD(16, admission_step::refund_rates);
          if ((held_ & global_.mask) != 0) {
            REIN_ADMISSION_YIELD(17, admission_step::release_global);
            held_ &= ~global_.mask;
          }
        }
      default: break;
    }
    return admission_step::fail;  // resumed after the end
  }

  // Ends the admission: a wait failed (timed out, cancelled, closed, ...), at at(); the error is the
  // driver's (error() says only the machine's own reasons).
  admission_step fail() noexcept { return finished(admission_step::fail); }

  // The stage the last step is about.
  std::size_t stage() const noexcept { return wide(stage_); }
  // Where a failure now would be said to be (npos: before any stage).
  std::size_t at() const noexcept { return wide(at_); }
  // The rate whose units the caller holds while taking the others (take_rates: a key's rate its line granted
  // at step 3, or a global rate its line granted at step 5), or npos.
  std::size_t held_rate() const noexcept { return wide(held_rate_); }
  // Why the machine ended the admission: an admission stage refused (errc::admission_refused), a pin
  // refused (errc::queue_full), a rate closed or too small for the charge; none for try_acquire's refusal and
  // for fail().
  error_code error() const noexcept { return ec_ == errc{} ? error_code() : make_error_code(ec_); }
  // Whether the machine is still in its first try, where every step is at the instant the acquire started.
  bool trying() const noexcept { return trying_; }

 private:
  // Positions are kept in a byte (a stage list is short): `none` is npos.
  static constexpr std::uint8_t none = 255;
  static std::uint8_t position(std::size_t i) noexcept { return i < size ? static_cast<std::uint8_t>(i) : none; }
  static std::size_t wide(std::uint8_t i) noexcept { return i == none ? npos : i; }

  // The places of one kind of stage, in list order, and their mask.
  struct places {
    std::array<std::uint8_t, size> at{};
    std::uint8_t count = 0;
    std::uint64_t mask = 0;
  };
  static constexpr places where(stage_rank r, bool keyed_only) {
    places p;
    for (std::size_t i = 0; i < size; ++i) {
      if (Layout::ranks[i] != r || (keyed_only && !Layout::keyed[i])) continue;
      p.at[p.count++] = static_cast<std::uint8_t>(i);
      p.mask |= std::uint64_t{1} << i;
    }
    return p;
  }
  static constexpr places gates_ = where(stage_rank::gate, false);
  static constexpr places per_key_ = where(stage_rank::per_key_concurrency, false);
  static constexpr places global_ = where(stage_rank::global_concurrency, false);
  static constexpr places key_rates_ = where(stage_rank::rate, true);
  static constexpr std::uint64_t admission_mask_ = where(stage_rank::admission, false).mask;

  bool holds(std::size_t i) const noexcept { return (held_ >> i) & 1U; }

  admission_step failed(errc ec) noexcept {
    ec_ = ec;
    return finished(admission_step::fail);
  }
  admission_step finished(admission_step s) noexcept {
    point_ = 255;
    return s;
  }

  std::uint64_t held_ = 0;  // the gates passed and the permits held (not the rate units), by position
  std::uint8_t k_ = 0;
  std::uint8_t stage_ = none;
  std::uint8_t at_ = none;
  std::uint8_t held_rate_ = none;
  std::uint8_t claim_ = none;  // the key's rate whose line granted the caller's units at step 3 (its claim)
  // The key's rate that refused at step 5: step 3 waits in its line rather than asking it again. A rate that
  // cannot be asked without taking (ask_ready says ready for it) is found short only there, and asking
  // again would loop at one instant between two such rates, each line granting and the other refusing.
  std::uint8_t must_wait_ = none;
  std::uint8_t point_ = 0;
  errc ec_{};
  bool waits_;
  bool trying_ = true;
  bool first_ = true;
  bool to_gates_ = true;
};

}  // namespace rein::detail

#undef REIN_ADMISSION_TAKE
#undef REIN_ADMISSION_YIELD
