#include "trainrun/launcher/host_discovery.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "trainrun/hostfile/host_list.h"
#include "trainrun/hostfile/slot_plan.h"

extern char** environ;

namespace trainrun::launcher {
namespace {

absl::Status BadLine(absl::string_view script, int number, absl::string_view line,
                     absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("the host discovery script '", script,
                                                 "' printed \"", line, "\" on line ", number, ": ",
                                                 why, "; each line must be host or host:slots"));
}

}  // namespace

absl::StatusOr<std::vector<hostfile::HostSpec>> ParseDiscoveryOutput(absl::string_view script,
                                                                     absl::string_view output,
                                                                     int default_slots) {
  std::vector<hostfile::HostSpec> hosts;
  std::set<std::string> seen;
  int number = 0;
  for (absl::string_view raw : absl::StrSplit(output, '\n')) {
    ++number;
    absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty() || line[0] == '#') continue;
    // The -H entry's grammar and checks: [user@]host[:slots], [IPv6]:slots.
    absl::StatusOr<hostfile::HostSpec> host = hostfile::ParseHostEntry(line, default_slots);
    if (!host.ok()) return BadLine(script, number, line, host.status().message());
    if (!seen.insert(host->host).second) {
      return BadLine(script, number, line, "the host is listed twice");
    }
    hosts.push_back(*std::move(host));
  }
  return hosts;
}

absl::StatusOr<std::vector<hostfile::HostSpec>> RunDiscoveryScript(const std::string& script,
                                                                   int default_slots) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("cannot run the host discovery script '", script,
                                            "': pipe: ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  // Its own process group, so that a timeout kills whatever it started; signals as by default.
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setpgroup(&attributes, 0);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  const char* argv[] = {"/bin/sh", "-c", script.c_str(), nullptr};
  pid_t pid = -1;
  const int spawned = ::posix_spawn(&pid, "/bin/sh", &actions, &attributes,
                                    const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  ::close(pipe_fds[1]);
  if (spawned != 0) {
    ::close(pipe_fds[0]);
    return absl::InternalError(absl::StrCat("cannot run the host discovery script '", script,
                                            "': ", std::strerror(spawned)));
  }
  std::string output;
  const auto deadline = std::chrono::steady_clock::now() + kDiscoveryScriptTimeout;
  bool timed_out = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd readable{pipe_fds[0], POLLIN, 0};
    const int ready = ::poll(&readable, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    char buffer[4096];
    const ssize_t n = ::read(pipe_fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    output.append(buffer, static_cast<size_t>(n));
    if (output.size() > (1 << 20)) break;  // no host list is that long
  }
  ::close(pipe_fds[0]);
  if (timed_out) ::kill(-pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return absl::DeadlineExceededError(absl::StrCat("the host discovery script '", script,
                                                    "' did not finish within ",
                                                    kDiscoveryScriptTimeout.count(), " s"));
  }
  if (WIFSIGNALED(status)) {
    return absl::FailedPreconditionError(absl::StrCat("the host discovery script '", script,
                                                      "' was killed by signal ", WTERMSIG(status)));
  }
  if (WEXITSTATUS(status) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the host discovery script '", script, "' exited with code ",
                     WEXITSTATUS(status), WEXITSTATUS(status) == 127 ? " (not found?)" : ""));
  }
  return ParseDiscoveryOutput(script, output, default_slots);
}

}  // namespace trainrun::launcher
