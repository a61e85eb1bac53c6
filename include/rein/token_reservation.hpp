// A reservation of a token bucket's tokens: reserve now, learn the delay, then wait, go elsewhere or cancel
// (Go's x/time/rate Reservation) on Asio.
#pragma once

#include <rein/algo/token_bucket.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/reservation.hpp>

#include REIN_ASIO_HEADER(any_io_executor.hpp)

#include <chrono>
#include <mutex>

namespace rein {

/// Tokens reserved from a rein::basic_token_bucket by its `reserve(n)`: rein::basic_reservation over the
/// bucket's rule, with the bucket's order of template parameters. Its `cancel()` gives back every token
/// except those a later reservation still counts on (algo::basic_token_bucket::cancel_reservation states
/// the rule and where Go's `CancelAt` was wrong).
template <class Executor = net::any_io_executor, class Clock = std::chrono::steady_clock, class Mutex = std::mutex>
using basic_token_reservation = basic_reservation<algo::basic_token_bucket<Clock>, Executor, Mutex>;

}  // namespace rein
