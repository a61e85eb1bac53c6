// Intrusive pairing heap of wait_ops ordered by deadline, so one timer per limiter can serve every deadline.
// Not API.
//
// Push and top are O(1), erase of any op O(log n) amortized, and nothing is allocated: the links live in the
// op (a heap of pointers in a vector would allocate under the limiter's lock). Equal deadlines come out in
// arrival order (wait_op::seq), so waiters that time out at the same instant complete first come, first out.
#pragma once

#include <rein/detail/wait_op.hpp>

#include <cstdint>
#include <utility>

namespace rein::detail {

class deadline_heap {
 public:
  bool empty() const noexcept { return root_ == nullptr; }
  wait_op* top() const noexcept { return root_; }

  void push(wait_op* op) noexcept {
    op->heap_child = op->heap_sibling = op->heap_back = nullptr;
    root_ = meld(root_, op);
  }

  void erase(wait_op* op) noexcept {
    if (op == root_) {
      root_ = merge_pairs(op->heap_child);
    } else {
      // Cut op's subtree out of its parent's child list, then merge its children back in at the root.
      if (op->heap_back->heap_child == op) op->heap_back->heap_child = op->heap_sibling;
      else op->heap_back->heap_sibling = op->heap_sibling;
      if (op->heap_sibling != nullptr) op->heap_sibling->heap_back = op->heap_back;
      root_ = meld(root_, merge_pairs(op->heap_child));
    }
    if (root_ != nullptr) root_->heap_back = root_->heap_sibling = nullptr;
    op->heap_child = op->heap_sibling = op->heap_back = nullptr;
  }

 private:
  // seq wraps: compared as a serial number, which is right while fewer than 2^31 ops wait at once.
  static bool earlier(const wait_op* a, const wait_op* b) noexcept {
    if (a->deadline_ns != b->deadline_ns) return a->deadline_ns < b->deadline_ns;
    return static_cast<std::int32_t>(a->seq - b->seq) < 0;
  }

  // Both arguments are roots (no sibling, no back link) or null.
  static wait_op* meld(wait_op* a, wait_op* b) noexcept {
    if (a == nullptr) return b;
    if (b == nullptr) return a;
    if (earlier(b, a)) std::swap(a, b);
    b->heap_back = a;
    b->heap_sibling = a->heap_child;
    if (a->heap_child != nullptr) a->heap_child->heap_back = b;
    a->heap_child = b;
    return a;
  }

  // The standard two-pass merge: meld siblings pairwise left to right, then fold the pairs right to left.
  static wait_op* merge_pairs(wait_op* first) noexcept {
    wait_op* pairs = nullptr;  // melded pairs, newest first, chained through heap_sibling
    while (first != nullptr) {
      wait_op* a = first;
      wait_op* b = a->heap_sibling;
      first = b != nullptr ? b->heap_sibling : nullptr;
      a->heap_sibling = a->heap_back = nullptr;
      if (b != nullptr) b->heap_sibling = b->heap_back = nullptr;
      wait_op* m = meld(a, b);
      m->heap_sibling = pairs;
      pairs = m;
    }
    wait_op* result = nullptr;
    while (pairs != nullptr) {
      wait_op* next = pairs->heap_sibling;
      pairs->heap_sibling = nullptr;
      result = meld(result, pairs);
      pairs = next;
    }
    return result;
  }

  wait_op* root_ = nullptr;
};

}  // namespace rein::detail
