// How the job reaches its remote hosts: the HostChannel its flags select (SSH today, with -p, -i,
// --ssh-client and --ssh-strict-host-key-checking), and the agent that channel starts there.
#pragma once

#include <memory>
#include <string>

#include "channel/host_channel.h"
#include "ssh/ssh_config.h"
#include "trainrun/launcher/launch_spec.h"

namespace trainrun::launcher::remote {

// MakeHostChannel is the HostChannel of `spec`: one `srun` step per node when UsesSlurm(spec),
// else SSH.
std::unique_ptr<channel::HostChannel> MakeHostChannel(const LaunchSpec& spec);

// JoinedHostChannel is the channel of one host that came by itself with its stream already open
// (per-node mode: a node that joined the running job, channel::LateHost): Start hands that stream
// on, so that the usual greeting (ConnectAgent) reads its agent's Hello.
std::shared_ptr<channel::HostChannel> JoinedHostChannel(
    std::unique_ptr<channel::HostStream> stream);

// UsesSlurm: --launcher slurm, or auto with the hosts from the Slurm allocation and srun on PATH.
bool UsesSlurm(const LaunchSpec& spec);

// SchedulerEnded says why the scheduler ended the job's allocation, when `spec` launched through
// one and it did (slurm::AllocationEnded); "" otherwise. The summary of a failed job starts with
// it. `settle`: the failure may be the scheduler's, so wait up to 3 s for its controller to record
// it.
std::string SchedulerEnded(const LaunchSpec& spec, bool settle);

// SshOptionsFor turns the job's SSH flags (-p, -i, --ssh-client, --ssh-strict-host-key-checking,
// --start-timeout) into SshOptions.
ssh::SshOptions SshOptionsFor(const LaunchSpec& spec);

// RemoteTrainrunPath is the trainrun the agents run: --remote-trainrun, else this executable's
// own absolute path.
std::string RemoteTrainrunPath(const LaunchSpec& spec);

}  // namespace trainrun::launcher::remote
