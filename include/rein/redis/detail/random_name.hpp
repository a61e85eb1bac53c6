// A name no other limiter object uses, for what Redis keeps per process: a shared semaphore's lease, a
// shared window's place in the fleet's queue. Not API.
#pragma once

#include <rein/detail/random_seed.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace rein::redis::detail {

/// 128 random bits in hex (rein::detail::random_seed: real entropy, so that two processes' names never meet).
inline std::string random_name() {
  std::string name;
  constexpr std::string_view digits = "0123456789abcdef";
  for (int word = 0; word < 2; ++word) {
    std::uint64_t bits = rein::detail::random_seed();
    for (int i = 0; i < 16; ++i, bits >>= 4) name.push_back(digits[bits & 0xf]);
  }
  return name;
}

}  // namespace rein::redis::detail
