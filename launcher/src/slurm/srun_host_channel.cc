#include "slurm/srun_host_channel.h"

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
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "posix/unique_fd.h"
#include "ssh/tcp_connect.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::launcher::slurm {
namespace {

using posix::UniqueFd;
using ssh::RouteAddresses;

constexpr size_t kStderrTailBytes = 4096;

// As ssh/openssh_channel.cc's (a reader gone is EPIPE, not a signal); to move to posix/.
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

std::vector<std::string> SrunArguments(const std::string& host, const std::string& command) {
  return {"srun",
          "-u",
          "-N1",
          "-n1",
          "-w",
          host,
          "--kill-on-bad-exit=1",
          "--overlap",
          "--job-name=trainrun-agent",
          "sh",
          "-c",
          command};
}

// One host's agent: the srun process, its stdin (the agent's) and stdout (the agent's).
class SrunStream final : public channel::HostStream {
 public:
  SrunStream(std::string host, pid_t pid, UniqueFd in, UniqueFd out, UniqueFd err,
             RouteAddresses route)
      : host_(std::move(host)),
        pid_(pid),
        stdin_(std::move(in)),
        stdout_(std::move(out)),
        stderr_(std::move(err)),
        wake_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
        route_(std::move(route)) {}

  ~SrunStream() override {
    {
      std::lock_guard<std::mutex> lock(write_mu_);
      stdin_.Reset();
    }
    if (!exit_status_) {
      // SIGTERM makes srun cancel its step (the agent and its ranks with it).
      ::kill(pid_, SIGTERM);
      Reap(absl::Now() + absl::Seconds(5));
      if (!exit_status_) {
        ::kill(pid_, SIGKILL);
        int status;
        ::waitpid(pid_, &status, 0);
      }
    }
  }

  absl::Status Write(absl::string_view data, absl::Duration timeout) override {
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
        return absl::UnavailableError(
            absl::StrCat("host ", host_, ": srun stopped reading: ", std::strerror(errno)));
      }
      pollfd p{stdin_.get(), POLLOUT, 0};
      int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
      if (ms <= 0 || ::poll(&p, 1, static_cast<int>(ms)) == 0) {
        return absl::DeadlineExceededError(
            absl::StrCat("host ", host_, ": timed out sending to the agent's job step"));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<size_t> Read(char* buffer, size_t size, absl::Duration timeout) override {
    absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      if (interrupted_.load()) return absl::CancelledError("interrupted");
      if (!stdout_) return size_t{0};
      pollfd fds[3] = {{stdout_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}, {-1, POLLIN, 0}};
      if (stderr_) fds[2].fd = stderr_.get();
      int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
      if (ms <= 0) {
        return absl::DeadlineExceededError(
            absl::StrCat("host ", host_, ": nothing received for ", absl::FormatDuration(timeout)));
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

  void Interrupt() override {
    interrupted_.store(true);
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof one);
  }

  void CloseStdin() override {
    std::lock_guard<std::mutex> lock(write_mu_);
    stdin_.Reset();
  }

  absl::Status EndStatus() override {
    absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (stderr_ && absl::Now() < deadline) {
      pollfd p{stderr_.get(), POLLIN, 0};
      if (::poll(&p, 1, 100) > 0) DrainStderr();
    }
    Reap(deadline);
    std::string tail(absl::StripTrailingAsciiWhitespace(stderr_tail_));
    if (size_t newline = tail.rfind('\n'); newline != std::string::npos) {
      tail = tail.substr(newline + 1);
    }
    if (!exit_status_) {
      return absl::UnavailableError(
          absl::StrCat("host ", host_, ": the agent's job step ended but srun did not exit"));
    }
    int status = *exit_status_;
    if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
      if (std::string why = AllocationEnded(); !why.empty()) {
        return absl::AbortedError(
            absl::StrCat("host ", host_, ": ", why, ", so its job step (srun) ended"));
      }
      return absl::AbortedError(absl::StrCat("host ", host_, ": the agent's job step (srun) ",
                                             "ended with status ", WEXITSTATUS(status),
                                             tail.empty() ? "" : ": ", tail));
    }
    if (WIFSIGNALED(status)) {
      return absl::AbortedError(
          absl::StrCat("host ", host_, ": srun was killed by signal ", WTERMSIG(status)));
    }
    return absl::OkStatus();
  }

  std::string LocalAddress() const override { return route_.local; }
  std::string RemoteAddress() const override { return route_.remote; }

 private:
  void DrainStderr() {
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

  void Reap(absl::Time deadline) {
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

  const std::string host_;
  const pid_t pid_;
  std::mutex write_mu_;
  UniqueFd stdin_;
  UniqueFd stdout_;
  UniqueFd stderr_;
  UniqueFd wake_;
  std::atomic<bool> interrupted_{false};
  std::string stderr_tail_;
  std::optional<int> exit_status_;
  const RouteAddresses route_;
};

absl::StatusOr<std::unique_ptr<channel::HostStream>> StartStep(const std::string& host,
                                                               const std::string& command) {
  std::vector<std::string> args = SrunArguments(host, command);
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
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
    // srun dies with the launcher, and its step with it.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(255);
    ::dup2(in_read.get(), 0);
    ::dup2(out_write.get(), 1);
    ::dup2(err_write.get(), 2);
    ::execvp(argv[0], argv.data());
    const char message[] = "cannot execute srun (is Slurm's client on PATH?)\n";
    [[maybe_unused]] ssize_t n = ::write(2, message, sizeof message - 1);
    ::_exit(127);
  }
  ::fcntl(in_write.get(), F_SETFL, O_NONBLOCK);
  ::fcntl(out_read.get(), F_SETFL, O_NONBLOCK);
  ::fcntl(err_read.get(), F_SETFL, O_NONBLOCK);
  RouteAddresses route = ssh::RouteToHost(host, absl::Now() + absl::Seconds(2));
  return std::unique_ptr<channel::HostStream>(std::make_unique<SrunStream>(
      host, pid, std::move(in_write), std::move(out_read), std::move(err_read), std::move(route)));
}

class SrunHostChannel final : public channel::HostChannel {
 public:
  std::string Describe(const hostfile::HostSpec& host,
                       const std::string& agent_command) const override {
    return absl::StrCat("srun -u -N1 -n1 -w ", host.host,
                        " (this Slurm allocation); agent: ", agent_command);
  }

  void Start(const std::vector<hostfile::HostSpec>& hosts, const std::string& agent_command,
             absl::Time /*deadline*/, channel::StreamCallback on_stream) override {
    // srun is a child that dies with the thread that forked it (PR_SET_PDEATHSIG): fork here, on
    // the caller's thread, which outlives the job; each srun starts its step in the background.
    for (size_t i = 0; i < hosts.size(); ++i) {
      on_stream(static_cast<int>(i), StartStep(hosts[i].host, agent_command));
    }
  }
};

}  // namespace

std::unique_ptr<channel::HostChannel> MakeSrunHostChannel() {
  return std::make_unique<SrunHostChannel>();
}

// A step killed by the time limit, scancel or a node failure ends with status 143 like any other;
// only the controller knows which it was.
namespace {

// AllocationState: why job `job_id` ended, as scontrol says it now ("" while it runs).
std::string AllocationState(const std::string& job_id) {
  const std::string* job = &job_id;
  std::string command = absl::StrCat("timeout 2 scontrol show job -o ", *job, " 2>/dev/null");
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return "";
  std::string out;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.append(buffer, n);
  ::pclose(pipe);
  auto field = [&](absl::string_view name) -> std::string {
    size_t at = out.find(absl::StrCat(" ", name, "="));
    if (at == std::string::npos) return "";
    at += name.size() + 2;
    return out.substr(at, out.find_first_of(" \n", at) - at);
  };
  const std::string state = field("JobState");
  if (state == "TIMEOUT") {
    return absl::StrCat("Slurm job ", *job,
                        " reached its time limit (TimeLimit=", field("TimeLimit"), ")");
  }
  if (state == "CANCELLED") return absl::StrCat("Slurm job ", *job, " was cancelled (scancel)");
  if (state == "NODE_FAIL") return absl::StrCat("a node of Slurm job ", *job, " failed");
  if (state == "PREEMPTED") return absl::StrCat("Slurm job ", *job, " was preempted");
  return "";
}

}  // namespace

std::string AllocationEnded(absl::Duration settle) {
  std::optional<std::string> job = env::Lookup(env::kSlurmJobId);
  if (!job || job->empty() ||
      !std::all_of(job->begin(), job->end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return "";
  }
  const absl::Time give_up = absl::Now() + settle;
  for (;;) {
    std::string why = AllocationState(*job);
    if (!why.empty() || absl::Now() >= give_up) return why;
    absl::SleepFor(absl::Milliseconds(250));
  }
}

}  // namespace trainrun::launcher::slurm
