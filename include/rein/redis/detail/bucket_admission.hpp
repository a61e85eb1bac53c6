// The admission rule of rein::redis::shared_token_bucket, apart from any I/O: the scripted admission
// (scripted_admission.hpp) with the bucket's model of the server's state. A remote policy on rein's wait line.
#pragma once

#include <rein/algo/token_bucket.hpp>
#include <rein/config.hpp>
#include <rein/detail/clock_time.hpp>
#include <rein/redis/detail/hash_tag.hpp>
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
#include <utility>

namespace rein::redis {

/// The rule of a shared_token_bucket. Every process sharing a quota must use the same key, rate and capacity:
/// Redis stores how much is owed, and each call applies the caller's rate and capacity to it.
/// The waiting line's options are rein::line_options, the constructor's next argument (fifo order and
/// reject_newest only); its observer also receives rejections for unavailable (Redis could not be asked
/// under fail_closed).
struct shared_token_bucket_options {
  /// The Redis key holding the quota's state (one hash); not empty. A rate set for the fleet (set_rate)
  /// is kept in `"{" + key + "}:rate"`, or `key + ":rate"` when the key has a hash tag already: in the
  /// key's Redis Cluster slot either way. A key that contains '}' must have a hash tag.
  std::string key;
  double rate = 0;              ///< tokens per second for everyone together, in (0, 1e9]
  std::int64_t capacity = 0;    ///< the burst: most tokens the bucket holds, in [1, 1e15]; capacity / rate <= 1e9 s
  /// What to do while Redis cannot be asked (see failure_policy).
  failure_policy on_failure = failure_policy::fail_closed;
  /// With fail_open: the local bucket's share of rate and capacity, in (0, 1] (its capacity is at least 1).
  double fail_open_share = 1.0;
  /// Most admission requests this limiter has on the wire at once (pipelined on its connection), >= 1.
  /// 1 sends them one at a time.
  std::size_t max_in_flight = 64;
  /// After Redis was found unreachable, how long the failure policy applies before Redis is asked again
  /// (once the connection is back). Keeps a server that answers LOADING or BUSY from being hammered. >= 0.
  std::chrono::milliseconds recheck_interval{100};
  /// Most tokens taken per round trip, in [1, capacity]. 1 (the default): each admission is a round trip.
  /// Above 1, a process asks for up to `batch` tokens at once (at least what the caller wants, as many as
  /// the bucket holds), one request at a time, and spends the rest on later callers without asking. The
  /// fleet-wide bound becomes capacity + rate * t + P * (batch - 1) admissions in any t, for P processes:
  /// a process holds at most batch - 1 tokens taken and not yet spent. What is left when the limiter is
  /// destroyed goes back to Redis through a shared connection; a connection of the limiter's own is
  /// closed at once, and the rest is lost (unused, never over the bound).
  std::int64_t batch = 1;
};

/// A shared_token_bucket's counters and state, copied under its lock (see shared_limiter_snapshot).
struct shared_token_bucket_snapshot : shared_limiter_snapshot {
  /// The bucket's tokens as of the last reply, plus refill since: an estimate, blind to other processes'
  /// takes since that reply. `capacity` before the first reply.
  double tokens = 0;
  /// The rate in force, tokens per second, as every rate limiter's `limit`: the fleet's stored by set_rate
  /// once this process wrote or saw it in a reply, else get_options().rate.
  double limit = 0;
  std::int64_t capacity = 0;  ///< the burst in force (likewise)
  std::int64_t batch_stock = 0;  ///< tokens taken in a batch and not yet spent (at most batch - 1)
};

namespace detail {

/// What the token bucket's replies teach: the bucket's content at the last reply (the script's third
/// number, in microseconds of refill), so the next caller is held until the refill rather than sent to be
/// refused, and no more requests go on the wire than the bucket is believed to hold tokens.
template <class Clock>
class bucket_model {
 public:
  /// The public type, as messages name it.
  static constexpr std::string_view type_name = "rein::redis::shared_token_bucket";
  using options_type = shared_token_bucket_options;
  using snapshot_type = shared_token_bucket_snapshot;
  using local_type = algo::basic_token_bucket<Clock>;
  using time_point = typename Clock::time_point;
  using duration = typename Clock::duration;

  /// The options, checked: std::invalid_argument naming the type, the field and the value.
  static options_type validated(options_type o) {
    constexpr std::string_view type = type_name;
    const auto fail = [&](const std::string& what) { throw std::invalid_argument(std::string(type) + ": " + what); };
    validate_common(o, type);
    // Its set_rate key is the key in braces: a '}' in a key without a hash tag would give it another slot.
    if (hash_tag(o.key).empty() && o.key.find('}') != std::string::npos)
      fail("key must have a hash tag ({tag}) when it contains '}', got \"" + o.key + "\"");
    if (!(o.rate > 0 && o.rate <= 1e9)) fail("rate must be > 0, finite and at most 1e9 tokens per second, got " + format_number(o.rate));
    if (o.capacity < 1 || o.capacity > 1'000'000'000'000'000)
      fail("capacity must be in [1, 1e15] tokens, got " + std::to_string(o.capacity));
    if (static_cast<double>(o.capacity) / o.rate > 1e9)
      fail("capacity / rate (seconds to refill from empty) must be at most 1e9, got " +
           format_number(static_cast<double>(o.capacity) / o.rate));
    if (o.batch < 1 || o.batch > o.capacity)
      fail("batch must be in [1, capacity] tokens, got " + std::to_string(o.batch) + " with capacity " + std::to_string(o.capacity));
    return o;
  }

  bucket_model(const options_type& o, time_point) : options_(o), interval_us_(1e6 / o.rate), capacity_(o.capacity) {}

  double interval_us() const noexcept { return interval_us_; }

  bool exceeds(std::size_t n) const noexcept { return n > static_cast<std::uint64_t>(capacity_); }

  // When the bucket, as last seen plus refill, holds n tokens.
  time_point ready_at(std::size_t n, time_point) const {
    if (!have_reply_) return time_point::min();
    const double missing_us = static_cast<double>(n) * interval_us_ - available_us_;
    if (missing_us <= 0) return last_reply_at_;
    return rein::detail::add_saturated(last_reply_at_, rein::detail::ceil_duration<duration>(micros(missing_us)));
  }

  time_point firm_until() const noexcept { return time_point::min(); }

  // As many requests on the wire as the bucket is believed to hold tokens (at least one), so a nearly empty
  // bucket is not asked 64 times for one token.
  std::size_t window(time_point now) const {
    if (options_.batch > 1) return 1;  // a batch covers the callers behind it: one request at a time
    const double tokens = std::floor(tokens_estimate(now));
    if (tokens >= static_cast<double>(options_.max_in_flight)) return options_.max_in_flight;
    return tokens < 1 ? 1 : static_cast<std::size_t>(tokens);
  }

  void learn(const verdict& v, time_point now) noexcept {
    // The rate in force: the fleet's when one is stored, else this process's options (also after a
    // set_rate of ours that never reached Redis).
    if (v.stored_interval_ns > 0 && v.stored_capacity > 0) {
      interval_us_ = static_cast<double>(v.stored_interval_ns) / 1000;
      capacity_ = v.stored_capacity;
    } else if (v.what == verdict::kind::allowed || v.what == verdict::kind::denied) {
      set_rate(options_.rate, options_.capacity);
    }
    have_reply_ = true;
    last_reply_at_ = now;
    available_us_ = v.available_us;
  }

  std::int64_t refund_most() const noexcept { return capacity_; }

  /// The rate and capacity in force (set_rate's, once this process wrote or saw them).
  void set_rate(double rate, std::int64_t capacity) noexcept {
    interval_us_ = 1e6 / rate;
    capacity_ = capacity;
  }

  std::optional<local_type> make_local(time_point now) const {
    const double share = options_.fail_open_share;
    const auto local_capacity =
        std::max<std::int64_t>(1, static_cast<std::int64_t>(std::floor(static_cast<double>(options_.capacity) * share)));
    return local_type(algo::token_bucket_options{.rate = options_.rate * share, .capacity = local_capacity}, now);
  }

  void fill(snapshot_type& s, time_point now) const {
    s.tokens = tokens_estimate(now);
    s.limit = 1e6 / interval_us_;
    s.capacity = capacity_;
    s.batch_stock = stock_;
  }

  // ---- batches (scripted_admission's batching-model members) ----------------------------------------------

  std::int64_t ask(std::int64_t n) const noexcept { return std::max(n, options_.batch); }

  bool spend(std::int64_t n) noexcept {
    if (stock_ < n) return false;
    stock_ -= n;
    return true;
  }

  void stock(std::int64_t units) noexcept { stock_ += units; }

  std::int64_t take_stock() noexcept { return std::exchange(stock_, 0); }

 private:
  using micros = std::chrono::duration<double, std::micro>;

  double tokens_estimate(time_point now) const {
    const auto capacity = static_cast<double>(capacity_);
    if (!have_reply_) return capacity;
    const double elapsed_us = micros(std::max(now, last_reply_at_) - last_reply_at_).count();
    return std::min(capacity, (available_us_ + elapsed_us) / interval_us_);
  }

  options_type options_;
  double interval_us_;      // of the rate in force
  std::int64_t capacity_;   // in force
  bool have_reply_ = false;
  time_point last_reply_at_{};
  double available_us_ = 0;  // the bucket's content at last_reply_at_, in microseconds of refill
  std::int64_t stock_ = 0;   // tokens of a batch taken from Redis and not yet spent
};

/// The shared bucket's admission rule, as a remote policy (see scripted_admission).
template <class Clock>
using bucket_admission = scripted_admission<Clock, bucket_model<Clock>>;

}  // namespace detail
}  // namespace rein::redis
