// An allocator that counts what goes through it, to prove an operation uses its handler's allocator.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <new>

namespace rein_test {

/// Shared by every copy and rebind of one counting_allocator.
struct allocation_counts {
  std::atomic<long> allocations{0};
  std::atomic<long> deallocations{0};
  std::atomic<long> bytes_in_use{0};   ///< allocated and not yet deallocated
  std::atomic<long> fail_after{-1};  ///< >= 0: allocations beyond this many throw std::bad_alloc

  long live() const noexcept { return allocations.load() - deallocations.load(); }
};

/// A std::allocator that counts into `allocation_counts` (and can be told to fail).
template <class T>
class counting_allocator {
 public:
  using value_type = T;

  explicit counting_allocator(allocation_counts& counts) noexcept : counts_(&counts) {}
  template <class U>
  counting_allocator(const counting_allocator<U>& other) noexcept : counts_(other.counts()) {}

  T* allocate(std::size_t n) {
    const long limit = counts_->fail_after.load();
    if (limit >= 0 && counts_->allocations.load() >= limit) throw std::bad_alloc();
    T* p = std::allocator<T>().allocate(n);
    counts_->allocations.fetch_add(1);
    counts_->bytes_in_use.fetch_add(static_cast<long>(n * sizeof(T)));
    return p;
  }

  void deallocate(T* p, std::size_t n) noexcept {
    counts_->deallocations.fetch_add(1);
    counts_->bytes_in_use.fetch_sub(static_cast<long>(n * sizeof(T)));
    std::allocator<T>().deallocate(p, n);
  }

  allocation_counts* counts() const noexcept { return counts_; }

  template <class U>
  bool operator==(const counting_allocator<U>& other) const noexcept {
    return counts_ == other.counts();
  }

 private:
  allocation_counts* counts_;
};

}  // namespace rein_test
