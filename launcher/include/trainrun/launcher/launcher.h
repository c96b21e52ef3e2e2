// Launch: run one job to its end and say what trainrun should exit with.
//
//   trainrun::launcher::LaunchSpec spec;
//   spec.plan = *trainrun::hostfile::PlanSlots(hosts, 4);
//   spec.command = {"python3", "train.py"};
//   absl::StatusOr<int> code = trainrun::launcher::Launch(spec);
//   return code.ok() ? *code : ReportAndMapToExitCode(code.status());
//
// Launch starts one rank per entry of spec.plan, each with the worker environment of DESIGN.md
// (JobEnvironment) and the address of the job's rendezvous server, which runs while the ranks do,
// forwards their output (OutputForwarder), and supervises them (JobSupervisor):
// the first failure ends the job, Ctrl-C/SIGTERM/SIGHUP end it with 130/143/129, and one summary is
// logged. While it runs it handles SIGINT, SIGTERM, SIGHUP, SIGCHLD and ignores SIGPIPE; it
// restores them before it returns.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "trainrun/launcher/launch_spec.h"
#include "trainrun/launcher/local_host.h"

namespace trainrun::launcher {

// Launch runs the job and returns trainrun's exit code: 0 when every rank exited 0; the first
// failed rank's code (128+N for signal N); 128+N when trainrun got signal N. An error Status for
// what kept the job from starting: NotFound when the command cannot be executed here (one line,
// "cannot execute 'NAME': REASON"; trainrun exits 127), an empty command or plan, a remote host
// that could not be reached or whose agent did not start within spec.start_timeout (one line naming
// the host and the reason), an unknown --network-interface, a bad -x, an --output-filename
// directory that cannot be made.
//
// Hosts that are not this machine (IsLocalHost) are reached over SSH: `trainrun --agent` runs
// there (src/remote/), started with that host's ranks, and its ranks are supervised as local ones.
absl::StatusOr<int> Launch(const LaunchSpec& spec);

}  // namespace trainrun::launcher
