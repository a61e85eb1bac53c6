// The separately compiled part of rein: include this header in exactly one source file of a program built
// with REIN_SEPARATE_COMPILATION defined (rein/config.hpp), as Asio's <asio/impl/src.hpp>.
#pragma once

// Without the define the other units compile rein header-only, and this unit would define what they
// already define inline (or, with the define missing here only, leave the out-of-line functions undefined).
#if !defined(REIN_SEPARATE_COMPILATION)
#error "rein/impl/src.hpp: define REIN_SEPARATE_COMPILATION in every unit of the program, this one included"
#endif

#include <rein/config.hpp>
#include <rein/impl/random_seed.ipp>
#include <rein/impl/throttle.ipp>
#include <rein/keyed.hpp>
#include <rein/quota_gate.hpp>
#include <rein/semaphore.hpp>
#include <rein/token_bucket.hpp>

namespace rein {

REIN_DETAIL_SEMAPHORE_INSTANTIATIONS()
REIN_DETAIL_QUOTA_GATE_INSTANTIATIONS()
REIN_DETAIL_TOKEN_BUCKET_INSTANTIATIONS()
REIN_DETAIL_KEYED_INSTANTIATION(, semaphore)
REIN_DETAIL_KEYED_INSTANTIATION(, quota_gate)
REIN_DETAIL_KEYED_INSTANTIATION(, token_bucket)

}  // namespace rein
