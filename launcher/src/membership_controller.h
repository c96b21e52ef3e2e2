// MembershipController: JobRun's seam for how a running job's members change, chosen by the
// job's FailureMode (failure_policy.h). A job with fixed members (fail fast, restart) has
// FixedMembership: a lost remote host is a failure, the ranks' peer-failure reports are trusted.
// An elastic job has ElasticController (elastic_controller.h): it survives lost hosts, discovers
// hosts, grows onto them, blacklists and publishes each generation. JobRun calls the same methods
// whatever the mode.
#pragma once

#include <boost/asio/io_context.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "job_plan.h"
#include "remote/remote_ranks.h"
#include "trainrun/launcher/job_environment.h"
#include "trainrun/launcher/job_supervisor.h"
#include "trainrun/launcher/launch_spec.h"
#include "trainrun/launcher/output_forwarder.h"
#include "trainrun/launcher/process_set.h"
#include "trainrun/rendezvous/server.h"

namespace trainrun::launcher {

// JobParts are the parts of a JobRun a controller acts on; they outlive it. The controller is made
// before the ranks and the supervisor exist and uses them only once the job runs.
struct JobParts {
  const LaunchSpec& spec;
  const JobPlan& plan;
  boost::asio::io_context& io;
  hostfile::SlotPlan& slots;  // the job's slots: the plan's, then those it grew by
  std::vector<HostView>& views;
  std::optional<JobSupervisor>& supervisor;
  std::unique_ptr<rendezvous::Server>& server;
  RankProcessSet& local_ranks;
  remote::RemoteRanks& remote_ranks;
  OutputForwarder& output;
  const std::string& bind_address;  // the rendezvous server's
  bool& host_failed;                // a remote host's agent failed or was lost
  // The Job a remote host's agent gets, without its ranks (JobRun::RemoteJob).
  std::function<remote::Job()> remote_job;
  // What a remote host's agent decides of its view (JobRun::SeenThrough).
  std::function<void(const remote::RemoteAgent& agent, bool master_here, HostView& view)>
      seen_through;
  // The channel that reached the start's hosts; hosts that come by themselves while the job runs
  // (per-node mode's joining nodes) arrive through it (HostChannel::AcceptLateHosts).
  std::shared_ptr<channel::HostChannel> channel;
};

class MembershipController {
 public:
  virtual ~MembershipController() = default;

  // Timing is the remote hosts' heartbeat and silence limit; Configure adds the controller's
  // fields to a remote host's Job (the agent's silence limit).
  virtual remote::RemoteTiming Timing() const { return {}; }
  virtual void Configure(remote::Job& job) const {}
  // HostLostHandler is RemoteEvents::on_host_lost; empty when a lost host is a failure.
  virtual std::function<void(const std::vector<int>&, const std::string&)> HostLostHandler() {
    return {};
  }
  // TrustsPeerReports: a rank's "failed because of peer P" names slots (false when rank numbers
  // change with each generation).
  virtual bool TrustsPeerReports() const { return true; }
  // OnRankExit hands a rank's end to the supervisor, with what the controller makes of it.
  virtual void OnRankExit(int rank, const ExitInfo& exit) = 0;
  // OnMembershipChange is the supervisor's on_membership_change.
  virtual void OnMembershipChange(const MembershipChange& change) {}
  // Start begins what runs beside the job (host discovery); Stop ends it, waiting briefly for
  // what is under way. Stop is idempotent.
  virtual void Start() {}
  virtual void Stop() {}
  // Per-node mode: NodesWaiting counts the nodes that joined while the job ran and wait for its
  // next start (a --nnodes MIN:MAX job with --max-restarts); EndJob tells them the job's outcome,
  // as RemoteRanks::EndJob tells the others.
  virtual int NodesWaiting() const { return 0; }
  virtual void EndJob(const remote::JobEnd& end) {}
};

// MakeMembershipController: the controller for `parts.spec`'s FailureMode.
std::unique_ptr<MembershipController> MakeMembershipController(JobParts parts);

}  // namespace trainrun::launcher
