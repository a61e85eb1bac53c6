// Allocation of parked ops when the handler has no allocator of its own. Not API.
//
// A handoff frees one op (its completion ran) and a later acquire makes one of the same type, usually on
// the same thread: keeping the freed block for the next op of that size on that thread saves a malloc and a
// free per handoff (about a tenth of the handoff's instructions). Asio's own recycling cache cannot serve:
// its two general slots are taken by the executor's own operations, and a larger op evicts them.
#pragma once

#include <cstddef>
#include <memory>
#include <new>

namespace rein::detail {

// Under AddressSanitizer every op gets a fresh block, so that a use of a freed op is still caught.
#if defined(__SANITIZE_ADDRESS__)
#define REIN_SPARE_BLOCKS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define REIN_SPARE_BLOCKS 0
#endif
#endif
#ifndef REIN_SPARE_BLOCKS
#define REIN_SPARE_BLOCKS 8
#endif

/// A few spare blocks per thread for each block size and alignment (a stack: the most recently freed block,
/// the likeliest in cache, goes out first). Several, because completions run in batches: the releases of one
/// scheduler pass free their ops before the next acquires make theirs.
template <std::size_t Size, std::size_t Align>
class thread_spare_block {
 public:
  static void* allocate() {
    if constexpr (capacity != 0) {
      if (!ended()) {
        slot& s = spare();
        if (s.count != 0) return s.blocks[--s.count];
      }
    }
    return fresh();
  }

  static void deallocate(void* p) noexcept {
    if constexpr (capacity != 0) {
      if (!ended()) {
        slot& s = spare();
        if (s.count != capacity) {
          s.blocks[s.count++] = p;
          return;
        }
      }
    }
    release(p);
  }

 private:
  static constexpr std::size_t capacity = REIN_SPARE_BLOCKS;
  static constexpr bool over_aligned = Align > __STDCPP_DEFAULT_NEW_ALIGNMENT__;

  static void* fresh() {
    if constexpr (over_aligned) return ::operator new(Size, std::align_val_t(Align));
    else return ::operator new(Size);
  }

  static void release(void* p) noexcept {
    if constexpr (over_aligned) ::operator delete(p, std::align_val_t(Align));
    else ::operator delete(p);
  }

  // Set when the thread's slot is destroyed: an op freed later in the thread's exit (say, by a thread_local
  // io_context destroyed with a completion queued) goes straight back to operator delete. Trivially
  // destructible, so it can be read to the very end of the thread.
  static bool& ended() noexcept {
    thread_local bool flag = false;
    return flag;
  }

  struct slot {
    void* blocks[capacity == 0 ? 1 : capacity];
    std::size_t count = 0;
    slot() = default;
    slot(const slot&) = delete;
    slot& operator=(const slot&) = delete;
    ~slot() {
      ended() = true;
      while (count != 0) release(blocks[--count]);
    }
  };

  static slot& spare() noexcept {
    thread_local slot s;
    return s;
  }
};

/// An allocator of single T objects through thread_spare_block; arrays go to operator new. Stateless: any
/// instance frees what another allocated, on any thread.
template <class T>
class spare_allocator {
 public:
  using value_type = T;

  spare_allocator() noexcept = default;
  template <class U>
  explicit spare_allocator(const spare_allocator<U>&) noexcept {}
  /// Stands in for std::allocator, the default of handlers without an allocator.
  template <class U>
  explicit spare_allocator(const std::allocator<U>&) noexcept {}

  T* allocate(std::size_t n) {
    if (n == 1) return static_cast<T*>(block::allocate());
    return std::allocator<T>().allocate(n);
  }

  void deallocate(T* p, std::size_t n) noexcept {
    if (n == 1) block::deallocate(p);
    else std::allocator<T>().deallocate(p, n);
  }

  template <class U>
  bool operator==(const spare_allocator<U>&) const noexcept {
    return true;
  }

 private:
  using block = thread_spare_block<sizeof(T), alignof(T)>;
};

}  // namespace rein::detail
