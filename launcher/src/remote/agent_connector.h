// Connecting to every remote host's agent at once, through the job's HostChannel: the channel
// starts the agents and gives back one stream per host; each stream is greeted (the agent's Hello)
// in parallel, all before the same deadline (--start-timeout). The first failure ends the attempt:
// the streams already open are closed (their agents see end-of-file and exit), and the error names
// the host.
//
//   auto channel = ssh::MakeSshHostChannel(options);
//   auto agents = ConnectAgents(*channel, hosts, AgentCommand("/usr/bin/trainrun"), deadline,
//                               [](int connected, int total) { /* progress line */ });
//   for (RemoteAgent& agent : *agents) agent.stream->Write(EncodeJob(job), ...);
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "channel/host_channel.h"
#include "remote/agent_protocol.h"
#include "trainrun/hostfile/slot_plan.h"

namespace trainrun::launcher::remote {

// RemoteAgent is one host's agent, connected and greeted.
struct RemoteAgent {
  hostfile::HostSpec host;  // as the user wrote it; host.host names it in messages
  std::unique_ptr<channel::HostStream> stream;
  Hello hello;
  FrameReader reader;  // holds any bytes that arrived after the Hello

  const std::string& name() const { return host.host; }
};

// AgentCommand is the command line that starts an agent: `<remote trainrun> --agent`, quoted for
// the remote login shell.
std::string AgentCommand(const std::string& remote_trainrun);

// ConnectAgents starts `command` on every one of `hosts` through `channel` and waits for each
// agent's Hello, all in parallel and before `deadline`; returns the agents in the hosts' order
// (without the hosts the channel called absent, channel::HostAbsent), or the first failure as soon
// as it happens. An agent that cannot be started (trainrun missing there,
// another protocol version) is reported with what to do; agents of another trainrun release with
// the same protocol are one warning line (ReleaseMismatch). `on_progress` is called (from the
// calling thread) each time another host connects.
absl::StatusOr<std::vector<RemoteAgent>> ConnectAgents(
    channel::HostChannel& channel, const std::vector<hostfile::HostSpec>& hosts,
    const std::string& command, absl::Time deadline,
    const std::function<void(int connected, int total)>& on_progress = {});

// ReleaseMismatch is one line naming each agent whose trainrun release differs from this one's, and
// both releases ("host h2 runs trainrun 0.2.0, this is trainrun 0.1.0 (...)"); "" when all agree.
// ConnectAgents logs it as a warning: the agents speak this trainrun's protocol (else they are
// refused), so the job can go on, but the hosts should be brought to one release.
std::string ReleaseMismatch(const std::vector<RemoteAgent>& agents);

// ConnectAgent is ConnectAgents for one host.
absl::StatusOr<RemoteAgent> ConnectAgent(channel::HostChannel& channel,
                                         const hostfile::HostSpec& host, const std::string& command,
                                         absl::Time deadline);

// LauncherAddress is this machine's address as `agent`'s host sees it: the local address of the
// connection, else the first word of the host's SSH_CONNECTION; "" when neither is known.
std::string LauncherAddress(const RemoteAgent& agent);

// RendezvousBindAddress picks the address the rendezvous server binds for a job with remote hosts:
// the local address of the connections toward them (the first agent's, when they agree; the
// wildcard address when they differ, e.g. hosts reached over different interfaces).
std::string RendezvousBindAddress(const std::vector<RemoteAgent>& agents);

// AdvertiseHost is the address ranks dial when the rendezvous server binds a wildcard address:
// this machine's side of the first agent's connection ("127.0.0.1" when unknown).
std::string AdvertiseHost(const std::vector<RemoteAgent>& agents);

}  // namespace trainrun::launcher::remote
