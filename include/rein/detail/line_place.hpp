// Where an acquire waits on its line, as the doors that made it say. Not API.
#pragma once

#include <cstdint>

namespace rein::detail {

/// An acquire's class in priority order, its partition, and its key and weight in fair order: what
/// at_priority, partition(name) and for_key set on a limiter's doors. 16 bytes, passed in two registers.
/// Its default is all zeros, so that a compiler makes it with one wide store: a default weight of 1 written
/// over a zeroed block, then read back as the 8 bytes around it, stalled every uncontended acquire on g++ 12.
struct line_place {
  std::uint64_t key = 0;       ///< fair order: the hash of the caller's key (0: the limiter's own doors)
  std::uint32_t weight = 0;    ///< fair order: the key's weight, 1 to max_fair_weight; 0: the plain key's 1
  std::uint8_t priority = 0;   ///< priority order: the class, 0 the most urgent
  std::uint8_t partition = 0;  ///< the partition's index; 0: the rest, or none
};

/// The largest weight for_key takes: tags are doubles, so that a share as small as 1 / 1,000,000 of a unit
/// keeps its order within a busy period of up to about 2^32 units granted at weight 1.
inline constexpr std::uint32_t max_fair_weight = 1'000'000;

}  // namespace rein::detail
