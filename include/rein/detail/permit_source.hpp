// The interface a permit reports back to. Not API.
#pragma once

#include <rein/outcome.hpp>

#include <chrono>
#include <cstddef>

namespace rein::detail {

/// What a concurrency limiter implements so that a permit can give its slots back.
///
/// `stamp` is the grant time (nanoseconds since the limiter clock's epoch), so that an adaptive limiter can
/// measure latency from grant to report without the permit knowing the clock type.
class permit_source {
 public:
  virtual void release_permit(std::size_t count, std::chrono::nanoseconds stamp, outcome result) noexcept = 0;
  virtual void permit_created() noexcept {}

 protected:
  ~permit_source() = default;
};

}  // namespace rein::detail
