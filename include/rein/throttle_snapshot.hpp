// What a throttle (rein/throttle.hpp) reports: its counters, each stage's counts and the sum rule that adds
// them up, and the error its coroutine doors throw.
#pragma once

#include <rein/config.hpp>
#include <rein/detail/format.hpp>
#include <rein/error.hpp>
#include <rein/observer.hpp>
#include <rein/throttle_charge.hpp>
#include <rein/wait_stats.hpp>

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rein {

/// What a throttle did at one place of its stage list (throttle_snapshot::stages). Each acquisition the
/// throttle made there is counted once, as one of four: the take an admitted call kept (`admitted`), a
/// re-take (`readmitted`), the first take of an acquire that ended without admission (`abandoned`), or an
/// extra take by guard.reconcile() (`reconciled`). Their sum, acquired(), is this throttle's share of the
/// stage's own `acquired_total` (for a rein::keyed stage, the sum over its keys' limiters).
struct throttle_stage_counts {
  std::size_t position = 0;                    ///< the place in the throttle's stage list (0 for the first)
  throttle_stage kind = throttle_stage::none;  ///< the stage's kind (none for a rein::unlimited place)
  /// Admissions that took this stage: the throttle's admitted_total less those whose charge here was 0
  /// (a concurrency or rate stage charged 0 is passed without being asked; a gate or an admission stage is
  /// always asked).
  std::uint64_t admitted = 0;
  /// Re-takes: acquisitions by a caller that had already taken this stage in the same acquire and given
  /// it back (a concurrency or rate stage), or passed it in an earlier round (a gate, which holds nothing).
  /// The throttle gives back only what blocks others, and so takes again only that: the global slots of a
  /// caller that must wait for its key's rate, and everything but its key's permits when a gate paused
  /// meanwhile. What its first try took is kept for the waiting path (a refusal there gives back nothing
  /// it would take again at once).
  std::uint64_t readmitted = 0;
  /// Acquires that took this stage and ended without admission (a try_acquire refused at a later stage, a
  /// waiting acquire that failed or was cancelled): one each, for its first take.
  std::uint64_t abandoned = 0;
  /// Takes by guard.reconcile() for an under-estimated charge on a rate stage that cannot go into debt
  /// (no `charge(n)`: it is asked with try_acquire instead).
  std::uint64_t reconciled = 0;
  /// Takes given back before any admission: permits released, rate units refunded. Always 0 at a gate or
  /// an admission stage (a pass holds nothing). Once no acquire is under way, given_back = readmitted +
  /// abandoned at a concurrency or rate stage: every take but the one an admission keeps is given back.
  std::uint64_t given_back = 0;

  /// admitted + readmitted + abandoned + reconciled: every acquisition this throttle made at the stage.
  std::uint64_t acquired() const noexcept { return admitted + readmitted + abandoned + reconciled; }
};

/// Counters of a throttle (each stage's own limiter has its own snapshot too), read without blocking an
/// admission made at once (the wait histogram is copied under a lock that only admissions after waiting
/// take): each counter is exact, two counters may be a moment apart, and wait.count() is acquired_total.
///
/// Admissions, re-admissions and give-backs are counted apart. acquired_total counts guards handed out,
/// one per call however many times it passed a stage; a stage's own acquired_total counts every grant it
/// made, the throttle's re-takes included, so it can be larger. The sum rule, per place `i` of the list,
/// exact once no acquire of the throttle is under way (waiting == 0 and no try_acquire running) and when
/// nothing but this throttle acquires from the stage:
///
///     stage(i).snapshot().acquired_total == stages[i].acquired()
///         == stages[i].admitted + stages[i].readmitted + stages[i].abandoned + stages[i].reconciled
///     stages[i].admitted == acquired_total  (when no call's charge at stage i is 0)
///
/// (An acquire under way has its re-takes counted at once, and its first take when it ends: in `admitted`
/// or in `abandoned`.)
struct throttle_snapshot {
  std::uint64_t acquired_total = 0;          ///< guards handed out (as every limiter's acquired_total)
  std::uint64_t admitted_total = 0;          ///< the same (the former name)
  std::uint64_t readmitted_total = 0;        ///< re-takes at every stage: the sum of stages[i].readmitted
  std::uint64_t given_back_total = 0;        ///< takes given back before admission: the sum of stages[i].given_back
  std::size_t in_flight = 0;                 ///< admitted guards not yet completed or destroyed
  std::size_t waiting = 0;                   ///< acquires waiting now (not admitted at once, not yet ended)
  std::uint64_t rejected_total = 0;          ///< the sum of the reasons for_each_rejected() lists
  std::uint64_t rejected_gate = 0;           ///< try_acquire refused at the gate
  std::uint64_t rejected_rate = 0;           ///< try_acquire refused at the rate stage
  std::uint64_t rejected_per_key = 0;        ///< try_acquire refused at the per-key stage
  std::uint64_t rejected_global = 0;         ///< try_acquire refused at the global stage
  /// Refused at once by an admission stage (rein::admission_throttle), by either door: try_acquire, and
  /// the waiting acquires that failed with errc::admission_refused (also in failed_total).
  std::uint64_t rejected_admission = 0;
  std::uint64_t timed_out_total = 0;         ///< waiting acquires that failed with errc::timed_out
  std::uint64_t queue_full_total = 0;        ///< ... with errc::queue_full (a stage's line, or too many keys)
  std::uint64_t closed_total = 0;            ///< ... with errc::closed
  std::uint64_t exceeds_capacity_total = 0;  ///< ... with errc::exceeds_capacity
  std::uint64_t unavailable_total = 0;       ///< ... with errc::upstream_unavailable (a stage's open circuit)
  std::uint64_t overloaded_total = 0;        ///< ... with errc::overloaded (shed by a stage's sojourn rule)
  std::uint64_t cancelled_total = 0;         ///< ... with operation_aborted (not a rejection)
  std::uint64_t failed_total = 0;            ///< waiting acquires that failed (any error, cancellation included)
  /// Upstream rejections the caller reported: guard.reject() calls and complete(response) with a 429 (or a
  /// 503 with Retry-After), each pausing the key's gates; printed as `reported=`. Not a refusal of the
  /// throttle's (those are rejected_total): the call was admitted and sent, and the upstream refused it.
  std::uint64_t rejections_reported = 0;
  /// One entry per place of the stage list, in list order (a rein::unlimited place included, all zero):
  /// what the throttle took and gave back there (see throttle_stage_counts and the sum rule above).
  std::vector<throttle_stage_counts> stages{};
  /// Every admission's wait, from the acquire call to admission across all stages: a zero for each guard
  /// admitted at once (try_acquire, or an acquire that every stage admitted at once, however long
  /// async_acquire's coroutine waited to start on its executor), the measured time for each admitted after
  /// waiting (that start included). Its count() is acquired_total. (A stage's own snapshot times only the
  /// waits on that stage's line.)
  duration_histogram wait{};

  /// Calls f(reject_reason, std::uint64_t count) for each reason summed in rejected_total.
  template <class F>
  void for_each_rejected(F&& f) const {
    f(reject_reason::gate, rejected_gate);
    f(reject_reason::rate, rejected_rate);
    f(reject_reason::per_key, rejected_per_key);
    f(reject_reason::global, rejected_global);
    f(reject_reason::admission, rejected_admission);
    f(reject_reason::timed_out, timed_out_total);
    f(reject_reason::queue_full, queue_full_total);
    f(reject_reason::closed, closed_total);
    f(reject_reason::exceeds_capacity, exceeds_capacity_total);
    f(reject_reason::unavailable, unavailable_total);
    f(reject_reason::overloaded, overloaded_total);
  }
};

/// One line: `acquired=100 in_flight=4 waiting=1 rejected=7 (rate=5 timed_out=2) cancelled=0 failed=2
/// reported=1 readmitted=26 given_back=30 wait[n=100 p50=0 p90=2.00ms p99=9.00ms max=10.0ms]` (reported:
/// the upstream's rejections, rejections_reported; readmitted and given_back: summed over the stages).
inline std::ostream& operator<<(std::ostream& os, const throttle_snapshot& s) {
  os << "acquired=" << s.acquired_total << " in_flight=" << s.in_flight << " waiting=" << s.waiting << ' ';
  detail::write_rejected(os, s);
  os << " cancelled=" << s.cancelled_total << " failed=" << s.failed_total << " reported=" << s.rejections_reported
     << " readmitted=" << s.readmitted_total << " given_back=" << s.given_back_total << " wait[";
  detail::write_histogram(os, s.wait);
  os << ']';
  return os;
}


/// What a throttle's acquire throws when it fails: the error (errc::timed_out, errc::closed, errc::queue_full,
/// errc::exceeds_capacity, errc::upstream_unavailable, errc::overloaded, errc::admission_refused,
/// operation_aborted), and where: the stage's position in the list, its kind and the
/// key; `what()` says all of it (the throttle's name, the stage's position and kind, the key, the error).
class throttle_error : public system_error {
 public:
  /// Made by the throttle.
  throttle_error(error_code ec, const std::string& what, std::size_t stage, throttle_stage kind, std::string key)
      : system_error(ec, what), stage_(stage), kind_(kind), key_(std::move(key)) {}

  /// The failing stage's position in the throttle's list (0 for the first).
  std::size_t stage() const noexcept { return stage_; }
  /// The failing stage's kind.
  throttle_stage kind() const noexcept { return kind_; }
  /// The key the caller asked for.
  const std::string& key() const noexcept { return key_; }

 private:
  std::size_t stage_;
  throttle_stage kind_;
  std::string key_;
};

namespace detail {

/// The error of a failed throttle acquire, with a what() that says all of it: the throttle's `name` (none if
/// empty), the stage's position (none if `stage` is SIZE_MAX) and kind, the key, the error.
REIN_DECL throttle_error throttle_failure(const error_code& ec, std::string_view name, std::size_t stage,
                                          throttle_stage kind, const std::string& key);

}  // namespace detail

}  // namespace rein
