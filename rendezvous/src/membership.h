// Membership: who the job's ranks are and what the rendezvous knows of each — their places (the
// slot plan's, and the ranks an elastic job grew by), who has joined, how each ended, and the
// ranks' "failed because of peer P" reports. No gRPC here: the server (server.cc) turns a
// JoinRequest into a JoinClaim and the Placement back into its answer.
//
//   Membership members(ranks);
//   absl::StatusOr<Placement> place = members.Join({"a", 1, std::nullopt, 4242}, &names);
//   members.NoteExit(3, "exited with code 1");
//   members.DescribeAbsent({0, 3});  // "; rank 3 has not joined; rank 3 exited with code 1"
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "trainrun/rendezvous/server.h"

namespace trainrun::rendezvous::internal {

// JoinClaim is what a joining worker says of itself.
struct JoinClaim {
  std::string host;         // its TRAINRUN_HOSTNAME
  int local_rank = 0;       // its TRAINRUN_LOCAL_RANK
  std::optional<int> rank;  // the rank it was started as, when it says (a grown rank must)
  int64_t pid = 0;
};

// Placement is a joined worker's place in the job: its rank, the size of the job it is told of,
// and its slot.
struct Placement {
  int rank = 0;
  int size = 0;
  RankSlot slot;
};

// Membership is thread-safe; each call takes its own lock briefly and calls nothing outside.
class Membership {
 public:
  explicit Membership(std::vector<RankSlot> ranks);

  // Join places a worker by (host, local_rank), or by its rank when AddRanks added it, and marks it
  // joined. Fails with NOT_FOUND (no such place), INVALID_ARGUMENT (a claimed rank that is not the
  // place's) or ALREADY_EXISTS (joined before). `host_names`, when given, receives every rank's
  // host as the join answer sends them (distinct names, in rank order).
  absl::StatusOr<Placement> Join(const JoinClaim& claim, std::vector<std::string>* host_names);
  // AddRanks appends ranks (Server::AddRanks) and returns the first one's number.
  int AddRanks(const std::vector<RankSlot>& slots);
  // NoteExit records how `rank` ended ("exited with code 1"); out-of-range ranks are ignored.
  void NoteExit(int rank, const std::string& how);
  // AddPeerFailure keeps a "failed because of peer" report, up to a bound of 4 per rank (plus 16),
  // and returns whether it was kept.
  bool AddPeerFailure(const PeerFailure& failure);

  // Runs returns the runs of hosts (host index, length) that cover ranks 0 .. size-1, the last one
  // cut short where `size` ends inside it.
  std::vector<std::pair<int, int>> Runs(int size) const;
  // HostTable is the hosts' names front-coded (JoinResponse.host_table), encoded once and again
  // after AddRanks changed them.
  std::shared_ptr<const std::string> HostTable();

  int size() const;
  std::vector<RankState> Ranks() const;
  std::vector<PeerFailure> PeerFailures() const;
  // DescribeAbsent says which of `ranks` have not joined and how those that ended did:
  // "; ranks 3, 7 have not joined; rank 3 exited with code 1", or "" when there is nothing to say.
  std::string DescribeAbsent(const std::vector<int>& ranks) const;

 private:
  void AppendHostRun(int host);  // one more rank, on host_names_[host]

  mutable std::mutex mutex_;
  std::vector<RankSlot> slots_;
  std::map<std::pair<std::string, int>, int> rank_of_;  // (host, local_rank) -> rank
  int first_added_ = 0;  // the first rank AddRanks may add (the start's size)
  // Every rank's host: distinct names, in rank order, and runs of ranks on one host
  // (rendezvous.proto).
  std::vector<std::string> host_names_;
  std::vector<int> host_run_hosts_;
  std::vector<int> host_run_lengths_;
  std::shared_ptr<const std::string> host_table_;
  std::vector<RankState> ranks_;
  std::vector<PeerFailure> peer_failures_;
};

// At most this many keys or ranks are named in one error; the rest are counted.
inline constexpr size_t kMaxNamed = 16;
// NameSome joins up to kMaxNamed items and counts the rest: "a, b and 3 more".
std::string NameSome(const std::vector<std::string>& items);
// NameRanks writes "rank 3" or "ranks 3, 7".
std::string NameRanks(const std::vector<int>& ranks);

}  // namespace trainrun::rendezvous::internal
