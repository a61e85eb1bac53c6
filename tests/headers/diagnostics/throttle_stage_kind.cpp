// Must not compile: a stage that is neither a gate, a concurrency limiter nor a rate limiter. The diagnostic
// test (tests/headers/CMakeLists.txt) expects the throttle's own message naming the kinds.
#include <rein/throttle.hpp>

struct not_a_limiter {
  using clock_type = std::chrono::steady_clock;
  int get_executor() const { return 0; }
};

int main() {
  not_a_limiter x;
  rein::throttle t(x);
  return t.try_acquire("k") ? 0 : 1;
}
