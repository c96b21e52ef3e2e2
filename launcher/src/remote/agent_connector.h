// Connecting to every remote host's agent at once: one SSH session per host, all in parallel, each
// bounded by the same deadline (--start-timeout). The first failure ends the attempt: the sessions
// already open are closed (their agents see end-of-file and exit), and the error names the host.
//
//   auto agents = ConnectAgents(targets, AgentCommand("/usr/bin/trainrun"), options, deadline,
//                               [](int connected, int total) { /* progress line */ });
//   for (RemoteAgent& agent : *agents) agent.channel->Write(EncodeJob(job), ...);
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "remote/agent_protocol.h"
#include "ssh/remote_channel.h"
#include "ssh/ssh_config.h"

namespace trainrun::launcher::remote {

// RemoteAgent is one host's agent, connected and greeted.
struct RemoteAgent {
  ssh::SshTarget target;
  std::unique_ptr<ssh::RemoteChannel> channel;
  Hello hello;
  FrameReader reader;  // holds any bytes that arrived after the Hello
};

// AgentCommand is the exec command that starts an agent: `<remote trainrun> --agent`, quoted for
// the remote login shell.
std::string AgentCommand(const std::string& remote_trainrun);

// ConnectAgent opens one host's session, starts its agent and waits for its Hello, before
// `deadline`. An agent that cannot be started (trainrun missing there, another version) is
// reported with what to do. `cancelled`, when given, is polled while waiting for the greeting.
absl::StatusOr<RemoteAgent> ConnectAgent(const ssh::SshTarget& target, const std::string& command,
                                         const ssh::SshOptions& options, absl::Time deadline,
                                         const std::function<bool()>& cancelled = {});

// ConnectAgents runs ConnectAgent for every target in parallel and returns the agents in the
// targets' order, or the first failure as soon as it happens. `on_progress` is called (from the
// calling thread) each time another host connects.
absl::StatusOr<std::vector<RemoteAgent>> ConnectAgents(
    const std::vector<ssh::SshTarget>& targets, const std::string& command,
    const ssh::SshOptions& options, absl::Time deadline,
    const std::function<void(int connected, int total)>& on_progress);

// RendezvousBindAddress picks the address the rendezvous server binds for a job with remote hosts:
// the local address of the connections toward them (the first agent's, when they agree; the
// wildcard address when they differ, e.g. hosts reached over different interfaces).
std::string RendezvousBindAddress(const std::vector<RemoteAgent>& agents);

}  // namespace trainrun::launcher::remote
