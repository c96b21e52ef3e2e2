#include "monitor/monitor.h"

#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "trainrun/launcher/logging.h"
#include "trainrun/launcher/monitor.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::launcher::monitor {
namespace {

JobViewOptions ViewOptions(const LaunchSpec& spec, const JobPlan& plan) {
  JobViewOptions options;
  options.job_id = plan.environment.job_id();
  options.command = absl::StrJoin(spec.command, " ");
  for (const hostfile::RankAssignment& a : spec.plan.ranks) {
    options.rank_hosts.push_back(spec.plan.hosts[a.host_index].host);
  }
  options.window = spec.straggler_window;
  options.threshold = spec.straggler_threshold;
  int restarts = 0;
  if (std::optional<std::string> count = plan.environment.Lookup(env::kRestartCount)) {
    (void)absl::SimpleAtoi(*count, &restarts);
  }
  options.restarts = restarts;
  return options;
}

}  // namespace

Monitor::Monitor(const LaunchSpec& spec, const JobPlan& plan, boost::asio::io_context& io)
    : spec_(spec), view_(ViewOptions(spec, plan)), timer_(io) {
  if (spec.monitor.empty()) return;
  absl::StatusOr<MonitorAddress> address = ParseMonitorAddress(spec.monitor);
  if (!address.ok()) {  // checked by the CLI already
    Logger().warn("{}; the job runs without the page", std::string(address.status().message()));
    return;
  }
  std::string token = env::kMonitorToken.Get();
  if (token.empty()) {
    absl::StatusOr<std::string> drawn = rendezvous::RandomToken();
    if (drawn.ok()) token = *drawn;
  }
  const std::string trace =
      plan.environment.Lookup(env::kTimeline.name).value_or(env::kTimeline.default_value);
  absl::StatusOr<std::unique_ptr<MonitorServer>> page =
      MonitorServer::Start(*address, token, trace, view_);
  if (!page.ok()) {
    Logger().warn("{}; the job runs without the page", std::string(page.status().message()));
    return;
  }
  page_ = *std::move(page);
  Logger().info("monitor: {}", page_->url());
}

Monitor::~Monitor() = default;

void Monitor::Serve(const rendezvous::Server& server, std::function<int()> membership_changes) {
  server_ = &server;
  membership_changes_ = std::move(membership_changes);
  Tick();
}

void Monitor::Tick() {
  timer_.expires_after(std::chrono::seconds(1));
  timer_.async_wait([this](const boost::system::error_code& error) {
    if (error || finished_) return;
    ReadReports();
    Tick();
  });
}

void Monitor::ReadReports() {
  if (server_ == nullptr) return;
  if (membership_changes_) view_.OnMembershipChanges(membership_changes_());
  std::map<int, std::string> reports;
  const std::string prefix = env::kMonitorKeyPrefix;
  for (const auto& [key, value] : server_->ValuesWithPrefix(prefix)) {
    int rank = -1;
    if (absl::SimpleAtoi(key.substr(prefix.size()), &rank)) reports[rank] = value;
  }
  // At the end the ranks' last reports complete the table; ranks gone are no news.
  if (std::string line = view_.OnReports(reports, Clock::now()); !line.empty() && !finished_) {
    Logger().warn("{}", line);
  }
}

std::string Monitor::OnStalls(const std::map<int, std::string>& waiting,
                              const StallInspector& inspector, const std::string& warning) {
  std::map<int, std::string> current;
  for (const auto& [rank, op] : waiting) {
    if (!op.empty()) current[rank] = op;
  }
  if (current.empty()) {
    stall_.clear();
  } else if (!warning.empty()) {
    stall_ = warning;
  }
  view_.OnStalls(current, current.empty() ? std::vector<int>{} : inspector.Stalled(), stall_);
  if (warning.empty() || !view_.has_reports()) return "";
  return "; the straggler table at the job's end says who kept the others waiting before";
}

void Monitor::Finish(const std::string& summary) {
  if (finished_) return;
  finished_ = true;
  ReadReports();  // the ranks' last reports, sent as their communicators ended
  timer_.cancel();
  view_.OnEnd(summary);
  if ((view_.straggler_named() || page_ != nullptr || !stall_.empty()) && view_.has_reports()) {
    Logger().info("{}", view_.Table());
  }
  // A page that is watching gets its next look at the ended job before trainrun exits.
  if (page_ != nullptr && page_->watched(3)) std::this_thread::sleep_for(std::chrono::seconds(1));
}

absl::Status CheckAddress(const std::string& text) { return ParseMonitorAddress(text).status(); }

}  // namespace trainrun::launcher::monitor

namespace trainrun::launcher {
absl::Status CheckMonitorAddress(const std::string& text) { return monitor::CheckAddress(text); }
}  // namespace trainrun::launcher
