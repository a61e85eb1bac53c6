// The lock-free fast path of a thread-safe semaphore: free permits lent out of the locked line. Not API.
//
// One 64-bit word holds what an uncontended acquire and release touch, so that each is one compare-and-swap
// instead of a lock and an unlock of the line's mutex (the scheme of Go's sync.Mutex and tokio's Semaphore:
// a state word, and the slow path only when someone waits):
//
//   bit 63       open: the line lent this word its free permits and nothing needs the lock
//   bits 47..62  holders: permit objects taken minus given back through the word, plus 2^15
//   bits 31..46  acquires: grants made through the word
//   bits 0..30   units: free permits
//
// The line (limiter_core) keeps one rule: while its lock is held, the word is closed, so every locked path
// sees the whole state. Taking the lock reclaims the word (one exchange: its units back to the policy, its
// acquires and holders into the line's counts); releasing the lock lends the free permits again, but only
// while no line state could need the lock for an uncontended call: nobody waits, nothing is owed, no
// observer, no partitions, not closed, not shut down. A closed word is written only under the lock (a
// compare-and-swap here needs the open bit), so the line reads it without an exchange when it is closed, as
// it is throughout a contended stretch.
//
// A call that the word cannot serve (closed, too few units, a counter at its bound) takes the lock and
// finds the whole state there, so the word never decides a refusal: it only grants and takes back. The
// counters' bounds (2^16 acquires, holders within 2^15 of the lent value) are reached only by long runs
// between two locked calls; the locked call that follows folds them into the line.
//
// Linearisation: each call through the word takes effect at its successful compare-and-swap, a reclaim at
// its exchange, so what threads can do is what some sequence of whole calls does. Checked: every sequence of
// six calls of a few callers against a model of the semaphore (tests/async/semaphore.cpp), the word's bounds
// (tests/algo/permit_pool.cpp), and threads racing through it (tests/async/semaphore_stress.cpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace rein::detail {

class permit_pool {
 public:
  /// What a reclaim moved out of the word: free units, grants, and the change in permit objects out.
  struct taken {
    std::size_t units = 0;
    std::uint64_t acquires = 0;
    std::int64_t holders = 0;
  };

  static constexpr std::uint64_t max_units = (std::uint64_t{1} << 31) - 1;

  /// Takes n free permits for one new permit object: false leaves the word as it was.
  bool try_take(std::size_t n) noexcept {
    std::uint64_t old = word_.load(std::memory_order_relaxed);
    for (;;) {
      if (!(old & open_bit) || units(old) < n || field(old, acquire_shift) == field_max ||
          field(old, holder_shift) == field_max)
        return false;
      const std::uint64_t next = old - n + (std::uint64_t{1} << acquire_shift) + (std::uint64_t{1} << holder_shift);
      if (word_.compare_exchange_weak(old, next, std::memory_order_acquire, std::memory_order_relaxed)) return true;
    }
  }

  /// Gives back n permits of one permit object: false leaves the word as it was.
  bool try_give(std::size_t n) noexcept {
    std::uint64_t old = word_.load(std::memory_order_relaxed);
    for (;;) {
      if (!(old & open_bit) || n > max_units - units(old) || field(old, holder_shift) == 0) return false;
      const std::uint64_t next = old + n - (std::uint64_t{1} << holder_shift);
      if (word_.compare_exchange_weak(old, next, std::memory_order_release, std::memory_order_relaxed)) return true;
    }
  }

  /// Under the line's lock: closes the word and returns what it held (nothing if it was closed).
  taken reclaim() noexcept {
    // Closed means written only under the lock, which we hold: no exchange needed to see it stay closed.
    if (!(word_.load(std::memory_order_relaxed) & open_bit)) return {};
    const std::uint64_t old = word_.exchange(0, std::memory_order_acq_rel);
    return {static_cast<std::size_t>(units(old)), field(old, acquire_shift),
            static_cast<std::int64_t>(field(old, holder_shift)) - static_cast<std::int64_t>(holder_base)};
  }

  /// Under the line's lock, with the word closed: lends it `n` units (at most max_units) and opens it.
  void open(std::size_t n) noexcept {
    word_.store(open_bit | (holder_base << holder_shift) | n, std::memory_order_release);
  }

  /// Whether the word is open (for tests; racy outside the lock).
  bool is_open() const noexcept { return (word_.load(std::memory_order_relaxed) & open_bit) != 0; }

 private:
  static constexpr int acquire_shift = 31;
  static constexpr int holder_shift = 47;
  static constexpr std::uint64_t field_max = 0xffff;
  static constexpr std::uint64_t holder_base = 0x8000;
  static constexpr std::uint64_t open_bit = std::uint64_t{1} << 63;

  static std::uint64_t units(std::uint64_t w) noexcept { return w & max_units; }
  static std::uint64_t field(std::uint64_t w, int shift) noexcept { return (w >> shift) & field_max; }

  std::atomic<std::uint64_t> word_{0};
};

}  // namespace rein::detail
