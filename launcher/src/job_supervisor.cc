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
      timer_(io),
      on_membership_change_(std::move(on_membership_change)),
      elastic_timer_(io),
      io_(io) {
  start_size_ = plan.size();
}

void JobSupervisor::OnRankStarted(int rank) { ++started_; }

void JobSupervisor::OnStartFailure(int rank, std::string message) {
  if (!start_failure_.has_value()) start_failure_ = std::move(message);
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
  if (pending_.erase(rank) > 0) {
    // A rank the job was growing by, before it became a member: no member is lost.
    lost_.insert(rank);
  } else if (exit.ok()) {
    if (options_.elastic.has_value() && lost_.count(rank) == 0) {
      finishing_ = true;
      GiveUpPending();
    }
  } else {
    Logger().debug("rank {} {}", rank, exit.Describe());
    if (lost_.count(rank) > 0) {
      // A rank stopped because its host left the discovery output: already one change.
    } else if (options_.elastic.has_value() && !teardown_started_.has_value()) {
      OnElasticLoss(rank, exit);
    } else {
      StartTeardown();
    }
  }
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

std::vector<int> JobSupervisor::Survivors() const {
  std::vector<int> survivors;
  for (int rank = 0; rank < plan_.size(); ++rank) {
    if (exits_.count(rank) == 0 && lost_.count(rank) == 0 && pending_.count(rank) == 0) {
      survivors.push_back(rank);
    }
  }
  return survivors;
}

void JobSupervisor::GiveUpPending() {
  if (pending_.empty()) return;
  std::vector<int> ranks(pending_.begin(), pending_.end());
  Logger().debug("the job is finishing: stopping {}, which had not joined it yet",
                 RankRanges(ranks));
  for (int rank : ranks) {
    lost_.insert(rank);
    stopped_.insert(rank);
  }
  pending_.clear();
  ranks_.TerminateRanks(ranks);
  auto timer = std::make_unique<boost::asio::steady_timer>(io_, options_.grace_period);
  timer->async_wait([this, ranks](const boost::system::error_code& error) {
    if (!error && !done_) ranks_.KillRanks(ranks);
  });
  removal_timers_.push_back(std::move(timer));
}

bool JobSupervisor::Live(int rank) const {
  return rank >= 0 && rank < plan_.size() && exits_.count(rank) == 0 && lost_.count(rank) == 0;
}

bool JobSupervisor::StoppedOnPurpose(int rank) const {
  return teardown_started_.has_value() || stopped_.count(rank) > 0;
}

void JobSupervisor::OnRanksAdded(const std::vector<int>& ranks) {
  for (int rank : ranks) {
    pending_.insert(rank);
    ++started_;
  }
}

bool JobSupervisor::OnRanksJoined(const std::vector<int>& ranks, const std::string& why,
                                  std::chrono::steady_clock::time_point since,
                                  const std::string& host) {
  std::vector<int> joined;
  for (int rank : ranks) {
    if (pending_.erase(rank) > 0) joined.push_back(rank);
  }
  if (joined.empty() || teardown_started_.has_value() || done_ || finishing_) return false;
  const std::vector<int> members = Survivors();
  if (PastResetLimit(why)) return false;
  if (below_minimum_.has_value()) {
    // The job waited for ranks: these may be enough.
    if (static_cast<int>(members.size()) < options_.elastic->min_np) {
      Logger().warn("{}; {} ranks now, still fewer than --min-np {}", why, members.size(),
                    options_.elastic->min_np);
      return false;
    }
    below_minimum_.reset();
    elastic_timer_.cancel();
  }
  MembershipChange change;
  change.joined_ranks = joined;
  change.joined_host = host;
  Record(std::move(change), why, members, since);
  return true;
}

void JobSupervisor::OnElasticLoss(int rank, const ExitInfo& exit) {
  // A failure while the job already waits for ranks is that wait's consequence, not news.
  if (below_minimum_.has_value()) return;
  Loss({rank}, absl::StrCat("rank ", rank, " on ", plan_.HostOf(rank).host, " ", exit.Describe()),
       exit.time);
}

void JobSupervisor::OnHostLost(const std::vector<int>& ranks, const std::string& why) {
  if (ranks.empty()) return;
  const auto now = std::chrono::steady_clock::now();
  ExitInfo exit;
  exit.signal = SIGKILL;
  exit.time = now;
  for (int rank : ranks) {
    if (exits_.count(rank) == 0) exits_[rank] = exit;
  }
  Logger().debug("{}: ranks {}", why, RankRanges(ranks));
  // Ranks the job was growing by (not members yet) are given up without a change.
  std::vector<int> members;
  for (int rank : ranks) {
    if (pending_.erase(rank) > 0) {
      lost_.insert(rank);
    } else {
      members.push_back(rank);
    }
  }
  if (members.empty()) {
    MaybeDone();
    return;
  }
  if (options_.elastic.has_value() && !teardown_started_.has_value() &&
      !below_minimum_.has_value()) {
    Loss(members, absl::StrCat(why, ": ", RankRanges(members), " lost"), now,
         plan_.HostOf(members.front()).host);
  } else if (!options_.elastic.has_value()) {
    OnStartFailure(members.front(), why);
  }
  MaybeDone();
}

void JobSupervisor::OnRanksRemoved(const std::vector<int>& ranks, const std::string& why) {
  if (!options_.elastic.has_value() || teardown_started_.has_value() || done_) return;
  std::vector<int> running;
  std::vector<int> members;
  for (int rank : ranks) {
    if (exits_.count(rank) > 0 || lost_.count(rank) > 0) continue;
    running.push_back(rank);
    stopped_.insert(rank);
    // A pending rank (the job was growing onto this host) is given up without a change.
    if (pending_.erase(rank) > 0) {
      lost_.insert(rank);
    } else {
      members.push_back(rank);
    }
  }
  if (running.empty()) return;
  ranks_.TerminateRanks(running);
  auto timer = std::make_unique<boost::asio::steady_timer>(io_, options_.grace_period);
  timer->async_wait([this, running](const boost::system::error_code& error) {
    if (!error && !done_) ranks_.KillRanks(running);
  });
  removal_timers_.push_back(std::move(timer));
  if (members.empty()) return;
  if (below_minimum_.has_value()) {
    for (int rank : members) lost_.insert(rank);
    return;
  }
  Loss(members, absl::StrCat(why, ": ", RankRanges(members), " stopped"),
       std::chrono::steady_clock::now(), plan_.HostOf(members.front()).host);
}

bool JobSupervisor::PastResetLimit(const std::string& why) {
  if (options_.elastic->reset_limit <= 0 ||
      static_cast<int>(changes_.size()) < options_.elastic->reset_limit) {
    return false;
  }
  reset_limit_hit_ =
      absl::StrCat(why, "; the job's membership had already changed ", changes_.size(),
                   changes_.size() == 1 ? " time" : " times", ", as many as --reset-limit ",
                   options_.elastic->reset_limit, " allows, so the job was stopped");
  StartTeardown();
  return true;
}

void JobSupervisor::Loss(const std::vector<int>& ranks, const std::string& why,
                         std::chrono::steady_clock::time_point when, const std::string& host) {
  for (int r : ranks) lost_.insert(r);
  const std::vector<int> survivors = Survivors();
  const int rank = ranks.front();
  if (PastResetLimit(why)) return;
  if (static_cast<int>(survivors.size()) < options_.elastic->min_np) {
    below_minimum_ = BelowMinimum{rank, why, static_cast<int>(survivors.size())};
    Logger().warn(
        "{}; {} {} left, fewer than --min-np {}: waiting up to {} s (--elastic-timeout) "
        "for ranks",
        why, survivors.size(), survivors.size() == 1 ? "rank is" : "ranks are",
        options_.elastic->min_np, options_.elastic->timeout.count());
    WaitForRanks();
    return;
  }
  MembershipChange change;
  change.lost_ranks = ranks;
  change.lost_host = host;
  Record(std::move(change), why, survivors, when);
}

void JobSupervisor::Record(MembershipChange change, const std::string& why,
                           const std::vector<int>& members,
                           std::chrono::steady_clock::time_point when) {
  change.generation = static_cast<int>(changes_.size()) + 1;
  change.why = why;
  change.members = members;
  change.when = when;
  changes_.push_back(change);
  if (on_membership_change_) on_membership_change_(change);
}

void JobSupervisor::WaitForRanks() {
  // Without host discovery no rank can come: the wait is Horovod's, so that a job started with a
  // discovery script later behaves the same, and the user sees why it ended.
  elastic_timer_.expires_after(options_.elastic->timeout);
  elastic_timer_.async_wait([this](const boost::system::error_code& error) {
    if (error || done_) return;
    below_minimum_->waiting = false;
    StartTeardown();
    MaybeDone();
  });
}

std::string JobSupervisor::OnGenerationFormed(int generation) {
  if (generation < 1 || generation > static_cast<int>(changes_.size())) return "";
  MembershipChange& change = changes_[generation - 1];
  change.recovery_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - change.when).count();
  std::vector<int> from_start, grown;
  for (int slot : change.members) (slot < start_size_ ? from_start : grown).push_back(slot);
  std::string formed = absl::StrCat(RankRanges(from_start), " of the start");
  if (from_start.empty()) formed = RankRanges(grown);
  if (!from_start.empty() && !grown.empty()) {
    // "ranks 0-1 of the start and 4-5": the ranks the job grew by keep their numbers (slots).
    absl::StrAppend(&formed, " and ", RankRanges(grown).substr(grown.size() == 1 ? 5 : 6));
  }
  return absl::StrFormat(
      "%s; the job goes on at %d %s (generation %d, formed by %s), recovered in %.2f s", change.why,
      change.members.size(), change.members.size() == 1 ? "rank" : "ranks", generation, formed,
      change.recovery_seconds);
}

std::string JobSupervisor::ElasticSummary() const {
  if (changes_.empty()) return "";
  std::vector<std::string> parts;
  std::vector<std::string> hosts;
  std::vector<std::string> joined_hosts;
  int joined = 0;
  for (const MembershipChange& change : changes_) {
    if (!change.lost_host.empty()) hosts.push_back(change.lost_host);
    if (!change.joined_ranks.empty()) {
      joined += static_cast<int>(change.joined_ranks.size());
      joined_hosts.push_back(change.joined_host);
    }
    parts.push_back(
        change.recovery_seconds >= 0
            ? absl::StrFormat("%s (recovered in %.2f s)", change.why, change.recovery_seconds)
            : absl::StrCat(change.why, " (not recovered)"));
  }
  const size_t now = changes_.back().members.size();
  return absl::StrCat(
      "the job survived ", changes_.size(),
      changes_.size() == 1 ? " membership change" : " membership changes", ", ",
      joined == 0 ? absl::StrCat(now, " of ", start_size_, " ranks remain")
                  : absl::StrCat(now, now == 1 ? " rank" : " ranks", " at the end (", start_size_,
                                 " at the start), ", joined, joined == 1 ? " rank" : " ranks",
                                 " joined (on ", absl::StrJoin(joined_hosts, ", "), ")"),
      hosts.empty()
          ? ""
          : absl::StrCat(", ", hosts.size(), hosts.size() == 1 ? " host lost (" : " hosts lost (",
                         absl::StrJoin(hosts, ", "), ")"),
      ": ", absl::StrJoin(parts, "; "));
}

void JobSupervisor::OnSignal(int signal) {
  if (!teardown_started_.has_value()) {
    signal_ = signal;
    Logger().warn("got {}; stopping all ranks", SignalName(signal));
    StartTeardown();
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
  stall_ = Stall{std::move(stalled), std::move(description)};
  StartTeardown();
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
  exited_before_join_ = rank;
  Logger().debug("rank {} exited 0 without joining while others wait for it", rank);
  StartTeardown();
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
  if (below_minimum_.has_value() && below_minimum_->waiting) return;
  if (done_ || !starts_complete_ || static_cast<int>(exits_.size()) < started_) return;
  done_ = true;
  timer_.cancel();
  elastic_timer_.cancel();
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
    if (exit.ok() || lost_.count(rank) > 0) continue;
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

int JobSupervisor::exit_code() const {
  if (below_minimum_.has_value() && !signal_.has_value()) {
    return exits_.at(below_minimum_->rank).ExitCode();
  }
  if (reset_limit_hit_.has_value() && !signal_.has_value()) return 1;
  if (std::optional<int> blamed = Blamed(); blamed.has_value())
    return exits_.at(*blamed).ExitCode();
  if (exited_before_join_.has_value()) return 1;
  if (signal_.has_value()) return 128 + *signal_;
  if (start_failure_.has_value() || stall_.has_value()) return 1;
  for (const auto& [rank, exit] : exits_) {
    // Only reachable for failures during a teardown (and an elastic job's survived losses).
    if (!exit.ok() && lost_.count(rank) == 0) return exit.ExitCode();
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
}

std::string JobSupervisor::Summary() const {
  std::optional<int> blamed = Blamed();
  if (!blamed.has_value() && !signal_.has_value() && !start_failure_.has_value() &&
      !exited_before_join_.has_value() && !stall_.has_value() && !below_minimum_.has_value() &&
      !reset_limit_hit_.has_value()) {
    bool all_ok = std::all_of(exits_.begin(), exits_.end(), [&](const auto& e) {
      return e.second.ok() || lost_.count(e.first) > 0;
    });
    if (all_ok) return "";
  }
  std::vector<std::string> lines;
  std::set<int> accounted = lost_;
  if (reset_limit_hit_.has_value() && !signal_.has_value()) {
    lines.push_back(*reset_limit_hit_);
    blamed.reset();
  }
  if (below_minimum_.has_value() && !signal_.has_value()) {
    const int rank = below_minimum_->rank;
    lines.push_back(absl::StrCat(below_minimum_->why, "; ", below_minimum_->remaining,
                                 below_minimum_->remaining == 1 ? " rank was" : " ranks were",
                                 " left, fewer than --min-np ", options_.elastic->min_np,
                                 ", and no rank came within ", options_.elastic->timeout.count(),
                                 " s (--elastic-timeout), so the job was stopped"));
    AppendStderrTail(rank, lines);
    blamed.reset();
  }
  // A blamed rank that reported failing because of a peer was blamed only because that peer did
  // not fail on its own before the teardown (it exited 0, hung, or was still running): the peer
  // is still the root cause, and the summary says so.
  std::optional<int> root_peer;
  if (blamed.has_value()) root_peer = RootPeer(*blamed);
  if (root_peer.has_value()) {
    const int peer = *root_peer;
    auto exit = exits_.find(peer);
    accounted.insert(peer);
    // The rank that waited on the root peer itself (the end of the chain of reports), if its
    // diagnosis says the peer was alive but made no progress.
    auto diagnosis = std::find_if(peer_messages_.begin(), peer_messages_.end(), [&](const auto& m) {
      return peer_failures_.at(m.first) == peer && IsStallDiagnosis(m.second);
    });
    if (diagnosis != peer_messages_.end()) {
      // The peer was alive and waited on: stalled, in the words of the rank that waited for it.
      lines.push_back(absl::StrCat(
          "rank ", peer, " on ", plan_.HostOf(peer).host, " stalled: rank ", diagnosis->first,
          " waited for it and reported \"", diagnosis->second, "\"; so the job was stopped; rank ",
          peer, " then ", exit != exits_.end() ? exit->second.Describe() : "could not be reaped"));
    } else if (peer_failures_.count(peer) == 0 && AnyStallDiagnosis() &&
               (exit == exits_.end() || !teardown_started_.has_value() ||
                exit->second.time >= *teardown_started_)) {
      // The peer's neighbours timed out on each other, and it alone said nothing and ran on.
      lines.push_back(absl::StrCat(
          "rank ", peer, " on ", plan_.HostOf(peer).host,
          " stalled: its peers timed out waiting in a collective, and it "
          "alone neither reported nor failed; so the job was stopped; rank ",
          peer, " then ", exit != exits_.end() ? exit->second.Describe() : "could not be reaped"));
    } else {
      lines.push_back(absl::StrCat(
          "rank ", peer, " on ", plan_.HostOf(peer).host,
          " failed first: its peers lost their connections to it, so the job was stopped; rank ",
          peer, " then ", exit != exits_.end() ? exit->second.Describe() : "could not be reaped"));
    }
    AppendStderrTail(peer, lines);
  } else if (!lines.empty()) {
    // Already said: the elastic job fell below --min-np.
  } else if (blamed.has_value()) {
    const ExitInfo& exit = exits_.at(*blamed);
    const std::string& host = plan_.HostOf(*blamed).host;
    accounted.insert(*blamed);
    if (exit.exec_errno != 0) {
      lines.push_back(absl::StrCat("cannot execute '", options_.command,
                                   "': ", std::strerror(exit.exec_errno), " (rank ", *blamed,
                                   " on ", host, "); check the command and PATH"));
    } else {
      lines.push_back(absl::StrCat("rank ", *blamed, " on ", host, " ", exit.Describe(),
                                   "; it failed first, so the job was stopped"));
      AppendStderrTail(*blamed, lines);
    }
  } else if (exited_before_join_.has_value()) {
    const int rank = *exited_before_join_;
    accounted.insert(rank);
    lines.push_back(absl::StrCat(
        "rank ", rank, " on ", plan_.HostOf(rank).host,
        " exited with code 0 without joining the job, while the other ranks waited for it; the "
        "job was stopped (does rank ",
        rank, " skip the collectives' setup, or end before it?)"));
    AppendStderrTail(rank, lines);
  } else if (stall_.has_value()) {
    std::vector<std::string> names;
    for (int rank : stall_->ranks) {
      accounted.insert(rank);
      names.push_back(absl::StrCat(rank, " on ", plan_.HostOf(rank).host));
    }
    lines.push_back(absl::StrCat(stall_->ranks.size() == 1 ? "rank " : "ranks ",
                                 absl::StrJoin(names, ", "), " stalled: ", stall_->description,
                                 "; the job was stopped (--stall-check-shutdown-time-seconds)"));
    for (const auto& [rank, message] : peer_messages_) {
      if (IsStallDiagnosis(message)) lines.push_back(absl::StrCat("  rank ", rank, ": ", message));
    }
  } else if (signal_.has_value()) {
    lines.push_back(absl::StrCat("interrupted by ", SignalName(*signal_), "; the job was stopped"));
  } else if (start_failure_.has_value()) {
    lines.push_back(*start_failure_);
  }

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
  if (std::string elastic = ElasticSummary(); !elastic.empty()) lines.push_back(elastic);
  return absl::StrJoin(lines, "\n");
}

}  // namespace trainrun::launcher
