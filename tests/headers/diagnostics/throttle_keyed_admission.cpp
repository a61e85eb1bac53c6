// Must not compile: an admission stage (here one that a rein::keyed registry can hold; rein::admission_throttle
// itself has no executor for one) listed per key. The diagnostic test (tests/headers/CMakeLists.txt) expects
// the throttle's own message: an admission stage is global.
#include <rein/config.hpp>
#include <rein/keyed.hpp>
#include <rein/line_options.hpp>
#include <rein/outcome.hpp>
#include <rein/throttle.hpp>
#include <rein/try_result.hpp>

#include <chrono>

struct admission_like {
  using executor_type = rein::net::any_io_executor;
  using rule_type = int;
  using clock_type = std::chrono::steady_clock;
  admission_like(const executor_type&, int, const rein::line_options& = {}) {}
  rein::try_result try_acquire() { return rein::try_result(rein::try_status::acquired); }
  void record(rein::outcome) {}
  int snapshot() const { return 0; }
  bool idle() const { return true; }
};

int main() {
  rein::net::io_context io;
  rein::keyed<admission_like> per_key(io.get_executor(), 1);
  rein::throttle t(per_key);
  return t.try_acquire("k") ? 0 : 1;
}
