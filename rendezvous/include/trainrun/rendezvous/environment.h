// The worker environment: every environment variable trainrun sets or reads, named once, here.
//
// The launcher sets the variables of the first part in each worker (DESIGN.md, "A worker's
// environment"); the collectives library and the agent read them. Settings come last, each declared
// once with its type, default and parser (see "Settings"): code reads a setting only through its
// declaration, and any other variable only through Lookup, so that this file is the one place that
// reads the environment (the only getenv is behind these).
//
//   int64_t timeout_s = trainrun::env::kTimeoutSeconds.Get();  // throws BadSetting on "abc"
//   std::optional<std::string> home = trainrun::env::Lookup(trainrun::env::kHome);
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainrun::env {

// Lookup returns the value of the environment variable `name` (one declared in this file), or
// nullopt when it is unset. An empty value is returned as "".
std::optional<std::string> Lookup(const char* name);

// --- Set by the launcher in every worker -------------------------------------------------------

// Global rank and world size.
inline constexpr char kRank[] = "TRAINRUN_RANK";
inline constexpr char kSize[] = "TRAINRUN_SIZE";
// Rank on this host, and the number of ranks on this host.
inline constexpr char kLocalRank[] = "TRAINRUN_LOCAL_RANK";
inline constexpr char kLocalSize[] = "TRAINRUN_LOCAL_SIZE";
// Index of this host among the hosts that have this local_rank, and their count.
inline constexpr char kCrossRank[] = "TRAINRUN_CROSS_RANK";
inline constexpr char kCrossSize[] = "TRAINRUN_CROSS_SIZE";
// The host's name as the user wrote it (-H, hostfile).
inline constexpr char kHostname[] = "TRAINRUN_HOSTNAME";
// host:port of the launcher's rendezvous server.
inline constexpr char kRendezvousAddr[] = "TRAINRUN_RENDEZVOUS_ADDR";
// Set by a host's agent that relays its ranks' rendezvous calls (rendezvous/relay.h): the relay's
// Unix socket, "@name" (abstract) or a path. The client then calls it instead of dialing
// TRAINRUN_RENDEZVOUS_ADDR, which still names the server (the data plane routes toward it).
// `-x TRAINRUN_RENDEZVOUS_RELAY=off` asks the agents to start no relay: each rank dials the server.
inline constexpr char kRendezvousRelay[] = "TRAINRUN_RENDEZVOUS_RELAY";
// "off" when the job's rendezvous speaks plain text (trainrun --no-tls, for debugging); absent
// otherwise: the rendezvous then runs over TLS with a certificate made from TRAINRUN_JOB_TOKEN.
inline constexpr char kRendezvousTls[] = "TRAINRUN_RENDEZVOUS_TLS";
// The rendezvous server's Unix socket, for the ranks on trainrun's own machine (a path in a
// directory only the job's user can enter): they dial it in plain text instead of
// TRAINRUN_RENDEZVOUS_ADDR with TLS. Absent on other hosts; a rank that cannot see the path
// (another mount namespace) dials TRAINRUN_RENDEZVOUS_ADDR.
inline constexpr char kRendezvousSocket[] = "TRAINRUN_RENDEZVOUS_SOCKET";
// The job's id, and its secret: the rendezvous and the data plane refuse peers without it.
inline constexpr char kJobId[] = "TRAINRUN_JOB_ID";
inline constexpr char kJobToken[] = "TRAINRUN_JOB_TOKEN";
// --max-restarts: which start of the job this is (0 the first), and how many restarts it may have.
inline constexpr char kRestartCount[] = "TRAINRUN_RESTART_COUNT";
inline constexpr char kMaxRestarts[] = "TRAINRUN_MAX_RESTARTS";
// --min-np (elastic mode): "1" in every rank, which then, when its communicator breaks, joins the
// job's next generation (rendezvous/generation.h) instead of failing (how long it waits for that
// generation is the setting kElasticTimeoutSeconds).
inline constexpr char kElastic[] = "TRAINRUN_ELASTIC";
// Set only in a rank started while its elastic job runs (the job grew onto a new host or slot):
// its slot, by which it joins the rendezvous (its TRAINRUN_RANK is its place in the generation it
// joins). Such a rank joins the first generation that includes it, not generation 0.
inline constexpr char kElasticSlot[] = "TRAINRUN_ELASTIC_SLOT";
// Horovod's name for kElastic.
inline constexpr char kHorovodElastic[] = "HOROVOD_ELASTIC";

// Horovod's names for the same values.
inline constexpr char kHorovodRank[] = "HOROVOD_RANK";
inline constexpr char kHorovodSize[] = "HOROVOD_SIZE";
inline constexpr char kHorovodLocalRank[] = "HOROVOD_LOCAL_RANK";
inline constexpr char kHorovodLocalSize[] = "HOROVOD_LOCAL_SIZE";
inline constexpr char kHorovodCrossRank[] = "HOROVOD_CROSS_RANK";
inline constexpr char kHorovodCrossSize[] = "HOROVOD_CROSS_SIZE";
inline constexpr char kHorovodHostname[] = "HOROVOD_HOSTNAME";

// torchrun's names, so `init_process_group(init_method="env://")` works unchanged.
inline constexpr char kTorchRank[] = "RANK";
inline constexpr char kTorchWorldSize[] = "WORLD_SIZE";
inline constexpr char kTorchLocalRank[] = "LOCAL_RANK";
inline constexpr char kTorchLocalWorldSize[] = "LOCAL_WORLD_SIZE";
inline constexpr char kTorchGroupRank[] = "GROUP_RANK";
inline constexpr char kTorchMasterAddr[] = "MASTER_ADDR";
inline constexpr char kTorchMasterPort[] = "MASTER_PORT";
inline constexpr char kTorchRestartCount[] = "TORCHELASTIC_RESTART_COUNT";
inline constexpr char kTorchMaxRestarts[] = "TORCHELASTIC_MAX_RESTARTS";

// What scripts written for mpirun read.
inline constexpr char kOmpiRank[] = "OMPI_COMM_WORLD_RANK";
inline constexpr char kOmpiSize[] = "OMPI_COMM_WORLD_SIZE";
inline constexpr char kOmpiLocalRank[] = "OMPI_COMM_WORLD_LOCAL_RANK";
inline constexpr char kOmpiLocalSize[] = "OMPI_COMM_WORLD_LOCAL_SIZE";

// RankValue names a value of the rank's place that the worker environment carries under several
// names (trainrun's own and the aliases below).
enum class RankValue {
  kRank,
  kSize,
  kLocalRank,
  kLocalSize,
  kCrossRank,
  kCrossSize,
  kHostname,
  kHostIndex,
};

// RankVariable is one variable of the worker environment that carries a RankValue.
struct RankVariable {
  const char* name;
  RankValue value;
};

// kRankVariables is every name under which a rank's place is set: trainrun's own, Horovod's,
// torchrun's and Open MPI's, in one table. The launcher sets each of them in every worker.
inline constexpr RankVariable kRankVariables[] = {
    {kRank, RankValue::kRank},
    {kSize, RankValue::kSize},
    {kLocalRank, RankValue::kLocalRank},
    {kLocalSize, RankValue::kLocalSize},
    {kCrossRank, RankValue::kCrossRank},
    {kCrossSize, RankValue::kCrossSize},
    {kHostname, RankValue::kHostname},
    {kHorovodRank, RankValue::kRank},
    {kHorovodSize, RankValue::kSize},
    {kHorovodLocalRank, RankValue::kLocalRank},
    {kHorovodLocalSize, RankValue::kLocalSize},
    {kHorovodCrossRank, RankValue::kCrossRank},
    {kHorovodCrossSize, RankValue::kCrossSize},
    {kHorovodHostname, RankValue::kHostname},
    {kTorchRank, RankValue::kRank},
    {kTorchWorldSize, RankValue::kSize},
    {kTorchLocalRank, RankValue::kLocalRank},
    {kTorchLocalWorldSize, RankValue::kLocalSize},
    {kTorchGroupRank, RankValue::kHostIndex},  // torchrun: the node's index
    {kOmpiRank, RankValue::kRank},
    {kOmpiSize, RankValue::kSize},
    {kOmpiLocalRank, RankValue::kLocalRank},
    {kOmpiLocalSize, RankValue::kLocalSize},
};

// Set to 1 when several ranks share a host and the user left it unset (as torchrun does).
inline constexpr char kOmpNumThreads[] = "OMP_NUM_THREADS";

// Set to 1 when the user left it unset, so that a Python worker's output is live even where its
// stdout is a pipe (--no-pty, or stderr).
inline constexpr char kPythonUnbuffered[] = "PYTHONUNBUFFERED";

// CUDA's own: the GPUs a process may use. Left alone by default; with --assign-gpus (kAssignGpus
// 1) the launcher sets it to one GPU per local rank when the host has GPUs
// (launcher/gpu_assignment.h), and a value the user set is the list the ranks share out.
inline constexpr char kCudaVisibleDevices[] = "CUDA_VISIBLE_DEVICES";

// --- Read by trainrun from its own environment ------------------------------------------------

// Inside a Slurm allocation, and with no -H or --hostfile, the hosts come from these: the
// compressed node list (`node[01-03],gpu5`) and the tasks per node (`2(x3),1`).
inline constexpr char kSlurmJobNodelist[] = "SLURM_JOB_NODELIST";
inline constexpr char kSlurmTasksPerNode[] = "SLURM_TASKS_PER_NODE";
// An allocation made with GPUs per node (`--gpus-per-node=G`, `--gres=gpu:G`) and no
// `--ntasks-per-node` has one task per node: then each node gets G slots, one rank per GPU.
inline constexpr char kSlurmGpusOnNode[] = "SLURM_GPUS_ON_NODE";
inline constexpr char kSlurmNtasksPerNode[] = "SLURM_NTASKS_PER_NODE";
// The allocation's id: when a job step ends badly, the Slurm channel asks `scontrol show job` why
// (the time limit, scancel, a node failure) for the summary.
inline constexpr char kSlurmJobId[] = "SLURM_JOB_ID";
// Set by Slurm inside a job step: the agent accepts a pty as stdout there (`srun -u` gives one).
inline constexpr char kSlurmStepId[] = "SLURM_STEP_ID";

// torchrun's: every torchrun flag may come from PET_<FLAG> (PET_NNODES, PET_NPROC_PER_NODE,
// PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, ...), as Kubeflow's training operator sets them
// in a PyTorchJob's pods; trainrun reads them for the flags the command line does not give
// (cli/foreign_flags.h). kPetPrefix + the flag's name in capitals with underscores.
inline constexpr char kPetPrefix[] = "PET_";
// The training operator's older contract (no PET_*): MASTER_ADDR, MASTER_PORT (kTorchMasterAddr,
// kTorchMasterPort), WORLD_SIZE as the number of nodes and RANK as this node's index, read only
// when LOCAL_RANK is unset (a rank of trainrun or torchrun has it, a pod does not).
// Open MPI's MCA parameters from the environment, as an MPIJob's launcher pod has them: the remote
// shell (`-mca plm_rsh_agent`) and the hostfile.
// Grid Engine's, inside a parallel job (`qsub -pe`): the job's hosts and slots, one `host slots
// queue processors` line per queue instance. With no -H or --hostfile they are the job's hosts,
// reached with `qrsh -inherit` (--launcher sge).
inline constexpr char kSgePeHostfile[] = "PE_HOSTFILE";
// The remote shell to reach hosts with, as --rsh-agent (which wins over it).
inline constexpr char kRshAgent[] = "TRAINRUN_RSH_AGENT";
inline constexpr char kOmpiMcaRshAgent[] = "OMPI_MCA_plm_rsh_agent";
inline constexpr char kOmpiMcaHostfile[] = "OMPI_MCA_orte_default_hostfile";

// Where the SSH client finds the user's ~/.ssh (HOME, else the passwd entry), the default remote
// user when neither user@host nor ~/.ssh/config names one (USER, after the passwd entry), and the
// ssh-agent the libssh2 client asks for keys first.
inline constexpr char kHome[] = "HOME";
inline constexpr char kUser[] = "USER";
inline constexpr char kSshAuthSock[] = "SSH_AUTH_SOCK";

// Read by the agent on a remote host: sshd's "client_ip client_port server_ip server_port", whose
// first word is how that host sees the launcher.
inline constexpr char kSshConnection[] = "SSH_CONNECTION";

// Per-node mode: the secret every node's trainrun proves to join the job (--rdzv-token; also
// --rdzv-token-file). Unset: any node that reaches node 0's endpoint is accepted.
inline constexpr char kRdzvToken[] = "TRAINRUN_RDZV_TOKEN";

// The search path of the worker command (a rank's own PATH: trainrun's, or -x PATH=...).
inline constexpr char kPath[] = "PATH";

// --- Settings -----------------------------------------------------------------------------------
//
// A setting is a variable a rank or trainrun acts on, declared once below with its name, type,
// default, accepted values, which side reads it, and its meaning, in the manner of NCCL_PARAM. Its
// Parse is the one parser of its values, on every side: a bad value is one sentence naming the
// variable and the value ("TRAINRUN_TIMEOUT is 'abc'; set it to an integer of 1 or more (or unset
// it)"), which Get() throws as BadSetting, and trainrun returns as InvalidArgument before it starts
// a rank. kSettings lists them all: `trainrun --help`, the man page and docs/usage.md's table are
// made from it.

// Side says who acts on a setting: the ranks (the collectives, the Python package), trainrun, or
// both (trainrun passes the value it acts on to every rank).
enum class Side { kRank, kTrainrun, kBoth };

// BadSetting is what Get() throws for a value that Parse refuses; what() is the sentence.
class BadSetting : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// IntSetting is an integer setting accepted from min_value to max_value. `old_name`, when set, is
// an earlier name still read when `name` is unset.
struct IntSetting {
  const char* name;
  int64_t default_value;
  int64_t min_value;
  int64_t max_value;
  Side side;
  const char* meaning;
  const char* old_name = nullptr;

  // Parse reads a value given for this setting (as set: decimal digits, within the bounds).
  absl::StatusOr<int64_t> Parse(absl::string_view text) const;
  // Get returns the environment's value, or the default when unset or empty; throws BadSetting.
  int64_t Get() const;
};

// StringSetting is a text setting; `choices` ("auto|tcp|shm") lists the values accepted, "" any.
struct StringSetting {
  const char* name;
  const char* default_value;
  const char* choices;
  Side side;
  const char* meaning;

  absl::StatusOr<std::string> Parse(absl::string_view text) const;
  std::string Get() const;
};

inline constexpr int64_t kNoLimit = INT64_MAX;

// Seconds a collective or rendezvous wait may take before it fails with a TimeoutError.
inline constexpr IntSetting kTimeoutSeconds{
    "TRAINRUN_TIMEOUT",
    300,
    1,
    kNoLimit,
    Side::kRank,
    "seconds any single wait of a rank (a peer's data, the rendezvous) may take before it fails"};

// Stall inspection, as Horovod's stall inspector (--stall-check-warning-time-seconds and
// --stall-check-shutdown-time-seconds set them; trainrun passes the warning time it acts on to
// every rank). A rank whose collective has waited this long publishes it under
// kStallKeyPrefix<rank> (rendezvous/stall_report.h), and trainrun warns which ranks wait in which
// collective and which have not joined it; 0 turns it off.
inline constexpr IntSetting kStallWarningSeconds{
    "TRAINRUN_STALL_CHECK_TIME_SECONDS",
    60,
    0,
    kNoLimit,
    Side::kBoth,
    "seconds a collective may wait before trainrun warns which ranks have not joined it (0: off)"};
// Seconds a collective may wait before trainrun ends the job as stalled (0: never;
// TRAINRUN_TIMEOUT still ends the wait).
inline constexpr IntSetting kStallShutdownSeconds{
    "TRAINRUN_STALL_SHUTDOWN_TIME_SECONDS",
    0,
    0,
    kNoLimit,
    Side::kTrainrun,
    "seconds a collective may wait before trainrun ends the job as stalled (0: never)"};
// The rendezvous key under which a rank publishes the collective it has waited in too long ("" when
// that collective completed).
inline constexpr char kStallKeyPrefix[] = "trainrun/stall/";

// Straggler attribution and the live view (--monitor; collectives/src/attribution.h,
// launcher/src/monitor/). Every kMonitorPeriodMs each rank publishes its cumulative collective
// counters under kMonitorKeyPrefix<rank> (one small Set; 0: never). The launcher sets it: the
// straggler window (--straggler-window, 10 s), or 1 s with --monitor.
inline constexpr IntSetting kMonitorPeriodMs{
    "TRAINRUN_MONITOR_PERIOD_MS",
    0,
    0,
    kNoLimit,
    Side::kRank,
    "milliseconds between a rank's reports of its collective counters to trainrun (0: none; "
    "trainrun sets it from --straggler-window, or 1000 with --monitor)"};
inline constexpr char kMonitorKeyPrefix[] = "trainrun/monitor/";
// Straggler attribution samples about one collective a millisecond, a spacing measured from the
// rank's own pace; a fixed number of collectives between samples instead makes a run's work the
// same however fast the machine is (the speed guard, bench/guard/, counts instructions under
// callgrind, where time runs ~50x slower).
inline constexpr IntSetting kStragglerSampleEvery{
    "TRAINRUN_STRAGGLER_SAMPLE_EVERY",
    0,
    0,
    65536,
    Side::kRank,
    "collectives between straggler samples (0: about one a millisecond)"};
// Read by trainrun (--monitor) and `trainrun top`: the token the live page and /metrics ask for
// off loopback (unset: trainrun makes one and prints it in the page's address).
inline constexpr StringSetting kMonitorToken{
    "TRAINRUN_MONITOR_TOKEN", "", "", Side::kTrainrun,
    "the token trainrun's --monitor page asks for off loopback, and `trainrun top` sends"};

// Whether the launcher gives each local rank its own GPU through CUDA_VISIBLE_DEVICES (1) or
// leaves CUDA_VISIBLE_DEVICES alone (0), e.g. when the workers pick devices themselves.
inline constexpr IntSetting kAssignGpus{
    "TRAINRUN_ASSIGN_GPUS",
    0,
    0,
    1,
    Side::kTrainrun,
    "1 (or --assign-gpus): one GPU per local rank via CUDA_VISIBLE_DEVICES when the host has "
    "GPUs; 0: leave CUDA_VISIBLE_DEVICES alone, as horovodrun and torchrun do"};

// Network interface (e.g. eth0) whose address workers listen on and the rendezvous binds.
inline constexpr StringSetting kNetworkInterface{
    "TRAINRUN_NETWORK_INTERFACE", "", "", Side::kRank,
    "interface whose address a rank listens on for data (--network-interface sets it); default: "
    "the one routing to the rendezvous"};

// Seconds an elastic rank waits for the job's next generation: trainrun sets it to
// --elastic-timeout plus kElasticTimeoutMarginSeconds, so that trainrun ends a job below --min-np
// with its own message rather than each rank with a timeout. The default is that of the default
// --elastic-timeout (Horovod's 600 s), for a rank started some other way.
inline constexpr int64_t kDefaultElasticTimeoutSeconds = 600;
inline constexpr int64_t kElasticTimeoutMarginSeconds = 30;
inline constexpr IntSetting kElasticTimeoutSeconds{
    "TRAINRUN_ELASTIC_TIMEOUT",
    kDefaultElasticTimeoutSeconds + kElasticTimeoutMarginSeconds,
    1,
    kNoLimit,
    Side::kRank,
    "seconds an elastic rank waits for the job's next generation (set by trainrun from "
    "--elastic-timeout)"};

// --- Collectives over TCP (collectives/) ---------------------------------------------------------

// TCP connections between each pair of ranks; large transfers are striped across them.
inline constexpr IntSetting kSocketsPerPeer{"TRAINRUN_SOCKETS_PER_PEER",
                                            1,
                                            1,
                                            64,
                                            Side::kRank,
                                            "TCP connections between each pair of ranks"};

// SO_SNDBUF/SO_RCVBUF of data connections in bytes (0: the kernel's autotuning).
inline constexpr IntSetting kSocketBufferBytes{
    "TRAINRUN_SOCKET_BUFFER_BYTES",
    4 << 20,
    0,
    INT32_MAX,
    Side::kRank,
    "socket send/receive buffer of data connections, bytes (0: the kernel's autotuning)"};

// Ring algorithms move data in segments of this many bytes, so sending, receiving and reducing
// overlap. A ring allreduce's segments are smaller where a rank's block is mid-sized
// (algorithms.cc: a block above 256 KiB in at least 16, of at least 64 KiB).
inline constexpr IntSetting kRingSegmentBytes{
    "TRAINRUN_RING_SEGMENT_BYTES",
    256 << 10,
    4096,
    kNoLimit,
    Side::kRank,
    "pipelining segment of ring algorithms, bytes (an allreduce cuts a rank's block above 256 "
    "KiB into 16, down to 64 KiB, where this is larger)"};

// Ring algorithms send segment k of step s+1 this many segments after segment k of step s
// arrived (a wavefront), so what was just reduced is still in cache when it leaves and the
// socket queues stay short.
inline constexpr IntSetting kRingLag{"TRAINRUN_RING_LAG",
                                     4,
                                     1,
                                     1024,
                                     Side::kRank,
                                     "segments by which a ring step trails the previous one"};

// Allreduce of at most this many bytes uses recursive doubling (latency) instead of the ring.
inline constexpr IntSetting kSmallAllreduceBytes{
    "TRAINRUN_SMALL_ALLREDUCE_BYTES",
    64 << 10,
    0,
    kNoLimit,
    Side::kRank,
    "largest allreduce that uses recursive doubling instead of the ring, bytes (over TCP, "
    "allreduces up to 256 KiB at up to 4 ranks, 64 KiB above, take recursive doubling with "
    "the call records in any case)"};

// Microseconds a wait for a peer polls without sleeping before it blocks in poll(2) (lower latency,
// at the cost of a busy core while waiting). Only used when ranks have a core each.
inline constexpr IntSetting kSpinMicroseconds{
    "TRAINRUN_SPIN_MICROSECONDS",
    50,
    0,
    1000000,
    Side::kRank,
    "busy-poll time before a wait for a peer sleeps, microseconds"};

// --- Collectives over shared memory (collectives/src/shm_transport.h) ----------------------------

// Which transport a communicator uses: "auto" (shared memory when every rank is on this host and
// the same-host check passes, else TCP), "tcp", or "shm" (shared memory, or fail when the ranks
// cannot share memory). For tests and comparisons; `trainrun --tcp` sets tcp.
inline constexpr StringSetting kTransport{"TRAINRUN_TRANSPORT", "auto", "auto|tcp|shm", Side::kRank,
                                          "the collectives' transport between ranks"};

// Allreduce over shared memory moves data through cache-sized chunks of this many bytes.
inline constexpr IntSetting kShmChunkBytes{"TRAINRUN_SHM_CHUNK_BYTES",
                                           256 << 10,
                                           4096,
                                           kNoLimit,
                                           Side::kRank,
                                           "allreduce pipelining chunk over shared memory, bytes"};

// A job on several hosts with several ranks on each (hierarchical allreduce) moves its allreduce
// through shared memory in chunks of this many bytes; each rank's part of a chunk then crosses to
// the other hosts while the next chunk is reduced (collectives/src/hierarchical.h).
inline constexpr IntSetting kHierarchicalChunkBytes{
    "TRAINRUN_HIERARCHICAL_CHUNK_BYTES",
    4 << 20,
    4096,
    kNoLimit,
    Side::kRank,
    "allreduce chunk of a job on several hosts with several ranks each, bytes"};

// Allreduce over shared memory of at most this many bytes reduces in one phase on every rank.
inline constexpr IntSetting kShmSmallBytes{
    "TRAINRUN_SHM_SMALL_BYTES",
    16 << 10,
    0,
    kNoLimit,
    Side::kRank,
    "largest shared-memory allreduce that every rank reduces whole (one synchronisation), bytes"};

// What a rank waiting on its peers over shared memory does: "adaptive" (spin, at most
// TRAINRUN_SPIN_MICROSECONDS, only while the ranks it waits on are running on other CPUs, else
// sleep at once: fast when every rank has a core, and no CPU taken from the rank waited on when
// they share cores with each other or with other work), "spin" (spin TRAINRUN_SPIN_MICROSECONDS
// whatever the peers do when every rank of the host has a core, else yield a few times, then
// sleep), or "sleep" (sleep on a futex at once; least CPU, most latency).
inline constexpr StringSetting kShmWait{"TRAINRUN_SHM_WAIT", "adaptive", "adaptive|spin|sleep",
                                        Side::kRank,
                                        "how a rank waits on its peers over shared memory"};

// Ring buffer between each ordered pair of ranks for point-to-point transfers, bytes.
inline constexpr IntSetting kShmChannelBytes{"TRAINRUN_SHM_CHANNEL_BYTES",
                                             512 << 10,
                                             4096,
                                             kNoLimit,
                                             Side::kRank,
                                             "shared-memory ring per ordered pair of ranks, bytes"};

// --- The launcher --------------------------------------------------------------------------------

// The rank shim trainrun starts each local rank under (launcher/src/rank_shim.h): unset or empty,
// trainrun-rank-shim next to trainrun (or in ../libexec/trainrun/); a path, that executable;
// "fork", no executable: trainrun forks itself per rank, as it does where no shim is installed.
inline constexpr StringSetting kRankShim{"TRAINRUN_RANK_SHIM", "", "", Side::kTrainrun,
                                         "the rank shim executable, or \"fork\" for none"};

// --- Python package (python/) ----------------------------------------------------------------

// A directory every rank on this host can see: without a launcher (tests, quick local runs),
// trainrun.init() makes the ranks meet through files there (TRAINRUN_RANK and TRAINRUN_SIZE must
// be set too), as torch's file:// init does.
inline constexpr char kFileStore[] = "TRAINRUN_FILE_STORE";

// trainrun.run (python/trainrun/_launch.py): the trainrun executable it starts (else the build
// tree's, else PATH's); and, in each rank it started, the port of the caller's connection back and
// the secret the rank proves on it (python/trainrun/_run_rank.py).
inline constexpr char kTrainrunBin[] = "TRAINRUN_BIN";
inline constexpr char kRunPort[] = "TRAINRUN_RUN_PORT";
inline constexpr char kRunToken[] = "TRAINRUN_RUN_TOKEN";

// 0 skips the exchange of call records before each collective (collectives/src/call_check.h):
// ranks that call different collectives then corrupt each other's data or hang, and join() is
// refused.
inline constexpr IntSetting kCheckShapes{"TRAINRUN_CHECK_SHAPES",
                                         1,
                                         0,
                                         1,
                                         Side::kRank,
                                         "1: ranks check they call the same collective alike"};
// A file to write a Chrome trace of every collective to (collectives/src/timeline.h), from the
// start; `trainrun --timeline-filename FILE` sets it. HOROVOD_TIMELINE is read when it is unset;
// "DYNAMIC" (Horovod's value) starts none, leaving it to start_timeline().
inline constexpr StringSetting kTimeline{"TRAINRUN_TIMELINE", "", "", Side::kRank,
                                         "Chrome trace file of the collectives (empty: none)"};
inline constexpr char kHorovodTimeline[] = "HOROVOD_TIMELINE";

// Tensor fusion, two sizes: the most bytes of queued in-place allreduces the runtime's
// communication thread runs as one (collectives/comm_thread.h; Horovod's fusion threshold,
// `trainrun --fusion-threshold-mb`; 0 turns fusion off), and the size of the gradient buckets
// trainrun.torch.DistributedOptimizer reduces as one message. TRAINRUN_FUSION_BYTES, their one
// name before, still sets either when its own name is unset.
inline constexpr char kOldFusionBytes[] = "TRAINRUN_FUSION_BYTES";
inline constexpr IntSetting kFusionThresholdBytes{
    "TRAINRUN_FUSION_THRESHOLD_BYTES",
    int64_t{64} << 20,
    0,
    kNoLimit,
    Side::kRank,
    "most bytes of queued allreduces run as one fused allreduce (0: no fusion)",
    kOldFusionBytes};
inline constexpr IntSetting kBucketBytes{
    "TRAINRUN_BUCKET_BYTES",
    1 << 20,
    0,
    kNoLimit,
    Side::kRank,
    "gradient bucket of trainrun.torch.DistributedOptimizer, bytes",
    kOldFusionBytes};

// --- GPUs (collectives/gpu/) ---------------------------------------------------------------------

// Where libnccl.so.2 is: the file, or a folder holding it; searched before the Python nvidia-*
// wheels and the loader's path (collectives/gpu/loader.h).
inline constexpr char kNcclLibrary[] = "TRAINRUN_NCCL_LIBRARY";
// Where CUDA's runtime (libcudart.so.13 or .12) is: the file, or a folder holding it.
inline constexpr char kCudaLibrary[] = "TRAINRUN_CUDA_LIBRARY";
// Where NVIDIA's management library (libnvidia-ml.so.1, the driver's) is, for the GPU use a rank
// reports to --monitor (collectives/src/gpu_usage.h); unset: the loader's path.
inline constexpr char kNvmlLibrary[] = "TRAINRUN_NVML_LIBRARY";
// How a communicator moves GPU buffers: "auto" (NCCL when every rank has a GPU of its own and NCCL
// loads, else host staging), "nccl" (fail when NCCL cannot serve) or "staged" (always through
// pinned host memory).
inline constexpr StringSetting kGpuPath{"TRAINRUN_GPU_PATH", "auto", "auto|nccl|staged",
                                        Side::kRank, "how GPU buffers are reduced"};
// Set to 1 in every worker by `trainrun --verbose`: a worker says once per communicator which path
// its GPU buffers take.
inline constexpr IntSetting kVerbose{
    "TRAINRUN_VERBOSE", 0, 0, 1, Side::kRank, "1: workers say what they chose"};

// --- Every setting -------------------------------------------------------------------------------

// SettingRef is one entry of kSettings: exactly one of the two is set.
struct SettingRef {
  const IntSetting* int_setting;
  const StringSetting* string_setting;

  const char* name() const { return int_setting ? int_setting->name : string_setting->name; }
  Side side() const { return int_setting ? int_setting->side : string_setting->side; }
  const char* meaning() const {
    return int_setting ? int_setting->meaning : string_setting->meaning;
  }
  // DefaultText is the default as it would be set ("300", "auto"; "" for none).
  std::string DefaultText() const;
  // Check parses `text` as this setting's value: the sentence of a bad one, else OK.
  absl::Status Check(absl::string_view text) const;
  // CheckEnvironment is Check of the environment's value (OK when unset).
  absl::Status CheckEnvironment() const;
};

inline constexpr SettingRef kSettings[] = {
    {&kTimeoutSeconds, nullptr},
    {&kStallWarningSeconds, nullptr},
    {&kStallShutdownSeconds, nullptr},
    {&kAssignGpus, nullptr},
    {nullptr, &kNetworkInterface},
    {&kElasticTimeoutSeconds, nullptr},
    {&kSocketsPerPeer, nullptr},
    {&kSocketBufferBytes, nullptr},
    {&kRingSegmentBytes, nullptr},
    {&kRingLag, nullptr},
    {&kSmallAllreduceBytes, nullptr},
    {&kSpinMicroseconds, nullptr},
    {nullptr, &kTransport},
    {&kShmChunkBytes, nullptr},
    {&kHierarchicalChunkBytes, nullptr},
    {&kShmSmallBytes, nullptr},
    {nullptr, &kShmWait},
    {&kShmChannelBytes, nullptr},
    {nullptr, &kRankShim},
    {&kCheckShapes, nullptr},
    {nullptr, &kTimeline},
    {&kFusionThresholdBytes, nullptr},
    {&kBucketBytes, nullptr},
    {nullptr, &kGpuPath},
    {&kVerbose, nullptr},
    {&kMonitorPeriodMs, nullptr},
    {&kStragglerSampleEvery, nullptr},
    {nullptr, &kMonitorToken},
};

// FindSetting returns the setting named `name` (its name or old name), or nullptr.
const SettingRef* FindSetting(absl::string_view name);

}  // namespace trainrun::env
