#include "rank_shim.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>

// Everything below runs in a forked child of a multithreaded process: async-signal-safe system
// calls only — no allocation, no locks, no stdio, no C++ exceptions.

namespace trainrun::launcher::internal {
namespace {

static_assert(kShimKillSignal == SIGUSR1);

int64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// Proxy to write(2) of one whole record (smaller than PIPE_BUF, so atomic), with EINTR retry.
void WriteRecord(int fd, ShimRecord::Kind kind, int32_t value, int64_t time_ns) {
  ShimRecord record{kind, value, time_ns};
  while (write(fd, &record, sizeof(record)) < 0 && errno == EINTR) {
  }
}

// Closes every fd from `first` up: close_range(2) where the kernel has it, else by listing
// /proc/self/fd with getdents64 (no opendir: it allocates).
void CloseFrom(int first) {
  if (syscall(SYS_close_range, first, ~0U, 0) == 0) return;
  for (;;) {
    int dir = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) return;
    int to_close[256];
    int count = 0;
    alignas(8) char buffer[4096];
    long n;
    while (count < 256 && (n = syscall(SYS_getdents64, dir, buffer, sizeof(buffer))) > 0) {
      for (long offset = 0; offset < n && count < 256;) {
        const char* name = buffer + offset + 19;  // linux_dirent64: ino(8) off(8) reclen(2) type(1)
        unsigned short reclen;
        __builtin_memcpy(&reclen, buffer + offset + 16, sizeof(reclen));
        offset += reclen;
        int fd = 0;
        bool numeric = *name != '\0';
        for (const char* c = name; *c != '\0'; ++c) {
          if (*c < '0' || *c > '9')
            numeric = false;
          else
            fd = fd * 10 + (*c - '0');
        }
        if (numeric && fd >= first && fd != dir) to_close[count++] = fd;
      }
    }
    close(dir);
    if (count == 0) return;
    for (int i = 0; i < count; ++i) close(to_close[i]);
  }
}

// Moves the four fds to 0..3 (sources may overlap targets), then closes everything above.
void ArrangeFds(const ShimArgs& args) {
  const int sources[4] = {args.stdin_fd, args.stdout_fd, args.stderr_fd, args.status_fd};
  int high[4];
  for (int i = 0; i < 4; ++i) high[i] = fcntl(sources[i], F_DUPFD, 16);
  for (int i = 0; i < 4; ++i) dup2(high[i], i);
  CloseFrom(4);
}

// Sends `signal` to every direct child of this process (those reparented to it included), read
// from /proc/thread-self/children. Returns the number signalled.
int SignalChildren(int signal) {
  int fd = open("/proc/thread-self/children", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buffer[4096];
  int signalled = 0;
  long pid = 0;
  bool in_number = false;
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) {
    for (ssize_t i = 0; i < n; ++i) {
      char c = buffer[i];
      if (c >= '0' && c <= '9') {
        pid = pid * 10 + (c - '0');
        in_number = true;
      } else if (in_number) {
        kill(static_cast<pid_t>(pid), signal);
        ++signalled;
        pid = 0;
        in_number = false;
      }
    }
  }
  if (in_number) {
    kill(static_cast<pid_t>(pid), signal);
    ++signalled;
  }
  close(fd);
  return signalled;
}

// Kills the command's group and every descendant that ends up as our child, until none is left.
// Returns the command's wait status if it is reaped here.
void KillEverything(pid_t command, bool* command_reaped, int* command_status,
                    int64_t* command_time) {
  for (;;) {
    kill(-command, SIGKILL);
    SignalChildren(SIGKILL);
    int status = 0;
    pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      return;  // ECHILD: nothing left
    }
    if (pid == command && !*command_reaped) {
      *command_reaped = true;
      *command_status = status;
      *command_time = MonotonicNs();
    }
  }
}

// Starts the command; returns its pid, or -errno when it could not be executed. vfork: the child
// borrows this process's memory until its execve, so there is no copy of anything to make, and an
// exec failure comes back through `error` (written by the child before it exits) with no pipe.
pid_t StartCommand(const ShimArgs& args, pid_t shim) {
  volatile int error = 0;
  pid_t pid = vfork();
  if (pid < 0) return -errno;
  if (pid == 0) {
    setpgid(0, 0);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int signal = 1; signal < NSIG; ++signal) sigaction(signal, &dfl, nullptr);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != shim) _exit(127);
    close(3);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    // --bind-to and --wdir; a failure is reported as the exec's (the launcher checked both).
    int failure = 0;
    if (args.cpus != nullptr && sched_setaffinity(0, sizeof(cpu_set_t), args.cpus) != 0) {
      failure = errno;
    }
    if (failure == 0 && args.cwd != nullptr && chdir(args.cwd) != 0) failure = errno;
    if (failure == 0) execve(args.executable, args.argv, args.envp);
    error = failure == 0 ? errno : failure;
    _exit(127);
  }
  // The child has exec'd or exited by now. Also set from here, so that the group exists before we
  // might signal it (EACCES once it has exec'd, when it set the group itself).
  setpgid(pid, pid);
  if (error != 0) {
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return -error;
  }
  return pid;
}

}  // namespace

void RunRankShim(const ShimArgs& args) {
  // All signals stay blocked (trainrun blocked them before forking); the shim takes them with
  // sigwaitinfo, and the command unblocks them before execve.
  //
  // A process group of its own, out of the terminal's signals, but in trainrun's session: with
  // scheduler autogroups (CONFIG_SCHED_AUTOGROUP, on by default) every session is a task group of
  // its own, and ranks in separate groups do not hand a shared core to each other by sched_yield.
  // 4 ranks on 2 cores, each in a session of its own, took 14-17 µs per small shared-memory
  // allreduce (their yields failed, so they slept on futexes) against Open MPI's 6 µs (mpirun's
  // ranks share its session); in one session, 4-6 µs.
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, kShimKillSignal);
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  ArrangeFds(args);
  if (getppid() != args.parent) _exit(1);  // trainrun died before PDEATHSIG was armed

  const pid_t shim = getpid();
  pid_t command = StartCommand(args, shim);
  if (command < 0) {
    WriteRecord(3, ShimRecord::kExecFailed, -command, MonotonicNs());
    _exit(0);
  }
  WriteRecord(3, ShimRecord::kStarted, command, MonotonicNs());

  sigset_t all;
  sigfillset(&all);
  bool reaped = false;
  int status = 0;
  int64_t time_ns = 0;
  while (!reaped) {
    siginfo_t info;
    int signal = sigwaitinfo(&all, &info);
    if (signal == SIGCHLD) {
      int child_status = 0;
      pid_t pid;
      while ((pid = waitpid(-1, &child_status, WNOHANG)) > 0) {
        if (pid == command) {
          reaped = true;
          status = child_status;
          time_ns = MonotonicNs();
        }
      }
    } else if (signal == SIGTERM) {
      // A stopped process keeps SIGTERM pending until it runs again: wake it, as systemd does,
      // so that a stalled (SIGSTOPped) rank ends now rather than at the grace period's SIGKILL.
      kill(-command, SIGTERM);
      kill(-command, SIGCONT);
    } else if (signal == kShimKillSignal) {
      break;
    }
  }
  KillEverything(command, &reaped, &status, &time_ns);
  WriteRecord(3, ShimRecord::kExited, status, time_ns);
  _exit(0);
}

}  // namespace trainrun::launcher::internal
