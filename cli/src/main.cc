// trainrun: start and supervise a distributed training job. All of it is in trainrun_cli and
// trainrun_launcher; see trainrun/cli/run_main.h.
//
// `trainrun --agent` (alone) is the hidden role the launcher starts on every remote host over SSH
// (trainrun/launcher/agent.h): it speaks the agent protocol on stdin/stdout. `trainrun --gpu-probe`
// (alone) prints what this host has for GPUs, for a remote --dry-run (collectives/gpu/loader.h).
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "trainrun/cli/run_main.h"
#include "trainrun/collectives/gpu/loader.h"
#include "trainrun/launcher/agent.h"
#include "trainrun/launcher/launcher.h"
#include "trainrun/rendezvous/environment.h"

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--agent") == 0) {
    // Inside a Slurm step started with `srun -u` the agent's stdout is a pty (already raw): the
    // Slurm channel's; anywhere else a terminal means a person typed it.
    const bool in_slurm_step = trainrun::env::Lookup(trainrun::env::kSlurmStepId).has_value();
    if ((::isatty(0) || ::isatty(1)) && !in_slurm_step) {
      std::fprintf(stderr,
                   "trainrun: error: --agent is the role trainrun starts on remote hosts over SSH; "
                   "it is not for use from a terminal\n");
      return 2;
    }
    return trainrun::launcher::RunAgent();
  }
  if (argc == 2 && std::strcmp(argv[1], "--gpu-probe") == 0) {
    const std::string probe =
        trainrun::collectives::gpu::DescribeProbe(trainrun::collectives::gpu::ProbeHost());
    std::printf("gpu: %s\n", probe.c_str());
    return 0;
  }
  trainrun::cli::InstallStderrLogger();
  return trainrun::cli::RunMain(trainrun::cli::Arguments(argc, argv), trainrun::launcher::Launch);
}
