// Generation: the membership of an elastic job (trainrun --min-np) after a change, as the launcher
// publishes it in the job's store and workers read it when they join again.
//
// Generation 0 is the job as it started: rank r is slot r (its TRAINRUN_RANK). When a rank is lost
// and enough remain, the launcher publishes generation g+1 under GenerationKey(g+1) (and sets the
// counter kLatestGenerationKey to g+1, both at once): the survivors in slot order, renumbered
// 0..k-1, each with its new local and cross place. A worker whose communicator broke (or that saw
// the counter move) waits for the next generation, finds its slot in it, and connects anew.
//
//   absl::StatusOr<Generation> next = WaitForGeneration(store, current + 1, timeout);
//   if (!next.ok()) return next.status();
//   std::optional<RankPlace> me = next->PlaceOf(my_slot);  // nullopt: left out of the job
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainrun/rendezvous/rank_place.h"
#include "trainrun/rendezvous/store.h"

namespace trainrun::rendezvous {

// GenerationMember is one rank of a generation: its slot (its rank in generation 0) and its host.
struct GenerationMember {
  int slot = 0;
  std::string host;
};

// Generation is one membership of an elastic job; members[i] is rank i.
struct Generation {
  int number = 0;
  std::vector<GenerationMember> members;

  // PlaceOf returns the place of slot `slot` in this generation (rank, size, and local and cross
  // places derived from the members' hosts, in rank order), or nullopt when it is not a member.
  std::optional<RankPlace> PlaceOf(int slot) const;
  // Encode writes the generation as the store's value: one "slot host" line per member.
  std::string Encode() const;
  // Decode parses Encode's text; fails with INVALID_ARGUMENT naming the bad line.
  static absl::StatusOr<Generation> Decode(int number, const std::string& text);
};

// The store's counter (Store::Add) holding the newest generation's number; 0 before any change.
inline constexpr char kLatestGenerationKey[] = "elastic/latest";

// GenerationKey is the store key of generation `number`'s membership.
std::string GenerationKey(int number);
// GenerationJoinedPrefix: a member of generation `number` that has connected to the others sets
// the key of this prefix followed by its slot (the launcher counts them: the change's recovery).
std::string GenerationJoinedPrefix(int number);

// WaitForGeneration returns the newest generation numbered `at_least` or more: the newest one
// already published when it is that new, else the first to be published within `timeout` (then
// DEADLINE_EXCEEDED).
absl::StatusOr<Generation> WaitForGeneration(Store& store, int at_least,
                                             std::chrono::milliseconds timeout);

// LatestGeneration returns the newest published generation's number (0: none since the start),
// without waiting.
absl::StatusOr<int> LatestGeneration(Store& store);

}  // namespace trainrun::rendezvous
