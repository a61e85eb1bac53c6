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
  /// A permit gives its `count` slots back (exactly once per permit object).
  virtual void release_permit(std::size_t count, std::chrono::nanoseconds stamp, outcome result) noexcept = 0;

  /// A permit was split in two (permit::split): one more permit object will report back. Grants are counted
  /// by the limiter itself; only a split adds a holder the limiter did not see.
  virtual void permit_split() noexcept = 0;

  /// A composition that held a permit while its caller waited elsewhere (a throttle's later stages) moves
  /// the permit's stamp from `from` to `to`, the moment the call was sent, so that the latency measured is
  /// the call's own. Only limiters that file grants by stamp need to know.
  virtual void restamp_permit(std::chrono::nanoseconds from, std::chrono::nanoseconds to) noexcept {
    (void)from;
    (void)to;
  }

 protected:
  ~permit_source() = default;
};

}  // namespace rein::detail
