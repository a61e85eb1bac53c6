// The interface a permit reports back to. Not API.
#pragma once

#include <rein/outcome.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace rein::detail {

/// A release without a work hint: the limiter's code for it is the code it had before hints existed (an
/// empty tag, where a hinted release passes the work as a double).
struct no_work {};

/// What a concurrency limiter implements so that a permit can give its slots back.
///
/// `stamp` is the grant time (nanoseconds since the limiter clock's epoch), so that an adaptive limiter can
/// measure latency from grant to report without the permit knowing the clock type. `note` is what the
/// limiter's policy noted at this very grant (an adaptive limiter: the calls in flight right after it; 0 for
/// policies that note nothing): carried by the permit because the stamp alone cannot tell apart grants made
/// at one instant, and a note filed by stamp is handed back to whichever of them reports first.
class permit_source {
 public:
  /// A permit gives its `count` slots back (exactly once per permit object).
  virtual void release_permit(std::size_t count, std::chrono::nanoseconds stamp, std::uint64_t note,
                              outcome result) noexcept = 0;

  /// As release_permit, with the caller's work hint (`completion_hint::work`, already checked: finite and
  /// >= 0). A source whose policy learns from latency hands it on with the sample; the others ignore it.
  virtual void release_permit_with_work(std::size_t count, std::chrono::nanoseconds stamp, std::uint64_t note,
                                        outcome result, double work) noexcept {
    (void)work;
    release_permit(count, stamp, note, result);
  }

  /// A permit was split in two (permit::split): one more permit object will report back. Grants are counted
  /// by the limiter itself; only a split adds a holder the limiter did not see. `note` is the permit's (a
  /// leased permit's lease: detail/lease_table.hpp).
  virtual void permit_split(std::uint64_t note) noexcept = 0;

  /// A composition that held a permit while its caller waited elsewhere (a throttle's later stages) moves
  /// the permit's stamp from `from` to `to`, the moment the call was sent, so that the latency measured is
  /// the call's own. Only limiters that keep something by stamp need to know (none of rein's: an adaptive
  /// limiter's in-flight count rides in the permit's note, which a restamp leaves alone).
  virtual void restamp_permit(std::chrono::nanoseconds from, std::chrono::nanoseconds to) noexcept {
    (void)from;
    (void)to;
  }

 protected:
  ~permit_source() = default;
};

}  // namespace rein::detail
