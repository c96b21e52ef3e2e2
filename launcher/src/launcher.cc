#include "trainrun/launcher/launcher.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "remote/remote_ranks.h"
#include "stdin_forwarder.h"
#include "trainrun/launcher/job_environment.h"
#include "trainrun/launcher/job_supervisor.h"
#include "trainrun/launcher/logging.h"
#include "trainrun/launcher/output_forwarder.h"
#include "trainrun/launcher/process_set.h"
#include "trainrun/rendezvous/environment.h"
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
// With remote hosts, `bind_address` is the local address of the SSH connections toward them
// (remote::RendezvousBindAddress), and `advertise_host` what a wildcard bind advertises.
rendezvous::ServerOptions RendezvousOptions(
    const LaunchSpec& spec, const JobEnvironment& job, const std::string& bind_address,
    const std::string& advertise_host,
    std::function<void(const rendezvous::PeerFailure&)> on_peer_failure,
    std::function<void(int rank)> on_exit_before_join) {
  rendezvous::ServerOptions options;
  options.bind_address = bind_address;
  if (options.bind_address == "0.0.0.0" || options.bind_address == "::") {
    options.advertise_host = advertise_host;
  }
  options.port = spec.rendezvous_port;
  options.job_id = job.job_id();
  options.token = job.token();
  for (const hostfile::RankAssignment& a : spec.plan.ranks) {
    options.ranks.push_back(
        {spec.plan.HostOf(a.rank).host, a.local_rank, a.local_size, a.cross_rank, a.cross_size});
  }
  options.on_peer_failure = std::move(on_peer_failure);
  options.on_exit_before_join = std::move(on_exit_before_join);
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
    return absl::InvalidArgumentError(
        "no command given; put it after trainrun's flags, e.g. `trainrun -np 2 python3 train.py`");
  }
  if (spec.plan.size() == 0) return absl::InvalidArgumentError("the slot plan has no ranks");
  std::vector<int> remote_hosts;  // indices into spec.plan.hosts
  for (size_t i = 0; i < spec.plan.hosts.size(); ++i) {
    if (!IsLocalHost(spec.plan.hosts[i].host)) remote_hosts.push_back(static_cast<int>(i));
  }
  std::vector<bool> rank_is_local(spec.plan.size(), true);
  for (const hostfile::RankAssignment& a : spec.plan.ranks) {
    for (int index : remote_hosts) {
      if (a.host_index == index) rank_is_local[a.rank] = false;
    }
  }
  const bool any_local =
      std::find(rank_is_local.begin(), rank_is_local.end(), true) != rank_is_local.end();
  // --network-interface: the rendezvous binds that interface's address here, and every worker
  // gets TRAINRUN_NETWORK_INTERFACE (its data plane listens on that interface of its own host);
  // passed as an -x the user's own -x can still override.
  std::string interface_address;
  LaunchSpec job_spec = spec;
  if (!spec.network_interfaces.empty()) {
    if (spec.rendezvous_addr.empty()) {
      absl::StatusOr<std::string> address =
          remote::NetworkInterfaceAddress(spec.network_interfaces[0]);
      if (!address.ok()) return address.status();
      interface_address = *address;
    }
    job_spec.exported.insert(job_spec.exported.begin(),
                             {env::kNetworkInterface.name, spec.network_interfaces[0]});
  }
  absl::StatusOr<JobEnvironment> job = JobEnvironment::Create(job_spec, CurrentEnvironment());
  if (!job.ok()) return job.status();

  Executable executable =
      ResolveExecutable(spec.command[0], job->Lookup("PATH").value_or("/bin:/usr/bin"));
  if (executable.error != 0 && any_local) {
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
  // Remote hosts: their agents, connected in parallel, before anything starts anywhere.
  std::vector<remote::RemoteAgent> agents;
  std::string bind_address = !spec.rendezvous_addr.empty() ? spec.rendezvous_addr
                             : !interface_address.empty()  ? interface_address
                                                           : "127.0.0.1";
  std::string advertise_host = "127.0.0.1";  // for a wildcard bind: every rank is on this host
  if (!remote_hosts.empty()) {
    absl::StatusOr<std::vector<remote::RemoteAgent>> connected =
        remote::ConnectRemoteHosts(spec, remote_hosts);
    if (!connected.ok()) return connected.status();
    agents = *std::move(connected);
    if (spec.rendezvous_addr.empty() && interface_address.empty()) {
      bind_address = remote::RendezvousBindAddress(agents);
    }
    advertise_host = remote::AdvertiseHost(agents);
  }

  boost::asio::io_context io;
  std::optional<JobSupervisor> supervisor;

  // The rendezvous server lives until the ranks are gone (it is destroyed before `supervisor` and
  // `io`). A rank's "I failed because of peer P" arrives on a gRPC thread and is posted to the
  // supervisor, which then blames P rather than the rank that reported it.
  absl::StatusOr<std::unique_ptr<rendezvous::Server>> server =
      rendezvous::Server::Start(RendezvousOptions(
          spec, *job, bind_address, advertise_host,
          [&io, &supervisor](const rendezvous::PeerFailure& f) {
            boost::asio::post(io, [&supervisor, rank = f.rank, peer = f.peer_rank] {
              if (supervisor) supervisor->ReportPeerFailure(rank, peer);
            });
          },
          [&io, &supervisor](int rank) {
            boost::asio::post(io, [&supervisor, rank] {
              if (supervisor) supervisor->OnExitBeforeJoin(rank);
            });
          }));
  if (!server.ok()) {
    return absl::Status(
        server.status().code(),
        absl::StrCat("cannot start the job's rendezvous server: ", server.status().message()));
  }
  job->SetRendezvousAddress((*server)->address());
  Logger().debug("rendezvous server at {}", (*server)->address());
  RankProcessSet::Callbacks callbacks;
  callbacks.on_output = [&](int rank, OutputStream stream, std::string_view bytes) {
    (*output)->Write(rank, stream, bytes);
    supervisor->OnOutput(rank, stream, bytes);
  };
  callbacks.on_exit = [&](int rank, const ExitInfo& exit) {
    (*server)->NoteRankExit(rank, exit.Describe(), exit.ok());
    supervisor->OnRankExit(rank, exit);
  };
  RankProcessSet ranks(io, callbacks);
  remote::RemoteEvents remote_events;
  remote_events.on_output = callbacks.on_output;
  remote_events.on_exit = callbacks.on_exit;
  remote_events.on_failure = [&](int rank, std::string message) {
    supervisor->OnStartFailure(rank, std::move(message));
  };
  remote::RemoteRanks remote_ranks(io, std::move(agents), std::move(remote_events));
  remote::AllRanks all_ranks({&ranks, &remote_ranks});
  SupervisorOptions supervisor_options;
  supervisor_options.command = spec.command[0];
  supervisor_options.grace_period = spec.grace_period;
  supervisor.emplace(io, spec.plan, all_ranks, supervisor_options, [&io] { io.stop(); });

  boost::asio::signal_set signals(io, SIGINT, SIGTERM, SIGHUP);
  std::function<void()> wait_for_signal = [&] {
    signals.async_wait([&](const boost::system::error_code& error, int signal) {
      if (error) return;
      supervisor->OnSignal(signal);
      wait_for_signal();
    });
  };
  wait_for_signal();

  // trainrun's stdin goes to rank 0 when it runs here; a remote rank 0 gets /dev/null.
  std::unique_ptr<internal::StdinForwarder> stdin_forwarder =
      rank_is_local[0] ? internal::StdinForwarder::Create(io) : nullptr;
  if (!remote_hosts.empty()) {
    std::vector<remote::Job> jobs = remote::MakeJobs(spec, *job, remote_ranks.agents(),
                                                     remote_hosts, bind_address, (*server)->port());
    for (const remote::Job& host_job : jobs) {
      for (const remote::RankJob& rank : host_job.ranks) supervisor->OnRankStarted(rank.rank);
    }
    remote_ranks.Start(std::move(jobs), spec.start_timeout);
  }
  for (int rank = 0; rank < spec.plan.size(); ++rank) {
    if (!rank_is_local[rank]) continue;
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
  Logger().debug("job {}: started {} local ranks of {} ({} hosts remote)", job->job_id(),
                 ranks.running(), spec.plan.size(), remote_hosts.size());
  if (!supervisor->done()) io.run();

  (*server)->Shutdown();
  (*output)->EndLines();
  if (std::string summary = supervisor->Summary(); !summary.empty()) {
    Logger().error("{}", absl::StrReplaceAll(summary, {{"\n", "\n  "}}));
  }
  return supervisor->exit_code();
}

}  // namespace trainrun::launcher
