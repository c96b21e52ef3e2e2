// ElasticController: the elastic job's MembershipController (--min-np). It owns what an elastic
// job does beside supervising its ranks (ElasticPolicy decides what a loss means):
//   - lost hosts: a host whose agent is lost or silent loses its ranks (blacklisting the host),
//   with
//     the elastic heartbeat and silence limit (remote/agent.h);
//   - joining nodes (per-node mode's --nnodes MIN:MAX): a node that joins the running job through
//     the job's channel (HostChannel::AcceptLateHosts) is grown onto as a host of its own;
//   - discovery (--host-discovery-script): a thread runs the script every
//     ElasticSpec::discovery_interval and posts its outcome to OnDiscovered, which stops the ranks
//     of hosts that left the output (JobSupervisor::OnRanksRemoved) and grows onto listed hosts;
//   - growth: Grow starts ranks on a host as slots past the plan's, pending in the supervisor;
//     WatchGrowth makes each batch one membership change once its ranks joined the rendezvous;
//   - the blacklist: a host whose rank failed gets no new ranks until its cooldown has passed;
//   - generations: PublishGeneration tells the ranks each new generation through the rendezvous
//     (rendezvous/generation.h) and WatchGenerations logs it once every member joined it.
// Growth is implemented in elastic_growth.cc, the rest in elastic_controller.cc.
#pragma once

#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "membership_controller.h"
#include "remote/agent_connector.h"
#include "trainrun/hostfile/slot_plan.h"
#include "trainrun/rendezvous/rank_place.h"

namespace trainrun::launcher {

class ElasticController final : public MembershipController {
 public:
  explicit ElasticController(JobParts parts);
  ~ElasticController() override;

  remote::RemoteTiming Timing() const override;
  void Configure(remote::Job& job) const override;
  std::function<void(const std::vector<int>&, const std::string&)> HostLostHandler() override;
  bool TrustsPeerReports() const override { return false; }
  void OnRankExit(int rank, const ExitInfo& exit) override;
  void OnMembershipChange(const MembershipChange& change) override { PublishGeneration(change); }
  void Start() override {
    StartDiscovery();
    AcceptNodes();
  }
  void EndJob(const remote::JobEnd& end) override;
  void Stop() override;

 private:
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
  // `channel`: how to reach the host (none: the start's, remote::MakeHostChannel).
  void ConnectToGrow(const hostfile::HostSpec& host, int count, bool joined_host,
                     std::chrono::steady_clock::time_point since,
                     std::shared_ptr<channel::HostChannel> channel = nullptr);
  // Per-node mode (--nnodes MIN:MAX): AcceptNodes has the job's channel hand each node that joins
  // the running job to OnNodeJoined (on the io thread), which grows onto it with its
  // --nproc-per-node ranks through the agent on its join connection.
  void AcceptNodes();
  void OnNodeJoined(channel::LateHost node);
  void OnGrowConnected(const hostfile::HostSpec& host, int count, bool joined_host,
                       std::chrono::steady_clock::time_point since,
                       absl::StatusOr<remote::RemoteAgent> agent);
  // The view of a host the job grew onto (`agent`: its agent; null for this machine).
  HostView GrownHostView(const hostfile::HostSpec& host, const remote::RemoteAgent* agent) const;
  // Why the ranks of a remote host could not join this job ("" when they can).
  std::string CannotReachFromRanks(const std::string& host) const;
  // The ranks running or pending, and those whose agent is being connected.
  int LiveOrConnecting() const;
  void WatchGrowth();
  // Blacklisting (elastic jobs with --host-discovery-script): a host whose rank failed gets no new
  // ranks until its cooldown (--blacklist-cooldown-range; forever without it) has passed.
  void Blacklist(const std::string& host, const std::string& what);
  bool Blacklisted(const std::string& host, std::chrono::steady_clock::time_point now) const;
  // EndIfEveryHostBlacklisted ends the job (EveryHostBlacklisted, saying `failure`, exit code
  // `code`) when every host of the discovery output is blacklisted for good, as Horovod fails.
  void EndIfEveryHostBlacklisted(const std::string& failure, int code);
  // Place is rank `slot`'s place in the job's newest membership with `added` joined to it.
  std::optional<rendezvous::RankPlace> PlaceWith(const std::vector<int>& added, int slot) const;

  // JobRun's parts (JobParts), under the names JobRun gives them.
  const LaunchSpec& spec_;
  const JobPlan& plan_;
  boost::asio::io_context& io_;
  hostfile::SlotPlan& slots_;
  std::vector<HostView>& views_;
  std::optional<JobSupervisor>& supervisor_;
  std::unique_ptr<rendezvous::Server>& server_;
  RankProcessSet& local_ranks_;
  remote::RemoteRanks& remote_ranks_;
  OutputForwarder& output_;
  const std::string& bind_address_;
  bool& host_failed_;
  std::function<remote::Job()> remote_job_;
  std::function<void(const remote::RemoteAgent&, bool, HostView&)> seen_through_;
  std::shared_ptr<channel::HostChannel> channel_;  // the start's (JobParts::channel)
  std::vector<remote::RemoteAgent> ending_nodes_;  // nodes that joined as the job was ending

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
  // What the connecting threads share with the controller: once `closed` (Stop), they post nothing
  // and close the agent they got. Stop waits up to a second for `running` to reach 0.
  struct Connections {
    std::mutex mu;
    std::condition_variable changed;
    bool closed = false;
    int running = 0;
  };
  std::shared_ptr<Connections> connections_ = std::make_shared<Connections>();
  // The newest generation published, and the oldest not yet seen formed.
  int published_generation_ = 0;
  int forming_generation_ = 1;
  boost::asio::steady_timer generation_timer_;
  boost::asio::steady_timer growth_timer_;
};

}  // namespace trainrun::launcher
