// What the fixtures that run a real server as a child process share (nginx, Prometheus, Redis Cluster): a
// free loopback port, a probe for "accepts connections", a stop that asks first and then insists, and a
// temporary directory for their files.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <system_error>
#include <stdexcept>
#include <string>
#include <thread>

namespace rein_test {

/// A fresh directory under /tmp (mkdtemp), removed with everything in it when destroyed; `who` names the
/// fixture, in the directory's name and in the error.
class temp_dir {
 public:
  explicit temp_dir(const std::string& who) {
    std::string name = "/tmp/rein-" + who + "-XXXXXX";
    if (::mkdtemp(name.data()) == nullptr) throw std::runtime_error(who + ": mkdtemp failed");
    path_ = name;
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
};

/// A loopback port the kernel considers free right now; `who` names the fixture in the error.
inline unsigned short free_loopback_port(const std::string& who) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(who + ": socket failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &size) == 0;
  ::close(fd);
  if (!ok) throw std::runtime_error(who + ": no free port");
  return ntohs(addr.sin_port);
}

/// Whether something accepts TCP connections on 127.0.0.1:port.
inline bool accepts_connections(unsigned short port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

/// SIGTERM, then SIGKILL if the child has not exited within 5 s; reaps it and sets `pid` to -1.
inline void stop_child(pid_t& pid) noexcept {
  if (pid <= 0) return;
  ::kill(pid, SIGTERM);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= give_up) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  pid = -1;
}

}  // namespace rein_test
