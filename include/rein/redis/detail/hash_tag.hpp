// Redis Cluster's hash tag of a key: the part that decides its slot. Not API.
#pragma once

#include <string_view>

namespace rein::redis::detail {

/// What lies between the key's first '{' and the next '}', if that is not empty; else empty (then the
/// whole key decides the slot). The rule of the Redis Cluster specification.
constexpr std::string_view hash_tag(std::string_view key) noexcept {
  const auto open = key.find('{');
  if (open == std::string_view::npos) return {};
  const auto close = key.find('}', open + 1);
  if (close == std::string_view::npos || close == open + 1) return {};
  return key.substr(open + 1, close - open - 1);
}

}  // namespace rein::redis::detail
