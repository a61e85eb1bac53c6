// The admission rule of rein::redis::shared_sliding_window, apart from any I/O: the scripted admission
// (scripted_admission.hpp) with the sliding window's model of the server's state.
#pragma once

#include <rein/algo/sliding_window.hpp>
#include <rein/config.hpp>
#include <rein/observer.hpp>
#include <rein/redis/detail/scripted_admission.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>

namespace rein::redis {

/// The rule of a shared_sliding_window. Every process sharing a window must use the same prefix, key, limit
/// and window: Redis stores the admissions' stamps, and each call applies the caller's limit and window.
/// The waiting line's options are rein::line_options, the constructor's next argument (fifo order and
/// reject_newest only); its observer also receives rejections for unavailable (Redis could not be asked
/// under fail_closed).
struct shared_sliding_window_options {
  /// The name of the window, the Redis hash tag: the keys are `prefix + "{" + key + "}:window"` (a sorted
  /// set of admission stamps and of the fleet's waiting processes), `... + ":window:seq"` (a counter naming
  /// and ranking them) and `... + ":window:limit"` (set_limit's), all in one Cluster slot. Not empty, no
  /// braces.
  std::string key;
  std::string prefix = "rein:";  ///< what the keys start with (no braces)
  std::int64_t limit = 0;        ///< most admissions in any window, fleet-wide, in [1, 2^27]
  /// The window's length, in (0, 1e9 s]. Redis keeps microseconds: a window of w admits at most `limit`
  /// with stamps in any half-open interval (t - w, t].
  std::chrono::milliseconds window{0};
  /// How long a process keeps its entry in the fleet's queue past the retry-after Redis last gave it (past
  /// its last admission: this long), in [1 ms, 1 h]. A process that dies (or stops asking) while waiting
  /// holds back the places it was owed that long after they free up; one slower than that to ask again (a
  /// stalled event loop) joins the queue anew, at its end and at the least count served.
  std::chrono::milliseconds queue_grace{200};
  /// What to do while Redis cannot be asked (see failure_policy).
  failure_policy on_failure = failure_policy::fail_closed;
  /// With fail_open: the local window's share of the limit, in (0, 1] (its limit is at least 1).
  double fail_open_share = 1.0;
  /// Most admission requests this limiter has on the wire at once (pipelined on its connection), >= 1.
  std::size_t max_in_flight = 64;
  /// After Redis was found unreachable, how long the failure policy applies before Redis is asked again
  /// (once the connection is back). >= 0.
  std::chrono::milliseconds recheck_interval{100};
};

/// A shared_sliding_window's counters and state, copied under its lock (see shared_limiter_snapshot).
struct shared_sliding_window_snapshot : shared_limiter_snapshot {
  /// Most admissions in any window, as this process asks (get_options().limit); a limit stored with set_limit
  /// replaces it on the server, which the replies do not report (`free` reflects it).
  std::int64_t limit = 0;
  /// Free places this process may take as of the last reply (blind to other processes since): the window's
  /// free places less those the processes queued ahead of it asked for; `limit` before the first reply.
  std::int64_t free = 0;
};

namespace detail {

/// What the sliding window's replies teach: the free places left to this process after the decision (the
/// script's third number: net of what the fleet's queued processes ahead of it asked for), so no more
/// requests go on the wire than there are places for it (at least one), and a process just admitted does
/// not pipeline a burst past the others' turns. A denial says when the admission that must leave before its
/// turn leaves; that is the scripted admission's hold.
template <class Clock>
class window_model : public free_places_model<Clock, shared_sliding_window_options> {
 public:
  /// The public type, as messages name it.
  static constexpr std::string_view type_name = "rein::redis::shared_sliding_window";
  using options_type = shared_sliding_window_options;
  using snapshot_type = shared_sliding_window_snapshot;
  using local_type = algo::basic_sliding_window<Clock>;
  using time_point = typename Clock::time_point;
  /// Redis ranks the waiting processes (the fleet queue): admissions say how long their callers will wait.
  static constexpr bool queues = true;

  /// The options, checked: std::invalid_argument naming the type, the field and the value.
  static options_type validated(options_type o) {
    constexpr std::string_view type = type_name;
    const auto fail = [&](const std::string& what) { throw std::invalid_argument(std::string(type) + ": " + what); };
    validate_common(o, type);
    if (o.limit < 1 || o.limit > local_type::max_limit)
      fail("limit must be in [1, 2^27] admissions, got " + std::to_string(o.limit));
    if (o.window.count() < 1 || o.window > std::chrono::seconds(1'000'000'000))
      fail("window must be in [1 ms, 1e9 s], got " + std::to_string(o.window.count()) + "ms");
    if (o.queue_grace.count() < 1 || o.queue_grace > std::chrono::hours(1))
      fail("queue_grace must be in [1 ms, 1 h], got " + std::to_string(o.queue_grace.count()) + "ms");
    return o;
  }

  using free_places_model<Clock, shared_sliding_window_options>::free_places_model;

  std::optional<local_type> make_local(time_point now) const {
    const auto share = std::floor(static_cast<double>(this->get_options().limit) * this->get_options().fail_open_share);
    const auto limit = std::max<std::int64_t>(1, static_cast<std::int64_t>(share));
    return local_type(typename local_type::options{.limit = limit, .window = std::chrono::duration_cast<typename Clock::duration>(this->get_options().window)}, now);
  }

  void fill(snapshot_type& s, time_point) const noexcept {
    s.limit = this->get_options().limit;
    s.free = this->free_places();
  }
};

/// The shared sliding window's admission rule, as a remote policy (see scripted_admission).
template <class Clock>
using window_admission = scripted_admission<Clock, window_model<Clock>>;

}  // namespace detail
}  // namespace rein::redis
