// How each host of a plan is reached, in words, for `trainrun --dry-run`.
#pragma once

#include <string>

#include "trainrun/hostfile/slot_plan.h"
#include "trainrun/launcher/launch_spec.h"

namespace trainrun::launcher {

// DescribeHostAccess says in one phrase how `host` is reached under `spec`: "local (no SSH)", or
// "ssh root@h1 port 22 (libssh2, host keys accept-new), keys: ...; agent: /usr/bin/trainrun
// --agent". A host whose SSH configuration cannot be read gets the reason instead.
std::string DescribeHostAccess(const LaunchSpec& spec, const hostfile::HostSpec& host);

}  // namespace trainrun::launcher
