// The worker environment: every environment variable trainrun sets or reads, named once, here.
//
// The launcher sets the variables of the first part in each worker (DESIGN.md, "A worker's
// environment"); the collectives library and the agent read them. Tunables come last, each with its
// default, in the manner of NCCL_PARAM: code reads a tunable only through its `EnvParam`.
//
//   int64_t timeout_s = trainrun::env::kTimeoutSeconds.Get();
#pragma once

#include <cstdint>
#include <string>

namespace trainrun::env {

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
// The job's id, and its secret: the rendezvous and the data plane refuse peers without it.
inline constexpr char kJobId[] = "TRAINRUN_JOB_ID";
inline constexpr char kJobToken[] = "TRAINRUN_JOB_TOKEN";

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

// What scripts written for mpirun read.
inline constexpr char kOmpiRank[] = "OMPI_COMM_WORLD_RANK";
inline constexpr char kOmpiSize[] = "OMPI_COMM_WORLD_SIZE";
inline constexpr char kOmpiLocalRank[] = "OMPI_COMM_WORLD_LOCAL_RANK";
inline constexpr char kOmpiLocalSize[] = "OMPI_COMM_WORLD_LOCAL_SIZE";

// Set to 1 when several ranks share a host and the user left it unset (as torchrun does).
inline constexpr char kOmpNumThreads[] = "OMP_NUM_THREADS";

// CUDA's own: the GPUs a process may use. The launcher sets it to one GPU per local rank when the
// host has GPUs (launcher/gpu_assignment.h); a value the user set is respected (each rank gets one
// of its entries). Not set when kAssignGpus is 0.
inline constexpr char kCudaVisibleDevices[] = "CUDA_VISIBLE_DEVICES";

// --- Tunables ----------------------------------------------------------------------------------

// EnvParam is an integer tunable read from the environment, with its default. Get() returns the
// variable's value when it is set to an integer, else the default.
struct EnvParam {
  const char* name;
  int64_t default_value;
  const char* meaning;

  int64_t Get() const;
};

// StringParam is a string tunable; Get() returns the value, or the default when unset or empty.
struct StringParam {
  const char* name;
  const char* default_value;
  const char* meaning;

  std::string Get() const;
};

// Seconds a collective or rendezvous wait may take before it fails with a TimeoutError.
inline constexpr EnvParam kTimeoutSeconds{"TRAINRUN_TIMEOUT", 300,
                                          "seconds any single wait may take before it fails"};

// Whether the launcher gives each local rank its own GPU through CUDA_VISIBLE_DEVICES (1) or
// leaves CUDA_VISIBLE_DEVICES alone (0), e.g. when the workers pick devices themselves.
inline constexpr EnvParam kAssignGpus{
    "TRAINRUN_ASSIGN_GPUS", 1,
    "1: one GPU per local rank via CUDA_VISIBLE_DEVICES when the host has GPUs; 0: leave it alone"};

// Network interface (e.g. eth0) whose address workers listen on and the rendezvous binds.
inline constexpr StringParam kNetworkInterface{
    "TRAINRUN_NETWORK_INTERFACE", "",
    "interface for data-plane and rendezvous addresses; default: the one routing to the rendezvous"};

}  // namespace trainrun::env
