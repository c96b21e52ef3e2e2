#include "trainrun/rendezvous/generation.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace trainrun::rendezvous {

std::optional<RankPlace> Generation::PlaceOf(int slot) const {
  // The layout rule of the slot plan, over the members: local ranks count the members of one host
  // in rank order; hosts are numbered in the order of their first member, and a member's cross
  // place is among the hosts that have its local rank.
  std::map<std::string, int> host_size;
  for (const GenerationMember& m : members) ++host_size[m.host];
  std::vector<std::string> host_order;
  for (const GenerationMember& m : members) {
    if (std::find(host_order.begin(), host_order.end(), m.host) == host_order.end()) {
      host_order.push_back(m.host);
    }
  }
  std::map<std::string, int> seen_on_host;
  std::vector<int> local_rank(members.size());
  for (size_t i = 0; i < members.size(); ++i) local_rank[i] = seen_on_host[members[i].host]++;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].slot != slot) continue;
    RankPlace place;
    place.rank = static_cast<int>(i);
    place.size = static_cast<int>(members.size());
    place.local_rank = local_rank[i];
    place.local_size = host_size[members[i].host];
    place.cross_rank = 0;
    place.cross_size = 0;
    for (const std::string& host : host_order) {
      if (host_size[host] <= place.local_rank) continue;
      if (host == members[i].host) place.cross_rank = place.cross_size;
      ++place.cross_size;
    }
    return place;
  }
  return std::nullopt;
}

std::string Generation::Encode() const {
  std::string text;
  for (const GenerationMember& m : members) absl::StrAppend(&text, m.slot, " ", m.host, "\n");
  return text;
}

absl::StatusOr<Generation> Generation::Decode(int number, const std::string& text) {
  Generation generation;
  generation.number = number;
  std::set<int> slots;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ');
    GenerationMember member;
    if (fields.size() != 2 || fields[1].empty() || !absl::SimpleAtoi(fields[0], &member.slot) ||
        member.slot < 0 || !slots.insert(member.slot).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("generation ", number, " has a malformed member line '", line, "'"));
    }
    member.host = std::string(fields[1]);
    generation.members.push_back(std::move(member));
  }
  if (generation.members.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("generation ", number, " has no members"));
  }
  return generation;
}

std::string GenerationKey(int number) { return absl::StrCat("elastic/generation/", number); }

std::string GenerationJoinedPrefix(int number) {
  return absl::StrCat("elastic/joined/", number, "/");
}

absl::StatusOr<int> LatestGeneration(Store& store) {
  absl::StatusOr<int64_t> latest = store.Add(kLatestGenerationKey, 0);
  if (!latest.ok()) return latest.status();
  return static_cast<int>(*latest);
}

absl::StatusOr<Generation> WaitForGeneration(Store& store, int at_least,
                                             std::chrono::milliseconds timeout) {
  absl::StatusOr<int> latest = LatestGeneration(store);
  if (!latest.ok()) return latest.status();
  const int number = std::max(at_least, *latest);
  absl::StatusOr<std::vector<std::string>> text = store.Get({GenerationKey(number)}, timeout);
  if (!text.ok()) return text.status();
  return Generation::Decode(number, (*text)[0]);
}

}  // namespace trainrun::rendezvous
