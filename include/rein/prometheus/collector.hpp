// rein's limiters as Prometheus metrics (prometheus-cpp), read from their snapshots at scrape time.
#pragma once

#include <rein/algo/log_histogram.hpp>
#include <rein/observer.hpp>
#include <rein/partition.hpp>

#include <prometheus/client_metric.h>
#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>
#include <prometheus/metric_type.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace rein::prometheus {

// What every metric is named and what it means. All carry the label `limiter` (the registration's name);
// per-key series of a keyed registry add `key`.
//
// | metric                          | type      | from the snapshot                                      |
// | ------------------------------- | --------- | ------------------------------------------------------ |
// | rein_acquired_total             | counter   | acquired_total                                         |
// | rein_rejected_total{reason}     | counter   | each reason for_each_rejected() lists                  |
// | rein_cancelled_total            | counter   | cancelled_total                                        |
// | rein_waiting                    | gauge     | waiting                                                |
// | rein_in_flight                  | gauge     | in_flight                                              |
// | rein_limit                      | gauge     | limit (calls, or units per second for rates)           |
// | rein_utilisation_ratio          | gauge     | utilisation                                            |
// | rein_tokens                     | gauge     | tokens                                                 |
// | rein_held                       | gauge     | held: permits a shared semaphore's lease holds (Redis) |
// | rein_free                       | gauge     | free: a shared semaphore's permits or shared window's  |
// |                                 |           | places free fleet-wide, as last seen from the server   |
// | rein_fail_open_acquired_total   | counter   | local_admitted: a shared limiter's grants by its local |
// |                                 |           | rule while Redis could not be asked (fail_open); also  |
// |                                 |           | counted in rein_acquired_total                         |
// | rein_redis_round_trip_seconds   | histogram | round_trip: a shared limiter's admission requests,     |
// |                                 |           | sent to answered (the buckets of rein_wait_seconds)    |
// | rein_reserved_total             | counter   | a rate limiter's reservations (reserve())              |
// | rein_reservations_cancelled_total | counter | ... of those cancelled before their time               |
// | rein_reserved_returned_total    | counter   | ... units those cancellations gave back                |
// | rein_paused                     | gauge     | paused (0 or 1)                                        |
// | rein_circuit_state              | gauge     | an adaptive limiter's circuit: 0 closed, 1 half-open,  |
// |                                 |           | 2 open (ordered by how much is refused)                |
// | rein_circuit_opens_total        | counter   | circuit_opens (times the circuit opened)               |
// | rein_leases_expired_total       | counter   | a semaphore's leases_expired_total (with_lease: leases |
// |                                 |           | that ran out before their permits came back)           |
// | rein_wait_seconds               | histogram | wait (le = 1.024 us x 4^j, up to 73 min)              |
// | rein_service_seconds            | histogram | service (adaptive limiters: grant to outcome)          |
// | rein_partition_guaranteed{partition} | gauge | each partition's guarantee (partitions; the unnamed     |
// |                                 |           | rest has an empty partition label, i.e. none)          |
// | rein_partition_in_flight{partition}  | gauge | ... its holdings                                       |
// | rein_partition_waiting{partition}    | gauge | ... its waiters                                        |
// | rein_partition_acquired_total{partition} | counter | ... its grants                                   |
// | rein_keys                       | gauge     | a keyed registry's live keys                           |
// | rein_keys_created_total         | counter   | ... limiters made                                      |
// | rein_keys_evicted_total         | counter   | ... idle limiters dropped                              |
// | rein_keys_unexported            | gauge     | ... live keys left out by the cardinality cap          |
// | rein_upstream_rejections_total  | counter   | a throttle's guard.reject() calls (upstream 429s)      |
// | rein_throttle_stage_acquired_total{stage,kind,as} | counter | a throttle's acquisitions at each  |
// |                                 |           | stage, each counted once, as: admitted, readmitted,   |
// |                                 |           | abandoned, reconciled (throttle_stage_counts)          |
// | rein_throttle_stage_given_back_total{stage,kind} | counter | ... takes given back before admission |
// | rein_retry_attempts_total       | counter   | a retry policy's attempts (first ones included)        |
// | rein_retries_total              | counter   | ... attempts after a failure                           |
// | rein_hedge_attempts_total       | counter   | a hedge policy's attempts (hedges included)            |
// | rein_hedges_total{outcome}      | counter   | ... hedges started, won, cancelled, refused (budget)   |
//
// A throttle's own rein_acquired_total counts admissions (one per guard); a stage's counts every grant it
// made, the throttle's re-takes included. The throttle's per-stage series say which is which without
// counting anything twice: summed over `as`, rein_throttle_stage_acquired_total{stage="i"} is the stage's
// rein_acquired_total (when only this throttle acquires from it), and its `as="admitted"` series is the
// honest count of calls that passed the stage. `stage` is the place in the list ("0" for the first), `kind`
// its rein::throttle_stage (admission, gate, per_key, global, rate); a rein::unlimited place has no series.
//
// Histogram buckets are exact: every `le` is a bucket boundary of rein::algo::log_histogram (a power of
// two of nanoseconds), so `rein_wait_seconds_bucket` counts are the limiter's own, not estimates.

/// Options of collector::add_keyed.
struct keyed_export_options {
  /// At most this many keys get per-key series at each scrape (a bound on label cardinality: keys may be
  /// invented by callers); the rest are counted in rein_keys_unexported. Default: 100.
  std::size_t max_keys = 100;
};

/// A prometheus-cpp Collectable holding rein limiters: `exposer.RegisterCollectable(collector)`.
///
/// ```
///   auto metrics = std::make_shared<rein::prometheus::collector>();
///   metrics->add(throttle);
///   metrics->add(rate);
///   metrics->add(global);
///   metrics->add_keyed(per_host, {}, {.max_keys = 10});
///   prometheus::Exposer exposer("127.0.0.1:" + args.port);
///   exposer.RegisterCollectable(metrics);
/// ```
/// (From examples/prometheus/prometheus_throttle.cpp, which CI builds.) `add` takes any rein limiter,
/// throttle or retry policy; `add_keyed` a keyed registry with up to max_keys of its keys' limiters.
///
/// Everything is read at scrape time from each object's snapshot() (a copy under its lock, a few hundred ns
/// for the histograms); nothing is added to the limiters' own paths. Metric names follow Prometheus'
/// conventions (base units, `_total` counters, `_seconds` histograms; the table at the top of this file).
///
/// @par Lifetime
/// A registered object must outlive its registration: call remove(name) first, or destroy the collector
/// (unregistered from the exposer) first.
///
/// @par Thread Safety
/// add, remove and Collect may be called concurrently (an internal mutex); the registered objects are read
/// through their thread-safe snapshot() (rein's std::mutex variants).
class collector : public ::prometheus::Collectable {
 public:
  /// Registers `object` (a rein limiter, throttle or retry policy: anything with snapshot()) as `name`;
  /// an empty `name` takes object.name(). @throws std::invalid_argument if the name is empty or taken.
  template <class Object>
  void add(const Object& object, std::string name = {}) {
    if (name.empty()) {
      if constexpr (requires { object.name(); }) name = std::string(object.name());
    }
    insert(std::move(name), [&object](sink& out, const labels& l) { export_snapshot(out, l, object.snapshot()); });
  }

  /// Registers a rein::keyed registry as `name` (empty: its options' name): its own counters, and the
  /// metrics of at most `options.max_keys` keys' limiters with a `key` label.
  template <class Keyed>
  void add_keyed(Keyed& registry, std::string name = {}, keyed_export_options options = {}) {
    if (name.empty()) name = registry.name();
    insert(std::move(name), [&registry, options](sink& out, const labels& l) {
      const auto s = registry.snapshot();
      out.gauge("rein_keys", "Live keys of a keyed registry.", l, static_cast<double>(s.keys));
      out.counter("rein_keys_created_total", "Limiters a keyed registry made.", l, static_cast<double>(s.created_total));
      out.counter("rein_keys_evicted_total", "Idle limiters a keyed registry dropped.", l,
                  static_cast<double>(s.evicted_total));
      export_rejected(out, l, s);
      const std::size_t exported = registry.for_each_snapshot(
          [&](const auto& key, const auto& snapshot) {
            labels per_key = l;
            per_key.push_back({"key", key_text(key)});
            export_snapshot(out, per_key, snapshot);
          },
          options.max_keys);
      out.gauge("rein_keys_unexported", "Live keys left out of the per-key series by the cardinality cap.", l,
                static_cast<double>(s.keys > exported ? s.keys - exported : 0));
    });
  }

  /// Unregisters `name`; returns whether it was registered.
  bool remove(std::string_view name) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = std::find_if(sources_.begin(), sources_.end(), [&](const source& s) { return s.name == name; });
    if (it == sources_.end()) return false;
    sources_.erase(it);
    return true;
  }

  /// Registered names, in registration order.
  std::vector<std::string> names() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> out;
    for (const source& s : sources_) out.push_back(s.name);
    return out;
  }

  /// Called by prometheus-cpp at each scrape: every registered object's metrics, grouped in families.
  std::vector<::prometheus::MetricFamily> Collect() const override {
    sink out;
    std::lock_guard<std::mutex> lock(mutex_);
    for (const source& s : sources_) s.read(out, labels{{"limiter", s.name}});
    return out.take();
  }

  /// The `le` bounds of rein_wait_seconds, rein_service_seconds and rein_redis_round_trip_seconds, in
  /// nanoseconds: 2^10, 2^12, ... 2^42 (1.024 us to 73.3 minutes), each a bucket boundary of
  /// rein::algo::log_histogram.
  static std::vector<std::uint64_t> histogram_bounds_ns() {
    std::vector<std::uint64_t> bounds;
    for (unsigned k = 10; k <= algo::log_histogram::top_bits; k += 2) bounds.push_back(std::uint64_t{1} << k);
    return bounds;
  }

 private:
  using labels = std::vector<::prometheus::ClientMetric::Label>;

  // Families by name, in first-seen order (Prometheus' text format wants one block per family).
  class sink {
   public:
    void counter(const std::string& name, const char* help, const labels& l, double v) {
      ::prometheus::ClientMetric m;
      m.label = l;
      m.counter.value = v;
      family(name, help, ::prometheus::MetricType::Counter).metric.push_back(std::move(m));
    }
    void gauge(const std::string& name, const char* help, const labels& l, double v) {
      ::prometheus::ClientMetric m;
      m.label = l;
      m.gauge.value = v;
      family(name, help, ::prometheus::MetricType::Gauge).metric.push_back(std::move(m));
    }
    void histogram(const std::string& name, const char* help, const labels& l, const algo::log_histogram& h) {
      ::prometheus::ClientMetric m;
      m.label = l;
      m.histogram.sample_count = h.count();
      m.histogram.sample_sum = static_cast<double>(h.sum().count()) / 1e9;
      for (std::uint64_t bound : histogram_bounds_ns()) {
        ::prometheus::ClientMetric::Bucket b;
        b.upper_bound = static_cast<double>(bound) / 1e9;
        // A bound is a bucket boundary, so the count below it is exact. (A value of exactly `bound` ns is
        // counted in the next bucket: `le` reads as "below" here, a difference of one nanosecond.)
        b.cumulative_count = h.count_below(std::chrono::nanoseconds(static_cast<std::int64_t>(bound)));
        m.histogram.bucket.push_back(b);
      }
      ::prometheus::ClientMetric::Bucket inf;
      inf.upper_bound = std::numeric_limits<double>::infinity();
      inf.cumulative_count = h.count();
      m.histogram.bucket.push_back(inf);
      family(name, help, ::prometheus::MetricType::Histogram).metric.push_back(std::move(m));
    }
    std::vector<::prometheus::MetricFamily> take() { return std::move(families_); }

   private:
    ::prometheus::MetricFamily& family(const std::string& name, const char* help, ::prometheus::MetricType type) {
      auto [it, fresh] = index_.try_emplace(name, families_.size());
      if (fresh) {
        ::prometheus::MetricFamily f;
        f.name = name;
        f.help = help;
        f.type = type;
        families_.push_back(std::move(f));
      }
      return families_[it->second];
    }
    std::vector<::prometheus::MetricFamily> families_;
    std::map<std::string, std::size_t> index_;
  };

  struct source {
    std::string name;
    std::function<void(sink&, const labels&)> read;
  };

  void insert(std::string name, std::function<void(sink&, const labels&)> read) {
    if (name.empty()) throw std::invalid_argument("rein::prometheus::collector: name must not be empty, got \"\"");
    std::lock_guard<std::mutex> lock(mutex_);
    for (const source& s : sources_)
      if (s.name == name)
        throw std::invalid_argument("rein::prometheus::collector: name must be unique, got \"" + name + "\" twice");
    sources_.push_back(source{std::move(name), std::move(read)});
  }

  template <class Key>
  static std::string key_text(const Key& key) {
    if constexpr (std::is_convertible_v<const Key&, std::string_view>) return std::string(std::string_view(key));
    else return std::to_string(key);
  }

  template <class Snapshot>
  static void export_rejected(sink& out, const labels& l, const Snapshot& s) {
    s.for_each_rejected([&](reject_reason why, std::uint64_t n) {
      labels with_reason = l;
      with_reason.push_back({"reason", std::string(to_string(why))});
      out.counter("rein_rejected_total", "Callers turned away, by reason.", with_reason, static_cast<double>(n));
    });
  }

  // Whatever of the shared vocabulary the snapshot has.
  // The value of rein_circuit_state: the states ordered by how much they refuse (closed admits by the limit,
  // half-open admits only probes, open refuses all), so that max() over limiters or keys is the worst one
  // and `> 0` means "not closed". A single gauge, as Prometheus' own client libraries export an enum whose
  // values are ordered (a state set, one 0/1 series per state, would triple the series of every key).
  template <class State>
  static double circuit_value(State state) noexcept {
    if (state == State::half_open) return 1.0;
    if (state == State::open) return 2.0;
    return 0.0;
  }

  // One series per partition (a semaphore's or adaptive limiter's options.partitions), labelled by its name;
  // the rest's empty name is no label, as Prometheus reads an empty label value.
  static void export_partitions(sink& out, const labels& l, const std::vector<partition_snapshot>& parts) {
    for (const partition_snapshot& p : parts) {
      labels with_partition = l;
      if (!p.name.empty()) with_partition.push_back({"partition", p.name});
      out.gauge("rein_partition_guaranteed", "Permits guaranteed to a partition: floor(share x limit).", with_partition,
                static_cast<double>(p.guaranteed));
      out.gauge("rein_partition_in_flight", "Permits a partition's calls hold now.", with_partition,
                static_cast<double>(p.in_flight));
      out.gauge("rein_partition_waiting", "A partition's operations waiting now.", with_partition,
                static_cast<double>(p.waiting));
      out.counter("rein_partition_acquired_total", "Grants to a partition.", with_partition,
                  static_cast<double>(p.acquired_total));
    }
  }

  // A throttle's counts per stage (rein::throttle_stage_counts): each acquisition under one `as`.
  template <class StageCounts>
  static void export_throttle_stages(sink& out, const labels& l, const std::vector<StageCounts>& stages) {
    for (const StageCounts& c : stages) {
      if (c.kind == decltype(c.kind)::none) continue;  // a place left empty
      labels at = l;
      at.push_back({"stage", std::to_string(c.position)});
      at.push_back({"kind", to_string(c.kind)});
      const std::pair<const char*, std::uint64_t> parts[] = {{"admitted", c.admitted},
                                                             {"readmitted", c.readmitted},
                                                             {"abandoned", c.abandoned},
                                                             {"reconciled", c.reconciled}};
      for (const auto& [as, n] : parts) {
        labels with_as = at;
        with_as.push_back({"as", as});
        out.counter("rein_throttle_stage_acquired_total",
                    "A throttle's acquisitions at a stage, each once: kept by an admission, re-taken, or taken by an "
                    "acquire that was not admitted, or by reconcile.",
                    with_as, static_cast<double>(n));
      }
      out.counter("rein_throttle_stage_given_back_total", "A throttle's takes at a stage given back before admission.",
                  at, static_cast<double>(c.given_back));
    }
  }

  // A rate limiter's reservations (reserve(): token bucket, windows, rate_limits): taken, cancelled, and
  // the units given back.
  template <class Snapshot>
  static void export_reservations(sink& out, const labels& l, const Snapshot& s) {
    out.counter("rein_reserved_total", "Reservations a rate limiter made (reserve()).", l,
                static_cast<double>(s.reserved_total));
    out.counter("rein_reservations_cancelled_total", "Reservations cancelled before their time to act.", l,
                static_cast<double>(s.reservations_cancelled_total));
    out.counter("rein_reserved_returned_total", "Units (tokens, starts) that cancelled reservations gave back.", l,
                static_cast<double>(s.reserved_returned_total));
  }

  // A hedge policy's hedges, one series per outcome (rein::hedge_snapshot).
  template <class Snapshot>
  static void export_hedges(sink& out, const labels& l, const Snapshot& s) {
    out.counter("rein_hedge_attempts_total", "Attempts a hedge policy started, hedges included.", l,
                static_cast<double>(s.attempts_total));
    // Outcomes that do not overlap, so that a sum over `outcome` counts each hedge the budget was asked for
    // once: lost is a hedge started that neither won nor was cancelled (it failed, or ended after the winner).
    const std::uint64_t settled = s.hedges_won_total + s.hedges_cancelled_total;
    const std::pair<const char*, std::uint64_t> outcomes[] = {
        {"won", s.hedges_won_total},
        {"cancelled", s.hedges_cancelled_total},
        {"lost", s.hedges_total > settled ? s.hedges_total - settled : 0},
        {"refused", s.hedges_refused_total}};
    for (const auto& [outcome, n] : outcomes) {
      labels with_outcome = l;
      with_outcome.push_back({"outcome", outcome});
      out.counter("rein_hedges_total", "Hedges asked of the budget, by outcome: won, cancelled, lost, refused.",
                  with_outcome, static_cast<double>(n));
    }
  }

  template <class Snapshot>
  static void export_snapshot(sink& out, const labels& l, const Snapshot& s) {
    if constexpr (requires { s.acquired_total; })
      out.counter("rein_acquired_total", "Grants (or admitted calls, or succeeded retried calls).", l,
                  static_cast<double>(s.acquired_total));
    if constexpr (requires { s.for_each_rejected([](reject_reason, std::uint64_t) {}); }) export_rejected(out, l, s);
    if constexpr (requires { s.cancelled_total; })
      out.counter("rein_cancelled_total", "Waits the caller cancelled.", l, static_cast<double>(s.cancelled_total));
    if constexpr (requires { s.waiting; })
      out.gauge("rein_waiting", "Operations waiting now.", l, static_cast<double>(s.waiting));
    if constexpr (requires { s.in_flight; })
      out.gauge("rein_in_flight", "Calls holding a slot now.", l, static_cast<double>(s.in_flight));
    if constexpr (requires { s.limit; })
      out.gauge("rein_limit", "The limit: calls in flight, or units per second for rates, or starts per window.", l,
                static_cast<double>(s.limit));
    if constexpr (requires { s.utilisation; })
      out.gauge("rein_utilisation_ratio", "How much of the limit is used, in [0, 1].", l, s.utilisation);
    if constexpr (requires { s.tokens; }) out.gauge("rein_tokens", "Tokens in the bucket now.", l, s.tokens);
    if constexpr (requires { s.held; })
      out.gauge("rein_held", "Permits Redis counts for this process under its lease now.", l,
                static_cast<double>(s.held));
    if constexpr (requires { s.free; })
      out.gauge("rein_free", "Permits or places free fleet-wide, as last seen from the server.", l,
                static_cast<double>(s.free));
    if constexpr (requires { s.local_admitted; })
      out.counter("rein_fail_open_acquired_total", "Grants by the local rule while Redis could not be asked.", l,
                  static_cast<double>(s.local_admitted));
    if constexpr (requires { s.reserved_total; }) export_reservations(out, l, s);
    if constexpr (requires { s.paused; })
      out.gauge("rein_paused", "Whether a quota gate's pause is in effect (1) or not (0).", l, s.paused ? 1.0 : 0.0);
    if constexpr (requires { s.circuit; })
      out.gauge("rein_circuit_state", "An adaptive limiter's circuit: 0 closed, 1 half-open, 2 open.", l,
                circuit_value(s.circuit));
    if constexpr (requires { s.circuit; s.circuit_opens; })
      out.counter("rein_circuit_opens_total", "Times an adaptive limiter's circuit opened.", l,
                  static_cast<double>(s.circuit_opens));
    if constexpr (requires { s.leases_expired_total; })
      out.counter("rein_leases_expired_total", "Leased permits taken back because their lease ran out.", l,
                  static_cast<double>(s.leases_expired_total));
    if constexpr (requires { s.partitions; }) export_partitions(out, l, s.partitions);
    if constexpr (requires { s.wait.count(); })
      out.histogram("rein_wait_seconds", "Time from the acquire call to the grant.", l, s.wait);
    if constexpr (requires { s.service.count(); })
      out.histogram("rein_service_seconds", "Time from the grant to the reported outcome.", l, s.service);
    if constexpr (requires { s.round_trip.count(); })
      out.histogram("rein_redis_round_trip_seconds", "Time from an admission request's send to Redis's answer.", l,
                    s.round_trip);
    if constexpr (requires { s.rejections_reported; })
      out.counter("rein_upstream_rejections_total", "Upstream rejections reported through a throttle guard.", l,
                  static_cast<double>(s.rejections_reported));
    if constexpr (requires { s.stages.front().acquired(); }) export_throttle_stages(out, l, s.stages);
    if constexpr (requires { s.hedges_total; }) export_hedges(out, l, s);
    if constexpr (requires { s.retries_total; s.attempts_total; }) {
      out.counter("rein_retry_attempts_total", "Attempts made, first ones included.", l,
                  static_cast<double>(s.attempts_total));
      out.counter("rein_retries_total", "Attempts after a failure.", l, static_cast<double>(s.retries_total));
    }
  }

  mutable std::mutex mutex_;
  std::vector<source> sources_;
};

}  // namespace rein::prometheus
