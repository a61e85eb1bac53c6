// How a public limiter owns its waiting line (detail/limiter_core.hpp), as Asio's io_object_impl owns an
// I/O object's implementation. Not API.
#pragma once

#include <memory>
#include <utility>

namespace rein::detail {

/// How a public limiter owns its core: move-only, and the core is shut down when its owner is destroyed or
/// assigned to (waiters complete with operation_aborted; permits already out stay valid, see the core's
/// lifetime notes). A moved-from owner holds nothing: its limiter may only be destroyed or assigned to, as
/// a moved-from Asio I/O object.
template <class Core>
class core_owner {
 public:
  template <class... Args>
  explicit core_owner(Args&&... args) : core_(std::make_shared<Core>(std::forward<Args>(args)...)) {}

  core_owner(core_owner&&) noexcept = default;
  core_owner& operator=(core_owner&& other) noexcept {
    if (this != &other) {
      reset();
      core_ = std::move(other.core_);
    }
    return *this;
  }
  ~core_owner() { reset(); }

  Core* operator->() const noexcept { return core_.get(); }
  Core* get() const noexcept { return core_.get(); }

 private:
  void reset() noexcept {
    if (core_) std::exchange(core_, nullptr)->shutdown();
  }

  std::shared_ptr<Core> core_;
};

}  // namespace rein::detail
