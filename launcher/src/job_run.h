// The phases of a job after its hosts are reached (launcher.cc): serve the rendezvous, start the
// ranks, supervise them, summarize. JobRun holds what those phases share — the event loop, the
// supervisor, the local and remote ranks, the rendezvous server — in the order they must be torn
// down, so that Launch() reads as the list of phases.
//
//   JobRun run(spec, plan, output, std::move(agents));
//   if (absl::Status served = run.ServeRendezvous(); !served.ok()) return served;
//   run.StartRanks(deadline);
//   if (absl::Status ready = run.RendezvousReady(); !ready.ok()) return ready;
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
#include "membership_controller.h"
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
  // `channel` is the one that reached them (hosts that come by themselves later arrive through it).
  JobRun(const LaunchSpec& spec, const JobPlan& plan, OutputForwarder& output,
         std::vector<remote::RemoteAgent> agents, std::shared_ptr<channel::HostChannel> channel);
  ~JobRun();
  JobRun(const JobRun&) = delete;
  JobRun& operator=(const JobRun&) = delete;

  // ServeRendezvous starts the job's rendezvous server where every rank can reach it, and works out
  // each host's view of the job (HostView). Fails when the server cannot listen.
  absl::Status ServeRendezvous();
  // RendezvousReady waits until the server serves (it builds while the ranks start) and says
  // whether it does.
  absl::Status RendezvousReady() { return server_->Ready(); }
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
  // Per-node mode, after Summarize: the job ended because a node joined (to start again with it),
  // and how many nodes (node 0 included) are still there for a next start.
  bool nodes_changed() const;
  int nodes() const;

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
  // OnStarted counts a started rank (local or remote, with its binding's words); the last one
  // prints the start line unless --quiet.
  void OnStarted(int rank, const std::string& binding);
  // SeenThrough fills in what a remote host's agent decides of its view: the host's address and GPU
  // count, and this machine as that host sees it (the rendezvous address when the server listens on
  // every interface, MASTER_ADDR when rank 0 runs here (`master_here`)).
  void SeenThrough(const remote::RemoteAgent& agent, const std::string& bind_address,
                   bool master_here, HostView& view) const;
  // RemoteJob is a remote host's Job without its ranks.
  remote::Job RemoteJob() const;
  const LaunchSpec& spec_;
  // The job's slots: the plan's, then the ranks an elastic job grew by (slot = index).
  hostfile::SlotPlan slots_;
  std::string bind_address_;  // the rendezvous server's
  bool host_failed_ = false;  // a remote host's agent failed or was lost
  std::chrono::steady_clock::time_point
      launched_;  // when Launch began (the start deadline's clock)
  int started_ = 0;
  const JobPlan& plan_;
  OutputForwarder& output_;
  std::vector<HostView> views_;
  // Destroyed in reverse order: the stdin pump, the signal handler, the ranks (remote, then local:
  // each kills what still runs), the membership controller, the rendezvous server, the
  // supervisor, the event loop.
  boost::asio::io_context io_;
  std::optional<JobSupervisor> supervisor_;
  std::unique_ptr<rendezvous::Server> server_;
  // How the job's members change (FixedMembership, or ElasticController): made first of the parts
  // it acts on, since the remote ranks take its host-loss handler and timing.
  std::unique_ptr<MembershipController> controller_;
  RankProcessSet local_ranks_;
  remote::RemoteRanks remote_ranks_;
  remote::AllRanks all_ranks_;
  boost::asio::signal_set signals_;
  std::unique_ptr<internal::StdinForwarder> stdin_forwarder_;
  StallInspector stall_inspector_;
  boost::asio::steady_timer stall_timer_;
  monitor::Monitor monitor_;  // the straggler line, the --monitor page (monitor/monitor.h)
};

}  // namespace trainrun::launcher
