// The virtual clock of a line in queue_order::fair: start-time fair queueing over its waiters. Not API; the
// line (limiter_core.hpp) keeps one and asks it under its lock.
//
// The rule (start-time fair queueing, Goyal, Vin and Cheng, SIGCOMM 1996; a deficit round robin whose
// rounds are as fine as one request): a waiter of key k asking n units at weight w gets the start tag
// S = max(V, F_k) and advances the key's finish tag F_k = S + n / w; the line serves waiters by start tag,
// smallest first, the earlier arrival first on equal tags; V is the start tag of the last waiter served, or
// of the first waiter if that is larger (a key that was idle joins the round being served: behind its
// first waiter, so that a stream of new keys cannot keep passing a weighted head that waits to fit).
// A key with waiters therefore gets its weight's share of what is granted from the line, whatever its
// arrival rate: between two backlogged keys i and j the service (units / weight) granted in any interval
// differs by at most n_i / w_i + n_j / w_j, one request of each. A key that was idle comes back at V with
// no credit saved up (a key cannot hoard its share while it waits for nothing).
//
// Only waiters are scheduled: a grant made at once to an empty line takes no tag. When the line empties,
// every key is idle and the clock starts again from zero (the tags only order waiters, so nothing is
// lost), which also bounds the table by the keys seen within one busy period; a table that a busy period
// left much larger than the next one needs is given back then.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace rein::detail {

class fair_schedule {
 public:
  /// The start tag a new waiter of `key` gets: max(V, F_k). Makes room for the key first, so that
  /// admitted() cannot fail: throws std::bad_alloc only for a key new to a full table, changing nothing
  /// the line can see (an entry with no finish tag yet reads as none).
  double start_tag(std::uint64_t key) { return std::max(now_, find_or_insert(key).finish); }

  /// The waiter of `key` at `weight`, given `tag` by start_tag and asking n, joined the line: the key's
  /// finish tag moves past it.
  void admitted(std::uint64_t key, std::uint32_t weight, double tag, std::size_t n) noexcept {
    slot* s = probe(slots_, key);  // start_tag made it, and nothing was inserted since
    s->finish = tag + static_cast<double>(n) / static_cast<double>(weight);
  }

  /// V moves to `tag` if that is later: the start tag of a waiter granted (in tag order, or out of it: a
  /// partition below its guarantee), or of the line's first waiter when a new one arrives.
  void advance(double tag) noexcept { now_ = std::max(now_, tag); }

  /// The line emptied: every key is idle. O(1) (the slots of an older epoch read as empty), unless the
  /// table is over 64 slots and 16 times what this busy period's keys needed: then it is freed, so that one
  /// flood of keys does not hold its memory for the limiter's life.
  void idle() noexcept {
    now_ = 0.0;
    const std::size_t peak = std::exchange(peak_, 0);
    if (size_ == 0) return;
    size_ = 0;
    if (slots_.size() > 64 && 16 * peak < slots_.size()) {
      std::vector<slot>().swap(slots_);
      return;
    }
    if (++epoch_ == 0) {  // wrapped: clear for real, once in 2^32 busy periods
      for (slot& s : slots_) s.epoch = 0;
      epoch_ = 1;
    }
  }

  /// Keys in the table (seen in this busy period, not yet dropped by a rebuild).
  std::size_t keys() const noexcept { return size_; }
  /// Slots of the table (24 bytes each): between 2 and 8 per key of the busiest recent busy period.
  std::size_t capacity() const noexcept { return slots_.size(); }

 private:
  struct slot {
    std::uint64_t key = 0;
    double finish = 0.0;
    std::uint32_t epoch = 0;  // live in epoch_ only
  };

  static std::size_t mix(std::uint64_t k) noexcept {  // splitmix64's finaliser: keys may be plain integers
    k ^= k >> 30;
    k *= 0xbf58476d1ce4e5b9ULL;
    k ^= k >> 27;
    k *= 0x94d049bb133111ebULL;
    k ^= k >> 31;
    return static_cast<std::size_t>(k);
  }

  slot* probe(std::vector<slot>& slots, std::uint64_t key) noexcept {
    const std::size_t mask = slots.size() - 1;
    for (std::size_t i = mix(key) & mask;; i = (i + 1) & mask) {
      slot& s = slots[i];
      if (s.epoch != epoch_ || s.key == key) return &s;
    }
  }

  slot& find_or_insert(std::uint64_t key) {
    if (!slots_.empty()) {
      slot* s = probe(slots_, key);
      if (s->epoch == epoch_) return *s;
    }
    if (2 * (size_ + 1) > slots_.size()) rebuild();
    slot* s = probe(slots_, key);
    *s = slot{key, 0.0, epoch_};
    peak_ = std::max(peak_, ++size_);
    return *s;
  }

  // Drops the keys whose finish tag V has passed (a new waiter of theirs starts at V anyway), then sizes the
  // table for four times the keys left (a power of two), so that a rebuild comes at most once per that many
  // new keys: its allocation is amortised over them.
  void rebuild() {
    std::size_t live = 0;
    for (const slot& s : slots_) live += s.epoch == epoch_ && s.finish > now_;
    std::size_t capacity = 16;
    while (capacity < 4 * (live + 1)) capacity *= 2;
    std::vector<slot> table(capacity);
    for (const slot& s : slots_)
      if (s.epoch == epoch_ && s.finish > now_) *probe(table, s.key) = s;
    slots_.swap(table);
    size_ = live;
  }

  std::vector<slot> slots_;
  std::size_t size_ = 0;
  std::size_t peak_ = 0;  // the most keys at once in this busy period
  std::uint32_t epoch_ = 1;
  double now_ = 0.0;
};

}  // namespace rein::detail
