// Must not compile: an admission stage charged through rein::by_tokens. It decides each call as one request
// and takes no units, so the weight would be ignored; the diagnostic test (tests/headers/CMakeLists.txt)
// expects the throttle's own message.
#include <rein/admission_throttle.hpp>
#include <rein/config.hpp>
#include <rein/semaphore.hpp>
#include <rein/throttle.hpp>

int main() {
  rein::net::io_context io;
  rein::admission_throttle admission;
  rein::semaphore global(io, 4);
  rein::throttle t(rein::by_tokens(admission), global);
  return t.try_acquire("") ? 0 : 1;
}
