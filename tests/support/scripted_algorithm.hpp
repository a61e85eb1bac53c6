// A limit algorithm for the adaptive limiters' tests: its limit moves only when the test says, and it records
// every sample it is fed.
#pragma once

#include <rein/algo/limit_algorithm.hpp>

#include <chrono>
#include <cstdint>
#include <vector>

namespace rein_test {

struct scripted_options {
  double initial_limit = 2.0;
  double min_limit = 1.0;
  double max_limit = 64.0;
};

/// An algorithm whose limit only the test moves; it records every sample it is fed.
template <class Clock = std::chrono::steady_clock>
class scripted {
 public:
  using clock_type = Clock;
  using options = scripted_options;
  using sample_type = rein::algo::basic_sample<Clock>;
  template <class C>
  using rebind_clock = scripted<C>;

  explicit scripted(const options& o = {}) : o_{o}, limit_{o.initial_limit} {}
  double limit() const { return limit_; }
  double min_limit() const { return o_.min_limit; }
  double max_limit() const { return o_.max_limit; }
  std::uint64_t decreases() const { return decreases_; }
  std::uint64_t increases() const { return increases_; }
  void on_sample(const sample_type& s) { samples.push_back(s); }
  void set(double limit) {
    (limit < limit_ ? decreases_ : increases_) += 1;
    limit_ = limit;
  }

  std::vector<sample_type> samples;

 private:
  options o_;
  double limit_;
  std::uint64_t decreases_ = 0;
  std::uint64_t increases_ = 0;
};

/// The samples a limiter on a scripted algorithm has recorded.
template <class Limiter>
auto samples_of(const Limiter& l) {
  return l.inspect_algorithm([](const auto& a) { return a.samples; });
}

}  // namespace rein_test
