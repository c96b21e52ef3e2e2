#include "reach_hosts.h"

#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "remote/host_access.h"
#include "trainrun/launcher/logging.h"

namespace trainrun::launcher {
namespace {

// ProgressLine shows "hosts 3/8 connected (4s)" on a terminal, once connecting has taken a second,
// and erases it when destroyed.
class ProgressLine {
 public:
  explicit ProgressLine(int total) : total_(total), start_(absl::Now()) {
    if (::isatty(2)) ticker_ = std::thread([this] { Tick(); });
  }
  ~ProgressLine() {
    if (!ticker_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = true;
    }
    finished_cv_.notify_all();
    ticker_.join();
    if (shown_) std::fprintf(stderr, "\r\033[K");
  }

  void Connected(int connected) {
    std::lock_guard<std::mutex> lock(mu_);
    connected_ = connected;
  }

 private:
  void Tick() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!finished_cv_.wait_for(lock, std::chrono::seconds(1), [&] { return finished_; })) {
      std::fprintf(stderr, "\rtrainrun: hosts %d/%d connected (%llds)", connected_, total_,
                   static_cast<long long>(absl::ToInt64Seconds(absl::Now() - start_)));
      std::fflush(stderr);
      shown_ = true;
    }
  }

  const int total_;
  const absl::Time start_;
  std::mutex mu_;
  std::condition_variable finished_cv_;
  bool finished_ = false;
  int connected_ = 0;
  bool shown_ = false;
  std::thread ticker_;
};

}  // namespace

absl::StatusOr<std::vector<remote::RemoteAgent>> ReachHosts(const LaunchSpec& spec,
                                                            const JobPlan& plan,
                                                            const StartDeadline& deadline,
                                                            channel::HostChannel* channel) {
  if (plan.remote_hosts.empty()) return std::vector<remote::RemoteAgent>{};
  std::vector<hostfile::HostSpec> hosts;
  for (int index : plan.remote_hosts) hosts.push_back(spec.plan.hosts[index]);
  const std::string command = remote::AgentCommand(remote::RemoteTrainrunPath(spec));
  const absl::Time start = absl::Now();
  Logger().debug("connecting to {} hosts: {}", hosts.size(), command);
  absl::StatusOr<std::vector<remote::RemoteAgent>> agents;
  {
    ProgressLine progress(static_cast<int>(hosts.size()));
    agents = remote::ConnectAgents(*channel, hosts, command, deadline.at,
                                   [&](int connected, int) { progress.Connected(connected); });
  }
  if (!agents.ok() && agents.status().code() != absl::StatusCode::kCancelled) {
    // A host that cannot be reached is a bad host, as the documentation's exit codes say: exit 2
    // (not 127, the shell's "command not found", nor 124), nothing left running.
    return absl::InvalidArgumentError(agents.status().message());
  }
  if (agents.ok()) {
    Logger().debug("{} hosts connected in {}", hosts.size(),
                   absl::FormatDuration(absl::Now() - start));
  }
  return agents;
}

}  // namespace trainrun::launcher
