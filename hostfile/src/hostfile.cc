#include "trainrun/hostfile/hostfile.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "host_entry.h"

namespace trainrun::hostfile {
namespace {

// Parses one non-blank line (comment already removed) into `host`.
absl::Status ParseLine(absl::string_view line, HostSpec& host) {
  std::vector<absl::string_view> fields =
      absl::StrSplit(line, absl::ByAnyChar(" \t\r\f\v"), absl::SkipEmpty());
  absl::StatusOr<internal::ParsedEntry> entry = internal::ParseEntry(fields[0]);
  if (!entry.ok()) return entry.status();
  host = entry->spec;
  bool has_slots = entry->has_slots;

  for (size_t i = 1; i < fields.size(); ++i) {
    absl::string_view field = fields[i];
    size_t eq = field.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected '", field, "' after host '",
                                                     host.host,
                                                     "'; expected slots=N or max_slots=N"));
    }
    absl::string_view key = field.substr(0, eq);
    absl::string_view value = field.substr(eq + 1);
    if (key == "slots") {
      if (has_slots) {
        return absl::InvalidArgumentError(
            absl::StrCat("host '", host.host, "' is given a slot count twice"));
      }
      absl::StatusOr<int> slots = internal::ParseSlotCount(value, host.host);
      if (!slots.ok()) return slots.status();
      host.slots = *slots;
      has_slots = true;
    } else if (key == "max_slots" || key == "max-slots") {
      absl::StatusOr<int> max_slots = internal::ParseSlotCount(value, host.host);
      if (!max_slots.ok()) return max_slots.status();
      host.max_slots = *max_slots;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown field '", key, "' for host '", host.host, "'; expected slots=N or max_slots=N"));
    }
  }
  if (host.max_slots && *host.max_slots < host.slots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host '", host.host, "' has max_slots=", *host.max_slots, " below its slots=", host.slots));
  }
  return absl::OkStatus();
}

absl::Status AtLine(absl::string_view file_name, int line_number, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat(file_name, ":", line_number, ": ", status.message()));
}

}  // namespace

absl::StatusOr<std::vector<HostSpec>> ParseHostfile(absl::string_view text,
                                                    absl::string_view file_name) {
  internal::HostSet hosts;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    HostSpec host;
    if (absl::Status s = ParseLine(line, host); !s.ok()) return AtLine(file_name, line_number, s);
    if (absl::Status s = hosts.Add(host); !s.ok()) {
      return AtLine(file_name, line_number, s);
    }
  }
  if (hosts.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("hostfile '", file_name, "' lists no hosts; write one `host slots=N` a line"));
  }
  return hosts.Take();
}

absl::StatusOr<std::vector<HostSpec>> ReadHostfile(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    int error = errno;
    if (error == ENOENT) {
      return absl::NotFoundError(absl::StrCat("hostfile '", path, "' does not exist"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read hostfile '", path, "': ", std::strerror(error)));
  }
  if (S_ISDIR(info.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("hostfile '", path, "' is a directory, not a file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    int error = errno;
    return absl::PermissionDeniedError(
        absl::StrCat("cannot read hostfile '", path, "': ", std::strerror(error)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::FailedPreconditionError(absl::StrCat("cannot read hostfile '", path, "'"));
  }
  return ParseHostfile(text.str(), path);
}

}  // namespace trainrun::hostfile
