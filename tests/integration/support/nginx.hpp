// A real nginx for the integration tests: started on a free loopback port from tests/integration/nginx.conf.in
// in a temporary prefix, stopped by its PID. POSIX only.
#pragma once

#include "support/child_server.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

extern char** environ;

namespace rein_test {

/// The limits written in nginx.conf.in.
struct nginx_limits {
  static constexpr double rate = 200;  ///< /rate: limit_req, requests per second
  static constexpr int burst = 20;     ///< /rate: limit_req burst (nodelay)
  static constexpr double host_a = 100;  ///< /host_a: limit_req, requests per second (burst 10, nodelay)
  static constexpr double host_b = 40;   ///< /host_b: limit_req, requests per second (burst 10, nodelay)
  static constexpr int connections = 8;  ///< /conn: limit_conn
  static constexpr double exact_a = 20;  ///< /exact_a: limit_req, requests per second, no burst
  static constexpr double exact_b = 50;  ///< /exact_b: limit_req, requests per second, no burst
  static constexpr double burst1_a = 20;  ///< /burst1_a: limit_req, requests per second, burst 1 (nodelay)
};

/// Starts nginx in the constructor (throws std::runtime_error with nginx's own messages if it cannot) and
/// stops it in the destructor: SIGTERM to its PID, then SIGKILL if it has not exited within 5 s. Everything
/// nginx writes stays in a temporary directory, removed afterwards.
///
/// The binary is $REIN_NGINX, else /usr/sbin/nginx, else `nginx` on the PATH; the configuration template
/// is $REIN_NGINX_CONF, else nginx.conf.in next to this header's folder.
class nginx_server {
 public:
  nginx_server() {
    const std::string binary = find_binary();
    const std::string conf = read_file(template_path());
    char dir_template[] = "/tmp/rein-nginx-XXXXXX";
    if (::mkdtemp(dir_template) == nullptr) throw std::runtime_error("nginx fixture: mkdtemp failed");
    prefix_ = dir_template;
    // A port found free can be taken before nginx binds it: try a few.
    std::string log;
    for (int attempt = 0; attempt < 5; ++attempt) {
      port_ = free_loopback_port("nginx fixture");
      write_file(prefix_ / "nginx.conf", replace_all(conf, "@PORT@", std::to_string(port_)));
      if (start(binary, log)) return;
    }
    std::filesystem::remove_all(prefix_);
    throw std::runtime_error("nginx fixture: nginx did not start:\n" + log);
  }

  nginx_server(const nginx_server&) = delete;
  nginx_server& operator=(const nginx_server&) = delete;

  ~nginx_server() {
    stop();
    std::error_code ignored;
    std::filesystem::remove_all(prefix_, ignored);
  }

  unsigned short port() const noexcept { return port_; }
  pid_t pid() const noexcept { return pid_; }
  /// "http://127.0.0.1:<port><path>"
  std::string url(std::string_view path) const { return "http://127.0.0.1:" + std::to_string(port_) + std::string(path); }
  /// What nginx wrote to stderr so far (warnings and errors).
  std::string log() const { return read_file(prefix_ / "stderr.log"); }

 private:
  static std::string find_binary() {
    if (const char* env = std::getenv("REIN_NGINX"); env != nullptr && *env != '\0') return env;
    if (::access("/usr/sbin/nginx", X_OK) == 0) return "/usr/sbin/nginx";
    if (const char* path = std::getenv("PATH"); path != nullptr) {
      std::stringstream dirs(path);
      for (std::string dir; std::getline(dirs, dir, ':');) {
        const std::string candidate = dir + "/nginx";
        if (::access(candidate.c_str(), X_OK) == 0) return candidate;
      }
    }
    throw std::runtime_error("nginx fixture: nginx not found (Debian: apt-get install nginx; or set REIN_NGINX)");
  }

  static std::filesystem::path template_path() {
    if (const char* env = std::getenv("REIN_NGINX_CONF"); env != nullptr && *env != '\0') return env;
#if defined(REIN_TEST_SOURCE_DIR)
    return std::filesystem::path(REIN_TEST_SOURCE_DIR) / "integration" / "nginx.conf.in";
#else
    return std::filesystem::path(__FILE__).parent_path().parent_path() / "nginx.conf.in";  // may be relative
#endif
  }

  static std::string read_file(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("nginx fixture: cannot read " + path.string());
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

  static void write_file(const std::filesystem::path& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out) throw std::runtime_error("nginx fixture: cannot write " + path.string());
  }

  static std::string replace_all(std::string text, std::string_view from, std::string_view to) {
    for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
      text.replace(at, from.size(), to);
    return text;
  }



  // Spawns nginx and waits until it accepts connections. False (with its log) if it exited instead.
  bool start(const std::string& binary, std::string& log) {
    const std::string prefix = prefix_.string() + "/";
    const std::string conf = (prefix_ / "nginx.conf").string();
    const std::string err = (prefix_ / "stderr.log").string();
    std::vector<std::string> args = {binary, "-p", prefix, "-c", conf, "-e", "stderr"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    ::posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, err.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    const int spawned = ::posix_spawn(&pid_, binary.c_str(), &actions, nullptr, argv.data(), environ);
    ::posix_spawn_file_actions_destroy(&actions);
    if (spawned != 0) throw std::runtime_error("nginx fixture: cannot run " + binary + ": " + std::strerror(spawned));

    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < give_up) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        log += read_file(err);
        return false;
      }
      if (accepts_connections(port_)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    stop();
    log += read_file(err) + "(no connection within 10 s)\n";
    return false;
  }

  void stop() noexcept { stop_child(pid_); }

  std::filesystem::path prefix_;
  unsigned short port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace rein_test
