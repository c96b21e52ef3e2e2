// JobEnvironment: the worker environment of DESIGN.md ("A worker's environment"), built once per
// job, so that a variable's whole path is here: trainrun's own environment, the job's identity,
// the rank's place in the plan, and the user's -x variables, in that order of precedence.
//
//   auto job = JobEnvironment::Create(spec, CurrentEnvironment());
//   job->SetRendezvousAddress("10.0.0.1:29400");      // once the server listens
//   std::vector<std::string> env = job->ForRank(3);   // "NAME=value" strings for execve
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

// JobEnvironment holds what every rank of one job shares, and makes each rank's environment.
class JobEnvironment {
 public:
  // Create draws the job id and a fresh random token (from /dev/urandom) and a free port for
  // MASTER_PORT. `base` is the environment passed on to workers (normally CurrentEnvironment()).
  // Fails when -x names a variable that is neither given a value nor set in `base`, or when
  // /dev/urandom cannot be read.
  static absl::StatusOr<JobEnvironment> Create(const LaunchSpec& spec,
                                               const std::vector<std::string>& base);

  // SetRendezvousAddress sets TRAINRUN_RENDEZVOUS_ADDR ("host:port") for every rank made after it.
  // Until it is called the variable is left out.
  void SetRendezvousAddress(std::string host_port) { rendezvous_addr_ = std::move(host_port); }

  // ForRank returns rank `rank`'s whole environment as "NAME=value" strings, sorted by name.
  std::vector<std::string> ForRank(int rank) const;

  // Lookup returns the value `name` has in every rank's environment (base and -x), if any.
  std::optional<std::string> Lookup(const std::string& name) const;

  const std::string& job_id() const { return job_id_; }
  const std::string& token() const { return token_; }
  const std::string& master_addr() const { return master_addr_; }
  int master_port() const { return master_port_; }

 private:
  JobEnvironment() = default;

  hostfile::SlotPlan plan_;
  std::map<std::string, std::string> base_;    // trainrun's environment
  std::map<std::string, std::string> forced_;  // -x NAME=value (and -x NAME, from base)
  std::string job_id_;
  std::string token_;
  std::string master_addr_;
  int master_port_ = 0;
  std::optional<std::string> rendezvous_addr_;
  int host_gpu_count_ = 0;   // GPUs on this host (CountHostGpus), for CUDA_VISIBLE_DEVICES
  bool assign_gpus_ = true;  // TRAINRUN_ASSIGN_GPUS
};

}  // namespace trainrun::launcher
