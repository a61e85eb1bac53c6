// What a completed call says about the dependency's capacity.
#pragma once

namespace rein {

/// The outcome of one call made under a permit, fed back to adaptive limiters.
///
/// - `success`: the call completed normally; its latency (from grant to report) is a sample.
/// - `congestion`: the dependency said "you are sending too much": a timeout, 429, 503 or 504.
/// - `ignored`: the call says nothing about capacity (400, 401, 404, cancelled by the caller); no sample.
///
/// The three-way split follows Netflix concurrency-limits (onSuccess / onDropped / onIgnore).
enum class outcome { success, congestion, ignored };

/// Maps an HTTP status code to an outcome.
///
/// 2xx and 3xx are `success`; 408 (request timeout), 429 (too many requests), 503 (service unavailable)
/// and 504 (gateway timeout) are `congestion`; every other code, including 500 and the rest of 4xx, is
/// `ignored`, since it says nothing about load. Codes outside [100, 599] are `ignored`.
constexpr outcome classify_http_status(int status) noexcept {
  if (status >= 200 && status < 400) return outcome::success;
  switch (status) {
    case 408:
    case 429:
    case 503:
    case 504: return outcome::congestion;
    default: return outcome::ignored;
  }
}

}  // namespace rein
