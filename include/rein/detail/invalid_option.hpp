// The one way rein words an invalid option: "<type>: <rule>, got <value>". Not API.
//
// Every options struct, algorithm and I/O object validates through these, so messages read the same
// everywhere, and an I/O object that validates through a nested pure rule (an algo:: type) renames the
// message to the type the user wrote (renaming_errors), with the field's path ("backoff.base").
#pragma once

#include <charconv>
#include <chrono>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace rein::detail {

/// A number as the shortest text that reads back to it, locale-free: 0.5, 1e+20, -3.
template <class T>
  requires std::is_arithmetic_v<T> && (!std::is_same_v<T, bool>)
std::string show(T value) {
  char buffer[64];
  const auto end = std::to_chars(buffer, buffer + sizeof buffer, value).ptr;
  return std::string(buffer, end);
}

/// A duration in nanoseconds with its unit: "-5000000 ns".
inline std::string show(std::chrono::nanoseconds d) { return show(d.count()) + " ns"; }

/// "rein::semaphore" or, for a named limiter, "rein::semaphore \"api\"": how messages name a limiter.
inline std::string describe(std::string_view type, std::string_view name) {
  std::string s(type);
  if (!name.empty()) {
    s += " \"";
    s += name;
    s += '"';
  }
  return s;
}

/// Throws `std::invalid_argument("<type>: <rule>, got <got>")`.
[[noreturn]] inline void throw_invalid(std::string_view type, std::string_view rule, std::string_view got) {
  std::string message(type);
  message.append(": ").append(rule).append(", got ").append(got);
  throw std::invalid_argument(message);
}

/// A draw from a random source, checked where it is used (a function given as a source cannot be checked
/// where it is given): a number in [0, 1], both ends included, the same everywhere rein takes one. Anything
/// else, NaN included, throws `std::invalid_argument("<who>: <field> must be in [0, 1], got <draw>")`; check
/// before changing anything, so that a refused draw costs nothing.
inline double checked_draw(std::string_view who, std::string_view field, double draw) {
  if (!(draw >= 0.0 && draw <= 1.0)) throw_invalid(who, std::string(field) + " must be in [0, 1]", show(draw));
  return draw;
}

/// A work hint (how much work a call asked of its dependency), checked where it is given: finite and >= 0,
/// the same everywhere rein takes one. Anything else, NaN included, throws
/// `std::invalid_argument("<who>: work must be >= 0 and finite, got <work>")`.
inline double checked_work(std::string_view who, double work) {
  if (!(work >= 0.0 && work <= std::numeric_limits<double>::max()))
    throw_invalid(who, "work must be >= 0 and finite", show(work));
  return work;
}

/// Who an error names: a type and, for a named object, its name. Worded (describe) only when an error is
/// rethrown, so that a hot path that may rename an error builds no string until one comes.
struct named {
  std::string_view type;
  std::string_view name = {};
};

/// Throws `std::invalid_argument("<who>: <field_path><rest>")`.
[[noreturn]] inline void throw_renamed(named who, std::string_view field_path, std::string_view rest) {
  std::string message = describe(who.type, who.name);
  message.append(": ").append(field_path).append(rest);
  throw std::invalid_argument(message);
}

/// Runs f; an std::invalid_argument whose message starts with "<from>: " is rethrown as
/// "<who>: <field_path><the rest>", so that an I/O object's errors name the type the user wrote and, for a
/// nested options struct, the field's path ("rein::retry_policy: backoff.base must be > 0, got 0 ns").
/// Other exceptions pass through unchanged.
template <class F>
decltype(auto) renaming_errors(std::string_view from, named who, F&& f, std::string_view field_path = {}) {
  try {
    return std::forward<F>(f)();
  } catch (const std::invalid_argument& e) {
    const std::string_view what = e.what();
    if (what.size() < from.size() + 2 || what.substr(0, from.size()) != from ||
        what.substr(from.size(), 2) != ": ")
      throw;
    throw_renamed(who, field_path, what.substr(from.size() + 2));
  }
}

/// Runs f; an std::invalid_argument from one of rein's pure rules ("rein::algo::<rule>: <rest>") is rethrown
/// as "<who>: <rule>.<rest>", naming the I/O object the user wrote and the nested options the rule took
/// ("rein::adaptive_limiter: aimd.backoff must be in (0, 1), got 2"). Other exceptions pass unchanged.
template <class F>
decltype(auto) renaming_nested_errors(named who, F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const std::invalid_argument& e) {
    constexpr std::string_view pure = "rein::algo::";
    const std::string_view what = e.what();
    const std::size_t colon = what.find(": ");
    if (what.substr(0, pure.size()) != pure || colon == std::string_view::npos) throw;
    const std::string field = std::string(what.substr(pure.size(), colon - pure.size())) + ".";
    throw_renamed(who, field, what.substr(colon + 2));
  }
}

}  // namespace rein::detail
