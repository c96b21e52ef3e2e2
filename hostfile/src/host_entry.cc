#include "host_entry.h"

#include <cstdint>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "trainrun/hostfile/host_list.h"

namespace trainrun::hostfile::internal {
namespace {

bool IsNameChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

// Inside brackets: an IPv6 address, optionally with a zone (`fe80::1%eth0`).
bool IsIpv6Char(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == ':' || c == '.' || c == '%' ||
         c == '-' || c == '_';
}

absl::Status CheckChars(absl::string_view text, absl::string_view what, bool (*ok)(char)) {
  for (char c : text) {
    if (!ok(c)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s '%s' contains the character '%s', which is not allowed there", what,
                          text, absl::CHexEscape(absl::string_view(&c, 1))));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> ParseSlotCount(absl::string_view text, absl::string_view host) {
  if (text.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("host '", host, "' has an empty slot count; write host:N with N >= 1"));
  }
  bool all_digits = true;
  for (char c : text) all_digits = all_digits && absl::ascii_isdigit(static_cast<unsigned char>(c));
  if (!all_digits) {
    return absl::InvalidArgumentError(absl::StrCat("slot count '", text, "' for host '", host,
                                                   "' is not a positive whole number"));
  }
  uint64_t value = 0;
  // All digits, so a failed parse means the number overflowed: absurd either way.
  if (!absl::SimpleAtoi(text, &value) || value > static_cast<uint64_t>(kMaxSlotsPerHost)) {
    return absl::InvalidArgumentError(absl::StrCat("host '", host, "' asks for ", text,
                                                   " slots; one host may have at most ",
                                                   kMaxSlotsPerHost));
  }
  if (value == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host '", host, "' has 0 slots; give it at least 1"));
  }
  return static_cast<int>(value);
}

absl::StatusOr<ParsedEntry> ParseEntry(absl::string_view entry) {
  ParsedEntry parsed;
  absl::string_view rest = entry;
  if (size_t at = rest.find('@'); at != absl::string_view::npos) {
    parsed.spec.user = std::string(rest.substr(0, at));
    rest.remove_prefix(at + 1);
    if (parsed.spec.user.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("entry '", entry, "' has an empty user name before '@'"));
    }
    if (absl::Status s = CheckChars(parsed.spec.user, "user name", IsNameChar); !s.ok()) return s;
  }

  absl::string_view host;
  absl::string_view slots;
  bool has_colon = false;
  if (!rest.empty() && rest.front() == '[') {
    size_t close = rest.find(']');
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("entry '", entry, "' opens '[' for an IPv6 address but never closes it"));
    }
    host = rest.substr(1, close - 1);
    absl::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') {
        return absl::InvalidArgumentError(
            absl::StrCat("entry '", entry, "' has '", after, "' after ']'; write [address]:slots"));
      }
      has_colon = true;
      slots = after.substr(1);
    }
    if (host.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("entry '", entry, "' has an empty address"));
    }
    if (absl::Status s = CheckChars(host, "IPv6 address", IsIpv6Char); !s.ok()) return s;
  } else {
    size_t colon = rest.find(':');
    if (colon != absl::string_view::npos && rest.find(':', colon + 1) != absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("entry '", entry,
                       "' has more than one ':'; write IPv6 addresses in brackets, e.g. [::1]:2"));
    }
    host = rest.substr(0, colon);
    if (colon != absl::string_view::npos) {
      has_colon = true;
      slots = rest.substr(colon + 1);
    }
    if (host.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("entry '", entry, "' has no host name"));
    }
    if (absl::Status s = CheckChars(host, "host name", IsNameChar); !s.ok()) return s;
  }
  parsed.spec.host = std::string(host);
  if (has_colon) {
    absl::StatusOr<int> count = ParseSlotCount(slots, host);
    if (!count.ok()) return count.status();
    parsed.spec.slots = *count;
    parsed.has_slots = true;
  }
  return parsed;
}

absl::Status HostSet::Add(HostSpec host) {
  auto [found, added] = index_.emplace(host.host, hosts_.size());
  if (!added) {
    HostSpec& existing = hosts_[found->second];
    if (existing.user != host.user) {
      return absl::InvalidArgumentError(
          absl::StrCat("host '", host.host, "' is listed as both '", HostLabel(existing), "' and '",
                       HostLabel(host), "'; give each host one user"));
    }
    if (existing.slots + host.slots > kMaxSlotsPerHost) {
      return absl::InvalidArgumentError(absl::StrCat(
          "host '", host.host, "' is listed more than once, for ", existing.slots + host.slots,
          " slots in all; one host may have at most ", kMaxSlotsPerHost));
    }
    existing.slots += host.slots;
    if (host.max_slots) existing.max_slots = existing.max_slots.value_or(0) + *host.max_slots;
    return absl::OkStatus();
  }
  hosts_.push_back(std::move(host));
  return absl::OkStatus();
}

}  // namespace trainrun::hostfile::internal
