// --ssh-client openssh: the system `ssh` binary carries the channel, its stdin and stdout being the
// remote command's. Everything `ssh` supports then works (ProxyJump, certificates, Kerberos, RSA
// keys with SHA-2 signatures); what we lose is an early, precise error: `ssh` connects in the
// background, so a failure shows up as its exit (status 255) and what it printed, which EndStatus
// turns into the same one-line reasons as the libssh2 client gives.
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "posix/piped_child.h"
#include "ssh/remote_channel.h"
#include "ssh/tcp_connect.h"

namespace trainrun::launcher::ssh {
namespace {

constexpr int kServerAliveIntervalSeconds = 10;

bool FileExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string PasswdSshDirectory() {
  const passwd* pw = getpwuid(getuid());
  return pw != nullptr && pw->pw_dir != nullptr ? std::string(pw->pw_dir) + "/.ssh" : "";
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
  OpensshChannel(SshTarget target, std::unique_ptr<posix::PipedChild> ssh,
                 std::string local_address, std::string remote_address)
      : target_(std::move(target)),
        ssh_(std::move(ssh)),
        local_address_(std::move(local_address)),
        remote_address_(std::move(remote_address)) {}

  absl::Status Write(absl::string_view data, absl::Duration timeout) override {
    return ssh_->Write(data, timeout);
  }
  absl::StatusOr<size_t> Read(char* buffer, size_t size, absl::Duration timeout) override {
    return ssh_->Read(buffer, size, timeout);
  }
  void Interrupt() override { ssh_->Interrupt(); }
  void CloseStdin() override { ssh_->CloseStdin(); }

  absl::Status EndStatus() override {
    // ssh's stderr closes when it exits; collect the rest, then its status.
    std::optional<int> exit_status = ssh_->Finish();
    std::string tail(absl::StripTrailingAsciiWhitespace(ssh_->stderr_tail()));
    if (!exit_status) {
      return absl::UnavailableError(
          absl::StrCat("host ", target_.alias, ": the connection ended but ssh did not exit"));
    }
    int status = *exit_status;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 255) {
      return DescribeSshFailure(target_, ssh_->stderr_tail());
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
  const SshTarget target_;
  // Dropping it closes the remote command's stdin and ends ssh (SIGTERM, then SIGKILL).
  const std::unique_ptr<posix::PipedChild> ssh_;
  const std::string local_address_;
  const std::string remote_address_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RemoteChannel>> OpenOpensshCommand(const SshTarget& target,
                                                                  const std::string& command,
                                                                  const SshOptions& options) {
  posix::PipedChild::Options child;
  child.argv = SshArguments(target, command, options);
  child.exec_failure = "ssh: cannot execute the ssh binary";
  child.where = absl::StrCat("host ", target.alias);
  child.program = "ssh";
  child.peer = "the remote command";
  // ssh dies with us, so no connection outlives the launcher (the remote agent then sees
  // end-of-file and tears its ranks down).
  absl::StatusOr<std::unique_ptr<posix::PipedChild>> ssh =
      posix::PipedChild::Start(std::move(child));
  if (!ssh.ok()) return ssh.status();
  // `ssh` connects on its own; the addresses are those of the route toward the config's HostName.
  RouteAddresses route = RouteToHost(target.hostname, absl::Now() + absl::Seconds(2));
  return std::unique_ptr<RemoteChannel>(std::make_unique<OpensshChannel>(
      target, *std::move(ssh), std::move(route.local), std::move(route.remote)));
}

}  // namespace trainrun::launcher::ssh
