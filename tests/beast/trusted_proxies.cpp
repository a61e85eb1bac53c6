// rein/beast/trusted_proxies.hpp: the client of a request behind proxies, read from X-Forwarded-For or
// RFC 7239 Forwarded only as far as trusted proxies wrote it; forged and malformed fields have exact answers.
#include "support/catch.hpp"

#include <rein/beast/trusted_proxies.hpp>

#include <boost/asio/ip/address.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/message.hpp>

#include <initializer_list>
#include <stdexcept>
#include <string>

namespace {

namespace http = boost::beast::http;
using rein::beast::client_source;
using rein::beast::forwarded_field;
using rein::beast::trusted_proxies;

const auto proxy = boost::asio::ip::make_address("10.0.0.1");
const auto inner_proxy = boost::asio::ip::make_address("10.0.0.2");
const auto stranger = boost::asio::ip::make_address("192.0.2.99");

// A request with one field line per value of `lines` under `name`.
http::request<http::empty_body> with(const char* name, std::initializer_list<const char*> lines) {
  http::request<http::empty_body> r{http::verb::get, "/", 11};
  for (const char* line : lines) r.insert(name, line);
  return r;
}

// "<key> <source>" of the client `proxies` finds for `request` from `peer`.
std::string found(trusted_proxies& proxies, const http::request<http::empty_body>& request,
                  const boost::asio::ip::address& peer = proxy) {
  const rein::beast::client_address c = proxies.client(request, peer);
  return c.key() + " " + rein::beast::to_string(c.source);
}

}  // namespace

TEST_CASE("no trusted proxy: the field is never read, the peer is the client", "[beast][trusted_proxies]") {
  trusted_proxies none;
  CHECK(found(none, with("X-Forwarded-For", {"203.0.113.7"})) == "10.0.0.1 peer");
  CHECK(none.malformed() == 0);
}

TEST_CASE("trusted by address: the right-most address that is no trusted proxy's", "[beast][trusted_proxies]") {
  trusted_proxies proxies({.addresses = {"10.0.0.1", "10.0.0.2"}});
  CHECK(found(proxies, with("X-Forwarded-For", {"203.0.113.7"})) == "203.0.113.7 forwarded");
  // Two proxies: the outer one appended the client, the inner one the outer one.
  CHECK(found(proxies, with("X-Forwarded-For", {"203.0.113.7, 10.0.0.1"}), inner_proxy) == "203.0.113.7 forwarded");
  // Several field lines are one list, in order (RFC 9110 section 5.3); empty elements are skipped.
  CHECK(found(proxies, with("X-Forwarded-For", {"198.51.100.1", " , 203.0.113.7 ,"})) == "203.0.113.7 forwarded");
  // Every address a trusted proxy's: the left-most (a proxy's own request).
  CHECK(found(proxies, with("X-Forwarded-For", {"10.0.0.2"})) == "10.0.0.2 forwarded");
  // Ports, brackets and spellings: the canonical address.
  CHECK(found(proxies, with("X-Forwarded-For", {"203.0.113.7:51234"})) == "203.0.113.7 forwarded");
  CHECK(found(proxies, with("X-Forwarded-For", {"[2001:DB8::1]:443"})) == "2001:db8::1 forwarded");
  CHECK(found(proxies, with("X-Forwarded-For", {"2001:db8:0:0::1"})) == "2001:db8::1 forwarded");
  CHECK(found(proxies, with("X-Forwarded-For", {"::ffff:203.0.113.7"})) == "203.0.113.7 forwarded");
  // A dual-stack socket's peer: the IPv4-mapped form of a trusted address is trusted.
  CHECK(found(proxies, with("X-Forwarded-For", {"203.0.113.7"}), boost::asio::ip::make_address("::ffff:10.0.0.1")) ==
        "203.0.113.7 forwarded");
  CHECK(proxies.malformed() == 0);
}

TEST_CASE("a forged X-Forwarded-For cannot choose the key", "[beast][trusted_proxies]") {
  trusted_proxies proxies({.addresses = {"10.0.0.1"}});
  // Through the proxy: whatever the client wrote is left of what the proxy appended.
  CHECK(found(proxies, with("X-Forwarded-For", {"198.51.100.1, 203.0.113.7"})) == "203.0.113.7 forwarded");
  // Posing as a trusted proxy's chain: the proxy's own append still ends the list.
  CHECK(found(proxies, with("X-Forwarded-For", {"198.51.100.1, 10.0.0.1, 203.0.113.7"})) == "203.0.113.7 forwarded");
  // Garbage left of the client's address is never examined.
  CHECK(found(proxies, with("X-Forwarded-For", {"not an address; DROP TABLE, 203.0.113.7"})) ==
        "203.0.113.7 forwarded");
  // Straight to the server: the peer is no trusted proxy, the field is not read.
  CHECK(found(proxies, with("X-Forwarded-For", {"198.51.100.1"}), stranger) == "192.0.2.99 peer");
  CHECK(proxies.malformed() == 0);
}

TEST_CASE("a trusted proxy's field that cannot be used: the peer, counted", "[beast][trusted_proxies]") {
  trusted_proxies proxies({.addresses = {"10.0.0.1"}});
  CHECK(found(proxies, with("X-Forwarded-For", {})) == "10.0.0.1 malformed");
  CHECK(found(proxies, with("X-Forwarded-For", {""})) == "10.0.0.1 malformed");
  CHECK(found(proxies, with("X-Forwarded-For", {"unknown"})) == "10.0.0.1 malformed");
  CHECK(found(proxies, with("X-Forwarded-For", {"203.0.113.7 198.51.100.1"})) == "10.0.0.1 malformed");
  CHECK(found(proxies, with("X-Forwarded-For", {"203.0.113.7:port"})) == "10.0.0.1 malformed");
  CHECK(found(proxies, with("X-Forwarded-For", {"[203.0.113.7]"})) == "10.0.0.1 malformed");
  CHECK(found(proxies, with("X-Forwarded-For", {"203.0.113.256"})) == "10.0.0.1 malformed");
  CHECK(proxies.malformed() == 7);
  CHECK(found(proxies, with("X-Forwarded-For", {"203.0.113.7"}), stranger) == "192.0.2.99 peer");  // not counted
  CHECK(proxies.malformed() == 7);
}

TEST_CASE("trusted by count: the client is the hops-th address from the right", "[beast][trusted_proxies]") {
  trusted_proxies one({.hops = 1});
  CHECK(found(one, with("X-Forwarded-For", {"198.51.100.1, 203.0.113.7"}), stranger) == "203.0.113.7 forwarded");
  trusted_proxies two({.hops = 2});
  CHECK(found(two, with("X-Forwarded-For", {"198.51.100.1, 203.0.113.7, 10.0.0.1"}), inner_proxy) ==
        "203.0.113.7 forwarded");
  CHECK(two.malformed() == 0);
  // Fewer addresses than proxies: the field does not reach past them.
  CHECK(found(two, with("X-Forwarded-For", {"203.0.113.7"}), inner_proxy) == "10.0.0.2 malformed");
  CHECK(found(two, with("X-Forwarded-For", {}), inner_proxy) == "10.0.0.2 malformed");
  CHECK(two.malformed() == 2);
}

TEST_CASE("RFC 7239 Forwarded: the for= of each proxy's element", "[beast][trusted_proxies]") {
  trusted_proxies proxies({.addresses = {"10.0.0.1", "10.0.0.2"}, .field = forwarded_field::forwarded});
  // The examples of RFC 7239 section 4 and 7.1.
  CHECK(found(proxies, with("Forwarded", {"for=192.0.2.60;proto=http;by=203.0.113.43"})) == "192.0.2.60 forwarded");
  CHECK(found(proxies, with("Forwarded", {"For=\"[2001:db8:cafe::17]:4711\""})) == "2001:db8:cafe::17 forwarded");
  CHECK(found(proxies, with("Forwarded", {"for=192.0.2.43, for=198.51.100.17"})) == "198.51.100.17 forwarded");
  CHECK(found(proxies, with("Forwarded", {"for=192.0.2.43", "for=198.51.100.17;by=10.0.0.1"})) ==
        "198.51.100.17 forwarded");
  // A quoted-string may hold a comma and a quoted-pair; a port may be obfuscated.
  CHECK(found(proxies, with("Forwarded", {"for=192.0.2.43;host=\"a,\\\"b\", for=\"198.51.100.17:_x1\""})) ==
        "198.51.100.17 forwarded");
  // Past the trusted proxies' elements.
  CHECK(found(proxies, with("Forwarded", {"for=198.51.100.1, for=203.0.113.7, for=10.0.0.1"}), inner_proxy) ==
        "203.0.113.7 forwarded");
  // X-Forwarded-For is the client's to forge when the proxies write Forwarded: never read.
  CHECK(found(proxies, with("X-Forwarded-For", {"203.0.113.7"})) == "10.0.0.1 malformed");
  CHECK(proxies.malformed() == 1);
}

TEST_CASE("RFC 7239 Forwarded that breaks the grammar or names no address: the peer, counted",
          "[beast][trusted_proxies]") {
  trusted_proxies proxies({.addresses = {"10.0.0.1"}, .field = forwarded_field::forwarded});
  CHECK(found(proxies, with("Forwarded", {"for=unknown"})) == "10.0.0.1 malformed");
  CHECK(found(proxies, with("Forwarded", {"for=_hidden"})) == "10.0.0.1 malformed");
  CHECK(found(proxies, with("Forwarded", {"proto=https"})) == "10.0.0.1 malformed");  // no for=
  CHECK(found(proxies, with("Forwarded", {"for=203.0.113.7;for=198.51.100.1"})) == "10.0.0.1 malformed");
  // A client's open quote swallows the proxy's element: the proxy's address, not one the client chose.
  CHECK(found(proxies, with("Forwarded", {"for=\"198.51.100.1, for=203.0.113.7"})) == "10.0.0.1 malformed");
  CHECK(found(proxies, with("Forwarded", {"for="})) == "10.0.0.1 malformed");
  CHECK(found(proxies, with("Forwarded", {"for 203.0.113.7"})) == "10.0.0.1 malformed");
  CHECK(found(proxies, with("Forwarded", {"for=203.0.113.7 x"})) == "10.0.0.1 malformed");
  CHECK(proxies.malformed() == 8);
  // A client's forged element left of the proxy's is not examined.
  CHECK(found(proxies, with("Forwarded", {"for=_forged;secret=1, for=203.0.113.7"})) == "203.0.113.7 forwarded");
  CHECK(proxies.malformed() == 8);
}

TEST_CASE("trusted_proxies options are checked, naming the type, the field and the value",
          "[beast][trusted_proxies]") {
  const auto message = [](rein::beast::trusted_proxies_options o) {
    try {
      trusted_proxies p(std::move(o));
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(message({.addresses = {"10.0.0.1", "proxy.internal"}}) ==
        "rein::beast::trusted_proxies: addresses[1] must be an IP address, got \"proxy.internal\"");
  CHECK(message({.addresses = {"10.0.0.1"}, .hops = 1}) ==
        "rein::beast::trusted_proxies: hops must be 0 when addresses are given, got 1");
  CHECK(message({.addresses = {"10.0.0.1", "2001:db8::2"}}) == "accepted");
}
