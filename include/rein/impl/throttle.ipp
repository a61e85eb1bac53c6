// Defines the functions rein/throttle.hpp declares REIN_DECL: included by it in header-only builds, by
// rein/impl/src.hpp with REIN_SEPARATE_COMPILATION.
#pragma once

#include <rein/throttle.hpp>

#include <cstddef>
#include <limits>
#include <string>
#include <string_view>

namespace rein::detail {

REIN_DECL throttle_error throttle_failure(const error_code& ec, std::string_view name, std::size_t stage,
                                          throttle_stage kind, const std::string& key) {
  std::string what = "rein::throttle";
  if (!name.empty()) what.append(" \"").append(name).append("\"");
  what += "::acquire";
  if (stage != std::numeric_limits<std::size_t>::max())
    what.append(": stage ").append(std::to_string(stage)).append(" (").append(to_string(kind)).append(")");
  what.append(", key \"").append(key).append("\"");
  return throttle_error(ec, what, stage, kind, key);
}

}  // namespace rein::detail
