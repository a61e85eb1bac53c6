// The message of an std::invalid_argument, for tests of option checks.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace rein_test {

/// What `f()` throws as std::invalid_argument (its what()), or "no exception".
template <class F>
std::string invalid_argument_of(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no exception";
}

}  // namespace rein_test
