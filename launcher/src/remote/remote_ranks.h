// The launcher's side of remote hosts: connecting to their agents (ConnectRemoteHosts), then
// RemoteRanks, which sends each agent its Job and turns what the agents say back into the same
// events local ranks produce (output, exits), so that one JobSupervisor and one OutputForwarder
// serve every host. Teardown reaches the agents as Terminate and Kill frames; an agent that goes
// silent or whose connection ends before it said Done is a failure naming its host.
//
//   auto agents = ConnectRemoteHosts(spec, remote_host_indices);        // in parallel, bounded
//   RemoteRanks remote(io, *std::move(agents), events);
//   remote.Start(jobs);                                                 // one Job per agent
//   AllRanks all({&local_ranks, &remote});                              // the supervisor's
//   RankControl
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
#include "remote/agent_connector.h"
#include "remote/agent_protocol.h"
#include "ssh/ssh_config.h"
#include "trainrun/launcher/exit_info.h"
#include "trainrun/launcher/job_environment.h"
#include "trainrun/launcher/launch_spec.h"
#include "trainrun/launcher/process_set.h"

namespace trainrun::launcher::remote {

// SshOptionsFor turns the job's SSH flags (-p, -i, --ssh-client, --ssh-strict-host-key-checking)
// into SshOptions; an unknown client or policy name is an InvalidArgument naming the flag.
absl::StatusOr<ssh::SshOptions> SshOptionsFor(const LaunchSpec& spec);

// RemoteTrainrunPath is the trainrun the agents run: --remote-trainrun, else this executable's
// own absolute path.
std::string RemoteTrainrunPath(const LaunchSpec& spec);

// NetworkInterfaceAddress is the IPv4 address of this host's interface `name`
// (--network-interface), for the rendezvous server to bind; an unknown interface, or one without an
// IPv4 address, is an InvalidArgument naming it.
absl::StatusOr<std::string> NetworkInterfaceAddress(const std::string& name);

// ConnectRemoteHosts connects to the agents of the plan's hosts `host_indices` (indices into
// spec.plan.hosts), all in parallel, within spec.start_timeout. On a terminal it shows one
// progress line while that takes longer than a second. The first failure is returned at once
// (one line naming the host and the reason), and every session already open is closed.
absl::StatusOr<std::vector<RemoteAgent>> ConnectRemoteHosts(const LaunchSpec& spec,
                                                            const std::vector<int>& host_indices);

// AdvertiseHost is the address remote ranks dial when the rendezvous server binds a wildcard
// address: this machine's side of the first agent's connection ("127.0.0.1" when unknown).
std::string AdvertiseHost(const std::vector<RemoteAgent>& agents);

// MakeJobs builds agent i's Job for the plan's host host_indices[i]: its ranks with their whole
// environments (JobEnvironment::ForRank, the job token included), the command, this directory and
// the grace period. With a wildcard `bind_address`, each host's ranks dial the rendezvous server
// (`port`) at the address its own SSH connection arrived from. When rank 0 runs on this machine,
// remote ranks' MASTER_ADDR is this machine's address toward them, not "localhost".
std::vector<Job> MakeJobs(const LaunchSpec& spec, const JobEnvironment& environment,
                          const std::vector<RemoteAgent>& agents,
                          const std::vector<int>& host_indices, const std::string& bind_address,
                          int port);

// RemoteEvents are the events of remote ranks, delivered on the io_context's thread.
struct RemoteEvents {
  std::function<void(int rank, OutputStream stream, std::string_view bytes)> on_output;
  // Once per rank sent in a Job: its real end, or, when its host's agent was lost, a SIGKILL
  // stamped after on_failure (so that the host's failure, not the rank, is blamed).
  std::function<void(int rank, const ExitInfo& exit)> on_exit;
  // A host-level failure (agent lost, silent, or unable to start its ranks), one line naming it.
  std::function<void(int first_rank, std::string message)> on_failure;
};

// RemoteRanks owns the agents' connections for the job's duration. Use it on the io_context's
// thread; one reader thread per agent posts what arrives there. Destroying it closes every
// connection, which makes each agent kill whatever it still runs.
class RemoteRanks : public RankControl {
 public:
  RemoteRanks(boost::asio::io_context& io, std::vector<RemoteAgent> agents, RemoteEvents events);
  ~RemoteRanks() override;
  RemoteRanks(const RemoteRanks&) = delete;
  RemoteRanks& operator=(const RemoteRanks&) = delete;

  const std::vector<RemoteAgent>& agents() const { return agents_; }

  // Start sends agent i the Job jobs[i], starts listening to every agent, and starts the
  // heartbeats. Ranks that have not all reported Started within `start_timeout` fail the job.
  void Start(std::vector<Job> jobs, std::chrono::seconds start_timeout);

  void TerminateAll() override;
  void KillAll() override;

 private:
  struct Host;

  void Send(Host& host, const std::string& frame);
  void ReaderLoop(Host& host);
  void OnFrame(Host& host, const Frame& frame);
  void OnEnd(Host& host, const std::string& reason);
  void Fail(Host& host, const std::string& message);
  void Heartbeat();

  boost::asio::io_context& io_;
  std::vector<RemoteAgent> agents_;
  RemoteEvents events_;
  std::vector<std::unique_ptr<Host>> hosts_;
  boost::asio::steady_timer heartbeat_;
  boost::asio::steady_timer start_deadline_;
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

 private:
  std::vector<RankControl*> parts_;
};

}  // namespace trainrun::launcher::remote
