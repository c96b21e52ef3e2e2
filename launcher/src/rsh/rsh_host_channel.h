// The remote-shell HostChannel: any program that runs a command on a named host, as mpirun's
// `plm_rsh_agent` (`--rsh-agent CMD`, `-mca plm_rsh_agent CMD`, TRAINRUN_RSH_AGENT): trainrun runs
// `CMD... HOST TRAINRUN --agent` once per host, and the agent protocol goes over that program's
// stdin and stdout, as the Slurm channel's does over `srun`. Grid Engine's `qrsh -inherit` (so the
// scheduler accounts for and kills the ranks), `kubectl exec` and `docker exec` wrappers,
// pdsh-style or site-specific jump scripts all work this way.
//
// The remote command is passed as separate words (the trainrun path, shell-quoted only where it
// needs quoting, then --agent), so both kinds of agent run it: those that join the words into a
// line for a remote shell (ssh, qrsh, rsh) and those that exec them as given (kubectl exec, docker
// exec).
//
//   auto channel = rsh::MakeRshHostChannel({"qrsh", "-inherit"}, SgeJobEnded);
//   channel->Start(hosts, "/usr/bin/trainrun --agent", deadline, on_stream);
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "channel/host_channel.h"

namespace trainrun::launcher::rsh {

// MakeRshHostChannel reaches each host with `agent` (the program and its first words); `label`
// names it in messages ("qrsh -inherit"; default: the words joined). `scheduler_ended` (may be
// empty) says why a scheduler ended the host's command, for the summary.
std::unique_ptr<channel::HostChannel> MakeRshHostChannel(
    std::vector<std::string> agent, std::function<std::string()> scheduler_ended = {});

}  // namespace trainrun::launcher::rsh
