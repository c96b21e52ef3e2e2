#include "trainrun/cli/config_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace trainrun::cli {
namespace {

// One `key: value` of the file: its dotted path ("params.cycle_time_ms"), a scalar, or a list
// (block or flow), or, for a section, the `name: value` pairs under it; and its line.
struct Entry {
  std::string path;
  std::optional<std::string> scalar;
  std::vector<std::string> list;
  std::vector<std::pair<std::string, std::string>> mapping;
  int line = 0;
};

// What a key does: the flag it stands for (with its value, or when true/false), or a note.
enum class Kind { kNumber, kText, kFlagIfTrue, kFlagIfFalse, kNote };
struct Key {
  const char* path;
  Kind kind;
  const char* flag_or_note;
};

constexpr char kNoAutotune[] =
    "trainrun has no cycle time or fusion buffer to autotune: each collective runs when every "
    "rank calls it";
constexpr char kNoMpi[] = "trainrun uses neither MPI, oneCCL nor a second NCCL stream";
// horovodrun's config keys (horovod/runner/common/util/config_parser.py), each as horovodrun's
// flag of the same meaning is in trainrun.
constexpr Key kHorovodKeys[] = {
    {"params.fusion_threshold_mb", Kind::kNumber, "--fusion-threshold-mb"},
    {"params.cycle_time_ms", Kind::kNumber, "--cycle-time-ms"},
    {"params.cache_capacity", Kind::kNumber, "--cache-capacity"},
    {"params.hierarchical_allreduce", Kind::kFlagIfTrue, "--hierarchical-allreduce"},
    {"params.hierarchical_allgather", Kind::kFlagIfTrue, "--hierarchical-allgather"},
    {"autotune.enabled", Kind::kNote, kNoAutotune},
    {"autotune.log_file", Kind::kNote, kNoAutotune},
    {"autotune.warmup_samples", Kind::kNote, kNoAutotune},
    {"autotune.steps_per_sample", Kind::kNote, kNoAutotune},
    {"autotune.bayes_opt_max_samples", Kind::kNote, kNoAutotune},
    {"autotune.gaussian_process_noise", Kind::kNote, kNoAutotune},
    {"timeline.filename", Kind::kText, "--timeline-filename"},
    {"timeline.mark_cycles", Kind::kFlagIfTrue, "--timeline-mark-cycles"},
    {"stall_check.enabled", Kind::kFlagIfFalse, "--no-stall-check"},
    {"stall_check.warning_time_seconds", Kind::kNumber, "--stall-check-warning-time-seconds"},
    {"stall_check.shutdown_time_seconds", Kind::kNumber, "--stall-check-shutdown-time-seconds"},
    {"library_options.mpi_threads_disable", Kind::kNote, kNoMpi},
    {"library_options.num_nccl_streams", Kind::kNote, kNoMpi},
    {"library_options.ccl_bgt_affinity", Kind::kNote, kNoMpi},
    {"library_options.gloo_timeout_seconds", Kind::kNumber, "TRAINRUN_TIMEOUT"},
    {"logging.level", Kind::kText, "--log-level"},
    {"logging.hide_timestamp", Kind::kFlagIfTrue, "--log-hide-timestamp"},
};
constexpr char kJobKeys[] = "hosts, processes_per_host, num_proc, environment, command";

// Removes a `#` comment (at the start or after a space, outside quotes) and trailing spaces.
std::string StripComment(absl::string_view line) {
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (quote != 0) {
      if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '#' && (i == 0 || line[i - 1] == ' ' || line[i - 1] == '\t')) {
      line = line.substr(0, i);
      break;
    }
  }
  return std::string(absl::StripTrailingAsciiWhitespace(line));
}

// Reader walks the file's lines; every error names the file and the line.
class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  absl::Status Error(int line, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(path_, " line ", line, ": ", what));
  }

  // A scalar: 'single' or "double" quoted, or plain.
  absl::StatusOr<std::string> Scalar(absl::string_view text, int line) const {
    text = absl::StripAsciiWhitespace(text);
    if (text.size() >= 2 && (text.front() == '"' || text.front() == '\'')) {
      if (text.back() != text.front()) return Error(line, "a quoted value does not end");
      return std::string(text.substr(1, text.size() - 2));
    }
    if (!text.empty() && (text.front() == '{' || text.front() == '&' || text.front() == '*' ||
                          text.front() == '|' || text.front() == '>')) {
      return Error(line, absl::StrCat("'", text,
                                      "' is YAML that trainrun's config files do not use; write a "
                                      "plain value, a list or `key: value` lines"));
    }
    return std::string(text);
  }

  // A flow list: [a, "b c", d].
  absl::StatusOr<std::vector<std::string>> FlowList(absl::string_view text, int line) const {
    if (text.back() != ']') return Error(line, "a list opened with [ does not end with ]");
    std::vector<std::string> items;
    absl::string_view inner = text.substr(1, text.size() - 2);
    if (absl::StripAsciiWhitespace(inner).empty()) return items;
    for (absl::string_view item : absl::StrSplit(inner, ',')) {
      absl::StatusOr<std::string> value = Scalar(item, line);
      if (!value.ok()) return value.status();
      items.push_back(*std::move(value));
    }
    return items;
  }

  absl::StatusOr<std::vector<Entry>> Parse(absl::string_view text) const {
    std::vector<Entry> entries;
    std::optional<size_t> section;  // the top-level key with no value on its line
    std::optional<size_t> list_owner;
    int number = 0;
    for (absl::string_view raw : absl::StrSplit(text, '\n')) {
      ++number;
      std::string line = StripComment(raw);
      if (absl::StripAsciiWhitespace(line).empty() || line == "---") continue;
      if (line.find('\t') < line.find_first_not_of(" \t")) {
        return Error(number, "indent with spaces, not tabs");
      }
      const size_t indent = line.find_first_not_of(' ');
      absl::string_view content = absl::string_view(line).substr(indent);
      if (absl::StartsWith(content, "- ") || content == "-") {
        if (!list_owner) return Error(number, "a list item with no key above it");
        absl::StatusOr<std::string> item = Scalar(content.substr(1), number);
        if (!item.ok()) return item.status();
        entries[*list_owner].list.push_back(*std::move(item));
        continue;
      }
      size_t colon = content.find(": ");
      if (colon == absl::string_view::npos && absl::EndsWith(content, ":")) {
        colon = content.size() - 1;
      }
      if (colon == absl::string_view::npos || colon == 0) {
        return Error(number, absl::StrCat("'", content, "' is not `key: value`"));
      }
      std::string key(absl::StripAsciiWhitespace(content.substr(0, colon)));
      absl::string_view rest = absl::StripAsciiWhitespace(content.substr(colon + 1));
      Entry entry;
      entry.line = number;
      if (indent == 0) {
        section.reset();
        entry.path = key;
      } else {
        if (!section) return Error(number, absl::StrCat("'", key, "' is indented under nothing"));
        entry.path = absl::StrCat(entries[*section].path, ".", key);
        entries[*section].mapping.emplace_back(key, std::string(rest));
        if (rest.empty()) return Error(number, absl::StrCat("'", entry.path, "' has no value"));
      }
      list_owner.reset();
      if (rest.empty()) {
        list_owner = entries.size();  // a list, or (at the top) a section
        if (indent == 0) section = entries.size();
      } else if (rest.front() == '[') {
        absl::StatusOr<std::vector<std::string>> list = FlowList(rest, number);
        if (!list.ok()) return list.status();
        entry.list = *std::move(list);
      } else {
        absl::StatusOr<std::string> value = Scalar(rest, number);
        if (!value.ok()) return value.status();
        entry.scalar = *std::move(value);
        if (indent > 0) entries[*section].mapping.back().second = *entry.scalar;
      }
      entries.push_back(std::move(entry));
    }
    return entries;
  }

 private:
  std::string path_;
};

std::optional<bool> ParseBool(const std::string& text) {
  std::string lower = absl::AsciiStrToLower(text);
  if (lower == "true" || lower == "yes" || lower == "on" || lower == "1") return true;
  if (lower == "false" || lower == "no" || lower == "off" || lower == "0") return false;
  return std::nullopt;
}

// Splits a command written as one string, as a shell would split plain words and quotes.
std::vector<std::string> SplitCommand(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (char c : text) {
    if (quote != 0) {
      if (c == quote) {
        quote = 0;
      } else {
        word += c;
      }
    } else if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (c == ' ' || c == '\t') {
      if (in_word) words.push_back(std::move(word));
      word.clear();
      in_word = false;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (in_word) words.push_back(std::move(word));
  return words;
}

}  // namespace

absl::StatusOr<ConfigFile> ParseConfigFile(absl::string_view text, const std::string& path) {
  Reader reader(path);
  absl::StatusOr<std::vector<Entry>> entries = reader.Parse(text);
  if (!entries.ok()) return entries.status();
  ConfigFile config;
  std::vector<std::string> hosts;
  std::optional<std::string> per_host;
  int per_host_line = 0;
  auto scalar_of = [&](const Entry& e) -> absl::StatusOr<std::string> {
    if (!e.scalar) return reader.Error(e.line, absl::StrCat("'", e.path, "' needs one value"));
    return *e.scalar;
  };
  for (const Entry& e : *entries) {
    const bool is_section = e.scalar == std::nullopt && e.list.empty();
    if (e.path == "controller") {
      absl::StatusOr<std::string> value = scalar_of(e);
      if (!value.ok()) return value.status();
      if (absl::AsciiStrToLower(*value) == "mpi") {
        return reader.Error(e.line, "controller: mpi: trainrun needs no MPI; remove the key");
      }
      continue;
    }
    if (e.path == "hosts") {
      hosts = e.scalar ? std::vector<std::string>(absl::StrSplit(*e.scalar, ',', absl::SkipEmpty()))
                       : e.list;
      continue;
    }
    if (e.path == "processes_per_host" || e.path == "num_proc") {
      absl::StatusOr<std::string> value = scalar_of(e);
      if (!value.ok()) return value.status();
      int n = 0;
      if (!absl::SimpleAtoi(*value, &n) || n < 1) {
        return reader.Error(e.line,
                            absl::StrCat(e.path, ": '", *value, "' is not a count (1 or more)"));
      }
      if (e.path == "num_proc") {
        config.flags.push_back({"--num-proc", *value});
      } else {
        per_host = *value;
        per_host_line = e.line;
      }
      continue;
    }
    if (e.path == "environment") {
      for (const auto& [name, value] : e.mapping)
        config.flags.push_back({"-x", name + "=" + value});
      for (const std::string& item : e.list) config.flags.push_back({"-x", item});
      continue;
    }
    if (e.path == "command") {
      config.command = e.scalar ? SplitCommand(*e.scalar) : e.list;
      continue;
    }
    // A section's keys come as entries of their own; the section itself does nothing.
    if (is_section &&
        (e.path == "params" || e.path == "autotune" || e.path == "timeline" ||
         e.path == "stall_check" || e.path == "library_options" || e.path == "logging")) {
      continue;
    }
    if (absl::StartsWith(e.path, "environment.")) continue;  // read with its section
    const Key* key = nullptr;
    for (const Key& candidate : kHorovodKeys) {
      if (e.path == candidate.path) key = &candidate;
    }
    if (key == nullptr) {
      return reader.Error(
          e.line, absl::StrCat("'", e.path,
                               "' is not a key trainrun knows (horovodrun's params, autotune, "
                               "timeline, stall_check, library_options and logging keys, or a "
                               "job file's ",
                               kJobKeys, ")"));
    }
    absl::StatusOr<std::string> value = scalar_of(e);
    if (!value.ok()) return value.status();
    switch (key->kind) {
      case Kind::kNumber: {
        double number = 0;
        if (!absl::SimpleAtod(*value, &number)) {
          return reader.Error(e.line, absl::StrCat(e.path, ": '", *value, "' is not a number"));
        }
        if (absl::StartsWith(key->flag_or_note, "--")) {
          config.flags.push_back({key->flag_or_note, *value});
        } else {
          config.flags.push_back({"-x", absl::StrCat(key->flag_or_note, "=", *value)});
        }
        break;
      }
      case Kind::kText:
        config.flags.push_back({key->flag_or_note, e.path == "logging.level"
                                                       ? absl::AsciiStrToLower(*value)
                                                       : *value});
        break;
      case Kind::kFlagIfTrue:
      case Kind::kFlagIfFalse: {
        std::optional<bool> on = ParseBool(*value);
        if (!on) {
          return reader.Error(e.line,
                              absl::StrCat(e.path, ": '", *value, "' is not true or false"));
        }
        if (*on == (key->kind == Kind::kFlagIfTrue)) config.flags.push_back({key->flag_or_note});
        break;
      }
      case Kind::kNote:
        config.notes.push_back(absl::StrCat(path, ": ", e.path,
                                            " is accepted for horovodrun compatibility and changes "
                                            "nothing: ",
                                            key->flag_or_note));
        break;
    }
  }
  if (per_host && hosts.empty()) {
    return reader.Error(per_host_line, "processes_per_host needs hosts: in the same file");
  }
  if (!hosts.empty()) {
    for (std::string& host : hosts) {
      host = std::string(absl::StripAsciiWhitespace(host));
      // host:N, user@host:N, [ipv6]:N
      const size_t bracket = host.rfind(']');
      const size_t colon = host.rfind(':');
      const bool has_slots =
          colon != std::string::npos && (bracket == std::string::npos || colon > bracket);
      if (per_host && !has_slots) host += ":" + *per_host;
    }
    config.flags.push_back({"--hosts", absl::StrJoin(hosts, ",")});
  }
  return config;
}

absl::StatusOr<ConfigFile> ReadConfigFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--config-file ", path, ": cannot read it: ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseConfigFile(text.str(), path);
}

}  // namespace trainrun::cli
