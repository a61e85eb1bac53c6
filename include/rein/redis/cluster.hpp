// A Redis Cluster client: one pipelined connection per node, commands routed by their key's hash slot,
// MOVED and ASK redirections followed, the slot map refreshed when it proves stale.
#pragma once

#include <rein/config.hpp>
#include <rein/detail/asio_header.hpp>
#include <rein/error.hpp>
#include <rein/redis/connection.hpp>
#include <rein/redis/detail/hash_tag.hpp>
#include <rein/redis/error.hpp>
#include <rein/redis/reply.hpp>

#include <hiredis/hiredis.h>

#include REIN_ASIO_HEADER(any_io_executor.hpp)
#include REIN_ASIO_HEADER(async_result.hpp)
#include REIN_ASIO_HEADER(error.hpp)
#include REIN_ASIO_HEADER(execution_context.hpp)

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace rein::redis {

/// A Redis server's address.
struct endpoint {
  std::string host = "127.0.0.1";  ///< name or address
  std::uint16_t port = 6379;       ///< TCP port
};

/// How to reach a Redis Cluster. Write with designated initializers:
/// `{.seeds = {{"10.0.0.7", 7000}, {"10.0.0.8", 7000}}}`.
struct cluster_options {
  /// Nodes asked for the slot map (CLUSTER SLOTS) before any other is known, and whenever every other known
  /// node is down. At least one; any node of the cluster, master or replica, will do. Name several, so
  /// that a client started while one of them is down still finds the cluster.
  std::vector<endpoint> seeds{};
  /// The options of every node's connection: credentials, timeouts, reconnection backoff (see
  /// connection_options). `host` and `port` are ignored (they come from the seeds and the slot map), and
  /// `database` must be 0: a cluster has only database 0. With `tls.enabled` every node connection uses
  /// TLS with these settings (nodes must announce their TLS ports: Redis's `tls-cluster yes`); with
  /// `tls.server_name` empty each node's certificate is checked against the address the slot map gives
  /// for it (usually an IP address), otherwise against that one name for every node.
  connection_options connection{};
  /// The least time between two slot map refreshes. A refresh is asked when a reply says MOVED, when a
  /// node fails, and when a limiter finds the node of its slot down. Must be > 0.
  std::chrono::milliseconds refresh_interval{100};
  /// How many MOVED or ASK redirections one command may follow; one more fails it with errc::unavailable.
  /// Must be >= 1.
  std::size_t max_redirects = 5;
};

/// A cluster client's counters, copied under its lock.
struct cluster_snapshot {
  std::size_t nodes = 0;  ///< nodes known: the seeds and every node the slot map or a redirection named, ever
  std::size_t connections = 0;      ///< connections kept: to the seeds and the masters of the last map
  std::size_t connected_nodes = 0;  ///< of those, connected now
  std::size_t slots_covered = 0;    ///< hash slots whose master is known (16384 once a full map arrived)
  std::uint64_t refreshes = 0;      ///< slot maps received and applied
  std::uint64_t failed_refreshes = 0;  ///< refreshes that got no usable map (node down, error reply)
  std::uint64_t moved = 0;             ///< MOVED redirections followed
  std::uint64_t asked = 0;             ///< ASK redirections followed
  /// Redirections not followed (more than max_redirects in a row, the target's connection refusing it):
  /// their commands failed with errc::unavailable. (A MOVED or ASK whose address cannot be read reaches the
  /// caller as the error reply it is.)
  std::uint64_t failed_redirects = 0;
};

/// Redis Cluster's number of hash slots.
inline constexpr unsigned cluster_slot_count = 16384;

namespace detail {

/// CRC16-CCITT in its XMODEM form (polynomial 0x1021, initial value 0): the hash of Redis Cluster's slots.
constexpr std::uint16_t crc16_xmodem(std::string_view data) noexcept {
  unsigned crc = 0;
  for (const char c : data) {
    crc ^= static_cast<unsigned>(static_cast<unsigned char>(c)) << 8;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 0x8000U) != 0 ? ((crc << 1) ^ 0x1021U) : (crc << 1);
  }
  return static_cast<std::uint16_t>(crc & 0xFFFFU);
}

}  // namespace detail

/// The hash slot of `key`, as Redis Cluster computes it: CRC16 of the key's hash tag (what lies between
/// its first '{' and the next '}', if that is not empty), or else of the whole key, modulo 16384. Keys with
/// the same tag share a slot, so one script can touch them all.
constexpr unsigned key_slot(std::string_view key) noexcept {
  const std::string_view tag = detail::hash_tag(key);
  return detail::crc16_xmodem(tag.empty() ? key : tag) % cluster_slot_count;
}

namespace detail {

/// A MOVED or ASK error reply: which slot, and the node that serves it (an empty host means the host of
/// the node that answered).
struct redirection {
  bool ask = false;
  unsigned slot = 0;
  std::string host;
  std::uint16_t port = 0;
};

template <class Number>
std::optional<Number> parse_number(std::string_view text) {
  Number value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

/// Reads "MOVED <slot> <host>:<port>" or "ASK <slot> <host>:<port>"; nothing for any other text.
inline std::optional<redirection> parse_redirection(std::string_view text) {
  redirection r;
  if (text.starts_with("MOVED ")) {
    text.remove_prefix(6);
  } else if (text.starts_with("ASK ")) {
    r.ask = true;
    text.remove_prefix(4);
  } else {
    return std::nullopt;
  }
  const auto space = text.find(' ');
  const auto colon = text.rfind(':');
  if (space == std::string_view::npos || colon == std::string_view::npos || colon < space) return std::nullopt;
  const auto slot = parse_number<unsigned>(text.substr(0, space));
  const auto port = parse_number<std::uint16_t>(text.substr(colon + 1));
  if (!slot || *slot >= cluster_slot_count || !port || *port == 0) return std::nullopt;
  r.slot = *slot;
  r.port = *port;
  r.host.assign(text.substr(space + 1, colon - space - 1));
  return r;
}

/// One range of CLUSTER SLOTS's answer: slots [first, last] and their master.
struct slot_range {
  unsigned first = 0;
  unsigned last = 0;
  std::string host;  // empty: the host of the node asked
  std::uint16_t port = 0;
};

/// Reads CLUSTER SLOTS's answer (Redis 3 to 7): an array of [first, last, [host, port, id, ...], replicas...].
/// Nothing if any element is malformed (a map half-read could send a slot's commands to the wrong node).
inline std::optional<std::vector<slot_range>> parse_cluster_slots(const ::redisReply& r) {
  if (r.type != REDIS_REPLY_ARRAY) return std::nullopt;
  std::vector<slot_range> out;
  out.reserve(r.elements);
  for (std::size_t i = 0; i < r.elements; ++i) {
    const ::redisReply& e = *r.element[i];
    if (e.type != REDIS_REPLY_ARRAY || e.elements < 3) return std::nullopt;
    const ::redisReply& first = *e.element[0];
    const ::redisReply& last = *e.element[1];
    const ::redisReply& master = *e.element[2];
    const int endpoint = master.type == REDIS_REPLY_ARRAY && master.elements >= 2 ? master.element[0]->type : -1;
    if (first.type != REDIS_REPLY_INTEGER || last.type != REDIS_REPLY_INTEGER ||
        (endpoint != REDIS_REPLY_STRING && endpoint != REDIS_REPLY_NIL) || master.element[1]->type != REDIS_REPLY_INTEGER)
      return std::nullopt;
    const long long port = master.element[1]->integer;
    if (first.integer < 0 || last.integer < first.integer || last.integer >= cluster_slot_count || port <= 0 ||
        port > 65535)
      return std::nullopt;
    // Redis 7's endpoints: nil or "" (cluster-preferred-endpoint-type unknown-endpoint) mean the node asked;
    // "?" means not known at all: the range stays unmapped, and a MOVED will say.
    std::string host = endpoint == REDIS_REPLY_NIL ? std::string() : std::string(master.element[0]->str, master.element[0]->len);
    if (host == "?") continue;
    out.push_back({static_cast<unsigned>(first.integer), static_cast<unsigned>(last.integer), std::move(host),
                   static_cast<std::uint16_t>(port)});
  }
  return out;
}

inline cluster_options validated(cluster_options o) {
  const auto fail = [](const std::string& what) { throw std::invalid_argument("rein::redis::cluster: " + what); };
  if (o.seeds.empty()) fail("seeds must name at least one node");
  for (const endpoint& e : o.seeds) {
    if (e.host.empty()) fail("seeds: a host must not be empty");
    if (e.port == 0) fail("seeds: port must be in [1, 65535], got 0 (host " + e.host + ")");
  }
  if (o.connection.database != 0)
    fail("connection.database must be 0 (a cluster has only database 0), got " + std::to_string(o.connection.database));
  if (o.refresh_interval.count() <= 0)
    fail("refresh_interval must be > 0, got " + std::to_string(o.refresh_interval.count()) + "ms");
  if (o.max_redirects == 0) fail("max_redirects must be >= 1, got 0");
  connection_options probe = o.connection;  // the timeouts and backoff, checked once with a seed's address
  probe.host = o.seeds.front().host;
  probe.port = o.seeds.front().port;
  probe = validated(std::move(probe));
#if defined(REIN_REDIS_TLS)
  // Node connections are made when first needed: their TLS files are checked now, once.
  if (probe.tls.enabled) (void)make_tls_context(probe.tls);
#endif
  return o;
}

// A node that only frees itself: the reply to ASKING.
class discard_node final : public request_node {
 public:
  void complete(const error_code&, const ::redisReply*) noexcept override { delete this; }
};

template <class Executor>
class cluster_core;

// A command sent to a cluster node on behalf of `inner`: a MOVED or ASK reply sends it again to the node
// named (MOVED and ASK come before a command runs, so sending it again runs it once); any other reply, or
// a failure, completes `inner`.
template <class Executor>
class redirect_node final : public request_node {
 public:
  redirect_node(std::shared_ptr<cluster_core<Executor>> owner, std::string command, request_node* inner,
                std::string host, std::size_t hops) noexcept
      : cluster_(std::move(owner)), command_(std::move(command)), inner_(inner), host_(std::move(host)), hops_(hops) {}

  std::string_view command() const noexcept { return command_; }

  void complete(const error_code& ec, const ::redisReply* reply) noexcept override {
    const std::shared_ptr<cluster_core<Executor>> cluster = std::move(cluster_);
    request_node* const inner = inner_;
    if (!ec && reply != nullptr && reply->type == REDIS_REPLY_ERROR) {
      const std::string_view text(reply->str, reply->len);
      std::optional<redirection> to;
      try {
        to = parse_redirection(text);
        if (to && to->host.empty()) to->host = host_;
      } catch (...) {  // no memory for the address: fail the command below as unavailable
        delete this;
        return inner->complete(errc::unavailable, nullptr);
      }
      if (to) {
        std::string command = std::move(command_);
        const std::size_t hops = hops_ + 1;
        delete this;
        return cluster->follow(std::move(*to), std::move(command), inner, hops);
      }
      if (text.starts_with("CLUSTERDOWN")) cluster->request_refresh();
    }
    if (ec && ec != net::error::operation_aborted) cluster->request_refresh();  // the node failed: did it move?
    // A node dropped from the map closes its connection: to the caller, that is a node gone, not a close.
    const error_code outcome = ec == net::error::operation_aborted && !cluster->closed() ? error_code(errc::unavailable) : ec;
    delete this;
    inner->complete(outcome, reply);
  }

 private:
  std::shared_ptr<cluster_core<Executor>> cluster_;
  std::string command_;
  request_node* inner_;
  std::string host_;  // of the node the command went to: an empty host in a redirection means this one
  std::size_t hops_;
};

// CLUSTER SLOTS on its way: hands the answer to the cluster.
template <class Executor>
class slots_node final : public request_node {
 public:
  slots_node(std::weak_ptr<cluster_core<Executor>> owner, std::string host) noexcept
      : cluster_(std::move(owner)), host_(std::move(host)) {}

  void complete(const error_code& ec, const ::redisReply* reply) noexcept override {
    const std::shared_ptr<cluster_core<Executor>> cluster = cluster_.lock();
    if (cluster) cluster->on_slots(host_, ec, reply);
    delete this;
  }

 private:
  std::weak_ptr<cluster_core<Executor>> cluster_;
  std::string host_;
};

// The commands of one hash slot: what a limiter on a cluster talks to.
template <class Executor>
class cluster_route final : public command_link {
 public:
  cluster_route(std::shared_ptr<cluster_core<Executor>> owner, unsigned slot) noexcept
      : cluster_(std::move(owner)), slot_(slot) {}

  bool submit(std::string_view command, request_node* node) override { return cluster_->submit(slot_, command, node); }
  void add_startup_command(std::string command) override { cluster_->add_startup_command(std::move(command)); }
  bool connected() noexcept override { return cluster_->connected(slot_); }
  connection_snapshot snapshot() const override { return cluster_->snapshot(slot_); }

 private:
  std::shared_ptr<cluster_core<Executor>> cluster_;
  unsigned slot_;
};

// The cluster's machinery, shared by the public object, the limiters' routes and the commands in flight.
//
// State under `mutex_`: the known nodes (never removed, so indices stay valid; a node's connection is made
// when first needed), the slot table (an index into nodes_ per slot, or `none`), the startup commands every
// connection gets, and the refresh's bookkeeping. Connections are used outside the lock: lock order is
// (a limiter's line) -> cluster -> connection, and nothing here calls back into a line under the lock.
//
// Routing: a slot with a known master goes there; an unknown one (before the first map) to the known
// nodes in turn, whose MOVED says where it lives. Failover: a failed command, a MOVED, CLUSTERDOWN, or a
// limiter asking whether its node is up while it is not, asks for a refresh; refreshes ask a connected
// node first, at most one at a time and one per refresh_interval.
template <class Executor>
class cluster_core final : public std::enable_shared_from_this<cluster_core<Executor>> {
 public:
  using executor_type = Executor;
  using connection_type = connection_core<Executor>;
  using clock = std::chrono::steady_clock;

  cluster_core(const Executor& ex, cluster_options options)
      : executor_(ex), options_(validated(std::move(options))), slots_(cluster_slot_count, none) {
    for (const endpoint& seed : options_.seeds) nodes_[node_index_locked(seed.host, seed.port)].seed = true;
  }

  cluster_core(const cluster_core&) = delete;
  cluster_core& operator=(const cluster_core&) = delete;

  const Executor& get_executor() const noexcept { return executor_; }
  const cluster_options& get_options() const noexcept { return options_; }

  /// The link of the slot that holds `key`.
  std::shared_ptr<command_link> route(std::string_view key) {
    return std::make_shared<cluster_route<Executor>>(this->shared_from_this(), key_slot(key));
  }

  /// Sends `command` to the master of `slot` and follows redirections; `node` gets the final reply. False,
  /// leaving `node` untouched, if the node's connection refuses it (down or closed).
  bool submit(unsigned slot, std::string_view command, request_node* node) {
    std::shared_ptr<connection_type> target;
    std::string host;
    bool unmapped = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closed_) return false;
      const std::size_t i = owner_locked(slot);
      target = connection_locked(i);
      host = nodes_[i].host;
      unmapped = stats_.refreshes == 0;
    }
    if (unmapped) request_refresh();
    auto r = std::make_unique<redirect_node<Executor>>(this->shared_from_this(), std::string(command), node, std::move(host), 0);
    if (!target->submit(r->command(), r.get())) {
      request_refresh();
      return false;
    }
    r.release();  // the connection completes it
    return true;
  }

  /// Whether the master of `slot` is connected. If not, starts connecting to it and asks for a refresh, so
  /// that a failover is noticed by whoever keeps asking.
  bool connected(unsigned slot) noexcept {
    try {
      std::shared_ptr<connection_type> owner;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (closed_) return false;
        owner = connection_locked(owner_locked(slot));  // an unmapped slot: the node submit would pick
      }
      if (owner && owner->connected()) return true;
      if (owner) owner->connect();
      request_refresh();
    } catch (...) {  // no memory for a connection or a request: down, for now
    }
    return false;
  }

  /// The counters of the connection to the master of `slot` (empty if none is known yet).
  connection_snapshot snapshot(unsigned slot) const {
    std::shared_ptr<connection_type> owner;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (slots_[slot] != none) owner = nodes_[slots_[slot]].link;
    }
    return owner ? owner->snapshot() : connection_snapshot{};
  }

  /// A command sent first on every node's connection, present and future.
  void add_startup_command(std::string command) {
    std::vector<std::shared_ptr<connection_type>> links;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (std::find(startup_.begin(), startup_.end(), command) != startup_.end()) return;
      startup_.push_back(command);
      links = links_locked();
    }
    for (const auto& link : links) link->add_startup_command(command);
  }

  bool closed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return closed_;
  }

  /// Closes every node's connection for good. Idempotent.
  void close() {
    std::vector<std::shared_ptr<connection_type>> links;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
      links = links_locked();
    }
    for (const auto& link : links) link->close();
  }

  cluster_snapshot snapshot() const {
    std::vector<std::shared_ptr<connection_type>> links;
    cluster_snapshot s;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      s = stats_;
      s.nodes = nodes_.size();
      s.slots_covered = static_cast<std::size_t>(std::count_if(slots_.begin(), slots_.end(), [](std::uint16_t i) { return i != none; }));
      links = links_locked();
    }
    s.connections = links.size();
    for (const auto& link : links) s.connected_nodes += link->connected() ? 1 : 0;
    return s;
  }

  /// Asks a node for the slot map, unless a refresh is on its way or the last one was less than
  /// refresh_interval ago. Never throws: a refresh that cannot be asked now is asked by a later trigger.
  void request_refresh() noexcept {
    try {
      std::vector<std::pair<std::shared_ptr<connection_type>, std::string>> candidates;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (closed_ || refreshing_ || clock::now() < next_refresh_) return;
        refreshing_ = true;
        candidates = candidates_locked();
      }
      static const std::string ask = encode_command({"CLUSTER", "SLOTS"});
      for (auto& [link, host] : candidates) {
        auto asking = std::make_unique<slots_node<Executor>>(this->weak_from_this(), host);
        if (!link->submit(ask, asking.get())) continue;
        asking.release();
        return;
      }
    } catch (...) {
    }
    refresh_done(false);
  }

  // ---- For the nodes in flight ----------------------------------------------------------------------------

  // Sends a redirected command on (completing `inner` with errc::unavailable if it cannot be).
  void follow(redirection to, std::string command, request_node* inner, std::size_t hops) noexcept {
    try {
      if (follow_or_refuse(std::move(to), std::move(command), inner, hops)) return;
    } catch (...) {  // no memory for the node or the connection
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.failed_redirects;
    }
    inner->complete(errc::unavailable, nullptr);
  }

  void on_slots(const std::string& asked, const error_code& ec, const ::redisReply* reply) noexcept {
    std::vector<std::shared_ptr<connection_type>> masters;
    std::vector<std::shared_ptr<connection_type>> departed;
    bool applied = false;
    try {
      std::optional<std::vector<slot_range>> ranges;
      if (!ec && reply != nullptr) ranges = parse_cluster_slots(*reply);
      if (ranges && !ranges->empty()) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!closed_) {
          apply_locked(asked, *ranges, masters, departed);
          applied = true;
        }
      }
    } catch (...) {  // no memory for the map: keep the old one
    }
    refresh_done(applied);
    for (const auto& link : masters) link->connect();  // a new master is ready before the limiters ask
    for (const auto& link : departed) link->close();
  }

 private:
  static constexpr std::uint16_t none = 0xFFFF;

  struct member {
    std::string host;
    std::uint16_t port;
    std::shared_ptr<connection_type> link;  // made when first needed
    bool seed = false;
    bool wanted = true;  // a seed, in the last map, or named by a redirection since
  };

  bool follow_or_refuse(redirection to, std::string command, request_node* inner, std::size_t hops) {
    if (hops > options_.max_redirects) return false;
    std::shared_ptr<connection_type> target;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closed_) return false;
      const std::size_t i = node_index_locked(to.host, to.port);
      target = connection_locked(i);
      if (to.ask) {
        ++stats_.asked;
      } else {
        slots_[to.slot] = static_cast<std::uint16_t>(i);  // the rest of the map is refreshed below
        ++stats_.moved;
      }
    }
    if (!to.ask) request_refresh();
    // Until the connection takes them, the nodes are ours (`inner` stays the caller's to complete).
    auto r = std::make_unique<redirect_node<Executor>>(this->shared_from_this(), std::move(command), inner, to.host, hops);
    if (!to.ask) {
      if (!target->submit(r->command(), r.get())) return false;
    } else {
      // ASKING lets the importing node run the next command of this connection on a slot it does not own yet.
      static const std::string asking = encode_command({"ASKING"});
      auto first = std::make_unique<discard_node>();
      if (!target->submit_pair(asking, first.get(), r->command(), r.get())) return false;
      (void)first.release();  // the connection owns it now
    }
    r.release();
    return true;
  }

  void refresh_done(bool applied) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    refreshing_ = false;
    next_refresh_ = clock::now() + options_.refresh_interval;
    if (applied) ++stats_.refreshes;
    else ++stats_.failed_refreshes;
  }

  // Takes the new map. A node that is neither in it nor a seed is forgotten (its connection closed, to be
  // made again if it comes back): a departed master would otherwise be reconnected to forever.
  void apply_locked(const std::string& asked, const std::vector<slot_range>& ranges,
                    std::vector<std::shared_ptr<connection_type>>& masters,
                    std::vector<std::shared_ptr<connection_type>>& departed) {
    std::vector<std::uint16_t> table(cluster_slot_count, none);
    for (member& n : nodes_) n.wanted = n.seed;
    for (const slot_range& r : ranges) {
      const std::size_t i = node_index_locked(r.host.empty() ? asked : r.host, r.port);
      std::fill(table.begin() + r.first, table.begin() + r.last + 1, static_cast<std::uint16_t>(i));
      nodes_[i].wanted = true;
      masters.push_back(connection_locked(i));
    }
    slots_.swap(table);
    for (member& n : nodes_)
      if (!n.wanted && n.link) departed.push_back(std::move(n.link));
  }

  // The node at host:port, added if new.
  std::size_t node_index_locked(const std::string& host, std::uint16_t port) {
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i].port == port && nodes_[i].host == host) {
        nodes_[i].wanted = true;
        return i;
      }
    }
    if (nodes_.size() >= none) throw std::length_error("rein::redis::cluster: too many nodes");
    nodes_.push_back({host, port, nullptr});
    return nodes_.size() - 1;
  }

  const std::shared_ptr<connection_type>& connection_locked(std::size_t i) {
    member& n = nodes_[i];
    if (!n.link) {
      connection_options o = options_.connection;
      o.host = n.host;
      o.port = n.port;
      n.link = std::make_shared<connection_type>(executor_, std::move(o));
      for (const std::string& command : startup_) n.link->add_startup_command(command);
    }
    return n.link;
  }

  // The node for a slot: its master, or for a slot not in the map (no map yet, or a server without
  // cluster support) a connected node, else the known nodes in turn; a node's MOVED will say where it lives.
  std::size_t owner_locked(unsigned slot) {
    if (slots_[slot] != none) return slots_[slot];
    const std::size_t start = rotation_++;
    std::optional<std::size_t> fallback;
    for (std::size_t k = 0; k < nodes_.size(); ++k) {
      const std::size_t i = (start + k) % nodes_.size();
      if (!nodes_[i].wanted) continue;
      if (nodes_[i].link && nodes_[i].link->connected()) return i;
      if (!fallback) fallback = i;
    }
    return fallback.value_or(start % nodes_.size());
  }

  std::vector<std::shared_ptr<connection_type>> links_locked() const {
    std::vector<std::shared_ptr<connection_type>> out;
    for (const member& n : nodes_)
      if (n.link) out.push_back(n.link);
    return out;
  }

  // Whom to ask for the map: connected nodes first (they answer at once), then the others in turn.
  std::vector<std::pair<std::shared_ptr<connection_type>, std::string>> candidates_locked() {
    std::vector<std::pair<std::shared_ptr<connection_type>, std::string>> up;
    std::vector<std::pair<std::shared_ptr<connection_type>, std::string>> rest;
    const std::size_t start = rotation_++;
    for (std::size_t k = 0; k < nodes_.size(); ++k) {
      const std::size_t i = (start + k) % nodes_.size();
      if (!nodes_[i].wanted) continue;
      const auto& link = connection_locked(i);
      (link->connected() ? up : rest).emplace_back(link, nodes_[i].host);
    }
    up.insert(up.end(), rest.begin(), rest.end());
    return up;
  }

  const Executor executor_;
  const cluster_options options_;

  mutable std::mutex mutex_;
  // Under mutex_:
  std::vector<member> nodes_;
  std::vector<std::uint16_t> slots_;
  std::vector<std::string> startup_;
  std::size_t rotation_ = 0;
  bool refreshing_ = false;
  bool closed_ = false;
  clock::time_point next_refresh_{};
  cluster_snapshot stats_{};
};

}  // namespace detail

/// A client of a Redis Cluster, for the rein::redis limiters and for plain commands.
///
/// Each command goes to the master that serves its key's hash slot, on one pipelined connection per node
/// (rein::redis::basic_connection's, with the options in `cluster_options::connection`). The slot map comes
/// from CLUSTER SLOTS, asked of the seeds first. A MOVED reply updates the map and sends the command to the
/// node named; an ASK reply (a slot being migrated) sends ASKING and the command to the node named, once.
/// Both come before a command runs, so a redirected command runs once. This is the client's part of the
/// Redis Cluster specification.
///
/// Failover: when a master fails, its commands fail with errc::unavailable (the limiters apply their
/// on_failure policy). A failed command, and every limiter that finds its node down at its recheck, asks
/// for a new slot map, at most once per `refresh_interval`; once the cluster has promoted a replica, the
/// map names it and commands go there. So the client follows within a refresh_interval (plus a limiter's
/// recheck_interval) of the promotion; the promotion itself takes the cluster's cluster-node-timeout and its
/// election. The other masters' slots are served throughout only if the cluster runs with
/// `cluster-require-full-coverage no`; with Redis's default (`yes`) every node answers CLUSTERDOWN until the
/// promotion, and every limiter applies its failure policy meanwhile. Replication is asynchronous: a
/// promoted replica may lack the last grants, stamps or leases its master made, so right after a failover a
/// fleet-wide bound can be exceeded by what was lost, and a semaphore whose lease was lost starts a new one.
/// While a slot moves (a MOVED in flight), one limiter's commands may reach the new master out of the order
/// they were sent in; the shared semaphore's renewals correct the count within a renewal period.
///
/// Each hop of a redirection is a request of its own, with its own `request_timeout`: a command may wait
/// up to max_redirects + 1 of them (a limiter's operations still end at their deadlines).
///
/// The limiters keep every key of one limiter in one slot (a hash tag), so each script runs on one node.
/// Pass the cluster instead of a connection: `shared_token_bucket bucket(cluster, {.key = "api", ...});`.
///
/// @par Thread Safety
/// Every member function may be called concurrently, except destruction.
///
/// @par Lifetime
/// Not copyable or movable. Destroying it closes every node's connection: pending commands complete with
/// operation_aborted. Limiters using it keep its machinery alive but see it as closed (errc::unavailable).
/// It must be destroyed before its execution context.
template <class Executor = net::any_io_executor>
class basic_cluster {
 public:
  /// The executor that runs completion handlers without an associated executor of their own.
  using executor_type = Executor;
  /// The shared machinery (an implementation type).
  using core_type = detail::cluster_core<Executor>;

  /// The cluster type when rebound to another executor.
  template <class OtherExecutor>
  struct rebind_executor {
    /// The same type on `OtherExecutor`.
    using other = basic_cluster<OtherExecutor>;
  };

  /// A client on `ex`; nothing happens on the network until the first command.
  /// @throws std::invalid_argument naming the field and value if an option is out of range (no seed, a
  /// database other than 0, a connection option out of range).
  explicit basic_cluster(const executor_type& ex, cluster_options options)
      : core_(std::make_shared<core_type>(ex, std::move(options))) {}

  /// A client whose handlers run on `context`'s executor by default.
  template <class ExecutionContext>
    requires std::is_convertible_v<ExecutionContext&, net::execution_context&>
  explicit basic_cluster(ExecutionContext& context, cluster_options options)
      : basic_cluster(context.get_executor(), std::move(options)) {}

  basic_cluster(const basic_cluster&) = delete;
  basic_cluster& operator=(const basic_cluster&) = delete;

  ~basic_cluster() { core_->close(); }

  /// The executor given at construction.
  executor_type get_executor() const noexcept { return core_->get_executor(); }

  /// The options in force (as validated at construction).
  const cluster_options& get_options() const noexcept { return core_->get_options(); }

  /// Closes every node's connection for good; pending commands complete with operation_aborted. Idempotent.
  void close() { core_->close(); }

  /// The client's counters.
  cluster_snapshot snapshot() const { return core_->snapshot(); }

  /// Sends one command to the master that serves `key`'s slot, pipelined with everyone else's, and
  /// completes with its reply after any redirection.
  ///
  /// @param key   the key whose slot decides the node (normally one of the command's keys).
  /// @param args  the command and its arguments, each sent as is, e.g. {"GET", key}.
  /// @param token completion token; signature `void(error_code, rein::redis::reply)`. Default: `deferred`.
  ///
  /// As basic_connection::async_execute: an error reply is a successful completion whose reply has
  /// `kind::error` (MOVED and ASK never reach the caller unless max_redirects is exceeded, which fails with
  /// errc::unavailable); errc::unavailable if the node is down or fails before replying, or the client was
  /// closed before the call; operation_aborted if it is closed while the command is pending. The handler
  /// runs on its associated executor, never inside this function.
  ///
  /// @par Per-Operation Cancellation
  /// None: a command on the wire cannot be taken back.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, reply)) Token = default_token_t>
  auto async_execute(std::string_view key, std::span<const std::string_view> args, Token&& token = Token{}) {
    return net::async_initiate<Token, void(error_code, reply)>(initiate_execute{core_}, token, key_slot(key),
                                                               encode_command(args));
  }

  /// As above, for a braced list of arguments: `async_execute(key, {"GET", key}, token)`.
  template <REIN_COMPLETION_TOKEN_FOR(void(error_code, reply)) Token = default_token_t>
  auto async_execute(std::string_view key, std::initializer_list<std::string_view> args, Token&& token = Token{}) {
    return async_execute(key, std::span<const std::string_view>(args.begin(), args.size()), std::forward<Token>(token));
  }

  /// The shared machinery, for limiters built on this cluster. Not API.
  const std::shared_ptr<core_type>& core() const noexcept { return core_; }

 private:
  struct initiate_execute {
    std::shared_ptr<core_type> core;  // a deferred operation may be launched after the object is gone
    using executor_type = Executor;
    executor_type get_executor() const noexcept { return core->get_executor(); }

    template <class Handler>
    void operator()(Handler&& handler, unsigned slot, const std::string& command) const {
      detail::start_execute(std::forward<Handler>(handler), core->get_executor(),
                            [&](detail::request_node* node) { return core->submit(slot, command, node); });
    }
  };

  std::shared_ptr<core_type> core_;
};

/// A cluster client on any I/O executor.
using cluster = basic_cluster<>;

}  // namespace rein::redis
