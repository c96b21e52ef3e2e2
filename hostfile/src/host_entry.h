// Pieces shared by the -H, hostfile and Slurm parsers. Messages carry no location; callers prefix
// theirs (the -H entry, FILE:LINE, the Slurm variable).
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainrun/hostfile/slot_plan.h"

namespace trainrun::hostfile::internal {

// ParseSlotCount reads a slot count for `host`: a whole number in [1, kMaxSlotsPerHost].
absl::StatusOr<int> ParseSlotCount(absl::string_view text, absl::string_view host);

// ParsedEntry is a host entry and whether it carried an explicit `:slots`.
struct ParsedEntry {
  HostSpec spec;
  bool has_slots = false;
};

// ParseEntry parses `[user@]host[:slots]` (see ParseHostEntry).
absl::StatusOr<ParsedEntry> ParseEntry(absl::string_view entry);

// HostSet is a host list being built: Add appends a host, or, when the same host is already
// there, adds its slots to that entry (as Open MPI does with a host listed once per slot). Add
// fails when the two entries name different users or the sum exceeds kMaxSlotsPerHost. Each Add
// costs O(1), so a 65536-node Slurm list is not quadratic.
class HostSet {
 public:
  absl::Status Add(HostSpec host);
  // Reserve makes room for `n` hosts at once (a Slurm list knows its size).
  void Reserve(size_t n) {
    hosts_.reserve(n);
    index_.reserve(n);
  }
  bool empty() const { return hosts_.empty(); }
  std::vector<HostSpec> Take() { return std::move(hosts_); }

 private:
  std::vector<HostSpec> hosts_;
  std::unordered_map<std::string, size_t> index_;  // host name -> its place in hosts_
};

}  // namespace trainrun::hostfile::internal
