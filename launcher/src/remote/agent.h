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
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "remote/agent_protocol.h"
#include "trainrun/launcher/process_set.h"

namespace trainrun::launcher::remote {

// The launcher sends a Heartbeat this often; the agent gives up after kSilenceLimit without any
// frame.
inline constexpr std::chrono::seconds kHeartbeatInterval{5};
inline constexpr std::chrono::seconds kSilenceLimit{30};
// An elastic job (--min-np) must notice a lost host within seconds (its survivors wait for the
// next generation meanwhile): its launcher heartbeats this often and each side gives the other up
// after kElasticSilenceLimit (sent to the agent in the Job).
inline constexpr std::chrono::milliseconds kElasticHeartbeatInterval{250};
inline constexpr std::chrono::milliseconds kElasticSilenceLimit{1500};

// AgentOptions: how RunAgentOn talks to its launcher. The defaults are `trainrun --agent`'s.
struct AgentOptions {
  int in_fd = 0;   // the launcher's frames arrive here
  int out_fd = 1;  // the agent's frames go here (may be in_fd: a socket)
  // Silence allowed before the Job arrives (a per-node agent waits while other nodes join).
  std::chrono::seconds first_silence = kSilenceLimit;
  // Per-node mode: after Done, wait for the launcher's JobEnd (or the connection's end).
  bool await_job_end = false;
  // The SSH session is the agent's parent: its death ends the agent (PR_SET_PDEATHSIG).
  bool watch_parent = true;
  // Also given each piece of the ranks' output (a per-node agent shows its own ranks' lines on
  // its node's console as well); may be empty.
  std::function<void(int rank, OutputStream stream, std::string_view bytes)> on_output;
  // Per-node mode: undoes the launcher's seal of the job's token (TRAINRUN_JOB_TOKEN in each
  // rank's environment; channel/host_channel.h's Seal). May be empty: the token came as it is.
  std::function<std::string(const std::string&)> unseal_token;
};

// AgentOutcome is how an agent's session ended.
struct AgentOutcome {
  int exit_code = 0;              // 0 when every rank exited 0
  std::optional<JobEnd> job_end;  // the launcher's JobEnd, when it sent one
  bool launcher_gone = false;     // the connection ended (or fell silent) before the job did
};

// RunAgentOn runs the agent over `options`' descriptors until its session ends.
AgentOutcome RunAgentOn(const std::string& release, const AgentOptions& options);

}  // namespace trainrun::launcher::remote
