// One limiter per key (host, tenant, model), made on first use, evicted when idle, with a hard cap on keys.
#pragma once

#include <rein/config.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/detail/format.hpp>
#include <rein/error.hpp>
#include <rein/line_options.hpp>
#include <rein/null_mutex.hpp>
#include <rein/observer.hpp>
#include <rein/wait_stats.hpp>

#include REIN_ASIO_HEADER(execution_context.hpp)

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <tuple>
#include <utility>
#include <vector>

namespace rein {

/// Options of rein::keyed.
struct keyed_options {
  /// Most keys alive at once; a hard bound on memory when keys are sprayed (an attacker inventing host
  /// names). Must be >= 1. Default: 10,000.
  std::size_t max_keys = 10'000;
  /// Live keys examined for eviction each time a new key is made (lazy, bounded cleanup). Default: 2, so
  /// that keys are examined at least as fast as they are made.
  std::size_t sweep_batch = 2;
  /// Live keys examined, at most, to make room when `max_keys` are alive; if none of them is idle the new key
  /// is refused with errc::queue_full. Must be >= 1. Default: 64 (the cost of a refusal under a key spray).
  std::size_t max_scan = 64;
  /// How long a key must go unused before its idle limiter may be evicted, in nanoseconds of the limiter's
  /// clock (`Limiter::clock_type`, std::chrono::steady_clock for a limiter without one); >= 0. A key is used
  /// when get() or find() returns its limiter and when such a handle is released. Lets an adaptive
  /// limiter's learned limit (or an adaptive rate) survive short idle gaps instead of starting again from
  /// its initial limit; memcached and Caffeine call it expire-after-access. A permit kept after its handle
  /// is gone keeps the limiter busy, hence alive, but its release does not count as a use. With max_keys
  /// alive and no key evictable under the TTL, a new key evicts one idle key whose TTL has not run out
  /// (the cap bounds memory; the TTL is a preference). Default: 0, evict as soon as idle (a registry
  /// sprayed with keys frees their memory at once).
  std::chrono::nanoseconds idle_ttl{0};
  /// Names the registry in events, metrics and error messages. Default: none.
  std::string name{};
  /// Called outside the registry's lock with evictions (key_evicted, with the key) and refused keys
  /// (rejected, reason max_keys, with the key); see rein::limiter_observer. Each key's limiter has its own
  /// observer, in the line_options given with its rule. Default: none (no cost).
  limiter_observer observer{};
};

/// Counters of a rein::keyed.
struct keyed_snapshot {
  std::size_t keys = 0;              ///< live keys
  std::uint64_t created_total = 0;   ///< limiters made
  std::uint64_t evicted_total = 0;   ///< idle limiters dropped
  std::uint64_t rejected_total = 0;  ///< new keys refused at the cap (errc::queue_full): reason max_keys
  std::size_t max_keys = 0;          ///< the cap (keyed_options::max_keys)
  double utilisation = 0.0;          ///< keys / max_keys

  /// Calls f(reject_reason, std::uint64_t count) for each reason summed in rejected_total.
  template <class F>
  void for_each_rejected(F&& f) const {
    f(reject_reason::max_keys, rejected_total);
  }
};

/// What a composition admitted through one limiter, in its units, kept with the limiter: rein::throttle
/// reads an upstream's remaining count against them (see throttle_guard::complete). Both counts only grow;
/// `admitted - ended` is what is in flight. Differences are taken modulo 2^64, so neither overflows.
/// @par Thread Safety
/// Atomics: any thread, lock-free.
struct admission_counts {
  std::atomic<std::uint64_t> admitted{0};  ///< units admitted
  std::atomic<std::uint64_t> ended{0};     ///< units of admitted calls that have ended (completed, released)
};

/// One line: `keys=3 max_keys=10000 utilisation=0 created=5 evicted=2 rejected=0`.
inline std::ostream& operator<<(std::ostream& os, const keyed_snapshot& s) {
  os << "keys=" << s.keys << " max_keys=" << s.max_keys << " utilisation=";
  detail::write_number(os, s.utilisation, 4);
  os << " created=" << s.created_total << " evicted=" << s.evicted_total << ' ';
  detail::write_rejected(os, s);
  return os;
}

namespace detail {

/// The clock a keyed registry times idle keys with: the limiter's own (`clock_type`), else the steady clock.
template <class Limiter>
struct keyed_clock {
  using type = std::chrono::steady_clock;
};

template <class Limiter>
  requires requires { typename Limiter::clock_type; }
struct keyed_clock<Limiter> {
  using type = typename Limiter::clock_type;
};

}  // namespace detail

/// rein::keyed's default hash: std::hash<Key>, except for std::string keys, which are hashed as
/// std::string_view (transparent: `is_transparent`), so that a lookup by a view or a literal needs no
/// std::string (C++20 heterogeneous lookup, P0919/P1690). Equal strings hash equal either way: the standard
/// defines std::hash<std::string> as std::hash<std::string_view> of the same characters.
template <class Key>
struct key_hash : std::hash<Key> {};

template <>
struct key_hash<std::string> {
  using is_transparent = void;
  std::size_t operator()(std::string_view key) const noexcept { return std::hash<std::string_view>{}(key); }
};

/// rein::keyed's default key equality: std::equal_to<Key>, except for std::string keys, compared through
/// std::equal_to<> (transparent, so a std::string_view is compared without being made a std::string).
template <class Key>
struct key_equal : std::equal_to<Key> {};

template <>
struct key_equal<std::string> : std::equal_to<> {};

}  // namespace rein

#if defined(__GLIBCXX__)
// libstdc++ keeps each node's hash only for a hash it does not deem fast, and deems every user's hash fast:
// a string key would then be hashed again at each step of a bucket walk and compared whole at each
// collision. Ours costs what std::hash<std::string> does, which libstdc++ deems slow; say the same.
template <>
struct std::__is_fast_hash<rein::key_hash<std::string>> : std::false_type {};
#endif

namespace rein {

/// When a limiter may be dropped by rein::keyed: it must be indistinguishable from a new one (nobody waits,
/// nothing is held or used up), so that dropping it and making it again later changes nothing a caller can
/// observe, except counters.
///
/// The primary template uses, in this order: a member `bool idle() const`; else a snapshot with `in_flight`
/// (semaphore, adaptive limiter: nothing held, and for an adaptive limiter its circuit closed; note that an
/// adaptive limiter's learned limit is then lost: an evicted key starts again from its initial limit, which
/// keyed_options::idle_ttl postpones); else a snapshot with `tokens` and `capacity` (token bucket: full);
/// else a snapshot with `in_window` (sliding window: empty); else, for any other rate limiter (rate_limits,
/// adaptive_rate_limiter), its whole capacity available now (an adaptive rate's learned rate is then lost,
/// as an adaptive limiter's limit is). All also need `waiting == 0`. Specialise it for other limiters.
template <class Limiter>
struct idle_traits {
  /// Whether `limiter` holds nothing and nobody waits on it, so that evicting it loses nothing.
  static bool idle(const Limiter& limiter) {
    if constexpr (requires { { limiter.idle() } -> std::convertible_to<bool>; }) {
      return limiter.idle();
    } else {
      const auto s = limiter.snapshot();
      if constexpr (requires { s.in_flight; }) {
        // An adaptive limiter whose circuit is not closed remembers that its dependency is down: a fresh one
        // would send to it again at once.
        if constexpr (requires { s.circuit != decltype(s.circuit){}; })
          if (s.circuit != decltype(s.circuit){}) return false;
        return s.waiting == 0 && s.in_flight == 0;
      } else if constexpr (requires { s.tokens >= s.capacity; }) {
        return s.waiting == 0 && s.tokens >= static_cast<decltype(s.tokens)>(s.capacity);
      } else if constexpr (requires { s.in_window; }) {
        return s.waiting == 0 && s.in_window == 0;
      } else if constexpr (requires { typename Limiter::limit_type; }) {
        // Any other rate limiter (rate_limits, adaptive_rate_limiter): at rest when its whole capacity could
        // be taken now.
        return limiter.inspect([](const typename Limiter::limit_type& limit, const wait_stats& w) {
          const auto now = Limiter::clock_type::now();
          const auto at = limit.ready_at(limit.capacity(), now);
          return w.waiting == 0 && at && *at <= now;
        });
      } else {
        static_assert(sizeof(Limiter) == 0, "rein::idle_traits: specialise it for this limiter");
        return false;
      }
    }
  }
};

/// One limiter per key, made on first use: `keyed<semaphore>` caps calls in flight per host,
/// `keyed<quota_gate>` pauses one host on its 429s, `keyed<token_bucket>` gives each tenant its own rate.
///
/// ```
/// rein::keyed<rein::semaphore> per_host(io, 4);  // semaphore(io, 4) for every host...
/// per_host.set_override("slow-site.example", 1);  // ...but semaphore(io, 1) for this one
/// auto permit = co_await per_host.get(host)->acquire();
/// ```
/// (From tests/async/doc_snippets.cpp, which compiles and runs it.)
///
/// A default and per-key overrides, as a per-provider registry of limiters has them, with
/// the two things a long-running service needs on top: idle keys are evicted, and the number of keys is
/// capped.
///
/// - Creation: a key's limiter is `Limiter(executor, rule, line)`, the shape every rein limiter takes, with
///   the key's override rule and line options if it has some, else those given to the constructor. The
///   registry's own options (rein::keyed_options) come after them: `keyed<semaphore>(io, 4, {.max_waiters =
///   8}, {.max_keys = 1000})`.
/// - Eviction: a limiter that is idle (see rein::idle_traits: indistinguishable from a fresh one), not
///   pinned by a handle, and unused for `idle_ttl` (default 0) may be dropped, lazily: each new key examines
///   `sweep_batch` live keys in a circular order, and sweep() examines as many as asked. Eviction is
///   invisible to callers (a new limiter is made on the next use) except that its counters restart.
/// - The cap: with `max_keys` alive, a new key examines up to `max_scan` keys and evicts the idle ones; if
///   that makes no room it is refused: get() throws, or reports, errc::queue_full (backpressure, like a full
///   waiting line). Existing keys are always served. The circular order makes repeated attempts examine
///   different keys.
/// - Handles: get() returns a handle that pins the limiter: it is not evicted while any handle to it lives,
///   so a reference taken from a handle is valid while the handle lives. Keep the handle until the operation
///   you start on the limiter has completed: a waiter keeps a limiter busy, but a grant whose handler has not
///   run yet is invisible to a rate limiter's or quota gate's idle check. `co_await keyed.get(k)->acquire()`
///   does this by itself (the temporary handle lives to the end of the full expression, the co_await
///   included); a permit that outlives the handle keeps a concurrency limiter busy, hence alive.
///
/// @tparam Limiter one of rein's limiters, or any type with a `rule_type`, constructible from (executor,
///                 rule_type, rein::line_options), that rein::idle_traits understands; need not be movable.
///                 A limiter that takes more (an adaptive limiter's rein::adaptive_limiter_options: its
///                 circuit) gets them after the registry's options, for every key or per override.
/// @tparam Key     the key (std::string by default), hashable with Hash.
/// @tparam Mutex   std::mutex (default): safe from many threads; rein::null_mutex: one thread or strand only.
/// @tparam Hash, KeyEqual  rein::key_hash and rein::key_equal by default. When both are transparent
///                 (`is_transparent`, as the defaults are for std::string), the member functions take the
///                 key as a `std::string_view` (key_view): a lookup of a live key makes no copy of it and
///                 allocates nothing; only a new key is copied into the registry.
///
/// @par Thread Safety
/// With std::mutex, every member function may be called concurrently, except destruction; handles may be
/// destroyed on any thread. With null_mutex, all use must happen on one thread or strand.
///
/// @par Lifetime
/// Not copyable or movable. Destroying it destroys every limiter (their waiters complete with
/// operation_aborted). A handle may outlive the keyed object (a throttle guard in a coroutine frame that the
/// io_context destroys after the stages): it may then only be reset or destroyed, which is safe.
template <class Limiter, class Key = std::string, class Mutex = std::mutex, class Hash = key_hash<Key>,
          class KeyEqual = key_equal<Key>>
class keyed {
  struct entry;
  static constexpr bool heterogeneous_ = std::is_same_v<Key, std::string> &&
                                         requires { typename Hash::is_transparent; } &&
                                         requires { typename KeyEqual::is_transparent; };

 public:
  /// The limiter made for each key.
  using limiter_type = Limiter;
  /// The key type.
  using key_type = Key;
  /// How member functions take a key: `std::string_view` when the registry looks string keys up without
  /// copying them (see Hash, KeyEqual), else `const Key&`.
  using key_view = std::conditional_t<heterogeneous_, std::string_view, const Key&>;
  /// The executor that runs completion handlers without an associated executor of their own.
  using executor_type = typename Limiter::executor_type;
  /// The rule each key's limiter takes (`Limiter::rule_type`: a semaphore's permits, a bucket's
  /// token_bucket_options, ...).
  using rule_type = typename Limiter::rule_type;
  /// The clock that times `keyed_options::idle_ttl`: the limiter's `clock_type`, else the steady clock.
  using clock_type = typename detail::keyed_clock<Limiter>::type;
  /// A key's limiter's snapshot type.
  using snapshot_type = decltype(std::declval<const Limiter&>().snapshot());
  /// The registry's own snapshot type.
  using registry_snapshot_type = keyed_snapshot;

  /// A pin on one key's limiter: while it lives, the limiter is not evicted. Move-only; an empty handle
  /// (default-constructed, moved-from, or a refused get) holds nothing.
  class handle {
   public:
    handle() noexcept = default;
    /// Takes over `other`'s pin; `other` becomes empty.
    handle(handle&& other) noexcept : entry_(std::exchange(other.entry_, nullptr)), use_(other.use_) {}
    /// Releases this pin, then takes over `other`'s; `other` becomes empty.
    handle& operator=(handle&& other) noexcept {
      if (this != &other) {
        reset();
        entry_ = std::exchange(other.entry_, nullptr);
        use_ = other.use_;
      }
      return *this;
    }
    handle(const handle&) = delete;
    handle& operator=(const handle&) = delete;
    ~handle() { reset(); }

    /// Whether the handle holds a limiter.
    explicit operator bool() const noexcept { return entry_ != nullptr; }
    /// The limiter; precondition: the handle is not empty.
    Limiter& operator*() const noexcept { return *entry_->limiter; }
    /// The limiter; precondition: the handle is not empty.
    Limiter* operator->() const noexcept { return entry_->limiter.get(); }
    /// The limiter, or nullptr for an empty handle.
    Limiter* get() const noexcept { return entry_ ? entry_->limiter.get() : nullptr; }
    /// The key (valid while the handle holds it).
    const Key& key() const noexcept { return *entry_->key; }
    /// Counts kept with the key for compositions over the registry, at 0 when the key's limiter is made
    /// and living as long as it does: rein::throttle counts there the units its admissions took from the
    /// key's rate limiter, and those of the calls that ended, so that an upstream's remaining count can be
    /// read against the calls in flight. Precondition: the handle is not empty.
    admission_counts& admissions() const noexcept { return entry_->admissions; }

    /// Unpins now (a use of the key, for keyed_options::idle_ttl).
    void reset() noexcept {
      if (entry_ == nullptr) return;
      entry* e = std::exchange(entry_, nullptr);
      if (use_ && e->timed) e->used_ns.store(now_ns(), std::memory_order_relaxed);  // ordered by the unpin
      e->unpin();
    }

   private:
    friend class keyed;
    handle(entry* e, bool use) noexcept : entry_(e), use_(use) { entry_->refs.fetch_add(1, std::memory_order_relaxed); }
    entry* entry_ = nullptr;
    bool use_ = false;  // its release is a use of the key (get and find; not for_each's pins)
  };

  /// Makes an empty registry; each key's limiter will be `Limiter(ex, rule, line)` unless overridden.
  /// The rule and line options are checked here, by making one limiter from them and discarding it (rein's
  /// local limiters do nothing observable when made: no timer, no I/O, until first used), so that bad
  /// options fail where they are given, not at the first get() of some key.
  /// @throws std::invalid_argument naming the field and value when an option is out of range, and whatever
  ///         `Limiter(ex, rule, line)` throws.
  keyed(const executor_type& ex, rule_type rule, line_options line = {}, const keyed_options& options = {})
      : executor_(ex),
        options_(validated(options)),
        line_(line),
        default_factory_(checked(factory_for(std::move(rule), std::move(line)), ex)) {}

  /// As above, with more arguments for each key's limiter after its line options, kept and passed to every
  /// one: an adaptive limiter's rein::adaptive_limiter_options (its circuit, idle restart and classifier),
  /// `keyed<adaptive_limiter>(io, algorithm, line, keyed_opts, rein::adaptive_limiter_options{...})`.
  template <class First, class... More>
  keyed(const executor_type& ex, rule_type rule, line_options line, const keyed_options& options, First&& first,
        More&&... more)
      : executor_(ex),
        options_(validated(options)),
        line_(line),
        default_factory_(checked(factory_for(std::move(rule), std::move(line), std::forward<First>(first),
                                             std::forward<More>(more)...),
                                 ex)) {}

  /// As above, on an execution context (an io_context).
  template <class ExecutionContext, class... More>
    requires std::is_convertible_v<ExecutionContext&, net::execution_context&>
  keyed(ExecutionContext& context, rule_type rule, line_options line = {}, const keyed_options& options = {},
        More&&... more)
      : keyed(executor_type(context.get_executor()), std::move(rule), std::move(line), options,
              std::forward<More>(more)...) {}

  keyed(const keyed&) = delete;
  keyed& operator=(const keyed&) = delete;

  ~keyed();

  /// The executor given at construction.
  executor_type get_executor() const noexcept { return executor_; }

  /// Makes future limiters of `key` as `Limiter(ex, rule, line)` (without `line`: the registry's line
  /// options, as given at construction, so that an override of the rule keeps the name, observer and
  /// max_waiters every key has). A limiter already alive for `key` keeps its settings until it is evicted
  /// (references to it may be in use).
  /// @throws whatever `Limiter(ex, rule, line)` throws (std::invalid_argument for bad options), checked here
  ///         by making one limiter and discarding it; the override is then not set.
  void set_override(key_view key, rule_type rule) { set_override(key, std::move(rule), line_); }

  /// As above, with the override's own line options, and the limiter's further arguments if it takes any
  /// (an adaptive limiter's rein::adaptive_limiter_options: a circuit for this key alone).
  template <class... More>
  void set_override(key_view key, rule_type rule, line_options line, More&&... more) {
    auto make = checked(factory_for(std::move(rule), std::move(line), std::forward<More>(more)...), executor_);
    std::lock_guard<Mutex> lock(mutex_);
    if (auto it = overrides_.find(key); it != overrides_.end()) it->second = std::move(make);
    else overrides_.emplace(Key(key), std::move(make));
  }

  /// Forgets `key`'s override (future limiters get the defaults). Returns whether there was one.
  bool erase_override(key_view key) {
    std::lock_guard<Mutex> lock(mutex_);
    auto it = overrides_.find(key);
    if (it == overrides_.end()) return false;
    overrides_.erase(it);
    return true;
  }

  /// The limiter of `key`, made now if it is not alive. A live key is found without copying it and without
  /// allocating (for string keys under the default Hash and KeyEqual); a new key is copied once.
  /// @throws rein::system_error with errc::queue_full if `key` is new and max_keys are alive and busy; any
  ///         exception of the limiter's constructor.
  handle get(key_view key);

  /// The name given in the options (empty if none).
  const std::string& name() const noexcept { return options_.name; }

  /// As get(key), reporting a refusal through `ec` (errc::queue_full) and an empty handle.
  handle get(key_view key, error_code& ec);

  /// The limiter of `key` if it is alive; an empty handle otherwise. Never makes one.
  handle find(key_view key) {
    std::lock_guard<Mutex> lock(mutex_);
    auto it = map_.find(key);
    return it == map_.end() ? handle() : used(it->second);
  }

  /// `key`'s limiter's snapshot, or nullopt if it is not alive (an evicted key reads as a fresh one would).
  std::optional<snapshot_type> snapshot(key_view key) const {
    std::lock_guard<Mutex> lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    return it->second.limiter->snapshot();
  }

  /// Calls `f(const Key&, Limiter&)` for every live key (for metrics), without holding the registry's lock:
  /// each limiter is pinned during its call, so `f` may use this registry and may await nothing (it is a
  /// plain function). Keys made or evicted meanwhile may or may not be visited.
  template <class F>
  void for_each(F&& f) {
    std::vector<handle> pinned;
    {
      std::lock_guard<Mutex> lock(mutex_);
      pinned.reserve(map_.size());
      for (auto& [key, e] : map_) {
        (void)key;
        pinned.push_back(handle(&e, false));
      }
    }
    for (handle& h : pinned) f(h.key(), *h);
  }

  /// Examines up to `budget` live keys (in the circular order new keys also use) and evicts the idle,
  /// unpinned ones unused for `idle_ttl`. Returns how many were evicted. `sweep()` examines every key once.
  std::size_t sweep(std::size_t budget = std::numeric_limits<std::size_t>::max()) {
    events pending(this);
    std::lock_guard<Mutex> lock(mutex_);
    return examine_locked(budget, pending);
  }

  /// Live keys.
  std::size_t size() const {
    std::lock_guard<Mutex> lock(mutex_);
    return map_.size();
  }

  /// Whether `key` has a live limiter.
  bool contains(key_view key) const {
    std::lock_guard<Mutex> lock(mutex_);
    return map_.find(key) != map_.end();
  }

  /// Counters, copied under the lock.
  keyed_snapshot snapshot() const {
    std::lock_guard<Mutex> lock(mutex_);
    keyed_snapshot s = stats_;
    s.keys = map_.size();
    s.max_keys = options_.max_keys;
    s.utilisation = static_cast<double>(s.keys) / static_cast<double>(s.max_keys);
    return s;
  }

  /// The former name of snapshot().
  [[deprecated("use snapshot()")]] keyed_snapshot stats() const { return snapshot(); }

  /// Calls `f(const Key&, const snapshot_type&)` for at most `limit` live keys (for metrics: a cap on label
  /// cardinality), in the registry's iteration order, each key's snapshot taken while it is pinned. Returns
  /// how many keys were visited.
  template <class F>
  std::size_t for_each_snapshot(F&& f, std::size_t limit = std::numeric_limits<std::size_t>::max()) {
    std::size_t visited = 0;
    for_each([&](const Key& key, Limiter& limiter) {
      if (visited >= limit) return;
      ++visited;
      f(key, static_cast<const Limiter&>(limiter).snapshot());
    });
    return visited;
  }

  /// The registry's options in force (as validated at construction).
  const keyed_options& get_options() const noexcept { return options_; }

 private:
  using factory = std::function<std::unique_ptr<Limiter>(const executor_type&)>;

  // Evicted and refused keys, gathered under the lock and reported after it (declared before the lock).
  // Keys are copied only when there is an observer.
  class events {
   public:
    explicit events(const keyed* owner) noexcept : owner_(owner) {}
    events(const events&) = delete;
    events& operator=(const events&) = delete;
    ~events() {
      for (auto& [kind, key] : items_) {
        limiter_event e;
        e.kind = kind;
        e.name = owner_->options_.name;
        if (kind == event_kind::rejected) e.reason = reject_reason::max_keys;
        if constexpr (std::is_convertible_v<const Key&, std::string_view>) e.key = key;
        try {
          owner_->options_.observer(e);
        } catch (...) {
        }
      }
    }
    void evicted(const Key& key) { add(event_kind::key_evicted, key); }
    void refused(key_view key) { add(event_kind::rejected, key); }

   private:
    void add(event_kind kind, key_view key) {
      if (!owner_->options_.observer) return;
      try {
        items_.emplace_back(kind, Key(key));
      } catch (...) {  // no memory for the event: the counters still have it
      }
    }
    const keyed* owner_;
    std::vector<std::pair<event_kind, Key>> items_;
  };

  // A live key. Entries live in the map's nodes (stable addresses) and form a circular list, the "clock"
  // that eviction walks, so that successive examinations visit different keys. An entry is counted by the
  // registry (one) and by each handle. A registry destroyed while handles are out moves each pinned entry's
  // node out of the map into `holder`, and the last handle deletes it, so that a handle that outlives the
  // registry (a guard in a coroutine frame that the io_context destroys after the stages) unpins safely.
  struct entry {
    std::unique_ptr<Limiter> limiter;
    std::atomic<std::size_t> refs{1};
    void* holder = nullptr;                 // the node, once the registry is gone
    void (*drop_holder)(void*) = nullptr;
    bool timed = false;                   // idle_ttl > 0: uses are timed
    std::atomic<std::int64_t> used_ns{0};  // the latest use, in clock_type's nanoseconds since its epoch
    admission_counts admissions;  // handle::admissions()
    const Key* key = nullptr;
    entry* prev = nullptr;
    entry* next = nullptr;

    // Pinned by a handle: more than the registry's count.
    bool pinned() const noexcept { return refs.load(std::memory_order_acquire) != 1; }
    // Drops one count; the last one deletes the entry's node (the registry has let it go by then).
    void unpin() noexcept {
      if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) drop_holder(holder);
    }
  };

  template <class... More>
  static factory factory_for(rule_type rule, line_options line, More&&... more) {
    // The arguments are kept in the factory and passed as lvalues (copied) at each creation.
    return [rule = std::move(rule), line = std::move(line),
            more = std::make_tuple(std::decay_t<More>(std::forward<More>(more))...)](const executor_type& ex) {
      return std::apply([&](const auto&... m) { return std::make_unique<Limiter>(ex, rule, line, m...); }, more);
    };
  }

  static factory checked(factory make, const executor_type& ex);

  entry* create_locked(key_view key) {
    auto factory_it = overrides_.find(key);
    std::unique_ptr<Limiter> limiter = factory_it != overrides_.end() ? factory_it->second(executor_) : default_factory_(executor_);
    auto [it, inserted] = map_.try_emplace(Key(key));  // the one copy of a new key
    (void)inserted;
    entry& e = it->second;
    e.limiter = std::move(limiter);
    e.key = &it->first;
    e.timed = timed();
    link_locked(&e);
    ++stats_.created_total;
    return &e;
  }

  void link_locked(entry* e) noexcept {
    if (hand_ == nullptr) {
      e->prev = e->next = e;
      hand_ = e;
      return;
    }
    // Just behind the hand: a new key is examined last.
    e->next = hand_;
    e->prev = hand_->prev;
    hand_->prev->next = e;
    hand_->prev = e;
  }

  void unlink_locked(entry* e) noexcept {
    if (e->next == e) {
      hand_ = nullptr;
      return;
    }
    e->prev->next = e->next;
    e->next->prev = e->prev;
    if (hand_ == e) hand_ = e->next;
  }

  static std::int64_t now_ns() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now().time_since_epoch()).count();
  }

  bool timed() const noexcept { return options_.idle_ttl > std::chrono::nanoseconds::zero(); }

  // A handle on `e`, which counts as a use.
  handle used(entry& e) noexcept {
    if (e.timed) e.used_ns.store(now_ns(), std::memory_order_relaxed);
    return handle(&e, true);
  }

  // Walks up to `budget` entries from the hand, evicting the idle and unpinned ones (and, with
  // `honour_ttl`, unused for idle_ttl), at most `most` of them.
  std::size_t examine_locked(std::size_t budget, events& pending, bool honour_ttl = true,
                             std::size_t most = std::numeric_limits<std::size_t>::max()) {
    std::size_t evicted = 0;
    const bool ttl = honour_ttl && timed();
    const std::int64_t now = ttl ? now_ns() : 0;
    for (std::size_t seen = 0, live = map_.size();
         seen < budget && seen < live && hand_ != nullptr && evicted < most; ++seen) {
      entry* e = hand_;
      hand_ = e->next;
      // The count is read first: a handle is only made under our lock, so an unpinned entry stays so, and the
      // acquire pairs with the release of the last handle's reset (whatever it did to the limiter is visible,
      // and so is the use it recorded).
      if (e->pinned()) continue;
      if (ttl && now - e->used_ns.load(std::memory_order_relaxed) < options_.idle_ttl.count()) continue;
      if (!idle_traits<Limiter>::idle(*e->limiter)) continue;
      unlink_locked(e);
      pending.evicted(*e->key);
      map_.erase(map_.find(*e->key));  // by iterator: the key argument would live in the erased node
      ++evicted;
      ++stats_.evicted_total;
    }
    return evicted;
  }

  static const keyed_options& validated(const keyed_options& o);

  executor_type executor_;
  keyed_options options_;
  line_options line_;  // every key's, unless an override gives its own (immutable)
  factory default_factory_;
  mutable Mutex mutex_;
  using map_type = std::unordered_map<Key, entry, Hash, KeyEqual>;
  map_type map_;
  std::unordered_map<Key, factory, Hash, KeyEqual> overrides_;
  entry* hand_ = nullptr;
  keyed_snapshot stats_{};
};

// Members defined outside the class, so that REIN_SEPARATE_COMPILATION compiles them in one unit only: a
// unit that declares the class extern then neither instantiates them nor copies them in (config.hpp).
template <class Limiter, class Key, class Mutex, class Hash, class KeyEqual>
REIN_SEPARATE_INLINE auto keyed<Limiter, Key, Mutex, Hash, KeyEqual>::get(key_view key) -> handle {
  error_code ec;
  handle h = get(key, ec);
  if (ec) throw system_error(ec, options_.name.empty() ? std::string("rein::keyed::get")
                                                        : "rein::keyed \"" + options_.name + "\"::get");
  return h;
}

template <class Limiter, class Key, class Mutex, class Hash, class KeyEqual>
REIN_SEPARATE_INLINE auto keyed<Limiter, Key, Mutex, Hash, KeyEqual>::get(key_view key, error_code& ec) -> handle {
  ec = {};
  events pending(this);
  std::lock_guard<Mutex> lock(mutex_);
  if (auto it = map_.find(key); it != map_.end()) return used(it->second);
  examine_locked(options_.sweep_batch, pending);
  if (map_.size() >= options_.max_keys) examine_locked(options_.max_scan, pending);
  if (map_.size() >= options_.max_keys && timed())
    examine_locked(options_.max_scan, pending, false, 1);  // the cap wins over the TTL, for one key
  if (map_.size() >= options_.max_keys) {
    ++stats_.rejected_total;
    ec = errc::queue_full;
    pending.refused(key);
    return {};
  }
  return used(*create_locked(key));
}

template <class Limiter, class Key, class Mutex, class Hash, class KeyEqual>
REIN_SEPARATE_INLINE keyed<Limiter, Key, Mutex, Hash, KeyEqual>::~keyed() {
  using node = typename map_type::node_type;
  std::lock_guard<Mutex> lock(mutex_);
  for (auto it = map_.begin(); it != map_.end();) {
    entry& e = it->second;
    if (!e.pinned()) {
      ++it;  // goes with the map
      continue;
    }
    e.limiter.reset();  // its waiters complete with operation_aborted, as every other key's do
    auto next = std::next(it);
    e.holder = new node(map_.extract(it));  // the entry stays where it is, in its node
    e.drop_holder = [](void* n) { delete static_cast<node*>(n); };
    e.unpin();  // the registry's count: a handle still out deletes the node when it lets go
    it = next;
  }
}

template <class Limiter, class Key, class Mutex, class Hash, class KeyEqual>
REIN_SEPARATE_INLINE auto keyed<Limiter, Key, Mutex, Hash, KeyEqual>::checked(factory make,
                                                                              const executor_type& ex) -> factory {
  (void)make(ex);  // throws for arguments no limiter can be made from
  return make;
}

template <class Limiter, class Key, class Mutex, class Hash, class KeyEqual>
REIN_SEPARATE_INLINE const keyed_options& keyed<Limiter, Key, Mutex, Hash, KeyEqual>::validated(
    const keyed_options& o) {
  if (o.max_keys < 1) throw std::invalid_argument("rein::keyed: max_keys must be >= 1, got 0");
  if (o.max_scan < 1) throw std::invalid_argument("rein::keyed: max_scan must be >= 1, got 0");
  if (o.idle_ttl < std::chrono::nanoseconds::zero())
    throw std::invalid_argument("rein::keyed: idle_ttl must be >= 0, got " + std::to_string(o.idle_ttl.count()) +
                                " ns");
  return o;
}

/// `keyed<limiter>` of a default limiter, compiled once with REIN_SEPARATE_COMPILATION (rein/config.hpp):
/// declared extern by whichever of this header and the limiter's own comes second.
#define REIN_DETAIL_KEYED_INSTANTIATION(kind, limiter) kind template class keyed<limiter>;

#if defined(REIN_SEPARATE_COMPILATION)
#if defined(REIN_DETAIL_SEMAPHORE_INSTANTIATIONS)
REIN_DETAIL_KEYED_INSTANTIATION(extern, semaphore)
#endif
#if defined(REIN_DETAIL_QUOTA_GATE_INSTANTIATIONS)
REIN_DETAIL_KEYED_INSTANTIATION(extern, quota_gate)
#endif
#if defined(REIN_DETAIL_TOKEN_BUCKET_INSTANTIATIONS)
REIN_DETAIL_KEYED_INSTANTIATION(extern, token_bucket)
#endif
#endif

}  // namespace rein
