// Shared memory for the ranks of one host: an anonymous memfd mapped by every rank, and the futex
// wait/wake that synchronises them.
//
// The segment has no name anywhere (no /dev/shm entry), so nothing is left behind however the ranks
// end, kill -9 included: the memory goes when the last rank that maps it goes. The creator keeps
// the fd open until every peer has opened it through /proc/<creator pid>/fd/<fd>; that path only
// leads to the segment from a process that shares the creator's kernel and /proc, which is what
// same_host.h turns into a proof.
//
//   ShmSegment seg = ShmSegment::Create(bytes);            // one rank
//   ShmSegment seg = ShmSegment::Open(pid, fd, bytes);     // the others
//   FutexWait(&word, seen, std::chrono::milliseconds(20));
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace trainrun::collectives::internal {

// ShmSegment owns one shared mapping (and, on the creating rank, the memfd until Release).
class ShmSegment {
 public:
  ShmSegment() = default;
  ShmSegment(ShmSegment&& other) noexcept { *this = std::move(other); }
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ~ShmSegment();

  // Create makes a zero-filled anonymous segment of `bytes` bytes and maps it. Throws IoError.
  static ShmSegment Create(size_t bytes);
  // Open maps the segment that process `pid` holds as descriptor `fd`, as seen through this
  // process's /proc. Throws IoError (naming the path) when it cannot be opened or is not `bytes`
  // long.
  static ShmSegment Open(pid_t pid, int fd, size_t bytes);

  char* data() const { return static_cast<char*>(data_); }
  size_t bytes() const { return bytes_; }
  // fd is the creator's descriptor (for peers to open), -1 after CloseFd or on an opened segment.
  int fd() const { return fd_; }
  // CloseFd closes the creator's descriptor once every peer has mapped the segment; the mapping
  // stays.
  void CloseFd();

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  int fd_ = -1;
};

// FutexWait sleeps while `*word == expected`, at most `timeout` (or until woken; spurious returns
// are possible). Works across processes on a MAP_SHARED mapping.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds timeout);
// FutexWakeAll wakes every waiter on `word`.
void FutexWakeAll(std::atomic<uint32_t>* word);

// RandomNonce returns `bytes` bytes from the kernel's random source, hex-encoded.
std::string RandomNonce(size_t bytes);

// ProcessWatch tells whether a process has ended (exited or killed, reaped or not), through a
// pidfd; Alive() is cheap (one poll(2) with no wait).
class ProcessWatch {
 public:
  ProcessWatch() = default;
  explicit ProcessWatch(pid_t pid);
  ProcessWatch(ProcessWatch&& other) noexcept { *this = std::move(other); }
  ProcessWatch& operator=(ProcessWatch&& other) noexcept;
  ~ProcessWatch();

  bool Alive() const;
  // fd is the pidfd (readable once the process has ended), or -1 when the kernel has none.
  int fd() const { return pidfd_; }

 private:
  pid_t pid_ = 0;
  int pidfd_ = -1;
};

}  // namespace trainrun::collectives::internal
