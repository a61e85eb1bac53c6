// A real Prometheus server for the integration tests, and the processes around it: started on a free
// loopback port in a temporary directory, stopped by PID, queried through its HTTP API. POSIX only.
#pragma once

#include "support/child_server.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

extern char** environ;

namespace rein_test {

/// The Prometheus binary: $REIN_PROMETHEUS, else /usr/bin/prometheus; nullopt if neither is executable.
inline std::optional<std::string> find_prometheus() {
  if (const char* env = std::getenv("REIN_PROMETHEUS"); env != nullptr && *env != '\0') {
    if (::access(env, X_OK) == 0) return std::string(env);
    return std::nullopt;
  }
  if (::access("/usr/bin/prometheus", X_OK) == 0) return std::string("/usr/bin/prometheus");
  return std::nullopt;
}


/// GET http://127.0.0.1:<port><target> (HTTP/1.0: the server closes when done). The status code and the
/// body; status 0 if nothing answered.
struct http_reply {
  int status = 0;
  std::string body;
};

inline http_reply http_get(unsigned short port, const std::string& target) {
  http_reply reply;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return reply;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return reply;
  }
  const std::string request = "GET " + target + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (::send(fd, request.data(), request.size(), 0) != static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return reply;
  }
  std::string raw;
  char buffer[4096];
  for (ssize_t n; (n = ::recv(fd, buffer, sizeof buffer, 0)) > 0;) raw.append(buffer, static_cast<std::size_t>(n));
  ::close(fd);
  if (raw.rfind("HTTP/", 0) != 0) return reply;
  const std::size_t space = raw.find(' ');
  reply.status = std::atoi(raw.c_str() + space + 1);
  const std::size_t body = raw.find("\r\n\r\n");
  if (body != std::string::npos) reply.body = raw.substr(body + 4);
  return reply;
}

/// Percent-encodes a query parameter.
inline std::string url_encode(std::string_view text) {
  std::string out;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += ch;
    } else {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02X", c);
      out += hex;
    }
  }
  return out;
}

/// A child process, stopped by its PID: SIGTERM, then SIGKILL after 5 s.
class child_process {
 public:
  /// Runs `args` with stdin from /dev/null and stdout and stderr to `log` (appended).
  child_process(const std::vector<std::string>& args, const std::filesystem::path& log) {
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    ::posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    const int spawned = ::posix_spawn(&pid_, copy[0].c_str(), &actions, nullptr, argv.data(), environ);
    ::posix_spawn_file_actions_destroy(&actions);
    if (spawned != 0) throw std::runtime_error("cannot run " + copy[0] + ": " + std::strerror(spawned));
  }
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;
  ~child_process() { stop(); }

  /// Whether it is still running.
  bool running() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    return true;
  }

  void stop() noexcept { stop_child(pid_); }

 private:
  pid_t pid_ = -1;
};

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Prometheus scraping `target_port` on 127.0.0.1 every second, its data in a temporary directory.
class prometheus_server {
 public:
  prometheus_server(const std::string& binary, unsigned short target_port) {
    {
      std::ofstream config(dir_.path() / "prometheus.yml");
      config << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
             << "scrape_configs:\n  - job_name: rein\n    static_configs:\n      - targets: ['127.0.0.1:"
             << target_port << "']\n";
    }
    for (int attempt = 0; attempt < 5; ++attempt) {
      port_ = free_loopback_port("prometheus fixture");
      process_.emplace_back(std::make_unique<child_process>(
          std::vector<std::string>{binary, "--config.file=" + (dir_.path() / "prometheus.yml").string(),
                                   "--storage.tsdb.path=" + (dir_.path() / "data").string(),
                                   "--web.listen-address=127.0.0.1:" + std::to_string(port_)},
          dir_.path() / "prometheus.log"));
      if (wait_ready()) return;
      process_.clear();
    }
    throw std::runtime_error("prometheus fixture: prometheus did not start:\n" + log());
  }

  unsigned short port() const noexcept { return port_; }
  std::string log() const { return read_text(dir_.path() / "prometheus.log"); }

  /// The value of an instant query's single sample, if the query returns exactly one.
  std::optional<double> query_one(const std::string& promql) const {
    const http_reply r = http_get(port_, "/api/v1/query?query=" + url_encode(promql));
    if (r.status != 200) return std::nullopt;
    // {"status":"success","data":{"resultType":"vector","result":[{"metric":{...},"value":[1.7e9,"12"]}]}}
    const std::size_t first = r.body.find("\"value\":[");
    if (first == std::string::npos || r.body.find("\"value\":[", first + 1) != std::string::npos) return std::nullopt;
    const std::size_t open = r.body.find('"', r.body.find(',', first));
    const std::size_t close = r.body.find('"', open + 1);
    if (open == std::string::npos || close == std::string::npos) return std::nullopt;
    return std::strtod(r.body.substr(open + 1, close - open - 1).c_str(), nullptr);
  }

 private:
  bool wait_ready() {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < give_up) {
      if (!process_.front()->running()) return false;
      if (http_get(port_, "/-/ready").status == 200) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  temp_dir dir_{"prometheus"};
  unsigned short port_ = 0;
  std::vector<std::unique_ptr<child_process>> process_;
};

}  // namespace rein_test
