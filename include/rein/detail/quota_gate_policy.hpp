// The admission rule of rein::basic_quota_gate (closed until a pause ends, then a staggered release), as
// the wait line asks it. Not API.
#pragma once

#include <rein/detail/clock_time.hpp>
#include <rein/observer.hpp>
#include <rein/outcome.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <utility>

namespace rein::detail {

// Waiter "tickets". The core hands the policy only the head waiter's count, so the gate passes a ticket in
// its place (a gate has no units to count): (sequence << 1) | arrived_while_paused. Sequence numbers rise
// with arrival; ticket 0 is the synchronous fast path (try_acquire), which never carries jitter.
inline constexpr std::size_t quota_ticket(std::uint64_t sequence, bool paused) noexcept {
  return static_cast<std::size_t>((sequence << 1) | (paused ? 1U : 0U));
}

// A uniform number in [0, 1) for (seed, sequence): a stateless counter-based draw (SplitMix64's finaliser), so
// a waiter's jitter does not depend on the order in which the policy happens to look at waiters.
inline double quota_unit(std::uint64_t seed, std::uint64_t sequence) noexcept {
  std::uint64_t z = seed + sequence * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

// What a quota gate reads outside the lock to number its waiters: shared by the gate and its policy, so
// that it stays where it is when the gate is moved and lives as long as either.
template <class Rep>
struct quota_tickets {
  std::atomic<std::uint64_t> next_sequence{1};
  std::atomic<Rep> paused_until_ticks{std::numeric_limits<Rep>::lowest()};  // the pause's end, in clock ticks
};

// The count a quota gate hands the line for a request (its n is ignored): a ticket (detail/acquire_doors.hpp).
// "Paused" is read from the copy of paused_until kept outside the lock: a caller racing with a pause that
// starts at that very moment may be counted as not paused, and then resumes at the pause's end without
// jitter, in its FIFO place.
template <class Clock>
struct quota_counter {
  quota_tickets<typename Clock::rep>* tickets;
  std::size_t try_count(std::size_t) const noexcept { return quota_ticket(0, false); }
  std::size_t wait_count(std::size_t) const noexcept {
    const std::uint64_t sequence = tickets->next_sequence.fetch_add(1, std::memory_order_relaxed);
    const bool paused =
        Clock::now().time_since_epoch().count() < tickets->paused_until_ticks.load(std::memory_order_relaxed);
    return quota_ticket(sequence, paused);
  }
};

// The admission rule of a quota gate: closed until `paused_until`, then the waiters who arrived while it was
// closed go in a staggered order.
//
// Stagger ("release batch"): at the first grant attempt at or after the pause's end E, the head waiter's
// sequence number is `first` and the last sequence number issued so far is `last`; N = last - first + 1.
// Waiter k = sequence - first resumes at E + floor(J * (k + u_k) / N), u_k uniform in [0, 1): one instant in
// each of N equal slices of the window J. Release instants rise with arrival order, so the core's FIFO
// head-of-line admission never holds a waiter past its instant by more than its predecessors' (also rising)
// instants, and the spread stays uniform whatever N is. N counts sequence numbers, not waiters (some may
// have been granted, cancelled or timed out): gaps only leave some slices empty.
template <class Clock>
struct quota_gate_policy {
  using time_point = typename Clock::time_point;
  using duration = typename Clock::duration;
  static constexpr bool needs_time = true;

  // Configuration.
  duration max_pause;
  double jitter;
  std::chrono::nanoseconds max_jitter;
  std::uint64_t seed;
  std::shared_ptr<quota_tickets<typename Clock::rep>> tickets;  // the gate's counter

  // The pause.
  time_point paused_until = time_point::min();
  time_point pause_started = time_point::min();  // when the gate last went from open to paused
  std::uint64_t pause_requests = 0;
  std::uint64_t pauses = 0;
  std::uint64_t capped = 0;

  // The release batch of the latest pause end.
  bool batch_valid = false;
  time_point batch_end{};
  std::chrono::nanoseconds batch_window{0};
  std::uint64_t batch_first = 0;
  std::uint64_t batch_last = 0;

  quota_gate_policy(duration max_pause_, double jitter_, std::chrono::nanoseconds max_jitter_, std::uint64_t seed_,
                    std::shared_ptr<quota_tickets<typename Clock::rep>> tickets_) noexcept
      : max_pause(max_pause_), jitter(jitter_), max_jitter(max_jitter_), seed(seed_), tickets(std::move(tickets_)) {}

  bool exceeds(std::size_t) const noexcept { return false; }

  observed_state observe(time_point now) const noexcept {
    observed_state s;
    s.paused = now < paused_until;
    // Saturated: a reading as early as time_point::min() is further from the pause's end than nanoseconds hold.
    if (s.paused) s.pause_left = std::chrono::nanoseconds(ns_between(to_ns_saturated(paused_until), to_ns_saturated(now)));
    return s;
  }

  bool try_take(std::size_t ticket, time_point now) noexcept {
    if (now < paused_until) return false;
    if (!jittered(ticket)) return true;
    if (!batch_valid) start_batch(sequence(ticket));
    return now >= release_at(sequence(ticket));
  }

  time_point ready_at(std::size_t ticket, time_point now) const noexcept {
    if (now < paused_until) return paused_until;
    if (jittered(ticket) && batch_valid) return release_at(sequence(ticket));
    return now;
  }

  // A lower bound: nobody passes before the pause ends (pauses never shorten; one of time_point::max() never
  // ends), and after it the jitter is not known yet.
  std::optional<time_point> predict(std::size_t, std::size_t, time_point now) const noexcept {
    if (now < paused_until) return paused_until;
    return std::nullopt;
  }

  void on_release(std::size_t, std::chrono::nanoseconds, outcome, time_point) noexcept {}

  // A release took nothing, so a cancellation that arrives after it (before the handler ran) may always take
  // it back: the caller then sees operation_aborted, as for a cancellation that came first.
  void on_revoke(std::size_t, time_point) noexcept {}

  // Closes the gate until `t` (cut to now + max_pause), unless it is already closed until then or later.
  void pause_until(time_point t, time_point now) noexcept {
    if (t <= now) return;  // nothing to wait for
    ++pause_requests;
    const time_point limit = add_saturated(now, max_pause);
    if (t > limit) {
      t = limit;
      ++capped;
    }
    if (t <= paused_until) return;  // pauses only extend: the latest deadline wins
    if (now >= paused_until) pause_started = now;
    paused_until = t;
    ++pauses;
    batch_valid = false;  // whoever still waits is released after the new end, in a new batch
  }

 private:
  static bool jittered(std::size_t ticket) noexcept { return (ticket & 1U) != 0; }
  static std::uint64_t sequence(std::size_t ticket) noexcept { return static_cast<std::uint64_t>(ticket) >> 1; }

  void start_batch(std::uint64_t first) noexcept {
    batch_valid = true;
    batch_end = paused_until;
    batch_first = first;
    const std::uint64_t issued = tickets->next_sequence.load(std::memory_order_relaxed) - 1;
    batch_last = issued > first ? issued : first;
    const auto span = std::chrono::duration_cast<std::chrono::nanoseconds>(paused_until - pause_started);
    const double window = std::floor(jitter * static_cast<double>(span.count()));
    batch_window = std::min(max_jitter, std::chrono::nanoseconds(static_cast<std::int64_t>(window)));
  }

  time_point release_at(std::uint64_t s) const noexcept {
    if (s < batch_first || s > batch_last || batch_window.count() == 0) return batch_end;
    const double slices = static_cast<double>(batch_last - batch_first) + 1.0;
    const double position = (static_cast<double>(s - batch_first) + quota_unit(seed, s)) / slices;
    const double offset = std::floor(static_cast<double>(batch_window.count()) * position);
    const auto delay = std::chrono::duration_cast<duration>(std::chrono::nanoseconds(static_cast<std::int64_t>(offset)));
    return add_saturated(batch_end, delay);
  }
};

}  // namespace rein::detail
