// Hostfiles in the forms people already have:
//
//   # Horovod, DeepSpeed and Open MPI          # and the -H form, one per line
//   node1 slots=4                              node3:4
//   ubuntu@node2 slots=4 max_slots=8           [fe80::1]:2
//
// `#` starts a comment; blank lines, tabs and CRLF line endings are fine. A host without a count
// has 1 slot; a host listed on several lines gets the sum, as Open MPI does.
//
//   auto hosts = trainrun::hostfile::ReadHostfile("hosts.txt");
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainrun/hostfile/slot_plan.h"

namespace trainrun::hostfile {

// ParseHostfile parses a hostfile's `text`; `file_name` only labels errors, which read
// `FILE:LINE: what is wrong` (InvalidArgument). A file that lists no host is an error too.
absl::StatusOr<std::vector<HostSpec>> ParseHostfile(absl::string_view text,
                                                    absl::string_view file_name);

// ReadHostfile reads and parses the hostfile at `path`. Errors: NotFound when it does not exist,
// PermissionDenied or FailedPrecondition when it cannot be read, and ParseHostfile's.
absl::StatusOr<std::vector<HostSpec>> ReadHostfile(const std::string& path);

}  // namespace trainrun::hostfile
