// Defines what rein/detail/random_seed.hpp declares: included by it in header-only builds, by
// rein/impl/src.hpp with REIN_SEPARATE_COMPILATION (so that only that unit parses <random>).
#pragma once

#include <rein/detail/random_seed.hpp>

#include <cstdint>
#include <random>

namespace rein::detail {

REIN_DECL std::uint64_t random_seed() {
  std::random_device device;
  return (static_cast<std::uint64_t>(device()) << 32) ^ device();
}

}  // namespace rein::detail
