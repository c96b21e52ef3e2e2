// The phases of a job after its hosts are reached (launcher.cc): serve the rendezvous, start the
// ranks, supervise them, summarize. JobRun holds what those phases share — the event loop, the
// supervisor, the local and remote ranks, the rendezvous server — in the order they must be torn
// down, so that Launch() reads as the list of phases.
//
//   JobRun run(spec, plan, output, std::move(agents));
//   if (absl::Status served = run.ServeRendezvous(); !served.ok()) return served;
//   run.StartRanks(deadline);
//   run.Supervise();
//   return run.Summarize();
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "job_plan.h"
#include "monitor/monitor.h"
#include "remote/agent_connector.h"
#include "remote/remote_ranks.h"
#include "start_deadline.h"
#include "stdin_forwarder.h"
#include "trainrun/launcher/job_environment.h"
#include "trainrun/launcher/job_supervisor.h"
#include "trainrun/launcher/launch_spec.h"
#include "trainrun/launcher/output_forwarder.h"
#include "trainrun/launcher/process_set.h"
#include "trainrun/launcher/stall_inspector.h"
#include "trainrun/rendezvous/rank_place.h"
#include "trainrun/rendezvous/server.h"

namespace trainrun::launcher {

class JobRun {
 public:
  // JobRun takes the agents of plan.remote_hosts (in that order) for the job's duration. It
  // handles SIGINT, SIGTERM and SIGHUP while it lives.
  JobRun(const LaunchSpec& spec, const JobPlan& plan, OutputForwarder& output,
         std::vector<remote::RemoteAgent> agents);
  ~JobRun();
  JobRun(const JobRun&) = delete;
  JobRun& operator=(const JobRun&) = delete;

  // ServeRendezvous starts the job's rendezvous server where every rank can reach it, and works out
  // each host's view of the job (HostView). Fails when the server cannot listen.
  absl::Status ServeRendezvous();
  // StartRanks sends each remote host its ranks and starts the local ones; every rank must have
  // started by `deadline`, or the job fails naming the host.
  void StartRanks(const StartDeadline& deadline);
  // Supervise runs the job until every rank has ended (JobSupervisor's policy).
  void Supervise();
  // Summarize logs the one summary of a failed or interrupted job and returns trainrun's exit code.
  int Summarize();
  // After Summarize: trainrun was told to stop (a signal), and the summary's first line ("" when
  // the job succeeded).
  bool interrupted() const;
  std::string cause() const;

 private:
  // The host view of every host of the plan, by host index.
  std::vector<HostView> HostViews(const std::string& bind_address) const;
  void StartLocalRanks();
  // WarnIfOversubscribed warns when this host runs more ranks than it has cores, unless
  // --oversubscribe.
  void WarnIfOversubscribed() const;
  void WaitForSignal();
  // InspectStalls reads the ranks' stall reports once a second (StallInspector).
  void InspectStalls();
  void OnOutput(int rank, OutputStream stream, std::string_view bytes);
  void OnExit(int rank, const ExitInfo& exit);
  // HostLostHandler is RemoteEvents::on_host_lost for `spec` (none unless elastic);
  // RemoteTimingFor its heartbeat and silence limit.
  std::function<void(const std::vector<int>&, const std::string&)> HostLostHandler(
      const LaunchSpec& spec);
  static remote::RemoteTiming RemoteTimingFor(const LaunchSpec& spec);
  // OnStarted counts a started rank (local or remote, with its binding's words); the last one
  // prints the start line unless --quiet.
  void OnStarted(int rank, const std::string& binding);
  // Elastic jobs: PublishGeneration tells the ranks of a new generation through the rendezvous
  // (rendezvous/generation.h); WatchGenerations polls until each published one has formed (every
  // member has joined it), then logs the change's line.
  void PublishGeneration(const MembershipChange& change);
  void WatchGenerations();
  // Elastic jobs with --host-discovery-script: a thread runs the script every
  // ElasticSpec::discovery_interval and posts its outcome to OnDiscovered, which stops the ranks
  // of hosts that left the output (JobSupervisor::OnRanksRemoved) and says once what it cannot
  // use (a failing script, a new host). StopDiscovery ends the thread.
  void StartDiscovery();
  void StopDiscovery();
  void OnDiscovered(const absl::StatusOr<std::vector<hostfile::HostSpec>>& hosts,
                    std::chrono::steady_clock::time_point when);
  // Growing: Grow starts `count` ranks on `host` (this machine) as slots past the plan's, pending
  // in the supervisor; WatchGrowth polls until each batch's ranks have joined the rendezvous, then
  // makes them one membership change (JobSupervisor::OnRanksJoined).
  // A remote host (not this machine) is grown onto through an agent of its own: ConnectToGrow
  // connects one on a thread (the start's HostChannel and greeting) and posts the outcome to
  // OnGrowConnected, which gives the ranks to Grow with the agent (they run as RemoteRanks), or,
  // when the host cannot be reached, gives them up and blacklists the host. `agent` absent: this
  // machine's ranks, started under their shims.
  void Grow(const hostfile::HostSpec& host, int count, bool joined_host,
            std::chrono::steady_clock::time_point since,
            std::optional<remote::RemoteAgent> agent = std::nullopt);
  void ConnectToGrow(const hostfile::HostSpec& host, int count, bool joined_host,
                     std::chrono::steady_clock::time_point since);
  void OnGrowConnected(const hostfile::HostSpec& host, int count, bool joined_host,
                       std::chrono::steady_clock::time_point since,
                       absl::StatusOr<remote::RemoteAgent> agent);
  // The view of a host the job grew onto (`agent`: its agent; null for this machine).
  HostView GrownHostView(const hostfile::HostSpec& host, const remote::RemoteAgent* agent) const;
  // SeenThrough fills in what a remote host's agent decides of its view: the host's address and GPU
  // count, and this machine as that host sees it (the rendezvous address when the server listens on
  // every interface, MASTER_ADDR when rank 0 runs here (`master_here`)).
  void SeenThrough(const remote::RemoteAgent& agent, const std::string& bind_address,
                   bool master_here, HostView& view) const;
  // Why the ranks of a remote host could not join this job ("" when they can).
  std::string CannotReachFromRanks(const std::string& host) const;
  // The ranks running or pending, and those whose agent is being connected.
  int LiveOrConnecting() const;
  // RemoteJob is a remote host's Job without its ranks.
  remote::Job RemoteJob() const;
  void WatchGrowth();
  // Blacklisting (elastic jobs with --host-discovery-script): a host whose rank failed gets no new
  // ranks until its cooldown (--blacklist-cooldown-range; forever without it) has passed.
  void Blacklist(const std::string& host, const std::string& what);
  bool Blacklisted(const std::string& host, std::chrono::steady_clock::time_point now) const;
  // Place is rank `slot`'s place in the job's newest membership with `added` joined to it.
  std::optional<rendezvous::RankPlace> PlaceWith(const std::vector<int>& added, int slot) const;

  const LaunchSpec& spec_;
  // The job's slots: the plan's, then the ranks an elastic job grew by (slot = index).
  hostfile::SlotPlan slots_;
  struct Growth {
    std::vector<int> ranks;
    std::string host;
    std::string why;
    std::chrono::steady_clock::time_point since;  // when the discovery output gained the host
    std::chrono::steady_clock::time_point started;
  };
  std::vector<Growth> growing_;
  struct Blacklisting {
    int times = 0;
    bool forever = false;
    std::chrono::steady_clock::time_point until;
  };
  std::map<std::string, Blacklisting> blacklist_;
  std::thread discovery_thread_;
  std::mutex discovery_mutex_;
  std::condition_variable discovery_wake_;
  bool discovery_stop_ = false;
  std::set<std::string> discovery_said_;   // what OnDiscovered has said once
  std::set<std::string> listed_;           // the hosts of the discovery script's latest output
  std::map<std::string, int> connecting_;  // ranks waiting for an agent, by host
  // What the connecting threads share with JobRun: once `closed`, they post nothing and close the
  // agent they got. JobRun waits up to a second for `running` to reach 0 when destroyed.
  struct Connections {
    std::mutex mu;
    std::condition_variable changed;
    bool closed = false;
    int running = 0;
  };
  std::shared_ptr<Connections> connections_ = std::make_shared<Connections>();
  std::string bind_address_;  // the rendezvous server's
  bool host_failed_ = false;  // a remote host's agent failed or was lost
  std::chrono::steady_clock::time_point
      launched_;  // when Launch began (the start deadline's clock)
  int started_ = 0;
  const JobPlan& plan_;
  OutputForwarder& output_;
  std::vector<HostView> views_;
  // Destroyed in reverse order: the stdin pump, the signal handler, the ranks (remote, then local:
  // each kills what still runs), the rendezvous server, the supervisor, the event loop.
  boost::asio::io_context io_;
  std::optional<JobSupervisor> supervisor_;
  std::unique_ptr<rendezvous::Server> server_;
  RankProcessSet local_ranks_;
  remote::RemoteRanks remote_ranks_;
  remote::AllRanks all_ranks_;
  boost::asio::signal_set signals_;
  std::unique_ptr<internal::StdinForwarder> stdin_forwarder_;
  StallInspector stall_inspector_;
  boost::asio::steady_timer stall_timer_;
  // Elastic jobs: the newest generation published, and the oldest not yet seen formed.
  int published_generation_ = 0;
  int forming_generation_ = 1;
  boost::asio::steady_timer generation_timer_;
  boost::asio::steady_timer growth_timer_;
  monitor::Monitor monitor_;  // the straggler line, the --monitor page (monitor/monitor.h)
};

}  // namespace trainrun::launcher
