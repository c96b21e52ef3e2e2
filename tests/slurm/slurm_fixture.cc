#include "slurm_fixture.h"

#include <chrono>
#include <sstream>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace trainrun::testing {

std::string SlurmCluster::CannotRun() {
  std::string why;
  if (RunCommand({TRAINRUN_SLURM_CLUSTER_SH, "check"}, &why) == 0) return "";
  return absl::StrCat("skipped: ", absl::StripTrailingAsciiWhitespace(why));
}

SlurmCluster::SlurmCluster(int nodes) {
  std::string out;
  int status = RunCommand(
      {TRAINRUN_SLURM_CLUSTER_SH, "start", dir() + "/cluster", std::to_string(nodes)}, &out, 60);
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (absl::ConsumePrefix(&line, "export SLURM_CONF=")) conf_ = std::string(line);
    if (absl::ConsumePrefix(&line, "export TRAINRUN_SLURM_NODES=")) {
      nodes_ = absl::StrSplit(line, ',', absl::SkipEmpty());
    }
  }
  if (status != 0 || conf_.empty() || static_cast<int>(nodes_.size()) != nodes) {
    RunCommand({TRAINRUN_SLURM_CLUSTER_SH, "stop", dir() + "/cluster"});
    throw std::runtime_error("the Slurm test cluster did not come up: " + out);
  }
}

SlurmCluster::~SlurmCluster() {
  RunCommand({TRAINRUN_SLURM_CLUSTER_SH, "stop", dir() + "/cluster"});
}

std::vector<std::string> SlurmCluster::Command(const std::vector<std::string>& argv) const {
  std::vector<std::string> command = {"env", "SLURM_CONF=" + conf_};
  command.insert(command.end(), argv.begin(), argv.end());
  return command;
}

std::vector<pid_t> SlurmCluster::NodeProcesses(int i) const {
  std::string output;
  RunCommand({"ip", "netns", "pids", nodes_[i]}, &output);
  std::string slurmd = ReadFileText(absl::StrCat(dir(), "/cluster/slurmd.", nodes_[i], ".pid"));
  std::vector<pid_t> pids;
  std::istringstream in(output);
  pid_t pid;
  while (in >> pid) {
    if (std::to_string(pid) != absl::StripAsciiWhitespace(slurmd)) pids.push_back(pid);
  }
  return pids;
}

bool SlurmCluster::NodesEmptyWithin(int seconds) const {
  return WaitUntil(
      [&] {
        for (size_t i = 0; i < nodes_.size(); ++i) {
          if (!NodeProcesses(static_cast<int>(i)).empty()) return false;
        }
        return true;
      },
      std::chrono::seconds(seconds));
}

}  // namespace trainrun::testing
