// LaunchSpec: everything the launcher needs to run one job, as the CLI parsed it. Every default of
// a launch is stated here, once: the CLI's flags start from these values (cli/run_options.h), and
// the launcher's parts that need one (the supervisor, the agent, the SSH clients) take it from
// here.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainrun/hostfile/slot_plan.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::launcher {

// SshClient selects how remote hosts are reached over SSH (--ssh-client).
enum class SshClient {
  kLibssh2,  // in-process libssh2
  kOpenssh,  // the system `ssh` binary: ProxyJump, certificates, Kerberos, RSA keys with SHA-2
};

// HostKeyPolicy is OpenSSH's StrictHostKeyChecking, without "ask" (a launcher cannot ask).
enum class HostKeyPolicy {
  kYes,        // the host's key must already be in known_hosts
  kAcceptNew,  // an unknown host's key is added; a changed key is refused
  kNo,         // any key is accepted; an unknown one is added; a changed one is warned about
};

// The defaults of a launch (the LaunchSpec members below start from them).
inline constexpr std::chrono::seconds kDefaultStartTimeout{30};
// --elastic-timeout's default: Horovod's 600 s.
inline constexpr std::chrono::seconds kDefaultElasticTimeout{env::kDefaultElasticTimeoutSeconds};

// ElasticSpec is Horovod's elastic mode (--min-np, --max-np, --elastic-timeout): a lost rank does
// not end the job while at least min_np ranks remain; the survivors form a new generation
// (rendezvous/generation.h) with new ranks 0..k-1. Below min_np the job waits up to `timeout` for
// ranks, then ends.
struct ElasticSpec {
  int min_np = 1;
  int max_np = 0;  // the most ranks the job may have; with no host discovery, the start's -np
  std::chrono::seconds timeout = kDefaultElasticTimeout;
  // --host-discovery-script: run (sh -c) every discovery_interval; prints "host[:slots]" lines,
  // slots_per_host where a line has none. The job started on its first output; a host that leaves
  // it has its ranks stopped (the job shrinks). "" : no discovery.
  std::string discovery_script;
  int slots_per_host = 1;
  std::chrono::milliseconds discovery_interval{1000};
  // --reset-limit: the most membership changes the job survives (0: no limit); one more ends it.
  int reset_limit = 0;
  // --blacklist-cooldown-range MIN MAX (Horovod's): a host whose rank failed gets no new ranks
  // (the job does not grow onto it) for MIN seconds, doubling with each later blacklisting up to
  // MAX; unset: a blacklisted host is never retried, as with horovodrun.
  std::optional<std::pair<std::chrono::seconds, std::chrono::seconds>> blacklist_cooldown;
  // Per-node mode's --nnodes MIN:MAX (the elastic job a range makes without --max-restarts): MIN,
  // the fewest nodes (hosts with a live rank) the job goes on with; fewer end it at once. 0: none.
  int min_nodes = 0;
};
inline constexpr std::chrono::milliseconds kDefaultGracePeriod{3000};
inline constexpr SshClient kDefaultSshClient = SshClient::kLibssh2;
inline constexpr HostKeyPolicy kDefaultHostKeyPolicy = HostKeyPolicy::kAcceptNew;
// Stall inspection, as Horovod's: the defaults of env::kStallWarningSeconds and
// env::kStallShutdownSeconds (0: never).
inline constexpr std::chrono::seconds kDefaultStallWarning{env::kStallWarningSeconds.default_value};
inline constexpr std::chrono::seconds kDefaultStallShutdown{
    env::kStallShutdownSeconds.default_value};
// The straggler line (launcher/src/monitor/): named when the others wait for one rank more than
// this share of their time, over windows of this many seconds.
inline constexpr double kDefaultStragglerThreshold = 0.10;
inline constexpr std::chrono::seconds kDefaultStragglerWindow{10};

// ParseSshClient reads "libssh2" / "openssh"; ParseHostKeyPolicy reads "yes" / "accept-new" / "no"
// (and OpenSSH's synonyms "true", "false", "off"). Anything else is an InvalidArgument naming the
// flag and the accepted values. The Name functions give the canonical spelling back.
absl::StatusOr<SshClient> ParseSshClient(absl::string_view text);
// Launcher is --launcher: how the hosts that are not this machine are reached. kAuto: through Slurm
// when the hosts came from the Slurm allocation and `srun` is on PATH, through a remote shell when
// one is named (--rsh-agent), else SSH. kRsh: through LaunchSpec::rsh_agent
// (rsh/rsh_host_channel.h). kLocal: every rank on this host (an allocation is not used).
enum class Launcher { kAuto, kSsh, kSlurm, kRsh, kLocal };
absl::StatusOr<Launcher> ParseLauncher(absl::string_view text);
absl::StatusOr<HostKeyPolicy> ParseHostKeyPolicy(absl::string_view text);
// BindTo is mpirun's --bind-to: the CPUs each local rank may run on (cpu_binding.h). kNone, the
// default, leaves the affinity trainrun has, as horovodrun (with Gloo) and torchrun do.
enum class BindTo { kNone, kCore, kSocket };
absl::StatusOr<BindTo> ParseBindTo(absl::string_view text);
absl::string_view BindToName(BindTo bind_to);
absl::string_view SshClientName(SshClient client);
absl::string_view HostKeyPolicyName(HostKeyPolicy policy);

// Per-node mode (torchrun's model): node 0's rendezvous port when --rdzv-endpoint gives none
// (torchrun's default), and the job id when --rdzv-id gives none.
inline constexpr int kDefaultRdzvPort = 29400;
inline constexpr char kDefaultRdzvId[] = "none";

// PerNodeSpec is per-node mode: trainrun started once on each node (`--nnodes 2 --node-rank K
// --rdzv-endpoint HOST:PORT --nproc-per-node N`). Node 0's trainrun is the job's launcher: it
// listens at the endpoint's port, where the other nodes' trainruns dial in and serve as its agents
// (launcher/src/nodes/), then serves the job's rendezvous there. Each node runs its own
// --nproc-per-node ranks (nodes may differ: node 0 plans the job once every node has joined and
// said its count); ranks are numbered by node rank, then local rank.
struct PerNodeSpec {
  int nnodes = 1;  // the job's nodes; with --nnodes MIN:MAX, MAX (node ranks are 0 to MAX-1)
  // --nnodes MIN:MAX's MIN (0: no range, every node must join): node 0 starts the job once MIN
  // nodes (itself included) have joined and `last_call` has passed since, or at once when all MAX
  // have (torchrun's c10d rendezvous and its last_call_timeout). A node that comes after the start
  // joins the running job (an elastic job grows onto it; with --max-restarts the job starts again
  // with it).
  int min_nnodes = 0;
  // A start after the first (Launch sets it): the nodes, node 0 included, that were in the job as
  // the last start ended; the next starts as soon as that many have joined again (and at least
  // MIN), without waiting for the last call. 0: the first start.
  int expect_nodes = 0;
  std::chrono::seconds last_call{30};  // --rdzv-last-call
  int node_rank = 0;
  int nproc_per_node = 1;  // this node's ranks
  // --master-port (PET_MASTER_PORT, the operator's MASTER_PORT): the MASTER_PORT every rank sees;
  // 0: a free port of node 0. When it is also the join port (--master-addr with --master-port),
  // node 0 closes the join port once every node has joined, so that rank 0 may listen there.
  int master_port = 0;
  std::string endpoint_host;  // node 0 as every node dials it (--rdzv-endpoint, --master-addr)
  int endpoint_port = kDefaultRdzvPort;
  std::string rdzv_id = kDefaultRdzvId;  // must be the same on every node
  // --rdzv-token (TRAINRUN_RDZV_TOKEN, --rdzv-token-file): the secret a node proves to join;
  // "": any node that reaches the endpoint is accepted, as with torchrun.
  std::string token;
};

// PerNodeSlotPlan is per-node mode's whole plan: host 0 is node 0 (named by the endpoint's host),
// host K is "node<K>", with counts[K] slots each; a node with no slots (one that did not join a
// --nnodes MIN:MAX job) is left out (launcher/src/nodes/per_node_plan.cc).
absl::StatusOr<hostfile::SlotPlan> PerNodeSlotPlan(const PerNodeSpec& spec,
                                                   const std::vector<int>& counts);

// ExportedVariable is one `-x NAME` (value taken from trainrun's environment) or `-x NAME=value`.
struct ExportedVariable {
  std::string name;
  std::optional<std::string> value;
};

struct LaunchSpec {
  hostfile::SlotPlan plan;
  // The worker command and its arguments, as typed after trainrun's own flags.
  std::vector<std::string> command;
  std::vector<ExportedVariable> exported;
  // --output-filename DIR: each rank's output also goes to DIR/rank.<N>/{stdout,stderr}.
  std::optional<std::string> output_dir;
  // torchrun's --log-dir DIR: DIR/<rank>/stdout.log and stderr.log. --tee: the streams (torchrun's
  // Std: 0 none, 1 stdout, 2 stderr, 3 both) that go to those files and the console; --redirects:
  // the streams that go to the files only.
  std::optional<std::string> log_dir;
  int tee = 0;
  int redirects = 0;
  // Prefix worker lines with "[rank]<stdout>:" / "[rank]<stderr>:".
  bool tag_output = true;
  // Each rank's stdout is a pseudo-terminal, so that C stdio and Python flush it line by line and
  // output is live (as Open MPI does); stderr stays a pipe. --no-pty: a pipe, as before.
  bool stdout_pty = true;
  // The rendezvous over TLS with a certificate made from the job's token (the default);
  // --no-tls: plain text, to debug (the token then crosses the network in clear).
  bool rendezvous_tls = true;
  // --assign-gpus: one GPU per local rank through CUDA_VISIBLE_DEVICES (TRAINRUN_ASSIGN_GPUS=1
  // does the same). Off: CUDA_VISIBLE_DEVICES is left as it is, as horovodrun and torchrun do,
  // so that torch.cuda.set_device(local_rank) works.
  bool assign_gpus = false;
  // horovodrun's --tcp: the ranks' collectives go over TCP, also within a host. JobEnvironment
  // tells the ranks (TRAINRUN_TRANSPORT=tcp) unless -x gives TRAINRUN_TRANSPORT.
  bool tcp = false;
  // horovodrun's --fusion-threshold-mb, in bytes; unset: the ranks' defaults. JobEnvironment tells
  // the ranks (TRAINRUN_FUSION_BYTES, which sizes both the fusion cap and the optimizer's buckets)
  // unless -x gives TRAINRUN_FUSION_BYTES.
  std::optional<int64_t> fusion_threshold_bytes;
  // Prefix worker lines with the time they arrived.
  bool prefix_timestamp = false;
  // mpirun's placement flags. --bind-to (or --map-by core|socket): each local rank's CPUs, applied
  // by its shim before exec, here and on remote hosts. --report-bindings: one line per rank saying
  // its CPUs. --oversubscribe: more ranks than cores on a host without a warning.
  BindTo bind_to = BindTo::kNone;
  bool report_bindings = false;
  bool oversubscribe = false;
  // -wdir/--wdir: the ranks' working directory on every host; empty: trainrun's own directory.
  std::string working_dir;
  // --sync-dst-dir (MXNet's launch.py flag): src_dir (--sync-src-dir, absolute; default trainrun's
  // directory) is copied to dst_dir on every host before the ranks start there (working_dir is
  // dst_dir); `.git` and the --sync-exclude patterns are left out
  // (launcher/src/remote/file_sync.h).
  struct Sync {
    std::string src_dir;
    std::string dst_dir;
    std::vector<std::string> excludes;
  };
  std::optional<Sync> sync;
  // --start-timeout: one deadline from the first connection to a host to the last rank's start.
  std::chrono::seconds start_timeout = kDefaultStartTimeout;
  // --max-restarts (torchrun's): when the job fails, start all of it again, up to this many times;
  // the ranks see TRAINRUN_RESTART_COUNT (TORCHELASTIC_RESTART_COUNT). Not after a signal to
  // trainrun. In per-node mode every node joins node 0 again for each start (JobEnd::rejoin).
  int max_restarts = 0;
  // Which start of the job this is after failures (0: the first; Launch sets it): a failure of
  // start `restart` < max_restarts is followed by another.
  int restart = 0;
  // --min-np (and --max-np, --elastic-timeout): elastic mode; unset: the first failure ends the
  // job. Not with --max-restarts; in per-node mode only as --nnodes MIN:MAX makes it (min_nodes).
  std::optional<ElasticSpec> elastic;
  // Between SIGTERM and SIGKILL when the job is torn down.
  std::chrono::milliseconds grace_period = kDefaultGracePeriod;
  // --stall-check-warning-time-seconds: a collective that waits this long is reported (which ranks
  // wait in it, which have not joined); 0: off. Passed to the ranks as
  // TRAINRUN_STALL_CHECK_TIME_SECONDS. --stall-check-shutdown-time-seconds: the job is ended as
  // stalled at this wait; 0: never.
  std::chrono::seconds stall_warning = kDefaultStallWarning;
  std::chrono::seconds stall_shutdown = kDefaultStallShutdown;
  // --monitor [ADDR:]PORT: the live page ("" for none); --straggler-threshold (a fraction; 0: no
  // straggler line) and --straggler-window.
  std::string monitor;
  double straggler_threshold = kDefaultStragglerThreshold;
  std::chrono::seconds straggler_window = kDefaultStragglerWindow;
  // Print the plan, start nothing (the CLI prints it; Launch is not called).
  bool dry_run = false;
  // --no-probe: --dry-run prints the plan alone, asking no remote host which trainrun it has.
  bool dry_run_probe = true;
  bool verbose = false;
  // --quiet: no start line ("8 ranks on 2 hosts started in 0.41 s") when every rank has started.
  bool quiet = false;

  // The job's rendezvous server (rendezvous/server.h). --rendezvous-port: the port it listens on;
  // 0 lets the kernel choose. --rendezvous-addr: the address it binds and workers dial; empty:
  // 127.0.0.1 when every rank is on this host.
  int rendezvous_port = 0;
  std::string rendezvous_addr;

  // Remote hosts (horovodrun's flags; the SSH launcher reads them).
  // --network-interface(s): interfaces for rendezvous and data-plane addresses; empty: automatic.
  std::vector<std::string> network_interfaces;
  // -p/--ssh-port: the SSH port on every host; unset: ssh's default.
  std::optional<int> ssh_port;
  // -i/--ssh-identity-file: the private key to log in with; unset: ssh's defaults.
  std::optional<std::string> ssh_identity_file;
  // --ssh-client.
  SshClient ssh_client = kDefaultSshClient;
  // --ssh-strict-host-key-checking: checking hosts' keys against ~/.ssh/known_hosts.
  HostKeyPolicy ssh_host_key_checking = kDefaultHostKeyPolicy;
  // --remote-trainrun: trainrun's path on the other hosts; empty: this trainrun's own path.
  std::string remote_trainrun;
  // --launcher, and whether the hosts came from the Slurm allocation (SLURM_JOB_NODELIST).
  Launcher launcher = Launcher::kAuto;
  // --rsh-agent (mpirun's plm_rsh_agent, TRAINRUN_RSH_AGENT): the remote shell's words, run as
  // `WORDS... HOST TRAINRUN --agent` (kRsh; empty otherwise).
  std::vector<std::string> rsh_agent;
  bool hosts_from_slurm = false;

  // Per-node mode (--nnodes, --node-rank, --rdzv-endpoint): unset for a job this trainrun starts
  // on every host itself. In this mode `plan` is the whole job's: host 0 is node 0 (named by the
  // endpoint's host), host K is "node<K>".
  std::optional<PerNodeSpec> per_node;
};

}  // namespace trainrun::launcher
