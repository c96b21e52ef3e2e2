// UniqueFd: the one owner of a file descriptor in the launcher (sockets, pipes, eventfds, files).
//
//   UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
//   if (!fd) return Error(errno);
//   ::read(fd.get(), ...);  // closed when `fd` goes out of scope
#pragma once

#include <utility>

namespace trainrun::launcher::posix {

// UniqueFd owns a file descriptor and closes it once; -1 means none.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) Reset(std::exchange(other.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  // Release gives up ownership without closing.
  int Release() { return std::exchange(fd_, -1); }
  // Reset closes the fd held, if any, and holds `fd`.
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

}  // namespace trainrun::launcher::posix
