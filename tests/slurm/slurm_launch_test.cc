// trainrun inside a Slurm allocation of the test cluster (slurm_fixture.h): the hosts come from the
// allocation and are reached through Slurm, one `srun` step per node carrying the agent protocol;
// the nodes run no sshd. A barrier and a checked allreduce on 2 nodes x 2 tasks, a rank killed on
// node 2, scancel, a node failure, the time limit, and trainrun.run(fn) from Python; nothing may be
// left on any node.
#include <catch2/catch.hpp>
#include <chrono>
#include <regex>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "skip_test.h"
#include "slurm_fixture.h"

namespace trainrun::testing {
namespace {

// `salloc -N 2 --ntasks-per-node 2 trainrun ARGS...` on the cluster.
int RunInAllocation(const SlurmCluster& cluster, const std::vector<std::string>& args,
                    std::string* out) {
  std::vector<std::string> argv = {
      "salloc", "-Q", "-N", "2", "--ntasks-per-node", "2", TRAINRUN_BIN, "--start-timeout", "30"};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(cluster.Command(argv), out, 90);
}

TEST_CASE("slurm: trainrun reaches an allocation's nodes through srun", "[slurm]") {
  if (std::string why = SlurmCluster::CannotRun(); !why.empty()) SkipTest(why);
  SlurmCluster cluster(2);
  const std::string& n1 = cluster.nodes()[0];
  const std::string& n2 = cluster.nodes()[1];
  std::string out;

  SECTION("the plan and how the nodes are reached") {
    CHECK(RunInAllocation(cluster, {"--dry-run", "hostname"}, &out) == 0);
    INFO(out);
    CHECK(out.find(n1 + ": srun -u -N1 -n1 -w " + n1) != std::string::npos);
    CHECK(out.find(n2 + ": srun -u -N1 -n1 -w " + n2) != std::string::npos);
  }

  SECTION("a barrier and a checked allreduce, 2 nodes x 2 ranks") {
    int status = RunInAllocation(cluster, {TRAINRUN_BARRIER, "-v"}, &out);
    INFO(out);
    CHECK(status == 0);
    CHECK(out.find("rank 3 of 4 (local 1 of 2, host " + n2 + ") passed the barrier") !=
          std::string::npos);
    CHECK(out.find("rank 0 of 4 (local 0 of 2, host " + n1 + ") passed the barrier") !=
          std::string::npos);
    status = RunInAllocation(cluster,
                             {TRAINRUN_ALLREDUCE_PERF, "-b", "1K", "-e", "1M", "-f", "32", "-n",
                              "2", "-w", "1", "-c", "1"},
                             &out);
    INFO(out);
    CHECK(status == 0);
    int sizes = 0;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      const std::string tag = "[0]<stdout>:";
      if (line.rfind(tag, 0) != 0 || line.find('#') != std::string::npos) continue;
      ++sizes;
      std::istringstream words(line.substr(tag.size()));
      std::string word, last;
      while (words >> word) last = word;
      CHECK(last == "0");  // wrong elements, over all ranks
    }
    CHECK(sizes == 3);
  }

  SECTION("a directory copied through srun (--sync-dst-dir), the ranks running in the copy") {
    char src_template[] = "/tmp/trainrun-slurm-sync.XXXXXX";
    REQUIRE(mkdtemp(src_template) != nullptr);
    const std::string dir = src_template;
    REQUIRE(RunCommand({"sh", "-c",
                        "mkdir " + dir + "/src && echo lr=0.1 >" + dir + "/src/job.cfg"}) == 0);
    // The test's nodes share this machine's disk, so both copies land in one DIR.
    int status = RunInAllocation(cluster,
                                 {"--sync-src-dir", dir + "/src", "--sync-dst-dir", dir + "/copy",
                                  "sh", "-c", "echo \"in $(pwd): $(cat job.cfg)\""},
                                 &out);
    INFO(out);
    CHECK(status == 0);
    CHECK(out.find("synced " + dir + "/src to " + dir + "/copy on 2 hosts") != std::string::npos);
    CHECK(out.find("[3]<stdout>:in " + dir + "/copy: lr=0.1") != std::string::npos);
    RunCommand({"rm", "-rf", dir});
  }

  SECTION("a rank killed on node 2: its exit code and the summary") {
    int status = RunInAllocation(
        cluster,
        {"sh", "-c", "if [ $TRAINRUN_RANK = 3 ]; then sleep 1; kill -9 $$; fi; exec sleep 60"},
        &out);
    INFO(out);
    CHECK(status != 0);
    CHECK(out.find("rank 3 on " + n2) != std::string::npos);
    CHECK(out.find("SIGKILL") != std::string::npos);
  }

  SECTION("scancel: the job ends with a summary and nothing is left") {
    auto start = std::chrono::steady_clock::now();
    int status = RunCommand(
        cluster.Command(
            {"sh", "-c",
             absl::StrCat("salloc -Q -N 2 --ntasks-per-node 2 ", TRAINRUN_BIN,
                          " sh -c 'exec sleep 300' & ",
                          "until [ $(ps -e -o comm= | grep -c '^sleep$') -ge 4 ]; do sleep 0.1; "
                          "done; scancel $(squeue -h -o %i); wait $!")}),
        &out, 90);
    INFO(out);
    CHECK(status != 0);
    CHECK(out.find(" was cancelled (scancel)") != std::string::npos);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(60));
  }

  SECTION("a node fails (everything on node 2 killed, slurmd too): the job ends naming it") {
    auto start = std::chrono::steady_clock::now();
    int status = RunCommand(
        cluster.Command(
            {"sh", "-c",
             absl::StrCat("salloc -Q -N 2 --ntasks-per-node 2 ", TRAINRUN_BIN,
                          " sh -c 'exec sleep 300' & ",
                          "until [ $(ps -e -o comm= | grep -c '^sleep$') -ge 4 ]; do sleep 0.1; "
                          "done; ip netns pids ",
                          n2, " | xargs kill -9; wait $!")}),
        &out, 120);
    INFO(out);
    CHECK(status != 0);
    // Slurm's own word first (the controller's job state), whichever way trainrun noticed.
    CHECK(std::regex_search(
        out, std::regex("trainrun: error: (host " + n2 +
                        R"(: lost its agent before its ranks ended \()?a node of Slurm job )"
                        R"([0-9]+ failed)")));
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(60));
  }

  SECTION("the allocation's time limit ends the job, saying so") {
    auto start = std::chrono::steady_clock::now();
    // Slurm's limits are in whole minutes: -t 0:05 is one minute.
    int status =
        RunCommand(cluster.Command({"salloc", "-Q", "-N", "2", "--ntasks-per-node", "2", "-t",
                                    "0:05", TRAINRUN_BIN, "sh", "-c", "exec sleep 300"}),
                   &out, 150);
    INFO(out);
    CHECK(status != 0);
    CHECK(out.find("reached its time limit (TimeLimit=00:01:00)") != std::string::npos);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(100));
  }

  SECTION("trainrun.run(fn) inside salloc -N 2 returns every rank's value") {
    int status = RunCommand(
        cluster.Command({"env", "PYTHONPATH=" TRAINRUN_PYTHONPATH, "TRAINRUN_BIN=" TRAINRUN_BIN,
                         "salloc", "-Q", "-N", "2", "--ntasks-per-node", "2", TRAINRUN_PYTHON, "-c",
                         "import os, trainrun\n"
                         "def where(x):\n"
                         "    import numpy\n"
                         "    trainrun.init()\n"
                         "    s = trainrun.allreduce(numpy.ones(1), op=trainrun.Sum)\n"
                         "    return trainrun.rank(), os.environ['TRAINRUN_HOSTNAME'], x + s[0]\n"
                         "print('values', trainrun.run(where, args=(10,), np=4))\n"}),
        &out, 90);
    INFO(out);
    CHECK(status == 0);
    CHECK(out.find(absl::StrCat("values [(0, '", n1, "', 14.0), (1, '", n1, "', 14.0), (2, '", n2,
                                "', 14.0), (3, '", n2, "', 14.0)]")) != std::string::npos);
  }
  CHECK(cluster.NodesEmptyWithin());
}

}  // namespace
}  // namespace trainrun::testing
