// SSH as a HostChannel (channel/host_channel.h): each host's agent is started over an SSH
// connection of its own, made by libssh2 in this process or by the system `ssh`
// (SshOptions::client), with the user's ~/.ssh/config applied (ResolveSshTarget).
//
//   auto channel = trainrun::launcher::ssh::MakeSshHostChannel(options);
//   channel->Start(hosts, AgentCommand(path), deadline, on_stream);
#pragma once

#include <memory>

#include "channel/host_channel.h"
#include "ssh/ssh_config.h"

namespace trainrun::launcher::ssh {

// MakeSshHostChannel reaches hosts with `options` (-p, -i, --ssh-client, host-key policy, the SSH
// directory). Every connection is bounded by the deadline given to Start.
std::unique_ptr<channel::HostChannel> MakeSshHostChannel(SshOptions options);

}  // namespace trainrun::launcher::ssh
