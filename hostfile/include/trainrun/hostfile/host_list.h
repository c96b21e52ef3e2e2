// Host entries as users type them after -H: `host`, `host:slots`, `user@host:slots`,
// `[ipv6]:slots`, comma separated, as horovodrun and mpirun take them.
//
//   auto hosts = trainrun::hostfile::ParseHostList("a:2,ubuntu@b:2,[fe80::1]:4");
//   // (*hosts)[1].user == "ubuntu", (*hosts)[2].host == "fe80::1"
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainrun/hostfile/slot_plan.h"

namespace trainrun::hostfile {

// ParseHostEntry parses one `[user@]host[:slots]` entry; slots default to `default_slots`. IPv6
// addresses must be in brackets (`[::1]:2`). Errors (InvalidArgument) name the entry and what is
// wrong with it: an empty host or user, a character a host name cannot hold, a slot count that is
// empty, not a whole number, 0, or above kMaxSlotsPerHost.
absl::StatusOr<HostSpec> ParseHostEntry(absl::string_view entry, int default_slots = 1);

// ParseHostList parses a comma separated list of entries (the value of -H). A host listed twice
// gets the sum of its slots at its first position, as Open MPI does. Errors (InvalidArgument): an
// empty list or entry, whitespace in the list, any ParseHostEntry error.
absl::StatusOr<std::vector<HostSpec>> ParseHostList(absl::string_view list);

// HostLabel is how a host is shown to the user: `host`, `user@host`, `[ipv6]`.
std::string HostLabel(const HostSpec& host);

}  // namespace trainrun::hostfile
