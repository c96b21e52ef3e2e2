// The C++ face of the Slurm test cluster (slurm_fixture.h), and the Slurm behaviour the launch
// channel relies on: scancel ends every process of a job on every node (proctrack/linuxproc
// follows even a task that left its session), and `srun -u` carries bytes unchanged.
#include "slurm_fixture.h"

#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "skip_test.h"

namespace trainrun::testing {
namespace {

TEST_CASE("slurm: scancel leaves nothing on any node; srun -u is byte-clean", "[slurm]") {
  if (std::string why = SlurmCluster::CannotRun(); !why.empty()) SkipTest(why);
  SlurmCluster cluster(2);
  std::string out;
  // A job whose tasks each leave a detached grandchild; scancel while they run.
  int status = RunCommand(
      cluster.Command({"sh", "-c",
                       "srun -N 2 sh -c 'setsid sleep 300 & echo started; sleep 300' & "
                       "until [ $(squeue -h -t R | wc -l) = 1 ] && sleep 1; do sleep 0.1; done; "
                       "scancel $(squeue -h -o %i); wait"}),
      &out, 60);
  INFO(out);
  CHECK(status == 0);
  CHECK(out.find("CANCELLED") != std::string::npos);
  CHECK(cluster.NodesEmptyWithin());

  // srun -u: the task's stdout is a pty, already raw: every byte value arrives as sent.
  status = RunCommand(
      cluster.Command({"sh", "-c",
                       "srun -u -N1 -n1 -w " + cluster.nodes()[1] +
                           " /usr/bin/python3 -c 'import os; os.write(1, bytes(range(256)))' | "
                           "/usr/bin/python3 -c 'import sys; d = sys.stdin.buffer.read(); "
                           "print(\"clean\" if d == bytes(range(256)) else d)'"}),
      &out, 60);
  INFO(out);
  CHECK(status == 0);
  CHECK(out.find("clean") != std::string::npos);
}

}  // namespace
}  // namespace trainrun::testing
