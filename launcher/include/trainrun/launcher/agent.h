// The agent: `trainrun --agent`, the role the launcher starts on every remote host (over SSH
// today). It reads its host's Job from stdin, starts those ranks, and reports their output and
// exits on stdout (the agent protocol, launcher/src/remote/agent_protocol.h). It kills its ranks
// when the launcher goes away: end-of-file on stdin, silence, or the death of its parent.
//
//   if (argc == 2 && std::strcmp(argv[1], "--agent") == 0) return trainrun::launcher::RunAgent();
#pragma once

namespace trainrun::launcher {

// RunAgent runs the agent over fds 0 and 1 and returns the process's exit code: 0 when every rank
// exited 0, 1 otherwise (the launcher learns each rank's end from Exit messages, not from this).
int RunAgent();

}  // namespace trainrun::launcher
