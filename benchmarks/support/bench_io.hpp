// Shared benchmark helpers: an io_context with or without a reactor, coroutine loops driven by a
// benchmark::State, and a clock that records each run for the ratio summary (ratio_summary.hpp).
//
// Why the reactor matters: once an io_context owns a reactor (any socket or timer was ever created on it),
// its scheduler runs the reactor task once per pass over the handler queue; with few queued handlers, every
// scheduler round trip then costs an epoll_wait(0) system call. Benchmarks of async idioms therefore show
// both settings.
#pragma once

#include "ratio_summary.hpp"

#include <rein/config.hpp>

#include <benchmark/benchmark.h>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#else
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#endif

#include <cstdint>
#include <ctime>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

namespace rein_bench {

namespace net = rein::net;

enum class reactor { off, on };

inline const char* to_string(reactor r) noexcept { return r == reactor::on ? "reactor_on" : "reactor_off"; }

/// The io_context's default concurrency hint (what `io_context()` uses).
inline constexpr int default_concurrency_hint = -1;

/// An io_context run by the benchmark's own thread, with a reactor task (a steady_timer exists on it) or
/// without one, made with `concurrency_hint` (1: "one thread runs it", which lets Asio's scheduler keep
/// handlers posted from that thread in a thread-private queue).
class bench_io {
 public:
  explicit bench_io(reactor mode, int concurrency_hint = default_concurrency_hint)
      : mode_(mode), io_(concurrency_hint) {
    if (mode == reactor::on) reactor_timer_.emplace(io_);
  }

  bench_io(const bench_io&) = delete;
  bench_io& operator=(const bench_io&) = delete;

  reactor mode() const noexcept { return mode_; }
  net::io_context& context() noexcept { return io_; }
  net::any_io_executor executor() { return io_.get_executor(); }

  /// Starts `coroutine` (a net::awaitable<void>) on this context; what it throws is rethrown by run_all().
  /// A connected `slot` lets the caller cancel it (its awaited operations see a connected slot).
  template <class Awaitable>
  void spawn(Awaitable coroutine, net::cancellation_slot slot = {}) {
    net::co_spawn(io_, std::move(coroutine), net::bind_cancellation_slot(slot, failure_handler{this}));
  }

  /// Runs `coroutine` to completion on this context; rethrows what it threw.
  template <class Awaitable>
  void run(Awaitable coroutine) {
    spawn(std::move(coroutine));
    run_all();
  }

  /// Runs until no work is left, restarts the context so that it can run again, and rethrows the first
  /// exception a spawned coroutine ended with.
  void run_all() {
    io_.run();
    io_.restart();
    if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
  }

  /// Runs ready handlers until none is left, without waiting for parked coroutines to finish.
  void drain_ready() {
    while (io_.poll() != 0) {
    }
    io_.restart();
  }

 private:
  // Locked: the two-thread rows end coroutines on both threads.
  struct failure_handler {
    bench_io* self;
    void operator()(std::exception_ptr e) const {
      if (!e) return;
      std::lock_guard<std::mutex> lock(self->failure_mutex_);
      if (!self->failure_) self->failure_ = e;
    }
  };

  reactor mode_;
  std::mutex failure_mutex_;
  std::exception_ptr failure_;
  net::io_context io_;
  std::optional<net::steady_timer> reactor_timer_;
};

/// Wall and thread CPU time of one benchmark run, measured where Google Benchmark's own timer runs (from
/// the first iteration to the end of the last one), and recorded for the ratio summary on destruction.
class run_clock {
 public:
  run_clock(benchmark::State& state, std::string name) : state_(state), name_(std::move(name)) {}
  run_clock(const run_clock&) = delete;
  run_clock& operator=(const run_clock&) = delete;

  ~run_clock() {
    if (started_ && stopped_ && state_.iterations() > 0)
      results::get().record_run(name_, state_.iterations(), cpu_stop_ - cpu_start_, wall_stop_ - wall_start_);
  }

  void start() noexcept {
    started_ = true;
    wall_start_ = now_ns(CLOCK_MONOTONIC);
    cpu_start_ = now_ns(CLOCK_THREAD_CPUTIME_ID);
  }

  void stop() noexcept {
    cpu_stop_ = now_ns(CLOCK_THREAD_CPUTIME_ID);
    wall_stop_ = now_ns(CLOCK_MONOTONIC);
    stopped_ = true;
  }

 private:
  static double now_ns(clockid_t id) noexcept {
    timespec ts{};
    clock_gettime(id, &ts);
    return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
  }

  benchmark::State& state_;
  std::string name_;
  double wall_start_ = 0, wall_stop_ = 0, cpu_start_ = 0, cpu_stop_ = 0;
  bool started_ = false;
  bool stopped_ = false;
};

/// Hands the iterations of one benchmark run out to many coroutines on one thread: each calls next() before
/// each operation. Google Benchmark's timer (and the run_clock) starts at the first next() and stops at the
/// first that returns false; operations still in flight then finish untimed (at most one per coroutine, a
/// negligible share of a run).
class iteration_gate {
 public:
  iteration_gate(benchmark::State& state, run_clock& clock) noexcept : state_(state), clock_(clock) {}

  bool next() {
    if (done_) return false;  // State::KeepRunning must not be called again once it said false
    if (!state_.KeepRunning()) {
      clock_.stop();
      done_ = true;
      return false;
    }
    if (!started_) {
      started_ = true;
      clock_.start();
    }
    return true;
  }

 private:
  benchmark::State& state_;
  run_clock& clock_;
  bool started_ = false;
  bool done_ = false;
};

}  // namespace rein_bench
