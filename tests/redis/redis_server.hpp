// A redis-server of the test's own: on a free loopback port, persistence off, started with fork/exec and
// stopped by its PID. Used by tests/redis and benchmarks/redis (POSIX only).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#ifndef REIN_REDIS_SERVER
#error "REIN_REDIS_SERVER must name the redis-server executable (tests/redis/CMakeLists.txt defines it)"
#endif

namespace rein_test {

/// A loopback TCP port that was free a moment ago (the kernel's pick for port 0).
inline std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("free_port: socket failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("free_port: bind failed");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

/// Sends one inline command to 127.0.0.1:port and returns the first line of the reply ("" if none within
/// `timeout`). Blocking POSIX sockets: independent of the code under test.
inline std::string raw_command(std::uint16_t port, const std::string& command,
                               std::chrono::milliseconds timeout = std::chrono::milliseconds(500)) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return {};
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  std::string line;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string wire = command + "\r\n";
    if (::send(fd, wire.data(), wire.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(wire.size())) {
      char c = 0;
      while (::recv(fd, &c, 1, 0) == 1 && c != '\r') line.push_back(c);
    }
  }
  ::close(fd);
  return line;
}

/// A redis-server child process. Destroying it kills the server (SIGKILL) and reaps it.
class redis_server {
 public:
  /// Starts a server on a free port and waits until it answers PING.
  redis_server() : redis_server(free_port()) {}

  /// Starts a server on `port` and waits until it answers PING. `extra` is appended to the command line
  /// (e.g. {"--requirepass", "secret"}: readiness is then checked by its NOAUTH answer).
  explicit redis_server(std::uint16_t port, std::vector<std::string> extra = {}) : port_(port), extra_(std::move(extra)) {
    start();
  }

  redis_server(const redis_server&) = delete;
  redis_server& operator=(const redis_server&) = delete;

  ~redis_server() { kill(); }

  std::uint16_t port() const noexcept { return port_; }
  pid_t pid() const noexcept { return pid_; }
  bool running() const noexcept { return pid_ > 0; }

  /// Starts the server again (same port) after kill() or stop(), and waits until it answers PING.
  void start() {
    if (pid_ > 0) return;
    const std::string port = std::to_string(port_);
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("redis_server: fork failed");
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a crashed test
      const int null = ::open("/dev/null", O_RDWR);
      if (null >= 0) {
        ::dup2(null, STDIN_FILENO);
        ::dup2(null, STDOUT_FILENO);
      }
      std::vector<const char*> argv{"redis-server", "--port", port.c_str(), "--bind", "127.0.0.1",
                                    "--save", "", "--appendonly", "no", "--daemonize", "no",
                                    "--loglevel", "warning", "--logfile", ""};
      for (const std::string& arg : extra_) argv.push_back(arg.c_str());
      argv.push_back(nullptr);
      ::execv(REIN_REDIS_SERVER, const_cast<char* const*>(argv.data()));
      ::_exit(127);
    }
    wait_until_ready();
  }

  /// SIGKILL, as a crash or an OOM kill would: no goodbye to clients.
  void kill() { signal_and_reap(SIGKILL); }

  /// SIGTERM: an orderly shutdown.
  void stop() { signal_and_reap(SIGTERM); }

  /// SIGSTOP / SIGCONT: the server stays connected but answers nothing (a hung or partitioned server).
  void pause() { ::kill(pid_, SIGSTOP); }
  void resume() { ::kill(pid_, SIGCONT); }

 private:
  void wait_until_ready() {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < give_up) {
      const std::string answer = raw_command(port_, "PING");
      if (answer == "+PONG" || answer.starts_with("-NOAUTH")) return;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("redis_server: redis-server exited at start (port " + std::to_string(port_) + ")");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill();
    throw std::runtime_error("redis_server: no PONG within 20 s");
  }

  void signal_and_reap(int sig) {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);  // a stopped process would not act on SIGTERM
    ::kill(pid_, sig);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }

  std::uint16_t port_;
  std::vector<std::string> extra_;
  pid_t pid_ = -1;
};

}  // namespace rein_test
