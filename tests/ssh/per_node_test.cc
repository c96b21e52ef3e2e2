// Per-node mode end to end (torchrun's model): the real `trainrun` started once in each of two
// network-namespace hosts of a NetnsCluster, independently, as Kubernetes or a person would start
// it on each node: node 0 (10.213.1.11) serves the rendezvous at --rdzv-endpoint, node 1 joins it.
// No SSH is used (the fixture's sshds are never dialled). Checks a checked allreduce across both,
// the token, a node that never arrives, a failure on one node ending both, node 0's loss, and that
// nothing is left running on either host.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "skip_test.h"
#include "sshd_fixture.h"

namespace trainrun::testing {
namespace {

constexpr int kPort = 29400;

struct NodeRun {
  int status = -1;
  std::string out;
  double seconds = 0;
};

// The argv that runs trainrun as node `node` of `nnodes` (2, or a range MIN:MAX) in host
// namespace `node`.
std::vector<std::string> NodeArgv(const NetnsCluster& cluster, int node,
                                  const std::vector<std::string>& flags,
                                  const std::vector<std::string>& command,
                                  const std::string& nnodes = "2") {
  std::vector<std::string> argv = {"ip",
                                   "netns",
                                   "exec",
                                   cluster.host_ns(node),
                                   TRAINRUN_BIN,
                                   "--nnodes",
                                   nnodes,
                                   "--node-rank",
                                   std::to_string(node),
                                   "--rdzv-endpoint",
                                   absl::StrCat(cluster.host_address(0), ":", kPort),
                                   "--nproc-per-node",
                                   "2"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

// Starts both nodes' trainruns at once (node 1 first: it waits for node 0), each with its own
// flags, and waits for both.
std::vector<NodeRun> RunNodes(const NetnsCluster& cluster,
                              const std::vector<std::vector<std::string>>& flags,
                              const std::vector<std::string>& command) {
  std::vector<NodeRun> runs(2);
  std::vector<std::thread> threads;
  for (int node : {1, 0}) {
    threads.emplace_back([&, node] {
      auto start = std::chrono::steady_clock::now();
      runs[node].status =
          RunCommand(NodeArgv(cluster, node, flags[node], command), &runs[node].out, 60);
      runs[node].seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

pid_t ParentOf(pid_t pid) {
  const std::string stat = ReadFileText(absl::StrCat("/proc/", pid, "/stat"));
  // "pid (comm) state ppid ...": comm may hold spaces, so read after its ')'.
  size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  int ppid = -1;
  char state = 0;
  std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid);
  return ppid;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Every test's hosts: N network namespaces (the test is skipped where they cannot be made), with
// the sshd fixture's keys; CheckNothingLeft is each test's last check.
template <int N>
class Nodes {
 protected:
  Nodes()
      : can_(SkipUnlessNetns()), cluster(N, world.dir(), world.dir() + "/keys/authorized_keys") {}

  void CheckNothingLeft() {
    INFO("left behind:" << cluster.ProcessList());
    CHECK(cluster.HostsEmptyWithin());
  }

 private:
  static bool SkipUnlessNetns() {
    if (!CanUseNetns()) SkipTest("needs root and iproute2 to make network namespaces");
    return true;
  }
  bool can_;

 protected:
  SshWorld world;
  NetnsCluster cluster;
};

TEST_CASE_METHOD(Nodes<2>, "per-node: two independently started nodes run a checked allreduce",
                 "[netns][per_node][allreduce]") {
  const std::vector<std::string> token = {"--rdzv-token", "s3cret", "--start-timeout", "20"};
  std::vector<NodeRun> runs = RunNodes(cluster, {token, token}, {TRAINRUN_JOB_WORKER, "3"});
  INFO("node 0:\n" << runs[0].out << "\nnode 1:\n" << runs[1].out);
  CHECK(runs[0].status == 0);
  CHECK(runs[1].status == 0);
  // Node 0's trainrun is the job's launcher: every rank's output arrives there, tagged.
  for (int rank = 0; rank < 4; ++rank) {
    CHECK(Contains(runs[0].out, absl::StrCat("[", rank, "]<stdout>:rank ", rank, ": ok")));
  }
  // Node 1's console shows its own ranks' lines too.
  CHECK(Contains(runs[1].out, "[2]<stdout>:rank 2: ok"));
  CHECK(Contains(runs[1].out, "[3]<stdout>:rank 3: ok"));
  CHECK_FALSE(Contains(runs[1].out, "[0]<stdout>"));
  // With a token, no warning about strangers.
  CHECK_FALSE(Contains(runs[0].out + runs[1].out, "any host that reaches"));
  CheckNothingLeft();
}

TEST_CASE_METHOD(Nodes<2>, "per-node: a wrong token is refused; a node that never arrives is named",
                 "[netns][per_node][token]") {
  std::vector<NodeRun> runs = RunNodes(cluster,
                                       {{"--rdzv-token", "right", "--start-timeout", "3"},
                                        {"--rdzv-token", "wrong", "--start-timeout", "3"}},
                                       {TRAINRUN_JOB_WORKER, "1"});
  INFO("node 0:\n" << runs[0].out << "\nnode 1:\n" << runs[1].out);
  CHECK(runs[1].status != 0);
  CHECK(Contains(runs[1].out,
                 "refused this node (--node-rank 1): its --rdzv-token does not "
                 "match node 0's"));
  CHECK(runs[0].status != 0);
  CHECK(Contains(runs[0].out, "refused 10.213.1.12: its --rdzv-token does not match"));
  CHECK(Contains(runs[0].out,
                 "node 1 of --nnodes 2 never joined at port 29400 within "
                 "--start-timeout 3 s"));
  CheckNothingLeft();

  // Without a token, one warning line says any joiner is accepted; node 1 never started.
  NodeRun alone;
  alone.status = RunCommand(NodeArgv(cluster, 0, {"--start-timeout", "2"}, {"true"}), &alone.out);
  INFO(alone.out);
  CHECK(alone.status != 0);
  CHECK(Contains(alone.out,
                 "no --rdzv-token (nor TRAINRUN_RDZV_TOKEN): any host that reaches "
                 "10.213.1.11:29400 may join this job as a node, as with torchrun"));
  CHECK(Contains(alone.out, "node 1 of --nnodes 2 never joined"));
}

TEST_CASE_METHOD(Nodes<2>,
                 "per-node: a rank killed on node 1 ends both nodes with the same summary",
                 "[netns][per_node][failure]") {
  const std::vector<std::string> flags = {"--rdzv-token", "t", "--start-timeout", "20"};
  std::vector<NodeRun> runs =
      RunNodes(cluster, {flags, flags}, {TRAINRUN_JOB_WORKER, "50", "3", "2", "kill"});
  INFO("node 0:\n" << runs[0].out << "\nnode 1:\n" << runs[1].out);
  CHECK(runs[0].status == 128 + SIGKILL);
  CHECK(runs[1].status == 128 + SIGKILL);
  const std::string summary = "rank 3 on node1 was killed by SIGKILL; it failed first";
  CHECK(Contains(runs[0].out, summary));
  CHECK(Contains(runs[1].out, summary));
  CheckNothingLeft();
}

TEST_CASE_METHOD(Nodes<2>,
                 "per-node: node 0's trainrun killed ends node 1's ranks with a clear line",
                 "[netns][per_node][node0_lost]") {
  const std::vector<std::string> flags = {"--rdzv-token", "t", "--start-timeout", "20"};
  std::vector<NodeRun> runs(2);
  std::thread joiner([&] {
    runs[1].status = RunCommand(NodeArgv(cluster, 1, flags, {TRAINRUN_PRINT_THEN_SLEEP, "30"}),
                                &runs[1].out, 60);
  });
  std::thread head([&] {
    runs[0].status = RunCommand(NodeArgv(cluster, 0, flags, {TRAINRUN_PRINT_THEN_SLEEP, "30"}),
                                &runs[0].out, 60);
  });
  // Once node 1's two ranks run, kill node 0's trainrun.
  pid_t head_trainrun = -1;
  for (int i = 0; i < 100 && head_trainrun < 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    int sleepers = 0;
    for (pid_t pid : cluster.HostProcesses(1)) {
      if (Contains(ReadFileText(absl::StrCat("/proc/", pid, "/cmdline")), "print_then_sleep")) {
        ++sleepers;
      }
    }
    if (sleepers < 2) continue;
    for (pid_t pid : cluster.HostProcesses(0)) {
      const std::string cmdline = ReadFileText(absl::StrCat("/proc/", pid, "/cmdline"));
      // Node 0's trainrun itself (`ip netns exec` became it, so this test is its parent), not
      // one of its rank shims (forks of it, with the same command line).
      if (cmdline.rfind(TRAINRUN_BIN, 0) == 0 && ParentOf(pid) == ::getpid()) head_trainrun = pid;
    }
  }
  REQUIRE(head_trainrun > 0);
  ::kill(head_trainrun, SIGKILL);
  joiner.join();
  head.join();
  INFO("node 0:\n" << runs[0].out << "\nnode 1:\n" << runs[1].out);
  CHECK(runs[1].status != 0);
  CHECK(Contains(runs[1].out,
                 "lost node 0's trainrun at 10.213.1.11:29400 before the job "
                 "ended; this node's ranks (node 1) were ended"));
  CheckNothingLeft();
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// The start-time benchmark (hidden: run as `per_node_netns_test "[.bench]"`): 2 nodes x 2 ranks of
// the barrier example, per-node (the slower node's trainrun, both started at once) and over SSH
// from the client namespace (-H h0:2,h1:2), median of 5 each.
// Runs `argv` on a thread of its own into `run`, timing it.
std::thread RunTimed(std::vector<std::string> argv, NodeRun& run, int timeout_s = 60) {
  return std::thread([argv = std::move(argv), &run, timeout_s] {
    auto start = std::chrono::steady_clock::now();
    run.status = RunCommand(argv, &run.out, timeout_s);
    run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
}

TEST_CASE_METHOD(Nodes<3>,
                 "per-node: --nnodes 2:3 starts with the 2 nodes that joined; a late node joins it",
                 "[netns][per_node][range]") {
  const std::vector<std::string> flags = {"--rdzv-token",     "t", "--start-timeout", "20",
                                          "--rdzv-last-call", "2"};
  // Each rank says the world it started in, then lives long enough for node 2 to knock.
  const std::vector<std::string> job = {"/bin/sh", "-c",
                                        "echo \"rank $RANK of $WORLD_SIZE\"; sleep 5"};
  std::vector<NodeRun> runs(3);
  std::vector<std::thread> threads;
  threads.push_back(RunTimed(NodeArgv(cluster, 1, flags, job, "2:3"), runs[1]));
  threads.push_back(RunTimed(NodeArgv(cluster, 0, flags, job, "2:3"), runs[0]));
  // Node 2 comes once the job has started (the last call is 2 s after node 1 joined).
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  threads.push_back(RunTimed(NodeArgv(cluster, 2, flags, job, "2:3"), runs[2]));
  for (std::thread& t : threads) t.join();
  INFO("node 0:\n" << runs[0].out << "\nnode 1:\n" << runs[1].out << "\nnode 2:\n" << runs[2].out);
  CHECK(runs[0].status == 0);
  CHECK(runs[1].status == 0);
  CHECK(Contains(runs[0].out, "2 of --nnodes 2:3 nodes joined; starting the job with them"));
  for (int rank = 0; rank < 4; ++rank) {
    CHECK(Contains(runs[0].out, absl::StrCat("[", rank, "]<stdout>:rank ", rank, " of 4")));
  }
  // The late node joins the running job: its ranks start at their places in the grown job (this
  // script has no elastic API, so they never join the rendezvous; they are stopped once the
  // start's ranks have finished), and every node ends with the job's code.
  CHECK(runs[2].status == 0);
  CHECK(Contains(runs[0].out, "node2 joined the job: starting ranks 4-5 on it"));
  CHECK(Contains(runs[0].out, "[4]<stdout>:rank 4 of 6"));
  CHECK(Contains(runs[2].out, "[5]<stdout>:rank 5 of 6"));
  std::printf(
      "per-node --nnodes 2:3 (--rdzv-last-call 2): node 0 ran %.2f s (5 s job), the late "
      "node %.2f s\n",
      runs[0].seconds, runs[2].seconds);
  CheckNothingLeft();
}

TEST_CASE_METHOD(Nodes<2>,
                 "per-node: --nnodes 1:2 starts alone after the last call, at once when both join",
                 "[netns][per_node][range_start]") {
  const std::vector<std::string> job = {"/bin/sh", "-c", "echo \"rank $RANK of $WORLD_SIZE\""};
  // Node 0 alone: MIN is 1, so it starts by itself once the last call (1 s) has passed.
  NodeRun alone;
  std::thread(
      RunTimed(NodeArgv(cluster, 0, {"--rdzv-token", "t", "--rdzv-last-call", "1"}, job, "1:2"),
               alone))
      .join();
  INFO("alone:\n" << alone.out);
  CHECK(alone.status == 0);
  CHECK(Contains(alone.out, "1 of --nnodes 1:2 nodes joined; starting the job with them"));
  CHECK(Contains(alone.out, "[0]<stdout>:rank 0 of 2"));
  CHECK(Contains(alone.out, "[1]<stdout>:rank 1 of 2"));
  CHECK(alone.seconds >= 1);

  // Both nodes: MAX joined, so the job starts at once, without waiting for the last call (30 s).
  const std::vector<std::string> flags = {"--rdzv-token", "t", "--start-timeout", "20"};
  std::vector<NodeRun> runs(2);
  std::vector<std::thread> threads;
  threads.push_back(RunTimed(NodeArgv(cluster, 1, flags, job, "1:2"), runs[1]));
  threads.push_back(RunTimed(NodeArgv(cluster, 0, flags, job, "1:2"), runs[0]));
  for (std::thread& t : threads) t.join();
  INFO("node 0:\n" << runs[0].out << "\nnode 1:\n" << runs[1].out);
  CHECK(runs[0].status == 0);
  CHECK(runs[1].status == 0);
  for (int rank = 0; rank < 4; ++rank) {
    CHECK(Contains(runs[0].out, absl::StrCat("[", rank, "]<stdout>:rank ", rank, " of 4")));
  }
  CHECK(runs[0].seconds < 15);
  std::printf("per-node --nnodes 1:2: alone (--rdzv-last-call 1) %.2f s, both nodes %.2f s\n",
              alone.seconds, runs[0].seconds);

  // A node that joins and goes away during the last call is left out: node 0 starts alone (MAX
  // is 3, so node 1's join alone does not start the job).
  const std::vector<std::string> wait3 = {"--rdzv-token", "t", "--rdzv-last-call", "3"};
  std::vector<std::string> killed = NodeArgv(cluster, 1, wait3, job, "1:3");
  killed.insert(killed.begin() + 4, {"timeout", "-s", "KILL", "1"});
  NodeRun left, stayed;
  std::thread leaver = RunTimed(killed, left);
  std::thread head = RunTimed(NodeArgv(cluster, 0, wait3, job, "1:3"), stayed);
  leaver.join();
  head.join();
  INFO("node 0:\n" << stayed.out << "\nnode 1 (killed after 1 s):\n" << left.out);
  CHECK(left.status != 0);  // killed (RunCommand says -1)
  CHECK(stayed.status == 0);
  CHECK(Contains(stayed.out, "node 1 left before the job started; it may join again"));
  CHECK(Contains(stayed.out, "1 of --nnodes 1:3 nodes joined; starting the job with them"));
  CHECK(Contains(stayed.out, "[1]<stdout>:rank 1 of 2"));
  CHECK_FALSE(Contains(stayed.out, "[2]<stdout>"));

  // Fewer than MIN by --start-timeout: one sentence naming the range and the missing nodes.
  NodeRun short_of_min;
  short_of_min.status = RunCommand(
      NodeArgv(cluster, 0, {"--rdzv-token", "t", "--start-timeout", "2"}, {"true"}, "2:3"),
      &short_of_min.out);
  INFO(short_of_min.out);
  CHECK(short_of_min.status != 0);
  CHECK(Contains(short_of_min.out,
                 "only 1 of at least 2 nodes (--nnodes 2:3) joined at port 29400 within "
                 "--start-timeout 2 s"));
  CheckNothingLeft();
}

// The trainrun of node `node` in `cluster` (the one this test started, not a rank shim), once it
// runs; -1 when it does not within 10 s.
pid_t NodeTrainrun(const NetnsCluster& cluster, int node) {
  for (int i = 0; i < 100; ++i) {
    for (pid_t pid : cluster.HostProcesses(node)) {
      const std::string cmdline = ReadFileText(absl::StrCat("/proc/", pid, "/cmdline"));
      if (cmdline.rfind(TRAINRUN_BIN, 0) == 0 && ParentOf(pid) == ::getpid()) return pid;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return -1;
}

// FileAppears waits up to `seconds` for `path`, which a rank makes (RunCommand gives a node's
// output only once it ends): true once it exists.
bool FileAppears(const std::string& path, int seconds) {
  for (int i = 0; i < seconds * 10; ++i) {
    if (::access(path.c_str(), F_OK) == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// The seconds of the "recovered in S s" line that says `what`; -1 when there is none.
double RecoveredIn(const std::string& out, const std::string& what) {
  size_t at = out.find(what);
  if (at == std::string::npos) return -1;
  at = out.find("recovered in ", at);
  if (at == std::string::npos) return -1;
  return std::atof(out.c_str() + at + 13);
}

// WorkersRun waits up to 30 s until `count` elastic workers run on host `node` (the workers
// themselves, not their rank shims, whose command lines name them too).
bool WorkersRun(const NetnsCluster& cluster, int node, int count) {
  for (int i = 0; i < 300; ++i) {
    int workers = 0;
    for (pid_t pid : cluster.HostProcesses(node)) {
      const std::string cmdline = ReadFileText(absl::StrCat("/proc/", pid, "/cmdline"));
      if (cmdline.rfind(TRAINRUN_ELASTIC_WORKER, 0) == 0) ++workers;
    }
    if (workers >= count) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// The elastic C++ worker (examples/collectives/elastic_worker.cc, trainrun's elastic API): linear
// regression by SGD; 0.02 s a step keeps it running while nodes come and go.
std::vector<std::string> ElasticWorker(int steps) {
  return {TRAINRUN_ELASTIC_WORKER, "--steps", std::to_string(steps), "--step-sleep", "0.02",
          "--batches-per-commit",  "4"};
}

TEST_CASE_METHOD(Nodes<2>,
                 "per-node: --nnodes 1:3 grows onto a node that joins the running elastic job",
                 "[netns][per_node][grow]") {
  const std::vector<std::string> flags = {"--rdzv-token",     "t", "--start-timeout", "20",
                                          "--rdzv-last-call", "1"};
  // Node 0 starts alone (MIN 1, after the 1 s last call), at 2 ranks; node 1 comes once they
  // run, and a second later.
  std::vector<NodeRun> runs(2);
  std::vector<std::thread> threads;
  threads.push_back(RunTimed(NodeArgv(cluster, 0, flags, ElasticWorker(600), "1:3"), runs[0]));
  const bool alone = WorkersRun(cluster, 0, 2);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  threads.push_back(RunTimed(NodeArgv(cluster, 1, flags, ElasticWorker(600), "1:3"), runs[1]));
  for (std::thread& t : threads) t.join();
  CHECK(alone);
  INFO("node 0:\n" << runs[0].out << "\nnode 1:\n" << runs[1].out);
  CHECK(runs[0].status == 0);
  CHECK(runs[1].status == 0);
  CHECK(Contains(runs[0].out, "1 of --nnodes 1:3 nodes joined; starting the job with them"));
  CHECK(Contains(runs[0].out, "node1 joined the job: starting ranks 2-3 on it"));
  const double recovered = RecoveredIn(
      runs[0].out,
      "node1 joined the job (--nnodes 1:3): ranks 2-3 started; the job goes on at 4 ranks "
      "(generation 1, formed by ranks 0-1 of the start and 2-3)");
  CHECK(recovered >= 0);
  // The two ranks of the start resumed on 4 ranks; the job ended there, its weights checked.
  CHECK(Contains(runs[0].out, "(started as 0): resumed at step"));
  CHECK(Contains(runs[0].out, "on 4 ranks (generation 1)"));
  CHECK(Contains(runs[0].out, "on 4 rank(s) after 600 steps"));
  CHECK(Contains(runs[0].out, "weights bit-identical on every rank"));
  CHECK(Contains(runs[0].out, "the job survived 1 membership change"));
  std::printf(
      "per-node 1:3: node 1 joined the running job; re-formed at 4 ranks %.2f s after it "
      "joined (its ranks' start included; node 0 ran %.2f s, node 1 %.2f s)\n",
      recovered, runs[0].seconds, runs[1].seconds);
  CheckNothingLeft();
}

TEST_CASE_METHOD(Nodes<2>, "per-node: a node lost from a 1:3 elastic job may join it again",
                 "[netns][per_node][rejoin]") {
  const std::vector<std::string> flags = {"--rdzv-token",     "t", "--start-timeout", "20",
                                          "--rdzv-last-call", "1"};
  std::vector<NodeRun> runs(3);  // node 0, node 1 the first time, node 1 again
  std::thread head = RunTimed(NodeArgv(cluster, 0, flags, ElasticWorker(1200), "1:3"), runs[0]);
  REQUIRE(WorkersRun(cluster, 0, 2));
  std::thread first = RunTimed(NodeArgv(cluster, 1, flags, ElasticWorker(1200), "1:3"), runs[1]);
  const pid_t node1 = NodeTrainrun(cluster, 1);
  const bool grown = WorkersRun(cluster, 1, 2);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  if (node1 > 0) ::kill(node1, SIGKILL);
  first.join();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  std::thread again = RunTimed(NodeArgv(cluster, 1, flags, ElasticWorker(1200), "1:3"), runs[2]);
  again.join();
  head.join();
  INFO("node 0:\n"
       << runs[0].out << "\nnode 1:\n"
       << runs[1].out << "\nnode 1 again:\n"
       << runs[2].out);
  REQUIRE(node1 > 0);
  CHECK(grown);
  CHECK(runs[0].status == 0);
  CHECK(runs[2].status == 0);
  CHECK(Contains(runs[0].out, "node1 joined the job: starting ranks 2-3 on it"));
  CHECK(Contains(runs[0].out, "ranks 2-3 lost; the job goes on at 2 ranks"));
  CHECK(Contains(runs[0].out, "node1 joined the job: starting ranks 4-5 on it"));
  CHECK(Contains(runs[0].out, "on 4 rank(s) after 1200 steps"));
  CHECK(Contains(runs[0].out, "weights bit-identical on every rank"));
  CHECK(Contains(runs[0].out, "the job survived 3 membership changes"));
  CheckNothingLeft();
}

TEST_CASE_METHOD(
    Nodes<2>, "per-node: a node that joins as the elastic job ends runs nothing and ends with it",
    "[netns][per_node][join_ending]") {
  const std::vector<std::string> flags = {"--rdzv-token",     "t", "--start-timeout", "20",
                                          "--rdzv-last-call", "1"};
  // Rank 0 ends well at once (the job is finishing: it grows no more), rank 1 four seconds later.
  const std::string mark = world.dir() + "/finishing";
  const std::vector<std::string> job = {
      "/bin/sh", "-c",
      "echo \"rank $RANK of $WORLD_SIZE\"; if [ \"$RANK\" = 1 ]; then sleep 4; else touch " + mark +
          "; fi"};
  std::vector<NodeRun> runs(2);
  std::vector<std::thread> threads;
  threads.push_back(RunTimed(NodeArgv(cluster, 0, flags, job, "1:3"), runs[0]));
  const bool finishing = FileAppears(mark, 20);
  threads.push_back(RunTimed(NodeArgv(cluster, 1, flags, job, "1:3"), runs[1]));
  for (std::thread& t : threads) t.join();
  INFO("node 0:\n" << runs[0].out << "\nnode 1:\n" << runs[1].out);
  CHECK(finishing);
  CHECK(runs[0].status == 0);
  CHECK(runs[1].status == 0);
  CHECK(Contains(runs[0].out, "node1 joined as the job was ending; it runs nothing"));
  CHECK_FALSE(Contains(runs[0].out, "[2]<stdout>"));
  CHECK_FALSE(Contains(runs[1].out, "lost node 0"));
  CheckNothingLeft();
}

TEST_CASE_METHOD(
    Nodes<2>, "per-node: an elastic Python script (hvd.elastic.run) grows onto a node that joins",
    "[netns][per_node][grow_python]") {
#ifndef TRAINRUN_PYTHON
  trainrun::testing::SkipTest("needs trainrun's Python module (the trainrun_python target)");
#else
  const std::string output = world.dir() + "/output";
  const std::vector<std::string> flags = {"--rdzv-token",
                                          "t",
                                          "--start-timeout",
                                          "90",
                                          "--rdzv-last-call",
                                          "1",
                                          "-x",
                                          absl::StrCat("PYTHONPATH=", TRAINRUN_PYTHONPATH),
                                          "-x",
                                          "TRAINRUN_TIMEOUT=60",
                                          "-x",
                                          "PYTHONDONTWRITEBYTECODE=1"};
  // examples/elastic_train.py: from epoch 2 each step sleeps 0.3 s while the job has fewer than 4
  // ranks, so that it still trains when node 1's ranks (a Python with torch each) have joined.
  std::vector<std::string> job = {TRAINRUN_PYTHON,
                                  TRAINRUN_SOURCE_DIR "/examples/elastic_train.py"};
  for (const char* word : {"--epochs", "12", "--min-accuracy", "0.9", "--step-sleep", "0.3",
                           "--sleep-from-epoch", "2", "--sleep-until-size", "4"}) {
    job.push_back(word);
  }
  std::vector<NodeRun> runs(2);
  std::vector<std::thread> threads;
  std::vector<std::string> flags0 = flags;
  flags0.insert(flags0.end(), {"--output-filename", output});
  threads.push_back(RunTimed(NodeArgv(cluster, 0, flags0, job, "1:3"), runs[0], 240));
  // Node 1 comes once node 0's ranks train at 2 ranks (rank 0 has said its epoch 5).
  bool training = false;
  for (int i = 0; i < 1200 && !training; ++i) {
    training = Contains(ReadFileText(output + "/rank.0/stdout"), "epoch   5");
    if (!training) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  threads.push_back(RunTimed(NodeArgv(cluster, 1, flags, job, "1:3"), runs[1], 240));
  for (std::thread& t : threads) t.join();
  INFO("node 0:\n" << runs[0].out << "\nnode 1:\n" << runs[1].out);
  CHECK(training);
  CHECK(runs[0].status == 0);
  CHECK(runs[1].status == 0);
  CHECK(Contains(runs[0].out, "node1 joined the job: starting ranks 2-3 on it"));
  const double recovered = RecoveredIn(
      runs[0].out,
      "node1 joined the job (--nnodes 1:3): ranks 2-3 started; the job goes on at 4 ranks "
      "(generation 1, formed by ranks 0-1 of the start and 2-3)");
  CHECK(recovered >= 0);
  // Ranks 0-1 resumed at their last commit on 4 ranks; node 1's got the state by the sync.
  CHECK(Contains(runs[0].out, "(started as 0): resumed at step"));
  CHECK(Contains(runs[0].out, "(started as 1): resumed at step"));
  CHECK(Contains(runs[0].out, "on 4 ranks (last commit: step"));
  CHECK(Contains(runs[1].out, "(slot 2, on node1): joined at step"));
  const size_t final_line = runs[0].out.find("final test accuracy ");
  REQUIRE(final_line != std::string::npos);
  CHECK(std::atof(runs[0].out.c_str() + final_line + 20) >= 0.9);
  CHECK(Contains(runs[0].out.substr(final_line), "on 4 rank(s)"));
  CHECK(Contains(runs[0].out, "parameters bit-identical on every rank"));
  std::printf(
      "per-node 1:3, elastic_train.py: node 1 joined; re-formed at 4 ranks %.2f s after it "
      "joined (its ranks' Python and torch start included; node 0 ran %.2f s)\n",
      recovered, runs[0].seconds);
  CheckNothingLeft();
#endif
}

TEST_CASE_METHOD(Nodes<3>,
                 "per-node: a node killed in a 2:3 job leaves it going on with the other two",
                 "[netns][per_node][shrink]") {
  const std::vector<std::string> flags = {"--rdzv-token", "t", "--start-timeout", "20"};
  std::vector<NodeRun> runs(3);
  std::vector<std::thread> threads;
  for (int node : {2, 1, 0}) {
    threads.push_back(
        RunTimed(NodeArgv(cluster, node, flags, ElasticWorker(1000), "2:3"), runs[node]));
  }
  // Once node 2's ranks run (all 3 joined: the job started at once), SIGKILL its trainrun.
  const pid_t node2 = NodeTrainrun(cluster, 2);
  const bool running = WorkersRun(cluster, 2, 2);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  // (Without them, the nodes end by themselves: the checks below then say what happened.)
  if (node2 > 0 && running) ::kill(node2, SIGKILL);
  for (std::thread& t : threads) t.join();
  INFO("node 0:\n" << runs[0].out << "\nnode 1:\n" << runs[1].out << "\nnode 2:\n" << runs[2].out);
  REQUIRE(node2 > 0);
  CHECK(running);
  CHECK(runs[0].status == 0);
  CHECK(runs[1].status == 0);
  CHECK(runs[2].status != 0);  // killed
  CHECK(Contains(runs[0].out, "ranks 4-5 lost; the job goes on at 4 ranks (generation 1"));
  const double recovered = RecoveredIn(runs[0].out, "ranks 4-5 lost; the job goes on at 4 ranks");
  CHECK(recovered >= 0);
  CHECK(Contains(runs[0].out, "on 4 ranks (generation 1)"));
  CHECK(Contains(runs[0].out, "on 4 rank(s) after 1000 steps"));
  CHECK(Contains(runs[0].out, "weights bit-identical on every rank"));
  std::printf("per-node 2:3: node 2's trainrun killed; the job re-formed at 4 ranks in %.2f s\n",
              recovered);
  CheckNothingLeft();
}

TEST_CASE_METHOD(Nodes<2>,
                 "per-node: a node lost below --nnodes MIN ends the job at once, with one sentence",
                 "[netns][per_node][below_min]") {
  const std::vector<std::string> flags = {"--rdzv-token",     "t", "--start-timeout", "20",
                                          "--rdzv-last-call", "1"};
  std::vector<NodeRun> runs(2);
  std::vector<std::thread> threads;
  for (int node : {1, 0}) {
    threads.push_back(
        RunTimed(NodeArgv(cluster, node, flags, ElasticWorker(100000), "2:3"), runs[node]));
  }
  const pid_t node1 = NodeTrainrun(cluster, 1);
  const bool running = WorkersRun(cluster, 0, 2) && WorkersRun(cluster, 1, 2);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const auto killed_at = std::chrono::steady_clock::now();
  // Node 1 is killed in any case (the job would run for half an hour): REQUIRE after the joins.
  if (node1 > 0) ::kill(node1, SIGKILL);
  threads[1].join();  // node 0
  const double ended_in =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  threads[0].join();
  INFO("node 0:\n" << runs[0].out << "\nnode 1:\n" << runs[1].out);
  REQUIRE(node1 > 0);
  CHECK(running);
  CHECK(runs[0].status != 0);
  CHECK(Contains(runs[0].out,
                 "ranks 2-3 lost; 1 node was left, fewer than the 2 that --nnodes asks for at "
                 "least, so the job was stopped"));
  CHECK(ended_in < 5);
  std::printf("per-node 2:3: node 1's trainrun killed; node 0 ended the job in %.2f s\n", ended_in);
  CheckNothingLeft();
}

TEST_CASE_METHOD(
    Nodes<2>, "per-node: with --max-restarts a node that joins restarts every node at the new size",
    "[netns][per_node][restart_grow]") {
  const std::vector<std::string> flags = {"--rdzv-token",     "t", "--start-timeout", "20",
                                          "--rdzv-last-call", "1", "--max-restarts",  "1"};
  // A script without the elastic API: it says the world it started in, and waits (up to 60 s)
  // while that is smaller than 4 ranks, as a real job would run at the size it got.
  const std::string mark = world.dir() + "/started";
  const std::vector<std::string> job = {
      "/bin/sh", "-c",
      "echo \"rank $RANK of $WORLD_SIZE, restart $TRAINRUN_RESTART_COUNT\"; touch " + mark +
          "; if [ \"$WORLD_SIZE\" -lt 4 ]; then sleep 60; fi"};
  std::vector<NodeRun> runs(2);
  std::vector<std::thread> threads;
  threads.push_back(RunTimed(NodeArgv(cluster, 0, flags, job, "1:2"), runs[0]));
  REQUIRE(FileAppears(mark, 20));
  const auto joined_at = std::chrono::steady_clock::now();
  threads.push_back(RunTimed(NodeArgv(cluster, 1, flags, job, "1:2"), runs[1]));
  threads[0].join();
  const double reformed_in =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - joined_at).count();
  threads[1].join();
  INFO("node 0:\n" << runs[0].out << "\nnode 1:\n" << runs[1].out);
  CHECK(runs[0].status == 0);
  CHECK(runs[1].status == 0);
  CHECK(Contains(runs[0].out, "[0]<stdout>:rank 0 of 2, restart 0"));
  CHECK(Contains(runs[0].out, "node1 joined the job: every node's ranks start again with it"));
  CHECK(Contains(runs[0].out, "starting the job again with 2 nodes"));
  // The change of nodes is no failure: the restart count stays 0.
  for (int rank = 0; rank < 4; ++rank) {
    CHECK(Contains(runs[0].out,
                   absl::StrCat("[", rank, "]<stdout>:rank ", rank, " of 4, restart 0")));
  }
  CHECK(Contains(runs[1].out, "node 0 starts the job again: node 1 joins it again"));
  CHECK(runs[0].seconds < 30);
  std::printf(
      "per-node 1:2 --max-restarts 1: node 1 joined; the job ran again at 4 ranks and "
      "ended %.2f s after node 1 started\n",
      reformed_in);
  CheckNothingLeft();
}

TEST_CASE_METHOD(
    Nodes<3>, "per-node: with --max-restarts a lost node restarts the others, and below MIN ends",
    "[netns][per_node][restart_shrink]") {
  const std::vector<std::string> flags = {"--rdzv-token",     "t", "--start-timeout", "20",
                                          "--rdzv-last-call", "1", "--max-restarts",  "1"};
  // The first start waits (60 s) to be cut short; the restart ends at once.
  const std::string mark = world.dir() + "/started";
  const std::vector<std::string> job = {
      "/bin/sh", "-c",
      "echo \"rank $RANK of $WORLD_SIZE, restart $TRAINRUN_RESTART_COUNT\"; touch " + mark +
          "; if [ \"$TRAINRUN_RESTART_COUNT\" = 0 ]; then sleep 60; fi"};
  std::vector<NodeRun> runs(3);
  std::vector<std::thread> threads;
  for (int node : {2, 1, 0})
    threads.push_back(RunTimed(NodeArgv(cluster, node, flags, job, "2:3"), runs[node]));
  const pid_t node2 = NodeTrainrun(cluster, 2);
  const bool started = FileAppears(mark, 20);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto killed_at = std::chrono::steady_clock::now();
  if (node2 > 0) ::kill(node2, SIGKILL);
  threads[2].join();  // node 0
  const double restarted_in =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  threads[0].join();
  threads[1].join();
  INFO("node 0:\n" << runs[0].out << "\nnode 1:\n" << runs[1].out << "\nnode 2:\n" << runs[2].out);
  REQUIRE(node2 > 0);
  CHECK(started);
  CHECK(runs[0].status == 0);
  CHECK(runs[1].status == 0);
  CHECK(Contains(runs[0].out, "[4]<stdout>:rank 4 of 6, restart 0"));
  CHECK(Contains(runs[0].out, "restarting it (restart 1 of 1)"));
  for (int rank = 0; rank < 4; ++rank) {
    CHECK(Contains(runs[0].out,
                   absl::StrCat("[", rank, "]<stdout>:rank ", rank, " of 4, restart 1")));
  }
  CHECK(Contains(runs[1].out, "node 0 starts the job again: node 1 joins it again"));
  std::printf(
      "per-node 2:3 --max-restarts 1: node 2's trainrun killed; the other two ran again at "
      "4 ranks and ended %.2f s later\n",
      restarted_in);
  CheckNothingLeft();

  // Two nodes of 2:3, one lost: one is fewer than MIN, so no restart, one line says why.
  std::vector<NodeRun> pair(2);
  std::vector<std::thread> pair_threads;
  ::unlink(mark.c_str());
  for (int node : {1, 0})
    pair_threads.push_back(RunTimed(NodeArgv(cluster, node, flags, job, "2:3"), pair[node]));
  const pid_t node1 = NodeTrainrun(cluster, 1);
  const bool pair_started = FileAppears(mark, 20);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  if (node1 > 0) ::kill(node1, SIGKILL);
  for (std::thread& t : pair_threads) t.join();
  INFO("node 0:\n" << pair[0].out << "\nnode 1:\n" << pair[1].out);
  REQUIRE(node1 > 0);
  CHECK(pair_started);
  CHECK(pair[0].status != 0);
  CHECK(Contains(pair[0].out,
                 "1 node is left, fewer than the 2 that --nnodes 2:3 asks for at "
                 "least, so it does not start again"));
  CHECK_FALSE(Contains(pair[0].out, "restart 1"));
  CheckNothingLeft();
}

TEST_CASE_METHOD(Nodes<2>,
                 "per-node: --max-restarts with --nnodes N: every node joins again for the restart",
                 "[netns][per_node][restart]") {
  const std::vector<std::string> flags = {"--rdzv-token",   "t", "--start-timeout", "20",
                                          "--max-restarts", "2"};
  // Rank 3 (on node 1) fails in the first start; the second start succeeds.
  const std::vector<std::string> job = {
      "/bin/sh", "-c",
      "echo \"rank $RANK restart $TRAINRUN_RESTART_COUNT\"; "
      "[ \"$RANK\" != 3 ] || [ \"$TRAINRUN_RESTART_COUNT\" != 0 ] || exit 5"};
  std::vector<NodeRun> runs = RunNodes(cluster, {flags, flags}, job);
  INFO("node 0:\n" << runs[0].out << "\nnode 1:\n" << runs[1].out);
  CHECK(runs[0].status == 0);
  CHECK(runs[1].status == 0);
  CHECK(Contains(runs[0].out, "rank 3 on node1 exited with code 5"));
  CHECK(Contains(runs[0].out, "restarting it (restart 1 of 2)"));
  CHECK(Contains(runs[0].out, "[3]<stdout>:rank 3 restart 1"));
  CHECK(Contains(runs[0].out, "the job succeeded on its restart 1 of 2"));
  CHECK(Contains(runs[1].out, "node 0 starts the job again: node 1 joins it again"));
  CHECK(Contains(runs[1].out, "[2]<stdout>:rank 2 restart 1"));
  CheckNothingLeft();
}

TEST_CASE_METHOD(Nodes<2>, "per-node: start time next to an SSH launch",
                 "[.bench][netns][per_node]") {
  std::vector<double> per_node, ssh;
  for (int i = 0; i < 5; ++i) {
    std::vector<NodeRun> runs =
        RunNodes(cluster, {{"--rdzv-token", "t"}, {"--rdzv-token", "t"}}, {TRAINRUN_BARRIER, "-v"});
    INFO(runs[0].out << runs[1].out);
    REQUIRE(runs[0].status == 0);
    REQUIRE(runs[1].status == 0);
    REQUIRE(Contains(runs[0].out, "passed the barrier"));
    per_node.push_back(std::max(runs[0].seconds, runs[1].seconds));
    REQUIRE(cluster.HostsEmptyWithin());

    std::string out;
    auto start = std::chrono::steady_clock::now();
    int status = RunCommand(
        InClient(world, cluster,
                 {TRAINRUN_BIN, "-i", world.user_ed25519(), "-np", "4", "-H",
                  absl::StrCat(cluster.host_address(0), ":2,", cluster.host_address(1), ":2"),
                  TRAINRUN_BARRIER, "-v"}),
        &out, 60);
    INFO(out);
    REQUIRE(status == 0);
    ssh.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    REQUIRE(cluster.HostsEmptyWithin());
  }
  WARN("start time, 2 nodes x 2 ranks, barrier example, median of 5: per-node "
       << Median(per_node) << " s (slower node's trainrun), SSH launch " << Median(ssh) << " s");
}

}  // namespace
}  // namespace trainrun::testing
