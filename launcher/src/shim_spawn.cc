#include "shim_spawn.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "posix/unique_fd.h"
#include "rank_shim.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TRAINRUN_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define TRAINRUN_SANITIZED 1
#endif
#endif
#if !defined(TRAINRUN_SANITIZED) && (defined(__x86_64__) || defined(__aarch64__))
#define TRAINRUN_CLONE_SPAWN 1
#endif
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif

namespace trainrun::launcher::internal {
namespace {

constexpr size_t kChildStack = 64 * 1024;

absl::Status ErrnoStatus(int error, const char* what) {
  return absl::Status(absl::ErrnoToStatusCode(error),
                      absl::StrCat(what, ": ", std::strerror(error)));
}

// ShimCpus is the shim's CPUS argument: "0,2,5", or "" for no binding.
std::string ShimCpus(const std::vector<int>& cpus) {
  std::string text;
  for (int cpu : cpus) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) continue;
    if (!text.empty()) text += ',';
    text += std::to_string(cpu);
  }
  return text;
}

#ifdef TRAINRUN_CLONE_SPAWN
// RawSyscall is a system call without libc: it returns -errno and writes no errno (the child shares
// this thread's TLS, so libc's errno in the child would be this thread's).
inline long RawSyscall(long number, long a = 0, long b = 0, long c = 0) {
#if defined(__x86_64__)
  long result;
  asm volatile("syscall"
               : "=a"(result)
               : "a"(number), "D"(a), "S"(b), "d"(c)
               : "rcx", "r11", "memory");
  return result;
#else
  register long x8 asm("x8") = number;
  register long x0 asm("x0") = a;
  register long x1 asm("x1") = b;
  register long x2 asm("x2") = c;
  asm volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2) : "memory");
  return x0;
#endif
}

// SpawnChild runs in the clone, on its own stack, sharing this process's memory: raw system calls
// only. The sources in `fds` are all >= 4, so no dup3 overwrites a later one's source.
int SpawnChild(void* arg) {
  const ShimSpawn::Child& child = *static_cast<const ShimSpawn::Child*>(arg);
  for (long target = 0; target < 4; ++target) {
    RawSyscall(SYS_dup3, child.fds[target], target, 0);
  }
  const long error =
      RawSyscall(SYS_execve, reinterpret_cast<long>(child.path), reinterpret_cast<long>(child.argv),
                 reinterpret_cast<long>(child.envp));
  timespec now{};
  RawSyscall(SYS_clock_gettime, CLOCK_MONOTONIC, reinterpret_cast<long>(&now));
  const ShimRecord record{ShimRecord::kExecFailed, static_cast<int32_t>(-error),
                          int64_t{now.tv_sec} * 1000000000 + now.tv_nsec};
  RawSyscall(SYS_write, 3, reinterpret_cast<long>(&record), sizeof(record));
  for (;;) RawSyscall(SYS_exit, 127);
}

// UnderValgrind says whether this process runs on Valgrind, which refuses a clone that shares
// memory without CLONE_VFORK ("Unsupported clone() flags: 0x111") but supports posix_spawn's.
bool UnderValgrind() {
#ifdef RUNNING_ON_VALGRIND
  if (RUNNING_ON_VALGRIND) return true;
#endif
  // Without valgrind.h: Valgrind preloads its core into every process it runs.
  const char* preload = std::getenv("LD_PRELOAD");
  return preload != nullptr && std::strstr(preload, "vgpreload_core") != nullptr;
}
#endif

// PosixSpawn starts `spawn`'s shim with posix_spawn (the fallback where clone cannot be used).
absl::Status PosixSpawn(ShimSpawn::Child& child, pid_t& pid_out) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  for (int target = 0; target < 4; ++target) {
    posix_spawn_file_actions_adddup2(&actions, child.fds[target], target);
  }
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t all;
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attributes, &all);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int error = posix_spawn(&pid, child.path, &actions, &attributes, child.argv, child.envp);
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  if (error == EAGAIN || error == ENOMEM) return ErrnoStatus(error, "posix_spawn");
  if (error != 0) {
    // The shim's execve failed (posix_spawn reports it here). Do as the clone's child does: a
    // child that reports the exec failure on the status pipe and exits 127, so that both paths
    // end such a rank alike (not executed, said once).
    pid = fork();
    if (pid < 0) return ErrnoStatus(errno, "fork");
    if (pid == 0) {
      timespec now{};
      clock_gettime(CLOCK_MONOTONIC, &now);
      const ShimRecord record{ShimRecord::kExecFailed, static_cast<int32_t>(error),
                              int64_t{now.tv_sec} * 1000000000 + now.tv_nsec};
      [[maybe_unused]] ssize_t written = write(child.fds[3], &record, sizeof(record));
      _exit(127);
    }
  }
  pid_out = pid;
  return absl::OkStatus();
}

}  // namespace

ShimSpawn::~ShimSpawn() {
  if (stack_ != nullptr) munmap(stack_, kChildStack);
}

absl::StatusOr<std::unique_ptr<ShimSpawn>> ShimSpawn::Start(const std::string& shim,
                                                            const ProcessSpec& spec,
                                                            const std::array<int, 4>& fds) {
  std::unique_ptr<ShimSpawn> spawn(new ShimSpawn());
  // Sources below 4 could be overwritten by an earlier dup of the four: copy them higher first.
  std::array<posix::UniqueFd, 4> copies;
  spawn->fds_ = fds;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i] >= 4) continue;
    copies[i].Reset(fcntl(fds[i], F_DUPFD_CLOEXEC, 4));
    if (copies[i].get() < 0) return ErrnoStatus(errno, "dup");
    spawn->fds_[i] = copies[i].get();
  }
  // trainrun-rank-shim PARENT CPUS CWD EXECUTABLE ARGV0 [ARGS...] (rank_shim_main.cc)
  spawn->path_ = shim;
  spawn->args_ = {shim, std::to_string(getpid()), ShimCpus(spec.cpus), spec.cwd, spec.executable};
  spawn->args_.insert(spawn->args_.end(), spec.argv.begin(), spec.argv.end());
  for (const std::string& arg : spawn->args_)
    spawn->argv_.push_back(const_cast<char*>(arg.c_str()));
  spawn->argv_.push_back(nullptr);
  spawn->env_ = spec.env;  // the caller's spec may be gone before the clone reads it
  for (const std::string& var : spawn->env_) spawn->envp_.push_back(const_cast<char*>(var.c_str()));
  spawn->envp_.push_back(nullptr);

  spawn->child_ = {spawn->path_.c_str(), spawn->argv_.data(), spawn->envp_.data(),
                   spawn->fds_.data()};
#ifdef TRAINRUN_CLONE_SPAWN
  if (!UnderValgrind()) {
    void* stack = mmap(nullptr, kChildStack, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK | MAP_NORESERVE, -1, 0);
    if (stack == MAP_FAILED) return ErrnoStatus(errno, "mmap");
    spawn->stack_ = stack;
    // Every signal stays blocked in the child (and, through execve, in the shim, which takes them
    // with sigwaitinfo); none of this process's handlers can run on the child's stack.
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    const pid_t pid = clone(SpawnChild, static_cast<char*>(stack) + kChildStack, CLONE_VM | SIGCHLD,
                            &spawn->child_);
    const int clone_errno = errno;
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    if (pid < 0) return ErrnoStatus(clone_errno, "clone");
    spawn->pid_ = pid;
    return spawn;
  }
#endif
  if (absl::Status started = PosixSpawn(spawn->child_, spawn->pid_); !started.ok()) return started;
  return spawn;
}

}  // namespace trainrun::launcher::internal
