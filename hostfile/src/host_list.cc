#include "trainrun/hostfile/host_list.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "host_entry.h"

namespace trainrun::hostfile {

absl::StatusOr<HostSpec> ParseHostEntry(absl::string_view entry, int default_slots) {
  absl::StatusOr<internal::ParsedEntry> parsed = internal::ParseEntry(entry);
  if (!parsed.ok()) return parsed.status();
  if (!parsed->has_slots) parsed->spec.slots = default_slots;
  return parsed->spec;
}

absl::StatusOr<std::vector<HostSpec>> ParseHostList(absl::string_view list) {
  if (list.empty()) {
    return absl::InvalidArgumentError("the host list is empty; write host:slots,host:slots");
  }
  for (char c : list) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(
          absl::StrCat("the host list '", list,
                       "' contains whitespace; separate host:slots entries with commas only"));
    }
  }
  internal::HostSet hosts;
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    if (entry.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the host list '", list, "' has an empty entry (a stray comma?)"));
    }
    absl::StatusOr<HostSpec> host = ParseHostEntry(entry);
    if (!host.ok()) return host.status();
    if (absl::Status s = hosts.Add(*host); !s.ok()) return s;
  }
  return hosts.Take();
}

std::string HostLabel(const HostSpec& host) {
  std::string label = host.user.empty() ? "" : absl::StrCat(host.user, "@");
  if (host.host.find(':') != std::string::npos) {
    absl::StrAppend(&label, "[", host.host, "]");
  } else {
    absl::StrAppend(&label, host.host);
  }
  return label;
}

}  // namespace trainrun::hostfile
