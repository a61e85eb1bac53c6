// A completion handler that checks Asio's contract: called exactly once, never destroyed uncalled.
// (The idea is Beast's test::handler; see STYLE.md.)
#pragma once

#include "support/catch.hpp"

#include <rein/config.hpp>
#include <rein/permit.hpp>

#include <atomic>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

namespace rein_test {

/// What a checked_handler saw. The test keeps it (shared) after handing the handler to an operation.
template <class... Args>
struct completion_record {
  std::atomic<int> calls{0};
  std::optional<std::tuple<Args...>> args;  ///< the arguments of the (first) call
  std::thread::id thread;                   ///< where the call ran
  /// Set by the test when being destroyed uncalled is the expected end (an io_context destroyed with the
  /// completion queued); otherwise that fails the test.
  bool may_be_destroyed_uncalled = false;

  bool called() const noexcept { return calls.load(std::memory_order_acquire) > 0; }

  template <std::size_t I>
  auto& get() {
    REQUIRE(args.has_value());
    return std::get<I>(*args);
  }

  /// The first argument, for handlers whose first argument is an error_code.
  const rein::error_code& ec() {
    REQUIRE(args.has_value());
    return std::get<0>(*args);
  }
};

/// A move-only handler (so rein is also checked never to copy handlers) that records its call in a
/// completion_record. Calling it twice, or destroying the last live instance uncalled, fails the test.
/// Catch2 assertions are not thread-safe: in multi-threaded tests, read `calls` after joining instead.
template <class... Args>
class checked_handler {
 public:
  explicit checked_handler(std::shared_ptr<completion_record<Args...>> record) : record_(std::move(record)) {}

  checked_handler(checked_handler&& other) noexcept : record_(std::move(other.record_)) {}
  checked_handler& operator=(checked_handler&&) = delete;
  checked_handler(const checked_handler&) = delete;
  checked_handler& operator=(const checked_handler&) = delete;

  ~checked_handler() {
    if (record_ && !record_->called() && !record_->may_be_destroyed_uncalled)
      FAIL_CHECK("a completion handler was destroyed without being called");
  }

  void operator()(Args... args) {
    REQUIRE(record_ != nullptr);  // called through a moved-from instance
    if (record_->calls.fetch_add(1, std::memory_order_acq_rel) != 0) {
      FAIL_CHECK("a completion handler was called twice");
      return;
    }
    record_->thread = std::this_thread::get_id();
    record_->args.emplace(std::move(args)...);
  }

  const std::shared_ptr<completion_record<Args...>>& record() const noexcept { return record_; }

 private:
  std::shared_ptr<completion_record<Args...>> record_;
};

/// A checked handler and its record: `auto [handler, done] = rein_test::make_checked<error_code>();`.
template <class... Args>
std::pair<checked_handler<Args...>, std::shared_ptr<completion_record<Args...>>> make_checked() {
  auto record = std::make_shared<completion_record<Args...>>();
  return {checked_handler<Args...>(record), record};
}

/// The record of an acquire: `void(error_code, rein::permit)`.
using acquire_record = completion_record<rein::error_code, rein::permit>;
using acquire_handler = checked_handler<rein::error_code, rein::permit>;

inline std::pair<acquire_handler, std::shared_ptr<acquire_record>> checked_acquire() {
  return make_checked<rein::error_code, rein::permit>();
}

}  // namespace rein_test
