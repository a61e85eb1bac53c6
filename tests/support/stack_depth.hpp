// Measures how deep the machine stack goes across many calls, to prove completions do not nest.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace rein_test {

/// The frame address of a fresh call (not a local's address: AddressSanitizer may move locals to a heap
/// "fake stack").
[[gnu::noinline]] inline std::uintptr_t frame_address() noexcept {
  return reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
}

/// The span of stack addresses seen by sample(); a chain of completions that nest grows it by at least one
/// frame per link, one that does not stays within a few hundred bytes.
class stack_span {
 public:
  void sample() noexcept {
    const std::uintptr_t at = frame_address();
    low_ = std::min(low_, at);
    high_ = std::max(high_, at);
    ++samples_;
  }
  std::size_t bytes() const noexcept { return samples_ == 0 ? 0 : static_cast<std::size_t>(high_ - low_); }
  std::size_t samples() const noexcept { return samples_; }

 private:
  std::uintptr_t low_ = std::numeric_limits<std::uintptr_t>::max();
  std::uintptr_t high_ = 0;
  std::size_t samples_ = 0;
};

}  // namespace rein_test
