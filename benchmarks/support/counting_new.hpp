// Heap accounting for memory benchmarks: a counting global operator new, and the allocator's own count of
// bytes in use.
//
// The two see different things, which is why both exist:
// - The counting operator new sees what goes through `::operator new`: std::allocator, and so rein's parked
//   operations (allocated with the handler's associated allocator, std::allocator for use_awaitable). It does
//   NOT see Asio's coroutine frames, nor Asio's own operation objects (timer waits, channel sends, posted
//   handlers), nor cancellation-handler memory: Asio allocates those through its per-thread recycling
//   allocator, which calls std::aligned_alloc when the standard library has it (Asio's aligned_new).
//   So "bytes through operator new" is exactly "bytes beyond the coroutine frames" for rein's waiters.
// - `heap_in_use()` (glibc's mallinfo2) sees every byte the allocator handed out, frames included, with the
//   allocator's chunk overhead. Subtracting a baseline that parks the same number of coroutines on nothing
//   gives the cost of an idiom beyond its frames, whoever allocates it.
//
// A replacement operator new must be defined in exactly one translation unit of the program: that unit
// defines REIN_BENCH_DEFINE_COUNTING_NEW before including this header (benchmarks/semaphore.cpp does).
// Every other unit just includes it and reads the counters.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace rein_bench::heap {

struct counters {
  std::size_t allocations = 0;    ///< calls of any operator new
  std::size_t deallocations = 0;  ///< calls of any operator delete with a non-null pointer
  std::size_t bytes = 0;          ///< bytes requested from operator new, ever (not net of deletes)
};

namespace detail {
inline std::atomic<std::size_t> allocations{0};
inline std::atomic<std::size_t> deallocations{0};
inline std::atomic<std::size_t> bytes{0};
inline std::atomic<bool> defined{false};  // set by the unit that defines the replacement

inline void count_new(std::size_t size) noexcept {
  allocations.fetch_add(1, std::memory_order_relaxed);
  bytes.fetch_add(size, std::memory_order_relaxed);
}

inline void count_delete(void* p) noexcept {
  if (p != nullptr) deallocations.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace detail

/// True when the counting operator new is linked in (otherwise the counters stay 0).
inline bool counting() noexcept { return detail::defined.load(std::memory_order_relaxed); }

inline counters sample() noexcept {
  return {detail::allocations.load(std::memory_order_relaxed), detail::deallocations.load(std::memory_order_relaxed),
          detail::bytes.load(std::memory_order_relaxed)};
}

/// Bytes the C allocator has handed out and not taken back (chunk overhead included); -1 if unknown.
inline double heap_in_use() noexcept {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  const struct mallinfo2 m = mallinfo2();
  return static_cast<double>(m.uordblks) + static_cast<double>(m.hblkhd);
#else
  return -1;
#endif
}

}  // namespace rein_bench::heap

#if defined(REIN_BENCH_DEFINE_COUNTING_NEW)

namespace rein_bench::heap::detail {
inline void* allocate(std::size_t size) {
  count_new(size);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}

inline void* allocate(std::size_t size, std::align_val_t align) {
  count_new(size);
  const auto a = static_cast<std::size_t>(align);
  const std::size_t rounded = (size + a - 1) / a * a;  // aligned_alloc wants a multiple of the alignment
  if (void* p = std::aligned_alloc(a, rounded == 0 ? a : rounded)) return p;
  throw std::bad_alloc();
}

inline void release(void* p) noexcept {
  count_delete(p);
  std::free(p);
}

struct definer {
  definer() noexcept { defined.store(true, std::memory_order_relaxed); }
};
inline const definer define_once{};
}  // namespace rein_bench::heap::detail

// The replaceable allocation functions ([new.delete]); they may not be inline, hence the one defining unit.
void* operator new(std::size_t size) { return rein_bench::heap::detail::allocate(size); }
void* operator new[](std::size_t size) { return rein_bench::heap::detail::allocate(size); }
void* operator new(std::size_t size, std::align_val_t align) { return rein_bench::heap::detail::allocate(size, align); }
void* operator new[](std::size_t size, std::align_val_t align) {
  return rein_bench::heap::detail::allocate(size, align);
}
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return rein_bench::heap::detail::allocate(size);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return rein_bench::heap::detail::allocate(size);
  } catch (...) {
    return nullptr;
  }
}
void* operator new(std::size_t size, std::align_val_t align, const std::nothrow_t&) noexcept {
  try {
    return rein_bench::heap::detail::allocate(size, align);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t size, std::align_val_t align, const std::nothrow_t&) noexcept {
  try {
    return rein_bench::heap::detail::allocate(size, align);
  } catch (...) {
    return nullptr;
  }
}

void operator delete(void* p) noexcept { rein_bench::heap::detail::release(p); }
void operator delete[](void* p) noexcept { rein_bench::heap::detail::release(p); }
void operator delete(void* p, std::size_t) noexcept { rein_bench::heap::detail::release(p); }
void operator delete[](void* p, std::size_t) noexcept { rein_bench::heap::detail::release(p); }
void operator delete(void* p, std::align_val_t) noexcept { rein_bench::heap::detail::release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { rein_bench::heap::detail::release(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { rein_bench::heap::detail::release(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { rein_bench::heap::detail::release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { rein_bench::heap::detail::release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { rein_bench::heap::detail::release(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  rein_bench::heap::detail::release(p);
}
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  rein_bench::heap::detail::release(p);
}

#endif  // REIN_BENCH_DEFINE_COUNTING_NEW
