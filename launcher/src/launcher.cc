#include "trainrun/launcher/launcher.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
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
#include "trainrun/rendezvous/server.h"

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

// RendezvousOptions is the job's rendezvous server configuration: every rank's slot, the job's id
// and token, and where to listen (127.0.0.1 unless --rendezvous-addr says otherwise).
rendezvous::ServerOptions RendezvousOptions(
    const LaunchSpec& spec, const JobEnvironment& job,
    std::function<void(const rendezvous::PeerFailure&)> on_peer_failure) {
  rendezvous::ServerOptions options;
  options.bind_address = spec.rendezvous_addr.empty() ? "127.0.0.1" : spec.rendezvous_addr;
  if (options.bind_address == "0.0.0.0" || options.bind_address == "::") {
    options.advertise_host = "127.0.0.1";  // every rank is on this host
  }
  options.port = spec.rendezvous_port;
  options.job_id = job.job_id();
  options.token = job.token();
  for (const hostfile::RankAssignment& a : spec.plan.ranks) {
    options.ranks.push_back(
        {spec.plan.HostOf(a.rank).host, a.local_rank, a.local_size, a.cross_rank, a.cross_size});
  }
  options.on_peer_failure = std::move(on_peer_failure);
  return options;
}

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
  absl::StatusOr<JobEnvironment> job = JobEnvironment::Create(spec, CurrentEnvironment());
  if (!job.ok()) return job.status();

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

  // The rendezvous server lives until the ranks are gone (it is destroyed before `supervisor` and
  // `io`). A rank's "I failed because of peer P" arrives on a gRPC thread and is posted to the
  // supervisor, which then blames P rather than the rank that reported it.
  absl::StatusOr<std::unique_ptr<rendezvous::Server>> server =
      rendezvous::Server::Start(RendezvousOptions(spec, *job, [&io, &supervisor](
                                                                  const rendezvous::PeerFailure& f) {
        boost::asio::post(io, [&supervisor, rank = f.rank, peer = f.peer_rank] {
          if (supervisor) supervisor->ReportPeerFailure(rank, peer);
        });
      }));
  if (!server.ok()) {
    return absl::Status(server.status().code(),
                        absl::StrCat("cannot start the job's rendezvous server: ",
                                     server.status().message()));
  }
  job->SetRendezvousAddress((*server)->address());
  Logger().debug("rendezvous server at {}", (*server)->address());
  RankProcessSet::Callbacks callbacks;
  callbacks.on_output = [&](int rank, OutputStream stream, std::string_view bytes) {
    (*output)->Write(rank, stream, bytes);
    supervisor->OnOutput(rank, stream, bytes);
  };
  callbacks.on_exit = [&](int rank, const ExitInfo& exit) {
    (*server)->NoteRankExit(rank, exit.Describe());
    supervisor->OnRankExit(rank, exit);
  };
  RankProcessSet ranks(io, std::move(callbacks));
  SupervisorOptions supervisor_options;
  supervisor_options.command = spec.command[0];
  supervisor_options.grace_period = spec.grace_period;
  supervisor.emplace(io, spec.plan, ranks, supervisor_options, [&io] { io.stop(); });

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

  (*server)->Shutdown();
  (*output)->EndLines();
  if (std::string summary = supervisor->Summary(); !summary.empty()) {
    Logger().error("{}", absl::StrReplaceAll(summary, {{"\n", "\n  "}}));
  }
  return supervisor->exit_code();
}

}  // namespace trainrun::launcher
