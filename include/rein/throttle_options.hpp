// The options of a throttle (rein/throttle.hpp): names, the default pause, fair weights, which stages learn
// a rejection, the observer.
#pragma once

#include <rein/config.hpp>
#include <rein/observer.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace rein {

/// Which stages learn from a rejection (`guard.reject()`, or `complete(response)` with a 429 or a 503 with
/// Retry-After; also `complete_http(429)`, which pauses nothing). A rejection is a rate signal about one
/// key: the key's gates pause, and its own adaptive stages learn congestion. The
/// question is whether the global stages learn it too: if they do, one host's 429 cuts the global limit,
/// and so the share, of every host.
enum class rejection_feedback : std::uint8_t {
  /// A global stage learns a rejection only if the throttle has no keyed stage of its kind (a global
  /// concurrency limit, when no per-key concurrency stage exists; a global rate, when no per-key rate
  /// exists): a throttle in front of one upstream keeps learning 429s at its global stages, a throttle in
  /// front of many hosts learns them per host.
  automatic,
  /// Only keyed stages learn a rejection; global stages record nothing (outcome::ignored).
  per_key,
  /// Every stage learns a rejection as congestion.
  everywhere,
};

/// Options of a throttle.
struct throttle_options {
  /// The pause applied by `guard.reject()` when the upstream gave no usable Retry-After (1 to 5 s is
  /// usual). Must be > 0.
  std::chrono::nanoseconds default_pause{std::chrono::seconds(1)};
  /// Names the throttle in events, metrics and error messages. Default: none.
  std::string name{};
  /// The weight of a key on a global stage whose options chose `order = queue_order::fair` (see
  /// rein::queue_order::fair): while keys wait there, each is served its weight's share of the units the
  /// stage grants. Called with the caller's key when it starts to wait at such a stage: on the awaiting
  /// coroutine's thread (acquire), or on the completion handler's executor (async_acquire), so possibly from
  /// several threads at once; must not block or use the throttle. 0 counts as 1, more than 1,000,000 as
  /// 1,000,000, and a throw as 1. Default: none (every key weight 1). Keyed stages ignore it (each key waits
  /// on its own limiter); a throttle given a key_weight but no global stage in fair order throws
  /// std::invalid_argument when built.
  std::function<std::uint32_t(std::string_view key)> key_weight{};
  /// Which stages learn from guard.reject() (see rein::rejection_feedback). Default: automatic.
  rejection_feedback rejections = rejection_feedback::automatic;
  /// Called with every rejection (reason gate, rate, per_key or global for a try_acquire refused at that
  /// stage; admission for a call an admission stage refused, on any door; timed_out, queue_full, closed,
  /// exceeds_capacity, unavailable or overloaded for a waiting acquire that failed; cancelled),
  /// on the caller's thread, never under a lock; see rein::limiter_observer. Each stage's limiter has its own
  /// observer too. Default: none (no cost).
  limiter_observer observer{};
};

}  // namespace rein
