// The launcher's side of remote hosts once their agents are connected (agent_connector.h):
// RemoteRanks, which sends each agent its Job and turns what the agents say back into the same
// events local ranks produce (output, exits), so that one JobSupervisor and one OutputForwarder
// serve every host. Teardown reaches the agents as Terminate and Kill frames; an agent that goes
// silent or whose connection ends before it said Done is a failure naming its host.
//
//   RemoteRanks remote(io, std::move(agents), events);
//   remote.Start(jobs, deadline);            // one Job per agent; every rank started by `deadline`
//   AllRanks all({&local_ranks, &remote});   // the supervisor's RankControl
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "remote/agent.h"
#include "remote/agent_connector.h"
#include "remote/agent_protocol.h"
#include "start_deadline.h"
#include "trainrun/launcher/exit_info.h"
#include "trainrun/launcher/process_set.h"

namespace trainrun::launcher::remote {

// RemoteEvents are the events of remote ranks, delivered on the io_context's thread.
struct RemoteEvents {
  std::function<void(int rank, OutputStream stream, std::string_view bytes)> on_output;
  // Once per rank sent in a Job: its real end, or, when its host's agent was lost, a SIGKILL
  // stamped after on_failure (so that the host's failure, not the rank, is blamed).
  std::function<void(int rank, const ExitInfo& exit)> on_exit;
  // A host-level failure (agent lost, silent, or unable to start its ranks), one line naming it.
  std::function<void(int first_rank, std::string message)> on_failure;
  // A rank's command runs, bound to the CPUs `binding` describes (cpu_binding.h). Optional.
  std::function<void(int rank, const std::string& binding)> on_started;
  // Elastic jobs: a host whose agent was lost (its connection ended or fell silent) before its
  // ranks `ranks` (those not yet reported ended) did. When set, it replaces on_failure and those
  // ranks' on_exit for that event: the ranks are lost, not failed. `why` is one line naming the
  // host.
  std::function<void(const std::vector<int>& ranks, const std::string& why)> on_host_lost;
};

// RemoteTiming: how often the launcher heartbeats and how long a silent agent is waited for.
struct RemoteTiming {
  std::chrono::milliseconds heartbeat = kHeartbeatInterval;
  std::chrono::milliseconds silence = kSilenceLimit;
};

// RemoteRanks owns the agents' connections for the job's duration. Use it on the io_context's
// thread; one reader thread per agent posts what arrives there. Destroying it closes every
// connection, which makes each agent kill whatever it still runs.
class RemoteRanks : public RankControl {
 public:
  RemoteRanks(boost::asio::io_context& io, std::vector<RemoteAgent> agents, RemoteEvents events,
              RemoteTiming timing = {});
  ~RemoteRanks() override;
  RemoteRanks(const RemoteRanks&) = delete;
  RemoteRanks& operator=(const RemoteRanks&) = delete;

  const std::vector<RemoteAgent>& agents() const { return agents_; }

  // Start sends agent i the Job jobs[i], starts listening to every agent, and starts the
  // heartbeats. A host whose ranks have not all reported Started by `deadline` (the job's one start
  // deadline, which began before the hosts were connected) fails the job, naming it.
  void Start(std::vector<Job> jobs, const StartDeadline& deadline);

  // Add takes an agent connected while the job runs (an elastic job growing onto a host of its
  // discovery script) and sends it `job`: from then on its ranks are the job's like those of the
  // start (output, exits, heartbeats, teardown, a lost host). One Job per agent: a later batch on
  // the same host comes with another agent. An agent that reports an error (it cannot start a
  // rank) is its ranks' loss through on_host_lost when set, else a failure.
  void Add(RemoteAgent agent, const Job& job);

  void TerminateAll() override;
  void KillAll() override;
  void TerminateRanks(const std::vector<int>& ranks) override;
  void KillRanks(const std::vector<int>& ranks) override;

  // EndJob tells every agent still connected the job's outcome (per-node mode: a joined node's
  // trainrun prints the summary and exits with the code).
  void EndJob(const JobEnd& end);
  // Connected counts the agents whose stream has not ended (per-node mode: the nodes still there).
  int Connected() const;

 private:
  struct Host;

  void Send(Host& host, const std::string& frame);
  // SendJob sends `job` to the host's agent; its ranks become the host's.
  void SendJob(Host& host, const Job& job);
  void ReaderLoop(Host& host);
  void OnFrame(Host& host, const Frame& frame);
  void OnEnd(Host& host, const std::string& reason);
  void Fail(Host& host, const std::string& message);
  // Lost: the host's ranks not yet ended are gone (on_host_lost); false without on_host_lost.
  bool Lost(Host& host, const std::string& why);
  void Heartbeat();

  boost::asio::io_context& io_;
  std::vector<RemoteAgent> agents_;
  std::vector<std::unique_ptr<RemoteAgent>> added_agents_;  // Add's, each its Host's
  RemoteEvents events_;
  RemoteTiming timing_;
  std::vector<std::unique_ptr<Host>> hosts_;
  boost::asio::steady_timer heartbeat_;
  boost::asio::steady_timer start_deadline_;
  bool heartbeating_ = false;
  std::atomic<bool> stopping_{false};
};

// AllRanks fans TerminateAll and KillAll out to several RankControls (local and remote ranks).
class AllRanks : public RankControl {
 public:
  explicit AllRanks(std::vector<RankControl*> parts) : parts_(std::move(parts)) {}
  void TerminateAll() override {
    for (RankControl* part : parts_) part->TerminateAll();
  }
  void KillAll() override {
    for (RankControl* part : parts_) part->KillAll();
  }
  void TerminateRanks(const std::vector<int>& ranks) override {
    for (RankControl* part : parts_) part->TerminateRanks(ranks);
  }
  void KillRanks(const std::vector<int>& ranks) override {
    for (RankControl* part : parts_) part->KillRanks(ranks);
  }

 private:
  std::vector<RankControl*> parts_;
};

}  // namespace trainrun::launcher::remote
