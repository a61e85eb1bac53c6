// Finding the master through Redis Sentinel without a network: the replies' readers, the search's steps,
// the order of the sentinels, and the options' validation.
#include "parsed_reply.hpp"
#include "support/asio.hpp"
#include "support/catch.hpp"

#include <rein/redis/detail/sentinel_discovery.hpp>
#include <rein/redis/sentinel.hpp>

#include <hiredis/hiredis.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

using namespace std::literals;
namespace net = rein::net;
using rein::redis::endpoint;
using rein::redis::detail::discovery_step;
using rein::redis::detail::sentinel_discovery;
using kind = discovery_step::kind;

namespace {

using rein_test::parsed;

std::optional<endpoint> address_of(std::string_view wire) {
  parsed p(wire);
  return rein::redis::detail::parse_master_address(*p.r);
}

bool master_by(std::string_view wire) {
  parsed p(wire);
  return rein::redis::detail::reads_as_master(*p.r);
}

// A step, written down for exact comparison.
std::string show(const discovery_step& s) {
  switch (s.what) {
    case kind::ask_sentinel: return "ask " + std::to_string(s.sentinel);
    case kind::check_role: return "role " + s.address.host + ":" + std::to_string(s.address.port);
    case kind::found: return "found " + s.address.host + ":" + std::to_string(s.address.port) + " from " + std::to_string(s.sentinel);
    case kind::failed: return "failed";
  }
  return "?";
}

const endpoint old_master{"127.0.0.1", 6379};
const endpoint new_master{"127.0.0.1", 6380};

}  // namespace

TEST_CASE("GET-MASTER-ADDR-BY-NAME answers are read as an address, or as none") {
  const auto a = address_of("*2\r\n$9\r\n127.0.0.1\r\n$4\r\n6380\r\n");
  REQUIRE(a.has_value());
  CHECK(a->host == "127.0.0.1");
  CHECK(a->port == 6380);
  CHECK_FALSE(address_of("*-1\r\n").has_value());                                 // the name is not monitored
  CHECK_FALSE(address_of("$-1\r\n").has_value());
  CHECK_FALSE(address_of("-ERR unknown command\r\n").has_value());
  CHECK_FALSE(address_of("*2\r\n$0\r\n\r\n$4\r\n6380\r\n").has_value());           // no host
  CHECK_FALSE(address_of("*2\r\n$9\r\n127.0.0.1\r\n$1\r\n0\r\n").has_value());     // port 0
  CHECK_FALSE(address_of("*2\r\n$9\r\n127.0.0.1\r\n$5\r\n65536\r\n").has_value()); // too large
  CHECK_FALSE(address_of("*2\r\n$9\r\n127.0.0.1\r\n$3\r\n63x\r\n").has_value());   // not a number
  CHECK_FALSE(address_of("*1\r\n$9\r\n127.0.0.1\r\n").has_value());
}

TEST_CASE("ROLE says master only when its first element is \"master\"") {
  CHECK(master_by("*3\r\n$6\r\nmaster\r\n:3129659\r\n*0\r\n"));
  CHECK_FALSE(master_by("*5\r\n$5\r\nslave\r\n$9\r\n127.0.0.1\r\n:9538\r\n$9\r\nconnected\r\n:3167038\r\n"));
  CHECK_FALSE(master_by("*2\r\n$8\r\nsentinel\r\n*0\r\n"));
  CHECK_FALSE(master_by("-LOADING Redis is loading the dataset in memory\r\n"));
  CHECK_FALSE(master_by("*0\r\n"));
}

TEST_CASE("the first sentinel that names a master ROLE confirms ends the search") {
  sentinel_discovery d({0, 1, 2});
  CHECK(show(d.start()) == "ask 0");
  CHECK(show(d.on_master_address(new_master)) == "role 127.0.0.1:6380");
  CHECK(show(d.on_role(true)) == "found 127.0.0.1:6380 from 0");
}

TEST_CASE("a sentinel down, silent or answering null is passed over") {
  sentinel_discovery d({2, 0, 1});
  CHECK(show(d.start()) == "ask 2");
  CHECK(show(d.on_master_address(std::nullopt)) == "ask 0");
  CHECK(show(d.on_master_address(std::nullopt)) == "ask 1");
  CHECK(show(d.on_master_address(new_master)) == "role 127.0.0.1:6380");
  CHECK(show(d.on_role(true)) == "found 127.0.0.1:6380 from 1");
}

TEST_CASE("a stale sentinel's dead master is refused by ROLE and the next sentinel is asked") {
  sentinel_discovery d({0, 1, 2});
  CHECK(show(d.start()) == "ask 0");
  CHECK(show(d.on_master_address(old_master)) == "role 127.0.0.1:6379");
  CHECK(show(d.on_role(false)) == "ask 1");
  // Sentinel 1 is stale too: the candidate ROLE refused is not checked again in this search.
  CHECK(show(d.on_master_address(old_master)) == "ask 2");
  CHECK(show(d.on_master_address(new_master)) == "role 127.0.0.1:6380");
  CHECK(show(d.on_role(true)) == "found 127.0.0.1:6380 from 2");
}

TEST_CASE("the search fails once every sentinel was asked") {
  sentinel_discovery d({0, 1});
  CHECK(show(d.start()) == "ask 0");
  CHECK(show(d.on_master_address(old_master)) == "role 127.0.0.1:6379");
  CHECK(show(d.on_role(false)) == "ask 1");
  CHECK(show(d.on_master_address(std::nullopt)) == "failed");

  sentinel_discovery none({});
  CHECK(show(none.start()) == "failed");
}

TEST_CASE("the sentinel that answered is asked first next time, the others keep their order") {
  std::vector<std::size_t> order{0, 1, 2, 3};
  rein::redis::detail::put_first(order, 2);
  CHECK(order == std::vector<std::size_t>{2, 0, 1, 3});
  rein::redis::detail::put_first(order, 2);
  CHECK(order == std::vector<std::size_t>{2, 0, 1, 3});
  rein::redis::detail::put_first(order, 3);
  CHECK(order == std::vector<std::size_t>{3, 2, 0, 1});
  rein::redis::detail::put_first(order, 9);  // not in the list: nothing moves
  CHECK(order == std::vector<std::size_t>{3, 2, 0, 1});
}

TEST_CASE("invalid sentinel options throw, naming the type, the field and the value") {
  net::io_context io;
  const auto message = [&](rein::redis::sentinel_options o) {
    try {
      rein::redis::sentinel s(io, std::move(o));  // nothing touches the network before the first command
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  const rein::redis::sentinel_options good{.sentinels = {{"127.0.0.1", 26379}}, .master_name = "m"};
  CHECK(message(good) == "no exception");
  auto o = good;
  o.sentinels.clear();
  CHECK(message(o) == "rein::redis::sentinel: sentinels must name at least one sentinel");
  o = good;
  o.sentinels.push_back({"", 26380});
  CHECK(message(o) == "rein::redis::sentinel: sentinels: a host must not be empty");
  o = good;
  o.sentinels.push_back({"10.0.0.9", 0});
  CHECK(message(o) == "rein::redis::sentinel: sentinels: port must be in [1, 65535], got 0 (host 10.0.0.9)");
  o = good;
  o.master_name = "";
  CHECK(message(o) == "rein::redis::sentinel: master_name must not be empty");
  o = good;
  o.sentinel_timeout = 0ms;
  CHECK(message(o) == "rein::redis::sentinel: sentinel_timeout must be > 0, got 0ms");
  o.sentinel_timeout = -5ms;
  CHECK(message(o) == "rein::redis::sentinel: sentinel_timeout must be > 0, got -5ms");
  o = good;
  o.sentinel_username = "rein";
  CHECK(message(o) == "rein::redis::sentinel: sentinel_username needs a sentinel_password");
  o = good;
  o.connection.request_timeout = 0ms;
  CHECK(message(o) == "rein::redis::sentinel: connection.request_timeout must be > 0, got 0ms");
  o = good;
  o.connection.reconnect_cap = 10ms;
  CHECK(message(o) == "rein::redis::sentinel: connection.reconnect_cap must be >= reconnect_base, got 10ms");
}

TEST_CASE("a Sentinel client's connection defaults to a short reconnection cap") {
  const rein::redis::sentinel_options o{.sentinels = {{"127.0.0.1", 26379}}, .master_name = "m"};
  CHECK(o.connection.reconnect_cap == 250ms);
  CHECK(o.connection.reconnect_base == 25ms);
  CHECK(o.sentinel_timeout == 250ms);
}
