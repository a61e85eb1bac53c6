// TLS to Redis (rein::redis_tls) against real TLS-only redis-servers, with certificates the test makes with
// the openssl command in a temporary directory: a CA, a server certificate for 127.0.0.1 and localhost, an
// expired one, one for another name, a second CA, and a client certificate. Real time with margins.
#include "support.hpp"

#include <rein/error.hpp>
#include <rein/permit.hpp>
#include <rein/redis/cluster.hpp>
#include <rein/redis/connection.hpp>
#include <rein/redis/shared_semaphore.hpp>
#include <rein/redis/shared_token_bucket.hpp>

#include <openssl/x509_vfy.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#ifndef REIN_OPENSSL
#error "REIN_OPENSSL must name the openssl executable (tests/redis/CMakeLists.txt defines it)"
#endif

using namespace rein_test;

namespace {

// docs/redis.md's example (TLS, a restricted user, the start-up check): compiled here, never run.
[[maybe_unused]] net::awaitable<void> documented_tls(net::io_context& io, std::string secret) {
  rein::redis::connection_options options{.host = "redis.internal", .port = 6380, .username = "rein",
                                          .password = secret};
  options.tls.enabled = true;  // the server's certificate is verified by default
  options.tls.ca_file = "/etc/ssl/redis-ca.pem";
  rein::redis::connection redis(io, options);
  rein::redis::shared_semaphore pool(redis, {.key = "db", .limit = 3});
  co_await redis.async_connect(net::use_awaitable);  // throws at start if refused
}

// The certificates, made once per test binary run.
struct certificates {
  std::filesystem::path dir;

  certificates() {
    char pattern[] = "/tmp/rein-tls-XXXXXX";
    if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir = pattern;
    const std::string o = REIN_OPENSSL;
    const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::string ca_ext = " -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign";
    // A leaf: key and request, then signed by `ca` with `days` (negative: already expired) and `ext`.
    const auto leaf = [&](const std::string& name, const std::string& ca, const std::string& days,
                          const std::string& ext) {
      return o + " req -new" + ec + " -keyout " + name + ".key -out " + name + ".csr -subj /CN=" + name +
             " && printf '" + ext + "\\n' > " + name + ".ext && " + o + " x509 -req -in " + name + ".csr -CA " + ca +
             ".crt -CAkey " + ca + ".key -CAcreateserial -days " + days + " -extfile " + name + ".ext -out " + name +
             ".crt";
    };
    const std::string script =
        "(cd " + dir.string() + " && " +
        o + " req -x509" + ec + " -keyout ca.key -out ca.crt -days 2 -subj /CN=rein-test-ca" + ca_ext + " && " +
        o + " req -x509" + ec + " -keyout other-ca.key -out other-ca.crt -days 2 -subj /CN=rein-other-ca" + ca_ext +
        " && " + leaf("server", "ca", "2", "subjectAltName=IP:127.0.0.1,DNS:localhost") + " && " +
        leaf("expired", "ca", "-1", "subjectAltName=IP:127.0.0.1,DNS:localhost") + " && " +
        leaf("elsewhere", "ca", "2", "subjectAltName=DNS:redis.example.com") + " && " +
        leaf("client", "ca", "2", "extendedKeyUsage=clientAuth") + ") >/dev/null 2>&1";
    if (std::system(script.c_str()) != 0) throw std::runtime_error("openssl failed to make the test certificates");
  }
  ~certificates() {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
  std::string operator()(const std::string& file) const { return (dir / file).string(); }
};

const certificates& certs() {
  static const certificates instance;
  return instance;
}

// A TLS-only redis-server (--port 0) presenting `name`.crt, trusting ca.crt for client certificates.
// `plain_port` non-zero: a plaintext port too (for the throughput comparison on one server).
class tls_server {
 public:
  explicit tls_server(const std::string& name, const std::string& auth_clients = "no", std::uint16_t plain_port = 0)
      : port_(free_port()) {
    const std::string tls_port = std::to_string(port_);
    const std::string plain = std::to_string(plain_port);
    const std::string cert = certs()(name + ".crt");
    const std::string key = certs()(name + ".key");
    const std::string ca = certs()("ca.crt");
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("tls_server: fork failed");
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int null = ::open("/dev/null", O_RDWR);
      if (null >= 0) {
        ::dup2(null, STDIN_FILENO);
        ::dup2(null, STDOUT_FILENO);
      }
      std::vector<const char*> argv{"redis-server", "--port", plain.c_str(), "--tls-port", tls_port.c_str(),
                                    "--tls-cert-file", cert.c_str(), "--tls-key-file", key.c_str(),
                                    "--tls-ca-cert-file", ca.c_str(), "--tls-auth-clients", auth_clients.c_str(),
                                    "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                    "--loglevel", "warning", "--logfile", "", nullptr};
      ::execv(REIN_REDIS_SERVER, const_cast<char* const*>(argv.data()));
      ::_exit(127);
    }
    // Ready once the TLS port accepts connections.
    const auto give_up = steady::now() + std::chrono::seconds(20);
    while (steady::now() < give_up) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(port_);
      const bool up = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
      ::close(fd);
      if (up) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    throw std::runtime_error("tls_server: the TLS port did not open within 20 s");
  }
  tls_server(const tls_server&) = delete;
  tls_server& operator=(const tls_server&) = delete;
  ~tls_server() {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  std::uint16_t port() const noexcept { return port_; }

 private:
  std::uint16_t port_;
  pid_t pid_ = -1;
};

rein::redis::connection_options tls_to(std::uint16_t port, std::string ca = "ca.crt") {
  auto o = local(port);
  o.tls.enabled = true;
  o.tls.ca_file = certs()(ca);
  return o;
}

// Runs async_connect to its end; returns its error code.
rein::error_code start(net::io_context& io, rein::redis::connection& c) {
  std::optional<rein::error_code> result;
  c.async_connect([&](rein::error_code ec) { result = ec; });
  REQUIRE(run_until(io, [&] { return result.has_value(); }, std::chrono::seconds(5)));
  return *result;
}

rein::error_code refused(long verdict) {
  return rein::error_code(static_cast<int>(verdict), rein::redis::tls_verify_category());
}

}  // namespace

TEST_CASE("tls: a TLS-only server verified by its CA serves commands, a shared semaphore and a shared bucket") {
  tls_server server("server");
  net::io_context io;
  rein::redis::connection c(io, tls_to(server.port()));
  const std::string key = unique_key("tls");
  rein::redis::shared_semaphore sem(c, {.key = key, .limit = 2});
  rein::redis::shared_token_bucket bucket(c, {.key = key + ":bucket", .rate = 100, .capacity = 10});
  CHECK(start(io, c) == rein::error_code{});
  CHECK(c.snapshot().startup_errors == 0);
  CHECK(execute(io, c, {"SET", key, "over tls"}).text == "OK");
  CHECK(execute(io, c, {"GET", key}).text == "over tls");

  std::optional<rein::error_code> got;
  rein::permit held;
  sem.async_acquire(2, [&](rein::error_code ec, rein::permit p) {
    got = ec;
    held = std::move(p);
  });
  REQUIRE(run_until(io, [&] { return got.has_value(); }));
  CHECK(*got == rein::error_code{});
  CHECK(held.count() == 2);
  std::optional<rein::error_code> full;
  sem.async_acquire_for(1, std::chrono::milliseconds(100), [&](rein::error_code ec, rein::permit) { full = ec; });
  REQUIRE(run_until(io, [&] { return full.has_value(); }));
  CHECK(*full == rein::errc::timed_out);
  held.release();

  std::size_t admitted = 0;
  std::vector<rein::error_code> errors;
  for (int i = 0; i < 10; ++i) {
    bucket.async_acquire(1, [&](rein::error_code ec) {
      if (ec) errors.push_back(ec);
      else ++admitted;
    });
  }
  REQUIRE(run_until(io, [&] { return admitted + errors.size() == 10; }));
  for (const auto& ec : errors) UNSCOPED_INFO(ec.message());
  CHECK(admitted == 10);
  const auto s = c.snapshot();
  CHECK(s.connects == 1);
  CHECK(s.connect_failures == 0);
}

TEST_CASE("tls: the server name may differ from the host (SNI and the certificate check use it)") {
  tls_server server("server");
  net::io_context io;
  auto o = tls_to(server.port());
  o.tls.server_name = "localhost";  // host stays 127.0.0.1; the certificate names both
  rein::redis::connection c(io, o);
  CHECK(start(io, c) == rein::error_code{});
  CHECK(execute(io, c, {"PING"}).text == "PONG");
}

TEST_CASE("tls: a server certificate from another CA fails at startup, clearly, and never falls back") {
  tls_server server("server");
  net::io_context io;
  rein::redis::connection c(io, tls_to(server.port(), "other-ca.crt"));
  const rein::error_code ec = start(io, c);
  // redis-server sends its chain with the CA, which the client does not trust.
  CHECK(ec == refused(X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN));
  CHECK(ec.message() == "the server's TLS certificate was refused: self-signed certificate in certificate chain");
  const auto s = c.snapshot();
  CHECK(s.last_error == ec);
  CHECK(s.last_error_message ==
        "TLS handshake with 127.0.0.1:" + std::to_string(server.port()) + " failed: " + ec.message());
  CHECK(s.connects == 0);
  CHECK(s.connect_failures >= 1);
  // Commands are refused; none is ever sent in the clear (the server would drop a plaintext client anyway).
  rein::error_code command_ec;
  execute(io, c, {"PING"}, &command_ec);
  CHECK(command_ec == rein::redis::errc::unavailable);
  CHECK(c.snapshot().replies == 0);
}

TEST_CASE("tls: an expired server certificate fails at startup") {
  tls_server server("expired");
  net::io_context io;
  rein::redis::connection c(io, tls_to(server.port()));
  const rein::error_code ec = start(io, c);
  CHECK(ec == refused(X509_V_ERR_CERT_HAS_EXPIRED));
  CHECK(ec.message() == "the server's TLS certificate was refused: certificate has expired");
}

TEST_CASE("tls: a certificate for another name fails at startup, by address and by name") {
  tls_server server("elsewhere");
  net::io_context io;
  rein::redis::connection by_address(io, tls_to(server.port()));
  CHECK(start(io, by_address) == refused(X509_V_ERR_IP_ADDRESS_MISMATCH));
  auto o = tls_to(server.port());
  o.tls.server_name = "localhost";
  rein::redis::connection by_name(io, o);
  const rein::error_code ec = start(io, by_name);
  CHECK(ec == refused(X509_V_ERR_HOSTNAME_MISMATCH));
  CHECK(ec.message() == "the server's TLS certificate was refused: hostname mismatch");
  // With verification off (tests only) the same server is accepted.
  auto unchecked = tls_to(server.port());
  unchecked.tls.verify_peer = false;
  rein::redis::connection c(io, unchecked);
  CHECK(start(io, c) == rein::error_code{});
}

TEST_CASE("tls: a TLS client to a plaintext server fails at startup; it never speaks plaintext") {
  redis_server plain;
  net::io_context io;
  rein::redis::connection c(io, tls_to(plain.port()));
  const rein::error_code ec = start(io, c);
  CHECK(ec);
  // redis-server takes the ClientHello for an unfinished command and waits: the handshake times out.
  CHECK(ec == net::error::timed_out);
  CHECK(c.snapshot().last_error_message ==
        "connecting to 127.0.0.1:" + std::to_string(plain.port()) +
            " (TCP and TLS handshake) took longer than connect_timeout");
  CHECK(c.snapshot().replies == 0);
}

TEST_CASE("tls: a server that requires a client certificate accepts ours and refuses a client without one") {
  tls_server server("server", "yes");
  net::io_context io;
  auto with = tls_to(server.port());
  with.tls.certificate_file = certs()("client.crt");
  with.tls.private_key_file = certs()("client.key");
  rein::redis::connection c(io, with);
  CHECK(start(io, c) == rein::error_code{});
  CHECK(execute(io, c, {"PING"}).text == "PONG");

  rein::redis::connection without(io, tls_to(server.port()));
  const rein::error_code ec = start(io, without);
  INFO(ec.message() << " / " << without.snapshot().last_error_message);
  CHECK(ec);
  CHECK(without.snapshot().replies == 0);
  CHECK(without.snapshot().last_error_message.find(
            "right after the TLS handshake, before any reply (does the server require a client certificate?") !=
        std::string::npos);
}

TEST_CASE("tls: bad TLS options are refused with the field and the value") {
  net::io_context io;
  const auto refused_with = [&](const rein::redis::connection_options& o, const std::string& text) {
    try {
      rein::redis::connection c(io, o);
      FAIL("accepted");
    } catch (const std::invalid_argument& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).starts_with("rein::redis::connection: "));
      CHECK(std::string(e.what()).find(text) != std::string::npos);
    }
  };
  auto off = local(6379);
  off.tls.ca_file = "/etc/ca.pem";
  refused_with(off, "tls.ca_file is \"/etc/ca.pem\" but tls.enabled is false");
  auto cert_only = tls_to(6379);
  cert_only.tls.certificate_file = certs()("client.crt");
  refused_with(cert_only, "tls.certificate_file \"" + certs()("client.crt") + "\" needs tls.private_key_file");
  auto missing = tls_to(6379);
  missing.tls.ca_file = "/nonexistent/ca.pem";
  refused_with(missing, "tls.ca_file \"/nonexistent/ca.pem\" cannot be used");
  auto no_directory = tls_to(6379);  // OpenSSL would take any path and look it up only at the handshake
  no_directory.tls.ca_directory = "/nonexistent/ca-dir";
  refused_with(no_directory, "tls.ca_directory \"/nonexistent/ca-dir\" is not a directory");
  auto mismatched = tls_to(6379);
  mismatched.tls.certificate_file = certs()("client.crt");
  mismatched.tls.private_key_file = certs()("server.key");
  refused_with(mismatched, "tls.private_key_file \"" + certs()("server.key") + "\" cannot be used");
  // A cluster's node connections are made later: its TLS files are checked at construction too.
  rein::redis::cluster_options nodes{.seeds = {{"127.0.0.1", 7000}}, .connection = missing};
  std::string what;
  try {
    rein::redis::cluster refused_cluster(io, nodes);
  } catch (const std::invalid_argument& e) {
    what = e.what();
  }
  CHECK(what.find("tls.ca_file \"/nonexistent/ca.pem\" cannot be used") != std::string::npos);
  nodes.connection = tls_to(6379);
  CHECK_NOTHROW(rein::redis::cluster(io, nodes));  // node connections inherit the TLS settings
}

TEST_CASE("tls: throughput beside plaintext on one server (printed, not asserted)") {
  const std::uint16_t plain_port = free_port();
  tls_server server("server", "no", plain_port);
  net::io_context io;
  rein::redis::connection tls(io, tls_to(server.port()));
  rein::redis::connection plain(io, local(plain_port));
  REQUIRE(start(io, tls) == rein::error_code{});
  REQUIRE(start(io, plain) == rein::error_code{});
  const std::string key = unique_key("throughput");
  // Pipelined: `total` INCRs, at most 256 in flight. Sequential: one round trip at a time.
  const auto pipelined = [&](rein::redis::connection& c, int total) {
    int sent = 0;
    int done = 0;
    std::function<void()> more = [&] {
      while (sent < total && sent - done < 256) {
        ++sent;
        c.async_execute({"INCR", key}, [&](rein::error_code ec, rein::redis::reply) {
          REQUIRE_FALSE(ec);
          ++done;
          more();
        });
      }
    };
    const auto begin = steady::now();
    more();
    REQUIRE(run_until(io, [&] { return done == total; }, std::chrono::seconds(60)));
    return total / std::chrono::duration<double>(steady::now() - begin).count();
  };
  const auto sequential = [&](rein::redis::connection& c, int total) {
    const auto begin = steady::now();
    for (int i = 0; i < total; ++i) execute(io, c, {"INCR", key});
    return std::chrono::duration<double, std::micro>(steady::now() - begin).count() / total;
  };
  pipelined(plain, 5000);  // warm up both
  pipelined(tls, 5000);
  // A shared token bucket that never runs dry: `total` acquires, 64 awaiting Redis at a time (each one an
  // EVALSHA round trip of the bucket's script).
  const auto acquires = [&](rein::redis::connection& c, int total) {
    rein::redis::shared_token_bucket bucket(c, {.key = unique_key("throughput-bucket"), .rate = 1e9, .capacity = 1000000000});
    int sent = 0;
    int done = 0;
    std::function<void()> more = [&] {
      while (sent < total && sent - done < 64) {
        ++sent;
        bucket.async_acquire(1, [&](rein::error_code ec) {
          REQUIRE_FALSE(ec);
          ++done;
          more();
        });
      }
    };
    const auto begin = steady::now();
    more();
    REQUIRE(run_until(io, [&] { return done == total; }, std::chrono::seconds(60)));
    return total / std::chrono::duration<double>(steady::now() - begin).count();
  };
  // Alternated, best of three each: the machine may be shared, and the best run is the least disturbed.
  double plain_rate = 0, tls_rate = 0, plain_rtt = 1e9, tls_rtt = 1e9, plain_acquires = 0, tls_acquires = 0;
  for (int round = 0; round < 3; ++round) {
    plain_rate = std::max(plain_rate, pipelined(plain, 50000));
    tls_rate = std::max(tls_rate, pipelined(tls, 50000));
    plain_rtt = std::min(plain_rtt, sequential(plain, 2000));
    tls_rtt = std::min(tls_rtt, sequential(tls, 2000));
    plain_acquires = std::max(plain_acquires, acquires(plain, 10000));
    tls_acquires = std::max(tls_acquires, acquires(tls, 10000));
  }
  std::printf("shared_token_bucket, 10000 acquires (64 awaiting Redis), best of 3: plaintext %.0f/s, TLS %.0f/s "
              "(%.2fx)\n", plain_acquires, tls_acquires, tls_acquires / plain_acquires);
  std::printf("redis throughput, 50000 pipelined INCR (256 in flight), best of 3: plaintext %.0f/s, TLS %.0f/s "
              "(%.2fx)\n", plain_rate, tls_rate, tls_rate / plain_rate);
  std::printf("redis round trip, 2000 sequential INCR, best of 3: plaintext %.1f us, TLS %.1f us\n", plain_rtt,
              tls_rtt);
  CHECK(plain_rate > 0);
  CHECK(tls_rate > 0);
}

TEST_CASE("tls: a Redis Cluster over TLS (tls-cluster yes): the cluster's node connections use the TLS settings") {
  // Three masters, no replicas: TLS between clients and nodes and on the cluster bus. Each node also has a
  // plaintext port, used here only to set the cluster up.
  struct node {
    std::uint16_t tls_port = free_port();
    std::uint16_t bus_port = free_port();
    std::unique_ptr<redis_server> server;
  };
  std::vector<node> nodes(3);
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    node& n = nodes[i];
    n.server = std::make_unique<redis_server>(
        free_port(), std::vector<std::string>{
                         "--cluster-enabled", "yes", "--cluster-config-file", certs()("nodes-" + std::to_string(i) + ".conf"),
                         "--cluster-port", std::to_string(n.bus_port), "--tls-port", std::to_string(n.tls_port),
                         "--tls-cluster", "yes", "--tls-replication", "yes", "--tls-auth-clients", "no",
                         "--tls-cert-file", certs()("server.crt"), "--tls-key-file", certs()("server.key"),
                         "--tls-ca-cert-file", certs()("ca.crt")});
  }
  const char* ranges[3][2] = {{"0", "5460"}, {"5461", "10922"}, {"10923", "16383"}};
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    REQUIRE(raw_command(nodes[i].server->port(),
                        std::string("CLUSTER ADDSLOTSRANGE ") + ranges[i][0] + " " + ranges[i][1]) == "+OK");
    if (i > 0) {
      REQUIRE(raw_command(nodes[i].server->port(), "CLUSTER MEET 127.0.0.1 " + std::to_string(nodes[0].tls_port) + " " +
                                                       std::to_string(nodes[0].bus_port)) == "+OK");
    }
  }
  net::io_context io;
  std::vector<std::unique_ptr<rein::redis::connection>> admin;
  for (const node& n : nodes) admin.push_back(std::make_unique<rein::redis::connection>(io, local(n.server->port())));
  REQUIRE(run_until(
      io,
      [&] {
        for (auto& c : admin) {
          rein::error_code ec;
          if (execute(io, *c, {"CLUSTER", "INFO"}, &ec).text.find("cluster_state:ok") == std::string::npos) return false;
        }
        return true;
      },
      std::chrono::seconds(20)));

  rein::redis::cluster_options options{.seeds = {{"127.0.0.1", nodes[0].tls_port}}, .connection = tls_to(nodes[0].tls_port)};
  rein::redis::cluster cluster(io, options);
  const std::string key = unique_key("tls-cluster");
  std::vector<std::unique_ptr<rein::redis::shared_semaphore>> sems;
  for (int i = 0; i < 9; ++i) {
    sems.push_back(std::make_unique<rein::redis::shared_semaphore>(
        cluster, rein::redis::shared_semaphore_options{.key = key + ":" + std::to_string(i), .limit = 1}));
  }
  std::vector<rein::permit> held;
  std::size_t granted = 0;
  for (auto& sem : sems) {
    sem->async_acquire(1, [&](rein::error_code ec, rein::permit p) {
      CHECK(ec == rein::error_code{});
      granted += ec ? 0 : 1;
      held.push_back(std::move(p));
    });
  }
  REQUIRE(run_until(io, [&] { return held.size() == sems.size(); }));
  CHECK(granted == sems.size());
  // The keys landed on more than one master, each reached over TLS (nodes announce their TLS ports to a
  // TLS client; a plaintext one would have been refused by the TLS ports).
  std::size_t masters_used = 0;
  for (auto& c : admin) masters_used += execute(io, *c, {"DBSIZE"}).integer > 0 ? 1 : 0;
  CHECK(masters_used >= 2);
}
