#include "trainrun/launcher/job_supervisor.h"

#include <algorithm>
#include <csignal>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "rank_ranges.h"
#include "trainrun/launcher/logging.h"
#include "trainrun/launcher/python_interpreter.h"

namespace trainrun::launcher {
namespace {

constexpr size_t kTailBytes = 16 * 1024;

// "SIGTERM", "code 1", "not executed"
std::string Brief(const ExitInfo& exit) {
  if (exit.exec_errno != 0) return "not executed";
  if (exit.signal != 0) return SignalName(exit.signal);
  return absl::StrCat("code ", exit.code);
}

}  // namespace

JobSupervisor::JobSupervisor(boost::asio::io_context& io, const hostfile::SlotPlan& plan,
                             RankControl& ranks, SupervisorOptions options,
                             std::function<void()> on_done,
                             std::function<void(const MembershipChange&)> on_membership_change)
    : plan_(plan),
      ranks_(ranks),
      options_(std::move(options)),
      on_done_(std::move(on_done)),
      timer_(io) {
  policy_ = MakeFailurePolicy(
      {io, plan, ranks, *this, options_.grace_period, std::move(on_membership_change)},
      options_.elastic);
}

void JobSupervisor::OnRankStarted(int rank) { ++started_; }

void JobSupervisor::OnStartFailure(int rank, std::string message) {
  End(StartFailed{std::move(message)});
}

void JobSupervisor::End(EndReason reason) {
  if (!reason_.has_value()) reason_ = std::move(reason);
  StartTeardown();
}

void JobSupervisor::OnStartsComplete() {
  starts_complete_ = true;
  MaybeDone();
}

void JobSupervisor::OnOutput(int rank, OutputStream stream, std::string_view bytes) {
  if (stream != OutputStream::kStderr) return;
  std::string& tail = stderr_tail_[rank];
  tail.append(bytes);
  if (tail.size() > 2 * kTailBytes) tail.erase(0, tail.size() - kTailBytes);
}

void JobSupervisor::OnRankExit(int rank, const ExitInfo& exit) {
  exits_[rank] = exit;
  if (exit.ok() && joined_.count(rank) == 0) exited_without_joining_.insert(rank);
  if (!exit.ok()) Logger().debug("rank {} {}", rank, exit.Describe());
  if (policy_->OnExit(rank, exit)) StartTeardown();
  MaybeDone();
  CheckExitBeforeJoin();
}

void JobSupervisor::OnRankJoined(int rank) {
  joined_.insert(rank);
  exited_without_joining_.erase(rank);  // its join overtook the news of its exit
  CheckExitBeforeJoin();
}

void JobSupervisor::CheckExitBeforeJoin() {
  if (exit_before_join_seen_ || done_ || exited_without_joining_.empty()) return;
  const bool joined_running = std::any_of(joined_.begin(), joined_.end(),
                                          [this](int rank) { return exits_.count(rank) == 0; });
  if (!joined_running) return;
  exit_before_join_seen_ = true;
  OnExitBeforeJoin(*exited_without_joining_.begin());
}

bool JobSupervisor::Live(int rank) const {
  return rank >= 0 && rank < plan_.size() && exits_.count(rank) == 0 && !policy_->Survived(rank);
}

bool JobSupervisor::StoppedOnPurpose(int rank) const {
  return teardown_started_.has_value() || policy_->StoppedOnPurpose(rank);
}

void JobSupervisor::OnRanksAdded(const std::vector<int>& ranks) {
  started_ += static_cast<int>(ranks.size());
  policy_->OnRanksAdded(ranks);
}

bool JobSupervisor::OnRanksJoined(const std::vector<int>& ranks, const std::string& why,
                                  std::chrono::steady_clock::time_point since,
                                  const std::string& host) {
  return policy_->OnRanksJoined(ranks, why, since, host);
}

void JobSupervisor::OnHostLost(const std::vector<int>& ranks, const std::string& why) {
  if (ranks.empty()) return;
  ExitInfo exit;
  exit.signal = SIGKILL;
  exit.time = std::chrono::steady_clock::now();
  for (int rank : ranks) {
    if (exits_.count(rank) == 0) exits_[rank] = exit;
  }
  Logger().debug("{}: ranks {}", why, RankRanges(ranks));
  policy_->OnHostLost(ranks, why);
  MaybeDone();
}

void JobSupervisor::OnRanksRemoved(const std::vector<int>& ranks, const std::string& why) {
  policy_->OnRanksRemoved(ranks, why);
}

std::string JobSupervisor::OnGenerationFormed(int generation) {
  return policy_->OnGenerationFormed(generation);
}

std::string JobSupervisor::ElasticSummary() const { return policy_->Summary(); }

void JobSupervisor::OnSignal(int signal) {
  if (!teardown_started_.has_value()) {
    Logger().warn("got {}; stopping all ranks", SignalName(signal));
    End(Interrupted{signal});
  } else if (!killed_) {
    Logger().warn("got {} again; killing all ranks now", SignalName(signal));
    killed_ = true;
    killed_at_ = std::chrono::steady_clock::now();
    ranks_.KillAll();
  }
}

void JobSupervisor::ReportPeerFailure(int rank, int peer, std::string message) {
  peer_failures_.emplace(rank, peer);
  if (!message.empty()) peer_messages_.emplace(rank, std::move(message));
}

void JobSupervisor::OnStall(std::vector<int> stalled, std::string description) {
  if (teardown_started_.has_value() || done_) return;
  End(Stalled{std::move(stalled), std::move(description)});
}

bool IsStallDiagnosis(std::string_view message) {
  return message.find("no progress from rank") != std::string_view::npos ||
         message.find("moved no data") != std::string_view::npos;
}

bool JobSupervisor::AnyStallDiagnosis() const {
  return std::any_of(peer_messages_.begin(), peer_messages_.end(),
                     [](const auto& m) { return IsStallDiagnosis(m.second); });
}

void JobSupervisor::OnExitBeforeJoin(int rank) {
  if (teardown_started_.has_value() || rank < 0 || rank >= plan_.size()) return;
  Logger().debug("rank {} exited 0 without joining while others wait for it", rank);
  End(ExitedBeforeJoin{rank});
}

void JobSupervisor::StartTeardown() {
  if (teardown_started_.has_value()) return;
  teardown_started_ = std::chrono::steady_clock::now();
  ranks_.TerminateAll();
  timer_.expires_after(options_.grace_period);
  timer_.async_wait([this](const boost::system::error_code& error) {
    if (error || done_) return;
    if (!killed_) {
      Logger().debug("grace period over; sending SIGKILL");
      killed_ = true;
      killed_at_ = std::chrono::steady_clock::now();
      ranks_.KillAll();
    }
    timer_.expires_after(options_.kill_timeout);
    timer_.async_wait([this](const boost::system::error_code& error2) {
      if (error2 || done_) return;
      Logger().error("{} of {} ranks did not end within {} ms of SIGKILL; giving up on them",
                     started_ - static_cast<int>(exits_.size()), started_,
                     options_.kill_timeout.count());
      done_ = true;
      on_done_();
    });
  });
}

void JobSupervisor::MaybeDone() {
  if (policy_->Holding()) return;
  if (done_ || !starts_complete_ || static_cast<int>(exits_.size()) < started_) return;
  done_ = true;
  timer_.cancel();
  policy_->OnDone();
  on_done_();
}

std::optional<int> JobSupervisor::Blamed() const {
  std::optional<int> best;
  auto better = [&](int rank, const ExitInfo& exit) {
    if (!best.has_value()) return true;
    bool peer = peer_failures_.count(rank) > 0;
    bool best_peer = peer_failures_.count(*best) > 0;
    if (peer != best_peer) return !peer;
    return exit.time < exits_.at(*best).time;
  };
  for (const auto& [rank, exit] : exits_) {
    if (exit.ok() || policy_->Survived(rank)) continue;
    // Failures that began after the teardown did are its consequence, not a cause.
    if (teardown_started_.has_value() && exit.time >= *teardown_started_) continue;
    if (better(rank, exit)) best = rank;
  }
  // The first failure seen was a report of a peer. The peer at the end of the chain may have
  // failed on its own and still be reaped after the reports came in and the teardown began (its
  // connections close as it exits, before its supervisor sees the exit): its failure is the cause.
  if (best.has_value() && peer_failures_.count(*best) > 0) {
    std::optional<int> root = RootPeer(*best);
    if (root.has_value() && peer_failures_.count(*root) == 0 && OwnFailure(*root)) return root;
  }
  return best;
}

bool JobSupervisor::OwnFailure(int rank) const {
  auto it = exits_.find(rank);
  if (it == exits_.end() || it->second.ok()) return false;
  const ExitInfo& exit = it->second;
  if (exit.signal == 0) return true;
  if (exit.signal == SIGTERM) return false;
  if (exit.signal == SIGKILL) return !killed_at_.has_value() || exit.time < *killed_at_;
  return true;
}

std::optional<int> JobSupervisor::RootPeer(int rank) const {
  // Follow "rank R failed because of peer P" from `rank` to a rank that reported nothing: timeouts
  // ripple around a ring, each rank naming the neighbour it waited on, and only the end of that
  // chain (a stalled rank, say) failed on its own.
  std::set<int> seen = {rank};
  std::optional<int> root;
  bool looped = false;
  for (int current = rank;;) {
    auto it = peer_failures_.find(current);
    if (it == peer_failures_.end()) break;
    const int peer = it->second;
    if (peer < 0 || peer >= plan_.size()) break;
    if (!seen.insert(peer).second) {
      looped = true;
      break;
    }
    root = peer;
    current = peer;
  }
  if (!looped) return root;
  // A chain that loops has no end: the timeouts raced around the ring and each rank named a
  // neighbour that was itself waiting. When they timed out (rather than lost connections), the
  // rank that stalled them is the one that neither reported nor failed while the rest did; when
  // exactly one rank is so, it is the root. Otherwise the chain ends where it closes.
  if (AnyStallDiagnosis()) {
    if (std::optional<int> silent = SilentRank(); silent.has_value()) return silent;
  }
  return root;
}

std::optional<int> JobSupervisor::SilentRank() const {
  std::optional<int> silent;
  for (int rank = 0; rank < plan_.size(); ++rank) {
    if (peer_failures_.count(rank) > 0) continue;
    auto exit = exits_.find(rank);
    const bool alive_at_teardown = exit == exits_.end() || !teardown_started_.has_value() ||
                                   exit->second.time >= *teardown_started_;
    if (!alive_at_teardown) continue;
    if (silent.has_value()) return std::nullopt;  // more than one: no answer
    silent = rank;
  }
  return silent;
}

std::optional<EndReason> JobSupervisor::Reason() const {
  if (reason_.has_value() && (std::holds_alternative<BelowMinimum>(*reason_) ||
                              std::holds_alternative<ResetLimitReached>(*reason_) ||
                              std::holds_alternative<EveryHostBlacklisted>(*reason_) ||
                              std::holds_alternative<NodesChanged>(*reason_))) {
    return reason_;
  }
  if (std::optional<int> blamed = Blamed(); blamed.has_value()) return RankFailed{*blamed};
  return reason_;
}

int JobSupervisor::exit_code() const {
  if (std::optional<EndReason> reason = Reason(); reason.has_value()) {
    if (const auto* failed = std::get_if<RankFailed>(&*reason)) {
      return exits_.at(failed->rank).ExitCode();
    }
    if (const auto* below = std::get_if<BelowMinimum>(&*reason)) {
      return exits_.at(below->rank).ExitCode();
    }
    if (const auto* blacklisted = std::get_if<EveryHostBlacklisted>(&*reason)) {
      return blacklisted->code;
    }
    if (const auto* interrupted = std::get_if<Interrupted>(&*reason)) {
      return 128 + interrupted->signal;
    }
    return 1;
  }
  for (const auto& [rank, exit] : exits_) {
    // Only reachable for failures during a teardown (and an elastic job's survived losses).
    if (!exit.ok() && !policy_->Survived(rank)) return exit.ExitCode();
  }
  return 0;
}

void JobSupervisor::AppendStderrTail(int rank, std::vector<std::string>& lines) const {
  auto tail = stderr_tail_.find(rank);
  if (tail == stderr_tail_.end() || tail->second.empty()) return;
  std::vector<std::string> tail_lines = absl::StrSplit(tail->second, '\n');
  if (!tail_lines.empty() && tail_lines.back().empty()) tail_lines.pop_back();
  size_t first = tail_lines.size() > static_cast<size_t>(options_.stderr_tail_lines)
                     ? tail_lines.size() - options_.stderr_tail_lines
                     : 0;
  lines.push_back(absl::StrCat("last lines of rank ", rank, "'s stderr:"));
  for (size_t i = first; i < tail_lines.size(); ++i)
    lines.push_back(absl::StrCat("  | ", tail_lines[i]));
  if (options_.python_hint) {
    if (std::string module = MissingPythonModule(tail->second); !module.empty()) {
      lines.push_back(options_.python_hint(module));
    }
  }
}

std::string JobSupervisor::Summary() const {
  const std::optional<EndReason> reason = Reason();
  if (!reason.has_value()) {
    bool all_ok = std::all_of(exits_.begin(), exits_.end(), [&](const auto& e) {
      return e.second.ok() || policy_->Survived(e.first);
    });
    if (all_ok) return "";
  }
  std::vector<std::string> lines;
  std::set<int> accounted;
  for (const auto& [rank, exit] : exits_) {
    if (policy_->Survived(rank)) accounted.insert(rank);
  }
  for (const auto& [rank, peer] : peer_failures_) {
    if (policy_->Survived(rank)) accounted.insert(rank);
  }
  if (reason.has_value()) Render(*reason, accounted, lines);

  // Ranks that reported, through the rendezvous, failing because of a peer.
  std::map<int, std::vector<int>> by_peer;
  for (const auto& [rank, peer] : peer_failures_) {
    if (accounted.insert(rank).second) by_peer[peer].push_back(rank);
  }
  for (const auto& [peer, ranks] : by_peer) {
    lines.push_back(
        absl::StrCat(RankRanges(ranks), " reported failing because rank ", peer, " had"));
  }
  // The rest, grouped by how they ended: failures before the teardown (after the blamed one),
  // and ranks the teardown stopped.
  std::map<std::string, std::vector<int>> failed_too, stopped;
  for (const auto& [rank, exit] : exits_) {
    if (accounted.count(rank) || exit.ok()) continue;
    bool before = !teardown_started_.has_value() || exit.time < *teardown_started_;
    if (before) {
      failed_too[exit.Describe()].push_back(rank);
    } else {
      stopped[Brief(exit)].push_back(rank);
    }
  }
  for (const auto& [how, ranks] : failed_too) {
    lines.push_back(absl::StrCat(RankRanges(ranks), " also ", how, ", after the first failure"));
  }
  for (const auto& [how, ranks] : stopped) {
    lines.push_back(
        absl::StrCat("stopped as a consequence: ", RankRanges(ranks), " (ended: ", how, ")"));
  }
  std::vector<int> unreaped;
  for (int rank = 0; rank < plan_.size(); ++rank) {
    if (!exits_.count(rank) && rank < started_) unreaped.push_back(rank);
  }
  if (!unreaped.empty())
    lines.push_back(absl::StrCat(RankRanges(unreaped), " could not be reaped"));
  if (std::string policy = policy_->Summary(); !policy.empty()) lines.push_back(policy);
  return absl::StrJoin(lines, "\n");
}

void JobSupervisor::Render(const EndReason& reason, std::set<int>& accounted,
                           std::vector<std::string>& lines) const {
  if (const auto* failed = std::get_if<RankFailed>(&reason)) {
    RenderRankFailed(failed->rank, accounted, lines);
  } else if (const auto* below = std::get_if<BelowMinimum>(&reason);
             below != nullptr && below->min_nodes > 0) {
    lines.push_back(absl::StrCat(below->why, "; ", below->remaining,
                                 below->remaining == 1 ? " node was" : " nodes were",
                                 " left, fewer than the ", below->min_nodes,
                                 " that --nnodes asks for at least, so the job was stopped"));
    AppendStderrTail(below->rank, lines);
  } else if (below != nullptr && below->remaining == 0) {
    // Every rank had failed: nothing to wait for (Horovod stops there too).
    lines.push_back(absl::StrCat(below->why, "; no rank was left (every rank had failed), so the ",
                                 "job was stopped"));
    AppendStderrTail(below->rank, lines);
  } else if (below != nullptr) {
    lines.push_back(absl::StrCat(
        below->why, "; ", below->remaining, below->remaining == 1 ? " rank was" : " ranks were",
        " left, fewer than --min-np ", below->min_np, ", and no rank came within ",
        below->timeout.count(), " s (--elastic-timeout), so the job was stopped"));
    AppendStderrTail(below->rank, lines);
  } else if (const auto* reset = std::get_if<ResetLimitReached>(&reason)) {
    lines.push_back(reset->message);
  } else if (const auto* blacklisted = std::get_if<EveryHostBlacklisted>(&reason)) {
    lines.push_back(blacklisted->message);
  } else if (const auto* changed = std::get_if<NodesChanged>(&reason)) {
    lines.push_back(changed->message);
  } else if (const auto* early = std::get_if<ExitedBeforeJoin>(&reason)) {
    const int rank = early->rank;
    accounted.insert(rank);
    lines.push_back(absl::StrCat(
        "rank ", rank, " on ", plan_.HostOf(rank).host,
        " exited with code 0 without joining the job, while the other ranks waited for it; the "
        "job was stopped (does rank ",
        rank, " skip the collectives' setup, or end before it?)"));
    AppendStderrTail(rank, lines);
  } else if (const auto* stall = std::get_if<Stalled>(&reason)) {
    std::vector<std::string> names;
    for (int rank : stall->ranks) {
      accounted.insert(rank);
      names.push_back(absl::StrCat(rank, " on ", plan_.HostOf(rank).host));
    }
    lines.push_back(absl::StrCat(stall->ranks.size() == 1 ? "rank " : "ranks ",
                                 absl::StrJoin(names, ", "), " stalled: ", stall->description,
                                 "; the job was stopped (--stall-check-shutdown-time-seconds)"));
    for (const auto& [rank, message] : peer_messages_) {
      if (IsStallDiagnosis(message)) lines.push_back(absl::StrCat("  rank ", rank, ": ", message));
    }
  } else if (const auto* interrupted = std::get_if<Interrupted>(&reason)) {
    lines.push_back(
        absl::StrCat("interrupted by ", SignalName(interrupted->signal), "; the job was stopped"));
  } else if (const auto* start = std::get_if<StartFailed>(&reason)) {
    lines.push_back(start->message);
  }
}

void JobSupervisor::RenderRankFailed(int blamed, std::set<int>& accounted,
                                     std::vector<std::string>& lines) const {
  // A blamed rank that reported failing because of a peer was blamed only because that peer did
  // not fail on its own before the teardown (it exited 0, hung, or was still running): the peer
  // is still the root cause, and the summary says so.
  if (std::optional<int> root_peer = RootPeer(blamed); root_peer.has_value()) {
    const int peer = *root_peer;
    auto exit = exits_.find(peer);
    accounted.insert(peer);
    const std::string then =
        absl::StrCat("; rank ", peer, " then ",
                     exit != exits_.end() ? exit->second.Describe() : "could not be reaped");
    // The rank that waited on the root peer itself (the end of the chain of reports), if its
    // diagnosis says the peer was alive but made no progress.
    auto diagnosis = std::find_if(peer_messages_.begin(), peer_messages_.end(), [&](const auto& m) {
      return peer_failures_.at(m.first) == peer && IsStallDiagnosis(m.second);
    });
    if (diagnosis != peer_messages_.end()) {
      // The peer was alive and waited on: stalled, in the words of the rank that waited for it.
      lines.push_back(absl::StrCat(
          "rank ", peer, " on ", plan_.HostOf(peer).host, " stalled: rank ", diagnosis->first,
          " waited for it and reported \"", diagnosis->second, "\"; so the job was stopped", then));
    } else if (peer_failures_.count(peer) == 0 && AnyStallDiagnosis() &&
               (exit == exits_.end() || !teardown_started_.has_value() ||
                exit->second.time >= *teardown_started_)) {
      // The peer's neighbours timed out on each other, and it alone said nothing and ran on.
      lines.push_back(absl::StrCat("rank ", peer, " on ", plan_.HostOf(peer).host,
                                   " stalled: its peers timed out waiting in a collective, and it "
                                   "alone neither reported nor failed; so the job was stopped",
                                   then));
    } else {
      lines.push_back(absl::StrCat(
          "rank ", peer, " on ", plan_.HostOf(peer).host,
          " failed first: its peers lost their connections to it, so the job was stopped", then));
    }
    AppendStderrTail(peer, lines);
    return;
  }
  const ExitInfo& exit = exits_.at(blamed);
  const std::string& host = plan_.HostOf(blamed).host;
  accounted.insert(blamed);
  if (exit.exec_errno != 0) {
    lines.push_back(absl::StrCat("cannot execute '", options_.command,
                                 "': ", std::strerror(exit.exec_errno), " (rank ", blamed, " on ",
                                 host, "); check the command and PATH"));
  } else {
    lines.push_back(absl::StrCat("rank ", blamed, " on ", host, " ", exit.Describe(),
                                 "; it failed first, so the job was stopped"));
    AppendStderrTail(blamed, lines);
  }
}

}  // namespace trainrun::launcher
