// Must not compile: a class member declared rein::throttle<> in the hope that its stages are deduced (class
// template argument deduction does not apply to members). The diagnostic test (tests/headers/CMakeLists.txt)
// expects the throttle's sentence naming rein::throttle_for, not only "no matching constructor".
#include <rein/semaphore.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>

struct upstream {
  explicit upstream(rein::net::io_context& io) : global(io, 4), rate(io, {.rate = 10, .capacity = 1}) {}

  rein::semaphore global;
  rein::token_bucket rate;
  rein::throttle<> throttle{global, rate};
};

int main() {
  rein::net::io_context io;
  upstream u(io);
  return u.throttle.try_acquire("k") ? 0 : 1;
}
