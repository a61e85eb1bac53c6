// The words a throttle's stage list is written in (rein/throttle.hpp): what one call costs (rein::charge) and
// how much of it each stage takes (rein::by_tokens, rein::weighted), a place left empty (rein::unlimited), and
// the kinds of stage a refusal names (rein::throttle_stage).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace rein {

/// Marks a place in a throttle's stage list that holds no stage: `rein::throttle t(rein::unlimited, ...)`.
/// (A stage not used can also be left out of the list.)
struct unlimited_t {
  /// Constructible only explicitly (use the constant rein::unlimited).
  explicit constexpr unlimited_t(int) noexcept {}
};
inline constexpr unlimited_t unlimited{0};

/// What kind of stage refused or failed a throttle acquire. A keyed stage that could not make the caller's key
/// (keyed_options::max_keys reached: errc::queue_full) is reported as its own kind.
enum class throttle_stage : std::uint8_t {
  none,     ///< not rejected
  gate,     ///< a quota gate is paused (a 429 said so)
  rate,     ///< a rate limit had no room for the call's charge
  per_key,  ///< the key's concurrency limit is reached
  global,   ///< a global concurrency limit is reached
  /// an admission stage (rein::admission_throttle) refused the call locally, at once: the backend has been
  /// refusing a share of calls for overload
  admission,
};

/// A readable name of a throttle_stage ("none", "gate", "rate", "per_key", "global", "admission").
constexpr const char* to_string(throttle_stage s) noexcept {
  switch (s) {
    case throttle_stage::none: return "none";
    case throttle_stage::gate: return "gate";
    case throttle_stage::rate: return "rate";
    case throttle_stage::per_key: return "per_key";
    case throttle_stage::global: return "global";
    case throttle_stage::admission: return "admission";
  }
  return "unknown";
}

/// What one call costs, in the units the stages count: `{.requests = 1, .tokens = 1200}` for an LLM call
/// estimated at 1,200 tokens. Each stage takes one of the numbers (see rein::by_tokens, rein::weighted);
/// by default every stage charges `requests`. A concurrency or rate stage charged 0 is passed without being
/// asked (a gate or an admission stage is always asked).
struct charge {
  std::size_t requests = 1;  ///< calls (requests per minute, calls in flight)
  std::size_t tokens = 0;    ///< a second unit: LLM tokens, bytes, cost points (an estimate, see reconcile)
};

/// The weight of a stage that charges `charge::requests` (every stage's default).
struct by_requests_t {
  /// `c.requests`.
  constexpr std::size_t operator()(const charge& c) const noexcept { return c.requests; }
};

/// The weight of a stage that charges `charge::tokens`.
struct by_tokens_t {
  /// `c.tokens`.
  constexpr std::size_t operator()(const charge& c) const noexcept { return c.tokens; }
};

/// A stage with its own weight: `weight(charge)` units are taken from it per call. Made by rein::weighted
/// and rein::by_tokens; refers to the stage (it must outlive the throttle).
template <class Stage, class Weight>
class weighted_stage {
 public:
  /// The stage (a limiter, or a rein::keyed of limiters) and the callable `std::size_t(const charge&)`.
  weighted_stage(Stage& stage, Weight weight) noexcept(std::is_nothrow_move_constructible_v<Weight>)
      : stage_(&stage), weight_(std::move(weight)) {}

  /// The stage.
  Stage& stage() const noexcept { return *stage_; }
  /// The units this stage takes for a call charged `c`.
  std::size_t units(const charge& c) const { return static_cast<std::size_t>(weight_(c)); }

 private:
  Stage* stage_;
  Weight weight_;
};

/// A stage charged `weight(charge)` per call: `rein::weighted(bytes, [](const rein::charge& c) { return
/// c.tokens * 4; })`. `weight` must not throw, block or use the throttle.
template <class Stage, class Weight>
  requires std::is_invocable_r_v<std::size_t, const Weight&, const charge&>
weighted_stage<Stage, Weight> weighted(Stage& stage, Weight weight) {
  return weighted_stage<Stage, Weight>(stage, std::move(weight));
}

/// A stage charged `charge::tokens` per call (a tokens-per-minute budget).
template <class Stage>
weighted_stage<Stage, by_tokens_t> by_tokens(Stage& stage) noexcept {
  return weighted_stage<Stage, by_tokens_t>(stage, by_tokens_t{});
}

}  // namespace rein
