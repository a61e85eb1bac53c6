// Intrusive pairing heap of the deadlines of waiting ops, so one timer per limiter can serve every deadline.
// Not API.
//
// Push and top are O(1), erase of any node O(log n) amortized, and nothing is allocated: the links live in
// the op's deadline_node (a heap of pointers in a vector would allocate under the limiter's lock). Equal
// deadlines come out in arrival order (deadline_node::seq), so waiters that time out at the same instant
// complete first come, first out.
#pragma once

#include <rein/detail/wait_op.hpp>

#include <cstdint>
#include <utility>

namespace rein::detail {

class deadline_heap {
 public:
  bool empty() const noexcept { return root_ == nullptr; }
  deadline_node* top() const noexcept { return root_; }

  void push(deadline_node* node) noexcept {
    node->child = node->sibling = node->back = nullptr;
    root_ = meld(root_, node);
  }

  void erase(deadline_node* node) noexcept {
    if (node == root_) {
      root_ = merge_pairs(node->child);
    } else {
      // Cut the node's subtree out of its parent's child list, then merge its children back in at the root.
      if (node->back->child == node) node->back->child = node->sibling;
      else node->back->sibling = node->sibling;
      if (node->sibling != nullptr) node->sibling->back = node->back;
      root_ = meld(root_, merge_pairs(node->child));
    }
    if (root_ != nullptr) root_->back = root_->sibling = nullptr;
    node->child = node->sibling = node->back = nullptr;
  }

 private:
  // seq wraps: compared as a serial number, which is right while fewer than 2^31 ops wait at once.
  static bool earlier(const deadline_node* a, const deadline_node* b) noexcept {
    if (a->deadline_ns != b->deadline_ns) return a->deadline_ns < b->deadline_ns;
    return static_cast<std::int32_t>(a->seq - b->seq) < 0;
  }

  // Both arguments are roots (no sibling, no back link) or null.
  static deadline_node* meld(deadline_node* a, deadline_node* b) noexcept {
    if (a == nullptr) return b;
    if (b == nullptr) return a;
    if (earlier(b, a)) std::swap(a, b);
    b->back = a;
    b->sibling = a->child;
    if (a->child != nullptr) a->child->back = b;
    a->child = b;
    return a;
  }

  // The standard two-pass merge: meld siblings pairwise left to right, then fold the pairs right to left.
  static deadline_node* merge_pairs(deadline_node* first) noexcept {
    deadline_node* pairs = nullptr;  // melded pairs, newest first, chained through sibling
    while (first != nullptr) {
      deadline_node* a = first;
      deadline_node* b = a->sibling;
      first = b != nullptr ? b->sibling : nullptr;
      a->sibling = a->back = nullptr;
      if (b != nullptr) b->sibling = b->back = nullptr;
      deadline_node* m = meld(a, b);
      m->sibling = pairs;
      pairs = m;
    }
    deadline_node* result = nullptr;
    while (pairs != nullptr) {
      deadline_node* next = pairs->sibling;
      pairs->sibling = nullptr;
      result = meld(result, pairs);
      pairs = next;
    }
    return result;
  }

  deadline_node* root_ = nullptr;
};

}  // namespace rein::detail
