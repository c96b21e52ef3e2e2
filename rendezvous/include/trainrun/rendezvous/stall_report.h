// StallReport: what a rank publishes, under env::kStallKeyPrefix<rank>, about a collective it has
// waited in longer than the stall warning time, and what trainrun's stall inspector reads back
// (launcher/stall_inspector.h). The collective is named as a person would look for it
// (`allreduce "grad.fc1.weight" (#1,204)`, or `barrier #7` when it has no name), and the report
// says how long the rank had waited when it published, so that trainrun says how long the rank has
// actually waited, whatever warning time each side was given.
//
//   store.Set(key, StallReport{"allreduce #7", std::chrono::milliseconds(2000)}.Encode());
//   StallReport report = StallReport::Decode(value);  // value "" : waits in none
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace trainrun::rendezvous {

struct StallReport {
  std::string collective;  // empty: the rank waits in no collective (its last one completed)
  // How long the rank had waited in it when it published; negative when the report does not say.
  std::chrono::milliseconds waited{-1};

  // Encode is the store value: the collective, then a tab and the milliseconds waited.
  std::string Encode() const {
    if (collective.empty()) return "";
    return collective + "\t" + std::to_string(waited.count());
  }

  // Decode reads a store value; a value without a tab and a number is a collective with no wait.
  static StallReport Decode(const std::string& value) {
    StallReport report;
    const size_t tab = value.rfind('\t');
    if (tab == std::string::npos || tab + 1 == value.size() ||
        value.find_first_not_of("0123456789", tab + 1) != std::string::npos ||
        value.size() - tab > 16) {
      report.collective = value;
      return report;
    }
    report.collective = value.substr(0, tab);
    report.waited = std::chrono::milliseconds(std::stoll(value.substr(tab + 1)));
    return report;
  }
};

// DescribeCollective names a collective for a stall report: `kind "name" (#sequence)`, or
// `kind #sequence` without a name; the sequence with thousands separators (1,204).
inline std::string DescribeCollective(const char* kind, const std::string& name,
                                      uint64_t sequence) {
  std::string digits = std::to_string(sequence);
  std::string number;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) number += ',';
    number += digits[i];
  }
  if (name.empty()) return std::string(kind) + " #" + number;
  return std::string(kind) + " \"" + name + "\" (#" + number + ")";
}

}  // namespace trainrun::rendezvous
