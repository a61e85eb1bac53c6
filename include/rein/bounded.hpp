// A sliding window over a huge input: at most `limit` calls in flight, items pulled lazily, first error wins.
#pragma once

#include <rein/config.hpp>
#include <rein/detail/asio_header.hpp>

#include REIN_ASIO_HEADER(any_io_executor.hpp)
#include REIN_ASIO_HEADER(awaitable.hpp)
#include REIN_ASIO_HEADER(basic_waitable_timer.hpp)
#include REIN_ASIO_HEADER(bind_cancellation_slot.hpp)
#include REIN_ASIO_HEADER(cancellation_signal.hpp)
#include REIN_ASIO_HEADER(co_spawn.hpp)
#include REIN_ASIO_HEADER(error.hpp)
#include REIN_ASIO_HEADER(redirect_error.hpp)
#include REIN_ASIO_HEADER(strand.hpp)
#include REIN_ASIO_HEADER(this_coro.hpp)
#include REIN_ASIO_HEADER(use_awaitable.hpp)
#include REIN_ASIO_HEADER(wait_traits.hpp)

#include <chrono>
#include <cstddef>
#include <exception>
#include <memory>
#include <optional>
#include <iterator>
#include <ranges>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace rein {

namespace detail {

// The range as the loop keeps it: a pointer to an lvalue range (which must outlive the loop), or the range
// itself, moved in, for an rvalue. (Not std::views::all: clang 14 cannot compile libstdc++ 12's views.)
template <class Range>
class bounded_range {
  using stored = std::conditional_t<std::is_lvalue_reference_v<Range>, std::remove_reference_t<Range>*,
                                    std::remove_cvref_t<Range>>;

 public:
  using range_type = std::remove_reference_t<Range>&;  // what begin/end see: always an lvalue

  explicit bounded_range(Range&& r) : range_(hold(std::forward<Range>(r))) {}

  range_type get() noexcept {
    if constexpr (std::is_lvalue_reference_v<Range>) return *range_;
    else return range_;
  }

 private:
  static stored hold(Range&& r) {
    if constexpr (std::is_lvalue_reference_v<Range>) return std::addressof(r);
    else return stored(std::move(r));
  }

  stored range_;
};

// An item as a worker keeps it while fn runs: a pointer into the range when the range's elements stay put
// (a forward range yielding lvalue references: a vector, a list), otherwise a copy (an input-only range, whose
// iterator may reuse its storage; a range computing its elements).
template <class R>
class bounded_item {
  static constexpr bool by_reference =
      std::ranges::forward_range<R> && std::is_lvalue_reference_v<std::ranges::range_reference_t<R>>;
  using stored = std::conditional_t<by_reference, std::remove_reference_t<std::ranges::range_reference_t<R>>*,
                                    std::ranges::range_value_t<R>>;

 public:
  template <class Iterator>
  explicit bounded_item(const Iterator& it) : item_(take(it)) {}

  decltype(auto) get() noexcept {
    if constexpr (by_reference) return *item_;
    else return (item_);
  }

 private:
  template <class Iterator>
  static stored take(const Iterator& it) {
    if constexpr (by_reference) return std::addressof(*it);
    else return stored(*it);
  }

  stored item_;
};

// Everything the loop shares. Touched only on the loop's strand, so it needs no lock.
template <class Range, class Fn, class Executor>
struct bounded_state {
  using range_type = typename bounded_range<Range>::range_type;
  using iterator = std::ranges::iterator_t<range_type>;
  using sentinel = std::ranges::sentinel_t<range_type>;
  using item_type = bounded_item<range_type>;
  using wake_timer = net::basic_waitable_timer<std::chrono::steady_clock, net::wait_traits<std::chrono::steady_clock>,
                                               net::any_io_executor>;

  struct worker_slot {
    net::cancellation_signal signal;
    bool done = false;
  };

  bounded_state(const Executor& ex, Range&& r, std::size_t limit_, Fn&& fn_)
      : strand(net::make_strand(ex)), range(std::forward<Range>(r)), fn(std::move(fn_)), limit(limit_),
        wake(strand, wake_timer::time_point::max()) {}

  net::strand<Executor> strand;
  bounded_range<Range> range;
  Fn fn;
  std::size_t limit;
  std::optional<iterator> it;  // begun on the strand: beginning an input view may already read
  std::optional<sentinel> end;
  std::vector<std::unique_ptr<worker_slot>> workers;  // grows to min(limit, items), never further
  std::size_t live = 0;
  bool stopping = false;
  std::exception_ptr error;
  wake_timer wake;  // never expires; cancelled when the last worker ends, to wake the supervisor

  static constexpr std::size_t no_worker = static_cast<std::size_t>(-1);

  // The next item, or nullopt at the end, after an error, or when iterating throws (that is the error).
  // `self` is the calling worker's index (no_worker for the supervisor).
  std::optional<item_type> pull(std::size_t self) {
    if (stopping) return std::nullopt;
    try {
      if (!it) {
        it.emplace(std::ranges::begin(range.get()));
        end.emplace(std::ranges::end(range.get()));
      }
      if (*it == *end) return std::nullopt;
      std::optional<item_type> item(std::in_place, *it);
      ++*it;
      return item;
    } catch (...) {
      fail(std::current_exception(), self);
      return std::nullopt;
    }
  }

  // Records the first error and cancels every other worker still running; later errors are dropped (they
  // are mostly the cancellations this causes). The failing worker itself is not cancelled: it is stopping
  // anyway, and a cancelled coroutine that never suspended would fail co_spawn's final post.
  void fail(std::exception_ptr e, std::size_t self) {
    if (!error) error = std::move(e);
    if (stopping) return;
    stopping = true;
    for (std::size_t i = 0; i < workers.size(); ++i)
      if (i != self && !workers[i]->done) workers[i]->signal.emit(net::cancellation_type::terminal);
  }
};

template <class State>
net::awaitable<void> bounded_worker(std::shared_ptr<State> s, std::size_t self, typename State::item_type item) {
  std::optional<typename State::item_type> current(std::move(item));
  while (current) {
    try {
      co_await s->fn(current->get());
    } catch (...) {
      s->fail(std::current_exception(), self);
    }
    current.reset();
    if (auto next = s->pull(self)) current.emplace(std::move(*next));
  }
}

template <class State>
struct bounded_worker_done {
  std::shared_ptr<State> s;
  std::size_t index;
  void operator()(std::exception_ptr e) const {
    s->workers[index]->done = true;
    if (e) s->fail(std::move(e), index);
    if (--s->live == 0) s->wake.cancel();
  }
};

template <class State>
void bounded_spawn(const std::shared_ptr<State>& s, typename State::item_type item) {
  const std::size_t index = s->workers.size();
  s->workers.push_back(std::make_unique<typename State::worker_slot>());
  ++s->live;
  net::co_spawn(s->strand, bounded_worker(s, index, std::move(item)),
                net::bind_cancellation_slot(s->workers[index]->signal.slot(), bounded_worker_done<State>{s, index}));
}

// Runs on the strand: starts up to `limit` workers, each with its first item, then waits for all of them.
template <class State>
net::awaitable<void> bounded_supervise(std::shared_ptr<State> s) {
  co_await net::this_coro::throw_if_cancelled(false);  // a cancelled caller still waits for its workers
  while (s->workers.size() < s->limit) {
    auto item = s->pull(State::no_worker);
    if (!item) break;
    bounded_spawn(s, std::move(*item));
  }
  while (s->live != 0) {
    error_code ec;
    co_await s->wake.async_wait(net::redirect_error(net::use_awaitable, ec));
    auto state = co_await net::this_coro::cancellation_state;
    if (state.cancelled() != net::cancellation_type::none) {
      s->fail(std::make_exception_ptr(system_error(net::error::operation_aborted, "rein::for_each_bounded")),
              State::no_worker);
      co_await net::this_coro::reset_cancellation_state();
    }
  }
  if (s->error) std::rethrow_exception(s->error);
}

}  // namespace detail

/// Calls `co_await fn(item)` for every item of `range`, with at most `limit` calls in flight, and completes
/// when all are done: a sliding window over a huge input.
///
/// Items are pulled lazily, one when a call starts: a million items never make a million coroutine frames
/// or a copy of the input; the frames alive are at most `limit` workers, their calls, and the loop. Any input
/// range works (`std::views::iota(0, n)`, a vector, a generator-like input view). A forward range yielding
/// lvalue references (a container) passes each item by reference to the element; other ranges pass a copy
/// that lives until that call ends.
///
/// Errors: the first exception thrown by a call (or by iterating the range) stops pulling, cancels every
/// call still running (terminal cancellation: their pending Asio operations complete with
/// `operation_aborted`, usually thrown as `rein::system_error`), waits for them to finish, and is then
/// rethrown; exceptions after the first are dropped.
///
/// @param ex    the executor the calls run on. They run on one strand of it, so that the loop's own state
///              needs no lock: between their suspension points, calls run one at a time (as in Python's
///              asyncio), while their waits and I/O overlap. Use a multi-threaded pool for parallel CPU work
///              only through work the calls post elsewhere.
/// @param range any `std::ranges::input_range` (iterated as an lvalue): an lvalue range must outlive the
///              returned awaitable; an rvalue range (a container, a view) is moved into it.
/// @param limit the most calls in flight; >= 1.
/// @param fn    `fn(item)` returning `net::awaitable<R>` (R ignored); called on the strand; moved into the
///              awaitable.
/// @throws std::invalid_argument at the call (not at the co_await) if `limit` is 0.
///
/// @par Per-Operation Cancellation
/// Cancelling the awaiting coroutine (terminal) cancels every call in flight, pulls no more items, waits for
/// the calls to finish, and throws `operation_aborted` (or the first error of a call, if one came first).
/// Cancellation reaches the loop through Asio's co_spawn; on standalone Asio 1.22 it is delivered on the
/// cancelling thread, so there cancel from the executor's own thread.
template <class Executor, class Range, class Fn>
  requires std::ranges::input_range<Range&>
net::awaitable<void> for_each_bounded(const Executor& ex, Range&& range, std::size_t limit, Fn fn) {
  if (limit == 0) throw std::invalid_argument("rein::for_each_bounded: limit must be >= 1, got 0");
  using state_type = detail::bounded_state<Range, Fn, Executor>;
  auto state = std::make_shared<state_type>(ex, std::forward<Range>(range), limit, std::move(fn));
  net::strand<Executor> strand = state->strand;
  return net::co_spawn(strand, detail::bounded_supervise(std::move(state)), net::use_awaitable);
}

}  // namespace rein
