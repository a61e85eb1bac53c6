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
inline std::atomic<long> live_bytes{0};   ///< bytes asked for in those blocks
inline std::atomic<bool> failing{false};  ///< while true, every operator new fails (bad_alloc, or nullptr)
/// While `failing`, only requests of at least this many bytes fail (0: every request).
inline std::atomic<std::size_t> failing_from{0};
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

// Each block starts with a header holding its size (16 bytes, so the caller's pointer keeps malloc's
// alignment).
inline constexpr std::size_t header_bytes = 16;

inline void* counted_malloc(std::size_t n) noexcept {
  if (failing.load(std::memory_order_relaxed) && n >= failing_from.load(std::memory_order_relaxed)) return nullptr;
  void* raw = std::malloc(n + header_bytes);
  if (raw == nullptr) return nullptr;
  *static_cast<std::size_t*>(raw) = n;
  live_blocks.fetch_add(1, std::memory_order_relaxed);
  live_bytes.fetch_add(static_cast<long>(n), std::memory_order_relaxed);
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  return static_cast<char*>(raw) + header_bytes;
}

inline void counted_free(void* p) noexcept {
  if (p == nullptr) return;
  void* raw = static_cast<char*>(p) - header_bytes;
  live_blocks.fetch_sub(1, std::memory_order_relaxed);
  live_bytes.fetch_sub(static_cast<long>(*static_cast<std::size_t*>(raw)), std::memory_order_relaxed);
  std::free(raw);
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
