// Must not compile: an op for rein::retry that returns an awaitable of int, not of rein::attempt<T>. The
// diagnostic test (tests/headers/CMakeLists.txt) expects retry's one sentence saying what op must return.
#include <rein/retry.hpp>

int main() {
  rein::retry_policy policy;
  auto op = []() -> rein::net::awaitable<int> { co_return 1; };
  auto run = rein::retry(policy, op);
  (void)run;
  return 0;
}
