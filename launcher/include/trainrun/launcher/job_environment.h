// JobEnvironment: the worker environment of DESIGN.md ("A worker's environment"), built once per
// job, so that a variable's whole path is here: trainrun's own environment, the job's identity,
// the rank's place in the plan, what its host sees (HostView), and the user's -x variables, in that
// order of precedence.
//
//   auto job = JobEnvironment::Create(spec, CurrentEnvironment());
//   HostView view{"worker1", "10.0.0.5", "10.0.0.1:29400", "10.0.0.1", 8};
//   std::vector<std::string> env = job->ForRank(3, view);   // "NAME=value" strings for execve
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainrun/launcher/launch_spec.h"

namespace trainrun::launcher {

// CurrentEnvironment returns this process's environment as "NAME=value" strings.
std::vector<std::string> CurrentEnvironment();

// HostView is what differs from host to host in the ranks' environment: each fact as that host
// sees it, worked out once (launcher/src/job_run.cc) rather than patched into a finished
// environment.
struct HostView {
  std::string name;             // as the user wrote it (TRAINRUN_HOSTNAME)
  std::string address;          // the address trainrun reached it at; "" for this machine
  std::string rendezvous_addr;  // host:port its ranks dial (TRAINRUN_RENDEZVOUS_ADDR); "": unset
  // The server's Unix socket, for this machine's ranks only (TRAINRUN_RENDEZVOUS_SOCKET); "": unset
  std::string rendezvous_socket;
  std::string master_addr;  // MASTER_ADDR: rank 0's host, as this host reaches it
  int gpu_count = 0;        // its GPUs, for CUDA_VISIBLE_DEVICES (a remote agent's Hello)
};

// JobEnvironment holds what every rank of one job shares, and makes each rank's environment.
class JobEnvironment {
 public:
  // Create draws the job id and a fresh random token (from /dev/urandom) and a free port for
  // MASTER_PORT (per-node mode's --master-port when given). `base` is the environment passed on to
  // workers (normally CurrentEnvironment()). Fails when -x names a variable that is neither given a
  // value nor set in `base`, or when /dev/urandom cannot be read.
  static absl::StatusOr<JobEnvironment> Create(const LaunchSpec& spec,
                                               const std::vector<std::string>& base);

  // ForRank returns rank `rank`'s whole environment as "NAME=value" strings, sorted by name, for
  // a rank on the host `host` describes.
  std::vector<std::string> ForRank(int rank, const HostView& host) const;
  // ForPlace is ForRank for a rank that is not in the job's starting plan (an elastic job that
  // grew): its place `a` in a job of `size` ranks.
  std::vector<std::string> ForPlace(const hostfile::RankAssignment& a, int size,
                                    const HostView& host) const;

  // SpecVariables: the variables the ranks get from the spec's typed fields, which only
  // JobEnvironment turns into variables: --tcp and --fusion-threshold-mb (each unless -x gives
  // the variable), and an elastic job's TRAINRUN_ELASTIC, HOROVOD_ELASTIC and
  // TRAINRUN_ELASTIC_TIMEOUT (--elastic-timeout plus env::kElasticTimeoutMarginSeconds, over any
  // -x: trainrun acts on it). Applied after the -x variables; the dry run prints them.
  static std::vector<ExportedVariable> SpecVariables(const LaunchSpec& spec);

  // Lookup returns the value `name` has in every rank's environment (base and -x), if any.
  std::optional<std::string> Lookup(const std::string& name) const;

  const std::string& job_id() const { return job_id_; }
  const std::string& token() const { return token_; }
  int master_port() const { return master_port_; }

 private:
  JobEnvironment() = default;

  hostfile::SlotPlan plan_;
  std::map<std::string, std::string> base_;    // trainrun's environment
  std::map<std::string, std::string> forced_;  // -x NAME=value (and -x NAME, from base)
  std::string job_id_;
  std::string token_;
  int master_port_ = 0;
  bool assign_gpus_ = false;  // --assign-gpus or TRAINRUN_ASSIGN_GPUS=1
};

}  // namespace trainrun::launcher
