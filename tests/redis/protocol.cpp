// rein::redis without a network: SHA-1, command encoding, reply conversion, the script's verdicts, options,
// and the cluster client's pure parts (slots, redirections, the slot map).
#include "parsed_reply.hpp"
#include "support.hpp"

#include <rein/redis/cluster.hpp>
#include <rein/redis/detail/sha1.hpp>
#include <rein/redis/error.hpp>
#include <rein/redis/reply.hpp>
#include <rein/redis/shared_token_bucket.hpp>

#include <hiredis/hiredis.h>

#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

using namespace std::literals;
namespace net = rein::net;
using rein::redis::reply;
using kind = rein::redis::detail::verdict::kind;

namespace {

using rein_test::parsed;

rein::redis::detail::verdict verdict_of(std::string_view wire) {
  parsed p(wire);
  return rein::redis::detail::read_verdict({}, p.r);
}

}  // namespace

TEST_CASE("sha1_hex gives the FIPS 180 test vectors") {
  using rein::redis::detail::sha1_hex;
  CHECK(sha1_hex("") == "da39a3ee5e6b4b0d3255bfef95601890afd80709");
  CHECK(sha1_hex("abc") == "a9993e364706816aba3e25717850c26c9cd0d89d");
  CHECK(sha1_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
  CHECK(sha1_hex(std::string(1'000'000, 'a')) == "34aa973cd4c4daa4f61eeb2bdbad27316534016f");
  // 55 and 56 bytes: the padding needs one block, then two.
  CHECK(sha1_hex(std::string(55, 'x')) != sha1_hex(std::string(56, 'x')));
}

TEST_CASE("encode_command writes a RESP array of bulk strings, binary-safe") {
  CHECK(rein::redis::encode_command({"SET", "k", "v"}) == "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n");
  const std::string odd("a\0b\r\n", 5);
  CHECK(rein::redis::encode_command({"GET", odd}) == "*2\r\n$3\r\nGET\r\n$5\r\n"s + odd + "\r\n");
  CHECK(rein::redis::encode_command({"PING"}) == "*1\r\n$4\r\nPING\r\n");
  CHECK_THROWS_AS(rein::redis::encode_command(std::span<const std::string_view>()), std::invalid_argument);
}

TEST_CASE("reply::from_hiredis copies every RESP2 type, nested") {
  parsed p("*5\r\n:42\r\n$-1\r\n+OK\r\n-ERR bad\r\n*1\r\n$3\r\na\0b\r\n"sv);
  const reply r = reply::from_hiredis(*p.r);
  REQUIRE(r.type == reply::kind::array);
  REQUIRE(r.elements.size() == 5);
  CHECK(r.elements[0].type == reply::kind::integer);
  CHECK(r.elements[0].integer == 42);
  CHECK(r.elements[1].type == reply::kind::nil);
  CHECK(r.elements[2].type == reply::kind::status);
  CHECK(r.elements[2].text == "OK");
  CHECK(r.elements[3].is_error());
  CHECK(r.elements[3].text == "ERR bad");
  REQUIRE(r.elements[4].elements.size() == 1);
  CHECK(r.elements[4].elements[0].type == reply::kind::string);
  CHECK(r.elements[4].elements[0].text == std::string("a\0b", 3));
}

TEST_CASE("the script's replies read as verdicts") {
  const auto allowed = verdict_of("*4\r\n:1\r\n:0\r\n:5000\r\n:1764979200000001\r\n");
  CHECK(allowed.what == kind::allowed);
  CHECK(allowed.available_us == 5000);
  CHECK(allowed.units == 0);
  CHECK(allowed.server_time_us == 1764979200000001);
  const auto denied = verdict_of("*4\r\n:0\r\n:1250\r\n:3750\r\n:1764979200000002\r\n");
  CHECK(denied.what == kind::denied);
  CHECK(denied.retry_after_us == 1250);
  CHECK(denied.available_us == 3750);
  CHECK(denied.server_time_us == 1764979200000002);
  // The bucket's own numbers come between `available` and the time: the units taken, and a stored rate.
  const auto batch = verdict_of("*5\r\n:1\r\n:0\r\n:100\r\n:3\r\n:1764979200000003\r\n");
  CHECK(batch.units == 3);
  CHECK(batch.stored_interval_ns == 0);
  CHECK(batch.server_time_us == 1764979200000003);
  const auto stored = verdict_of("*7\r\n:1\r\n:0\r\n:100\r\n:1\r\n:2000000\r\n:20\r\n:1764979200000004\r\n");
  CHECK(stored.units == 1);
  CHECK(stored.stored_interval_ns == 2000000);
  CHECK(stored.stored_capacity == 20);
  CHECK(stored.server_time_us == 1764979200000004);
  CHECK(verdict_of("*3\r\n:1\r\n:0\r\n:5000\r\n").what == kind::server_error);  // a script without its time
  CHECK(verdict_of("-NOSCRIPT No matching script. Please use EVAL.\r\n").what == kind::no_script);
  for (const char* busy : {"-LOADING Redis is loading the dataset in memory\r\n", "-BUSY Redis is busy\r\n",
                           "-READONLY You can't write against a read only replica.\r\n",
                           "-MASTERDOWN Link with MASTER is down\r\n", "-OOM command not allowed\r\n"}) {
    CHECK(verdict_of(busy).what == kind::unavailable);
  }
  const auto wrong = verdict_of("-WRONGTYPE Operation against a key holding the wrong kind of value\r\n");
  CHECK(wrong.what == kind::server_error);
  CHECK(wrong.message.starts_with("WRONGTYPE"));
  CHECK(verdict_of("*2\r\n:1\r\n:0\r\n").what == kind::server_error);
  CHECK(verdict_of("*3\r\n:1\r\n$1\r\n0\r\n:0\r\n").what == kind::server_error);
  CHECK(verdict_of("+OK\r\n").what == kind::server_error);
  CHECK(rein::redis::detail::read_verdict(rein::redis::errc::unavailable, nullptr).what == kind::unavailable);
}

TEST_CASE("rein::redis::errc has its own category") {
  const rein::error_code ec = rein::redis::errc::unavailable;
  CHECK(std::string(ec.category().name()) == "rein.redis");
  CHECK(ec.message() == "Redis is unavailable");
  CHECK(ec != rein::error_code(rein::errc::timed_out));
}

TEST_CASE("invalid options throw, naming the type, the field and the value") {
  net::io_context io;
  rein::redis::connection c(io);  // nothing touches the network before the first command
  const auto message = [&](rein::redis::shared_token_bucket_options o) {
    try {
      rein::redis::shared_token_bucket bucket(c, o);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  const rein::redis::shared_token_bucket_options good{.key = "k", .rate = 10, .capacity = 5};
  CHECK(message(good) == "no exception");
  auto o = good;
  o.key = "";
  CHECK(message(o) == "rein::redis::shared_token_bucket: key must not be empty");
  o = good;
  o.rate = -1;
  CHECK(message(o) == "rein::redis::shared_token_bucket: rate must be > 0, finite and at most 1e9 tokens per second, got -1");
  o.rate = std::numeric_limits<double>::quiet_NaN();
  CHECK(message(o).starts_with("rein::redis::shared_token_bucket: rate must be > 0"));
  o = good;
  o.capacity = 0;
  CHECK(message(o) == "rein::redis::shared_token_bucket: capacity must be in [1, 1e15] tokens, got 0");
  o = good;
  o.rate = 1e-6;
  o.capacity = 10'000;
  CHECK(message(o) == "rein::redis::shared_token_bucket: capacity / rate (seconds to refill from empty) must be at most 1e9, got 1e+10");
  o = good;
  o.fail_open_share = 1.5;
  CHECK(message(o) == "rein::redis::shared_token_bucket: fail_open_share must be in (0, 1], got 1.5");
  o = good;
  o.max_in_flight = 0;
  CHECK(message(o) == "rein::redis::shared_token_bucket: max_in_flight must be >= 1, got 0");
  o = good;
  o.key = "a}b";  // its rate key "{a}b}:rate" would be in another Cluster slot
  CHECK(message(o) == "rein::redis::shared_token_bucket: key must have a hash tag ({tag}) when it contains '}', got \"a}b\"");
  o.key = "{}{x}";  // an empty tag is none
  CHECK(message(o) == "rein::redis::shared_token_bucket: key must have a hash tag ({tag}) when it contains '}', got \"{}{x}\"");
  o.key = "a{b}c}";
  CHECK(message(o) == "no exception");
  CHECK(rein::redis::key_slot(rein::redis::detail::bucket_commands::rate_key("a{b}c}")) == rein::redis::key_slot("a{b}c}"));
  CHECK(rein::redis::key_slot(rein::redis::detail::bucket_commands::rate_key("plain")) == rein::redis::key_slot("plain"));
  o = good;
  o.recheck_interval = std::chrono::milliseconds(-1);
  CHECK(message(o) == "rein::redis::shared_token_bucket: recheck_interval must be >= 0, got -1ms");

  const auto connection_message = [&](rein::redis::connection_options co) {
    try {
      rein::redis::connection bad(io, co);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  rein::redis::connection_options co;
  co.port = 0;
  CHECK(connection_message(co) == "rein::redis::connection: port must be in [1, 65535], got 0");
  co = {};
  co.request_timeout = std::chrono::milliseconds(0);
  CHECK(connection_message(co) == "rein::redis::connection: request_timeout must be > 0, got 0ms");
  co = {};
  co.reconnect_cap = std::chrono::milliseconds(5);
  CHECK(connection_message(co) == "rein::redis::connection: reconnect_cap must be >= reconnect_base, got 5ms");
  co = {};
  co.host = "";
  CHECK(connection_message(co) == "rein::redis::connection: host must not be empty");
}

TEST_CASE("key_slot is Redis Cluster's: CRC16 (XMODEM) of the hash tag, modulo 16384") {
  using rein::redis::key_slot;
  STATIC_REQUIRE(rein::redis::detail::crc16_xmodem("123456789") == 0x31C3);  // the CRC's check value
  STATIC_REQUIRE(key_slot("foo") == 12182);                                 // the specification's example
  CHECK(key_slot("bar") == 5061);
  CHECK(key_slot("") == 0);
  // Hash tags, the specification's cases: the first '{', the next '}', a tag only if not empty.
  CHECK(key_slot("{user1000}.following") == key_slot("user1000"));
  CHECK(key_slot("{user1000}.followers") == key_slot("user1000"));
  CHECK(key_slot("foo{}{bar}") == rein::redis::detail::crc16_xmodem("foo{}{bar}") % 16384);
  CHECK(key_slot("foo{{bar}}zap") == key_slot("{bar"));
  CHECK(key_slot("foo{bar}{zap}") == key_slot("bar"));
  CHECK(key_slot("no}tag{") == rein::redis::detail::crc16_xmodem("no}tag{") % 16384);
  // A limiter's keys share one slot.
  CHECK(key_slot("rein:{api}:sem:holders") == key_slot("rein:{api}:sem:limit"));
  CHECK(key_slot("quota") == key_slot("{quota}:rate"));
}

TEST_CASE("MOVED and ASK replies are read; anything else is not a redirection") {
  using rein::redis::detail::parse_redirection;
  const auto moved = parse_redirection("MOVED 3999 127.0.0.1:6381");
  REQUIRE(moved.has_value());
  CHECK_FALSE(moved->ask);
  CHECK(moved->slot == 3999);
  CHECK(moved->host == "127.0.0.1");
  CHECK(moved->port == 6381);
  const auto ask = parse_redirection("ASK 16383 redis-7.internal:7000");
  REQUIRE(ask.has_value());
  CHECK(ask->ask);
  CHECK(ask->slot == 16383);
  CHECK(ask->host == "redis-7.internal");
  CHECK(ask->port == 7000);
  const auto same_host = parse_redirection("MOVED 1 :7001");  // Redis 7: the endpoint of the node asked
  REQUIRE(same_host.has_value());
  CHECK(same_host->host.empty());
  CHECK(same_host->port == 7001);
  const auto v6 = parse_redirection("MOVED 2 ::1:7002");
  REQUIRE(v6.has_value());
  CHECK(v6->host == "::1");
  CHECK(v6->port == 7002);
  for (const std::string_view bad : {"MOVED 16384 h:1", "MOVED 1 h:0", "MOVED 1 h:65536", "MOVED x h:1", "MOVED 1",
                                     "MOVED 1 h", "ASK  h:1", "ERR MOVED 1 h:1", "CLUSTERDOWN The cluster is down",
                                     "moved 1 h:1"})
    CHECK_FALSE(parse_redirection(bad).has_value());
}

TEST_CASE("CLUSTER SLOTS answers are read whole, or not at all") {
  using rein::redis::detail::parse_cluster_slots;
  // Three ranges; the second master's endpoint is nil (the node asked), the third's "?" (unknown: the range
  // stays unmapped); replicas follow masters.
  parsed two("*3\r\n"
             "*4\r\n:0\r\n:5460\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n*3\r\n$9\r\n127.0.0.1\r\n:7003\r\n$2\r\nr1\r\n"
             "*3\r\n:5461\r\n:16383\r\n*2\r\n$-1\r\n:7001\r\n"
             "*3\r\n:100\r\n:200\r\n*2\r\n$1\r\n?\r\n:7002\r\n");
  const auto ranges = parse_cluster_slots(*two.r);
  REQUIRE(ranges.has_value());
  REQUIRE(ranges->size() == 2);
  CHECK((*ranges)[0].first == 0);
  CHECK((*ranges)[0].last == 5460);
  CHECK((*ranges)[0].host == "127.0.0.1");
  CHECK((*ranges)[0].port == 7000);
  CHECK((*ranges)[1].first == 5461);
  CHECK((*ranges)[1].last == 16383);
  CHECK((*ranges)[1].host.empty());
  CHECK((*ranges)[1].port == 7001);

  // One malformed range spoils the answer: a range past the last slot, a reversed range, a port of 0,
  // a missing master, an error reply.
  for (const std::string_view bad :
       {"*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\nh\r\n:7000\r\n"sv,
        "*1\r\n*3\r\n:9\r\n:8\r\n*2\r\n$1\r\nh\r\n:7000\r\n"sv,
        "*1\r\n*3\r\n:0\r\n:8\r\n*2\r\n$1\r\nh\r\n:0\r\n"sv,
        "*1\r\n*2\r\n:0\r\n:8\r\n"sv,
        "-ERR This instance has cluster support disabled\r\n"sv}) {
    parsed p(bad);
    CHECK_FALSE(parse_cluster_slots(*p.r).has_value());
  }
}

TEST_CASE("invalid cluster options throw, naming the field and the value") {
  net::io_context io;
  const auto message = [&](rein::redis::cluster_options o) {
    try {
      rein::redis::cluster c(io, o);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  const rein::redis::cluster_options good{.seeds = {{"127.0.0.1", 7000}}};
  CHECK(message(good) == "no exception");
  auto o = good;
  o.seeds.clear();
  CHECK(message(o) == "rein::redis::cluster: seeds must name at least one node");
  o = good;
  o.seeds.push_back({"h", 0});
  CHECK(message(o) == "rein::redis::cluster: seeds: port must be in [1, 65535], got 0 (host h)");
  o = good;
  o.connection.database = 2;
  CHECK(message(o) == "rein::redis::cluster: connection.database must be 0 (a cluster has only database 0), got 2");
  o = good;
  o.refresh_interval = std::chrono::milliseconds(0);
  CHECK(message(o) == "rein::redis::cluster: refresh_interval must be > 0, got 0ms");
  o = good;
  o.max_redirects = 0;
  CHECK(message(o) == "rein::redis::cluster: max_redirects must be >= 1, got 0");
  o = good;
  o.connection.request_timeout = std::chrono::milliseconds(0);
  CHECK(message(o) == "rein::redis::connection: request_timeout must be > 0, got 0ms");
}
