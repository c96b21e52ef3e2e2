// A real Slurm cluster for C++ tests: tests/slurm/cluster.sh started in a temporary folder (munged,
// slurmctld on this host, N slurmd nodes each in its own network namespace), stopped when the
// object goes, also when a test fails or throws.
//
//   if (std::string why = SlurmCluster::CannotRun(); !why.empty()) SkipTest(why);  // skip_test.h
//   SlurmCluster cluster(2);
//   std::string out;
//   int status = RunCommand(cluster.Command({"salloc", "-N", "2", "srun", "hostname"}), &out);
//   CHECK(cluster.NodeProcesses(0).empty());   // nothing but slurmd left on node 0
//   CHECK(cluster.NodesEmptyWithin());          // nor, within 10 s, on any node
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "sshd_fixture.h"

namespace trainrun::testing {

class SlurmCluster {
 public:
  // Throws std::runtime_error, with cluster.sh's words, when the cluster does not come up.
  explicit SlurmCluster(int nodes = 2);
  ~SlurmCluster();
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  // "" when this machine can run a cluster (root, Slurm and munge installed), else why not.
  static std::string CannotRun();

  const std::string& dir() const { return dir_.path(); }
  const std::string& conf() const { return conf_; }  // SLURM_CONF
  const std::vector<std::string>& nodes() const { return nodes_; }
  // `env SLURM_CONF=... argv...`: argv run as a client of this cluster.
  std::vector<std::string> Command(const std::vector<std::string>& argv) const;
  // Pids in node i's network namespace other than its slurmd (a job's slurmstepd and tasks).
  std::vector<pid_t> NodeProcesses(int i) const;
  // Whether every node's NodeProcesses is empty within `seconds` (a cancelled step takes a moment
  // to end).
  bool NodesEmptyWithin(int seconds = 10) const;

 private:
  TempDir dir_;
  std::string conf_;
  std::vector<std::string> nodes_;
};

}  // namespace trainrun::testing
