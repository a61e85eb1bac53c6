// Which client sent a request that came through proxies: the forwarded-for fields (X-Forwarded-For, or
// RFC 7239 Forwarded) read from the right, and believed only as far as the proxies the user trusts.
// Optional: needs Boost.Beast (part of Boost), so it is not part of the standalone-Asio build.
#pragma once

#include <rein/config.hpp>
#include <rein/detail/invalid_option.hpp>

#include <boost/asio/ip/address.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/system/error_code.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rein::beast {

/// Which field the trusted proxies write (and so the only one read: the other is the client's to forge).
enum class forwarded_field : std::uint8_t {
  /// X-Forwarded-For: a comma-separated list of addresses, each proxy appending the address it received
  /// the request from (the de facto form: nginx's $proxy_add_x_forwarded_for, HAProxy's `option forwardfor`).
  /// An element is an IPv4 or IPv6 address, optionally with a port (`192.0.2.7:8080`, `[2001:db8::1]:443`).
  x_forwarded_for,
  /// Forwarded (RFC 7239): a comma-separated list of elements, one per proxy, whose `for=` parameter
  /// names the node the proxy received the request from (section 5.2; IPv6 in brackets and quotes,
  /// section 6). Parameter names are case-insensitive; a value is a token or a quoted-string.
  forwarded,
};

/// Options of rein::beast::trusted_proxies. Name the proxies either by address or by count, not both;
/// with neither, no proxy is trusted and every request's client is its connection's peer.
struct trusted_proxies_options {
  /// The exact IP addresses of the proxies in front of the server (IPv4 or IPv6, as text: "10.0.0.1",
  /// "2001:db8::2"). A request whose peer is one of them is read from the field; its client is the
  /// right-most address in the field that is not one of them. Default: none.
  std::vector<std::string> addresses{};
  /// The number of proxies every request passes through before the server, >= 0: the peer is the
  /// nearest, and the client the address the farthest one appended, `hops`-th from the right of the
  /// field. Only when the server cannot be reached but through them (the peer is not checked). Default: 0.
  std::size_t hops = 0;
  /// The field the proxies write. Default: X-Forwarded-For.
  forwarded_field field = forwarded_field::x_forwarded_for;
};

/// Where rein::beast::trusted_proxies::client found a request's client.
enum class client_source : std::uint8_t {
  peer,       ///< the connection's peer, not a trusted proxy: the field was not read
  forwarded,  ///< the forwarded field, right of which every address was a trusted proxy's
  malformed,  ///< the peer is a trusted proxy but the field was missing, malformed, too short, or named no
              ///< address where the client's should be (`unknown`, an obfuscated node): the peer, counted
};

/// "peer", "forwarded", "malformed".
constexpr const char* to_string(client_source s) noexcept {
  switch (s) {
    case client_source::forwarded: return "forwarded";
    case client_source::malformed: return "malformed";
    case client_source::peer: break;
  }
  return "peer";
}

/// A request's client as rein::beast::trusted_proxies found it.
struct client_address {
  /// The client's address; IPv4-mapped IPv6 addresses (RFC 4291, as a dual-stack socket reports IPv4
  /// peers) are written as the IPv4 address they map.
  boost::asio::ip::address address{};
  /// Where it came from.
  client_source source = client_source::peer;

  /// The address as a key for rein::beast::basic_admission: its canonical text ("192.0.2.7",
  /// "2001:db8::1"), so that spellings of one address share a key.
  std::string key() const { return address.to_string(); }
};

/// Finds the client of a request that came through proxies the user trusts, for keying admission by client
/// address: the right-most address in the forwarded field that does not belong to a trusted proxy. A
/// client writes whatever it likes into the field before the first proxy, and each proxy appends the
/// address it received the request from; only what trusted proxies appended is believed, so a client that
/// sends its own X-Forwarded-For through a trusted proxy still gets the key of its own address. The field
/// is read only when the peer is a trusted proxy (by `addresses`), or always (by `hops`); otherwise the
/// peer is the client. The field's lines are read together, in order (RFC 9110 section 5.3); empty list
/// elements are skipped (section 5.6.1).
///
/// Bad input never throws: a field that is missing, malformed (an unterminated quoted-string, a parameter
/// twice in one element), too short for `hops`, or that names no address where the client's should be
/// (`unknown`, `_obfuscated`, text) gives the peer, and counts in malformed(). Elements left of the client's
/// are not examined: what the client wrote itself cannot change its answer, except a Forwarded field whose
/// syntax it broke (an open quote), which gives the proxy's address.
///
/// ```
/// rein::beast::trusted_proxies proxies(c.proxies);
/// const auto peer = stream.socket().remote_endpoint().address();
/// admitted = co_await admission.admit(request, proxies.client(request, peer).key());
/// ```
/// (From examples/ingress.cpp, whose `c.proxies` are `{.addresses = {...}}` from --trusted-proxy, or
/// `{.hops = H}` from --proxy-hops.)
///
/// @par Thread Safety
/// client() may be called concurrently (its one shared state is an atomic counter).
class trusted_proxies {
 public:
  /// @throws std::invalid_argument naming the type ("rein::beast::trusted_proxies"), the field and the
  ///         value, for an address that is not an IP address, or for both `addresses` and `hops` set.
  explicit trusted_proxies(trusted_proxies_options options = {}) : options_(std::move(options)) {
    constexpr std::string_view who = "rein::beast::trusted_proxies";
    if (!options_.addresses.empty() && options_.hops != 0)
      detail::throw_invalid(who, "hops must be 0 when addresses are given", detail::show(options_.hops));
    for (std::size_t i = 0; i < options_.addresses.size(); ++i) {
      boost::system::error_code ec;
      const auto a = boost::asio::ip::make_address(options_.addresses[i], ec);
      if (ec)
        detail::throw_invalid(who, "addresses[" + std::to_string(i) + "] must be an IP address",
                              '"' + options_.addresses[i] + '"');
      trusted_.push_back(unmapped(a));
    }
  }

  trusted_proxies(const trusted_proxies&) = delete;
  trusted_proxies& operator=(const trusted_proxies&) = delete;

  /// The options in force.
  const trusted_proxies_options& get_options() const noexcept { return options_; }

  /// The client of `request`, received from `peer` (the connection's remote address). Never throws for
  /// any request; see the class for the rule.
  template <class Fields>
  client_address client(const boost::beast::http::header<true, Fields>& request,
                        const boost::asio::ip::address& peer) {
    const auto from = unmapped(peer);
    if (!trusts_peer(from)) return {from, client_source::peer};
    if (auto found = forwarded_client(request)) return {*found, client_source::forwarded};
    malformed_.fetch_add(1, std::memory_order_relaxed);
    return {from, client_source::malformed};
  }

  /// Requests whose peer was a trusted proxy but whose field could not be used (client_source::malformed).
  std::uint64_t malformed() const noexcept { return malformed_.load(std::memory_order_relaxed); }

 private:
  using address = boost::asio::ip::address;

  static address unmapped(const address& a) {
    if (a.is_v6() && a.to_v6().is_v4_mapped())
      return boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, a.to_v6());
    return a;
  }

  bool trusts_peer(const address& peer) const {
    return options_.hops != 0 || is_trusted(peer);
  }

  bool is_trusted(const address& a) const { return std::find(trusted_.begin(), trusted_.end(), a) != trusted_.end(); }

  // The client's address from the field, or nullopt when the field cannot say.
  template <class Fields>
  std::optional<address> forwarded_client(const boost::beast::http::header<true, Fields>& request) const {
    const auto nodes = options_.field == forwarded_field::forwarded ? forwarded_nodes(request) : x_forwarded_nodes(request);
    if (!nodes || nodes->empty()) return std::nullopt;
    if (options_.hops != 0) {
      if (nodes->size() < options_.hops) return std::nullopt;
      return node_address((*nodes)[nodes->size() - options_.hops]);
    }
    // Right to left past the trusted proxies; if all are trusted, the left-most (a proxy's own request).
    std::optional<address> a;
    for (auto it = nodes->rbegin(); it != nodes->rend(); ++it) {
      a = node_address(*it);
      if (!a) return std::nullopt;
      if (!is_trusted(*a)) return a;
    }
    return a;
  }

  static bool is_ows(char c) { return c == ' ' || c == '\t'; }

  static std::string_view trimmed(std::string_view s) {
    while (!s.empty() && is_ows(s.front())) s.remove_prefix(1);
    while (!s.empty() && is_ows(s.back())) s.remove_suffix(1);
    return s;
  }

  // The values of every line of the field `name` (a name or a boost::beast::http::field), in order.
  template <class Fields, class Name>
  static std::vector<std::string_view> lines(const boost::beast::http::header<true, Fields>& h, Name name) {
    std::vector<std::string_view> values;
    for (auto [it, end] = h.equal_range(name); it != end; ++it)
      values.emplace_back(it->value().data(), it->value().size());
    return values;
  }

  // X-Forwarded-For's elements, every line's in order.
  template <class Fields>
  static std::optional<std::vector<std::string>> x_forwarded_nodes(const boost::beast::http::header<true, Fields>& h) {
    std::vector<std::string> nodes;
    for (std::string_view rest : lines(h, "X-Forwarded-For")) {
      for (;;) {
        const auto comma = rest.find(',');
        const auto element = trimmed(rest.substr(0, comma));
        if (!element.empty()) nodes.emplace_back(element);
        if (comma == std::string_view::npos) break;
        rest.remove_prefix(comma + 1);
      }
    }
    return nodes;
  }

  // RFC 7230 tchar, the characters of a token (RFC 7239's parameter names and unquoted values).
  static bool is_tchar(char c) {
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return true;
    return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
  }

  static bool is_for(std::string_view name) {
    return name.size() == 3 && (name[0] | 0x20) == 'f' && (name[1] | 0x20) == 'o' && (name[2] | 0x20) == 'r';
  }

  // Forwarded's elements' `for=` values, every line's in order (an element without one: ""); nullopt when
  // a line breaks RFC 7239's grammar.
  template <class Fields>
  static std::optional<std::vector<std::string>> forwarded_nodes(const boost::beast::http::header<true, Fields>& h) {
    std::vector<std::string> nodes;
    for (std::string_view line : lines(h, boost::beast::http::field::forwarded))
      if (!parse_forwarded_line(line, nodes)) return std::nullopt;
    return nodes;
  }

  // forwarded-element *( OWS "," OWS forwarded-element ), each element pairs separated by ";".
  static bool parse_forwarded_line(std::string_view s, std::vector<std::string>& nodes) {
    std::size_t i = 0;
    std::optional<std::string> node;  // this element's for=, once seen
    bool element_has_pair = false;
    const auto end_element = [&] {
      if (element_has_pair) nodes.push_back(node.value_or(std::string()));
      node.reset();
      element_has_pair = false;
    };
    while (i < s.size()) {
      while (i < s.size() && is_ows(s[i])) ++i;
      if (i == s.size()) break;
      if (s[i] == ',') {
        end_element();
        ++i;
        continue;
      }
      if (s[i] == ';') {
        ++i;
        continue;
      }
      const std::size_t name_start = i;
      while (i < s.size() && is_tchar(s[i])) ++i;
      const std::string_view name = s.substr(name_start, i - name_start);
      if (name.empty() || i == s.size() || s[i] != '=') return false;
      ++i;
      std::string value;
      if (i < s.size() && s[i] == '"') {
        ++i;
        for (;;) {
          if (i == s.size()) return false;  // an unterminated quoted-string
          const char c = s[i++];
          if (c == '"') break;
          if (c == '\\') {
            if (i == s.size()) return false;
            value += s[i++];
          } else {
            value += c;
          }
        }
      } else {
        const std::size_t value_start = i;
        while (i < s.size() && is_tchar(s[i])) ++i;
        value = std::string(s.substr(value_start, i - value_start));
        if (value.empty()) return false;
      }
      while (i < s.size() && is_ows(s[i])) ++i;
      if (i < s.size() && s[i] != ';' && s[i] != ',') return false;
      element_has_pair = true;
      if (is_for(name)) {
        if (node) return false;  // RFC 7239 section 4: a parameter at most once per element
        node = std::move(value);
      }
    }
    end_element();
    return true;
  }

  static bool is_port(std::string_view p) {
    if (p.empty()) return false;
    if (p.front() == '_')  // RFC 7239 section 6.3's obfuscated port: "_" 1*(ALPHA / DIGIT / "." / "_" / "-")
      return p.size() > 1 && std::all_of(p.begin() + 1, p.end(), [](char c) {
               return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '.' ||
                      c == '_' || c == '-';
             });
    return p.size() <= 5 && std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; });
  }

  // A node's address: `a.b.c.d`, `a.b.c.d:port`, `[v6]`, `[v6]:port`, or a bare IPv6 address (as some
  // X-Forwarded-For writers put it); nullopt for anything else (`unknown`, `_obfuscated`, text).
  static std::optional<address> node_address(std::string_view node) {
    if (!node.empty() && node.front() == '[') {
      const auto close = node.find(']');
      if (close == std::string_view::npos) return std::nullopt;
      const auto after = node.substr(close + 1);
      if (!after.empty() && (after.front() != ':' || !is_port(after.substr(1)))) return std::nullopt;
      return parsed(node.substr(1, close - 1), family::v6);
    }
    if (std::count(node.begin(), node.end(), ':') == 1) {
      const auto colon = node.find(':');
      if (!is_port(node.substr(colon + 1))) return std::nullopt;
      return parsed(node.substr(0, colon), family::v4);
    }
    return parsed(node, family::any);
  }

  enum class family : std::uint8_t { any, v4, v6 };

  static std::optional<address> parsed(std::string_view text, family f) {
    boost::system::error_code ec;
    const auto a = boost::asio::ip::make_address(std::string(text), ec);
    if (ec || (f == family::v4 && !a.is_v4()) || (f == family::v6 && !a.is_v6())) return std::nullopt;
    return unmapped(a);
  }

  trusted_proxies_options options_;
  std::vector<address> trusted_;
  std::atomic<std::uint64_t> malformed_{0};
};

}  // namespace rein::beast
