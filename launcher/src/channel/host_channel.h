// HostChannel: how the launcher reaches the hosts that are not this machine — the one seam between
// the job pipeline and a way of reaching hosts. A HostChannel starts the agent (`trainrun --agent`)
// on N hosts and gives back one byte stream per host, connected to that agent's stdin and stdout;
// everything above it (the agent protocol, supervision, the job's environment) is the same however
// the hosts were reached. Three implement it: SSH (ssh/ssh_host_channel.h: libssh2 in-process, or
// the system `ssh`), Slurm (slurm/: one `srun` step per node) and per-node mode (nodes/: each
// node's own trainrun dials node 0's and serves as its agent), and they need nothing more than
// this:
//
//   std::unique_ptr<HostChannel> channel = ssh::MakeSshHostChannel(options);
//   channel->Start(hosts, "/usr/bin/trainrun --agent", deadline,
//                  [&](int host, absl::StatusOr<std::unique_ptr<HostStream>> stream) { ... });
//
// The launcher then reads each agent's Hello from its stream (remote/agent_connector.h), and speaks
// the agent protocol over it until the job ends; destroying a stream ends that host's agent.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "trainrun/hostfile/slot_plan.h"

namespace trainrun::launcher::channel {

// HostStream is one host's agent seen as a byte stream: its stdin (Write) and stdout (Read).
//
// Read and Write may be called from two threads at once (one reader, one writer); everything else
// from one thread. Destroying the stream closes the connection, which makes the agent kill its
// ranks.
class HostStream {
 public:
  virtual ~HostStream() = default;
  HostStream(const HostStream&) = delete;
  HostStream& operator=(const HostStream&) = delete;

  // Write sends all of `data` to the agent's stdin, waiting at most `timeout` for room.
  virtual absl::Status Write(absl::string_view data, absl::Duration timeout) = 0;

  // Read waits at most `timeout` for the agent's stdout and returns how many bytes it put in
  // `buffer` (at least 1), 0 once that stdout has ended, DeadlineExceeded when nothing came,
  // Cancelled after Interrupt(), or an error naming the host when the connection failed.
  virtual absl::StatusOr<size_t> Read(char* buffer, size_t size, absl::Duration timeout) = 0;

  // Interrupt makes a Read blocked in another thread return Cancelled, now and from then on.
  virtual void Interrupt() = 0;

  // CloseStdin sends end-of-file to the agent.
  virtual void CloseStdin() = 0;

  // EndStatus, after Read returned 0 or an error, says why the remote side ended, in one line
  // naming the host: the command's exit status, or the transport's failure (name not resolved,
  // refused, authentication, host key, ...).
  virtual absl::Status EndStatus() = 0;

  // LocalAddress is this machine's address on the connection toward the host (for the rendezvous
  // server to bind, and what that host's ranks dial), without a port; "" when unknown.
  virtual std::string LocalAddress() const = 0;

  // RemoteAddress is the host's numeric address this connection reached (for MASTER_ADDR, so that
  // a name only this machine can resolve, such as an ~/.ssh/config alias, never reaches the
  // workers); "" when unknown.
  virtual std::string RemoteAddress() const = 0;
  // JoinedSlots is, for a node that joined per-node mode's node 0 (nodes/), the ranks it said it
  // runs (its --nproc-per-node); 0 for a host trainrun reached itself.
  virtual int JoinedSlots() const { return 0; }

  // Seal is how the job's token (TRAINRUN_JOB_TOKEN in the ranks' environment) crosses this
  // stream: unchanged where the transport already hides it (SSH, a scheduler's own channel); a
  // per-node TCP connection seals it with a key from its join (nodes/node_join.h), which the agent
  // there undoes.
  virtual std::string Seal(const std::string& secret) const { return secret; }

 protected:
  HostStream() = default;
};

// StreamCallback receives host `host`'s stream (an index into the hosts given to Start), or the
// one-line reason it could not be reached. It is called exactly once per host, from any thread, and
// possibly after the caller stopped waiting: it must own what it touches.
using StreamCallback =
    std::function<void(int host, absl::StatusOr<std::unique_ptr<HostStream>> stream)>;

// HostAbsent is the status a channel gives a host that is optional and did not come (per-node
// mode's --nnodes MIN:MAX: a node that had not joined when the job started): not a failure; the
// job starts without it. IsHostAbsent recognizes it.
inline constexpr char kHostAbsentPayload[] = "trainrun.launcher/host-absent";
inline absl::Status HostAbsent(absl::string_view why) {
  absl::Status status = absl::CancelledError(why);
  status.SetPayload(kHostAbsentPayload, absl::Cord("1"));
  return status;
}
inline bool IsHostAbsent(const absl::Status& status) {
  return status.GetPayload(kHostAbsentPayload).has_value();
}

// LateHost is a host that reached a running job by itself (per-node mode: a node that joins a
// running --nnodes MIN:MAX job): the host (its name, and its slots as it said them) and its
// agent's stream, not yet greeted.
struct LateHost {
  hostfile::HostSpec host;
  std::unique_ptr<HostStream> stream;
};
using LateHostCallback = std::function<void(LateHost host)>;

// HostChannel is one way of reaching hosts.
class HostChannel {
 public:
  virtual ~HostChannel() = default;

  // Describe says in one phrase how `host` would be reached, for --dry-run (e.g. "ssh root@h1
  // port 22 (libssh2, host keys accept-new), keys: ...; agent: ..."), or why it cannot be.
  virtual std::string Describe(const hostfile::HostSpec& host,
                               const std::string& agent_command) const = 0;

  // Start starts `agent_command` (a shell command line) on every one of `hosts`, in parallel where
  // it can, and calls `on_stream` once per host with its stream, all before `deadline`. Start may
  // return before the streams are ready; the caller waits for the callbacks. The errors name the
  // host as the user wrote it (HostSpec::host) and say what to do.
  virtual void Start(const std::vector<hostfile::HostSpec>& hosts, const std::string& agent_command,
                     absl::Time deadline, StreamCallback on_stream) = 0;

  // AcceptLateHosts makes the hosts that come by themselves after Start's hosts were handed on go
  // to `on_host` (from any thread) instead of being refused, until the channel is destroyed or
  // AcceptLateHosts({}) is called. A channel whose hosts only come when reached (SSH, Slurm, a
  // remote shell) has none: the default ignores it.
  virtual void AcceptLateHosts(LateHostCallback on_host) {}
};

}  // namespace trainrun::launcher::channel
