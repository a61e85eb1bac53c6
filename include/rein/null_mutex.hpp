// A lock that does nothing, for limiters used from one thread or one strand only.
#pragma once

namespace rein {

/// Satisfies BasicLockable and does nothing.
///
/// Pass it as a limiter's Mutex parameter when every use of the limiter (acquire, release, cancellation
/// and the io_context running its completions) happens on one thread or one strand. The same code path as
/// the thread-safe variant runs, minus the locking. Like Asio's `null_mutex`, no checks are made.
struct null_mutex {
  /// Does nothing.
  constexpr void lock() noexcept {}
  /// Does nothing.
  constexpr void unlock() noexcept {}
  /// Does nothing; always succeeds.
  constexpr bool try_lock() noexcept { return true; }
};

}  // namespace rein
