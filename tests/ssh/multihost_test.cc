// End to end: the real `trainrun` binary, run in the client namespace of a NetnsCluster, launching
// over SSH (a real sshd in each host namespace) onto hosts 10.213.1.11 and .12, with the agent
// being `trainrun --agent` at the same path. Checks results, failure summaries naming rank and
// host, and that nothing is left running on any host afterwards.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "skip_test.h"
#include "sshd_fixture.h"

namespace trainrun::testing {
namespace {

// Runs trainrun in the cluster's client namespace with the world's SSH directory as ~/.ssh and
// the world's ed25519 key; returns its exit status and puts its output (stdout and stderr) in *out.
int RunTrainrun(const SshWorld& world, const NetnsCluster& cluster,
                const std::vector<std::string>& args, std::string* out, double* seconds = nullptr) {
  auto start = std::chrono::steady_clock::now();
  int status = RunCommand(TrainrunInClient(world, cluster, TRAINRUN_BIN, args), out, 60);
  if (seconds) {
    *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return status;
}

std::string Hosts(const NetnsCluster& cluster, int slots) {
  return absl::StrCat(cluster.host_address(0), ":", slots, ",", cluster.host_address(1), ":",
                      slots);
}

TEST_CASE("multihost: -np 8 over two SSH hosts passes the rendezvous barrier",
          "[ssh][netns][barrier]") {
  if (!CanUseNetns()) {
    trainrun::testing::SkipTest("needs root and iproute2 to make network namespaces");
  }
  SshWorld world;
  NetnsCluster cluster(2, world.dir(), world.dir() + "/keys/authorized_keys");
  std::string out;
  int status = RunTrainrun(world, cluster,
                           {"-np", "8", "-H", Hosts(cluster, 4), TRAINRUN_BARRIER, "-v"}, &out);
  INFO(out);
  CHECK(status == 0);
  for (int rank = 0; rank < 8; ++rank) {
    CHECK(out.find(absl::StrCat("[", rank, "]<stdout>:rank ", rank, " of 8")) != std::string::npos);
  }
  CHECK(out.find("passed the barrier") != std::string::npos);
  INFO("left behind:" << cluster.ProcessList());
  CHECK(cluster.HostsEmptyWithin());

  // The same launch through the system `ssh` binary.
  status = RunTrainrun(
      world, cluster,
      {"--ssh-client", "openssh", "-np", "4", "-H", Hosts(cluster, 2), TRAINRUN_BARRIER, "-v"},
      &out);
  INFO(out);
  CHECK(status == 0);
  CHECK(out.find("[3]<stdout>:rank 3 of 4") != std::string::npos);
  {
    const bool empty = cluster.HostsEmptyWithin();
    INFO("left behind after the openssh launch:" << cluster.ProcessList());
    CHECK(empty);
  }

  // The dry run says how each host is reached.
  status = RunTrainrun(
      world, cluster,
      {"--dry-run", "-np", "4", "-H", "localhost:2," + cluster.host_address(1) + ":2", "true"},
      &out);
  INFO("the dry run: " << out);
  CHECK(status == 0);
  CHECK(out.find("localhost: local") != std::string::npos);
  CHECK(out.find(cluster.host_address(1) + ": ssh root@" + cluster.host_address(1) + " port 22") !=
        std::string::npos);
}

TEST_CASE("multihost: remote ranks join and pass barriers through their host's relay",
          "[ssh][netns][relay]") {
  if (!CanUseNetns()) {
    trainrun::testing::SkipTest("needs root and iproute2 to make network namespaces");
  }
  SshWorld world;
  NetnsCluster cluster(2, world.dir(), world.dir() + "/keys/authorized_keys");
  // Each rank says which relay it was given, then joins and passes the example's barriers.
  const std::string command =
      "echo \"relay=${TRAINRUN_RENDEZVOUS_RELAY:-none}\"; exec " TRAINRUN_BARRIER " -v";
  std::string out;
  int status =
      RunTrainrun(world, cluster, {"-np", "8", "-H", Hosts(cluster, 4), "sh", "-c", command}, &out);
  INFO(out);
  CHECK(status == 0);
  for (int rank = 0; rank < 8; ++rank) {
    CHECK(out.find(absl::StrCat("[", rank, "]<stdout>:relay=@trainrun-relay-")) !=
          std::string::npos);
    CHECK(out.find(absl::StrCat("[", rank, "]<stdout>:rank ", rank, " of 8")) != std::string::npos);
  }
  CHECK(out.find("passed the barrier") != std::string::npos);
  {
    const bool empty = cluster.HostsEmptyWithin();
    INFO("left behind:" << cluster.ProcessList());
    CHECK(empty);
  }

  // Asked for none, the agents start none and the ranks dial the launcher themselves.
  status = RunTrainrun(world, cluster,
                       {"-x", "TRAINRUN_RENDEZVOUS_RELAY=off", "-np", "4", "-H", Hosts(cluster, 2),
                        "sh", "-c", command},
                       &out);
  INFO(out);
  CHECK(status == 0);
  CHECK(out.find("relay=@") == std::string::npos);
  CHECK(out.find("[3]<stdout>:relay=none") != std::string::npos);
  CHECK(out.find("[3]<stdout>:rank 3 of 4") != std::string::npos);
  INFO("left behind:" << cluster.ProcessList());
  CHECK(cluster.HostsEmptyWithin());
}

TEST_CASE("multihost: a remote rank's failure ends the job everywhere, naming rank and host",
          "[ssh][netns][failure]") {
  if (!CanUseNetns()) {
    trainrun::testing::SkipTest("needs root and iproute2 to make network namespaces");
  }
  SshWorld world;
  NetnsCluster cluster(2, world.dir(), world.dir() + "/keys/authorized_keys");
  const std::string host1 = cluster.host_address(1);

  SECTION("exit code 3") {
    std::string out;
    double seconds = 0;
    int status = RunTrainrun(
        world, cluster,
        {"-np", "4", "-H", Hosts(cluster, 2), "sh", "-c",
         "if [ \"$TRAINRUN_RANK\" = 3 ]; then sleep 0.5; echo dying >&2; exit 3; fi; sleep 30"},
        &out, &seconds);
    INFO(out);
    CHECK(status == 3);
    CHECK(out.find("rank 3 on " + host1 + " exited with code 3") != std::string::npos);
    CHECK(out.find("| dying") != std::string::npos);
    CHECK(seconds < 15);
    INFO("left behind:" << cluster.ProcessList());
    CHECK(cluster.HostsEmptyWithin());
  }
  SECTION("kill -9 of a remote rank") {
    std::string out;
    int status =
        RunTrainrun(world, cluster,
                    {"-np", "4", "-H", Hosts(cluster, 2), "sh", "-c",
                     "if [ \"$TRAINRUN_RANK\" = 2 ]; then sleep 0.5; kill -9 $$; fi; sleep 30"},
                    &out);
    INFO(out);
    CHECK(status == 128 + SIGKILL);
    CHECK(out.find("rank 2 on " + host1 + " was killed by SIGKILL") != std::string::npos);
    INFO("left behind:" << cluster.ProcessList());
    CHECK(cluster.HostsEmptyWithin());
  }
  SECTION("--max-restarts: a remote rank fails on the first start, the second passes a barrier") {
    std::string out;
    int status =
        RunTrainrun(world, cluster,
                    {"--max-restarts", "1", "-np", "4", "-H", Hosts(cluster, 2), "sh", "-c",
                     "if [ $TRAINRUN_RESTART_COUNT = 0 ] && [ $TRAINRUN_RANK = 3 ]; then "
                     "sleep 0.5; exit 3; fi; exec " TRAINRUN_BARRIER " -v"},
                    &out);
    INFO(out);
    CHECK(status == 0);
    CHECK(out.find("rank 3 on " + host1 + " exited with code 3") != std::string::npos);
    CHECK(out.find("restarting it (restart 1 of 1)") != std::string::npos);
    CHECK(out.find("the job succeeded on its restart 1 of 1") != std::string::npos);
    CHECK(out.find("[3]<stdout>:rank 3 of 4") != std::string::npos);
    CHECK(out.find("passed the barrier") != std::string::npos);
    INFO("left behind:" << cluster.ProcessList());
    CHECK(cluster.HostsEmptyWithin());
  }
  SECTION("kill -9 of a host's agent") {
    std::string out;
    // The rank's parent is its supervisor (rank_shim); the supervisor's parent is the agent.
    int status = RunTrainrun(world, cluster,
                             {"-np", "4", "-H", Hosts(cluster, 2), "sh", "-c",
                              "if [ \"$TRAINRUN_RANK\" = 2 ]; then sleep 0.5; "
                              "kill -9 $(ps -o ppid= -p $PPID); fi; sleep 30"},
                             &out);
    INFO(out);
    CHECK(status != 0);
    CHECK(out.find("host " + host1 + ": lost its agent") != std::string::npos);
    INFO("left behind:" << cluster.ProcessList());
    CHECK(cluster.HostsEmptyWithin());
  }
}

TEST_CASE("multihost: local and remote ranks in one job and an unreachable host failing the start",
          "[ssh][netns][mixed]") {
  if (!CanUseNetns()) {
    trainrun::testing::SkipTest("needs root and iproute2 to make network namespaces");
  }
  SshWorld world;
  NetnsCluster cluster(2, world.dir(), world.dir() + "/keys/authorized_keys");
  std::string out;
  int status = RunTrainrun(
      world, cluster,
      {"-np", "4", "-H", "localhost:2," + cluster.host_address(1) + ":2", TRAINRUN_BARRIER, "-v"},
      &out);
  INFO(out);
  CHECK(status == 0);
  CHECK(out.find("[0]<stdout>:rank 0 of 4") != std::string::npos);
  CHECK(out.find("[3]<stdout>:rank 3 of 4") != std::string::npos);

  // Remote ranks reach rank 0's host (this one) at the client's address, not "localhost".
  status = RunTrainrun(world, cluster,
                       {"-np", "4", "-H", "localhost:2," + cluster.host_address(1) + ":2", "sh",
                        "-c", "echo master=$MASTER_ADDR"},
                       &out);
  CHECK(status == 0);
  CHECK(out.find("[1]<stdout>:master=localhost") != std::string::npos);
  CHECK(out.find("[3]<stdout>:master=10.213.1.1") != std::string::npos);

  // --network-interface: the rendezvous binds that interface's address, workers are told its name.
  status = RunTrainrun(world, cluster,
                       {"--network-interface", "br0", "-np", "2", "-H",
                        "localhost:1," + cluster.host_address(1) + ":1", "sh", "-c",
                        "echo nic=$TRAINRUN_NETWORK_INTERFACE at=${TRAINRUN_RENDEZVOUS_ADDR%:*}"},
                       &out);
  CHECK(status == 0);
  CHECK(out.find("[0]<stdout>:nic=br0 at=10.213.1.1") != std::string::npos);
  CHECK(out.find("[1]<stdout>:nic=br0 at=10.213.1.1") != std::string::npos);
  status = RunTrainrun(
      world, cluster,
      {"--network-interface", "nosuch0", "-np", "2", "-H", cluster.host_address(1) + ":2", "true"},
      &out);
  CHECK(status != 0);
  CHECK(out.find("--network-interface nosuch0: this host has no interface 'nosuch0'") !=
        std::string::npos);

  // Nothing listens on port 2222 there: refused, in words, at once.
  status =
      RunTrainrun(world, cluster,
                  {"-p", "2222", "-np", "2", "-H", cluster.host_address(0) + ":2", "true"}, &out);
  CHECK(status != 0);
  CHECK(out.find("host " + cluster.host_address(0)) != std::string::npos);
  CHECK(out.find("refused") != std::string::npos);

  // 10.213.1.99 is on the test subnet but nobody holds it: the start fails within the timeout,
  // naming it, and the host that did connect is left with nothing running.
  double seconds = 0;
  std::vector<std::string> args = {"--start-timeout",
                                   "3",
                                   "-np",
                                   "4",
                                   "-H",
                                   cluster.host_address(0) + ":2,10.213.1.99:2",
                                   "true"};
  std::vector<std::string> argv = {"ip",
                                   "netns",
                                   "exec",
                                   cluster.client_ns(),
                                   "env",
                                   "HOME=" + world.dir() + "/home",
                                   TRAINRUN_BIN,
                                   "-i",
                                   world.user_ed25519()};
  argv.insert(argv.end(), args.begin(), args.end());
  auto start = std::chrono::steady_clock::now();
  status = RunCommand(argv, &out, 30);
  seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(out);
  CHECK(status != 0);
  CHECK(out.find("host 10.213.1.99") != std::string::npos);
  CHECK(seconds < 6);
  INFO("left behind:" << cluster.ProcessList());
  CHECK(cluster.HostsEmptyWithin());
}

TEST_CASE("multihost: each start failure in its own words, with nothing left on the other host",
          "[ssh][netns][errors]") {
  if (!CanUseNetns()) {
    trainrun::testing::SkipTest("needs root and iproute2 to make network namespaces");
  }
  SshWorld world;
  NetnsCluster cluster(2, world.dir(), world.dir() + "/keys/authorized_keys");
  const std::string good = cluster.host_address(1) + ":2,";
  auto run = [&](const std::string& key, const std::string& hosts, std::string* out,
                 const std::string& remote_trainrun = TRAINRUN_BIN) {
    std::vector<std::string> argv = {"ip",
                                     "netns",
                                     "exec",
                                     cluster.client_ns(),
                                     "env",
                                     "HOME=" + world.dir() + "/home",
                                     TRAINRUN_BIN,
                                     "-i",
                                     key,
                                     "--remote-trainrun",
                                     remote_trainrun,
                                     "--start-timeout",
                                     "5",
                                     "-np",
                                     "4",
                                     "-H",
                                     hosts,
                                     "sleep",
                                     "30"};
    auto start = std::chrono::steady_clock::now();
    int status = RunCommand(argv, out, 30);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(7));
    return status;
  };
  std::string out;
  SECTION("unresolvable name") {
    CHECK(run(world.user_ed25519(), good + "no-such-host.invalid:2", &out) != 0);
    INFO(out);
    CHECK(out.find("host no-such-host.invalid: name not resolved") != std::string::npos);
  }
  SECTION("a key the host does not accept") {
    CHECK(run(world.stranger(), good + cluster.host_address(0) + ":2", &out) != 0);
    INFO(out);
    CHECK(out.find("authentication failed for user root") != std::string::npos);
  }
  SECTION("no trainrun at that path on the host") {
    CHECK(run(world.user_ed25519(), good + cluster.host_address(0) + ":2", &out,
              "/nonexistent/trainrun") != 0);
    INFO(out);
    CHECK(out.find("trainrun is not installed at that path there") != std::string::npos);
    CHECK(out.find("--remote-trainrun") != std::string::npos);
  }
  SECTION("a changed host key") {
    std::string other = world.dir() + "/other_host_key";
    MakeKey("ed25519", other);
    std::string known = cluster.host_address(0) + " " + ReadFileText(other + ".pub");
    REQUIRE(RunCommand({"sh", "-c", "printf '%s' \"$0\" > " + world.ssh_dir() + "/known_hosts",
                        known}) == 0);
    CHECK(run(world.user_ed25519(), good + cluster.host_address(0) + ":2", &out) != 0);
    INFO(out);
    CHECK(out.find("host " + cluster.host_address(0) + ": host key mismatch") != std::string::npos);
  }
  INFO("left behind:" << cluster.ProcessList());
  CHECK(cluster.HostsEmptyWithin());
}

// Writes `text` to `path` and makes it executable.
void WriteScript(const std::string& path, const std::string& text) {
  REQUIRE(RunCommand({"sh", "-c", "printf '%s' \"$0\" > " + path + " && chmod +x " + path, text}) ==
          0);
}

TEST_CASE("multihost: an ~/.ssh/config alias reaches the workers as the address trainrun reached",
          "[ssh][netns][alias]") {
  if (!CanUseNetns()) {
    trainrun::testing::SkipTest("needs root and iproute2 to make network namespaces");
  }
  SshWorld world;
  NetnsCluster cluster(2, world.dir(), world.dir() + "/keys/authorized_keys");
  // worker1 and worker2 are names only this machine's SSH config knows.
  WriteScript(world.ssh_dir() + "/config",
              absl::StrCat("Host worker1\n  HostName ", cluster.host_address(0),
                           "\nHost worker2\n  HostName ", cluster.host_address(1), "\n"));
  for (const char* client : {"libssh2", "openssh"}) {
    std::string out;
    int status = RunTrainrun(world, cluster,
                             {"--ssh-client", client, "-np", "2", "-H", "worker1:1,worker2:1", "sh",
                              "-c", "echo master=$MASTER_ADDR host=$TRAINRUN_HOSTNAME"},
                             &out);
    INFO(client << ": " << out);
    CHECK(status == 0);
    CHECK(out.find("[0]<stdout>:master=" + cluster.host_address(0) + " host=worker1") !=
          std::string::npos);
    CHECK(out.find("[1]<stdout>:master=" + cluster.host_address(0) + " host=worker2") !=
          std::string::npos);
  }
  // The ranks meet through the rendezvous as usual.
  std::string out;
  int status = RunTrainrun(world, cluster,
                           {"-np", "4", "-H", "worker1:2,worker2:2", TRAINRUN_BARRIER, "-v"}, &out);
  INFO(out);
  CHECK(status == 0);
  CHECK(out.find("passed the barrier") != std::string::npos);
  INFO("left behind:" << cluster.ProcessList());
  CHECK(cluster.HostsEmptyWithin());
}

TEST_CASE("multihost: two names of one remote host are one host, its local ranks numbered across",
          "[ssh][netns][alias]") {
  if (!CanUseNetns()) {
    trainrun::testing::SkipTest("needs root and iproute2 to make network namespaces");
  }
  SshWorld world;
  NetnsCluster cluster(2, world.dir(), world.dir() + "/keys/authorized_keys");
  // Host 0 gets a second address: worker1 (an ~/.ssh/config name) and 10.213.1.111 are one machine
  // that no comparison of names or addresses could tell; its agents' Hellos can.
  const std::string second = "10.213.1.111";
  REQUIRE(RunCommand(
              {"ip", "-n", cluster.host_ns(0), "addr", "add", second + "/24", "dev", "eth0"}) == 0);
  WriteScript(world.ssh_dir() + "/config",
              absl::StrCat("Host worker1\n  HostName ", cluster.host_address(0), "\n"));
  std::string out;
  int status = RunTrainrun(
      world, cluster,
      {"-np", "3", "-H", absl::StrCat("worker1:1,", second, ":1,", cluster.host_address(1), ":1"),
       "sh", "-c",
       "echo rank=$RANK local=$LOCAL_RANK of $LOCAL_WORLD_SIZE host=$TRAINRUN_HOSTNAME"},
      &out);
  INFO(out);
  CHECK(status == 0);
  CHECK(out.find("trainrun: info: worker1, " + second +
                 " are one machine (one boot and network namespace, as their agents say): one host "
                 "with 2 slots, its local ranks numbered across them\n") != std::string::npos);
  CHECK(out.find("[0]<stdout>:rank=0 local=0 of 2 host=worker1\n") != std::string::npos);
  CHECK(out.find("[1]<stdout>:rank=1 local=1 of 2 host=worker1\n") != std::string::npos);
  CHECK(out.find("[2]<stdout>:rank=2 local=0 of 1 host=" + cluster.host_address(1) + "\n") !=
        std::string::npos);
  INFO("left behind:" << cluster.ProcessList());
  CHECK(cluster.HostsEmptyWithin());
}

TEST_CASE("multihost: a remote host's ranks get GPUs by that host's count, from its agent",
          "[ssh][netns][gpus]") {
  if (!CanUseNetns()) {
    trainrun::testing::SkipTest("needs root and iproute2 to make network namespaces");
  }
  SshWorld world;
  NetnsCluster cluster(2, world.dir(), world.dir() + "/keys/authorized_keys");
  // The agent runs where the driver lists two GPUs (this machine lists none).
  const std::string agent = world.dir() + "/agent_with_gpus";
  WriteScript(agent, absl::StrCat("#!/bin/sh\nexec unshare -m sh -c 'mount -t tmpfs none "
                                  "/proc/driver && mkdir -p /proc/driver/nvidia/gpus/0000:01:00.0 "
                                  "/proc/driver/nvidia/gpus/0000:02:00.0 && exec ",
                                  TRAINRUN_BIN, " --agent'\n"));
  std::string out;
  // By default CUDA_VISIBLE_DEVICES is left alone, as horovodrun and torchrun do.
  int status = RunTrainrun(world, cluster,
                           {"--remote-trainrun", agent, "-np", "3", "-H",
                            "localhost:1," + cluster.host_address(1) + ":2", "sh", "-c",
                            "echo gpu=${CUDA_VISIBLE_DEVICES-none}"},
                           &out);
  INFO(out);
  CHECK(status == 0);
  CHECK(out.find("[1]<stdout>:gpu=none") != std::string::npos);
  CHECK(out.find("[2]<stdout>:gpu=none") != std::string::npos);
  // --assign-gpus: one GPU per local rank, from each host's own count.
  status = RunTrainrun(world, cluster,
                       {"--assign-gpus", "--remote-trainrun", agent, "-np", "3", "-H",
                        "localhost:1," + cluster.host_address(1) + ":2", "sh", "-c",
                        "echo gpu=${CUDA_VISIBLE_DEVICES-none}"},
                       &out);
  INFO(out);
  CHECK(status == 0);
  CHECK(out.find("[0]<stdout>:gpu=none") != std::string::npos);  // this machine: no GPU
  CHECK(out.find("[1]<stdout>:gpu=0") != std::string::npos);
  CHECK(out.find("[2]<stdout>:gpu=1") != std::string::npos);
  INFO("left behind:" << cluster.ProcessList());
  CHECK(cluster.HostsEmptyWithin());
}

TEST_CASE("multihost: --start-timeout is one deadline, from the first connection to the last start",
          "[ssh][netns][deadline]") {
  if (!CanUseNetns()) {
    trainrun::testing::SkipTest("needs root and iproute2 to make network namespaces");
  }
  SshWorld world;
  NetnsCluster cluster(2, world.dir(), world.dir() + "/keys/authorized_keys");
  // The agent greets 3 s after trainrun starts (the connection and the remote login shell take
  // less), and reads its job 3 s after that: each phase alone fits in 5 s, both together do not.
  const std::string agent = world.dir() + "/slow_agent";
  const std::string start_file = world.dir() + "/started_at";
  WriteScript(agent,
              absl::StrCat("#!/bin/sh\nsleep $(awk -v t0=$(cat ", start_file,
                           ") -v now=$(date +%s.%N) 'BEGIN { d = t0 + 3 - now; print (d > 0 ? "
                           "d : 0) }')\n(sleep 3; exec cat) | ",
                           TRAINRUN_BIN, " --agent\n"));
  auto run = [&](const std::string& timeout, std::string* out, double* seconds) {
    std::vector<std::string> argv = TrainrunInClient(
        world, cluster, TRAINRUN_BIN,
        {"--remote-trainrun", agent, "-np", "2", "-H", cluster.host_address(1) + ":2", "true"},
        timeout);
    REQUIRE(RunCommand({"sh", "-c", "date +%s.%N > " + start_file}) == 0);
    auto start = std::chrono::steady_clock::now();
    int status = RunCommand(argv, out, 60);
    *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return status;
  };
  std::string out;
  double seconds = 0;
  int status = run("5", &out, &seconds);
  INFO(out);
  CHECK(status != 0);
  CHECK(out.find("host " + cluster.host_address(1) +
                 ": only 0 of its 2 ranks started within 5 s") != std::string::npos);
  CHECK(seconds < 8);
  INFO("left behind:" << cluster.ProcessList());
  CHECK(cluster.HostsEmptyWithin(std::chrono::seconds(10)));

  // With room for both phases the same job starts.
  status = run("10", &out, &seconds);
  INFO(out);
  CHECK(status == 0);
  CHECK(cluster.HostsEmptyWithin(std::chrono::seconds(10)));
}

TEST_CASE("multihost: the dry run tells each host's trainrun; another release is one line at start",
          "[ssh][netns][versions]") {
  if (!CanUseNetns()) {
    trainrun::testing::SkipTest("needs root and iproute2 to make network namespaces");
  }
  SshWorld world;
  NetnsCluster cluster(2, world.dir(), world.dir() + "/keys/authorized_keys");
  const std::string host0 = cluster.host_address(0);
  const std::string host1 = cluster.host_address(1);
  const std::string plan_line = "trainrun: dry run: 3 ranks on 3 hosts; nothing is started\n";
  std::string out;
  double seconds = 0;
  // Both hosts have this trainrun (at the same path); the dry run connects to ask.
  int status = RunTrainrun(
      world, cluster, {"--dry-run", "-H", "localhost:1," + host0 + ":1," + host1 + ":1", "true"},
      &out, &seconds);
  INFO(out);
  CHECK(status == 0);
  CHECK(out.find(plan_line) == 0);
  // Each host's line ends with what its `trainrun --gpu-probe` said (GPUs, driver, NCCL).
  const std::string found =
      absl::StrCat(": trainrun ", TRAINRUN_RELEASE, " at ", TRAINRUN_BIN, ", as here; ");
  // The hosts' lines come as they answer, after the plan and in any order.
  const size_t hosts_at = out.find("trainrun on the hosts:\n  ");
  CHECK(hosts_at != std::string::npos);
  CHECK(out.find("\n  " + host0 + found, hosts_at) != std::string::npos);
  const size_t host1_at = out.find("\n  " + host1 + found, hosts_at);
  CHECK(host1_at != std::string::npos);
  if (host1_at != std::string::npos) {
    CHECK(out.find("NCCL", host1_at) < out.find('\n', host1_at + 1));
  }
  CHECK(out.find("localhost: trainrun") == std::string::npos);  // this machine is not asked
  CHECK(seconds < 10);

  // A wrong --remote-trainrun, and a host that cannot be reached: one line each, the plan intact.
  status = RunTrainrun(world, cluster,
                       {"--dry-run", "--remote-trainrun", "/nonexistent/trainrun", "-H",
                        host0 + ":2,no-such-host.invalid:1", "true"},
                       &out, &seconds);
  INFO(out);
  CHECK(status == 0);
  CHECK(out.find("trainrun: dry run: 3 ranks on 2 hosts; nothing is started\n") == 0);
  CHECK(out.find("\n  " + host0 +
                 ": trainrun not found at /nonexistent/trainrun; install it there, or pass "
                 "--remote-trainrun PATH\n") != std::string::npos);
  CHECK(out.find("\n  no-such-host.invalid: name not resolved") != std::string::npos);
  CHECK(seconds < 10);

  // Agents of another release (the same protocol): the job runs, with one line at its start
  // naming each host and both releases.
  status = RunTrainrun(world, cluster,
                       {"--remote-trainrun", TRAINRUN_AGENT_OTHER_RELEASE, "-np", "3", "-H",
                        "localhost:1," + host0 + ":1," + host1 + ":1", "echo", "ran"},
                       &out);
  INFO(out);
  CHECK(status == 0);
  CHECK(out.find("[2]<stdout>:ran") != std::string::npos);
  CHECK(out.find(absl::StrCat("trainrun: warning: host ", host0,
                              " runs trainrun 0.0.0-other, host ", host1,
                              " runs trainrun 0.0.0-other, this is trainrun ", TRAINRUN_RELEASE,
                              " (the same agent protocol, so the job goes on); install the same "
                              "trainrun version on every host\n")) != std::string::npos);
  // The same release says nothing.
  status =
      RunTrainrun(world, cluster, {"-np", "2", "-H", host0 + ":1," + host1 + ":1", "true"}, &out);
  INFO(out);
  CHECK(status == 0);
  CHECK(out.find("warning") == std::string::npos);
  INFO("left behind:" << cluster.ProcessList());
  CHECK(cluster.HostsEmptyWithin());
}

#ifdef TRAINRUN_ALLREDUCE_PERF
TEST_CASE("multihost: an allreduce across two SSH hosts gives the right result",
          "[ssh][netns][allreduce]") {
  if (!CanUseNetns()) {
    trainrun::testing::SkipTest("needs root and iproute2 to make network namespaces");
  }
  SshWorld world;
  NetnsCluster cluster(2, world.dir(), world.dir() + "/keys/authorized_keys");
  std::string out;
  int status = RunTrainrun(world, cluster,
                           {"-np", "4", "-H", Hosts(cluster, 2), TRAINRUN_ALLREDUCE_PERF, "-b",
                            "1K", "-e", "1M", "-f", "32", "-n", "2", "-w", "1", "-c", "1"},
                           &out);
  INFO(out);
  CHECK(status == 0);
  CHECK(out.find("4 ranks") != std::string::npos);
  // Rank 0 prints one line per size; its last column counts wrong elements over all ranks.
  int sizes = 0;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const std::string tag = "[0]<stdout>:";
    if (line.rfind(tag, 0) != 0 || line.find('#') != std::string::npos) continue;
    ++sizes;
    std::istringstream words(line.substr(tag.size()));
    std::string word, last;
    while (words >> word) last = word;
    CHECK(last == "0");
  }
  CHECK(sizes == 3);  // 1K, 32K, 1M
  CHECK(cluster.HostsEmptyWithin());
}
#endif

TEST_CASE("multihost: a host that falls off the network fails the job, naming it",
          "[ssh][netns][slow][netloss]") {
  if (!CanUseNetns()) {
    trainrun::testing::SkipTest("needs root and iproute2 to make network namespaces");
  }
  SshWorld world;
  NetnsCluster cluster(2, world.dir(), world.dir() + "/keys/authorized_keys");
  // Once every rank runs, host 1's link goes down: no end-of-file, only silence.
  std::string script =
      absl::StrCat("(for i in $(seq 100); do [ \"$(grep -c up ", world.dir(),
                   "/net.out)\" = 4 ] && break; "
                   "sleep 0.1; done; ip netns exec ",
                   cluster.host_ns(1),
                   " ip link set eth0 down) & "
                   "env HOME=",
                   world.dir(), "/home ", TRAINRUN_BIN, " -i ", world.user_ed25519(), " -np 4 -H ",
                   Hosts(cluster, 2), " sh -c 'echo up; sleep 120' > ", world.dir(),
                   "/net.out 2>&1; echo status $?");
  std::string out;
  auto start = std::chrono::steady_clock::now();
  RunCommand({"ip", "netns", "exec", cluster.client_ns(), "sh", "-c", script}, &out, 90);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string log = ReadFileText(world.dir() + "/net.out");
  INFO(out << log);
  CHECK(out.find("status 1") != std::string::npos);
  CHECK(log.find("host " + cluster.host_address(1) + ": lost its agent") != std::string::npos);
  CHECK(log.find("no word from its agent") != std::string::npos);
  CHECK(seconds < 60);
  // The agent there noticed the silence too and killed its ranks.
  INFO("left behind:" << cluster.ProcessList());
  CHECK(cluster.OnlySshdLeftWithin(std::chrono::seconds(10)));
}

TEST_CASE("multihost: kill -9 of trainrun leaves nothing running on the hosts",
          "[ssh][netns][kill9]") {
  if (!CanUseNetns()) {
    trainrun::testing::SkipTest("needs root and iproute2 to make network namespaces");
  }
  SshWorld world;
  NetnsCluster cluster(2, world.dir(), world.dir() + "/keys/authorized_keys");
  std::string out;
  // Both SSH clients: with openssh, the launcher's `ssh` children must go with it.
  const std::string client = GENERATE(std::string("libssh2"), std::string("openssh"));
  CAPTURE(client);
  // trainrun in the background; once its ranks run everywhere, SIGKILL it.
  std::string script = absl::StrCat(
      "env HOME=", world.dir(), "/home ", TRAINRUN_BIN, " -i ", world.user_ed25519(),
      " --ssh-client ", client, " -np 4 -H ", Hosts(cluster, 2), " sh -c 'echo up; sleep 60' > ",
      world.dir(), "/bg.out 2>&1 & pid=$!; for i in $(seq 100); do [ \"$(grep -c up ", world.dir(),
      "/bg.out)\" = 4 ] && break; sleep 0.1; done; kill -9 $pid; wait $pid; echo killed");
  int status =
      RunCommand({"ip", "netns", "exec", cluster.client_ns(), "sh", "-c", script}, &out, 30);
  INFO(out << ReadFileText(world.dir() + "/bg.out"));
  CHECK(status == 0);
  CHECK(ReadFileText(world.dir() + "/bg.out").find("[3]<stdout>:up") != std::string::npos);
  INFO("left behind:" << cluster.ProcessList());
  CHECK(cluster.HostsEmptyWithin(std::chrono::seconds(5)));

  // Ctrl-C (SIGINT) reaches the remote ranks as a teardown, and trainrun exits 130.
  script = absl::StrCat(
      "env HOME=", world.dir(), "/home ", TRAINRUN_BIN, " -i ", world.user_ed25519(), " -np 4 -H ",
      Hosts(cluster, 2), " sh -c 'echo up; sleep 60' > ", world.dir(),
      "/int.out 2>&1 & pid=$!; for i in $(seq 100); do [ \"$(grep -c up ", world.dir(),
      "/int.out)\" = 4 ] && break; sleep 0.1; done; kill -INT $pid; wait $pid; echo status $?");
  status = RunCommand({"ip", "netns", "exec", cluster.client_ns(), "sh", "-c", script}, &out, 30);
  std::string log = ReadFileText(world.dir() + "/int.out");
  INFO(out << log);
  CHECK(out.find("status 130") != std::string::npos);
  CHECK(log.find("interrupted by SIGINT") != std::string::npos);
  CHECK(cluster.HostsEmptyWithin(std::chrono::seconds(5)));
}

}  // namespace
}  // namespace trainrun::testing

namespace trainrun::testing {
namespace {

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Not part of the suite (hidden): start-to-exit of `-np 8` over two SSH hosts beside `-np 8` on
// this host. Run: build/bin/ssh_multihost_test "[bench]"
TEST_CASE("multihost bench: -np 8 on two SSH hosts vs one host", "[.][bench]") {
  if (!CanUseNetns()) return;
  SshWorld world;
  NetnsCluster cluster(2, world.dir(), world.dir() + "/keys/authorized_keys");
  constexpr int kRuns = 11;
  std::vector<double> remote, local;
  for (int i = 0; i < kRuns; ++i) {
    std::string out;
    double seconds = 0;
    REQUIRE(RunTrainrun(world, cluster, {"-np", "8", "-H", Hosts(cluster, 4), TRAINRUN_BARRIER},
                        &out, &seconds) == 0);
    remote.push_back(seconds);
    auto start = std::chrono::steady_clock::now();
    REQUIRE(RunCommand({TRAINRUN_BIN, "-np", "8", TRAINRUN_BARRIER}, &out) == 0);
    local.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(remote.begin(), remote.end());
  std::sort(local.begin(), local.end());
  WARN("runs " << kRuns << ": two SSH hosts x4: median " << Median(remote) << " s (min "
               << remote.front() << ", max " << remote.back() << "); one host -np 8: median "
               << Median(local) << " s (min " << local.front() << ", max " << local.back() << ")");
}

}  // namespace
}  // namespace trainrun::testing

namespace trainrun::testing {
namespace {
// Seconds of the day of each "[rank]<stdout>:" line that contains `needle`, from
// --prefix-timestamp's "YYYY-MM-DD HH:MM:SS" (the time trainrun received the line).
int ArrivalSecond(const std::string& out, const std::string& needle) {
  size_t at = out.find(needle);
  if (at == std::string::npos) return -1;
  size_t line = out.rfind('\n', at);
  line = line == std::string::npos ? 0 : line + 1;
  const std::string text = out.substr(line, at - line);
  size_t colon = text.find(':');
  if (colon == std::string::npos || colon < 2 || colon + 5 > text.size()) return -1;
  return std::stoi(text.substr(colon - 2, 2)) * 3600 + std::stoi(text.substr(colon + 1, 2)) * 60 +
         std::stoi(text.substr(colon + 4, 2));
}

TEST_CASE("multihost: a remote rank's lines arrive as it prints them (Python and C stdio)",
          "[ssh][netns][live]") {
  if (!CanUseNetns()) {
    trainrun::testing::SkipTest("needs root and iproute2 to make network namespaces");
  }
  SshWorld world;
  NetnsCluster cluster(2, world.dir(), world.dir() + "/keys/authorized_keys");
  for (const std::vector<std::string>& worker :
       {std::vector<std::string>{"env", "-u", "PYTHONUNBUFFERED", "/usr/bin/python3", "-c",
                                 "import os,time\nprint('step 1', os.environ.get("
                                 "'PYTHONUNBUFFERED'))\ntime.sleep(3)\nprint('step 2')"},
        std::vector<std::string>{TRAINRUN_PRINT_THEN_SLEEP, "3"}}) {
    std::vector<std::string> args = {"--prefix-timestamp", "-np", "1", "-H",
                                     cluster.host_address(1) + ":1"};
    args.insert(args.end(), worker.begin(), worker.end());
    std::string out;
    int status = RunTrainrun(world, cluster, args, &out);
    INFO(out);
    CHECK(status == 0);
    int first = ArrivalSecond(out, "]<stdout>:step 1");
    int second = ArrivalSecond(out, "]<stdout>:step 2");
    REQUIRE(first >= 0);
    REQUIRE(second >= 0);
    // Printed 3 s apart: received at least 2 s apart (whole seconds), not together at exit.
    CHECK((second - first + 86400) % 86400 >= 2);
  }
  INFO("left behind:" << cluster.ProcessList());
  CHECK(cluster.HostsEmptyWithin());
}

TEST_CASE("multihost: --bind-to core, --report-bindings and -wdir on a remote host",
          "[ssh][netns][placement]") {
  if (!CanUseNetns()) {
    trainrun::testing::SkipTest("needs root and iproute2 to make network namespaces");
  }
  if (std::thread::hardware_concurrency() < 2) {
    trainrun::testing::SkipTest("one CPU: disjoint cores cannot be shown");
  }
  SshWorld world;
  NetnsCluster cluster(2, world.dir(), world.dir() + "/keys/authorized_keys");
  const std::string host = cluster.host_address(1);
  std::string out;
  int status = RunTrainrun(world, cluster,
                           {"--bind-to", "core", "--report-bindings", "-wdir", world.dir(), "-H",
                            host + ":2", "sh", "-c",
                            "echo cwd=$(pwd) cpus=$(sed -n 's/^Cpus_allowed_list:\\s*//p' "
                            "/proc/self/status)"},
                           &out);
  INFO(out);
  CHECK(status == 0);
  // Each remote rank runs in -wdir, on the core the agent bound it to, as reported.
  std::string cpus[2];
  for (int rank = 0; rank < 2; ++rank) {
    const std::string tag = "[" + std::to_string(rank) + "]<stdout>:cwd=" + world.dir() + " cpus=";
    size_t at = out.find(tag);
    REQUIRE(at != std::string::npos);
    cpus[rank] = out.substr(at + tag.size(), out.find('\n', at) - at - tag.size());
    CHECK(out.find("trainrun: info: rank " + std::to_string(rank) + " on " + host +
                   " bound to core " + std::to_string(rank) + " (cpus " + cpus[rank] + ")") !=
          std::string::npos);
  }
  CHECK(cpus[0] != cpus[1]);
  INFO("left behind:" << cluster.ProcessList());
  CHECK(cluster.HostsEmptyWithin());
}

}  // namespace
}  // namespace trainrun::testing
