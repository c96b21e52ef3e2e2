#include "shm_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>

#include "trainrun/collectives/errors.h"

namespace trainrun::collectives::internal {

using ::trainrun::internal::MakeMessage;

namespace {

void* MapShared(int fd, size_t bytes, const std::string& what) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    throw IoError(MakeMessage("cannot map ", what, " (", bytes, " bytes): ", std::strerror(errno)));
  }
  return p;
}

}  // namespace

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  std::swap(data_, other.data_);
  std::swap(bytes_, other.bytes_);
  std::swap(fd_, other.fd_);
  return *this;
}

ShmSegment::~ShmSegment() {
  if (data_ != nullptr) ::munmap(data_, bytes_);
  CloseFd();
}

void ShmSegment::CloseFd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

ShmSegment ShmSegment::Create(size_t bytes) {
  int fd = ::memfd_create("trainrun-collectives", MFD_CLOEXEC);
  if (fd < 0) {
    throw IoError(MakeMessage("cannot create a shared-memory segment (memfd_create): ",
                              std::strerror(errno)));
  }
  ShmSegment segment;
  segment.fd_ = fd;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    throw IoError(MakeMessage("cannot size a shared-memory segment to ", bytes, " bytes: ",
                              std::strerror(errno), " (is /dev/shm or memory limited?)"));
  }
  segment.data_ = MapShared(fd, bytes, "a new shared-memory segment");
  segment.bytes_ = bytes;
  return segment;
}

ShmSegment ShmSegment::Open(pid_t pid, int fd, size_t bytes) {
  const std::string path = MakeMessage("/proc/", pid, "/fd/", fd);
  int own = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (own < 0) throw IoError(MakeMessage("cannot open ", path, ": ", std::strerror(errno)));
  struct stat st {};
  const bool sized = ::fstat(own, &st) == 0 && static_cast<size_t>(st.st_size) == bytes;
  if (!sized) {
    ::close(own);
    throw IoError(MakeMessage(path, " is not a segment of ", bytes, " bytes"));
  }
  ShmSegment segment;
  try {
    segment.data_ = MapShared(own, bytes, path);
  } catch (...) {
    ::close(own);
    throw;
  }
  ::close(own);
  segment.bytes_ = bytes;
  return segment;
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds timeout) {
  struct timespec ts;
  ts.tv_sec = timeout.count() / 1000000;
  ts.tv_nsec = (timeout.count() % 1000000) * 1000;
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

std::string RandomNonce(size_t bytes) {
  std::string raw(bytes, '\0');
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = ::getrandom(raw.data() + got, bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw IoError(MakeMessage("getrandom failed: ", std::strerror(errno)));
    got += static_cast<size_t>(n);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : raw) {
    hex += kHex[c >> 4];
    hex += kHex[c & 15];
  }
  return hex;
}

ProcessWatch::ProcessWatch(pid_t pid) : pid_(pid) {
  pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

ProcessWatch& ProcessWatch::operator=(ProcessWatch&& other) noexcept {
  std::swap(pid_, other.pid_);
  std::swap(pidfd_, other.pidfd_);
  return *this;
}

ProcessWatch::~ProcessWatch() {
  if (pidfd_ >= 0) ::close(pidfd_);
}

bool ProcessWatch::Alive() const {
  if (pid_ <= 0) return true;
  if (pidfd_ < 0) return ::kill(pid_, 0) == 0 || errno == EPERM;
  struct pollfd p {
    pidfd_, POLLIN, 0
  };
  // A pidfd turns readable when the process ends, zombie or not.
  return ::poll(&p, 1, 0) == 0;
}

}  // namespace trainrun::collectives::internal
