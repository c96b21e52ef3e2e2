#include "trainrun/cli/config_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "shell_words.h"
#include "trainrun/rendezvous/environment.h"
#include "yaml-cpp/depthguard.h"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/yaml.h"

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
    {"library_options.gloo_timeout_seconds", Kind::kNumber, env::kTimeoutSeconds.name},
    {"logging.level", Kind::kText, "--log-level"},
    {"logging.hide_timestamp", Kind::kFlagIfTrue, "--log-hide-timestamp"},
};
constexpr char kJobKeys[] = "hosts, processes_per_host, num_proc, environment, command";

// DocumentStarts notes where each YAML document of a stream starts, and nothing else.
struct DocumentStarts : YAML::EventHandler {
  std::vector<YAML::Mark> marks;
  void OnDocumentStart(const YAML::Mark& mark) override { marks.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// Reader turns the YAML document (yaml-cpp) into entries; every error names the file and the line.
class Reader {
 public:
  Reader(std::string path, absl::string_view text)
      : path_(std::move(path)), text_(text), lines_(absl::StrSplit(text, '\n')) {}

  absl::Status Error(int line, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(path_, " line ", line, ": ", what));
  }

  absl::StatusOr<std::vector<Entry>> Parse() const {
    YAML::Node document;
    try {
      // The documents' starts first: yaml-cpp 0.7's LoadAll never ends on a stray ',' (each
      // "next document" starts where the last one did).
      std::istringstream in{std::string(text_)};
      YAML::Parser parser(in);
      DocumentStarts starts;
      while (parser.HandleNextDocument(starts)) {
        const std::vector<YAML::Mark>& marks = starts.marks;
        if (marks.size() >= 2 && marks.back().pos == marks[marks.size() - 2].pos) {
          const YAML::Mark& stuck = marks.back();
          const char c = static_cast<size_t>(stuck.pos) < text_.size() ? text_[stuck.pos] : ' ';
          return absl::InvalidArgumentError(
              absl::StrCat(path_, " line ", stuck.line + 1, ", column ", stuck.column + 1,
                           ": not valid YAML: '", std::string(1, c), "' is out of place here"));
        }
      }
      if (starts.marks.size() >= 2) {
        return Error(starts.marks[1].line + 1,
                     "a second YAML document (after ---); a config file holds one");
      }
      document = YAML::Load(std::string(text_));
    } catch (const YAML::DeepRecursion& e) {
      return Error(e.mark.line + 1, "the YAML nests too deep (over 2000 levels)");
    } catch (const YAML::Exception& e) {
      return SyntaxError(e);
    }
    try {
      if (document.IsNull()) return std::vector<Entry>();
      return Entries(document);
    } catch (const YAML::Exception& e) {
      return SyntaxError(e);
    }
  }

 private:
  static int Line(const YAML::Node& node) { return node.Mark().line + 1; }

  // yaml-cpp's complaint, with the line and column it gives; a tab where the line's indent is
  // the commonest cause, and says so.
  absl::Status SyntaxError(const YAML::Exception& e) const {
    if (e.mark.is_null()) return absl::InvalidArgumentError(absl::StrCat(path_, ": ", e.msg));
    const int line = e.mark.line + 1;
    absl::string_view source =
        line <= static_cast<int>(lines_.size()) ? lines_[line - 1] : absl::string_view();
    const size_t first = source.find_first_not_of(" \t");
    if (source.substr(0, first).find('\t') != absl::string_view::npos) {
      return Error(line, "indent with spaces, not tabs");
    }
    return absl::InvalidArgumentError(absl::StrCat(path_, " line ", line, ", column ",
                                                   e.mark.column + 1, ": not valid YAML: ", e.msg));
  }

  // A mapping's pairs in order, with YAML's merge key (`<<: *anchor`, which yaml-cpp 0.7 leaves
  // as a key) replaced by the anchored mapping's pairs that the mapping does not set itself.
  static std::vector<std::pair<YAML::Node, YAML::Node>> Pairs(const YAML::Node& map) {
    auto is_merge = [](const YAML::Node& key) {
      return key.IsScalar() && key.Tag() == "?" && key.Scalar() == "<<";
    };
    std::set<std::string> own;
    for (const auto& pair : map) {
      if (pair.first.IsScalar() && !is_merge(pair.first)) own.insert(pair.first.Scalar());
    }
    std::vector<std::pair<YAML::Node, YAML::Node>> pairs;
    std::set<std::string> merged;
    for (const auto& pair : map) {
      if (!is_merge(pair.first)) {
        pairs.emplace_back(pair.first, pair.second);
        continue;
      }
      std::vector<YAML::Node> sources;
      if (pair.second.IsSequence()) {
        for (const auto& item : pair.second) sources.push_back(item);
      } else {
        sources.push_back(pair.second);
      }
      for (const YAML::Node& source : sources) {
        if (!source.IsMap()) continue;  // nothing to merge
        for (const auto& inner : source) {
          if (!inner.first.IsScalar() || is_merge(inner.first)) continue;
          const std::string& name = inner.first.Scalar();
          if (own.count(name) == 0 && merged.insert(name).second) {
            pairs.emplace_back(inner.first, inner.second);
          }
        }
      }
    }
    return pairs;
  }

  // A key: a plain name, or an error on its line.
  absl::StatusOr<std::string> Key(const YAML::Node& key, absl::string_view above) const {
    if (!key.IsScalar() || key.Scalar().empty()) {
      return Error(Line(key),
                   absl::StrCat("a key", above.empty() ? "" : " under '", above,
                                above.empty() ? "" : "'", " is not a name; write `name: value`"));
    }
    return key.Scalar();
  }

  // A plain value that goes on over the next lines as `- item` was meant as a list: YAML reads
  // `hosts: a` then `  - b` as the one value "a - b".
  absl::Status CheckNotAList(const YAML::Node& value) const {
    if (value.Tag() != "?") return absl::OkStatus();
    for (int line = Line(value) + 1; line <= static_cast<int>(lines_.size()); ++line) {
      absl::string_view next = absl::StripAsciiWhitespace(lines_[line - 1]);
      if (next.empty()) continue;
      if ((next == "-" || absl::StartsWith(next, "- ")) &&
          value.Scalar().find(std::string(next)) != std::string::npos) {
        return Error(line, "a list item with no key above it");
      }
      break;
    }
    return absl::OkStatus();
  }

  // A list's items, each one plain value.
  absl::StatusOr<std::vector<std::string>> List(const YAML::Node& list,
                                                const std::string& path) const {
    std::vector<std::string> items;
    for (const auto& item : list) {
      if (!item.IsScalar()) {
        return Error(Line(item), absl::StrCat("'", path,
                                              "' is a list whose items are lists or `key: "
                                              "value`; write one plain value per item"));
      }
      items.push_back(item.Scalar());
    }
    return items;
  }

  absl::StatusOr<std::vector<Entry>> Entries(const YAML::Node& document) const {
    if (document.IsScalar()) {
      return Error(Line(document), absl::StrCat("'", document.Scalar(), "' is not `key: value`"));
    }
    if (!document.IsMap()) {
      return Error(Line(document), "the file is a list; write `key: value` lines");
    }
    std::vector<Entry> entries;
    for (const auto& [key_node, value] : Pairs(document)) {
      absl::StatusOr<std::string> key = Key(key_node, "");
      if (!key.ok()) return key.status();
      Entry entry;
      entry.path = *key;
      entry.line = Line(key_node);
      if (value.IsScalar()) {
        if (absl::Status list = CheckNotAList(value); !list.ok()) return list;
        entry.scalar = value.Scalar();
      } else if (value.IsSequence()) {
        absl::StatusOr<std::vector<std::string>> list = List(value, entry.path);
        if (!list.ok()) return list.status();
        entry.list = *std::move(list);
      } else if (value.IsMap()) {
        // A section: its `name: value` pairs, and an entry of its own for each.
        std::vector<Entry> children;
        for (const auto& [child_key, child_value] : Pairs(value)) {
          absl::StatusOr<std::string> name = Key(child_key, entry.path);
          if (!name.ok()) return name.status();
          Entry child;
          child.path = absl::StrCat(entry.path, ".", *name);
          child.line = Line(child_key);
          if (child_value.IsNull())
            return Error(child.line, absl::StrCat("'", child.path, "' has no value"));
          if (child_value.IsScalar()) {
            if (absl::Status list = CheckNotAList(child_value); !list.ok()) return list;
            child.scalar = child_value.Scalar();
            entry.mapping.emplace_back(*name, *child.scalar);
          } else if (child_value.IsSequence()) {
            absl::StatusOr<std::vector<std::string>> list = List(child_value, child.path);
            if (!list.ok()) return list.status();
            child.list = *std::move(list);
          } else {
            return Error(child.line, absl::StrCat("'", child.path,
                                                  "' holds `key: value` lines, a level deeper "
                                                  "than trainrun's keys go"));
          }
          children.push_back(std::move(child));
        }
        entries.push_back(std::move(entry));
        for (Entry& child : children) entries.push_back(std::move(child));
        continue;
      }
      entries.push_back(std::move(entry));
    }
    return entries;
  }

  std::string path_;
  absl::string_view text_;
  std::vector<absl::string_view> lines_;
};

std::optional<bool> ParseBool(const std::string& text) {
  std::string lower = absl::AsciiStrToLower(text);
  if (lower == "true" || lower == "yes" || lower == "on" || lower == "1") return true;
  if (lower == "false" || lower == "no" || lower == "off" || lower == "0") return false;
  return std::nullopt;
}

}  // namespace

absl::StatusOr<ConfigFile> ParseConfigFile(absl::string_view text, const std::string& path) {
  Reader reader(path, text);
  absl::StatusOr<std::vector<Entry>> entries = reader.Parse();
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
      if (!e.scalar) {
        config.command = e.list;
        continue;
      }
      absl::StatusOr<std::vector<std::string>> words = SplitShellWords(*e.scalar);
      if (!words.ok()) {
        return reader.Error(e.line,
                            absl::StrCat("command '", *e.scalar, "' ", words.status().message()));
      }
      config.command = *std::move(words);
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
