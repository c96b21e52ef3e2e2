// --sync-dst-dir end to end: the real `trainrun` binary in the client namespace of a NetnsCluster
// copies a source directory to two SSH hosts (a real sshd in each host namespace), each with a
// private tmpfs where the copy goes (no shared disk, as on a cluster without one). The ranks run
// in the copy; a resync without changes copies nothing; a changed file is copied again; .git and
// the --sync-exclude patterns stay behind; a host where the directory cannot be written fails the
// job with one line naming that host and the path, and nothing is left running.
#include <sys/stat.h>
#include <sys/time.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "skip_test.h"
#include "sshd_fixture.h"

namespace trainrun::testing {
namespace {

void Write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

int RunTrainrun(const SshWorld& world, const NetnsCluster& cluster,
                const std::vector<std::string>& args, std::string* out) {
  return RunCommand(TrainrunInClient(world, cluster, TRAINRUN_BIN, args), out, 60);
}

bool Has(const std::string& out, const std::string& text) {
  return out.find(text) != std::string::npos;
}

TEST_CASE("sync: --sync-dst-dir copies what changed to every host and the ranks run there",
          "[ssh][netns][sync]") {
  if (!CanUseNetns()) {
    trainrun::testing::SkipTest("needs root and iproute2 to make network namespaces");
  }
  SshWorld world;
  const std::string hosts_dir = world.dir() + "/hostdisk";  // each host's own tmpfs
  NetnsCluster cluster(2, world.dir(), world.dir() + "/keys/authorized_keys", hosts_dir);
  const std::string src = world.dir() + "/src";
  const std::string dst = hosts_dir + "/job";
  for (const char* sub : {"", "/data", "/.git", "/logs", "/cache"}) {
    mkdir((src + sub).c_str(), 0755);
  }
  Write(src + "/data/x.txt", "first version\n");
  Write(src + "/big.bin", std::string(3 << 20, 'b'));  // several pieces
  Write(src + "/run.sh", "#!/bin/sh\necho \"in $(pwd): $(cat data/x.txt)\"\n");
  chmod((src + "/run.sh").c_str(), 0755);
  Write(src + "/.git/HEAD", "ref: refs/heads/main\n");
  Write(src + "/logs/train.log", "excluded by *.log\n");
  Write(src + "/cache/blob", "excluded with its directory\n");
  const std::vector<std::string> job = {
      "-np",
      "4",
      "-H",
      absl::StrCat(cluster.host_address(0), ":2,", cluster.host_address(1), ":2"),
      "--sync-dst-dir",
      dst,
      "--sync-src-dir",
      src,
      "--sync-exclude",
      "*.log",
      "--sync-exclude",
      "cache",
      "./run.sh"};
  std::string out;

  // The first sync copies the three files to both hosts; each rank runs in DIR and reads them.
  int status = RunTrainrun(world, cluster, job, &out);
  INFO(out);
  REQUIRE(status == 0);
  CHECK(Has(out, absl::StrCat("synced ", src, " to ", dst, " on 2 hosts")));
  CHECK(Has(out, ": 6 files copied (6.0 MiB), 0 unchanged"));
  for (int rank = 0; rank < 4; ++rank) {
    CHECK(Has(out, absl::StrCat("[", rank, "]<stdout>:in ", dst, ": first version")));
  }
  for (int host = 0; host < 2; ++host) {
    std::string listing;
    CHECK(cluster.RunOnHost(host, {"sh", "-c", "cd " + dst + " && find . | sort"}, &listing) == 0);
    INFO("host " << host << " has:\n" << listing);
    CHECK(listing == ".\n./big.bin\n./data\n./data/x.txt\n./logs\n./run.sh\n");
    CHECK(cluster.RunOnHost(host, {"test", "-x", dst + "/run.sh"}) == 0);
  }
  // The launcher's own disk has no DIR: the copies are the hosts' own.
  CHECK(access(dst.c_str(), F_OK) != 0);
  CHECK(cluster.HostsEmptyWithin());

  // Nothing changed: nothing is copied (through the system ssh this time).
  std::vector<std::string> openssh = {"--ssh-client", "openssh"};
  openssh.insert(openssh.end(), job.begin(), job.end());
  status = RunTrainrun(world, cluster, openssh, &out);
  INFO(out);
  CHECK(status == 0);
  CHECK(Has(out, ": 0 files copied (0.0 MiB), 6 unchanged"));

  // A changed file is copied again, and the ranks see the new version.
  Write(src + "/data/x.txt", "second version\n");
  struct timeval later[2] = {{2000000000, 0}, {2000000000, 0}};
  utimes((src + "/data/x.txt").c_str(), later);
  status = RunTrainrun(world, cluster, job, &out);
  INFO(out);
  CHECK(status == 0);
  CHECK(Has(out, ": 2 files copied (0.0 MiB), 4 unchanged"));
  CHECK(Has(out, absl::StrCat("[3]<stdout>:in ", dst, ": second version")));
  CHECK(cluster.HostsEmptyWithin());

  // Host 2's disk is too small for big.bin: the copy stops with one line naming host and file,
  // and no piece of it is left behind there.
  REQUIRE(cluster.RunOnHost(1, {"rm", "-rf", dst}) == 0);
  REQUIRE(cluster.RunOnHost(1, {"mount", "-o", "remount,size=2m", hosts_dir}) == 0);
  status = RunTrainrun(world, cluster, job, &out);
  INFO(out);
  CHECK(status == 2);
  CHECK(Has(out, absl::StrCat("host ", cluster.host_address(1), ": cannot write '", dst,
                              "/big.bin': No space left on device")));
  CHECK(!Has(out, "]<stdout>:"));
  std::string left;
  cluster.RunOnHost(1, {"sh", "-c", "ls -a " + dst}, &left);
  CHECK(left.find("trainrun-sync") == std::string::npos);
  CHECK(cluster.HostsEmptyWithin());

  // Host 2's disk turns read-only: the job fails before any rank starts, naming host and path.
  REQUIRE(cluster.RunOnHost(1, {"mount", "-o", "remount,ro", hosts_dir}) == 0);
  Write(src + "/data/x.txt", "third version, never seen\n");
  status = RunTrainrun(world, cluster, job, &out);
  INFO(out);
  CHECK(status == 2);
  CHECK(Has(out,
            absl::StrCat("host ", cluster.host_address(1), ": cannot write to the sync directory '",
                         dst, "': Read-only file system")));
  CHECK(!Has(out, "]<stdout>:"));
  INFO("left behind:" << cluster.ProcessList());
  CHECK(cluster.HostsEmptyWithin());

  // A source that is not there is one line before any host is reached.
  status = RunTrainrun(world, cluster,
                       {"-np", "2", "-H", cluster.host_address(0) + ":2", "--sync-dst-dir", dst,
                        "--sync-src-dir", world.dir() + "/nosuch", "true"},
                       &out);
  INFO(out);
  CHECK(status == 2);
  CHECK(Has(out, "--sync-src-dir '" + world.dir() + "/nosuch' does not exist"));
}

}  // namespace
}  // namespace trainrun::testing
