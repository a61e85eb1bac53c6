// A counting replacement of the global operator new and delete, for tests that prove how much an operation
// allocates: the live blocks of the whole process, and the operator new calls made while counting is on.
//
// It replaces the global functions: include it in exactly one translation unit of a test binary (each
// tests/async file is its own binary). Every non-aligned form is replaced, so that no block allocated by one
// allocator is freed by the other (sanitizers check the pairs).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace rein_test::heap {

inline std::atomic<long> live_blocks{0};  ///< blocks from operator new not yet deleted
inline std::atomic<long> allocations{0};  ///< operator new calls while `counting` is true
inline std::atomic<bool> counting{false};

/// operator new calls made by f().
template <class F>
long allocations_of(F&& f) {
  allocations.store(0);
  counting.store(true);
  f();
  counting.store(false);
  return allocations.load();
}

inline void* counted_malloc(std::size_t n) noexcept {
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p != nullptr) {
    live_blocks.fetch_add(1, std::memory_order_relaxed);
    if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  }
  return p;
}

inline void counted_free(void* p) noexcept {
  if (p == nullptr) return;
  live_blocks.fetch_sub(1, std::memory_order_relaxed);
  std::free(p);
}

}  // namespace rein_test::heap

void* operator new(std::size_t n) {
  if (void* p = rein_test::heap::counted_malloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = rein_test::heap::counted_malloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return rein_test::heap::counted_malloc(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return rein_test::heap::counted_malloc(n); }
void operator delete(void* p) noexcept { rein_test::heap::counted_free(p); }
void operator delete[](void* p) noexcept { rein_test::heap::counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { rein_test::heap::counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { rein_test::heap::counted_free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { rein_test::heap::counted_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { rein_test::heap::counted_free(p); }
