// A seed for jitter that differs between processes. Not API.
#pragma once

#include <rein/config.hpp>

#include <cstdint>

namespace rein::detail {

/// 64 bits drawn from std::random_device, so that processes sharing an upstream do not jitter in lockstep.
/// Throws what std::random_device throws when the platform has no source.
REIN_DECL std::uint64_t random_seed();

}  // namespace rein::detail

#if !defined(REIN_SEPARATE_COMPILATION)
#include <rein/impl/random_seed.ipp>
#endif
