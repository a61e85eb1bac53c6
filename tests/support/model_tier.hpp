// The tiers of the model checks: a quick one in CI (smaller under a sanitizer, which runs several times
// slower) and a thorough one run by hand with REIN_MODEL_THOROUGH=1.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdlib>
#include <string_view>
#include <utility>
#include <vector>

namespace rein_test {

/// Whether REIN_MODEL_THOROUGH=1 asks for the thorough tier.
inline bool model_thorough() {
  const char* thorough = std::getenv("REIN_MODEL_THOROUGH");
  return thorough != nullptr && std::string_view(thorough) == "1";
}

/// Whether this build runs under AddressSanitizer or ThreadSanitizer.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool under_sanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool under_sanitizer = true;
#else
inline constexpr bool under_sanitizer = false;
#endif
#else
inline constexpr bool under_sanitizer = false;
#endif

/// The scope for a model check: `thorough` by hand, `sanitized` under a sanitizer, `quick` otherwise.
inline int model_scope(int quick, int sanitized, int thorough) {
  if (model_thorough()) return thorough;
  return under_sanitizer ? sanitized : quick;
}

/// Calls `visit(code, sequence)` once for each of the `events`^`depth` sequences of `depth` events, each
/// event one of `events` kinds (0 to events - 1): the exhaustive enumeration of a model check. `code`
/// numbers the sequence for a failure message: its events are code's digits in base `events`, lowest
/// first. Returns how many sequences it visited.
template <class Visit>
long for_each_sequence(int depth, int events, Visit&& visit) {
  assert(depth >= 0 && events >= 1);
  std::vector<int> sequence(static_cast<std::size_t>(depth), 0);
  for (long code = 0;; ++code) {
    visit(code, std::as_const(sequence));
    std::size_t digit = 0;  // the next sequence: add one, carrying
    while (digit < sequence.size() && ++sequence[digit] == events) sequence[digit++] = 0;
    if (digit == sequence.size()) return code + 1;
  }
}

}  // namespace rein_test
