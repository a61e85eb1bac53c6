// 64 random bits for seeds and ids. Not API.
#pragma once

#include <rein/config.hpp>

#include <cstdint>

namespace rein::detail {

/// 64 bits drawn from std::random_device, each call anew: jitter seeds that differ between processes (so that
/// processes sharing an upstream do not retry or resume in lockstep), and the Redis semaphore's lease names,
/// which must not repeat across processes. Keep it a real source of entropy for the latter: a weaker
/// fallback would make two processes' leases collide. Throws what std::random_device throws when the
/// platform has no source.
REIN_DECL std::uint64_t random_seed();

}  // namespace rein::detail

#if !defined(REIN_SEPARATE_COMPILATION)
#include <rein/impl/random_seed.ipp>
#endif
