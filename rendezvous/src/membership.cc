#include "membership.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "wire.h"

namespace trainrun::rendezvous::internal {

std::string NameSome(const std::vector<std::string>& items) {
  std::vector<std::string> named(items.begin(), items.begin() + std::min(items.size(), kMaxNamed));
  std::string out = absl::StrJoin(named, ", ");
  if (items.size() > kMaxNamed) absl::StrAppend(&out, " and ", items.size() - kMaxNamed, " more");
  return out;
}

std::string NameRanks(const std::vector<int>& ranks) {
  std::vector<std::string> names;
  names.reserve(ranks.size());
  for (int r : ranks) names.push_back(absl::StrCat(r));
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", NameSome(names));
}

Membership::Membership(std::vector<RankSlot> ranks) : slots_(std::move(ranks)) {
  ranks_.resize(slots_.size());
  std::map<std::string, int> host_index;
  for (size_t r = 0; r < slots_.size(); ++r) {
    const std::string& host = slots_[r].host;
    rank_of_[{host, slots_[r].local_rank}] = static_cast<int>(r);
    auto [it, added] = host_index.emplace(host, static_cast<int>(host_names_.size()));
    if (added) host_names_.push_back(host);
    AppendHostRun(it->second);
  }
  first_added_ = static_cast<int>(slots_.size());
}

void Membership::AppendHostRun(int host) {
  if (host_run_hosts_.empty() || host_run_hosts_.back() != host) {
    host_run_hosts_.push_back(host);
    host_run_lengths_.push_back(0);
  }
  ++host_run_lengths_.back();
}

int Membership::AddRanks(const std::vector<RankSlot>& slots) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int first = static_cast<int>(slots_.size());
  for (const RankSlot& slot : slots) {
    slots_.push_back(slot);
    ranks_.emplace_back();
    auto it = std::find(host_names_.begin(), host_names_.end(), slot.host);
    if (it == host_names_.end()) it = host_names_.insert(host_names_.end(), slot.host);
    AppendHostRun(static_cast<int>(it - host_names_.begin()));
  }
  host_table_.reset();
  return first;
}

absl::StatusOr<Placement> Membership::Join(const JoinClaim& claim,
                                           std::vector<std::string>* host_names) {
  std::lock_guard<std::mutex> lock(mutex_);
  // A rank added while the job runs (Server::AddRanks, an elastic job that grew) joins by its
  // rank, which the launcher gave it, on the host it was started on.
  auto found = rank_of_.find({claim.host, claim.local_rank});
  const int claimed = claim.rank.value_or(-1);
  int rank = -1;
  if (claimed >= first_added_ && claimed < static_cast<int>(ranks_.size()) &&
      slots_[claimed].host == claim.host) {
    rank = claimed;
  } else if (found != rank_of_.end()) {
    rank = found->second;
  } else {
    return absl::NotFoundError(absl::StrCat(
        "this job has no rank on host '", claim.host.substr(0, 256), "' with local_rank ",
        claim.local_rank, "; check TRAINRUN_HOSTNAME and TRAINRUN_LOCAL_RANK"));
  }
  if (claim.rank.has_value() && *claim.rank != rank) {
    return absl::InvalidArgumentError(absl::StrCat("a worker claiming rank ", *claim.rank,
                                                   " joined as host '", claim.host, "' local_rank ",
                                                   claim.local_rank, ", which is rank ", rank));
  }
  RankState& state = ranks_[rank];
  if (state.joined) {
    return absl::AlreadyExistsError(absl::StrCat("rank ", rank, " already joined (pid ", state.pid,
                                                 "); each rank joins once per job"));
  }
  state.joined = true;
  state.pid = claim.pid;
  // A rank of the start is told the start's job (ranks AddRanks added later are no part of its
  // first generation); an added rank, the job as it is now.
  Placement placement;
  placement.rank = rank;
  placement.size = rank < first_added_ ? first_added_ : static_cast<int>(slots_.size());
  placement.slot = slots_[rank];
  if (host_names != nullptr) *host_names = host_names_;
  return placement;
}

void Membership::NoteExit(int rank, const std::string& how) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (rank < 0 || rank >= static_cast<int>(ranks_.size())) return;
  ranks_[rank].exited = how;
}

bool Membership::AddPeerFailure(const PeerFailure& failure) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (peer_failures_.size() >= 4 * slots_.size() + 16) return false;
  peer_failures_.push_back(failure);
  return true;
}

std::vector<std::pair<int, int>> Membership::Runs(int size) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<int, int>> runs;
  for (size_t k = 0, end = 0; k < host_run_hosts_.size() && end < static_cast<size_t>(size); ++k) {
    const int length = std::min(host_run_lengths_[k], size - static_cast<int>(end));
    runs.emplace_back(host_run_hosts_[k], length);
    end += static_cast<size_t>(length);
  }
  return runs;
}

std::shared_ptr<const std::string> Membership::HostTable() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (host_table_ == nullptr) {
    std::vector<const std::string*> names;
    names.reserve(host_names_.size());
    for (const std::string& name : host_names_) names.push_back(&name);
    host_table_ = std::make_shared<const std::string>(EncodeTable(names));
  }
  return host_table_;
}

int Membership::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(slots_.size());
}

std::vector<RankState> Membership::Ranks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ranks_;
}

std::vector<PeerFailure> Membership::PeerFailures() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peer_failures_;
}

std::string Membership::DescribeAbsent(const std::vector<int>& ranks) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int> not_joined;
  std::vector<std::string> exits;
  for (int r : ranks) {
    if (r < 0 || r >= static_cast<int>(ranks_.size())) continue;
    if (!ranks_[r].joined) not_joined.push_back(r);
    if (ranks_[r].exited && exits.size() < kMaxNamed) {
      exits.push_back(absl::StrCat("rank ", r, " ", *ranks_[r].exited));
    }
  }
  std::string out;
  if (!not_joined.empty()) {
    absl::StrAppend(&out, "; ", NameRanks(not_joined), not_joined.size() == 1 ? " has" : " have",
                    " not joined");
  }
  if (!exits.empty()) absl::StrAppend(&out, "; ", absl::StrJoin(exits, "; "));
  return out;
}

}  // namespace trainrun::rendezvous::internal
