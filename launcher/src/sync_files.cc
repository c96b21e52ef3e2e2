#include "sync_files.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "remote/file_sync.h"
#include "trainrun/launcher/local_host.h"
#include "trainrun/launcher/logging.h"

namespace trainrun::launcher {
namespace {

std::string Mib(uint64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / 1048576.0); }

// SyncProgressLine shows "trainrun: sync to 4 hosts: 120.0 of 800.0 MiB (3s)" once a copy took a
// second, every second on a terminal (erased at the end) and every ten seconds otherwise.
class SyncProgressLine {
 public:
  SyncProgressLine(std::string where, const remote::SyncProgress& progress)
      : where_(std::move(where)),
        progress_(progress),
        terminal_(::isatty(2) != 0),
        start_(absl::Now()),
        ticker_([this] { Tick(); }) {}
  ~SyncProgressLine() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = true;
    }
    finished_cv_.notify_all();
    ticker_.join();
    if (shown_ && terminal_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  void Tick() {
    std::unique_lock<std::mutex> lock(mu_);
    const auto period = terminal_ ? std::chrono::seconds(1) : std::chrono::seconds(10);
    while (!finished_cv_.wait_for(lock, period, [&] { return finished_; })) {
      const std::string line =
          absl::StrCat("sync to ", where_, ": ", Mib(progress_.sent), " of ", Mib(progress_.total),
                       " (", absl::ToInt64Seconds(absl::Now() - start_), "s)");
      if (terminal_) {
        std::fprintf(stderr, "\rtrainrun: %s", line.c_str());
        std::fflush(stderr);
      } else {
        Logger().info("{}", line);
      }
      shown_ = true;
    }
  }

  const std::string where_;
  const remote::SyncProgress& progress_;
  const bool terminal_;
  const absl::Time start_;
  std::mutex mu_;
  std::condition_variable finished_cv_;
  bool finished_ = false;
  bool shown_ = false;
  std::thread ticker_;
};

void Summarize(const LaunchSpec& spec, const std::string& where, const remote::SyncStats& stats,
               absl::Duration took) {
  if (spec.quiet) return;
  Logger().info("synced {} to {} {} in {}: {} files copied ({}), {} unchanged", spec.sync->src_dir,
                spec.sync->dst_dir, where, absl::StrFormat("%.2f s", absl::ToDoubleSeconds(took)),
                stats.files, Mib(stats.bytes), stats.unchanged);
}

}  // namespace

bool RanksHere(const LaunchSpec& spec) {
  if (spec.per_node) return true;
  return std::any_of(spec.plan.hosts.begin(), spec.plan.hosts.end(),
                     [](const hostfile::HostSpec& host) { return IsLocalHost(host.host); });
}

absl::Status SyncHere(const LaunchSpec& spec) {
  const absl::Time start = absl::Now();
  absl::StatusOr<remote::SyncOffer> offer =
      remote::ScanSource(spec.sync->src_dir, spec.sync->dst_dir, spec.sync->excludes);
  if (!offer.ok()) return offer.status();
  remote::SyncProgress progress;
  absl::StatusOr<remote::SyncStats> stats;
  {
    SyncProgressLine line("this host", progress);
    stats = remote::SyncLocally(*offer, spec.sync->src_dir, progress);
  }
  if (!stats.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("this host: ", stats.status().message()));
  }
  Summarize(spec, "here", *stats, absl::Now() - start);
  return absl::OkStatus();
}

absl::Status SyncRemote(const LaunchSpec& spec, std::vector<remote::RemoteAgent>& agents) {
  if (agents.empty()) return absl::OkStatus();
  const absl::Time start = absl::Now();
  absl::StatusOr<remote::SyncOffer> offer =
      remote::ScanSource(spec.sync->src_dir, spec.sync->dst_dir, spec.sync->excludes);
  if (!offer.ok()) return offer.status();
  remote::SyncProgress progress;
  const std::string hosts =
      agents.size() == 1 ? agents[0].name() : absl::StrCat(agents.size(), " hosts");
  absl::StatusOr<remote::SyncStats> stats;
  {
    SyncProgressLine line(hosts, progress);
    stats = remote::SyncToAgents(*offer, spec.sync->src_dir, agents, progress);
  }
  if (!stats.ok()) return absl::InvalidArgumentError(stats.status().message());
  Summarize(spec, absl::StrCat("on ", hosts), *stats, absl::Now() - start);
  return absl::OkStatus();
}

}  // namespace trainrun::launcher
