// The admission rule of rein::redis::shared_quota_gate, apart from any I/O: the scripted admission
// (scripted_admission.hpp) with the gate's model of the server's state (a pause's release).
#pragma once

#include <rein/algo/rate_limit.hpp>
#include <rein/config.hpp>
#include <rein/detail/clock_time.hpp>
#include <rein/detail/random_seed.hpp>
#include <rein/observer.hpp>
#include <rein/redis/detail/scripted_admission.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>

namespace rein::redis {

/// The rule of a shared_quota_gate: those of the shared token bucket (key, failure policy, requests
/// on the wire, recheck) and of rein::quota_gate (max_pause, jitter). Every process sharing a gate must use
/// the same prefix and key.
/// The waiting line's options are rein::line_options, the constructor's next argument (fifo order and
/// reject_newest only); its observer also receives pause_started / pause_ended as this process learns them:
/// a pause it wrote (at once), or one a reply reported (the release ahead of the server's time in that
/// reply; ended by the local clock, first seen by the step after it), and rejections for unavailable (Redis
/// could not be asked under fail_closed).
struct shared_quota_gate_options {
  /// The name of the gate (e.g. the upstream host), the Redis hash tag: the key is
  /// `prefix + "{" + key + "}:pause"` (one hash: the pause's end and its release). Not empty, no braces.
  std::string key;
  std::string prefix = "rein:";  ///< what the key starts with (no braces)
  /// A pause longer than this is cut to it (a Retry-After of a year is a bug, not a plan). > 0.
  std::chrono::milliseconds max_pause{std::chrono::minutes{10}};
  /// The release after a pause is put off by a random part of `jitter` times the pause's length (at most
  /// `max_jitter`), drawn once by the process that writes the pause and stored with it: every process
  /// resumes at the same instant, and fleets sharing an upstream under different keys do not resume in
  /// lockstep. In [0, 1]; 0 releases at the pause's end.
  double jitter = 0.1;
  std::chrono::milliseconds max_jitter{std::chrono::seconds{30}};  ///< upper bound of the jitter, >= 0
  /// Seed of the jitter; the same seed gives the same draws. Default (nullopt): std::random_device.
  std::optional<std::uint64_t> seed{};
  /// What to do while Redis cannot be asked (see failure_policy). With fail_open every acquire is admitted
  /// unless this process knows of a pause (one it wrote or last read).
  failure_policy on_failure = failure_policy::fail_closed;
  /// Unused by the gate (nothing is counted), in (0, 1]: the field keeps the shared limiters' options alike.
  double fail_open_share = 1.0;
  /// Most admission requests this limiter has on the wire at once (pipelined on its connection), >= 1.
  std::size_t max_in_flight = 64;
  /// After Redis was found unreachable, how long the failure policy applies before Redis is asked again
  /// (once the connection is back). >= 0.
  std::chrono::milliseconds recheck_interval{100};
};

/// A shared_quota_gate's counters and state, copied under its lock (see shared_limiter_snapshot).
struct shared_quota_gate_snapshot : shared_limiter_snapshot {
  /// Whether a pause is in effect as this process knows it (as every gate's `paused`): one it wrote, or one
  /// a reply reported, not yet over by the local clock (see the options' `observer`).
  bool paused = false;
  /// The release of the latest pause Redis reported, by the server's clock (the epoch: none seen).
  std::chrono::system_clock::time_point release{};
  std::uint64_t pauses = 0;  ///< pauses this process wrote (pause_for, on_retry_after)
  std::uint64_t capped = 0;  ///< of those, cut to max_pause
};

namespace detail {

/// Admits everything: the gate's fail_open rule (a pause this process knows still holds, see gate_model).
template <class Clock>
struct open_rule {
  using time_point = typename Clock::time_point;
  algo::take_result try_take(std::int64_t, time_point) const noexcept { return algo::take_result::allowed; }
  std::optional<time_point> ready_at(std::int64_t, time_point t) const noexcept { return t; }
  void refund(std::int64_t, time_point) const noexcept {}
};

/// What the gate's replies teach: the stored release (the script's third number, server microseconds since
/// the Unix epoch). A denial's retry-after is the time to that release: the scripted admission's hold. A
/// pause this process writes holds it at once, before Redis has answered (`local pause`).
template <class Clock>
class gate_model {
 public:
  /// The public type, as messages name it.
  static constexpr std::string_view type_name = "rein::redis::shared_quota_gate";
  using options_type = shared_quota_gate_options;
  using snapshot_type = shared_quota_gate_snapshot;
  using local_type = open_rule<Clock>;
  using time_point = typename Clock::time_point;
  using duration = typename Clock::duration;

  /// The options, checked: std::invalid_argument naming the type, the field and the value.
  static options_type validated(options_type o) {
    constexpr std::string_view type = type_name;
    const auto fail = [&](const std::string& what) { throw std::invalid_argument(std::string(type) + ": " + what); };
    validate_common(o, type);
    if (o.max_pause.count() <= 0) fail("max_pause must be > 0, got " + std::to_string(o.max_pause.count()) + "ms");
    if (!(o.jitter >= 0 && o.jitter <= 1)) fail("jitter must be in [0, 1], got " + format_number(o.jitter));
    if (o.max_jitter.count() < 0) fail("max_jitter must be >= 0, got " + std::to_string(o.max_jitter.count()) + "ms");
    return o;
  }

  gate_model(const options_type& o, time_point)
      : options_(o), random_(o.seed ? *o.seed : rein::detail::random_seed()) {}

  bool exceeds(std::size_t) const noexcept { return false; }

  // Nothing is admitted before a pause this process wrote ends (and its jitter with it).
  time_point ready_at(std::size_t, time_point) const noexcept { return local_release_; }
  time_point firm_until() const noexcept { return local_release_; }

  std::size_t window(time_point) const noexcept { return options_.max_in_flight; }

  void learn(const verdict& v, time_point now) noexcept {
    if (v.available_us > 0) release_us_ = std::max(release_us_, static_cast<std::int64_t>(v.available_us));
    // A release still ahead by the server's clock when the script ran: paused here for that long from the
    // reply (late by the reply's way back, never early by clock skew: only the server's clock is compared).
    if (v.server_time_us > 0 && v.available_us > static_cast<double>(v.server_time_us)) {
      const auto left = std::chrono::microseconds(static_cast<std::int64_t>(v.available_us) - v.server_time_us);
      paused_until_ = std::max(paused_until_, rein::detail::add_saturated(now, std::chrono::ceil<duration>(left)));
    }
  }

  /// What the observer's pause events compare (rein::detail::observed_state): paused while a pause this
  /// process wrote, or one Redis reported, has not ended by the local clock.
  rein::detail::observed_state observe(time_point now) const noexcept {
    rein::detail::observed_state s;
    const time_point until = std::max(local_release_, paused_until_);
    s.paused = until > now;
    if (s.paused) s.pause_left = std::chrono::duration_cast<std::chrono::nanoseconds>(until - now);
    return s;
  }

  std::int64_t refund_most() const noexcept { return 0; }  // an admission takes nothing

  std::optional<local_type> make_local(time_point) const noexcept { return local_type{}; }

  void fill(snapshot_type& s, time_point now) const noexcept {
    s.paused = observe(now).paused;
    s.release = std::chrono::system_clock::time_point(std::chrono::microseconds(release_us_));
    s.pauses = pauses_;
    s.capped = capped_;
  }

  /// A pause of `d` written by this process: cut to max_pause, with its jitter drawn here. Returns the
  /// pause message (d and jitter in microseconds) and holds this process until its local release.
  message pause(duration d, time_point now) {
    using us = std::chrono::microseconds;
    ++pauses_;
    const auto cap = std::chrono::duration_cast<duration>(options_.max_pause);
    if (d > cap) {
      d = cap;
      ++capped_;
    }
    const auto pause_us = std::max<std::int64_t>(1, std::chrono::ceil<us>(d).count());
    const double spread = std::min(static_cast<double>(pause_us) * options_.jitter,
                                   static_cast<double>(std::chrono::duration_cast<us>(options_.max_jitter).count()));
    const auto jitter_us = static_cast<std::int64_t>(spread * std::uniform_real_distribution<double>(0, 1)(random_));
    const time_point release = rein::detail::add_saturated(now, std::chrono::ceil<duration>(us(pause_us + jitter_us)));
    local_release_ = std::max(local_release_, release);
    return message{message::kind::pause, 0, pause_us, jitter_us};
  }

  /// When this process resumes at the earliest, by its own clock (a pause it wrote).
  time_point local_release() const noexcept { return local_release_; }

 private:
  options_type options_;
  std::mt19937_64 random_;
  time_point local_release_ = time_point::min();
  time_point paused_until_ = time_point::min();  // the latest release Redis reported, on the local clock
  std::int64_t release_us_ = 0;  // the latest release Redis reported, server microseconds
  std::uint64_t pauses_ = 0;
  std::uint64_t capped_ = 0;
};

/// The shared quota gate's admission rule, as a remote policy (see scripted_admission).
template <class Clock>
using gate_admission = scripted_admission<Clock, gate_model<Clock>>;

}  // namespace detail
}  // namespace rein::redis
