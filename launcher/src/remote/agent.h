// The agent's timing (its entry point, RunAgent, is public: trainrun/launcher/agent.h).
//
// The agent: `trainrun --agent`, started by the launcher on a remote host over SSH. It reads its
// host's Job from stdin, starts those ranks with the launcher's own RankProcessSet, and sends their
// output and exits back on stdout (agent_protocol.h). It obeys Terminate and Kill, and kills its
// ranks when the launcher goes away: end-of-file on stdin (launcher killed, connection closed), no
// frame for kSilenceLimit (network lost), or the death of its parent, the SSH session
// (PR_SET_PDEATHSIG).
#pragma once

#include <chrono>

namespace trainrun::launcher::remote {

// The launcher sends a Heartbeat this often; the agent gives up after kSilenceLimit without any
// frame.
inline constexpr std::chrono::seconds kHeartbeatInterval{5};
inline constexpr std::chrono::seconds kSilenceLimit{30};

}  // namespace trainrun::launcher::remote
