// How each host of a plan is reached, in words, for `trainrun --dry-run`.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "trainrun/hostfile/slot_plan.h"
#include "trainrun/launcher/launch_spec.h"

namespace trainrun::launcher {

// DescribeHostAccess says in one phrase how `host` is reached under `spec`: "local (no SSH)", or
// "ssh root@h1 port 22 (libssh2, host keys accept-new), keys: ...; agent: /usr/bin/trainrun
// --agent". A host whose SSH configuration cannot be read gets the reason instead.
std::string DescribeHostAccess(const LaunchSpec& spec, const hostfile::HostSpec& host);
// DescribeHostsAccess is DescribeHostAccess for every host of `spec`'s plan, in its order, with one
// channel for all (a plan of 10,000 hosts is described in a fraction of a second).
std::vector<std::string> DescribeHostsAccess(const LaunchSpec& spec);

// ProbeRemoteTrainrun asks each host of `spec`'s plan that is not this machine, all at once and
// within --start-timeout, for the trainrun its agent would run (`<path> --version` over the job's
// channel), and says in one line per such host what it found: "h1: trainrun 0.1.0 at
// /usr/bin/trainrun, as here", "... but this is trainrun 0.2.0", or why there is none ("h2:
// trainrun not found at /opt/x; install it there, or pass --remote-trainrun PATH", "h3: name not
// resolved ..."). A host appears once, however many times the plan lists it.
// `on_line` (may be empty) gets each host's line as its answer comes, one at a time (so a plan of
// many hosts shows its first answers at once).
std::vector<std::string> ProbeRemoteTrainrun(
    const LaunchSpec& spec, const std::function<void(const std::string& line)>& on_line = {});

}  // namespace trainrun::launcher
