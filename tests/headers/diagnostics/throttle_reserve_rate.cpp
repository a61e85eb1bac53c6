// Must not compile: throttle.reserve with a rate stage that cannot reserve (an adaptive rate). The diagnostic
// test (tests/headers/CMakeLists.txt) expects the throttle's own message.
#include <rein/adaptive_rate_limiter.hpp>
#include <rein/throttle.hpp>

int main() {
  rein::net::io_context io;
  rein::adaptive_rate_limiter rate(io, {});
  rein::throttle t(rate);
  return t.reserve("k").ok() ? 0 : 1;
}
