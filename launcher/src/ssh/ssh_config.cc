#include "ssh/ssh_config.h"

#include <glob.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::launcher::ssh {
namespace {

// Include may nest; OpenSSH stops at 16 levels, and so do we, to end a loop of Includes.
constexpr int kMaxIncludeDepth = 16;
// An included file larger than this is not an SSH config (a log, an image, a core file).
constexpr off_t kMaxIncludedBytes = 1 << 20;

std::string HomeDirectory() {
  if (std::optional<std::string> home = env::Lookup(env::kHome); home && !home->empty())
    return *home;
  if (const passwd* pw = getpwuid(getuid()); pw != nullptr && pw->pw_dir != nullptr) {
    return pw->pw_dir;
  }
  return "/";
}

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Splits a config line into its keyword and arguments: whitespace separates, one `=` may stand
// between keyword and value, and double quotes group words.
std::vector<std::string> Tokenize(absl::string_view line) {
  std::vector<std::string> tokens;
  std::string current;
  bool in_quotes = false;
  bool have_token = false;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (c == '"') {
      in_quotes = !in_quotes;
      have_token = true;
    } else if (!in_quotes &&
               (std::isspace(static_cast<unsigned char>(c)) || (c == '=' && tokens.empty()))) {
      if (have_token) tokens.push_back(std::move(current));
      current.clear();
      have_token = false;
    } else {
      current.push_back(c);
      have_token = true;
    }
  }
  if (have_token) tokens.push_back(std::move(current));
  return tokens;
}

// Expands OpenSSH's tokens in a path: a leading `~`, %d (home), %u (local user), %h (remote
// host), %r (remote user), %n (the alias) and %%.
std::string ExpandPath(absl::string_view path, const std::string& home, const SshTarget& target) {
  std::string out;
  if (absl::StartsWith(path, "~/") || path == "~") {
    out = home;
    path.remove_prefix(1);
  }
  for (size_t i = 0; i < path.size(); ++i) {
    if (path[i] != '%' || i + 1 == path.size()) {
      out.push_back(path[i]);
      continue;
    }
    switch (path[++i]) {
      case 'd':
        out += home;
        break;
      case 'u':
        out += LocalUserName();
        break;
      case 'h':
        out += target.hostname.empty() ? target.alias : target.hostname;
        break;
      case 'r':
        out += target.user;
        break;
      case 'n':
        out += target.alias;
        break;
      case '%':
        out += '%';
        break;
      default:
        out.push_back('%');
        out.push_back(path[i]);
        break;
    }
  }
  return out;
}

// The values read from the config for one alias, before the flags are applied.
struct ConfigValues {
  std::optional<std::string> hostname;
  std::optional<std::string> user;
  std::optional<int> port;
  std::vector<std::string> identity_files;  // unexpanded
};

class ConfigReader {
 public:
  ConfigReader(const std::string& alias, const std::string& home) : alias_(alias), home_(home) {}

  absl::Status Read(absl::string_view text, const std::string& name, int depth) {
    bool active = true;  // settings before the first Host line apply to every host
    int line_number = 0;
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      ++line_number;
      std::vector<std::string> tokens = Tokenize(line);
      if (tokens.empty() || tokens[0][0] == '#') continue;
      std::string keyword = absl::AsciiStrToLower(tokens[0]);
      std::vector<std::string> args(tokens.begin() + 1, tokens.end());
      auto where = [&] { return absl::StrCat(name, ":", line_number); };
      if (keyword == "host") {
        if (args.empty()) return Malformed(where(), "Host needs at least one pattern");
        active = HostLineMatches(args);
      } else if (keyword == "match") {
        // Match blocks depend on state (exec, canonical names) we do not model: skip them, as
        // their settings are rarely what a cluster's hosts need.
        active = false;
      } else if (!active) {
        continue;
      } else if (keyword == "include") {
        if (depth >= kMaxIncludeDepth) return Malformed(where(), "Include nests too deeply");
        for (const std::string& pattern : args) {
          if (absl::Status s = Include(pattern, depth, where()); !s.ok()) return s;
        }
      } else if (keyword == "hostname" || keyword == "user" || keyword == "port" ||
                 keyword == "identityfile") {
        if (args.size() != 1)
          return Malformed(where(), absl::StrCat(tokens[0], " needs one value"));
        if (absl::Status s = Set(keyword, args[0], where()); !s.ok()) return s;
      }
      // Every other keyword belongs to OpenSSH alone (or to --ssh-client openssh): ignored.
    }
    return absl::OkStatus();
  }

  ConfigValues values() && { return std::move(values_); }

 private:
  static absl::Status Malformed(const std::string& where, absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", what, "; fix that line of the SSH config"));
  }

  bool HostLineMatches(const std::vector<std::string>& patterns) const {
    bool matched = false;
    for (const std::string& pattern : patterns) {
      if (!pattern.empty() && pattern[0] == '!') {
        if (MatchHostPattern(absl::string_view(pattern).substr(1), alias_)) return false;
      } else if (MatchHostPattern(pattern, alias_)) {
        matched = true;
      }
    }
    return matched;
  }

  // Reads the files `pattern` matches, in glob order. A directory among them is passed over (a
  // `config.d/*` that matches a subdirectory); a device, FIFO or socket, or a file over 1 MiB, is
  // an error, as reading it could block or never end.
  absl::Status Include(const std::string& pattern, int depth, const std::string& where) {
    std::string path = pattern;
    if (absl::StartsWith(path, "~")) path = home_ + path.substr(1);
    if (path.empty() || path[0] != '/') path = absl::StrCat(home_, "/.ssh/", path);
    glob_t found{};
    absl::Status status;
    if (glob(path.c_str(), 0, nullptr, &found) == 0) {
      for (size_t i = 0; i < found.gl_pathc && status.ok(); ++i) {
        std::string file = found.gl_pathv[i];
        struct stat st {};
        if (stat(file.c_str(), &st) != 0 || S_ISDIR(st.st_mode)) continue;
        if (!S_ISREG(st.st_mode)) {
          status = Malformed(
              where, absl::StrCat("Include matched ", file, ", which is not a regular file"));
        } else if (st.st_size > kMaxIncludedBytes) {
          status =
              Malformed(where, absl::StrCat("Include matched ", file, ", which is ", st.st_size,
                                            " bytes (an SSH config is under 1 MiB)"));
        } else if (std::optional<std::string> text = ReadFile(file)) {
          status = Read(*text, file, depth + 1);
        }
      }
    }
    globfree(&found);
    return status;
  }

  absl::Status Set(const std::string& keyword, const std::string& value, const std::string& where) {
    if (keyword == "hostname") {
      if (!values_.hostname) values_.hostname = value;
    } else if (keyword == "user") {
      if (!values_.user) values_.user = value;
    } else if (keyword == "port") {
      int port = 0;
      if (!absl::SimpleAtoi(value, &port) || port < 1 || port > 65535) {
        return Malformed(where, absl::StrCat("Port '", value, "' is not a port number (1-65535)"));
      }
      if (!values_.port) values_.port = port;
    } else if (keyword == "identityfile") {
      values_.identity_files.push_back(value);
    }
    return absl::OkStatus();
  }

  const std::string& alias_;
  const std::string& home_;
  ConfigValues values_;
};

bool MatchGlob(absl::string_view pattern, absl::string_view text) {
  // Iterative wildcard match with one backtrack point: linear in practice.
  size_t p = 0, t = 0, star = absl::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() &&
        (pattern[p] == '?' || absl::ascii_tolower(pattern[p]) == absl::ascii_tolower(text[t]))) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != absl::string_view::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace

bool MatchHostPattern(absl::string_view pattern, absl::string_view host) {
  return MatchGlob(pattern, host);
}

std::string LocalUserName() {
  if (const passwd* pw = getpwuid(getuid()); pw != nullptr && pw->pw_name != nullptr) {
    return pw->pw_name;
  }
  if (std::optional<std::string> user = env::Lookup(env::kUser)) return *user;
  return "root";
}

std::string SshDirectory(const SshOptions& options) {
  if (!options.ssh_dir.empty()) return options.ssh_dir;
  return HomeDirectory() + "/.ssh";
}

absl::StatusOr<SshTarget> ResolveSshTargetFromText(absl::string_view config_text,
                                                   const std::string& config_name,
                                                   const std::string& user_from_spec,
                                                   const std::string& alias,
                                                   const SshOptions& options,
                                                   const std::string& home) {
  ConfigReader reader(alias, home);
  if (absl::Status s = reader.Read(config_text, config_name, 0); !s.ok()) return s;
  ConfigValues values = std::move(reader).values();

  SshTarget target;
  target.alias = alias;
  target.config_file = config_name;
  target.hostname = alias;
  if (values.hostname) {
    std::string expanded;
    // HostName's only token is %h: the alias.
    for (size_t i = 0; i < values.hostname->size(); ++i) {
      char c = (*values.hostname)[i];
      if (c == '%' && i + 1 < values.hostname->size() && (*values.hostname)[i + 1] == 'h') {
        expanded += alias;
        ++i;
      } else {
        expanded.push_back(c);
      }
    }
    target.hostname = expanded;
  }
  target.user = !user_from_spec.empty() ? user_from_spec
                : values.user           ? *values.user
                                        : LocalUserName();
  target.port = options.port ? *options.port : values.port ? *values.port : 22;

  std::string ssh_dir = SshDirectory(options);
  if (options.identity_file) target.identity_files.push_back(*options.identity_file);
  for (const std::string& file : values.identity_files) {
    target.identity_files.push_back(ExpandPath(file, home, target));
  }
  if (target.identity_files.empty()) {
    target.default_identities = true;
    for (const char* name : {"id_ed25519", "id_ecdsa", "id_rsa"}) {
      target.identity_files.push_back(absl::StrCat(ssh_dir, "/", name));
    }
  }
  target.known_hosts_file = ssh_dir + "/known_hosts";
  return target;
}

absl::StatusOr<SshTarget> ResolveSshTarget(const std::string& user_from_spec,
                                           const std::string& alias, const SshOptions& options) {
  std::string ssh_dir = SshDirectory(options);
  std::string config_file = ssh_dir + "/config";
  std::optional<std::string> text = ReadFile(config_file);
  // With options.ssh_dir set, `~` is that directory's parent, so a test's config stays inside it.
  std::string home = options.ssh_dir.empty() ? HomeDirectory() : ssh_dir + "/..";
  auto target = ResolveSshTargetFromText(text.value_or(""), text ? config_file : "", user_from_spec,
                                         alias, options, home);
  return target;
}

}  // namespace trainrun::launcher::ssh
