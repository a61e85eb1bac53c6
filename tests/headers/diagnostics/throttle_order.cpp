// Must not compile: a rate stage listed before a concurrency stage (the order rein used before). The
// diagnostic test (tests/headers/CMakeLists.txt) expects the throttle's own message, not a deep error.
#include <rein/semaphore.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>

int main() {
  rein::net::io_context io;
  rein::token_bucket rate(io, {.rate = 10, .capacity = 1});
  rein::semaphore global(io, 4);
  rein::throttle t(rate, global);
  return t.try_acquire("k") ? 0 : 1;
}
