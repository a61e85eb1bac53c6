// A Redis Cluster of the test's own: 3 masters and 3 replicas, each a redis_server in cluster mode on free
// loopback ports, joined by `redis-cli --cluster create`. Nodes can be killed and restarted, a failover waited
// for, a slot migrated by hand (to provoke ASK redirects). Used by tests/redis (POSIX only).
//
// Queries go over plain blocking sockets (RESP2, one connection each): independent of the code under test,
// bounded by a timeout (a dead or stopped node cannot hang a test), and cheap enough to poll.
#pragma once

#include "redis_server.hpp"
#include "support/child_server.hpp"

#include <poll.h>
#include <stdlib.h>
#include <sys/time.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#ifndef REIN_REDIS_CLI
#error "REIN_REDIS_CLI must name the redis-cli executable (tests/redis/CMakeLists.txt defines it)"
#endif

namespace rein_test {

namespace cluster_detail {

inline constexpr unsigned slot_count = 16384;
inline constexpr std::size_t node_count = 6;  // 3 masters, each with one replica
inline constexpr std::chrono::milliseconds poll_interval{50};
// A query made while polling: a node that does not answer within this is just not ready yet.
inline constexpr std::chrono::milliseconds poll_timeout{500};
// A command the caller asked for: MIGRATE and WAIT may take a while.
inline constexpr std::chrono::milliseconds command_timeout{5000};

inline std::chrono::milliseconds remaining(std::chrono::steady_clock::time_point give_up) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(give_up - std::chrono::steady_clock::now());
  return std::max(left, std::chrono::milliseconds(0));
}

/// A decimal number (a RESP length or integer, a port or slot in CLUSTER NODES); nullopt if `s` is not one.
inline std::optional<long long> to_number(std::string_view s) {
  long long n = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return n;
}

/// `s` cut at each `sep`, empty pieces left out.
inline std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> pieces;
  std::size_t begin = 0;
  while (begin <= s.size()) {
    const std::size_t end = std::min(s.find(sep, begin), s.size());
    if (end > begin) pieces.emplace_back(s.substr(begin, end - begin));
    begin = end + 1;
  }
  return pieces;
}

inline std::string join(const std::vector<std::string>& pieces, std::string_view sep) {
  std::string out;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    if (i > 0) out += sep;
    out += pieces[i];
  }
  return out;
}

/// One RESP2 reply: type '+', '-', ':', '$' or '*', or '_' for a nil bulk string or array.
struct reply {
  char type = '_';
  std::string text;             // all but '*'
  std::vector<reply> elements;  // '*'
};

/// A reply as text: strings and integers as they are, an error with its '-' (so it cannot pass for a value),
/// nil as "(nil)", an array's elements one per line (nested arrays flattened, as redis-cli prints them when
/// its output is not a terminal).
inline std::string render(const reply& r) {
  switch (r.type) {
    case '-':
      return "-" + r.text;
    case '_':
      return "(nil)";
    case '*': {
      std::vector<std::string> lines;
      for (const reply& e : r.elements) lines.push_back(render(e));
      return join(lines, "\n");
    }
    default:
      return r.text;
  }
}

/// A blocking loopback connection whose connect, sends and receives each give up after `timeout`.
class connection {
 public:
  connection(std::uint16_t port, std::chrono::milliseconds timeout) : port_(port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) throw std::runtime_error("redis_cluster: socket failed");
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    // Closed with a reset: polling makes hundreds of connections, none should linger in TIME_WAIT.
    const linger abort_on_close{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof abort_on_close);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd_);
      throw failure("cannot connect");
    }
  }

  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;

  ~connection() { ::close(fd_); }

  /// Sends `args` as one command (a RESP array of bulk strings: binary-safe, no quoting).
  void send(const std::vector<std::string>& args) {
    std::string wire = "*" + std::to_string(args.size()) + "\r\n";
    for (const std::string& arg : args) wire += "$" + std::to_string(arg.size()) + "\r\n" + arg + "\r\n";
    std::size_t sent = 0;
    while (sent < wire.size()) {
      const ssize_t n = ::send(fd_, wire.data() + sent, wire.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw failure("send failed");
      sent += static_cast<std::size_t>(n);
    }
  }

  /// Reads one reply (an array with all its elements).
  reply receive() {
    reply r;
    r.type = get();
    const std::string head = line();
    if (r.type == '+' || r.type == '-' || r.type == ':') {
      r.text = head;
      return r;
    }
    const auto length = to_number(head);
    if ((r.type != '$' && r.type != '*') || !length) throw failure("not a RESP2 reply");
    if (*length < 0) {
      r.type = '_';
    } else if (r.type == '$') {
      r.text = take(static_cast<std::size_t>(*length));
      line();  // the CRLF after the payload
    } else {
      for (long long i = 0; i < *length; ++i) r.elements.push_back(receive());
    }
    return r;
  }

 private:
  std::runtime_error failure(const std::string& what) const {
    return std::runtime_error("redis_cluster: " + what + " (127.0.0.1:" + std::to_string(port_) + ")");
  }

  char get() {
    if (pos_ == buffer_.size()) fill();
    return buffer_[pos_++];
  }

  std::string line() {
    std::string s;
    for (char c = get(); c != '\r'; c = get()) s.push_back(c);
    get();  // '\n'
    return s;
  }

  std::string take(std::size_t n) {
    std::string s;
    while (s.size() < n) {
      if (pos_ == buffer_.size()) fill();
      const std::size_t chunk = std::min(n - s.size(), buffer_.size() - pos_);
      s.append(buffer_, pos_, chunk);
      pos_ += chunk;
    }
    return s;
  }

  void fill() {
    buffer_.resize(16384);
    ssize_t n = 0;
    while ((n = ::recv(fd_, buffer_.data(), buffer_.size(), 0)) < 0 && errno == EINTR) {
    }
    if (n <= 0) throw failure(n == 0 ? "connection closed" : "no reply in time");
    buffer_.resize(static_cast<std::size_t>(n));
    pos_ = 0;
  }

  std::uint16_t port_;
  int fd_ = -1;
  std::string buffer_;
  std::size_t pos_ = 0;
};

/// Sends `commands` to 127.0.0.1:port on one connection, each after the previous one's reply, and returns the
/// replies; throws std::runtime_error if the node cannot be reached or a reply does not come within `timeout`.
inline std::vector<reply> exchange(std::uint16_t port, const std::vector<std::vector<std::string>>& commands,
                                   std::chrono::milliseconds timeout) {
  connection c(port, timeout);
  std::vector<reply> replies;
  for (const std::vector<std::string>& args : commands) {
    c.send(args);
    replies.push_back(c.receive());
  }
  return replies;
}

inline reply request(std::uint16_t port, const std::vector<std::string>& args, std::chrono::milliseconds timeout) {
  return exchange(port, {args}, timeout).front();
}

/// The same without the exception: while polling, a node that is dead or busy is just not ready.
inline std::optional<reply> try_request(std::uint16_t port, const std::vector<std::string>& args) {
  try {
    return request(port, args, poll_timeout);
  } catch (const std::runtime_error&) {
    return std::nullopt;
  }
}

/// One line of CLUSTER NODES: `<id> <ip:port@cport[,hostname]> <flags> <master-id or -> <ping-sent>
/// <pong-recv> <config-epoch> <link-state> <slot, first-last, [slot->-id] or [slot-<-id]>...`.
struct node_entry {
  std::string id;
  std::uint16_t port = 0;  // 0 while the address is unknown (a handshake)
  std::vector<std::string> flags;
  std::string master_id;                                   // "-" for a master
  std::vector<std::pair<unsigned, unsigned>> ranges;      // the slots it serves, both ends included
  std::vector<std::string> migrations;                     // "[slot->-id]", "[slot-<-id]": only on the node itself

  bool has(std::string_view flag) const { return std::find(flags.begin(), flags.end(), flag) != flags.end(); }
  bool is_master() const { return has("master"); }
  /// Failed, suspected by the asking node, or not fully known yet.
  bool unsound() const { return has("fail") || has("fail?") || has("handshake") || has("noaddr"); }
};

inline std::optional<std::pair<unsigned, unsigned>> parse_range(std::string_view token) {
  const std::size_t dash = token.find('-');
  const auto first = to_number(token.substr(0, dash));
  const auto last = dash == std::string_view::npos ? first : to_number(token.substr(dash + 1));
  if (!first || !last || *first < 0 || *first > *last || *last >= slot_count) return std::nullopt;
  return std::pair{static_cast<unsigned>(*first), static_cast<unsigned>(*last)};
}

inline std::optional<node_entry> parse_node(std::string_view line) {
  const std::vector<std::string> t = split(line, ' ');
  if (t.size() < 8) return std::nullopt;
  node_entry e;
  e.id = t[0];
  const std::size_t at = t[1].find('@');
  const std::size_t colon = at == std::string::npos ? std::string::npos : t[1].rfind(':', at);
  if (colon == std::string::npos) return std::nullopt;
  const auto port = to_number(std::string_view(t[1]).substr(colon + 1, at - colon - 1));
  if (!port || *port < 0 || *port > 65535) return std::nullopt;
  e.port = static_cast<std::uint16_t>(*port);
  e.flags = split(t[2], ',');
  e.master_id = t[3];
  for (std::size_t i = 8; i < t.size(); ++i) {
    if (t[i].starts_with('[')) {
      e.migrations.push_back(t[i]);
    } else if (const auto range = parse_range(t[i])) {
      e.ranges.push_back(*range);
    } else {
      return std::nullopt;
    }
  }
  return e;
}

/// One node's view of the cluster (its CLUSTER NODES).
struct view {
  std::vector<node_entry> nodes;

  const node_entry* find_id(std::string_view id) const {
    for (const node_entry& e : nodes) {
      if (e.id == id) return &e;
    }
    return nullptr;
  }

  /// Per slot, the port of the master the view names for it (0: none).
  std::vector<std::uint16_t> owners() const {
    std::vector<std::uint16_t> owner(slot_count, 0);
    for (const node_entry& e : nodes) {
      for (const auto& [first, last] : e.ranges) std::fill(owner.begin() + first, owner.begin() + last + 1, e.port);
    }
    return owner;
  }

  /// The masters that serve at least one slot, by port.
  std::vector<std::uint16_t> masters() const {
    std::vector<std::uint16_t> ports;
    for (const node_entry& e : nodes) {
      if (e.is_master() && !e.ranges.empty()) ports.push_back(e.port);
    }
    std::sort(ports.begin(), ports.end());
    return ports;
  }

  std::size_t replicas_of(const node_entry& master) const {
    return static_cast<std::size_t>(
        std::count_if(nodes.begin(), nodes.end(), [&](const node_entry& e) { return e.master_id == master.id; }));
  }

  /// One line per node, by port ("30001 master 0-5460", "30004 slave of 30001"), without what differs between
  /// two nodes that agree (the myself flag, link states, a node's own migrations): equal summaries, same view.
  std::string summary() const {
    std::vector<std::string> lines;
    for (const node_entry& e : nodes) {
      std::vector<std::string> flags;
      std::copy_if(e.flags.begin(), e.flags.end(), std::back_inserter(flags),
                   [](const std::string& f) { return f != "myself"; });
      std::string line = std::to_string(e.port) + " " + join(flags, ",");
      if (const node_entry* m = e.master_id == "-" ? nullptr : find_id(e.master_id)) {
        line += " of " + std::to_string(m->port);
      }
      for (const auto& [first, last] : e.ranges) {
        line += " " + std::to_string(first) + (first == last ? "" : "-" + std::to_string(last));
      }
      lines.push_back(line);
    }
    std::sort(lines.begin(), lines.end());
    return join(lines, "; ");
  }

  /// What keeps this from being the view of a whole cluster as created (nullopt if nothing): six sound nodes,
  /// three masters sharing all the slots, each with one replica.
  std::optional<std::string> shape_problem() const {
    if (nodes.size() != node_count) return std::to_string(nodes.size()) + " nodes";
    for (const node_entry& e : nodes) {
      if (e.unsound()) return "node " + std::to_string(e.port) + " flagged " + join(e.flags, ",");
    }
    const std::vector<std::uint16_t> owner = owners();
    if (const auto hole = std::find(owner.begin(), owner.end(), 0); hole != owner.end()) {
      return "slot " + std::to_string(hole - owner.begin()) + " unassigned";
    }
    if (masters().size() != node_count / 2) return std::to_string(masters().size()) + " masters";
    for (const node_entry& e : nodes) {
      if (e.is_master() && replicas_of(e) != 1) {
        return "master " + std::to_string(e.port) + " with " + std::to_string(replicas_of(e)) + " replicas";
      }
    }
    return std::nullopt;
  }
};

inline std::optional<view> parse_view(std::string_view text) {
  view v;
  for (const std::string& line : split(text, '\n')) {
    const auto entry = parse_node(line);
    if (!entry) return std::nullopt;
    v.nodes.push_back(*entry);
  }
  return v;
}

/// CRC16-XMODEM, Redis's key hash: the slot of a key without a hash tag is crc16(key) % 16384.
inline unsigned crc16(std::string_view s) {
  unsigned crc = 0;
  for (const char c : s) {
    crc ^= static_cast<unsigned>(static_cast<unsigned char>(c)) << 8;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 0x8000U) != 0 ? (crc << 1) ^ 0x1021U : crc << 1;
    crc &= 0xffffU;
  }
  return crc;
}

/// A key (without a hash tag) whose slot is in `ranges`, which must not be empty.
inline std::string probe_key(const std::vector<std::pair<unsigned, unsigned>>& ranges) {
  for (unsigned n = 0;; ++n) {
    std::string key = "rein_test:cluster_probe:" + std::to_string(n);
    const unsigned slot = crc16(key) % slot_count;
    for (const auto& [first, last] : ranges) {
      if (first <= slot && slot <= last) return key;
    }
  }
}

/// What a program printed and how it ended.
struct run_result {
  int status = -1;  // its exit status; -1 if it was killed (not done in time) or died of a signal
  std::string output;  // stdout and stderr
};

/// Runs `program` with `args` (no shell), stdin from /dev/null, stdout and stderr captured; kills it if it is
/// not done within `limit`.
inline run_result run(const std::string& program, const std::vector<std::string>& args,
                      std::chrono::milliseconds limit) {
  // All the child needs is made before fork: in a multi-threaded test, the child may only exec.
  std::vector<const char*> argv{program.c_str()};
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  argv.push_back(nullptr);
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("redis_cluster: pipe failed");
  const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t pid = null < 0 ? -1 : ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a crashed test
    ::dup2(null, STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(out[1], STDERR_FILENO);
    ::execv(program.c_str(), const_cast<char* const*>(argv.data()));
    ::_exit(127);
  }
  if (null >= 0) ::close(null);
  ::close(out[1]);
  if (pid < 0) {
    ::close(out[0]);
    throw std::runtime_error("redis_cluster: cannot start " + program);
  }
  run_result result;
  const auto give_up = std::chrono::steady_clock::now() + limit;
  bool open = true;
  while (open && remaining(give_up).count() > 0) {
    pollfd p{out[0], POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(remaining(give_up).count())) <= 0) continue;  // EINTR or time up
    char buffer[4096];
    const ssize_t n = ::read(out[0], buffer, sizeof buffer);
    if (n > 0) result.output.append(buffer, static_cast<std::size_t>(n));
    open = n > 0 || (n < 0 && errno == EINTR);
  }
  ::close(out[0]);
  if (open) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!open && WIFEXITED(status)) result.status = WEXITSTATUS(status);
  return result;
}

}  // namespace cluster_detail

/// Six redis-server processes in cluster mode (3 masters, 3 replicas) on free loopback ports, with their
/// config files and sync files in a temporary directory. Destroying it kills them all and removes the
/// directory. The methods that ask "the cluster" ask a live node that reports cluster_state:ok (else any live
/// node that answers) and throw std::runtime_error if none answers.
class redis_cluster {
 public:
  static constexpr unsigned slot_count = cluster_detail::slot_count;

  /// Starts the nodes, creates the cluster with redis-cli and waits until it is healthy (see
  /// wait_until_healthy); throws std::runtime_error if that takes more than 30 s. `node_timeout` is the
  /// cluster's: how long a node may not answer before it is deemed failed (a failover takes about that plus
  /// one second).
  explicit redis_cluster(std::chrono::milliseconds node_timeout = std::chrono::milliseconds(1000))
      : node_timeout_(node_timeout) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    const std::string cli = redis_cli();
    while (nodes_.size() < cluster_detail::node_count) start_node();
    create(cli, give_up);
    wait_until_healthy(cluster_detail::remaining(give_up));
  }

  redis_cluster(const redis_cluster&) = delete;
  redis_cluster& operator=(const redis_cluster&) = delete;

  /// The nodes' client ports, all six, in the order they were started.
  std::vector<std::uint16_t> ports() const {
    std::vector<std::uint16_t> all;
    for (const node& n : nodes_) all.push_back(n.port);
    return all;
  }

  /// The masters that serve at least one slot now, by port. A killed master stays one until its replica is
  /// promoted.
  std::vector<std::uint16_t> masters() const { return current_view().masters(); }

  /// The port of the master that serves `slot` now (a killed one until its replica is promoted).
  std::uint16_t master_of_slot(unsigned slot) const {
    check_slot(slot);
    const std::uint16_t owner = current_view().owners()[slot];
    if (owner == 0) throw std::runtime_error("redis_cluster: slot " + std::to_string(slot) + " is not assigned");
    return owner;
  }

  /// The slot of `key` according to Redis (CLUSTER KEYSLOT): to check a client's own hashing against.
  unsigned key_slot(const std::string& key) const {
    for (const std::uint16_t port : live_ports()) {
      const auto r = cluster_detail::try_request(port, {"CLUSTER", "KEYSLOT", key});
      if (!r) continue;
      const auto slot = cluster_detail::to_number(r->text);
      if (r->type != ':' || !slot) throw std::runtime_error("redis_cluster: CLUSTER KEYSLOT: " + render(*r));
      return static_cast<unsigned>(*slot);
    }
    throw std::runtime_error("redis_cluster: no live node answers");
  }

  /// The node's cluster id (CLUSTER MYID).
  std::string node_id(std::uint16_t port) const {
    const cluster_detail::reply r =
        cluster_detail::request(port, {"CLUSTER", "MYID"}, cluster_detail::command_timeout);
    if (r.type != '$') {
      throw std::runtime_error("redis_cluster: CLUSTER MYID on " + std::to_string(port) + ": " + render(r));
    }
    return r.text;
  }

  /// Runs one command on one node (no redirects followed) and returns its whole reply as text: strings and
  /// integers as they are, an error with its leading '-' ("-MOVED 12182 127.0.0.1:35001"), nil as "(nil)", an
  /// array's elements one per line. Throws std::runtime_error if the node does not answer within `timeout`.
  std::string command(std::uint16_t port, const std::vector<std::string>& args,
                      std::chrono::milliseconds timeout = cluster_detail::command_timeout) const {
    return render(cluster_detail::request(port, args, timeout));
  }

  /// Runs the commands of `sequence` on one node over one connection, each after the previous one's reply, and
  /// returns the replies as command() does. For what needs a connection's state: {"SET", ...} then {"WAIT",
  /// "1", "100"} (WAIT counts the acknowledgements of the connection's own last write), {"ASKING"} or
  /// {"READONLY"} then a read, MULTI ... EXEC.
  std::vector<std::string> commands(std::uint16_t port, const std::vector<std::vector<std::string>>& sequence,
                                    std::chrono::milliseconds timeout = cluster_detail::command_timeout) const {
    std::vector<std::string> replies;
    for (const cluster_detail::reply& r : cluster_detail::exchange(port, sequence, timeout)) {
      replies.push_back(render(r));
    }
    return replies;
  }

  bool running(std::uint16_t port) const { return find(port).server->running(); }

  /// SIGKILL, as a crash would; the node stays dead until restart(). The slots it served are noted first, for
  /// wait_for_failover.
  void kill(std::uint16_t port) {
    node& n = find(port);
    if (!n.server->running()) return;
    std::vector<unsigned> served;
    if (const auto v = any_view()) {
      const std::vector<std::uint16_t> owner = v->owners();
      for (unsigned slot = 0; slot < slot_count; ++slot) {
        if (owner[slot] == port) served.push_back(slot);
      }
    }
    served_at_kill_[port] = std::move(served);
    n.server->kill();
  }

  /// Starts a killed node again on its port with its config file: it rejoins the cluster as itself (a master
  /// that was replaced meanwhile comes back as a replica of its successor). Returns once it answers PING; see
  /// wait_until_healthy for the cluster as a whole.
  void restart(std::uint16_t port) { find(port).server->start(); }

  /// Waits until the slots `dead_master` served when kill() stopped it are all served by one other node, by
  /// the account of every live node, each reporting cluster_state:ok; returns that node's port. Throws
  /// std::runtime_error if that takes longer than `limit`, std::logic_error if `dead_master` was not a killed
  /// master.
  std::uint16_t wait_for_failover(std::uint16_t dead_master, std::chrono::milliseconds limit) const {
    if (running(dead_master)) {
      throw std::logic_error("redis_cluster::wait_for_failover: node " + std::to_string(dead_master) + " runs");
    }
    const auto served = served_at_kill_.find(dead_master);
    if (served == served_at_kill_.end() || served->second.empty()) {
      throw std::logic_error("redis_cluster::wait_for_failover: node " + std::to_string(dead_master) +
                             " served no slot when kill() stopped it");
    }
    const auto give_up = std::chrono::steady_clock::now() + limit;
    for (;;) {
      std::string why;
      if (const auto owner = successor(served->second, dead_master, why)) return *owner;
      if (std::chrono::steady_clock::now() >= give_up) {
        throw std::runtime_error("redis_cluster: no failover from " + std::to_string(dead_master) + " within " +
                                 std::to_string(limit.count()) + " ms: " + why + "\n" + describe());
      }
      std::this_thread::sleep_for(cluster_detail::poll_interval);
    }
  }

  /// Waits until the cluster is whole again, as after construction: all six nodes running, reporting
  /// cluster_state:ok and sharing one view of it (three masters sharing the 16384 slots, each with one
  /// replica, no node suspected), every replica acknowledging its master's writes (so that WAIT 1 after a
  /// write counts it; each master writes and deletes a key "rein_test:cluster_probe:<n>" to find out). Throws
  /// std::runtime_error if that takes longer than `limit`.
  void wait_until_healthy(std::chrono::milliseconds limit = std::chrono::seconds(30)) const {
    const auto give_up = std::chrono::steady_clock::now() + limit;
    for (;;) {
      const auto problem = health_problem();
      if (!problem) return;
      if (std::chrono::steady_clock::now() >= give_up) {
        throw std::runtime_error("redis_cluster: not healthy within " + std::to_string(limit.count()) +
                                 " ms: " + *problem + "\n" + describe());
      }
      std::this_thread::sleep_for(cluster_detail::poll_interval);
    }
  }

  /// Starts moving `slot` from master `from` to master `to` by hand: `from` then answers ASK for the slot's
  /// keys it does not have, and `to` accepts them after ASKING.
  void begin_migration(unsigned slot, std::uint16_t from, std::uint16_t to) const {
    check_slot(slot);
    const std::string s = std::to_string(slot);
    // Importing first, as redis-cli does: once `from` redirects, `to` must accept.
    expect_ok(to, {"CLUSTER", "SETSLOT", s, "IMPORTING", node_id(from)});
    expect_ok(from, {"CLUSTER", "SETSLOT", s, "MIGRATING", node_id(to)});
  }

  /// Ends what begin_migration started: moves the slot's keys to `to` (MIGRATE), makes `to` its owner, and
  /// waits (at most 30 s, else std::runtime_error) until every live node says so.
  void finish_migration(unsigned slot, std::uint16_t from, std::uint16_t to) const {
    check_slot(slot);
    const std::string s = std::to_string(slot);
    move_keys(s, from, to);
    const std::string to_id = node_id(to);
    // Target first (it bumps its config epoch, so its claim wins), then the source, then every other master
    // so that none waits for the gossip.
    expect_ok(to, {"CLUSTER", "SETSLOT", s, "NODE", to_id});
    expect_ok(from, {"CLUSTER", "SETSLOT", s, "NODE", to_id});
    for (const std::uint16_t master : masters()) {
      if (master != from && master != to && running(master)) {
        expect_ok(master, {"CLUSTER", "SETSLOT", s, "NODE", to_id});
      }
    }
    wait_for_owner(slot, to, std::chrono::seconds(30));
  }

  /// Where the nodes keep their config files (nodes-<port>.conf).
  std::string directory() const { return dir_.path().string(); }

 private:
  struct node {
    std::uint16_t port;
    std::unique_ptr<redis_server> server;
  };

  static void check_slot(unsigned slot) {
    if (slot >= slot_count) throw std::invalid_argument("redis_cluster: no slot " + std::to_string(slot));
  }

  node& find(std::uint16_t port) {
    return const_cast<node&>(static_cast<const redis_cluster&>(*this).find(port));
  }

  const node& find(std::uint16_t port) const {
    for (const node& n : nodes_) {
      if (n.port == port) return n;
    }
    throw std::invalid_argument("redis_cluster: no node on port " + std::to_string(port));
  }

  std::vector<std::uint16_t> live_ports() const {
    std::vector<std::uint16_t> live;
    for (const node& n : nodes_) {
      if (n.server->running()) live.push_back(n.port);
    }
    return live;
  }

  std::vector<std::string> node_args(std::uint16_t port, std::uint16_t bus_port) const {
    const std::string p = std::to_string(port);
    return {
        "--cluster-enabled", "yes",
        // The default bus port, port + 10000, may be past 65535 or taken.
        "--cluster-port", std::to_string(bus_port),
        // Kept across restart(): the node rejoins as itself.
        "--cluster-config-file", dir_.path().string() + "/nodes-" + p + ".conf",
        "--cluster-node-timeout", std::to_string(node_timeout_.count()),
        // A replica may always be promoted, however long ago it last heard from its master.
        "--cluster-replica-validity-factor", "0",
        // Replicas stay with their masters: a fixed shape to test against and to wait for.
        "--cluster-allow-replica-migration", "no",
        // The other masters keep serving their slots while one is down, as a production cluster should for
        // a limiter: a failover then shows only on the dead master's slots.
        "--cluster-require-full-coverage", "no",
        "--dir", dir_.path().string(),
        // The nodes share the directory: each replica's sync file is its own, and is deleted once loaded, so a
        // restarted node starts empty (persistence is off) and cannot load another node's keys.
        "--dbfilename", "dump-" + p + ".rdb",
        "--rdb-del-sync-files", "yes",
        // A replica syncs at once, not 5 s later: WAIT counts it as soon as the cluster is up or a node is back.
        "--repl-diskless-sync-delay", "0",
#ifdef REIN_CLUSTER_DEBUG_LOGS  // to see what the nodes did: copy directory() aside before the cluster ends
        "--loglevel", "verbose", "--logfile", dir_.path().string() + "/log-" + p,
#endif
    };
  }

  /// Starts one node on two free ports (clients, cluster bus); on new ones if they were taken meanwhile.
  void start_node() {
    for (int attempt = 1;; ++attempt) {
      const std::uint16_t port = free_port();
      std::uint16_t bus_port = free_port();
      while (bus_port == port) bus_port = free_port();
      try {
        nodes_.push_back({port, std::make_unique<redis_server>(port, node_args(port, bus_port))});
        return;
      } catch (const std::runtime_error&) {
        if (attempt == 3) throw;
      }
    }
  }

  /// REIN_REDIS_CLI, checked before any server is started (CMake leaves it empty or *-NOTFOUND without one).
  static std::string redis_cli() {
    const std::string cli = REIN_REDIS_CLI;
    if (cli.empty() || ::access(cli.c_str(), X_OK) != 0) {
      throw std::runtime_error("redis_cluster: no redis-cli (REIN_REDIS_CLI: \"" + cli + "\"; Debian: redis-tools)");
    }
    return cli;
  }

  void create(const std::string& cli, std::chrono::steady_clock::time_point give_up) const {
    std::vector<std::string> args{"--cluster", "create"};
    for (const node& n : nodes_) args.push_back("127.0.0.1:" + std::to_string(n.port));
    args.insert(args.end(), {"--cluster-replicas", "1", "--cluster-yes"});
    const cluster_detail::run_result result = cluster_detail::run(cli, args, cluster_detail::remaining(give_up));
    if (result.status != 0 || result.output.find("[OK] All 16384 slots covered") == std::string::npos) {
      throw std::runtime_error("redis_cluster: redis-cli --cluster create failed (exit status " +
                               std::to_string(result.status) + "):\n" + result.output);
    }
  }

  static bool state_ok(std::uint16_t port) {
    const auto info = cluster_detail::try_request(port, {"CLUSTER", "INFO"});
    return info && info->type == '$' && info->text.find("cluster_state:ok\r\n") != std::string::npos;
  }

  static std::optional<cluster_detail::view> view_of(std::uint16_t port) {
    const auto nodes = cluster_detail::try_request(port, {"CLUSTER", "NODES"});
    if (!nodes || nodes->type != '$') return std::nullopt;
    return cluster_detail::parse_view(nodes->text);
  }

  /// The view of the first live node that reports cluster_state:ok, else of the first that answers: a node
  /// just restarted has an outdated one until the others have told it what changed.
  std::optional<cluster_detail::view> any_view() const {
    const std::vector<std::uint16_t> live = live_ports();
    for (const std::uint16_t port : live) {
      if (state_ok(port)) {
        if (auto v = view_of(port)) return v;
      }
    }
    for (const std::uint16_t port : live) {
      if (auto v = view_of(port)) return v;
    }
    return std::nullopt;
  }

  cluster_detail::view current_view() const {
    auto v = any_view();
    if (!v) throw std::runtime_error("redis_cluster: no live node answers CLUSTER NODES");
    return *std::move(v);
  }

  std::optional<std::string> health_problem() const {
    std::optional<cluster_detail::view> agreed;
    for (const node& n : nodes_) {
      const std::string name = "node " + std::to_string(n.port);
      if (!n.server->running()) return name + " is not running";
      if (!state_ok(n.port)) return name + " does not report cluster_state:ok";
      auto v = view_of(n.port);
      if (!v) return name + " does not answer CLUSTER NODES";
      if (const auto problem = v->shape_problem()) return name + " sees " + *problem;
      if (agreed && v->summary() != agreed->summary()) {
        return name + " disagrees with node " + std::to_string(nodes_[0].port);
      }
      if (!agreed) agreed = std::move(v);
    }
    return replication_problem(*agreed);
  }

  /// What keeps a master's replica from counting for WAIT (nullopt if nothing): each master writes (and
  /// deletes) a probe key in one of its slots, and its replica must acknowledge that within 100 ms. Looking at
  /// the link is not enough: after a diskless full sync, a master may report its replica online yet hold the
  /// stream back until the replica's next periodic REPLCONF ACK, up to a second later.
  static std::optional<std::string> replication_problem(const cluster_detail::view& v) {
    for (const cluster_detail::node_entry& e : v.nodes) {
      if (!e.is_master() || e.ranges.empty()) continue;
      const std::string key = cluster_detail::probe_key(e.ranges);
      const std::vector<std::vector<std::string>> probe{
          {"SET", key, "1", "PX", "10000"}, {"DEL", key}, {"WAIT", "1", "100"}};
      std::vector<cluster_detail::reply> replies;
      try {
        replies = cluster_detail::exchange(e.port, probe, cluster_detail::poll_timeout);
      } catch (const std::runtime_error&) {
      }
      if (replies.size() != 3 || replies[2].type != ':' || replies[2].text != "1") {
        return "the replica of node " + std::to_string(e.port) + " does not acknowledge writes yet";
      }
    }
    return std::nullopt;
  }

  /// The node that serves all of `slots`, not `dead`, by the account of every live node, each reporting
  /// cluster_state:ok; nullopt (why not in `why`) while there is none.
  std::optional<std::uint16_t> successor(const std::vector<unsigned>& slots, std::uint16_t dead,
                                         std::string& why) const {
    std::optional<std::uint16_t> agreed;
    for (const std::uint16_t port : live_ports()) {
      const std::string name = "node " + std::to_string(port);
      const auto v = state_ok(port) ? view_of(port) : std::nullopt;
      if (!v) {
        why = name + " does not report cluster_state:ok";
        return std::nullopt;
      }
      const std::vector<std::uint16_t> owner = v->owners();
      const std::uint16_t first = owner[slots.front()];
      if (first == dead || first == 0 ||
          !std::all_of(slots.begin(), slots.end(), [&](unsigned s) { return owner[s] == first; })) {
        why = name + " does not name one successor for the slots";
        return std::nullopt;
      }
      if (agreed && *agreed != first) {
        why = name + " names " + std::to_string(first) + ", another node " + std::to_string(*agreed);
        return std::nullopt;
      }
      agreed = first;
    }
    if (!agreed) why = "no live node";
    return agreed;
  }

  /// MIGRATE moves the slot's keys from `from` to `to`, 100 at a time, until `from` has none left.
  static void move_keys(const std::string& slot, std::uint16_t from, std::uint16_t to) {
    using cluster_detail::command_timeout;
    for (;;) {
      const cluster_detail::reply keys =
          cluster_detail::request(from, {"CLUSTER", "GETKEYSINSLOT", slot, "100"}, command_timeout);
      if (keys.type != '*') throw std::runtime_error("redis_cluster: CLUSTER GETKEYSINSLOT: " + render(keys));
      if (keys.elements.empty()) return;
      std::vector<std::string> args{"MIGRATE", "127.0.0.1", std::to_string(to), "", "0", "5000", "KEYS"};
      for (const cluster_detail::reply& key : keys.elements) args.push_back(key.text);
      expect_ok(from, args);  // OK, or NOKEY if the keys expired meanwhile
    }
  }

  static void expect_ok(std::uint16_t port, const std::vector<std::string>& args) {
    const cluster_detail::reply r = cluster_detail::request(port, args, cluster_detail::command_timeout);
    if (r.type != '+') {
      throw std::runtime_error("redis_cluster: " + cluster_detail::join(args, " ") + " on node " +
                               std::to_string(port) + ": " + render(r));
    }
  }

  /// Waits until every live node reports cluster_state:ok and names `owner` for `slot`, none still migrating
  /// or importing it.
  void wait_for_owner(unsigned slot, std::uint16_t owner, std::chrono::milliseconds limit) const {
    const std::string marker = "[" + std::to_string(slot) + "-";
    const auto settled = [&](std::uint16_t port) {
      const auto v = state_ok(port) ? view_of(port) : std::nullopt;
      return v && v->owners()[slot] == owner &&
             std::none_of(v->nodes.begin(), v->nodes.end(), [&](const cluster_detail::node_entry& e) {
               return std::any_of(e.migrations.begin(), e.migrations.end(),
                                  [&](const std::string& m) { return m.starts_with(marker); });
             });
    };
    const auto give_up = std::chrono::steady_clock::now() + limit;
    for (;;) {
      const std::vector<std::uint16_t> live = live_ports();
      if (std::all_of(live.begin(), live.end(), settled)) return;
      if (std::chrono::steady_clock::now() >= give_up) {
        throw std::runtime_error("redis_cluster: slot " + std::to_string(slot) + " not moved to " +
                                 std::to_string(owner) + " everywhere within " + std::to_string(limit.count()) +
                                 " ms\n" + describe());
      }
      std::this_thread::sleep_for(cluster_detail::poll_interval);
    }
  }

  /// Each node's state and view, for the message of a timeout.
  std::string describe() const {
    std::string out;
    for (const node& n : nodes_) {
      out += "  " + std::to_string(n.port) + ": ";
      if (!n.server->running()) {
        out += "killed\n";
        continue;
      }
      const auto info = cluster_detail::try_request(n.port, {"CLUSTER", "INFO"});
      const std::size_t at = info ? info->text.find("cluster_state:") : std::string::npos;
      out += at == std::string::npos ? "cluster_state?" : info->text.substr(at, info->text.find('\r', at) - at);
      const auto v = view_of(n.port);
      out += v ? " | " + v->summary() + "\n" : " | no view\n";
    }
    return out;
  }

  // Destroyed in reverse: the servers are killed before their directory is removed.
  temp_dir dir_{"cluster"};
  std::chrono::milliseconds node_timeout_;
  std::vector<node> nodes_;
  std::map<std::uint16_t, std::vector<unsigned>> served_at_kill_;
};

}  // namespace rein_test
