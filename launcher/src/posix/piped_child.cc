#include "posix/piped_child.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace trainrun::launcher::posix {
namespace {

constexpr size_t kStderrTailBytes = 4096;

// Writes to a pipe whose reader may be gone, getting EPIPE instead of a SIGPIPE that would end
// trainrun: SIGPIPE is blocked in this thread for the write and a pending one taken back.
ssize_t WriteWithoutSigpipe(int fd, absl::string_view data) {
  sigset_t pipe_set, old_set, pending;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  sigpending(&pending);
  bool was_pending = sigismember(&pending, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);
  ssize_t n = ::write(fd, data.data(), data.size());
  int saved_errno = errno;
  if (n < 0 && errno == EPIPE && !was_pending) {
    timespec zero{};
    sigtimedwait(&pipe_set, nullptr, &zero);
  }
  pthread_sigmask(SIG_SETMASK, &old_set, nullptr);
  errno = saved_errno;
  return n;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PipedChild>> PipedChild::Start(Options options) {
  std::vector<std::string> args = options.argv;
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const std::string exec_failure = options.exec_failure + "\n";
  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return absl::InternalError(std::strerror(errno));
  UniqueFd in_read(in[0]), in_write(in[1]);
  if (::pipe2(out, O_CLOEXEC) != 0) return absl::InternalError(std::strerror(errno));
  UniqueFd out_read(out[0]), out_write(out[1]);
  if (::pipe2(err, O_CLOEXEC) != 0) return absl::InternalError(std::strerror(errno));
  UniqueFd err_read(err[0]), err_write(err[1]);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    // Only async-signal-safe calls until exec. The child dies with us, so nothing it started (a
    // connection, a job step) outlives the launcher.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(255);
    ::dup2(in_read.get(), 0);
    ::dup2(out_write.get(), 1);
    ::dup2(err_write.get(), 2);
    ::execvp(argv[0], argv.data());
    [[maybe_unused]] ssize_t n = ::write(2, exec_failure.data(), exec_failure.size());
    ::_exit(options.exec_failure_status);
  }
  ::fcntl(in_write.get(), F_SETFL, O_NONBLOCK);
  ::fcntl(out_read.get(), F_SETFL, O_NONBLOCK);
  ::fcntl(err_read.get(), F_SETFL, O_NONBLOCK);
  return std::unique_ptr<PipedChild>(new PipedChild(std::move(options), pid, std::move(in_write),
                                                    std::move(out_read), std::move(err_read)));
}

PipedChild::PipedChild(Options options, pid_t pid, UniqueFd in, UniqueFd out, UniqueFd err)
    : options_(std::move(options)),
      pid_(pid),
      stdin_(std::move(in)),
      stdout_(std::move(out)),
      stderr_(std::move(err)),
      wake_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

PipedChild::~PipedChild() {
  CloseStdin();
  if (exit_status_) return;
  ::kill(pid_, SIGTERM);
  Reap(absl::Now() + options_.grace);
  if (!exit_status_) {
    ::kill(pid_, SIGKILL);
    int status;
    ::waitpid(pid_, &status, 0);
  }
}

absl::Status PipedChild::Write(absl::string_view data, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  std::lock_guard<std::mutex> lock(write_mu_);
  while (!data.empty()) {
    if (!stdin_) return absl::FailedPreconditionError("stdin already closed");
    ssize_t n = WriteWithoutSigpipe(stdin_.get(), data);
    if (n > 0) {
      data.remove_prefix(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN) {
      return absl::UnavailableError(absl::StrCat(options_.where, ": ", options_.program,
                                                 " stopped reading: ", std::strerror(errno)));
    }
    pollfd p{stdin_.get(), POLLOUT, 0};
    int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0 || ::poll(&p, 1, static_cast<int>(ms)) == 0) {
      return absl::DeadlineExceededError(
          absl::StrCat(options_.where, ": timed out sending to ", options_.peer));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> PipedChild::Read(char* buffer, size_t size, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    if (interrupted_.load()) return absl::CancelledError("interrupted");
    if (!stdout_) return size_t{0};
    pollfd fds[3] = {{stdout_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}, {-1, POLLIN, 0}};
    if (stderr_) fds[2].fd = stderr_.get();
    int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) {
      return absl::DeadlineExceededError(
          absl::StrCat(options_.where, ": nothing received for ", absl::FormatDuration(timeout)));
    }
    int ready = ::poll(fds, 3, static_cast<int>(std::min<int64_t>(ms, 1 << 30)));
    if (ready < 0 && errno != EINTR) return absl::InternalError(std::strerror(errno));
    if (fds[2].revents != 0) DrainStderr();
    if (fds[0].revents != 0) {
      ssize_t n = ::read(stdout_.get(), buffer, size);
      if (n > 0) return static_cast<size_t>(n);
      if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        stdout_.Reset();
        return size_t{0};
      }
    }
  }
}

void PipedChild::Interrupt() {
  interrupted_.store(true);
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof one);
}

void PipedChild::CloseStdin() {
  std::lock_guard<std::mutex> lock(write_mu_);
  stdin_.Reset();
}

std::optional<int> PipedChild::Finish() {
  absl::Time deadline = absl::Now() + options_.grace;
  while (stderr_ && absl::Now() < deadline) {
    pollfd p{stderr_.get(), POLLIN, 0};
    if (::poll(&p, 1, 100) > 0) DrainStderr();
  }
  Reap(deadline);
  return exit_status_;
}

void PipedChild::DrainStderr() {
  char chunk[1024];
  ssize_t n = ::read(stderr_.get(), chunk, sizeof chunk);
  if (n <= 0) {
    if (n == 0 || (errno != EAGAIN && errno != EINTR)) stderr_.Reset();
    return;
  }
  stderr_tail_.append(chunk, n);
  if (stderr_tail_.size() > kStderrTailBytes) {
    stderr_tail_.erase(0, stderr_tail_.size() - kStderrTailBytes);
  }
}

void PipedChild::Reap(absl::Time deadline) {
  while (!exit_status_) {
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exit_status_ = status;
      return;
    }
    if (r < 0 || absl::Now() >= deadline) return;
    ::usleep(10000);
  }
}

}  // namespace trainrun::launcher::posix
