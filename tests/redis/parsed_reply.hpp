// A reply parsed from RESP bytes with hiredis's reader, as the connection parses it: for the tests of the
// reply readers (protocol, Sentinel discovery).
#pragma once

#include "support/catch.hpp"

#include <hiredis/hiredis.h>

#include <string_view>

namespace rein_test {

// Parses one reply with hiredis's reader, as the connection does.
struct parsed {
  redisReply* r = nullptr;
  explicit parsed(std::string_view wire) {
    redisReader* reader = redisReaderCreate();
    REQUIRE(redisReaderFeed(reader, wire.data(), wire.size()) == REDIS_OK);
    void* out = nullptr;
    REQUIRE(redisReaderGetReply(reader, &out) == REDIS_OK);
    REQUIRE(out != nullptr);
    r = static_cast<redisReply*>(out);
    redisReaderFree(reader);
  }
  parsed(const parsed&) = delete;
  parsed& operator=(const parsed&) = delete;
  ~parsed() { freeReplyObject(r); }
};

}  // namespace rein_test
