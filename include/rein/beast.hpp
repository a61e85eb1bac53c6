// Boost.Beast responses read as rein::upstream_response: status, Retry-After and rate-limit headers.
// Optional: needs Boost.Beast (part of Boost), so it is not part of the standalone-Asio build.
#pragma once

#include <rein/rate_limit_headers.hpp>

#include <boost/beast/core/string_type.hpp>
#include <boost/beast/http/message.hpp>

#include <chrono>
#include <optional>
#include <string_view>

namespace rein {

/// Reads a Boost.Beast response for what rein's limiters need: `rein::read_response(response.result_int(),
/// <its fields>, dialect, now)`, so `result` is the status's outcome (rein::classify_http_status),
/// `retry_after` the Retry-After delay (RFC 9110 section 10.2.3), `too_many_requests` a 429 or a 503 with
/// Retry-After, and `requests` / `tokens` the budgets of the header dialect (rein::rate_limit_dialect: OpenAI,
/// Anthropic, GitHub-style, IETF RateLimit; detected from the fields present unless given), each in its
/// provider's meaning. Field names match case-insensitively, as Beast's fields do; of a repeated field, the
/// first counts.
///
/// Reads only: the response's body is not touched, and nothing is kept after the call. Never throws for
/// any field value (unreadable ones are absent). Safe to call concurrently on responses nobody modifies.
///
/// @param response any `boost::beast::http::response<Body, Fields>` (a string_body, an empty_body, ...).
/// @param dialect  whose rate-limit headers to read (default: detected).
/// @param now      the recipient's current time, the origin of HTTP-dates and RFC 3339 timestamps.
template <class Body, class Fields>
upstream_response read_response(const boost::beast::http::response<Body, Fields>& response,
                                rate_limit_dialect dialect = rate_limit_dialect::detect,
                                std::chrono::system_clock::time_point now = std::chrono::system_clock::now()) {
  const auto header = [&response](std::string_view name) -> std::optional<std::string_view> {
    const auto field = response.find(boost::beast::string_view(name.data(), name.size()));
    if (field == response.end()) return std::nullopt;
    const auto value = field->value();
    return std::string_view(value.data(), value.size());
  };
  return read_response(static_cast<int>(response.result_int()), header, dialect, now);
}

/// As read_response(response, dialect, now), the dialect detected from the fields present.
template <class Body, class Fields>
upstream_response read_response(const boost::beast::http::response<Body, Fields>& response,
                                std::chrono::system_clock::time_point now) {
  return read_response(response, rate_limit_dialect::detect, now);
}

}  // namespace rein
