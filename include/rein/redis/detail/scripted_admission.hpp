// What every rein::redis limiter decided by a Lua script shares, apart from any I/O: the tickets of the
// requests on the wire, the outbox, NOSCRIPT recovery, the hold of a denial, the failure policy and the
// refunds of late grants. A remote policy on rein's wait line (rein/detail/remote_admission.hpp); each
// limiter adds its own model of the server's state (the token bucket's, the sliding window's, the quota
// gate's), which says what a verdict teaches and when to ask next.
#pragma once

#include <rein/algo/rate_limit.hpp>
#include <rein/config.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/detail/clock_time.hpp>
#include <rein/detail/limiter_core.hpp>
#include <rein/detail/line_setup.hpp>
#include <rein/detail/remote_admission.hpp>
#include <rein/detail/wait_op.hpp>
#include <rein/error.hpp>
#include <rein/line_options.hpp>
#include <rein/redis/error.hpp>
#include <rein/wait_stats.hpp>

#include REIN_ASIO_HEADER(error.hpp)

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rein::redis {

/// What a shared limiter (shared_token_bucket, shared_sliding_window, shared_quota_gate) does while Redis
/// cannot be asked.
enum class failure_policy : std::uint8_t {
  /// Nothing is admitted: waiting and new acquires complete with errc::unavailable. For quotas that must
  /// never be exceeded (a provider suspends the account).
  fail_closed,
  /// Each process admits by a local, in-process rule holding `fail_open_share` of the shared limit (e.g. 1/N
  /// for N replicas), so the fleet stays near the quota without Redis. For quotas where availability
  /// matters more than exactness.
  fail_open,
};

/// The counters and state every shared limiter reports, copied under its lock, in the vocabulary of the
/// local limiters' snapshots (rein/wait_stats.hpp; docs/observability.md).
///
/// From rein::wait_stats: `waiting` counts every operation not yet completed (on the wire or waiting its
/// turn); wait times run from the acquire call to the grant, round trips included; `acquired_total` counts
/// every grant, fail_open's local ones included (`local_admitted` counts those apart); `rejected_total` and
/// its reasons include `unavailable` (Redis could not be asked and nothing local admitted) and `timed_out`
/// (at the deadline, or at once when Redis said the caller cannot be admitted before it).
struct shared_limiter_snapshot : wait_stats {
  /// Admission requests awaiting Redis's reply. Not `in_flight`, which means "calls holding a slot" in
  /// every snapshot (a shared semaphore's: its permits held).
  std::size_t requests_in_flight = 0;
  bool degraded = false;              ///< Redis was unreachable at the last attempt: on_failure applies
  bool connected = false;             ///< the connection is up
  std::uint64_t remote_allowed = 0;   ///< admissions Redis granted
  std::uint64_t remote_denied = 0;    ///< admissions Redis refused for now (the caller waited and asked again)
  std::uint64_t local_admitted = 0;   ///< admitted by the local rule (fail_open, while degraded)
  std::uint64_t server_errors = 0;    ///< error replies other than NOSCRIPT and the "unavailable" ones
  std::uint64_t script_loads = 0;     ///< NOSCRIPT replies, each answered by SCRIPT LOAD and a retry
  std::uint64_t refunds = 0;          ///< refund requests sent (refund(), what a cancelled caller got; a
                                      ///< semaphore's releases)
  std::uint64_t batch_admitted = 0;   ///< admitted from a batch taken earlier, without a round trip
  std::uint64_t round_trips = 0;      ///< admission replies received
  std::chrono::nanoseconds round_trip_last{0};   ///< request sent to reply settled, last admission
  std::chrono::nanoseconds round_trip_total{0};  ///< mean = round_trip_total / round_trips
  /// The longest admission round trip so far.
  std::chrono::nanoseconds round_trip_max{0};
  /// Every admission round trip (request handed to the connection to reply settled; a request never
  /// answered is not counted): the log histogram the wait times use (rein::duration_histogram).
  duration_histogram round_trip{};
  /// Redis's own clock (`TIME`, which every script reads) when it last granted an admission of this
  /// limiter: the server's time of that admission, to the microsecond; the epoch before the first.
  std::chrono::system_clock::time_point server_time_last{};
  std::chrono::microseconds retry_after_last{0};  ///< the retry-after of the last denial, as Redis computed it
};

namespace detail {

/// What a reply to a limiter's script says (see read_verdict in scripted_transport.hpp). Every script
/// answers {allowed (1/0), retry_after (microseconds until the request would be allowed), available (what
/// the model reads: the bucket's content in microseconds of refill, the window's free places, ...)}.
struct verdict {
  /// `lost`: the server no longer knows the caller (a shared semaphore's lease expired); the model decides.
  enum class kind : std::uint8_t { allowed, denied, lost, no_script, unavailable, server_error };
  kind what = kind::unavailable;
  double retry_after_us = 0;  ///< denied: microseconds until the request would be allowed
  double available_us = 0;    ///< allowed or denied: the third number of the reply (see the model)
  std::string message;        ///< the server's error text (empty for a request that was never answered)
  std::int64_t units = 0;     ///< allowed: units the server granted, when it says (a batch); 0: as asked
  /// A rate stored for the whole fleet (a shared bucket's set_rate) that decided instead of the caller's:
  /// nanoseconds per token and the capacity; 0: none stored.
  std::int64_t stored_interval_ns = 0;
  std::int64_t stored_capacity = 0;
  /// allowed, denied or lost: the server's TIME when the script ran, microseconds since the Unix epoch (the
  /// instant of its decision; a shared window stamps an admission with it); 0: not said.
  std::int64_t server_time_us = 0;
};

/// One request for the connection.
struct message {
  enum class kind : std::uint8_t { admission, refund, script_load, pause, renew };
  kind what = kind::admission;
  std::uint64_t ticket = 0;  ///< admission: its verdict goes back to settle(ticket, ...)
  std::int64_t n = 0;        ///< admission: units wanted; refund: units given back; pause: microseconds
  /// pause: the jitter added to the release, microseconds; admission, refund and renew: the model's tag
  /// (a shared semaphore's lease, see Model::tag below), or for an admission of a batching model the most
  /// units to take (0: n exactly), or for an admission of a queueing model the microseconds its caller
  /// will still wait (at least 1; 0: no deadline).
  std::int64_t extra = 0;
  /// admission of a queueing model: the units its process waits for (those on the wire, this op's and those
  /// of the ops behind it in the line, 64 ops at most), which the server's queue holds places for.
  std::int64_t wanted = 0;
  /// refund or pause: sent again after the server answered NOSCRIPT (see on_side_error; once at most).
  std::uint8_t resent = 0;
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

/// The shortest text that reads back as `v`.
inline std::string format_number(double v) {
  std::array<char, 32> buffer{};
  const auto result = std::to_chars(buffer.data(), buffer.data() + buffer.size(), v);
  return std::string(buffer.data(), result.ptr);
}

/// Checks the options every shared limiter has (failure policy, window of requests, recheck, key parts):
/// std::invalid_argument naming `type`, the field and the value.
template <class Options>
void validate_common(const Options& o, std::string_view type) {
  const auto fail = [&](const std::string& what) { throw std::invalid_argument(std::string(type) + ": " + what); };
  if (o.key.empty()) fail("key must not be empty");
  if constexpr (requires { o.prefix; }) {
    const auto braced = [](const std::string& s) { return s.find_first_of("{}") != std::string::npos; };
    if (braced(o.key)) fail("key must not contain '{' or '}' (it becomes the hash tag), got \"" + o.key + "\"");
    if (braced(o.prefix)) fail("prefix must not contain '{' or '}', got \"" + o.prefix + "\"");
  }
  if (!(o.fail_open_share > 0 && o.fail_open_share <= 1))
    fail("fail_open_share must be in (0, 1], got " + format_number(o.fail_open_share));
  if (o.max_in_flight < 1) fail("max_in_flight must be >= 1, got 0");
  if (o.recheck_interval.count() < 0)
    fail("recheck_interval must be >= 0, got " + std::to_string(o.recheck_interval.count()) + "ms");
}

/// The wait line's options of a shared limiter, checked (a remote line serves in fifo order and refuses the
/// newest: its requests are pipelined in order).
inline rein::detail::line_options line_options_of(std::string_view type, rein::line_options line) {
  constexpr std::string_view pipelined = "its requests are pipelined to Redis in order";
  return rein::detail::line_of(type, std::move(line),
                               {.fifo_only = pipelined, .no_evict = pipelined, .no_sojourn = "Redis decides the waits"});
}

/// A limiter's Redis key for `suffix`: prefix + "{" + key + "}" + suffix. The braces make `key` the hash
/// tag, so every key of one limiter lives in one Redis Cluster slot (its script touches one slot).
template <class Options>
std::string tagged_key(const Options& o, std::string_view suffix) {
  return o.prefix + "{" + o.key + "}" + std::string(suffix);
}

/// What a model of counted places (a sliding window's, a semaphore's) shares: the free places the last
/// reply reported (the script's third number), so no more requests go on the wire than there are places
/// (at least one); places free up as others leave, which only asking tells, so no estimate of its own.
template <class Clock, class Options>
class free_places_model {
 public:
  using time_point = typename Clock::time_point;

  free_places_model(const Options& o, time_point) : options_(o), free_(o.limit) {}

  bool exceeds(std::size_t n) const noexcept { return n > static_cast<std::uint64_t>(options_.limit); }
  time_point ready_at(std::size_t, time_point) const noexcept { return time_point::min(); }
  time_point firm_until() const noexcept { return time_point::min(); }

  std::size_t window(time_point) const noexcept {
    if (free_ >= static_cast<std::int64_t>(options_.max_in_flight)) return options_.max_in_flight;
    return free_ < 1 ? 1 : static_cast<std::size_t>(free_);
  }

  void learn(const verdict& v, time_point) noexcept { free_ = static_cast<std::int64_t>(v.available_us); }
  std::int64_t refund_most() const noexcept { return options_.limit; }

 protected:
  const Options& get_options() const noexcept { return options_; }
  std::int64_t free_places() const noexcept { return free_; }

 private:
  Options options_;
  std::int64_t free_;  // free places as of the last reply
};

/// A limiter decided by a script, as a remote policy (rein/detail/remote_admission.hpp).
///
/// Asking: the first waiting op is sent (one admission message, a ticket) once the model says the server
/// would admit it (`ready_at`) and the last denial's retry-after has passed; no more requests are in flight
/// than the model's window (at least one, at most max_in_flight). A denial holds the line for the
/// retry-after Redis computed when the denied op is the first waiting one; while such a hold (or the model's
/// firm_until) lasts, a first waiting op whose deadline comes before its end fails at once with rein::errc::timed_out (Redis said it
/// cannot be admitted by then). The model's own estimate (e.g. the bucket's refill) only delays asking: it
/// is blind to other processes' refunds, so it fails nobody.
///
/// Failing: a verdict `unavailable` (no reply, or LOADING, BUSY ...) degrades the limiter for
/// recheck_interval, and then until `link_up()` says the connection is back: meanwhile fail_closed fails each
/// waiting op with errc::unavailable in line order, and fail_open admits by the model's local rule (after
/// the model's firm_until).
/// NOSCRIPT is answered by SCRIPT LOAD and the same admission (twice at most); any other error reply fails
/// the op with errc::server_error.
///
/// Giving back: a verdict "allowed" for a ticket whose op left the line (cancelled, timed out, closed), and a
/// revoked grant, send a refund of their units (best effort), if the model has something to give back.
/// For a holding model, so does a stale grant (one the model's `fresh` refuses: its request left longer
/// than a lease ago, or under a lease since replaced): its op is not granted but asked again, so a process
/// that stalled with a grant in its socket never counts a permit its lease may no longer hold.
///
/// The Model (one per limiter) holds what the replies taught about the server's state:
///   using options_type; using snapshot_type (derived from shared_limiter_snapshot); using local_type
///   Model(const options_type&, time_point now)   options already validated
///   bool exceeds(n)                               n can never be admitted
///   time_point ready_at(n, now)                   when the server would admit n, as last seen (min: now)
///   time_point firm_until()                       before then nothing is admitted, for certain (min: none)
///   std::size_t window(now)                       most requests worth having on the wire (>= 1)
///   void learn(const verdict&, now)               an allowed or denied verdict
///   std::int64_t refund_most()                    the largest refund worth sending (0: nothing to refund)
///   std::optional<local_type> make_local(now)     fail_open's local rule (try_take, ready_at, refund)
///   void fill(snapshot_type&, now)                its part of the snapshot
/// and, for a model that takes units in batches (a shared bucket with `batch` > 1: `bool batching()`):
///   std::int64_t ask(n)                           most units to ask for when n are wanted (>= n)
///   bool spend(n)                                 take n from the units granted and not yet spent
///   void stock(units)                             units granted beyond what the op wanted
///   std::int64_t take_stock()                     everything not yet spent (to give back)
/// and, for a model whose grants are held until released (a shared semaphore: `static constexpr bool holds`):
///   std::int64_t tag()                            what every message carries (its lease), read when sent
///   bool owns(granted_at)                         whether a grant made then still counts on the server
///   bool fresh(tag, sent, now)                    whether a grant asked for at `sent` with `tag` may be
///                                                 honoured now (false: given back and asked again)
///   bool on_reply(tag, const verdict&, sent, now) an answer to a message sent at `sent` with `tag`; true:
///                                                 the lease is lost (nothing is held any more)
///   std::optional<std::int64_t> renewal()         the tag a lease renewal is sent with (none: no renewal)
/// and, for a model whose server ranks the waiting processes (a shared window's fleet queue: `static
/// constexpr bool queues`): each admission carries how long its caller will still wait (until its deadline),
/// so that the server queues only a caller still waiting at its turn, not one that gives up before, and
/// how many units this process waits for in all, so that the server holds places for all of them.
template <class Clock, class Model>
class scripted_admission {
  using remote_step = rein::detail::remote_step;
  using remote_settled = rein::detail::remote_settled;

 public:
  /// The public type, as messages name it.
  static constexpr std::string_view type_name = Model::type_name;
  static constexpr bool needs_time = true;
  using time_point = typename Clock::time_point;
  using duration = typename Clock::duration;
  using outbox = message_list;
  using model_type = Model;
  using options_type = typename Model::options_type;
  using snapshot_type = typename Model::snapshot_type;

  /// `link_up` says whether the connection is up. It is called under the line's lock, so it must be cheap
  /// and never call back into the line; it may start work that makes a later answer yes (a cluster's route
  /// starts connecting to its slot's master and asks for the slot map).
  scripted_admission(options_type o, std::function<bool()> link_up, time_point now)
      : options_(Model::validated(std::move(o))), model_(options_, now), link_up_(std::move(link_up)) {
    if (options_.on_failure == failure_policy::fail_open) local_ = model_.make_local(now);
  }

  const options_type& get_options() const noexcept { return options_; }
  Model& model() noexcept { return model_; }
  const Model& model() const noexcept { return model_; }

  // ---- admission_policy ----------------------------------------------------------------------------------

  bool exceeds(std::size_t n) const noexcept { return model_.exceeds(n); }

  /// Only a request for nothing is decided without Redis.
  bool try_take(std::size_t n, time_point) const noexcept { return n == 0; }

  /// For the first waiting op: when to offer it again. time_point::max() while only a verdict (a free place
  /// in the window) can move it.
  time_point ready_at(std::size_t n, time_point now) const {
    if (!degraded_at(now)) {
      const time_point at = remote_ready_at(n, now);
      return at > now ? at : time_point::max();
    }
    if (!local_) return time_point::max();  // fail_closed: every waiting op fails at once
    time_point wake = local_->ready_at(static_cast<std::int64_t>(n), now).value_or(time_point::max());
    wake = std::max(wake, model_.firm_until());
    if (degraded_until_ > now) wake = std::min(wake, degraded_until_);  // then Redis is asked again
    return wake;
  }

  /// Redis decides, so no bound is known in advance; a denial's retry-after fails the deadlines before it.
  std::optional<time_point> predict(std::size_t, std::size_t, time_point) const noexcept { return std::nullopt; }

  /// A permit came back: a holding model's units go back to the server (or to the local rule that granted
  /// them); nothing for a rate rule, which holds nothing.
  void on_release(std::size_t n, std::chrono::nanoseconds stamp, outcome, time_point now) noexcept {
    if constexpr (holding) give_back(static_cast<std::int64_t>(n), time_point(std::chrono::duration_cast<duration>(stamp)), now);
    else (void)n, (void)stamp, (void)now;
  }

  /// A holding model's grant just made (the line asks right after it): the server's TIME of Redis's grant,
  /// microseconds since the Unix epoch, or 0 for a grant Redis did not make; its permit carries it
  /// (rein::redis::server_time(permit)).
  std::uint64_t grant_note() const noexcept
    requires requires { requires Model::holds; }
  {
    return static_cast<std::uint64_t>(grant_server_us_);
  }

  /// A grant taken back before its handler ran: its units go back to Redis, or, for a grant the local rule
  /// made (told by its grant time, `granted_at`), to the local rule, even after Redis answers again.
  void on_revoke(std::size_t n, time_point granted_at, time_point now) noexcept {
    give_back(static_cast<std::int64_t>(n), granted_at, now);
  }

  // ---- remote_policy -------------------------------------------------------------------------------------

  remote_step admit(rein::detail::wait_op* op, std::size_t count, time_point now) noexcept {
    const auto n = static_cast<std::int64_t>(count);
    if (n == 0) return grant_units(0, 0);  // nothing asked of Redis
    if constexpr (batches) {
      if (model_.spend(n)) {  // taken from Redis earlier, in a batch
        ++stats_.batch_admitted;
        return remote_step::grant();
      }
    }
    if (!degraded_at(now)) {
      leave_degraded(now);
      // A semaphore's retry-after is a polling hint (a permit of this process may come back sooner), not a
      // bound: only a rate rule's denial says "not before then".
      const time_point firm = holding ? model_.firm_until() : std::max(hold_until_, model_.firm_until());
      const std::int64_t deadline_ns = op->deadline_ns();
      if (firm > now && deadline_ns != rein::detail::no_deadline && rein::detail::to_ns_saturated(firm) > deadline_ns) {
        // Redis said: not by then.
        return remote_step::refuse(make_error_code(rein::errc::timed_out), reject_reason::timed_out);
      }
      const time_point at = remote_ready_at(count, now);
      if (in_flight_ >= model_.window(now) || at > now) return remote_step::wait();
      const std::uint64_t ticket = first_ticket_ + tickets_.size();
      const std::int64_t tag = queues ? patience_us(*op, now) : batch_ask(n);
      try {
        tickets_.push_back(pending{op, n, now, tag, 0, false});
        outbox_.push({message::kind::admission, ticket, n, tag, queues ? in_flight_units_ + demand(*op) : 0});
      } catch (...) {
        if (tickets_.size() > ticket - first_ticket_) tickets_.pop_back();
        return remote_step::fail(net::error::no_memory);
      }
      ++in_flight_;
      in_flight_units_ += n;
      return remote_step::sent(ticket);
    }
    if (!local_) {
      return unavailable_step();
    }
    if (model_.firm_until() > now) return remote_step::wait();  // e.g. a pause this process wrote
    switch (local_->try_take(n, now)) {
      case algo::take_result::denied: return remote_step::wait();
      case algo::take_result::exceeds_capacity:
        return unavailable_step();
      case algo::take_result::allowed: break;
    }
    ++stats_.local_admitted;
    local_grants_ += n;
    return grant_units(n, 0);
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
      outbox_.push({message::kind::script_load, 0, 0, 0});
      if constexpr (holding) t.tag = model_tag();  // a new lease since; a batch asks as before
      outbox_.push({message::kind::admission, ticket, t.n, t.tag});
      return {t.op, remote_step::keep()};
    }
    rein::detail::wait_op* op = t.op;
    const std::int64_t n = t.n;
    const std::int64_t tag = t.tag;
    const time_point sent = t.sent;
    retire(t);
    learn(v, now);
    bool stale = false;  // a holding model's grant that may have outlived its lease: given back, asked again
    if constexpr (holding) {
      stale = v.what == kind::allowed && op != nullptr && !model_.fresh(tag, sent, now);
      if (model_.on_reply(tag, v, sent, now)) held_units_ = 0;
      if (v.what == kind::allowed && op != nullptr && !stale) held_units_ += n;
    } else {
      (void)tag, (void)sent;
    }
    pending_hold_.reset();
    const std::int64_t granted = v.what == kind::allowed && v.units > 0 ? v.units : n;
    if (op == nullptr || stale) {
      if (v.what == kind::allowed) send_refund(granted, holding ? tag : 0);  // under the lease it was granted to
      if (stale) ++stale_grants_;
      return {op, remote_step::wait()};  // a stale grant's op asks again, after the refund
    }
    if constexpr (batches) {
      if (v.what == kind::allowed && granted > n) model_.stock(granted - n);
    }
    switch (v.what) {
      case kind::allowed: return {op, grant_units(n, v.server_time_us)};
      case kind::denied:
        pending_hold_ = rein::detail::add_saturated(now, from_us(v.retry_after_us));
        return {op, remote_step::wait()};
      case kind::unavailable:  // the failure policy applies to it in line order
      case kind::lost:         // asked again as the model's new tag says
        return {op, remote_step::wait()};
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
      } catch (...) {  // no memory while a send is slow to take the line's queue: these messages are lost
      }
    }
    outbox_.clear();
  }

  // ---- The I/O object's other entry points --------------------------------------------------------------

  /// Gives n units back to the server (at most the model's refund_most): one refund message, which ends the
  /// hold of the last denial (the next admission, sent after the refund, asks again). Nothing for a model
  /// with nothing to give back.
  void refund(std::int64_t n) { send_refund(n, model_tag()); }

  /// Gives back the units of a batch not yet spent (when the limiter goes away).
  void release_unspent() {
    if constexpr (batches) refund(model_.take_stock());
  }

  /// Queues a message that is not an admission (fire and forget, e.g. a pause).
  void send(const message& m) { outbox_.push(m); }

  /// A side request `m` (refund, script load, pause) came back with an error. One that failed because the
  /// server lost its scripts (SCRIPT FLUSH, a failover to a replica that never loaded them) is sent again
  /// after a SCRIPT LOAD, once: a lost refund would keep units the fleet could use, and a lost pause would
  /// let the other processes call an upstream that asked everyone to wait. A shared semaphore's release is
  /// not sent again: its lease renewal already states what the lease holds, so a lost release is made up
  /// within a renewal, while a release resent after that renewal would count it twice, below what is held.
  void on_side_error(const message& m, bool no_script) {
    const bool release = holding && m.what == message::kind::refund;
    if (no_script && m.what != message::kind::script_load && m.resent == 0 && !release) {
      ++stats_.script_loads;
      outbox_.push({message::kind::script_load, 0, 0, 0});
      message again = m;
      again.resent = 1;
      outbox_.push(again);
      return;
    }
    ++stats_.server_errors;
  }

  /// A holding model's lease renewal, if it has one to renew (a timer of the I/O object calls this).
  /// The renewal says how many permits this lease may hold at most (those granted and not given back, and
  /// those asked for on the wire), so that the server forgets the releases it never received, and at least
  /// (those granted and not given back), so that a release arriving late cannot leave the count too low.
  void renew() {
    if constexpr (holding) {
      if (const std::optional<std::int64_t> tag = model_.renewal())  // `ticket` carries the least
        outbox_.push({message::kind::renew, static_cast<std::uint64_t>(held_units_), held_units_ + in_flight_units_, *tag});
    }
  }

  /// The answer to a renewal sent at `sent` with `tag` (unavailable when it got none: the lease runs on).
  void on_renewed(std::int64_t tag, const verdict& v, time_point sent, time_point now) {
    if constexpr (holding) {
      if (v.what == verdict::kind::unavailable) return;
      if (v.what == verdict::kind::no_script) {  // the server lost its scripts: load, the next renewal works
        ++stats_.script_loads;
        outbox_.push({message::kind::script_load, 0, 0, 0});
        return;
      }
      if (v.what == verdict::kind::server_error) {
        ++stats_.server_errors;
        return;
      }
      if (model_.on_reply(tag, v, sent, now)) held_units_ = 0;
    } else {
      (void)tag, (void)v, (void)sent, (void)now;
    }
  }

  /// What the observer's events compare, for a model that reports state (a shared gate's pause): see
  /// rein::detail::observed_state.
  rein::detail::observed_state observe(time_point now) const noexcept
    requires requires(const Model& m) { m.observe(now); }
  {
    return model_.observe(now);
  }

  /// The policy's counters and state (the line adds its own statistics).
  snapshot_type snapshot(time_point now) const {
    snapshot_type s{};
    static_cast<shared_limiter_snapshot&>(s) = stats_;
    s.requests_in_flight = in_flight_;
    s.degraded = degraded_;
    if constexpr (holding) {
      s.in_flight = static_cast<std::size_t>(out_units_);
      s.held = held_units_;
      s.stale_grants = stale_grants_;
    }
    model_.fill(s, now);
    return s;
  }

 private:
  struct pending {
    rein::detail::wait_op* op;  // null once its op left the line
    std::int64_t n;
    time_point sent;
    std::int64_t tag;  // the model's tag it was sent with
    std::uint8_t attempts;
    bool done;
  };

  using micros = std::chrono::duration<double, std::micro>;

  // A model whose grants are held until released (see the class comment).
  static constexpr bool holding = requires { requires Model::holds; };

  std::int64_t model_tag() const noexcept {
    if constexpr (holding) return model_.tag();
    else return 0;
  }

  // A model that takes units in batches (see the class comment).
  static constexpr bool batches = requires(Model& m) { m.spend(std::int64_t{}); };

  // A model whose server ranks the waiting processes (see the class comment).
  static constexpr bool queues = requires { requires Model::queues; };

  // How long `op` will still wait, in microseconds: at least 1 (a deadline due now), 0 without a deadline.
  static std::int64_t patience_us(const rein::detail::wait_op& op, time_point now) noexcept {
    const std::int64_t deadline_ns = op.deadline_ns();
    if (deadline_ns == rein::detail::no_deadline) return 0;
    return std::max<std::int64_t>(1, rein::detail::ns_between(deadline_ns, rein::detail::to_ns_saturated(now)) / 1000);
  }

  // The units waiting from `op` on: its own and those of the ops behind it in the line (a remote line is
  // FIFO), 64 ops at most, so that a long line costs no long walk. Those on the wire come on top.
  static std::int64_t demand(const rein::detail::wait_op& op) noexcept {
    std::int64_t units = 0;
    int ops = 0;
    for (const rein::detail::wait_op* w = &op; w != nullptr && ops < 64; w = w->next, ++ops)
      units += static_cast<std::int64_t>(w->count);
    return units;
  }

  // An admission's tag: a holding model's lease, or the batch to ask for (0: n exactly).
  std::int64_t batch_ask(std::int64_t n) const noexcept {
    if constexpr (batches) {
      const std::int64_t most = model_.ask(n);
      return most > n ? most : 0;
    } else {
      return (void)n, model_tag();
    }
  }

  void send_refund(std::int64_t n, std::int64_t tag) {
    const std::int64_t most = model_.refund_most();
    if (n <= 0 || most <= 0) return;
    ++stats_.refunds;
    outbox_.push({message::kind::refund, 0, std::min(n, most), tag});
    hold_until_ = time_point::min();  // what the last denial said no longer holds: ask again (after the refund)
  }

  // The server's time of a verdict, as a time of the system clock (whose epoch is Unix time's).
  static std::chrono::system_clock::time_point server_time(const verdict& v) noexcept {
    return std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::microseconds(v.server_time_us)));
  }

  // Redis cannot be asked and nothing local admits: counted by the line as wait_stats::unavailable_total.
  static remote_step unavailable_step() noexcept {
    return remote_step::refuse(make_error_code(errc::unavailable), reject_reason::unavailable);
  }

  // A count of microseconds from a verdict as a duration of the clock: rounded up, saturated.
  static duration from_us(double us) noexcept { return rein::detail::ceil_duration<duration>(micros(us)); }

  bool degraded_at(time_point now) const { return degraded_ && !(now >= degraded_until_ && link_up_()); }

  time_point remote_ready_at(std::size_t n, time_point now) const { return std::max(hold_until_, model_.ready_at(n, now)); }

  // A grant of n units to a waiting op, by Redis at `server_us` (0: by the local rule): a holding model's
  // callers hold them until given back, and the permit notes the server's time (grant_note).
  remote_step grant_units(std::int64_t n, std::int64_t server_us) noexcept {
    if constexpr (holding) {
      out_units_ += n;
      grant_server_us_ = server_us;
    } else {
      (void)server_us;
    }
    return remote_step::grant();
  }

  void give_back(std::int64_t n, time_point granted_at, time_point now) noexcept {
    if constexpr (holding) out_units_ -= std::min(n, out_units_);
    try {
      if (local_ && take_local_grant(n, granted_at)) {
        local_->refund(n, now);
        return;
      }
      if constexpr (holding) {
        if (!model_.owns(granted_at)) return;  // its lease was lost: the server already took it back
        held_units_ -= std::min(n, held_units_);
      }
      refund(n);
    } catch (...) {  // best effort, as every refund: without memory for the message the units stay taken
    }
  }

  // Whether a revoked (or, for a holding model, released) grant of n made at `granted_at` was the local
  // rule's: only the local rule grants while degraded, and Redis's grants end a degraded spell, so a grant
  // made within a spell was local. A rate rule's grants are revoked at once, so the last spell that ended
  // is enough; a permit may be held across any number of outages, so a holding model remembers every spell
  // whose local permits are not all back. A grant at the very instant a spell ended counts as local while
  // the spell's local units last: giving Redis units it never gave would let the fleet overshoot; keeping
  // them only under-uses the limit.
  bool take_local_grant(std::int64_t n, time_point granted_at) noexcept {
    if (degraded_ && granted_at >= degraded_since_ && local_grants_ >= n) {
      local_grants_ -= n;
      return true;
    }
    for (auto s = spells_.rbegin(); s != spells_.rend(); ++s) {
      if (granted_at >= s->since && granted_at <= s->until && s->local_units >= n) {
        s->local_units -= n;
        if (s->local_units == 0) spells_.erase(std::next(s).base());
        return true;
      }
    }
    return false;
  }

  void enter_degraded(time_point now) noexcept {
    if (degraded_) return;
    degraded_ = true;
    degraded_since_ = now;
  }

  // Redis answers again: what the local rule granted in this spell is remembered for late revocations.
  void leave_degraded(time_point now) noexcept {
    if (!degraded_) return;
    degraded_ = false;
    if constexpr (!holding) spells_.clear();  // revocations come at once: only the last spell matters
    if (local_grants_ > 0) {
      try {
        spells_.push_back({degraded_since_, now, local_grants_});
      } catch (...) {  // no memory: its local grants will be given to Redis (as after the last spell ended)
      }
    }
    local_grants_ = 0;
  }

  void record_round_trip(const pending& t, time_point now) {
    const auto rtt = std::chrono::duration_cast<std::chrono::nanoseconds>(std::max(now, t.sent) - t.sent);
    ++stats_.round_trips;
    stats_.round_trip_last = rtt;
    stats_.round_trip_total += rtt;
    stats_.round_trip_max = std::max(stats_.round_trip_max, rtt);
    stats_.round_trip.record(rtt);
  }

  void retire(pending& t) noexcept {
    t.done = true;
    t.op = nullptr;
    --in_flight_;
    in_flight_units_ -= t.n;
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
        leave_degraded(now);
        model_.learn(v, now);
        if (v.what == kind::allowed) {
          ++stats_.remote_allowed;
          stats_.server_time_last = server_time(v);
          hold_until_ = time_point::min();
        } else {
          ++stats_.remote_denied;
          stats_.retry_after_last = rein::detail::ceil_duration<std::chrono::microseconds>(micros(v.retry_after_us));
        }
        return;
      case kind::unavailable:
        enter_degraded(now);
        degraded_until_ = rein::detail::add_saturated(now, std::chrono::duration_cast<duration>(options_.recheck_interval));
        return;
      case kind::lost:  // the server answered: the model starts a new lease (on_reply)
        leave_degraded(now);
        model_.learn(v, now);
        return;
      case kind::no_script:
      case kind::server_error:
        ++stats_.server_errors;
        return;
    }
  }

  options_type options_;
  Model model_;
  std::function<bool()> link_up_;
  std::optional<typename Model::local_type> local_;
  std::int64_t local_grants_ = 0;  // units the local rule granted in the current degraded spell
  struct spell {
    time_point since = time_point::max();  // empty: no grant time falls inside
    time_point until = time_point::min();
    std::int64_t local_units = 0;  // its local grants not revoked yet
  };
  // The degraded spells that ended with local grants not all given back (a rate rule: only the last one).
  std::vector<spell> spells_;
  time_point degraded_since_{};

  std::deque<pending> tickets_;
  std::uint64_t first_ticket_ = 0;  // the ticket of tickets_.front()
  std::size_t in_flight_ = 0;       // tickets not yet settled, forgotten ones included
  std::int64_t in_flight_units_ = 0;  // what those tickets ask for
  std::int64_t held_units_ = 0;     // a holding model: granted by the server, not given back (current lease)
  std::int64_t out_units_ = 0;      // a holding model: granted to callers (by Redis or locally), not given back
  std::int64_t grant_server_us_ = 0;  // a holding model: the server's time of the grant just made (0: local)
  std::uint64_t stale_grants_ = 0;  // a holding model: grants refused as stale (see `fresh`)
  message_list outbox_;

  time_point hold_until_ = time_point::min();
  std::optional<time_point> pending_hold_;
  bool degraded_ = false;
  time_point degraded_until_{};

  shared_limiter_snapshot stats_{};
};

}  // namespace detail
}  // namespace rein::redis
