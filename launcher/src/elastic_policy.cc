#include "elastic_policy.h"

#include <csignal>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "rank_ranges.h"
#include "trainrun/launcher/logging.h"

namespace trainrun::launcher {

ElasticPolicy::ElasticPolicy(const PolicyContext& context, ElasticSpec elastic)
    : context_(context),
      elastic_(std::move(elastic)),
      start_size_(context.plan.size()),
      elastic_timer_(context.io) {}

bool ElasticPolicy::OnExit(int rank, const ExitInfo& exit) {
  if (pending_.erase(rank) > 0) {
    // A rank the job was growing by, before it became a member: no member is lost.
    lost_.insert(rank);
    return false;
  }
  if (exit.ok()) {
    if (lost_.count(rank) == 0) {
      finishing_ = true;
      GiveUpPending();
    }
    return false;
  }
  // A rank stopped because its host left the discovery output: already one change.
  if (lost_.count(rank) > 0) return false;
  if (context_.job.Ending()) return true;
  const std::string why =
      absl::StrCat("rank ", rank, " on ", context_.plan.HostOf(rank).host, " ", exit.Describe());
  if (below_minimum_.has_value()) {
    // A failure while the job already waits for ranks: the wait's consequence, unless it was the
    // last rank (then nothing is left to wait with, and the job ends at once).
    lost_.insert(rank);
    below_minimum_->remaining = static_cast<int>(Survivors().size());
    below_minimum_->rank = rank;
    below_minimum_->why = why;
    EndIfNoneLeft();
    return false;
  }
  Loss({rank}, why, exit.time);
  return false;
}

std::vector<int> ElasticPolicy::Survivors() const {
  std::vector<int> survivors;
  for (int rank = 0; rank < context_.plan.size(); ++rank) {
    if (!context_.job.Exited(rank) && lost_.count(rank) == 0 && pending_.count(rank) == 0) {
      survivors.push_back(rank);
    }
  }
  return survivors;
}

void ElasticPolicy::Stop(const std::vector<int>& ranks) {
  context_.ranks.TerminateRanks(ranks);
  auto timer = std::make_unique<boost::asio::steady_timer>(context_.io, context_.grace_period);
  timer->async_wait([this, ranks](const boost::system::error_code& error) {
    if (!error && !context_.job.Done()) context_.ranks.KillRanks(ranks);
  });
  removal_timers_.push_back(std::move(timer));
}

void ElasticPolicy::GiveUpPending() {
  if (pending_.empty()) return;
  std::vector<int> ranks(pending_.begin(), pending_.end());
  Logger().debug("the job is finishing: stopping {}, which had not joined it yet",
                 RankRanges(ranks));
  for (int rank : ranks) {
    lost_.insert(rank);
    stopped_.insert(rank);
  }
  pending_.clear();
  Stop(ranks);
}

void ElasticPolicy::OnRanksAdded(const std::vector<int>& ranks) {
  pending_.insert(ranks.begin(), ranks.end());
}

bool ElasticPolicy::OnRanksJoined(const std::vector<int>& ranks, const std::string& why,
                                  std::chrono::steady_clock::time_point since,
                                  const std::string& host) {
  std::vector<int> joined;
  for (int rank : ranks) {
    if (pending_.erase(rank) > 0) joined.push_back(rank);
  }
  if (joined.empty() || context_.job.Ending() || context_.job.Done() || finishing_) return false;
  const std::vector<int> members = Survivors();
  if (PastResetLimit(why)) return false;
  if (below_minimum_.has_value()) {
    // The job waited for ranks: these may be enough.
    if (static_cast<int>(members.size()) < elastic_.min_np) {
      Logger().warn("{}; {} ranks now, still fewer than --min-np {}", why, members.size(),
                    elastic_.min_np);
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

void ElasticPolicy::OnHostLost(const std::vector<int>& ranks, const std::string& why) {
  // Ranks the job was growing by (not members yet) are given up without a change.
  std::vector<int> members;
  for (int rank : ranks) {
    if (pending_.erase(rank) > 0) {
      lost_.insert(rank);
    } else {
      members.push_back(rank);
    }
  }
  if (members.empty() || context_.job.Ending()) return;
  if (below_minimum_.has_value()) {
    for (int rank : members) lost_.insert(rank);
    below_minimum_->remaining = static_cast<int>(Survivors().size());
    below_minimum_->rank = members.front();
    below_minimum_->why = absl::StrCat(why, ": ", RankRanges(members), " lost");
    EndIfNoneLeft();
    return;
  }
  Loss(members, absl::StrCat(why, ": ", RankRanges(members), " lost"),
       std::chrono::steady_clock::now(), context_.plan.HostOf(members.front()).host);
}

void ElasticPolicy::OnRanksRemoved(const std::vector<int>& ranks, const std::string& why) {
  if (context_.job.Ending() || context_.job.Done()) return;
  std::vector<int> running;
  std::vector<int> members;
  for (int rank : ranks) {
    if (context_.job.Exited(rank) || lost_.count(rank) > 0) continue;
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
  Stop(running);
  if (members.empty()) return;
  if (below_minimum_.has_value()) {
    for (int rank : members) lost_.insert(rank);
    return;
  }
  Loss(members, absl::StrCat(why, ": ", RankRanges(members), " stopped"),
       std::chrono::steady_clock::now(), context_.plan.HostOf(members.front()).host);
}

bool ElasticPolicy::PastResetLimit(const std::string& why) {
  if (elastic_.reset_limit <= 0 || static_cast<int>(changes_.size()) < elastic_.reset_limit) {
    return false;
  }
  context_.job.End(ResetLimitReached{
      absl::StrCat(why, "; the job's membership had already changed ", changes_.size(),
                   changes_.size() == 1 ? " time" : " times", ", as many as --reset-limit ",
                   elastic_.reset_limit, " allows, so the job was stopped")});
  return true;
}

void ElasticPolicy::Loss(const std::vector<int>& ranks, const std::string& why,
                         std::chrono::steady_clock::time_point when, const std::string& host) {
  for (int r : ranks) lost_.insert(r);
  const std::vector<int> survivors = Survivors();
  const int rank = ranks.front();
  if (PastResetLimit(why)) return;
  if (elastic_.min_nodes > 0) {
    // --nnodes MIN:MAX: fewer than MIN nodes end the job now (torchrun's rendezvous closes).
    std::set<std::string> nodes;
    for (int survivor : survivors) nodes.insert(context_.plan.HostOf(survivor).host);
    if (static_cast<int>(nodes.size()) < elastic_.min_nodes) {
      context_.job.End(BelowMinimum{rank, why, static_cast<int>(nodes.size()), elastic_.min_np,
                                    std::chrono::seconds(0), elastic_.min_nodes});
      return;
    }
  }
  if (static_cast<int>(survivors.size()) < elastic_.min_np) {
    below_minimum_ = Wait{rank, why, static_cast<int>(survivors.size())};
    Logger().warn(
        "{}; {} {} left, fewer than --min-np {}: waiting up to {} s (--elastic-timeout) "
        "for ranks",
        why, survivors.size(), survivors.size() == 1 ? "rank is" : "ranks are", elastic_.min_np,
        elastic_.timeout.count());
    if (!EndIfNoneLeft()) WaitForRanks();
    return;
  }
  MembershipChange change;
  change.lost_ranks = ranks;
  change.lost_host = host;
  Record(std::move(change), why, survivors, when);
}

void ElasticPolicy::Record(MembershipChange change, const std::string& why,
                           const std::vector<int>& members,
                           std::chrono::steady_clock::time_point when) {
  change.generation = static_cast<int>(changes_.size()) + 1;
  change.why = why;
  change.members = members;
  change.when = when;
  changes_.push_back(change);
  if (context_.on_membership_change) context_.on_membership_change(change);
}

bool ElasticPolicy::EndIfNoneLeft() {
  if (!below_minimum_.has_value() || !below_minimum_->waiting || below_minimum_->remaining > 0 ||
      !pending_.empty() || context_.job.Ending() || context_.job.Done()) {
    return false;
  }
  // Every rank has failed and none is starting: no rank is left to go on with once more come,
  // so the job ends now (as Horovod's), not after the elastic timeout.
  elastic_timer_.cancel();
  below_minimum_->waiting = false;
  context_.job.End(BelowMinimum{below_minimum_->rank, below_minimum_->why, 0, elastic_.min_np,
                                std::chrono::seconds(0)});
  return true;
}

void ElasticPolicy::WaitForRanks() {
  // Without host discovery no rank can come: the wait is Horovod's, so that a job started with a
  // discovery script later behaves the same, and the user sees why it ended.
  elastic_timer_.expires_after(elastic_.timeout);
  elastic_timer_.async_wait([this](const boost::system::error_code& error) {
    if (error || context_.job.Done()) return;
    below_minimum_->waiting = false;
    context_.job.End(BelowMinimum{below_minimum_->rank, below_minimum_->why,
                                  below_minimum_->remaining, elastic_.min_np, elastic_.timeout});
    context_.job.MaybeDone();
  });
}

std::string ElasticPolicy::OnGenerationFormed(int generation) {
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

std::string ElasticPolicy::Summary() const {
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

}  // namespace trainrun::launcher
