// Events rein's limiters push to an optional observer: rejections with their reason, limit changes, pauses,
// evictions, floor and ceiling transitions, circuit transitions.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <ostream>
#include <string_view>

namespace rein {

/// Why a caller was turned away (the `reason` label of `rein_rejected_total`).
enum class reject_reason : std::uint8_t {
  queue_full,        ///< the waiting line was full (max_waiters), at once
  timed_out,         ///< the deadline passed, at once or while waiting
  exceeds_capacity,  ///< the request can never be granted (more than the limiter's capacity)
  closed,            ///< the limiter was closed
  cancelled,         ///< the caller cancelled (counted apart: see wait_stats::cancelled_total)
  gate,              ///< a throttle's quota gate was paused
  rate,              ///< a throttle's rate stage had no token
  per_key,           ///< a throttle's per-key concurrency stage was full (or the key could not be made)
  global,            ///< a throttle's global concurrency stage was full
  max_keys,          ///< a keyed registry had max_keys live and busy keys
  budget_exhausted,  ///< a retry was due but the retry budget had none left
  attempts_exhausted,  ///< the last allowed attempt failed
  permanent,         ///< an attempt failed permanently
  unavailable,       ///< an adaptive limiter's circuit was open (errc::upstream_unavailable), at once; or a
                     ///< shared limiter could not ask Redis under fail_closed (rein::redis::errc::unavailable)
  admission,         ///< refused locally by client-side adaptive throttling (rein::admission_throttle)
  overloaded,        ///< shed by a line's sojourn rule (errc::overloaded; see rein::algo::basic_codel)
};

/// The reason's name, as in metrics labels: "queue_full", "timed_out", ...
constexpr std::string_view to_string(reject_reason r) noexcept {
  switch (r) {
    case reject_reason::queue_full: return "queue_full";
    case reject_reason::timed_out: return "timed_out";
    case reject_reason::exceeds_capacity: return "exceeds_capacity";
    case reject_reason::closed: return "closed";
    case reject_reason::cancelled: return "cancelled";
    case reject_reason::gate: return "gate";
    case reject_reason::rate: return "rate";
    case reject_reason::per_key: return "per_key";
    case reject_reason::global: return "global";
    case reject_reason::max_keys: return "max_keys";
    case reject_reason::budget_exhausted: return "budget_exhausted";
    case reject_reason::attempts_exhausted: return "attempts_exhausted";
    case reject_reason::permanent: return "permanent";
    case reject_reason::unavailable: return "unavailable";
    case reject_reason::admission: return "admission";
    case reject_reason::overloaded: return "overloaded";
  }
  return "unknown";
}

inline std::ostream& operator<<(std::ostream& os, reject_reason r) { return os << to_string(r); }

/// What happened.
enum class event_kind : std::uint8_t {
  rejected,       ///< `count` callers were turned away for `reason`
  limit_changed,  ///< the limit moved from `from` to `to` (adaptive limiters: when floor(limit) moves or a cut
                  ///< happens; others: any change by a setter such as set_rate or add_permits)
  pause_started,  ///< a quota gate closed for `pause` from now (it was open)
  pause_ended,    ///< a quota gate's pause was found over (by the first acquire, release or wake-up after it)
  key_evicted,    ///< a keyed registry dropped the idle limiter of `key`
  at_floor,       ///< the limit reached its floor (`to` is the limit)
  left_floor,     ///< the limit rose above its floor
  at_ceiling,     ///< the limit reached its ceiling
  left_ceiling,   ///< the limit fell below its ceiling
  circuit_opened,     ///< an adaptive limiter's circuit opened (from closed or half-open): calls fail fast
                      ///< with errc::upstream_unavailable for `pause` from now
  circuit_half_open,  ///< the open period was found over (by the first acquire or release after it): probes go
  circuit_closed,     ///< a probe succeeded: calls are admitted by the limit again
  lease_lost,  ///< a shared semaphore learned that Redis had expired its lease (`count` leases since the last
               ///< event): the permits its callers hold no longer count on the server
  lease_expired,  ///< a semaphore took back the permits of `count` leases (basic_semaphore::with_lease) whose
                  ///< holders had not given them back within their lease; those permits are now inert
};

constexpr std::string_view to_string(event_kind k) noexcept {
  switch (k) {
    case event_kind::rejected: return "rejected";
    case event_kind::limit_changed: return "limit_changed";
    case event_kind::pause_started: return "pause_started";
    case event_kind::pause_ended: return "pause_ended";
    case event_kind::key_evicted: return "key_evicted";
    case event_kind::at_floor: return "at_floor";
    case event_kind::left_floor: return "left_floor";
    case event_kind::at_ceiling: return "at_ceiling";
    case event_kind::left_ceiling: return "left_ceiling";
    case event_kind::circuit_opened: return "circuit_opened";
    case event_kind::circuit_half_open: return "circuit_half_open";
    case event_kind::circuit_closed: return "circuit_closed";
    case event_kind::lease_lost: return "lease_lost";
    case event_kind::lease_expired: return "lease_expired";
  }
  return "unknown";
}

/// One event. The string views are valid only during the observer's call.
struct limiter_event {
  event_kind kind = event_kind::rejected;    ///< what happened
  std::string_view name;                     ///< the limiter's name (line_options::name), empty if none
  reject_reason reason = reject_reason::queue_full;  ///< rejected: why
  std::uint64_t count = 1;                   ///< rejected: how many callers, at once; lease_lost,
                                             ///< lease_expired: how many leases
  double from = 0.0;                         ///< limit_changed: the limit before
  double to = 0.0;                           ///< limit_changed, at_/left_ floor and ceiling: the limit now
  std::chrono::nanoseconds pause{0};         ///< pause_started: how long the gate stays closed from now;
                                             ///< circuit_opened: how long the circuit stays open from now
  std::string_view key;                      ///< key_evicted, and a keyed registry's rejections: the key
};

/// Writes one line: `rejected reason=timed_out count=2 name=api`.
inline std::ostream& operator<<(std::ostream& os, const limiter_event& e) {
  os << to_string(e.kind);
  switch (e.kind) {
    case event_kind::rejected: os << " reason=" << to_string(e.reason) << " count=" << e.count; break;
    case event_kind::lease_lost:
    case event_kind::lease_expired: os << " count=" << e.count; break;
    case event_kind::limit_changed: os << " from=" << e.from << " to=" << e.to; break;
    case event_kind::pause_started:
    case event_kind::circuit_opened: os << " pause=" << e.pause.count() << "ns"; break;
    case event_kind::at_floor:
    case event_kind::left_floor:
    case event_kind::at_ceiling:
    case event_kind::left_ceiling: os << " limit=" << e.to; break;
    default: break;
  }
  if (!e.key.empty()) os << " key=" << e.key;
  if (!e.name.empty()) os << " name=" << e.name;
  return os;
}

/// An observer: called outside the limiter's lock, on the thread whose call caused the event (an acquire, a
/// release, a timer's wake-up), after the completions that call made ready were posted. It must not block;
/// it may call into the limiter. An exception it throws is swallowed (it must not break a release). Set
/// none (the default) and events cost one test of an empty std::function on the paths that can cause them.
using limiter_observer = std::function<void(const limiter_event&)>;

namespace detail {

/// Events gathered under a lock and delivered after it is released. Consecutive rejections for the same
/// reason are merged (a timer's wake-up that expires five waiters is one event with count 5).
class event_buffer {
 public:
  static constexpr std::size_t capacity = 8;

  void push(const limiter_event& e) noexcept {
    if (e.kind == event_kind::rejected && size_ != 0 && items_[size_ - 1].kind == event_kind::rejected &&
        items_[size_ - 1].reason == e.reason && items_[size_ - 1].key == e.key) {
      items_[size_ - 1].count += e.count;
      return;
    }
    if (size_ < capacity) items_[size_++] = e;
  }

  void reject(reject_reason why, std::uint64_t n = 1) noexcept {
    limiter_event e;
    e.kind = event_kind::rejected;
    e.reason = why;
    e.count = n;
    push(e);
  }

  bool empty() const noexcept { return size_ == 0; }

  /// Calls `observer` for each event in order, naming them `name`; exceptions are swallowed.
  void deliver(const limiter_observer& observer, std::string_view name) noexcept {
    for (std::size_t i = 0; i < size_; ++i) {
      items_[i].name = name;
      try {
        observer(items_[i]);
      } catch (...) {
      }
    }
    size_ = 0;
  }

 private:
  limiter_event items_[capacity];
  std::size_t size_ = 0;
};

/// A limiter's observable state, compared before and after each change to find transitions.
struct observed_state {
  double limit = 0.0;        ///< what limit_changed reports
  double level = 0.0;        ///< limit_changed fires when this moves (floor(limit) for adaptive limits)
  std::uint64_t cuts = 0;    ///< ... or when this moves (the algorithm's decreases)
  bool at_floor = false;
  bool at_ceiling = false;
  bool paused = false;
  std::chrono::nanoseconds pause_left{0};  ///< while paused: how long from now
  /// An adaptive limiter's circuit: 0 closed, 1 open, 2 half-open (circuit_state's values). `opens` counts
  /// the openings, so that a half-open circuit that re-opens before anyone looked still reports it.
  std::uint8_t circuit = 0;
  std::uint64_t opens = 0;
  std::chrono::nanoseconds open_left{0};  ///< while open: how long from now
  std::uint64_t leases_lost = 0;  ///< a shared semaphore's leases lost so far (lease_lost reports each rise)

  /// Equal when nothing an event reports changed (pause_left runs down by itself: not compared).
  bool operator==(const observed_state& o) const noexcept {
    return limit == o.limit && level == o.level && cuts == o.cuts && at_floor == o.at_floor &&
           at_ceiling == o.at_ceiling && paused == o.paused && circuit == o.circuit && opens == o.opens &&
           leases_lost == o.leases_lost;
  }

  /// Pushes the events that lead from `before` to `*this`.
  void diff(const observed_state& before, event_buffer& out) const noexcept {
    limiter_event e;
    if (level != before.level || cuts != before.cuts) {
      e.kind = event_kind::limit_changed;
      e.from = before.limit;
      e.to = limit;
      out.push(e);
    }
    e.to = limit;
    if (at_floor != before.at_floor) {
      e.kind = at_floor ? event_kind::at_floor : event_kind::left_floor;
      out.push(e);
    }
    if (at_ceiling != before.at_ceiling) {
      e.kind = at_ceiling ? event_kind::at_ceiling : event_kind::left_ceiling;
      out.push(e);
    }
    if (paused != before.paused) {
      e.kind = paused ? event_kind::pause_started : event_kind::pause_ended;
      e.pause = paused ? pause_left : std::chrono::nanoseconds{0};
      out.push(e);
    }
    if (circuit != before.circuit || opens != before.opens) {
      // Each opening since `before` is reported; a circuit that opened and moved on in between reports
      // where it is now as well.
      e.pause = std::chrono::nanoseconds{0};
      if (opens != before.opens) {
        e.kind = event_kind::circuit_opened;
        e.pause = circuit == 1 ? open_left : std::chrono::nanoseconds{0};
        out.push(e);
      }
      if (circuit != 1) {
        e.kind = circuit == 2 ? event_kind::circuit_half_open : event_kind::circuit_closed;
        out.push(e);
      }
    }
    if (leases_lost != before.leases_lost) {
      e.kind = event_kind::lease_lost;
      e.pause = std::chrono::nanoseconds{0};
      e.count = leases_lost - before.leases_lost;
      out.push(e);
    }
  }
};

}  // namespace detail
}  // namespace rein
