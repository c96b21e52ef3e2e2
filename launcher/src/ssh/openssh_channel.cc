// --ssh-client openssh: the system `ssh` binary carries the channel, its stdin and stdout being the
// remote command's. Everything `ssh` supports then works (ProxyJump, certificates, Kerberos, RSA
// keys with SHA-2 signatures); what we lose is an early, precise error: `ssh` connects in the
// background, so a failure shows up as its exit (status 255) and what it printed, which EndStatus
// turns into the same one-line reasons as the libssh2 client gives.
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "ssh/remote_channel.h"
#include "ssh/tcp_connect.h"

namespace trainrun::launcher::ssh {
namespace {

constexpr size_t kStderrTailBytes = 4096;
constexpr int kServerAliveIntervalSeconds = 10;

bool FileExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string PasswdSshDirectory() {
  const passwd* pw = getpwuid(getuid());
  return pw != nullptr && pw->pw_dir != nullptr ? std::string(pw->pw_dir) + "/.ssh" : "";
}

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

std::vector<std::string> SshArguments(const SshTarget& target, const std::string& command,
                                      const SshOptions& options) {
  int64_t connect_seconds = std::max<int64_t>(1, absl::ToInt64Seconds(options.connect_timeout));
  std::vector<std::string> args = {
      options.ssh_binary,
      "-T",  // no terminal: the channel carries binary frames
      "-x",
      "-a",
      "-o",
      "BatchMode=yes",
      "-o",
      absl::StrCat("StrictHostKeyChecking=", HostKeyPolicyName(options.host_key_policy)),
      "-o",
      absl::StrCat("ConnectTimeout=", connect_seconds),
      "-o",
      absl::StrCat("ServerAliveInterval=", kServerAliveIntervalSeconds),
      "-o",
      "ServerAliveCountMax=3",
      "-o",
      "LogLevel=ERROR",
      "-p",
      std::to_string(target.port),
      "-l",
      target.user,
  };
  // `ssh` reads the passwd entry's ~/.ssh; when trainrun was pointed elsewhere (HOME, tests), hand
  // it the same config, known_hosts and default keys that the libssh2 client would use.
  std::string ssh_dir = SshDirectory(options);
  bool elsewhere = ssh_dir != PasswdSshDirectory();
  if (elsewhere) {
    if (!target.config_file.empty()) {
      args.insert(args.end(), {"-F", target.config_file});
    } else {
      args.insert(args.end(), {"-F", "/dev/null"});
    }
    args.insert(args.end(), {"-o", "UserKnownHostsFile=" + target.known_hosts_file});
  }
  if (options.identity_file) args.insert(args.end(), {"-i", *options.identity_file});
  if (elsewhere && target.default_identities) {
    for (const std::string& key : target.identity_files) {
      if (FileExists(key)) args.insert(args.end(), {"-i", key});
    }
  }
  // The alias, not the resolved name, so that the rest of the user's config applies.
  args.push_back(target.alias);
  args.push_back("--");
  args.push_back(command);
  return args;
}

// Turns what `ssh` printed when it failed into one line with the reason.
absl::Status DescribeSshFailure(const SshTarget& target, const std::string& output) {
  std::string where = absl::StrCat("host ", target.alias);
  std::string said(absl::StripTrailingAsciiWhitespace(output));
  size_t last_newline = said.rfind('\n');
  std::string last_line = last_newline == std::string::npos ? said : said.substr(last_newline + 1);
  if (absl::StrContains(said, "Could not resolve hostname")) {
    return absl::NotFoundError(absl::StrCat(where, ": name not resolved (ssh: ", last_line,
                                            "); check the name in -H/--hostfile"));
  }
  if (absl::StrContains(said, "Connection refused")) {
    return absl::UnavailableError(absl::StrCat(
        where, ": connection refused (ssh: ", last_line,
        "); check that sshd runs there and the port (-p/--ssh-port, Port in ~/.ssh/config)"));
  }
  if (absl::StrContains(said, "timed out")) {
    return absl::DeadlineExceededError(
        absl::StrCat(where, ": timed out connecting (ssh: ", last_line,
                     "); check that the host is up and reachable, or raise --start-timeout"));
  }
  if (absl::StrContains(said, "REMOTE HOST IDENTIFICATION HAS CHANGED") ||
      absl::StrContains(said, "Host key verification failed")) {
    bool changed = absl::StrContains(said, "HAS CHANGED");
    return absl::PermissionDeniedError(absl::StrCat(
        where, changed ? ": host key mismatch" : ": host key unknown or not verified",
        " (ssh: ", last_line, "); check ", target.known_hosts_file,
        changed ? " and remove the old key with ssh-keygen -R if the host was reinstalled" : ""));
  }
  if (absl::StrContains(said, "Permission denied")) {
    return absl::PermissionDeniedError(
        absl::StrCat(where, ": authentication failed for user ", target.user, " (ssh: ", last_line,
                     "); check the host's ~/.ssh/authorized_keys, or pass -i/--ssh-identity-file"));
  }
  return absl::UnavailableError(
      absl::StrCat(where, ": ssh failed: ", said.empty() ? "no message" : last_line));
}

class OpensshChannel final : public RemoteChannel {
 public:
  OpensshChannel(SshTarget target, pid_t pid, UniqueFd in, UniqueFd out, UniqueFd err,
                 std::string local_address, std::string remote_address)
      : target_(std::move(target)),
        pid_(pid),
        stdin_(std::move(in)),
        stdout_(std::move(out)),
        stderr_(std::move(err)),
        wake_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
        local_address_(std::move(local_address)),
        remote_address_(std::move(remote_address)) {}

  ~OpensshChannel() override {
    {
      std::lock_guard<std::mutex> lock(write_mu_);
      stdin_.Reset();
    }
    if (!exit_status_) {
      ::kill(pid_, SIGTERM);
      Reap(absl::Now() + absl::Seconds(2));
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
            absl::StrCat("host ", target_.alias, ": ssh stopped reading: ", std::strerror(errno)));
      }
      pollfd p{stdin_.get(), POLLOUT, 0};
      int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
      if (ms <= 0 || ::poll(&p, 1, static_cast<int>(ms)) == 0) {
        return absl::DeadlineExceededError(
            absl::StrCat("host ", target_.alias, ": timed out sending to the remote command"));
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
        return absl::DeadlineExceededError(absl::StrCat(
            "host ", target_.alias, ": nothing received for ", absl::FormatDuration(timeout)));
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
    // ssh's stderr closes when it exits; collect the rest, then its status.
    absl::Time deadline = absl::Now() + absl::Seconds(2);
    while (stderr_ && absl::Now() < deadline) {
      pollfd p{stderr_.get(), POLLIN, 0};
      if (::poll(&p, 1, 100) > 0) DrainStderr();
    }
    Reap(deadline);
    std::string tail(absl::StripTrailingAsciiWhitespace(stderr_tail_));
    if (!exit_status_) {
      return absl::UnavailableError(
          absl::StrCat("host ", target_.alias, ": the connection ended but ssh did not exit"));
    }
    int status = *exit_status_;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 255) {
      return DescribeSshFailure(target_, stderr_tail_);
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
      return absl::AbortedError(absl::StrCat("host ", target_.alias,
                                             ": the remote command exited with status ",
                                             WEXITSTATUS(status), tail.empty() ? "" : ": ", tail));
    }
    if (WIFSIGNALED(status)) {
      return absl::AbortedError(
          absl::StrCat("host ", target_.alias, ": ssh was killed by signal ", WTERMSIG(status)));
    }
    return absl::OkStatus();
  }

  std::string LocalAddress() const override { return local_address_; }
  std::string RemoteAddress() const override { return remote_address_; }

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

  const SshTarget target_;
  const pid_t pid_;
  std::mutex write_mu_;
  UniqueFd stdin_;
  UniqueFd stdout_;
  UniqueFd stderr_;
  UniqueFd wake_;
  std::atomic<bool> interrupted_{false};
  std::string stderr_tail_;
  std::optional<int> exit_status_;
  const std::string local_address_;
  const std::string remote_address_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RemoteChannel>> OpenOpensshCommand(const SshTarget& target,
                                                                  const std::string& command,
                                                                  const SshOptions& options) {
  std::vector<std::string> args = SshArguments(target, command, options);
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
    // Only async-signal-safe calls until exec. ssh dies with us, so no connection outlives the
    // launcher (the remote agent then sees end-of-file and tears its ranks down).
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(255);
    ::dup2(in_read.get(), 0);
    ::dup2(out_write.get(), 1);
    ::dup2(err_write.get(), 2);
    ::execvp(argv[0], argv.data());
    const char message[] = "ssh: cannot execute the ssh binary\n";
    [[maybe_unused]] ssize_t n = ::write(2, message, sizeof message - 1);
    ::_exit(255);
  }
  ::fcntl(in_write.get(), F_SETFL, O_NONBLOCK);
  ::fcntl(out_read.get(), F_SETFL, O_NONBLOCK);
  ::fcntl(err_read.get(), F_SETFL, O_NONBLOCK);
  // `ssh` connects on its own; the addresses are those of the route toward the config's HostName.
  RouteAddresses route = RouteToHost(target.hostname, absl::Now() + absl::Seconds(2));
  return std::unique_ptr<RemoteChannel>(std::make_unique<OpensshChannel>(
      target, pid, std::move(in_write), std::move(out_read), std::move(err_read),
      std::move(route.local), std::move(route.remote)));
}

}  // namespace trainrun::launcher::ssh
