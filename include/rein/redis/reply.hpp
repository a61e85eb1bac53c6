// Redis commands and replies as plain values; hiredis does the protocol (encoding and parsing).
#pragma once

#include <hiredis/hiredis.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace rein::redis {

/// One reply of a Redis server (RESP2), copied out of the tree hiredis's reader builds.
struct reply {
  /// The RESP2 type of a reply.
  enum class kind : std::uint8_t { nil, status, error, integer, string, array };

  /// This reply's type.
  kind type = kind::nil;
  long long integer = 0;        ///< kind::integer
  std::string text;             ///< kind::status, kind::error and kind::string (binary-safe)
  std::vector<reply> elements;  ///< kind::array

  /// Whether Redis answered with an error (its message is in `text`).
  bool is_error() const noexcept { return type == kind::error; }

  /// A copy of hiredis's reply (which keeps owning it). RESP3 types, which a RESP2 connection never
  /// receives, are kept as text when they carry text and as nil otherwise.
  static reply from_hiredis(const ::redisReply& r) {
    reply out;
    switch (r.type) {
      case REDIS_REPLY_NIL: break;
      case REDIS_REPLY_STATUS: out.type = kind::status; break;
      case REDIS_REPLY_ERROR: out.type = kind::error; break;
      case REDIS_REPLY_INTEGER:
        out.type = kind::integer;
        out.integer = r.integer;
        return out;
      case REDIS_REPLY_STRING: out.type = kind::string; break;
      case REDIS_REPLY_ARRAY:
        out.type = kind::array;
        out.elements.reserve(r.elements);
        for (std::size_t i = 0; i < r.elements; ++i) out.elements.push_back(from_hiredis(*r.element[i]));
        return out;
      default:
        if (r.str == nullptr) return out;
        out.type = kind::string;
        break;
    }
    if (r.str != nullptr) out.text.assign(r.str, r.len);
    return out;
  }
};

/// Encodes one command in the Redis protocol with hiredis's `redisFormatCommandArgv` (each argument is
/// sent as is, binary-safe: no format string, no quoting).
///
/// @throws std::invalid_argument if `args` is empty; std::bad_alloc if hiredis cannot allocate.
inline std::string encode_command(std::span<const std::string_view> args) {
  if (args.empty()) throw std::invalid_argument("rein::redis::encode_command: a command needs at least its name");
  std::vector<const char*> argv;
  std::vector<std::size_t> lengths;
  argv.reserve(args.size());
  lengths.reserve(args.size());
  for (std::string_view a : args) {
    argv.push_back(a.data());
    lengths.push_back(a.size());
  }
  char* raw = nullptr;
  const auto length = ::redisFormatCommandArgv(&raw, static_cast<int>(argv.size()), argv.data(), lengths.data());
  if (length < 0 || raw == nullptr) throw std::bad_alloc();
  std::string out(raw, static_cast<std::size_t>(length));
  ::redisFreeCommand(raw);
  return out;
}

/// encode_command for a braced list: `encode_command({"SET", key, value})`.
inline std::string encode_command(std::initializer_list<std::string_view> args) {
  return encode_command(std::span<const std::string_view>(args.begin(), args.size()));
}

}  // namespace rein::redis
