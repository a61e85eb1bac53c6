// Waiting on a rate limiter's line until it could take n, taking nothing: the ready waits of
// limiter_core::async_ready and the room ("claim") their grants keep, as the throttle's step 3 uses them.
// Not API.
#pragma once

#include <rein/config.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/detail/wait_op.hpp>

#include REIN_ASIO_HEADER(async_result.hpp)

#include <cstddef>
#include <memory>
#include <utility>

namespace rein::detail {

/// The line of a rate limiter (rein::basic_rate_limiter and the types derived from it), for the throttle:
/// a friend of the limiter, so that the line stays out of the public interface.
struct rate_line_access {
  template <class Limiter>
  static auto* line(const Limiter& l) noexcept
    requires requires { l.core(); }
  {
    return l.core();
  }
};

/// A limiter whose line serves ready waits: a local rate line (a remote one, the Redis bucket, has none).
template <class Limiter>
concept ready_line = requires(const Limiter& l, std::size_t n) {
  { rate_line_access::line(l)->try_claim(n) } -> std::same_as<bool>;
};

/// Room a line keeps for one caller after a ready grant (limiter_core::try_claim or async_ready): given up
/// when destroyed or reset, unless taken first (limiter_core::take_claim ends it: then taken()). Move-only.
/// It shares the line's core, as a runner of a grant does, so that it may outlive its limiter (a guard
/// destroyed after its throttle's keyed stage evicted or destroyed the key's limiter): giving it up then
/// touches only the core. Made on the waiting path only, where one reference count is cheap.
class rate_claim {
 public:
  rate_claim() noexcept = default;
  rate_claim(std::shared_ptr<wait_owner> line, std::size_t units) noexcept : line_(std::move(line)), units_(units) {}
  rate_claim(rate_claim&&) noexcept = default;
  rate_claim& operator=(rate_claim&& other) noexcept {
    if (this != &other) {
      reset();
      line_ = std::move(other.line_);
      units_ = other.units_;
    }
    return *this;
  }
  rate_claim(const rate_claim&) = delete;
  rate_claim& operator=(const rate_claim&) = delete;
  ~rate_claim() { reset(); }

  /// Whether room is kept.
  explicit operator bool() const noexcept { return line_ != nullptr; }
  /// The units room is kept for.
  std::size_t units() const noexcept { return units_; }

  /// The line ended the claim (take_claim): nothing to give up.
  void taken() noexcept { line_.reset(); }

  /// Gives the room up now.
  void reset() noexcept {
    if (line_ != nullptr) std::exchange(line_, nullptr)->drop_claim(units_);
  }

 private:
  std::shared_ptr<wait_owner> line_;
  std::size_t units_ = 0;
};

/// The initiation of a ready wait on a line (a named one, as Asio's own objects use).
template <class Line>
struct initiate_ready {
  Line* line;
  using executor_type = typename Line::executor_type;
  executor_type get_executor() const noexcept { return line->get_executor(); }

  template <class Handler>
  void operator()(Handler&& handler, std::size_t n, typename Line::time_point deadline) const {
    line->async_ready(std::forward<Handler>(handler), n, deadline);
  }
};

/// A ready wait on `line` for n (limiter_core::async_ready), through any completion token; signature
/// `void(error_code)`. On success the caller owns a claim of n on the line (wrap it in a rate_claim).
template <class Line, class Token>
auto async_ready(Line* line, std::size_t n, typename Line::time_point deadline, Token&& token) {
  return net::async_initiate<Token, void(error_code)>(initiate_ready<Line>{line}, token, n, deadline);
}

}  // namespace rein::detail
