// The tiers of the model checks: a quick one in CI (smaller under a sanitizer, which runs several times
// slower) and a thorough one run by hand with REIN_MODEL_THOROUGH=1.
#pragma once

#include <cstdlib>
#include <string_view>

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

}  // namespace rein_test
