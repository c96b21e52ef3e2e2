#include "job_run.h"

#include <signal.h>
#include <unistd.h>

#include <boost/asio/post.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "posix/resolve_on_path.h"
#include "remote/host_access.h"
#include "trainrun/launcher/cpu_binding.h"
#include "trainrun/launcher/gpu_assignment.h"
#include "trainrun/launcher/logging.h"
#include "trainrun/launcher/python_interpreter.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::launcher {
namespace {

bool IsWildcard(const std::string& address) { return address == "0.0.0.0" || address == "::"; }

// HostPort writes "host:port", bracketing an IPv6 address.
std::string HostPort(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port)
                                             : absl::StrCat(host, ":", port);
}

std::string CurrentDirectory() {
  char cwd[4096] = {};
  return ::getcwd(cwd, sizeof cwd - 1) ? cwd : "";
}

}  // namespace

JobRun::JobRun(const LaunchSpec& spec, const JobPlan& plan, OutputForwarder& output,
               std::vector<remote::RemoteAgent> agents,
               std::shared_ptr<channel::HostChannel> channel)
    : spec_(spec),
      slots_(spec.plan),
      plan_(plan),
      output_(output),
      controller_(MakeMembershipController(
          {spec, plan, io_, slots_, views_, supervisor_, server_, local_ranks_, remote_ranks_,
           output, bind_address_, host_failed_, [this] { return RemoteJob(); },
           [this](const remote::RemoteAgent& agent, bool master_here, HostView& view) {
             SeenThrough(agent, bind_address_, master_here, view);
           },
           std::move(channel)})),
      local_ranks_(io_, {[this](int rank, OutputStream stream, std::string_view bytes) {
                           OnOutput(rank, stream, bytes);
                         },
                         [this](int rank, const ExitInfo& exit) { OnExit(rank, exit); }}),
      remote_ranks_(io_, std::move(agents),
                    {[this](int rank, OutputStream stream, std::string_view bytes) {
                       OnOutput(rank, stream, bytes);
                     },
                     [this](int rank, const ExitInfo& exit) { OnExit(rank, exit); },
                     [this](int rank, std::string message) {
                       host_failed_ = true;
                       supervisor_->OnStartFailure(rank, std::move(message));
                     },
                     [this](int rank, const std::string& binding) { OnStarted(rank, binding); },
                     controller_->HostLostHandler()},
                    controller_->Timing()),
      all_ranks_({&local_ranks_, &remote_ranks_}),
      signals_(io_, SIGINT, SIGTERM, SIGHUP),
      stall_inspector_(spec.plan.size(), spec.stall_warning, spec.stall_shutdown),
      stall_timer_(io_),
      monitor_(spec, plan, io_) {
  SupervisorOptions options;
  options.command = spec.command[0];
  options.grace_period = spec.grace_period;
  options.elastic = spec.elastic;
  options.python_hint = [](const std::string& module) {
    return PythonHint(module, env::Lookup(env::kPath).value_or(posix::kDefaultPath));
  };
  supervisor_.emplace(
      io_, slots_, all_ranks_, options, [this] { io_.stop(); },
      [this](const MembershipChange& change) { controller_->OnMembershipChange(change); });
  WaitForSignal();
  // trainrun's stdin goes to rank 0 when it runs here; a remote rank 0 gets /dev/null.
  if (plan.rank_is_local[0]) stdin_forwarder_ = internal::StdinForwarder::Create(io_);
}

JobRun::~JobRun() { controller_->Stop(); }

void JobRun::SeenThrough(const remote::RemoteAgent& agent, const std::string& bind_address,
                         bool master_here, HostView& view) const {
  // This machine as that host sees it.
  const std::string launcher_address = remote::LauncherAddress(agent);
  view.address = agent.stream->RemoteAddress();
  view.gpu_count = static_cast<int>(agent.hello.gpu_count);
  if (IsWildcard(bind_address) && !launcher_address.empty()) {
    view.rendezvous_addr = HostPort(launcher_address, server_->port());
  }
  if (master_here && !launcher_address.empty()) view.master_addr = launcher_address;
}

// Local and remote ranks report the same events; output goes to the console (and files) and to the
// supervisor, which keeps each rank's last stderr lines for the summary.
void JobRun::OnOutput(int rank, OutputStream stream, std::string_view bytes) {
  output_.Write(rank, stream, bytes);
  supervisor_->OnOutput(rank, stream, bytes);
  monitor_.OnOutput(rank, bytes);
}

void JobRun::OnExit(int rank, const ExitInfo& exit) {
  if (server_) server_->NoteRankExit(rank, exit.Describe());
  monitor_.OnExit(rank, exit);
  controller_->OnRankExit(rank, exit);
}

void JobRun::OnStarted(int rank, const std::string& binding) {
  monitor_.OnStarted(rank);
  if (spec_.report_bindings) {
    Logger().info("rank {} on {} bound {}", rank, slots_.HostOf(rank).host, binding);
  }
  if (++started_ != spec_.plan.size() || spec_.quiet || supervisor_->done()) return;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - launched_).count();
  const int hosts = static_cast<int>(spec_.plan.hosts.size());
  Logger().info("{} {} on {} {} started in {:.2f} s", started_, started_ == 1 ? "rank" : "ranks",
                hosts, hosts == 1 ? "host" : "hosts", seconds);
}

void JobRun::WaitForSignal() {
  signals_.async_wait([this](const boost::system::error_code& error, int signal) {
    if (error) return;
    supervisor_->OnSignal(signal);
    WaitForSignal();
  });
}

absl::Status JobRun::ServeRendezvous() {
  // Where the server listens: --rendezvous-addr, else --network-interface's address, else the
  // local address of the connections toward the remote hosts, else loopback (every rank is here).
  std::string bind_address = !spec_.rendezvous_addr.empty()     ? spec_.rendezvous_addr
                             : !plan_.interface_address.empty() ? plan_.interface_address
                             : !remote_ranks_.agents().empty()
                                 ? remote::RendezvousBindAddress(remote_ranks_.agents())
                                 : "127.0.0.1";
  rendezvous::ServerOptions options;
  options.bind_address = bind_address;
  // A wildcard bind advertises this machine's side of the first connection (or loopback).
  if (IsWildcard(bind_address))
    options.advertise_host = remote::AdvertiseHost(remote_ranks_.agents());
  options.port = spec_.rendezvous_port;
  options.job_id = plan_.environment.job_id();
  options.token = plan_.environment.token();
  options.tls = spec_.rendezvous_tls;
  // The ranks on this machine dial a Unix socket in plain text: no TLS handshake each (the token
  // crosses no network there); remote ranks dial the TCP port.
  options.local_socket = true;
  // Every rank here: the TCP port (with TLS) is served only if something dials it (a rank in
  // another mount namespace, which cannot see the socket).
  options.network_on_demand = plan_.remote_hosts.empty();
  for (const hostfile::RankAssignment& a : spec_.plan.ranks) {
    options.ranks.push_back(
        {spec_.plan.HostOf(a.rank).host, a.local_rank, a.local_size, a.cross_rank, a.cross_size});
  }
  // A rank's "I failed because of peer P" arrives on a gRPC thread and is posted to the supervisor,
  // which then blames P rather than the rank that reported it.
  // Where a rank's number changes with each generation (elastic), a report's ranks cannot be
  // trusted to name slots, and the supervisor blames exits alone.
  if (controller_->TrustsPeerReports())
    options.on_peer_failure = [this](const rendezvous::PeerFailure& f) {
      boost::asio::post(io_, [this, rank = f.rank, peer = f.peer_rank, message = f.message] {
        supervisor_->ReportPeerFailure(rank, peer, message);
      });
    };
  // Joins go to the supervisor, which sees from them and the exits a rank that exited 0 without
  // ever joining while joined ranks still run (the job cannot finish; it ends naming that rank).
  options.on_join = [this](int rank) {
    boost::asio::post(io_, [this, rank] { supervisor_->OnRankJoined(rank); });
  };
  absl::StatusOr<std::unique_ptr<rendezvous::Server>> server =
      rendezvous::Server::Start(std::move(options));
  if (!server.ok()) {
    return absl::Status(
        server.status().code(),
        absl::StrCat("cannot start the job's rendezvous server: ", server.status().message()));
  }
  server_ = *std::move(server);
  Logger().debug("rendezvous server at {}", server_->address());
  bind_address_ = bind_address;
  views_ = HostViews(bind_address);
  return absl::OkStatus();
}

std::vector<HostView> JobRun::HostViews(const std::string& bind_address) const {
  const std::vector<remote::RemoteAgent>& agents = remote_ranks_.agents();
  auto agent_of = [&](int host_index) -> const remote::RemoteAgent* {
    for (size_t i = 0; i < plan_.remote_hosts.size() && i < agents.size(); ++i) {
      if (plan_.remote_hosts[i] == host_index) return &agents[i];
    }
    return nullptr;
  };
  // MASTER_ADDR: rank 0's host as the user wrote it while every rank is there; once hosts are
  // reached, the address trainrun reached rank 0's host at (an ~/.ssh/config alias is a name only
  // this machine knows), or, when rank 0 is here, this machine's address toward each host.
  const int master_host = spec_.plan.ranks[0].host_index;
  const remote::RemoteAgent* master_agent = agent_of(master_host);
  std::string master_addr = spec_.plan.hosts[master_host].host;
  if (master_agent != nullptr && !master_agent->stream->RemoteAddress().empty()) {
    master_addr = master_agent->stream->RemoteAddress();
  }
  const int local_gpus = CountHostGpus();
  std::vector<HostView> views;
  for (size_t h = 0; h < spec_.plan.hosts.size(); ++h) {
    HostView view;
    view.name = spec_.plan.hosts[h].host;
    view.rendezvous_addr = server_->address();
    view.master_addr = master_addr;
    view.gpu_count = local_gpus;
    if (const remote::RemoteAgent* agent = agent_of(static_cast<int>(h))) {
      SeenThrough(*agent, bind_address, /*master_here=*/master_agent == nullptr, view);
    } else {
      view.rendezvous_socket = server_->socket_path();
    }
    views.push_back(std::move(view));
  }
  return views;
}

remote::Job JobRun::RemoteJob() const {
  remote::Job job;
  job.cwd = plan_.working_dir.empty() ? CurrentDirectory() : plan_.working_dir;
  job.bind_to = static_cast<uint32_t>(spec_.bind_to);
  job.argv = spec_.command;
  job.grace_period_ms = static_cast<uint32_t>(spec_.grace_period.count());
  job.stdout_pty = spec_.stdout_pty;
  controller_->Configure(job);
  return job;
}

void JobRun::StartRanks(const StartDeadline& deadline) {
  launched_ = deadline.when - deadline.timeout;
  if (!plan_.remote_hosts.empty()) {
    std::vector<remote::Job> jobs;
    const std::vector<remote::RemoteAgent>& agents = remote_ranks_.agents();
    for (size_t i = 0; i < plan_.remote_hosts.size(); ++i) {
      const int host_index = plan_.remote_hosts[i];
      remote::Job job = RemoteJob();
      // The token crosses each host's stream as that stream hides it (a per-node TCP connection
      // seals it: channel/host_channel.h).
      const channel::HostStream* stream = i < agents.size() ? agents[i].stream.get() : nullptr;
      const std::string token_entry = absl::StrCat(env::kJobToken, "=");
      for (const hostfile::RankAssignment& a : spec_.plan.ranks) {
        if (a.host_index != host_index) continue;
        std::vector<std::string> rank_env = plan_.environment.ForRank(a.rank, views_[host_index]);
        for (std::string& entry : rank_env) {
          if (stream != nullptr && absl::StartsWith(entry, token_entry)) {
            entry = token_entry + stream->Seal(entry.substr(token_entry.size()));
          }
        }
        job.ranks.push_back({static_cast<uint32_t>(a.rank), std::move(rank_env)});
        supervisor_->OnRankStarted(a.rank);
      }
      jobs.push_back(std::move(job));
    }
    remote_ranks_.Start(std::move(jobs), deadline);
  }
  StartLocalRanks();
  supervisor_->OnStartsComplete();
  Logger().debug("job {}: started {} local ranks of {} ({} hosts remote)",
                 plan_.environment.job_id(), local_ranks_.running(), spec_.plan.size(),
                 plan_.remote_hosts.size());
}

void JobRun::StartLocalRanks() {
  WarnIfOversubscribed();
  for (const hostfile::RankAssignment& a : spec_.plan.ranks) {
    if (!plan_.rank_is_local[a.rank]) continue;
    ProcessSpec process;
    process.cpus = CpusForRank(plan_.cpus, spec_.bind_to, a.local_rank, a.local_size);
    process.cwd = plan_.working_dir;
    process.executable = plan_.executable.path;
    process.argv = spec_.command;
    process.env = plan_.environment.ForRank(a.rank, views_[a.host_index]);
    process.stdin_fd = a.rank == 0 ? stdin_forwarder_->rank_stdin() : -1;
    process.stdout_pty = spec_.stdout_pty;
    if (absl::Status started = local_ranks_.Start(a.rank, process); !started.ok()) {
      supervisor_->OnStartFailure(a.rank, std::string(started.message()));
      return;
    }
    supervisor_->OnRankStarted(a.rank);
    OnStarted(a.rank, DescribeBinding(plan_.cpus, spec_.bind_to, a.local_rank, a.local_size));
    if (a.rank == 0) stdin_forwarder_->RankStarted();
  }
}

void JobRun::WarnIfOversubscribed() const {
  int local = 0;
  for (bool is_local : plan_.rank_is_local) local += is_local ? 1 : 0;
  const int cores = static_cast<int>(plan_.cpus.cores.size());
  if (spec_.oversubscribe || cores == 0 || local <= cores) return;
  Logger().warn(
      "{} ranks on this host, which has {} {} for them: ranks share cores and each runs slower "
      "(--oversubscribe says this is intended and turns this warning off)",
      local, cores, cores == 1 ? "core" : "cores");
}

void JobRun::InspectStalls() {
  if (spec_.stall_warning.count() <= 0) return;
  stall_timer_.expires_after(std::chrono::seconds(1));
  stall_timer_.async_wait([this](const boost::system::error_code& error) {
    if (error || supervisor_->done() || !server_) return;
    std::map<int, std::string> waiting;
    const std::string prefix = env::kStallKeyPrefix;
    for (const auto& [key, value] : server_->ValuesWithPrefix(prefix)) {
      int rank = -1;
      if (absl::SimpleAtoi(key.substr(prefix.size()), &rank)) waiting[rank] = value;
    }
    const auto now = std::chrono::steady_clock::now();
    std::string warning = stall_inspector_.Update(waiting, now);
    const std::string link = monitor_.OnStalls(waiting, stall_inspector_, warning);
    if (!warning.empty()) Logger().warn("{}{}", warning, link);
    if (stall_inspector_.ShutdownDue(now)) {
      supervisor_->OnStall(stall_inspector_.Stalled(), stall_inspector_.Describe(now));
      return;
    }
    InspectStalls();
  });
}

void JobRun::Supervise() {
  monitor_.Serve(*server_,
                 [this] { return static_cast<int>(supervisor_->MembershipChanges().size()); });
  InspectStalls();
  controller_->Start();
  if (!supervisor_->done()) io_.run();
}

int JobRun::Summarize() {
  controller_->Stop();
  monitor_.Finish(supervisor_->Summary());
  server_->Shutdown();
  output_.EndLines();
  // What the failure policy survived (an elastic job's membership changes), when the job succeeded.
  if (supervisor_->exit_code() == 0) {
    if (std::string changes = supervisor_->ElasticSummary(); !changes.empty()) {
      Logger().info("{}", changes);
    }
  }
  // (A node that joined, so that the job starts again with it, is no failure: Launch says it.)
  if (std::string summary = supervisor_->Summary(); !summary.empty() && !nodes_changed()) {
    // Slurm ends every step of an allocation past its time limit, on scancel or when a node fails:
    // what the ranks did then is its consequence, and the summary says so first.
    // A lost host or a rank killed by a signal may be the scheduler's doing, which its controller
    // records a moment after the steps end: then it is given up to 3 s to say so.
    const bool maybe_scheduler = host_failed_ || supervisor_->exit_code() > 128;
    if (std::string why = remote::SchedulerEnded(spec_, maybe_scheduler);
        !why.empty() && summary.find(why) == std::string::npos) {
      summary = absl::StrCat(why, ", which ended the job; what trainrun saw then:\n", summary);
    }
    Logger().error("{}", absl::StrReplaceAll(summary, {{"\n", "\n  "}}));
  }
  // Per-node mode: every joined node's trainrun prints the same summary and exits the same way, or
  // joins again when the job starts again (a node joined, or a failure within --max-restarts).
  if (spec_.per_node) {
    const bool again = nodes_changed() || (supervisor_->exit_code() != 0 && !interrupted() &&
                                           spec_.restart < spec_.max_restarts);
    const remote::JobEnd end{supervisor_->exit_code(), again ? "" : supervisor_->Summary(), again};
    remote_ranks_.EndJob(end);
    controller_->EndJob(end);
  }
  return supervisor_->exit_code();
}

bool JobRun::interrupted() const { return supervisor_->interrupted(); }

bool JobRun::nodes_changed() const { return supervisor_->nodes_changed(); }

int JobRun::nodes() const {
  return 1 + remote_ranks_.Connected() + controller_->NodesWaiting();  // 1: this node
}

std::string JobRun::cause() const {
  std::string summary = supervisor_->Summary();
  return summary.substr(0, summary.find('\n'));
}

}  // namespace trainrun::launcher
