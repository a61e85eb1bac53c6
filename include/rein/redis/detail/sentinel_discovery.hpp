// Finding a Redis master through Redis Sentinel, as a step machine without I/O: which sentinel to ask,
// which candidate to check with ROLE, and when the search is over. The I/O half is in rein/redis/sentinel.hpp.
// Not API.
#pragma once

#include <rein/redis/cluster.hpp>

#include <hiredis/hiredis.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rein::redis::detail {

/// Reads the answer to `SENTINEL GET-MASTER-ADDR-BY-NAME <name>`: an array of two bulk strings, host and
/// port. Nothing for a null reply (the sentinel does not know the name), an error reply, or anything
/// malformed (an empty host, a port outside [1, 65535]).
inline std::optional<endpoint> parse_master_address(const ::redisReply& r) {
  if (r.type != REDIS_REPLY_ARRAY || r.elements != 2) return std::nullopt;
  const ::redisReply& host = *r.element[0];
  const ::redisReply& port = *r.element[1];
  if (host.type != REDIS_REPLY_STRING || host.len == 0 || port.type != REDIS_REPLY_STRING) return std::nullopt;
  const auto number = parse_number<std::uint16_t>(std::string_view(port.str, port.len));
  if (!number || *number == 0) return std::nullopt;
  return endpoint{std::string(host.str, host.len), *number};
}

/// Whether an answer to ROLE says "master" (its first element); a replica's, a sentinel's or an error
/// reply says no.
inline bool reads_as_master(const ::redisReply& r) {
  if (r.type != REDIS_REPLY_ARRAY || r.elements == 0) return false;
  const ::redisReply& role = *r.element[0];
  return role.type == REDIS_REPLY_STRING && std::string_view(role.str, role.len) == "master";
}

/// What the I/O half does next.
struct discovery_step {
  enum class kind : std::uint8_t {
    ask_sentinel,  ///< send GET-MASTER-ADDR-BY-NAME to sentinel `sentinel`; answer with on_master_address
    check_role,    ///< connect to `address`, send ROLE; answer with on_role
    found,         ///< `address` is the master, as `sentinel` said and ROLE confirmed: connect to it
    failed,        ///< every sentinel was asked and none named a master that ROLE confirmed
  };
  kind what = kind::failed;
  std::size_t sentinel = 0;  ///< index in the options' list of sentinels
  endpoint address{};
};

/// One search for the master, following the Redis clients' Sentinel guidelines: ask the sentinels in
/// order; a sentinel that does not answer, answers null or answers nonsense is passed over; an address is
/// used only once ROLE on it says master. One change to the guidelines: when ROLE says no (or the
/// candidate cannot be reached) the search goes on with the next sentinel rather than starting over, and
/// a candidate that failed is not checked twice in one search. A sentinel that has not yet heard of a
/// failover names the dead master until the winner's hello message reaches it (up to two seconds), while
/// another sentinel already names the new one.
///
/// Invariant: at most one question is out at a time; each step is answered by exactly one call.
class sentinel_discovery {
 public:
  /// A search asking the sentinels in `order` (indices into the options' list).
  explicit sentinel_discovery(std::vector<std::size_t> order) : order_(std::move(order)) {}

  /// The first step.
  discovery_step start() { return ask(0); }

  /// The answer of the sentinel asked last: the address it named, or nothing (no answer, null, error).
  discovery_step on_master_address(std::optional<endpoint> address) {
    if (!address || tried(*address)) return ask(position_ + 1);
    candidate_ = std::move(*address);
    return {discovery_step::kind::check_role, order_[position_], candidate_};
  }

  /// The answer of ROLE on the candidate: true if it says master; false if it says anything else, or
  /// could not be asked.
  discovery_step on_role(bool master) {
    if (master) return {discovery_step::kind::found, order_[position_], candidate_};
    failed_.push_back(candidate_);
    return ask(position_ + 1);
  }

 private:
  discovery_step ask(std::size_t position) {
    position_ = position;
    if (position_ >= order_.size()) return {discovery_step::kind::failed, 0, {}};
    return {discovery_step::kind::ask_sentinel, order_[position_], {}};
  }

  bool tried(const endpoint& e) const {
    return std::any_of(failed_.begin(), failed_.end(), [&](const endpoint& f) { return f.host == e.host && f.port == e.port; });
  }

  std::vector<std::size_t> order_;
  std::size_t position_ = 0;
  endpoint candidate_{};
  std::vector<endpoint> failed_;  // candidates ROLE refused in this search
};

/// The order in which sentinels are asked: the one that answered last goes first (the guidelines' "put the
/// sentinel that replied at the head of the list"), the others keep their relative order.
inline void put_first(std::vector<std::size_t>& order, std::size_t sentinel) {
  const auto at = std::find(order.begin(), order.end(), sentinel);
  if (at != order.end()) std::rotate(order.begin(), at, at + 1);
}

}  // namespace rein::redis::detail
