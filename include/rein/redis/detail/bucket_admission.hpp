// The admission rule of rein::redis::shared_token_bucket, apart from any I/O: what to send to Redis, and what
// each verdict means for the waiters. A remote policy on rein's wait line (rein/detail/remote_admission.hpp).
#pragma once

#include <rein/algo/token_bucket.hpp>
#include <rein/config.hpp>
#include <rein/detail/clock_time.hpp>
#include <rein/detail/remote_admission.hpp>
#include <rein/outcome.hpp>
#include <rein/redis/error.hpp>
#include <rein/wait_stats.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/error.hpp>
#else
#include <boost/asio/error.hpp>
#endif

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace rein::redis {

/// What a shared_token_bucket does while Redis cannot be asked.
enum class failure_policy : std::uint8_t {
  /// Nothing is admitted: waiting and new acquires complete with errc::unavailable. For quotas that must
  /// never be exceeded (a provider suspends the account).
  fail_closed,
  /// Each process admits from a local, in-process rein::algo::token_bucket holding `fail_open_share` of the
  /// rate and of the capacity (e.g. 1/N for N replicas), so the fleet stays near the quota without Redis.
  /// For quotas where availability matters more than exactness.
  fail_open,
};

/// Options of a shared_token_bucket. Every process sharing a quota must use the same key, rate and capacity:
/// Redis stores how much is owed, and each call applies the caller's rate and capacity to it.
struct shared_token_bucket_options {
  std::string key;              ///< the Redis key holding the quota's state (one hash); not empty
  double rate = 0;              ///< tokens per second for everyone together, in (0, 1e9]
  std::int64_t capacity = 0;    ///< the burst: most tokens the bucket holds, in [1, 1e15]; capacity / rate <= 1e9 s
  /// What to do while Redis cannot be asked (see failure_policy).
  failure_policy on_failure = failure_policy::fail_closed;
  /// With fail_open: the local bucket's share of rate and capacity, in (0, 1] (its capacity is at least 1).
  double fail_open_share = 1.0;
  /// How many operations may wait their turn at once; one more completes with rein::errc::queue_full.
  /// Operations whose request is on the wire do not count. Default: unbounded.
  std::size_t max_waiters = std::numeric_limits<std::size_t>::max();
  /// Most admission requests this limiter has on the wire at once (pipelined on its connection), >= 1.
  /// 1 sends them one at a time.
  std::size_t max_in_flight = 64;
  /// After Redis was found unreachable, how long the failure policy applies before Redis is asked again
  /// (once the connection is back). Keeps a server that answers LOADING or BUSY from being hammered. >= 0.
  std::chrono::milliseconds recheck_interval{100};
};

/// A shared_token_bucket's counters and state, copied under its lock.
///
/// From rein::wait_stats: `waiting` counts every operation not yet completed (on the wire or waiting its
/// turn); wait times run from the acquire call to the grant, round trips included.
struct shared_token_bucket_snapshot : wait_stats {
  std::size_t in_flight = 0;          ///< admission requests awaiting Redis's reply
  bool degraded = false;              ///< Redis was unreachable at the last attempt: on_failure applies
  bool connected = false;             ///< the connection is up
  /// The bucket's tokens as of the last reply, plus refill since: an estimate, blind to other processes'
  /// takes since that reply. `capacity` before the first reply.
  double tokens = 0;
  std::uint64_t remote_allowed = 0;   ///< admissions Redis granted
  std::uint64_t remote_denied = 0;    ///< admissions Redis refused for now (the caller waited and asked again)
  std::uint64_t local_admitted = 0;   ///< admitted by the local bucket (fail_open, while degraded)
  std::uint64_t unavailable_total = 0;   ///< completed with errc::unavailable
  std::uint64_t server_errors = 0;    ///< error replies other than NOSCRIPT and the "unavailable" ones
  std::uint64_t script_loads = 0;     ///< NOSCRIPT replies, each answered by SCRIPT LOAD and a retry
  std::uint64_t refunds = 0;          ///< refund requests sent (refund(), or tokens a cancelled caller got)
  std::uint64_t round_trips = 0;      ///< admission replies received
  std::chrono::nanoseconds round_trip_last{0};   ///< request sent to reply settled, last admission
  std::chrono::nanoseconds round_trip_total{0};  ///< mean = round_trip_total / round_trips
  /// The longest admission round trip so far.
  std::chrono::nanoseconds round_trip_max{0};
  std::chrono::microseconds retry_after_last{0};  ///< the retry-after of the last denial, as Redis computed it
};

namespace detail {

/// What a reply to the token bucket script says (see read_verdict in shared_token_bucket.hpp).
struct verdict {
  enum class kind : std::uint8_t { allowed, denied, no_script, unavailable, server_error };
  kind what = kind::unavailable;
  double retry_after_us = 0;  ///< denied: microseconds until the request would be allowed
  double available_us = 0;    ///< allowed or denied: the bucket's content after the decision, in microseconds
  std::string message;        ///< the server's error text (empty for a request that was never answered)
};

/// One request for the connection.
struct message {
  enum class kind : std::uint8_t { admission, refund, script_load };
  kind what = kind::admission;
  std::uint64_t ticket = 0;  ///< admission: its verdict goes back to settle(ticket, ...)
  std::int64_t n = 0;        ///< admission: tokens wanted; refund: tokens given back
  friend bool operator==(const message&, const message&) = default;
};

/// Messages gathered under the line's lock and sent after it. Inline room for the usual few.
class message_list {
 public:
  void push(message m) {
    if (size_ < inline_.size()) inline_[size_] = m;
    else overflow_.push_back(m);
    ++size_;
  }
  bool empty() const noexcept { return size_ == 0; }
  std::size_t size() const noexcept { return size_; }
  const message& operator[](std::size_t i) const noexcept {
    return i < inline_.size() ? inline_[i] : overflow_[i - inline_.size()];
  }
  void clear() noexcept {
    size_ = 0;
    overflow_.clear();
  }

 private:
  std::array<message, 4> inline_{};
  std::vector<message> overflow_;
  std::size_t size_ = 0;
};

/// The options, checked: std::invalid_argument naming the type, the field and the value.
inline shared_token_bucket_options validated(shared_token_bucket_options o) {
  const auto fail = [](const std::string& what) {
    throw std::invalid_argument("rein::redis::shared_token_bucket: " + what);
  };
  const auto number = [](double v) {
    std::array<char, 32> buffer{};
    const auto result = std::to_chars(buffer.data(), buffer.data() + buffer.size(), v);  // shortest round trip
    return std::string(buffer.data(), result.ptr);
  };
  if (o.key.empty()) fail("key must not be empty");
  if (!(o.rate > 0 && o.rate <= 1e9)) fail("rate must be > 0, finite and at most 1e9 tokens per second, got " + number(o.rate));
  if (o.capacity < 1 || o.capacity > 1'000'000'000'000'000)
    fail("capacity must be in [1, 1e15] tokens, got " + std::to_string(o.capacity));
  if (static_cast<double>(o.capacity) / o.rate > 1e9)
    fail("capacity / rate (seconds to refill from empty) must be at most 1e9, got " +
         number(static_cast<double>(o.capacity) / o.rate));
  if (!(o.fail_open_share > 0 && o.fail_open_share <= 1))
    fail("fail_open_share must be in (0, 1], got " + number(o.fail_open_share));
  if (o.max_in_flight < 1) fail("max_in_flight must be >= 1, got 0");
  if (o.recheck_interval.count() < 0)
    fail("recheck_interval must be >= 0, got " + std::to_string(o.recheck_interval.count()) + "ms");
  return o;
}

/// The shared bucket's admission rule, as a remote policy (rein/detail/remote_admission.hpp).
///
/// Asking: the first waiting op is sent (one admission message, a ticket) once the bucket, as the last verdict
/// described it plus refill since, holds its n tokens and the last denial's retry-after has passed; no more
/// requests are in flight than the bucket is believed to hold tokens (at least one, at most max_in_flight).
/// A denial holds the line for the retry-after Redis computed when the denied op is the first waiting one.
///
/// Failing: a verdict `unavailable` (no reply, or LOADING, BUSY ...) degrades the bucket for
/// recheck_interval, and then until `link_up()` says the connection is back: meanwhile fail_closed fails each
/// waiting op with errc::unavailable in line order, and fail_open admits from a local bucket of
/// fail_open_share of the quota. NOSCRIPT is answered by SCRIPT LOAD and the same admission (twice at most);
/// any other error reply fails the op with errc::server_error.
///
/// Giving back: a verdict "allowed" for a ticket whose op left the line (cancelled, timed out, closed), and a
/// revoked grant, send a refund of their tokens (best effort).
template <class Clock>
class bucket_admission {
  using remote_step = rein::detail::remote_step;
  using remote_settled = rein::detail::remote_settled;

 public:
  static constexpr bool needs_time = true;
  using time_point = typename Clock::time_point;
  using duration = typename Clock::duration;
  using outbox = message_list;

  /// `link_up` says whether the connection is up (read under the lock: it must be cheap and lock-free).
  bucket_admission(shared_token_bucket_options o, std::function<bool()> link_up, time_point now)
      : options_(validated(std::move(o))), interval_us_(1e6 / options_.rate), link_up_(std::move(link_up)) {
    if (options_.on_failure == failure_policy::fail_open) {
      const double share = options_.fail_open_share;
      const auto local_capacity =
          std::max<std::int64_t>(1, static_cast<std::int64_t>(std::floor(static_cast<double>(options_.capacity) * share)));
      local_.emplace(algo::token_bucket_options{.rate = options_.rate * share, .capacity = local_capacity}, now);
    }
  }

  const shared_token_bucket_options& options() const noexcept { return options_; }
  double interval_us() const noexcept { return interval_us_; }

  // ---- admission_policy ----------------------------------------------------------------------------------

  bool exceeds(std::size_t n) const noexcept { return n > static_cast<std::uint64_t>(options_.capacity); }

  /// Only a request for nothing is decided without Redis.
  bool try_take(std::size_t n, time_point) const noexcept { return n == 0; }

  /// For the first waiting op: when to offer it again. time_point::max() while only a verdict (a free place
  /// in the window) can move it.
  time_point ready_at(std::size_t n, time_point now) const {
    if (!degraded_at(now)) {
      const time_point at = remote_ready_at(n);
      return at > now ? at : time_point::max();
    }
    if (!local_) return time_point::max();  // fail_closed: every waiting op fails at once
    time_point wake = local_->ready_at(static_cast<std::int64_t>(n), now).value_or(time_point::max());
    if (degraded_until_ > now) wake = std::min(wake, degraded_until_);  // then Redis is asked again
    return wake;
  }

  /// Redis decides, so no bound is known in advance: a deadline that cannot be met shows when it passes.
  std::optional<time_point> predict(std::size_t, std::size_t, time_point) const noexcept { return std::nullopt; }

  void on_release(std::size_t, std::chrono::nanoseconds, outcome, time_point) noexcept {}  // nothing is held

  /// A grant taken back before its handler ran: its tokens go back to Redis (a local one's to the local bucket).
  void on_revoke(std::size_t n, time_point now) noexcept { give_back(static_cast<std::int64_t>(n), now); }

  // ---- remote_policy -------------------------------------------------------------------------------------

  remote_step admit(rein::detail::wait_op* op, std::size_t count, time_point now) noexcept {
    const auto n = static_cast<std::int64_t>(count);
    if (n == 0) return remote_step::grant();
    if (!degraded_at(now)) {
      degraded_ = false;
      if (in_flight_ >= window(now) || remote_ready_at(count) > now) return remote_step::wait();
      const std::uint64_t ticket = first_ticket_ + tickets_.size();
      try {
        tickets_.push_back(pending{op, n, now, 0, false});
        outbox_.push({message::kind::admission, ticket, n});
      } catch (...) {
        if (tickets_.size() > ticket - first_ticket_) tickets_.pop_back();
        return remote_step::fail(net::error::no_memory);
      }
      ++in_flight_;
      return remote_step::sent(ticket);
    }
    if (!local_) {
      ++stats_.unavailable_total;
      return remote_step::fail(make_error_code(errc::unavailable));
    }
    switch (local_->try_take(n, now)) {
      case algo::take_result::denied: return remote_step::wait();
      case algo::take_result::exceeds_capacity:
        ++stats_.unavailable_total;
        return remote_step::fail(make_error_code(errc::unavailable));
      case algo::take_result::allowed: break;
    }
    ++stats_.local_admitted;
    local_grants_ += n;
    return remote_step::grant();
  }

  /// The verdict for `ticket` (every ticket gets exactly one, once: a reply, or `verdict{}` when the request
  /// could not be sent or answered).
  remote_settled settle(std::uint64_t ticket, const verdict& v, time_point now) {
    using kind = verdict::kind;
    pending& t = tickets_[static_cast<std::size_t>(ticket - first_ticket_)];
    if (v.what != kind::unavailable || !v.message.empty()) record_round_trip(t, now);
    if (v.what == kind::no_script && t.attempts < 2 && t.op != nullptr) {
      // The server lost its scripts (SCRIPT FLUSH, a failover): load, then ask again, back to back.
      ++t.attempts;
      t.sent = now;
      ++stats_.script_loads;
      outbox_.push({message::kind::script_load, 0, 0});
      outbox_.push({message::kind::admission, ticket, t.n});
      return {t.op, remote_step::keep()};
    }
    rein::detail::wait_op* op = t.op;
    const std::int64_t n = t.n;
    retire(t);
    learn(v, now);
    pending_hold_.reset();
    if (op == nullptr) {
      if (v.what == kind::allowed) refund(n);
      return {};
    }
    switch (v.what) {
      case kind::allowed: return {op, remote_step::grant()};
      case kind::denied:
        pending_hold_ = rein::detail::add_saturated(now, from_us(v.retry_after_us));
        return {op, remote_step::wait()};
      case kind::unavailable: return {op, remote_step::wait()};  // the failure policy applies to it in line order
      case kind::no_script:
      case kind::server_error: break;
    }
    return {op, remote_step::fail(make_error_code(errc::server_error))};
  }

  /// After a denial: it holds the line only if its op is the first waiting one.
  void on_denied(bool first_waiting) noexcept {
    if (first_waiting && pending_hold_) hold_until_ = std::max(hold_until_, *pending_hold_);
    pending_hold_.reset();
  }

  /// The op of `ticket` left the line: its verdict, when it comes, finds nobody (and refunds a grant).
  void forget(std::uint64_t ticket) noexcept { tickets_[static_cast<std::size_t>(ticket - first_ticket_)].op = nullptr; }

  /// Appends the messages gathered since the last call to `out`.
  void take_outbox(message_list& out) noexcept {
    if (outbox_.empty()) return;
    if (out.empty()) {
      std::swap(out, outbox_);
    } else {
      try {
        for (std::size_t i = 0; i < outbox_.size(); ++i) out.push(outbox_[i]);
      } catch (...) {  // not reached: the line takes the outbox once per locked step, into an empty batch
      }
    }
    outbox_.clear();
  }

  // ---- The I/O object's other entry points --------------------------------------------------------------

  /// Gives n tokens back to the shared bucket (never above full): one refund message.
  void refund(std::int64_t n) {
    if (n <= 0) return;
    ++stats_.refunds;
    outbox_.push({message::kind::refund, 0, std::min(n, options_.capacity)});
  }

  /// A refund or script load came back with an error.
  void on_side_error() noexcept { ++stats_.server_errors; }

  /// The policy's counters and state (the line adds its own statistics).
  shared_token_bucket_snapshot snapshot(time_point now) const {
    shared_token_bucket_snapshot s = stats_;
    s.in_flight = in_flight_;
    s.degraded = degraded_;
    s.tokens = tokens_estimate(now);
    return s;
  }

 private:
  struct pending {
    rein::detail::wait_op* op;  // null once its op left the line
    std::int64_t n;
    time_point sent;
    std::uint8_t attempts;
    bool done;
  };

  using micros = std::chrono::duration<double, std::micro>;

  // A count of microseconds from a verdict as a duration of the clock: rounded up, saturated.
  static duration from_us(double us) noexcept { return rein::detail::ceil_duration<duration>(micros(us)); }

  bool degraded_at(time_point now) const { return degraded_ && !(now >= degraded_until_ && link_up_()); }

  void give_back(std::int64_t n, time_point now) noexcept {
    try {
      if (degraded_ && local_ && local_grants_ >= n) {  // most likely a local grant: the local bucket's
        local_grants_ -= n;
        local_->refund(n, now);
        return;
      }
      refund(n);
    } catch (...) {  // best effort, as every refund: without memory for the message the tokens stay taken
    }
  }

  void record_round_trip(const pending& t, time_point now) {
    const auto rtt = std::chrono::duration_cast<std::chrono::nanoseconds>(std::max(now, t.sent) - t.sent);
    ++stats_.round_trips;
    stats_.round_trip_last = rtt;
    stats_.round_trip_total += rtt;
    stats_.round_trip_max = std::max(stats_.round_trip_max, rtt);
  }

  void retire(pending& t) noexcept {
    t.done = true;
    t.op = nullptr;
    --in_flight_;
    while (!tickets_.empty() && tickets_.front().done) {
      tickets_.pop_front();
      ++first_ticket_;
    }
  }

  void learn(const verdict& v, time_point now) {
    using kind = verdict::kind;
    switch (v.what) {
      case kind::allowed:
      case kind::denied:
        degraded_ = false;
        local_grants_ = 0;
        have_reply_ = true;
        last_reply_at_ = now;
        available_us_ = v.available_us;
        if (v.what == kind::allowed) {
          ++stats_.remote_allowed;
          hold_until_ = time_point::min();
        } else {
          ++stats_.remote_denied;
          stats_.retry_after_last = rein::detail::ceil_duration<std::chrono::microseconds>(micros(v.retry_after_us));
        }
        return;
      case kind::unavailable:
        degraded_ = true;
        degraded_until_ = rein::detail::add_saturated(now, std::chrono::duration_cast<duration>(options_.recheck_interval));
        return;
      case kind::no_script:
      case kind::server_error:
        ++stats_.server_errors;
        return;
    }
  }

  // When the first waiting op, wanting n, may be sent: after the last denial's retry-after, and once the
  // bucket, as last seen plus refill, holds n tokens.
  time_point remote_ready_at(std::size_t n) const {
    if (!have_reply_) return hold_until_;
    const double missing_us = static_cast<double>(n) * interval_us_ - available_us_;
    const time_point refilled =
        missing_us <= 0 ? last_reply_at_ : rein::detail::add_saturated(last_reply_at_, from_us(missing_us));
    return std::max(hold_until_, refilled);
  }

  // How many requests may be on the wire: as many as the tokens the bucket is believed to hold (at least
  // one), so a nearly empty bucket is not asked 64 times for one token.
  std::size_t window(time_point now) const {
    const double tokens = std::floor(tokens_estimate(now));
    if (tokens >= static_cast<double>(options_.max_in_flight)) return options_.max_in_flight;
    return tokens < 1 ? 1 : static_cast<std::size_t>(tokens);
  }

  double tokens_estimate(time_point now) const {
    const auto capacity = static_cast<double>(options_.capacity);
    if (!have_reply_) return capacity;
    const double elapsed_us = micros(std::max(now, last_reply_at_) - last_reply_at_).count();
    return std::min(capacity, (available_us_ + elapsed_us) / interval_us_);
  }

  shared_token_bucket_options options_;
  double interval_us_;
  std::function<bool()> link_up_;
  std::optional<algo::basic_token_bucket<Clock>> local_;
  std::int64_t local_grants_ = 0;  // tokens the local bucket granted since Redis last answered

  std::deque<pending> tickets_;
  std::uint64_t first_ticket_ = 0;  // the ticket of tickets_.front()
  std::size_t in_flight_ = 0;       // tickets not yet settled, forgotten ones included
  message_list outbox_;

  bool have_reply_ = false;
  time_point last_reply_at_{};
  double available_us_ = 0;  // the bucket's content at last_reply_at_, in microseconds of refill
  time_point hold_until_ = time_point::min();
  std::optional<time_point> pending_hold_;
  bool degraded_ = false;
  time_point degraded_until_{};

  shared_token_bucket_snapshot stats_{};
};

}  // namespace detail
}  // namespace rein::redis
