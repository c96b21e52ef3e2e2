#include "trainrun/hostfile/slurm.h"

#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "host_entry.h"

namespace trainrun::hostfile {
namespace {

constexpr size_t kMaxSlurmHosts = 65536;

// Splits on commas outside brackets: "a[1,3],b" -> {"a[1,3]", "b"}.
absl::StatusOr<std::vector<absl::string_view>> SplitTopLevel(absl::string_view list) {
  std::vector<absl::string_view> items;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    char c = list[i];
    if (c == '[') {
      if (++depth > 1) {
        return absl::InvalidArgumentError(absl::StrCat("nested '[' in '", list, "'"));
      }
    } else if (c == ']') {
      if (--depth < 0)
        return absl::InvalidArgumentError(absl::StrCat("unmatched ']' in '", list, "'"));
    } else if (c == ',' && depth == 0) {
      items.push_back(list.substr(start, i - start));
      start = i + 1;
    }
  }
  if (depth != 0) return absl::InvalidArgumentError(absl::StrCat("unclosed '[' in '", list, "'"));
  items.push_back(list.substr(start));
  return items;
}

bool AllDigits(absl::string_view text) {
  if (text.empty()) return false;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// Range is one part of a bracket group: low..high, printed `width` digits wide at least.
struct Range {
  uint64_t low = 0;
  uint64_t high = 0;
  int width = 0;
};

// Parses one bracket group's body, "01-03,07", into ranges, without expanding them: the count is
// checked against the host cap before any name is made.
absl::StatusOr<std::vector<Range>> ParseGroup(absl::string_view body) {
  std::vector<Range> ranges;
  for (absl::string_view part : absl::StrSplit(body, ',')) {
    std::vector<absl::string_view> bounds = absl::StrSplit(part, absl::MaxSplits('-', 1));
    uint64_t low = 0;
    uint64_t high = 0;
    if (!AllDigits(bounds[0]) || !absl::SimpleAtoi(bounds[0], &low) ||
        (bounds.size() == 2 && (!AllDigits(bounds[1]) || !absl::SimpleAtoi(bounds[1], &high)))) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", part, "' in [", body, "] is neither a number nor a range like 01-04"));
    }
    if (bounds.size() == 1) high = low;
    if (high < low) {
      return absl::InvalidArgumentError(absl::StrCat("range '", part, "' runs backwards"));
    }
    if (high - low >= kMaxSlurmHosts) {
      return absl::InvalidArgumentError(absl::StrCat("range '", part, "' is too large"));
    }
    ranges.push_back({low, high, static_cast<int>(bounds[0].size())});
  }
  return ranges;
}

// Count is how many values the ranges hold, or kMaxSlurmHosts + 1 if more.
size_t Count(const std::vector<Range>& ranges) {
  size_t count = 0;
  for (const Range& range : ranges) {
    count += range.high - range.low + 1;  // each at most kMaxSlurmHosts: no overflow
    if (count > kMaxSlurmHosts) return kMaxSlurmHosts + 1;
  }
  return count;
}

// Expands one name with bracket groups, left to right, as a cartesian product.
absl::Status ExpandName(absl::string_view name, std::vector<std::string>& out) {
  std::vector<std::string> partial = {""};
  absl::string_view rest = name;
  while (!rest.empty()) {
    size_t open = rest.find('[');
    absl::string_view literal = rest.substr(0, open);
    for (std::string& p : partial) absl::StrAppend(&p, literal);
    if (open == absl::string_view::npos) break;
    size_t close = rest.find(']', open);  // balanced: checked by SplitTopLevel
    absl::StatusOr<std::vector<Range>> ranges = ParseGroup(rest.substr(open + 1, close - open - 1));
    if (!ranges.ok()) return ranges.status();
    // The cap is checked before the names are made, so a short list that would expand to
    // millions of names costs nothing.
    const size_t count = Count(*ranges);
    if (count > kMaxSlurmHosts || partial.size() * count > kMaxSlurmHosts - out.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("expands to more than ", kMaxSlurmHosts, " hosts"));
    }
    std::vector<std::string> next;
    next.reserve(partial.size() * count);
    for (const std::string& p : partial) {
      for (const Range& range : *ranges) {
        for (uint64_t v = range.low; v <= range.high; ++v) {
          std::string name = p;
          const std::string digits = absl::StrCat(v);
          if (digits.size() < static_cast<size_t>(range.width)) {
            name.append(range.width - digits.size(), '0');
          }
          name += digits;
          next.push_back(std::move(name));
        }
      }
    }
    partial = std::move(next);
    rest.remove_prefix(close + 1);
  }
  out.insert(out.end(), partial.begin(), partial.end());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandSlurmNodelist(absl::string_view nodelist) {
  absl::StatusOr<std::vector<absl::string_view>> names = SplitTopLevel(nodelist);
  if (!names.ok()) return names.status();
  std::vector<std::string> hosts;
  for (absl::string_view name : *names) {
    if (name.empty() || name.front() == '[') {
      return absl::InvalidArgumentError(
          absl::StrCat("node list '", nodelist, "' has an entry without a host name"));
    }
    if (absl::Status s = ExpandName(name, hosts); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("node list '", nodelist, "': ", s.message()));
    }
  }
  return hosts;
}

absl::StatusOr<std::vector<int>> ExpandSlurmTasksPerNode(absl::string_view tasks_per_node) {
  std::vector<int> counts;
  for (absl::string_view part : absl::StrSplit(tasks_per_node, ',')) {
    absl::string_view count = part;
    uint64_t repeat = 1;
    if (size_t paren = part.find("(x"); paren != absl::string_view::npos) {
      absl::string_view times = part.substr(paren + 2);
      if (times.empty() || times.back() != ')' || !AllDigits(times.substr(0, times.size() - 1)) ||
          !absl::SimpleAtoi(times.substr(0, times.size() - 1), &repeat) || repeat == 0 ||
          repeat > kMaxSlurmHosts) {
        return absl::InvalidArgumentError(absl::StrCat("tasks per node '", tasks_per_node, "': '",
                                                       part, "' is not of the form N or N(xM)"));
      }
      count = part.substr(0, paren);
    }
    absl::StatusOr<int> slots = internal::ParseSlotCount(count, "(Slurm node)");
    if (!slots.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tasks per node '", tasks_per_node, "': '", part,
                       "' is not of the form N or N(xM) with 1 <= N <= ", kMaxSlotsPerHost));
    }
    if (counts.size() + repeat > kMaxSlurmHosts) {
      return absl::InvalidArgumentError(
          absl::StrCat("tasks per node '", tasks_per_node, "' covers too many nodes"));
    }
    counts.insert(counts.end(), repeat, *slots);
  }
  return counts;
}

absl::StatusOr<std::vector<HostSpec>> SlurmHosts(absl::string_view nodelist,
                                                 std::optional<absl::string_view> tasks_per_node) {
  absl::StatusOr<std::vector<std::string>> names = ExpandSlurmNodelist(nodelist);
  if (!names.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SLURM_JOB_NODELIST: ", names.status().message()));
  }
  std::vector<int> counts(names->size(), 1);
  if (tasks_per_node) {
    absl::StatusOr<std::vector<int>> expanded = ExpandSlurmTasksPerNode(*tasks_per_node);
    if (!expanded.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("SLURM_TASKS_PER_NODE: ", expanded.status().message()));
    }
    if (expanded->size() != names->size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SLURM_TASKS_PER_NODE '", *tasks_per_node, "' gives counts for ", expanded->size(),
          " nodes but SLURM_JOB_NODELIST '", nodelist, "' has ", names->size()));
    }
    counts = *std::move(expanded);
  }
  internal::HostSet hosts;
  hosts.Reserve(names->size());
  for (size_t i = 0; i < names->size(); ++i) {
    HostSpec host;
    host.host = std::move((*names)[i]);
    host.slots = counts[i];
    if (absl::Status s = hosts.Add(std::move(host)); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("SLURM_JOB_NODELIST: ", s.message()));
    }
  }
  return hosts.Take();
}

}  // namespace trainrun::hostfile
