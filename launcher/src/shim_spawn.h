// ShimSpawn: starting trainrun-rank-shim (rank_shim.h) for one rank without waiting for it.
//
// posix_spawn is a vfork: the caller sleeps until the child has exec'd, and on a busy machine the
// child waits its turn for a CPU first, so a launcher starting ranks one after another waited
// ~10 ms per rank at a load of 6 on 2 cores, doing nothing. Here the child is a clone(CLONE_VM)
// without CLONE_VFORK, on a stack of its own: it shares this process's memory only to read the
// prepared argv and environment, makes four dup3s and an execve with raw system calls (no libc:
// no errno, no locks), and the caller goes on at once. What the child reads lives in the
// ShimSpawn, which the caller keeps until the shim has been reaped.
//
//   absl::StatusOr<std::unique_ptr<ShimSpawn>> spawn = ShimSpawn::Start(shim, spec, fds);
//   pid_t pid = (*spawn)->pid();   // the shim; keep *spawn until waitpid(pid) has reaped it
//
// An execve that fails in the child (E2BIG, ENOMEM) is written to the status fd as the shim would
// write its command's (ShimRecord kExecFailed), and the child exits 127. Where the raw system
// calls are not written (architectures other than x86-64 and AArch64), under the sanitizers
// (which cannot follow a child sharing their memory) and when this process runs on Valgrind (which
// refuses such a clone, "Unsupported clone() flags: 0x111"), Start uses posix_spawn instead.
#pragma once

#include <sys/types.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainrun/launcher/process_set.h"

namespace trainrun::launcher::internal {

class ShimSpawn {
 public:
  // Start starts `shim` for `spec` with `fds` (stdin, stdout, stderr, status) as its 0..3 and
  // every signal blocked. An error only when no process could be made.
  static absl::StatusOr<std::unique_ptr<ShimSpawn>> Start(const std::string& shim,
                                                          const ProcessSpec& spec,
                                                          const std::array<int, 4>& fds);
  ~ShimSpawn();
  ShimSpawn(const ShimSpawn&) = delete;
  ShimSpawn& operator=(const ShimSpawn&) = delete;

  pid_t pid() const { return pid_; }

 private:
  ShimSpawn() = default;

  pid_t pid_ = -1;
  // What the child reads until its execve (kept until the shim is reaped).
  std::string path_;
  std::vector<std::string> args_;
  std::vector<std::string> env_;
  std::vector<char*> argv_;
  std::vector<char*> envp_;
  std::array<int, 4> fds_{};
  void* stack_ = nullptr;

 public:
  // Child is what the clone reads: pointers into the members above.
  struct Child {
    const char* path;
    char* const* argv;
    char* const* envp;
    const int* fds;
  };

 private:
  Child child_{};
};

}  // namespace trainrun::launcher::internal
