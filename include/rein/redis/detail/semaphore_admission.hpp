// The admission rule of rein::redis::shared_semaphore, apart from any I/O: the scripted admission
// (scripted_admission.hpp) with the semaphore's model of the server's state and of this process's lease.
#pragma once

#include <rein/algo/rate_limit.hpp>
#include <rein/config.hpp>
#include <rein/detail/clock_time.hpp>
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
#include <string_view>

namespace rein::redis {

/// The rule of a shared_semaphore. Every process sharing a semaphore must use the same prefix, key and limit
/// (each call applies the caller's limit).
/// The waiting line's options are rein::line_options, the constructor's next argument (fifo order and
/// reject_newest only); its observer also receives rejections for unavailable (Redis could not be asked
/// under fail_closed) and lease_lost when a reply says Redis had expired this process's lease (the permits
/// its callers hold then no longer count; see `lease`).
struct shared_semaphore_options {
  /// The name of the semaphore, the Redis hash tag: the keys are `prefix + "{" + key + "}:sem:holders"` (a
  /// hash: lease -> permits held), `...:sem:leases` (a sorted set: lease -> expiry), `...:sem:total`,
  /// `...:sem:queue` and `...:sem:seen` (the waiting leases) and `...:sem:limit` (set_limit's), all in one
  /// Cluster slot. Not empty, no braces.
  std::string key;
  std::string prefix = "rein:";  ///< what the keys start with (no braces)
  std::int64_t limit = 0;        ///< most permits held at once, fleet-wide, in [1, 2^31)
  /// How long the server counts a process's permits after it last heard from it, in [30 ms, 1 day]. The
  /// process renews its lease every lease / 3 while the semaphore exists; the permits of a process that
  /// crashed, hung or lost its network come back at most one lease after its last renewal.
  std::chrono::milliseconds lease{10'000};
  /// How often a waiting process asks again, in [1 ms, lease]: after a denial, the first waiting caller
  /// waits a quarter of it per place of this process in the fleet's queue of waiting processes (the head
  /// a quarter, at most the whole), unless a permit of this process comes back first (then it asks at
  /// once, after the release). Another process's release is seen only by asking: this bounds the delay
  /// between a permit freeing elsewhere and a waiter here taking it, and the rate at which a waiting
  /// process asks. A waiter that gives up keeps its process's place for three of these intervals.
  std::chrono::milliseconds poll_interval{10};
  /// What to do while Redis cannot be asked (see failure_policy).
  failure_policy on_failure = failure_policy::fail_closed;
  /// With fail_open: the local semaphore's share of the limit, in (0, 1] (at least 1 permit).
  double fail_open_share = 1.0;
  /// Most acquire requests this semaphore has on the wire at once (pipelined on its connection), >= 1.
  std::size_t max_in_flight = 64;
  /// After Redis was found unreachable, how long the failure policy applies before Redis is asked again
  /// (once the connection is back). >= 0.
  std::chrono::milliseconds recheck_interval{100};
};

/// A shared_semaphore's counters and state, copied under its lock (see shared_limiter_snapshot).
struct shared_semaphore_snapshot : shared_limiter_snapshot {
  /// The limit this process asks under (get_options().limit), fleet-wide permits. A limit stored with
  /// set_limit replaces it on the server, which the replies do not report: `free` reflects it, this not.
  std::int64_t limit = 0;
  /// Permits this process's callers hold now ("calls holding a slot", as every limiter's in_flight): granted
  /// by Redis or, under fail_open, by the local rule, and not yet given back; grants whose lease was lost
  /// since are still counted here (their holders still hold them), not in `held`.
  std::size_t in_flight = 0;
  /// Permits free fleet-wide as last seen from the server: `limit - total` in the reply to this process's
  /// last acquire (blind to other processes since, and to this process's own releases and renewals,
  /// whose replies are not read for it); `limit` before the first reply.
  std::int64_t free = 0;
  /// Permits Redis counts for this process under its current lease, as the process counts them (granted
  /// by Redis, not yet given back; 0 after a lost lease).
  std::int64_t held = 0;
  std::uint64_t lease = 0;         ///< the number of this process's current lease (1, then 2 after a loss, ...)
  std::uint64_t leases_lost = 0;   ///< leases Redis had expired when this process next spoke to it
  std::uint64_t renewals = 0;      ///< lease renewals sent
  /// Grants Redis made that this process refused as stale: read a lease or more after their request left
  /// (the process stalled, e.g. a GC pause or SIGSTOP, with the reply in its socket), or made under a lease
  /// lost since. Each was given back (a release under its lease) and its caller asked again.
  std::uint64_t stale_grants = 0;
};

namespace detail {

/// fail_open's local rule for a semaphore: `capacity` permits in this process alone.
template <class Clock>
class local_permits {
 public:
  using time_point = typename Clock::time_point;

  explicit local_permits(std::int64_t capacity) noexcept : capacity_(capacity), free_(capacity) {}

  algo::take_result try_take(std::int64_t n, time_point) noexcept {
    if (n > capacity_) return algo::take_result::exceeds_capacity;
    if (n > free_) return algo::take_result::denied;
    free_ -= n;
    return algo::take_result::allowed;
  }

  // Only a release frees a permit, and a release runs the line again: no time to wake up at.
  std::optional<time_point> ready_at(std::int64_t n, time_point now) const noexcept {
    if (n <= free_) return now;
    return std::nullopt;
  }

  void refund(std::int64_t n, time_point) noexcept { free_ = std::min(capacity_, free_ + n); }

 private:
  std::int64_t capacity_;
  std::int64_t free_;
};

/// What the semaphore's replies teach, and this process's lease. A lease is a number: the messages carry
/// it as their tag (2 * lease, plus 1 while Redis has not yet answered a request made under it: "create
/// it if missing"). Redis answers "lost" (-1) to a request of a lease it no longer knows (it expired: the
/// process was silent longer than `lease`); the process then starts the next lease, and its permits
/// granted before the loss no longer count anywhere (owns() is false: their release sends nothing).
template <class Clock>
class semaphore_model : public free_places_model<Clock, shared_semaphore_options> {
 public:
  /// The public type, as messages name it.
  static constexpr std::string_view type_name = "rein::redis::shared_semaphore";
  static constexpr bool holds = true;
  using options_type = shared_semaphore_options;
  using snapshot_type = shared_semaphore_snapshot;
  using local_type = local_permits<Clock>;
  using time_point = typename Clock::time_point;

  /// The options, checked: std::invalid_argument naming the type, the field and the value.
  static options_type validated(options_type o) {
    constexpr std::string_view type = type_name;
    const auto fail = [&](const std::string& what) { throw std::invalid_argument(std::string(type) + ": " + what); };
    validate_common(o, type);
    if (o.limit < 1 || o.limit > std::numeric_limits<std::int32_t>::max())
      fail("limit must be in [1, 2^31) permits, got " + std::to_string(o.limit));
    if (o.lease < std::chrono::milliseconds(30) || o.lease > std::chrono::hours(24))
      fail("lease must be in [30 ms, 1 day], got " + std::to_string(o.lease.count()) + "ms");
    if (o.poll_interval < std::chrono::milliseconds(1) || o.poll_interval > o.lease)
      fail("poll_interval must be in [1 ms, lease], got " + std::to_string(o.poll_interval.count()) + "ms");
    return o;
  }

  using free_places_model<Clock, shared_semaphore_options>::free_places_model;

  std::optional<local_type> make_local(time_point) const {
    const auto share = std::floor(static_cast<double>(this->get_options().limit) * this->get_options().fail_open_share);
    return local_type(std::max<std::int64_t>(1, static_cast<std::int64_t>(share)));
  }

  /// What the observer's events compare (rein::detail::observed_state): the leases lost so far, so that a
  /// loss learned from a reply is reported (lease_lost) by the step that applied it.
  rein::detail::observed_state observe(time_point) const noexcept {
    rein::detail::observed_state s;
    s.leases_lost = leases_lost_;
    return s;
  }

  void fill(snapshot_type& s, time_point) const noexcept {
    s.limit = this->get_options().limit;
    s.free = this->free_places();
    s.lease = lease_;
    s.leases_lost = leases_lost_;
    s.renewals = renewals_;
  }

  // ---- the lease (scripted_admission's holding-model members) ---------------------------------------------

  std::int64_t tag() const noexcept { return static_cast<std::int64_t>(lease_ * 2 + (confirmed_ ? 0 : 1)); }

  /// Whether a grant made at `granted_at` still counts on the server: made after the last lease was lost.
  bool owns(time_point granted_at) const noexcept { return granted_at > lost_at_; }

  /// Whether a grant to a request sent at `sent` under `tag` may be honoured at `now`: made under the
  /// current lease, and read less than `lease` after the request left, or while a later confirmation still
  /// holds the lease (lease_held: a slow but live server whose replies take longer than a lease would
  /// otherwise have every grant given back). Redis extended the lease to its own time of the request plus
  /// `lease`, and that came after `sent`, so the grant surely still counts now (if both clocks run at the same
  /// rate). A grant read later, with no confirmation since, may have outlived its lease while this process
  /// stalled, and other processes may hold every permit since.
  bool fresh(std::int64_t tag, time_point sent, time_point now) const noexcept {
    if (static_cast<std::uint64_t>(tag / 2) != lease_) return false;
    return now - sent < lease_length() || now < held_until_;
  }

  /// An answer to a message sent at `sent` under `tag`. Returns true when it says the current lease is lost
  /// (the next lease starts, with nothing held).
  bool on_reply(std::int64_t tag, const verdict& v, time_point sent, time_point now) noexcept {
    if (static_cast<std::uint64_t>(tag / 2) != lease_) return false;  // about a lease already replaced
    if (v.what == verdict::kind::lost) {
      ++leases_lost_;
      ++lease_;
      confirmed_ = false;
      lost_at_ = now;
      held_until_ = time_point::min();
      return true;
    }
    if (v.what == verdict::kind::allowed || v.what == verdict::kind::denied) {  // Redis extended the lease
      confirmed_ = true;
      held_until_ = std::max(held_until_, rein::detail::add_saturated(sent, lease_length()));
    }
    return false;
  }

  /// Whether the current lease surely still counts this process's permits at `now`: Redis confirmed it in
  /// answer to a request sent less than `lease` ago, and nothing said since that it is lost.
  bool lease_held(time_point now) const noexcept { return confirmed_ && now < held_until_; }

  /// The tag of a renewal: none until Redis made the lease (a renewal cannot create one).
  std::optional<std::int64_t> renewal() noexcept {
    if (!confirmed_) return std::nullopt;
    ++renewals_;
    return tag();
  }

 private:
  typename Clock::duration lease_length() const noexcept {
    return std::chrono::duration_cast<typename Clock::duration>(this->get_options().lease);  // truncated: shorter
  }

  std::uint64_t lease_ = 1;
  bool confirmed_ = false;  // Redis has answered a request of this lease (it exists there)
  time_point lost_at_ = time_point::min();
  time_point held_until_ = time_point::min();  // the lease surely counts until then (see lease_held)
  std::uint64_t leases_lost_ = 0;
  std::uint64_t renewals_ = 0;
};

/// The shared semaphore's admission rule, as a remote policy (see scripted_admission).
template <class Clock>
using semaphore_admission = scripted_admission<Clock, semaphore_model<Clock>>;

}  // namespace detail
}  // namespace rein::redis
