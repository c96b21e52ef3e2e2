#include "trainrun/launcher/launcher.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "stdin_forwarder.h"
#include "trainrun/launcher/job_environment.h"
#include "trainrun/launcher/job_supervisor.h"
#include "trainrun/launcher/logging.h"
#include "trainrun/launcher/output_forwarder.h"
#include "trainrun/launcher/process_set.h"

namespace trainrun::launcher {
namespace {

// Executable is what execvp would run for a command name, or why it cannot.
struct Executable {
  std::string path;
  int error = 0;  // errno execvp would fail with
};

// ResolveExecutable searches `path_var` as execvp does, so that a missing command is reported
// once, before anything starts, instead of once per rank.
Executable ResolveExecutable(const std::string& name, const std::string& path_var) {
  auto check = [](const std::string& candidate) {
    struct stat st {};
    if (stat(candidate.c_str(), &st) != 0) return errno;
    if (S_ISDIR(st.st_mode)) return EACCES;
    return access(candidate.c_str(), X_OK) == 0 ? 0 : errno;
  };
  if (name.find('/') != std::string::npos) return {name, check(name)};
  int error = ENOENT;
  for (absl::string_view dir : absl::StrSplit(path_var, ':')) {
    std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", name);
    int e = check(candidate);
    if (e == 0) return {candidate, 0};
    if (e == EACCES) error = EACCES;
  }
  return {name, error};
}

// Ignores SIGPIPE while alive (a rank that closed its stdin, a console that went away) and
// restores the previous disposition.
class IgnoreSigpipe {
 public:
  IgnoreSigpipe() {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ignore, &previous_);
  }
  ~IgnoreSigpipe() { sigaction(SIGPIPE, &previous_, nullptr); }

 private:
  struct sigaction previous_ {};
};

}  // namespace

bool IsLocalHost(const std::string& host) {
  if (host == "localhost" || host == "::1" || absl::StartsWith(host, "127.") ||
      absl::StartsWith(host, "localhost.")) {
    return true;
  }
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return false;
  std::string self = name;
  std::string short_self = self.substr(0, self.find('.'));
  return host == self || host == short_self;
}

std::string DescribePlan(const LaunchSpec& spec) {
  std::string out;
  std::string command = absl::StrJoin(spec.command, " ");
  for (const hostfile::RankAssignment& a : spec.plan.ranks) {
    absl::StrAppend(&out, "host=", spec.plan.HostOf(a.rank).host, " rank=", a.rank,
                    " local_rank=", a.local_rank, " cross_rank=", a.cross_rank, " command=", command,
                    "\n");
  }
  return out;
}

absl::StatusOr<int> Launch(const LaunchSpec& spec) {
  if (spec.command.empty()) {
    return absl::InvalidArgumentError("no command given; put it after trainrun's flags, e.g. `trainrun -np 2 python3 train.py`");
  }
  if (spec.plan.size() == 0) return absl::InvalidArgumentError("the slot plan has no ranks");
  for (const hostfile::HostSpec& host : spec.plan.hosts) {
    if (!IsLocalHost(host.host)) {
      return absl::UnimplementedError(absl::StrCat(
          "host '", host.host, "' is not this machine, and remote hosts are not supported yet; "
          "run with localhost slots only"));
    }
  }
  if (spec.dry_run) {
    std::fputs(DescribePlan(spec).c_str(), stdout);
    std::fflush(stdout);
    return 0;
  }

  absl::StatusOr<JobEnvironment> job = JobEnvironment::Create(spec, CurrentEnvironment());
  if (!job.ok()) return job.status();
  // The rendezvous server starts here, before any rank's environment is made:
  //   job->SetRendezvousAddress(server->address());

  Executable executable = ResolveExecutable(spec.command[0], job->Lookup("PATH").value_or("/bin:/usr/bin"));
  if (executable.error != 0) {
    Logger().error("cannot execute '{}': {}", spec.command[0], std::strerror(executable.error));
    return 127;
  }

  OutputOptions output_options;
  output_options.tag = spec.tag_output;
  output_options.prefix_timestamp = spec.prefix_timestamp;
  output_options.output_dir = spec.output_dir;
  output_options.world_size = spec.plan.size();
  absl::StatusOr<std::unique_ptr<OutputForwarder>> output = OutputForwarder::Create(output_options);
  if (!output.ok()) return output.status();

  IgnoreSigpipe ignore_sigpipe;
  boost::asio::io_context io;
  std::optional<JobSupervisor> supervisor;
  RankProcessSet::Callbacks callbacks;
  callbacks.on_output = [&](int rank, OutputStream stream, std::string_view bytes) {
    (*output)->Write(rank, stream, bytes);
    supervisor->OnOutput(rank, stream, bytes);
  };
  callbacks.on_exit = [&](int rank, const ExitInfo& exit) { supervisor->OnRankExit(rank, exit); };
  RankProcessSet ranks(io, std::move(callbacks));
  SupervisorOptions supervisor_options;
  supervisor_options.command = spec.command[0];
  supervisor_options.grace_period = spec.grace_period;
  supervisor.emplace(io, spec.plan, ranks, supervisor_options, [&io] { io.stop(); });
  // The rendezvous delivers "rank R failed because of peer P" with
  //   boost::asio::post(io, [&] { supervisor->ReportPeerFailure(r, p); });

  boost::asio::signal_set signals(io, SIGINT, SIGTERM, SIGHUP);
  std::function<void()> wait_for_signal = [&] {
    signals.async_wait([&](const boost::system::error_code& error, int signal) {
      if (error) return;
      supervisor->OnSignal(signal);
      wait_for_signal();
    });
  };
  wait_for_signal();

  std::unique_ptr<internal::StdinForwarder> stdin_forwarder = internal::StdinForwarder::Create(io);
  for (int rank = 0; rank < spec.plan.size(); ++rank) {
    ProcessSpec process;
    process.executable = executable.path;
    process.argv = spec.command;
    process.env = job->ForRank(rank);
    process.stdin_fd = rank == 0 ? stdin_forwarder->rank_stdin() : -1;
    if (absl::Status started = ranks.Start(rank, process); !started.ok()) {
      supervisor->OnStartFailure(rank, std::string(started.message()));
      break;
    }
    supervisor->OnRankStarted(rank);
    if (rank == 0) stdin_forwarder->RankStarted();
  }
  supervisor->OnStartsComplete();
  Logger().debug("job {}: started {} ranks of {}", job->job_id(), ranks.running(), spec.plan.size());
  if (!supervisor->done()) io.run();

  (*output)->EndLines();
  if (std::string summary = supervisor->Summary(); !summary.empty()) {
    Logger().error("{}", absl::StrReplaceAll(summary, {{"\n", "\n  "}}));
  }
  return supervisor->exit_code();
}

}  // namespace trainrun::launcher
