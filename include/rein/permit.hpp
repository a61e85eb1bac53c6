// A granted share of a concurrency limiter, given back on destruction.
#pragma once

#include <rein/completion_hint.hpp>
#include <rein/detail/permit_source.hpp>
#include <rein/outcome.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace rein {

namespace detail {
struct permit_access;
}

/// Move-only RAII handle to `count()` slots of a concurrency limiter (semaphore, adaptive limiter).
///
/// The slots go back to the limiter exactly once: on `complete(outcome)`, on `release()` or on destruction,
/// whichever comes first; afterwards the permit is empty and further calls do nothing. A default-constructed
/// or moved-from permit is empty. Adaptive limiters learn from the outcome; a permit released without one
/// reports `outcome::ignored` (it says nothing about capacity).
///
/// @par Lifetime
/// A permit may outlive the limiter that granted it (as tokio's `OwnedSemaphorePermit` may): the limiter's
/// state stays allocated until its last permit comes back, and giving the permit back then only frees it.
/// The limiter's waiters were completed when it was destroyed, so nobody is granted anything any more.
///
/// @par Thread Safety
/// Distinct permits may be used from any threads; one permit object is not to be used concurrently.
class permit {
 public:
  permit() noexcept = default;

  /// Made by limiters; users receive permits from `acquire`/`try_acquire`. `note` is what the limiter noted
  /// at the grant (see detail::permit_source::release_permit).
  permit(detail::permit_source* source, std::size_t count, std::chrono::nanoseconds stamp,
         std::uint64_t note = 0) noexcept
      : source_(source), count_(count), stamp_(stamp), note_(note) {}

  /// Takes over `other`'s permits; `other` becomes empty (it releases nothing).
  permit(permit&& other) noexcept
      : source_(std::exchange(other.source_, nullptr)),
        count_(std::exchange(other.count_, 0)),
        stamp_(other.stamp_),
        note_(other.note_) {}

  /// Releases this permit's permits, then takes over `other`'s; `other` becomes empty.
  permit& operator=(permit&& other) noexcept {
    if (this != &other) {
      release();
      source_ = std::exchange(other.source_, nullptr);
      count_ = std::exchange(other.count_, 0);
      stamp_ = other.stamp_;
      note_ = other.note_;
    }
    return *this;
  }

  permit(const permit&) = delete;
  permit& operator=(const permit&) = delete;

  ~permit() { release(); }

  /// How many slots this permit holds (0 once released).
  std::size_t count() const noexcept { return count_; }

  /// True while the permit holds its slots.
  explicit operator bool() const noexcept { return source_ != nullptr; }

  /// Gives the slots back and reports how the call went (feeds adaptive limiters; a semaphore ignores it).
  void complete(outcome result) noexcept {
    if (auto* source = std::exchange(source_, nullptr)) source->release_permit(std::exchange(count_, 0), stamp_, note_, result);
  }

  /// As complete(outcome), with what the caller knows of the call besides (rein::completion_hint): an
  /// adaptive limiter's algorithm gets `hint.work` with the call's sample (`algo::basic_sample::work`), so
  /// that a call asked for more work may take longer without being read as a queue; a semaphore ignores it.
  /// `permit.complete(outcome::success, {.work = tokens})`. On an empty permit it only checks the hint.
  ///
  /// @throws std::invalid_argument if `hint.work` is negative, NaN or infinite
  ///   ("rein::completion_hint: work must be >= 0 and finite, got <value>"); checked before anything is
  ///   given back, so the permit still holds its slots and gives them back later, once, as usual.
  void complete(outcome result, const completion_hint& hint) {
    detail::check_hint(hint);
    complete_checked(result, hint.work);
  }

  /// Gives the slots back without an outcome (reported as `outcome::ignored`).
  void release() noexcept { complete(outcome::ignored); }

  /// Moves n of this permit's slots into a new permit, so that they can be given back early and separately
  /// (tokio's `SemaphorePermit::split`; Go's x/sync `Release(n)` gives back part of a weighted acquire).
  /// Both parts keep the grant time (and what the limiter noted at the grant: an adaptive limiter's in-flight
  /// count), and each reports its own outcome when it goes back. n == count() moves
  /// everything (this permit becomes empty); n == 0 returns an empty permit.
  ///
  /// @throws std::invalid_argument if n > count().
  permit split(std::size_t n) {
    if (n > count_)
      throw std::invalid_argument("rein::permit::split: n must be <= count(), got n = " + std::to_string(n) +
                                  " with count() = " + std::to_string(count_));
    if (n == 0) return permit();
    if (n == count_) return std::move(*this);
    source_->permit_split(note_);
    count_ -= n;
    return permit(source_, n, stamp_, note_);
  }

 private:
  friend struct detail::permit_access;

  // complete(outcome, hint) once the hint passed check_hint.
  void complete_checked(outcome result, const std::optional<double>& work) noexcept {
    if (!work) return complete(result);
    if (auto* source = std::exchange(source_, nullptr))
      source->release_permit_with_work(std::exchange(count_, 0), stamp_, note_, result, *work);
  }

  detail::permit_source* source_ = nullptr;
  std::size_t count_ = 0;
  std::chrono::nanoseconds stamp_{};
  std::uint64_t note_ = 0;
};

namespace detail {

// What a composition may change in a permit it holds. Not API.
struct permit_access {
  // What the limiter noted at the grant (0 for an empty permit): for the limiter's own readers of it.
  static std::uint64_t note(const permit& p) noexcept { return p.note_; }

  // complete(result, hint) with a work hint its caller has checked (detail::check_hint): a composition that
  // checks the hint once for all its permits, before it gives any of them back. With no_work, complete(result).
  static void complete(permit& p, outcome result, std::optional<double> work) noexcept {
    p.complete_checked(result, work);
  }
  static void complete(permit& p, outcome result, no_work) noexcept { p.complete(result); }

  // Puts the permit under a lease: it reports back to `source` (the line's leases) with the lease's id as
  // its note (detail/line_leases.hpp).
  static void lease(permit& p, permit_source* source, std::uint64_t id) noexcept {
    p.source_ = source;
    p.note_ = id;
  }

  // Measures the permit's service time (grant to outcome, which adaptive limiters learn from) from `stamp`
  // (nanoseconds since the limiter's clock's epoch) instead of its grant: a throttle that held the permit
  // while it waited at a later stage starts the clock when the call is sent. Only forward: a stamp before the
  // grant would hand the limiter a grant it has not made yet (a half-open circuit would not know its probe).
  static void restamp(permit& p, std::chrono::nanoseconds stamp) noexcept {
    if (p.source_ == nullptr || stamp <= p.stamp_) return;
    p.source_->restamp_permit(p.stamp_, stamp);
    p.stamp_ = stamp;
  }
};

}  // namespace detail
}  // namespace rein
