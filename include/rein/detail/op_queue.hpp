// Intrusive queue of wait_ops with O(1) unlink, and a singly linked list of ops ready to complete. Not API.
#pragma once

#include <rein/detail/wait_op.hpp>

#include <cstddef>
#include <memory>

namespace rein::detail {

/// Doubly linked list through wait_op::next/prev, served from the front (the order is where ops are
/// linked: the back, the front, or by key). Allocates nothing; the ops own their memory.
class op_queue {
 public:
  bool empty() const noexcept { return head_ == nullptr; }
  std::size_t size() const noexcept { return size_; }
  wait_op* front() const noexcept { return head_; }
  wait_op* back() const noexcept { return tail_; }

  void push_back(wait_op* op) noexcept {
    op->next = nullptr;
    op->prev = tail_;
    if (tail_ != nullptr) tail_->next = op;
    else head_ = op;
    tail_ = op;
    ++size_;
  }

  void push_front(wait_op* op) noexcept {
    op->prev = nullptr;
    op->next = head_;
    if (head_ != nullptr) head_->prev = op;
    else tail_ = op;
    head_ = op;
    ++size_;
  }

  /// Links `op` right after `pos`, or at the front when `pos` is null.
  void insert_after(wait_op* pos, wait_op* op) noexcept {
    if (pos == nullptr) return push_front(op);
    op->prev = pos;
    op->next = pos->next;
    if (pos->next != nullptr) pos->next->prev = op;
    else tail_ = op;
    pos->next = op;
    ++size_;
  }

  void erase(wait_op* op) noexcept {
    if (op->prev != nullptr) op->prev->next = op->next;
    else head_ = op->next;
    if (op->next != nullptr) op->next->prev = op->prev;
    else tail_ = op->prev;
    op->next = op->prev = nullptr;
    --size_;
  }

 private:
  wait_op* head_ = nullptr;
  wait_op* tail_ = nullptr;
  std::size_t size_ = 0;
};

/// Ops unlinked under the lock, completed after it is released. Reuses wait_op::next (free once unlinked).
class ready_list {
 public:
  ready_list() = default;
  ready_list(const ready_list&) = delete;
  ready_list& operator=(const ready_list&) = delete;

  bool empty() const noexcept { return head_ == nullptr; }

  void push(wait_op* op) noexcept {
    op->next = nullptr;
    if (tail_ != nullptr) tail_->next = op;
    else head_ = op;
    tail_ = op;
  }

  /// Posts every completion, in the order the ops were made ready. Call without holding the lock. `keep`
  /// (a reference to the owner) is shared with the runners of granted ops; the last op may take it.
  /// `direct`: a grant whose handler's executor runs in this thread is run in place (a direct handoff, see
  /// wait_op.hpp); it may release and complete another batch before this one's next op is completed.
  void complete_all(const void* io_executor, wait_owner* owner, std::shared_ptr<wait_owner>& keep,
                    bool direct = false) noexcept {
    while (wait_op* op = head_) {
      head_ = op->next;  // read before completing: the op may be freed on another thread right after
      op->complete(op, io_executor, owner, keep, head_ == nullptr, direct);
    }
    tail_ = nullptr;
  }

 private:
  wait_op* head_ = nullptr;
  wait_op* tail_ = nullptr;
};

}  // namespace rein::detail
