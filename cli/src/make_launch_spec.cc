#include "trainrun/cli/make_launch_spec.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "shell_words.h"
#include "trainrun/hostfile/host_list.h"
#include "trainrun/hostfile/hostfile.h"
#include "trainrun/hostfile/slot_plan.h"
#include "trainrun/hostfile/slurm.h"
#include "trainrun/launcher/host_discovery.h"
#include "trainrun/launcher/local_host.h"
#include "trainrun/launcher/monitor.h"
#include "trainrun/launcher/python_interpreter.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::cli {
namespace {

using hostfile::HostSpec;

// Every error of this stage is the user's input; InvalidArgument maps to exit code 2.
absl::Status BadInput(absl::string_view prefix, const absl::Status& status) {
  return absl::InvalidArgumentError(absl::StrCat(prefix, status.message()));
}

// Hosts and where they came from (for messages).
struct Hosts {
  std::vector<HostSpec> hosts;
  std::string source;  // "" for -H/--hostfile, whose messages already name themselves
};

// SlotsFromSlurmGpus: in an allocation with GPUs per node (SLURM_GPUS_ON_NODE=G) and one task per
// node (no --ntasks-per-node), each node gets G slots, one rank per GPU; a count of tasks the user
// asked for is kept as it is.
absl::Status SlotsFromSlurmGpus(const EnvironmentLookup& env, std::vector<HostSpec>& hosts) {
  std::optional<std::string> gpus = env(env::kSlurmGpusOnNode);
  if (!gpus || gpus->empty() || env(env::kSlurmNtasksPerNode)) return absl::OkStatus();
  int count = 0;
  if (!absl::SimpleAtoi(*gpus, &count) || count < 0 || count > hostfile::kMaxSlotsPerHost) {
    return absl::InvalidArgumentError(
        absl::StrCat("in this Slurm allocation: ", env::kSlurmGpusOnNode, "='", *gpus,
                     "' is not a GPU count from 0 to ", hostfile::kMaxSlotsPerHost));
  }
  const bool one_task_each =
      std::all_of(hosts.begin(), hosts.end(), [](const HostSpec& h) { return h.slots == 1; });
  if (count > 1 && one_task_each) {
    for (HostSpec& host : hosts) host.slots = count;
  }
  return absl::OkStatus();
}

// ReadPeHostfile reads Grid Engine's $PE_HOSTFILE: one `host slots queue processors` line per
// queue instance of the job (a host may appear once per queue: its slots add up).
absl::StatusOr<std::vector<HostSpec>> ReadPeHostfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(
        env::kSgePeHostfile, "=", path, ": cannot read it (is this a Grid Engine job's node?)"));
  }
  std::vector<HostSpec> hosts;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    std::vector<std::string> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (words.empty()) continue;
    int slots = 0;
    if (words.size() < 2 || !absl::SimpleAtoi(words[1], &slots) || slots < 1) {
      return absl::InvalidArgumentError(absl::StrCat(env::kSgePeHostfile, " ", path, " line ",
                                                     number, ": \"", line,
                                                     "\" is not `host slots queue processors`"));
    }
    auto same = std::find_if(hosts.begin(), hosts.end(),
                             [&](const HostSpec& h) { return h.host == words[0]; });
    if (same != hosts.end()) {
      same->slots += slots;
      continue;
    }
    HostSpec host;
    host.host = words[0];
    host.slots = slots;
    hosts.push_back(std::move(host));
  }
  if (hosts.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(env::kSgePeHostfile, " ", path, " lists no host"));
  }
  return hosts;
}

// MergeNamesOfThisMachine makes every entry that names this machine (localhost, 127.0.0.1, its
// own name, ...) one host, at the first one's place with all their slots, so its ranks get one
// numbering of local ranks; one line says so.
void MergeNamesOfThisMachine(std::vector<HostSpec>& hosts) {
  std::vector<HostSpec> merged;
  std::vector<std::string> names;
  int first_local = -1;
  for (HostSpec& host : hosts) {
    if (!launcher::IsLocalHost(host.host)) {
      merged.push_back(std::move(host));
      continue;
    }
    names.push_back(host.host);
    if (first_local < 0) {
      first_local = static_cast<int>(merged.size());
      merged.push_back(std::move(host));
      continue;
    }
    HostSpec& local = merged[first_local];
    local.slots += host.slots;
    if (local.max_slots || host.max_slots) {
      local.max_slots =
          local.max_slots.value_or(local.slots - host.slots) + host.max_slots.value_or(host.slots);
    }
  }
  if (names.size() > 1) {
    spdlog::info(
        "{} all name this machine: one host with {} slots, its local ranks numbered across "
        "them",
        absl::StrJoin(names, ", "), merged[first_local].slots);
  }
  hosts = std::move(merged);
}

absl::StatusOr<Hosts> ResolveHosts(const RunOptions& options, const EnvironmentLookup& env) {
  if (options.hosts && options.hostfile) {
    return absl::InvalidArgumentError("give either -H or --hostfile, not both");
  }
  if (options.host_discovery_script) {
    if (options.hosts || options.hostfile) {
      return absl::InvalidArgumentError(absl::StrCat(
          "give either --host-discovery-script or ", options.hosts ? "-H" : "--hostfile",
          ", not both: the script's output is the job's host list"));
    }
    if (!options.min_np) {
      return absl::InvalidArgumentError(
          "--host-discovery-script is for elastic jobs, which --min-np makes; add --min-np N "
          "(the fewest ranks the job may go on with)");
    }
    auto hosts = launcher::RunDiscoveryScript(*options.host_discovery_script,
                                              options.slots_per_host.value_or(1));
    if (!hosts.ok()) return hosts.status();
    if (hosts->empty()) {
      return absl::InvalidArgumentError(absl::StrCat("the host discovery script '",
                                                     *options.host_discovery_script,
                                                     "' printed no host; the job needs one"));
    }
    return Hosts{*std::move(hosts), absl::StrCat("the host discovery script's hosts: ")};
  }
  if (options.hosts) {
    auto hosts = hostfile::ParseHostList(*options.hosts);
    if (!hosts.ok()) return BadInput("-H: ", hosts.status());
    return Hosts{*std::move(hosts), ""};
  }
  if (options.hostfile) {
    auto hosts = hostfile::ReadHostfile(*options.hostfile);
    if (!hosts.ok()) return BadInput("", hosts.status());
    return Hosts{*std::move(hosts), ""};
  }
  std::optional<std::string> nodelist =
      options.launcher == "local" ? std::nullopt : env(env::kSlurmJobNodelist);
  if (nodelist) {
    std::optional<std::string> tasks = env(env::kSlurmTasksPerNode);
    auto hosts = hostfile::SlurmHosts(
        *nodelist, tasks ? std::optional<absl::string_view>(*tasks) : std::nullopt);
    if (!hosts.ok()) return BadInput("in this Slurm allocation: ", hosts.status());
    if (absl::Status gpus = SlotsFromSlurmGpus(env, *hosts); !gpus.ok()) return gpus;
    return Hosts{*std::move(hosts), absl::StrCat("in this Slurm allocation (",
                                                 env::kSlurmJobNodelist, "=", *nodelist, "): ")};
  }
  std::optional<std::string> pe_hostfile =
      options.launcher == "local" || options.launcher == "slurm" ? std::nullopt
                                                                 : env(env::kSgePeHostfile);
  if (pe_hostfile) {
    auto hosts = ReadPeHostfile(*pe_hostfile);
    if (!hosts.ok()) return hosts.status();
    return Hosts{*std::move(hosts), absl::StrCat("in this Grid Engine job (", env::kSgePeHostfile,
                                                 "=", *pe_hostfile, "): ")};
  }
  if (!options.num_proc) {
    return absl::InvalidArgumentError(
        "give -np (ranks on this host) or hosts with -H or --hostfile, e.g. trainrun -np 4 "
        "python train.py");
  }
  if (*options.num_proc > hostfile::kMaxSlotsPerHost) {
    return absl::InvalidArgumentError(absl::StrCat("-np ", *options.num_proc, " is more than the ",
                                                   hostfile::kMaxSlotsPerHost,
                                                   " ranks one host may run"));
  }
  HostSpec local;
  local.host = kLocalHost;
  local.slots = std::max(*options.num_proc, 1);  // -np 0 is PlanSlots' error to report
  return Hosts{{local}, ""};
}

absl::StatusOr<std::vector<launcher::ExportedVariable>> ParseExports(
    const std::vector<std::string>& exports) {
  std::vector<launcher::ExportedVariable> variables;
  for (const std::string& item : exports) {
    launcher::ExportedVariable variable;
    size_t eq = item.find('=');
    variable.name = item.substr(0, eq);
    if (eq != std::string::npos) variable.value = item.substr(eq + 1);
    if (!IsValidVariableName(variable.name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "-x ", item, ": '", variable.name,
          "' is not a valid variable name (letters, digits and _, not starting with a digit)"));
    }
    variables.push_back(std::move(variable));
  }
  return variables;
}

// CheckSettings refuses a setting's bad value, with the setting's own sentence, before any rank
// starts: one given with -x NAME=VALUE, or (for a setting trainrun acts on) in trainrun's
// environment.
absl::Status CheckSettings(const std::vector<launcher::ExportedVariable>& exported,
                           const EnvironmentLookup& env) {
  for (const launcher::ExportedVariable& variable : exported) {
    const env::SettingRef* setting = env::FindSetting(variable.name);
    std::optional<std::string> value = variable.value ? variable.value : env(variable.name);
    if (setting == nullptr || !value || value->empty()) continue;
    if (absl::Status ok = setting->Check(*value); !ok.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("-x ", variable.name, ": ", ok.message()));
    }
  }
  for (const env::SettingRef& setting : env::kSettings) {
    if (setting.side() == env::Side::kRank) continue;
    std::optional<std::string> value = env(setting.name());
    if (!value || value->empty()) continue;
    if (absl::Status ok = setting.Check(*value); !ok.ok()) return ok;
  }
  return absl::OkStatus();
}

// ActedOn is the value of `setting` (one trainrun acts on, checked by CheckSettings) that trainrun
// acts on and JobEnvironment passes to the ranks: the flag (`flag`, typed as `flag_text`), else a
// -x value (given, or taken by -x NAME from trainrun's environment), else trainrun's environment,
// else the default. A flag and a -x value that differ are refused: the ranks and trainrun would
// disagree.
absl::StatusOr<int64_t> ActedOn(const env::IntSetting& setting, std::optional<int64_t> flag,
                                const std::string& flag_text,
                                const std::vector<launcher::ExportedVariable>& exported,
                                const EnvironmentLookup& env) {
  std::optional<std::string> text;
  for (const launcher::ExportedVariable& variable : exported) {
    if (variable.name == setting.name) text = variable.value ? variable.value : env(setting.name);
  }
  const bool by_x = text && !text->empty();
  if (!by_x) text = env(setting.name);
  std::optional<int64_t> value;
  if (text && !text->empty()) {
    absl::StatusOr<int64_t> parsed = setting.Parse(*text);
    if (!parsed.ok()) return parsed.status();
    value = *parsed;
  }
  if (flag) {
    if (by_x && *value != *flag) {
      return absl::InvalidArgumentError(absl::StrCat(flag_text, " and -x ", setting.name, "=",
                                                     *text, " disagree; give one of them"));
    }
    return *flag;
  }
  return value.value_or(setting.default_value);
}

// mpirun's --bind-to, --map-by, --report-bindings, --oversubscribe and -wdir.
absl::Status ApplyPlacement(const RunOptions& options, launcher::LaunchSpec& spec) {
  if (options.map_by) {
    // Open MPI's modifiers (":PE=2", ":SPAN") and its other units are not trainrun's.
    const std::string unit = absl::AsciiStrToLower(*options.map_by);
    if (unit == "core" || unit == "socket" || unit == "package") {
      spec.bind_to = *launcher::ParseBindTo(unit);  // Open MPI binds to the mapping unit
    } else if (unit == "node") {
      return absl::InvalidArgumentError(
          "--map-by node: trainrun fills each host's slots in order (rank 0..N-1 on the first "
          "host); to spread ranks over hosts give each fewer slots, e.g. -H a:1,b:1");
    } else if (unit != "slot") {
      return absl::InvalidArgumentError(
          absl::StrCat("--map-by ", *options.map_by,
                       " is not one of slot, core, socket (trainrun maps by "
                       "slot; core and socket bind each rank to one)"));
    }
  }
  if (options.bind_to) {
    absl::StatusOr<launcher::BindTo> bind_to = launcher::ParseBindTo(*options.bind_to);
    if (!bind_to.ok()) return bind_to.status();
    spec.bind_to = *bind_to;
  }
  spec.report_bindings = options.report_bindings;
  spec.oversubscribe = options.oversubscribe;
  if (options.wdir) {
    if (options.wdir->empty()) return absl::InvalidArgumentError("-wdir needs a directory name");
    // Relative to trainrun's directory, and the same path on every host.
    spec.working_dir = std::filesystem::absolute(*options.wdir).lexically_normal().string();
  }
  return absl::OkStatus();
}

// MXNet's --sync-dst-dir, with --sync-src-dir and --sync-exclude: the copy before the ranks start,
// and DIR as their directory on every host. After ApplyPlacement (-wdir) and the per-node spec.
absl::Status ApplySync(const RunOptions& options, launcher::LaunchSpec& spec) {
  if (!options.sync_dst_dir) {
    if (options.sync_src_dir || !options.sync_excludes.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          options.sync_src_dir ? "--sync-src-dir" : "--sync-exclude",
          " is for --sync-dst-dir, which copies the directory; add --sync-dst-dir DIR"));
    }
    return absl::OkStatus();
  }
  const std::string& dst = *options.sync_dst_dir;
  if (dst.empty() || dst[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("--sync-dst-dir '", dst,
                     "' is not an absolute path; give the directory the same way for every host, "
                     "e.g. /tmp/job"));
  }
  if (options.wdir) {
    return absl::InvalidArgumentError(
        "--sync-dst-dir and -wdir both set the ranks' directory; give one of them");
  }
  if (spec.per_node) {
    return absl::InvalidArgumentError(
        "--sync-dst-dir copies to the hosts a trainrun reaches (-H, a hostfile, Slurm, "
        "--rsh-agent); in per-node mode (--nnodes) each node's trainrun starts where it runs, so "
        "copy the files before starting them");
  }
  if (spec.elastic) {
    return absl::InvalidArgumentError(
        "--sync-dst-dir does not work with --min-np yet: hosts that join an elastic job later "
        "would not get the files; copy them beforehand");
  }
  launcher::LaunchSpec::Sync sync;
  std::error_code error;
  const std::filesystem::path src =
      std::filesystem::absolute(options.sync_src_dir.value_or("."), error).lexically_normal();
  sync.src_dir = src.string();
  if (sync.src_dir.size() > 1 && sync.src_dir.back() == '/') sync.src_dir.pop_back();
  if (!std::filesystem::is_directory(src, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--sync-src-dir '", options.sync_src_dir.value_or("."), "' ",
                     std::filesystem::exists(src, error) ? "is not a directory" : "does not exist",
                     "; give the directory to copy to the hosts"));
  }
  sync.dst_dir = std::filesystem::path(dst).lexically_normal().string();
  if (sync.dst_dir.size() > 1 && sync.dst_dir.back() == '/') sync.dst_dir.pop_back();
  sync.excludes = options.sync_excludes;
  spec.working_dir = sync.dst_dir;
  spec.sync = std::move(sync);
  return absl::OkStatus();
}

// torchrun's Std value (0 none, 1 stdout, 2 stderr, 3 both) of --tee or --redirects.
absl::StatusOr<int> ParseStd(const char* flag, const std::optional<std::string>& text) {
  if (!text) return 0;
  int value = -1;
  if (absl::SimpleAtoi(*text, &value) && value >= 0 && value <= 3) return value;
  if (text->find(':') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", *text,
                     ": per-local-rank values are torchrun's; trainrun takes one value for "
                     "every rank: 0 none, 1 stdout, 2 stderr, 3 both"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " ", *text, " is not one of 0 (none), 1 (stdout), 2 (stderr), 3 (both)"));
}

// torchrun's --log-dir, --tee and --redirects.
absl::Status ApplyTorchrunOutput(const RunOptions& options, launcher::LaunchSpec& spec) {
  absl::StatusOr<int> tee = ParseStd("--tee", options.tee);
  if (!tee.ok()) return tee.status();
  absl::StatusOr<int> redirects = ParseStd("--redirects", options.redirects);
  if (!redirects.ok()) return redirects.status();
  if (!options.log_dir) {
    if (*tee != 0 || *redirects != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(*tee != 0 ? "--tee" : "--redirects",
                       " writes the ranks' output to files: give --log-dir DIR for them"));
    }
    return absl::OkStatus();
  }
  if (options.log_dir->empty()) return absl::InvalidArgumentError("--log-dir needs a directory");
  spec.log_dir = std::filesystem::absolute(*options.log_dir).lexically_normal().string();
  // --log-dir alone: both streams to the files and the console.
  spec.tee = options.tee || options.redirects ? *tee : 3;
  spec.redirects = *redirects;
  return absl::OkStatus();
}

// A .py that is not executable runs with python3, as torchrun does (unless --no-python): the
// command becomes `python3 train.py ...`, and python3 is looked up on the job's PATH like any
// command. Returns the note to print, or "".
std::string RunPythonScriptWithPython(const RunOptions& options,
                                      std::vector<std::string>& command) {
  if (options.no_python || command.empty() || !absl::EndsWith(command[0], ".py")) return "";
  std::filesystem::path script = command[0];
  if (options.wdir && script.is_relative()) script = std::filesystem::path(*options.wdir) / script;
  struct stat st {};
  if (::stat(script.c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
      ::access(script.c_str(), X_OK) == 0) {
    return "";  // not here (another host's, or a typo the exec reports), or executable
  }
  // The interpreter trainrun's own Python package is for, when known (a `python3` first on PATH
  // may be another, without it); else the first python3 on the job's PATH, as torchrun does.
  if (std::string python = launcher::PackagePython(); !python.empty()) {
    command.insert(command.begin(), python);
    return absl::StrCat(command[1], " is not executable: running it as `", python, " ", command[1],
                        "` (the interpreter trainrun's Python package is for); --no-python runs "
                        "the command as given");
  }
  command.insert(command.begin(), "python3");
  return absl::StrCat(command[1], " is not executable: running it as `python3 ", command[1],
                      "` (the first python3 on the job's PATH), as torchrun does; --no-python "
                      "runs the command as given");
}

// MakeElasticSpec reads --min-np, --max-np and --elastic-timeout: unset without --min-np (the
// other two alone are an error), else checked against the job's `np` ranks.
absl::StatusOr<std::optional<launcher::ElasticSpec>> MakeElasticSpec(const RunOptions& options,
                                                                     int np, bool per_node) {
  if (!options.min_np) {
    if (options.slots_per_host || options.reset_limit ||
        !options.blacklist_cooldown_range.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          options.slots_per_host ? "--slots-per-host"
          : options.reset_limit  ? "--reset-limit"
                                 : "--blacklist-cooldown-range",
          " is for elastic jobs, which --min-np makes; add --min-np N (the fewest ranks the job "
          "may go on with)"));
    }
    if (options.max_np || options.elastic_timeout_s) {
      return absl::InvalidArgumentError(absl::StrCat(
          options.max_np ? "--max-np" : "--elastic-timeout",
          " is for elastic jobs, which --min-np makes; add --min-np N (the fewest ranks the job "
          "may go on with)"));
    }
    return std::nullopt;
  }
  launcher::ElasticSpec elastic;
  elastic.min_np = *options.min_np;
  if (options.host_discovery_script) elastic.discovery_script = *options.host_discovery_script;
  if (options.slots_per_host) elastic.slots_per_host = *options.slots_per_host;
  if (options.reset_limit) elastic.reset_limit = *options.reset_limit;
  if (!options.blacklist_cooldown_range.empty()) {
    const std::vector<int>& range = options.blacklist_cooldown_range;
    if (!options.host_discovery_script) {
      return absl::InvalidArgumentError(
          "--blacklist-cooldown-range is for jobs with --host-discovery-script: a blacklisted "
          "host is one the script may list again");
    }
    if (range.size() != 2) {
      return absl::InvalidArgumentError(
          "--blacklist-cooldown-range takes two numbers of seconds, MIN and MAX");
    }
    if (range[0] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--blacklist-cooldown-range ", range[0], " ", range[1], ": MIN ", range[0],
                       " is below 1 s; a failing host needs some cooldown"));
    }
    if (range[1] > 7 * 24 * 3600) {
      return absl::InvalidArgumentError(absl::StrCat("--blacklist-cooldown-range ", range[0], " ",
                                                     range[1], ": MAX ", range[1],
                                                     " is above a week (604800 s)"));
    }
    if (range[0] > range[1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("--blacklist-cooldown-range ", range[0], " ", range[1], ": MIN ", range[0],
                       " is more than MAX ", range[1], "; give the shorter cooldown first"));
    }
    elastic.blacklist_cooldown =
        std::make_pair(std::chrono::seconds(range[0]), std::chrono::seconds(range[1]));
  }
  elastic.max_np = options.max_np.value_or(np);
  if (options.elastic_timeout_s) elastic.timeout = std::chrono::seconds(*options.elastic_timeout_s);
  if (elastic.min_np > np) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--min-np ", elastic.min_np, " is more than the job's ", np, " ranks; give at most -np"));
  }
  if (elastic.max_np < np) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-np ", elastic.max_np, " is less than the job's ", np, " ranks; give at least -np"));
  }
  if (options.max_restarts > 0) {
    return absl::InvalidArgumentError(
        "--max-restarts and --min-np are two ways to survive a failure (restart all ranks, or go "
        "on with the survivors); give one");
  }
  if (per_node) {
    return absl::InvalidArgumentError(
        "--min-np does not work with --nnodes: run the elastic job from one trainrun with -H");
  }
  return elastic;
}

}  // namespace

EnvironmentLookup ProcessEnvironment() {
  return [](const std::string& name) { return env::Lookup(name.c_str()); };
}

bool IsValidVariableName(const std::string& name) {
  if (name.empty() || absl::ascii_isdigit(static_cast<unsigned char>(name[0]))) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

namespace {

// SplitAgentCommand splits --rsh-agent's text into words at blanks, keeping quoted parts whole.
absl::StatusOr<std::vector<std::string>> SplitAgentCommand(const std::string& text) {
  absl::StatusOr<std::vector<std::string>> words = SplitShellWords(text);
  if (!words.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rsh-agent '", text, "' ", words.status().message()));
  }
  if (words->empty()) {
    return absl::InvalidArgumentError(
        "--rsh-agent is empty; give the remote shell's command, e.g. --rsh-agent 'qrsh -inherit'");
  }
  return words;
}

// ApplyRshAgent: --rsh-agent (or TRAINRUN_RSH_AGENT) names the remote shell; with --launcher auto
// it is the way hosts are reached, --launcher rsh needs one.
absl::Status ApplyRshAgent(const RunOptions& options, const EnvironmentLookup& env,
                           launcher::LaunchSpec& spec) {
  std::optional<std::string> agent = options.rsh_agent;
  if (!agent) agent = env(env::kRshAgent);
  // Grid Engine: inside a parallel job (its hosts from $PE_HOSTFILE) the hosts are reached with
  // `qrsh -inherit`, so the scheduler accounts for the ranks and kills them with the job.
  const bool sge_hosts = !options.hosts && !options.hostfile && !options.per_node.nnodes &&
                         !env(env::kSlurmJobNodelist) && env(env::kSgePeHostfile).has_value();
  if (options.launcher == "sge" ||
      (!agent && spec.launcher == launcher::Launcher::kAuto && sge_hosts)) {
    spec.rsh_agent = {"qrsh", "-inherit"};
    spec.launcher = launcher::Launcher::kRsh;
    return absl::OkStatus();
  }
  if (!agent) {
    if (spec.launcher == launcher::Launcher::kRsh) {
      return absl::InvalidArgumentError(
          "--launcher rsh needs the remote shell: --rsh-agent CMD (or TRAINRUN_RSH_AGENT), e.g. "
          "--rsh-agent 'qrsh -inherit'");
    }
    return absl::OkStatus();
  }
  if (spec.launcher != launcher::Launcher::kAuto && spec.launcher != launcher::Launcher::kRsh) {
    if (!options.rsh_agent) return absl::OkStatus();  // the variable yields to an explicit choice
    return absl::InvalidArgumentError(
        absl::StrCat("--rsh-agent names a remote shell, but --launcher ", options.launcher,
                     " reaches hosts otherwise; drop one of them"));
  }
  absl::StatusOr<std::vector<std::string>> words = SplitAgentCommand(*agent);
  if (!words.ok()) return words.status();
  spec.rsh_agent = *std::move(words);
  spec.launcher = launcher::Launcher::kRsh;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<launcher::LaunchSpec> MakeLaunchSpec(const RunOptions& options,
                                                    const EnvironmentLookup& env) {
  if (options.command.empty()) {
    return absl::InvalidArgumentError(
        "no command to run; put it after the flags, e.g. trainrun -np 4 python train.py");
  }
  // Per-node mode first: it decides the plan (the whole job's), and --nproc-per-node alone is -np.
  PerNodeFacts facts{options.num_proc, options.hosts || options.hostfile,
                     options.rendezvous_port != 0 || !options.rendezvous_addr.empty(),
                     options.launcher, env};
  absl::StatusOr<PerNodeResult> per_node = MakePerNodeSpec(options.per_node, facts);
  if (!per_node.ok()) return per_node.status();
  absl::StatusOr<hostfile::SlotPlan> plan;
  if (per_node->spec) {
    plan = PerNodePlan(*per_node->spec);
    if (!plan.ok()) return plan.status();
  } else {
    RunOptions planned = options;
    planned.num_proc = per_node->num_proc;
    absl::StatusOr<Hosts> hosts = ResolveHosts(planned, env);
    if (!hosts.ok()) return hosts.status();
    if (options.host_discovery_script) {
      // Every discovered slot, up to --max-np, as Horovod starts them; -np is how many the job
      // needs (the start fails with fewer), and without --max-np also the most.
      int total = 0;
      for (const hostfile::HostSpec& host : hosts->hosts) total += host.slots;
      if (!planned.num_proc) {
        planned.num_proc = options.max_np ? std::min(total, *options.max_np) : total;
      } else if (options.max_np) {
        planned.num_proc = std::max(*planned.num_proc, std::min(total, *options.max_np));
      }
    }
    // A discovery script's hosts keep their names: the script's later runs are compared by name.
    if (!options.host_discovery_script) MergeNamesOfThisMachine(hosts->hosts);
    plan = hostfile::PlanSlots(hosts->hosts, planned.num_proc);
    if (!plan.ok()) return BadInput(hosts->source, plan.status());
  }
  absl::StatusOr<std::vector<launcher::ExportedVariable>> exported = ParseExports(options.exports);
  if (!exported.ok()) return exported.status();
  if (options.output_filename && options.output_filename->empty()) {
    return absl::InvalidArgumentError("--output-filename needs a directory name");
  }

  launcher::LaunchSpec spec;
  spec.plan = *std::move(plan);
  spec.command = options.command;
  if (std::string note = RunPythonScriptWithPython(options, spec.command);
      !note.empty() && !options.quiet) {
    spdlog::info("{}", note);
  }
  if (absl::Status output = ApplyTorchrunOutput(options, spec); !output.ok()) return output;
  spec.exported = *std::move(exported);
  spec.output_dir = options.output_filename;
  spec.tag_output = options.tag_output;
  spec.prefix_timestamp = options.prefix_timestamp;
  spec.stdout_pty = options.pty;
  spec.rendezvous_tls = options.tls;
  spec.assign_gpus = options.assign_gpus;
  // horovodrun's knobs that trainrun has (JobEnvironment tells the ranks; an explicit -x wins).
  spec.tcp = options.tcp;
  if (options.fusion_threshold_mb) {
    spec.fusion_threshold_bytes = static_cast<int64_t>(*options.fusion_threshold_mb * 1024 * 1024);
  }
  if (absl::Status checked = CheckSettings(spec.exported, env); !checked.ok()) return checked;
  {
    std::optional<int64_t> warning_flag;
    std::string warning_text;
    if (options.stall_warning_s) {
      warning_flag = *options.stall_warning_s;
      warning_text = absl::StrCat("--stall-check-warning-time-seconds ", *warning_flag);
    }
    if (options.no_stall_check) warning_flag = 0, warning_text = "--no-stall-check";
    absl::StatusOr<int64_t> warning =
        ActedOn(env::kStallWarningSeconds, warning_flag, warning_text, spec.exported, env);
    if (!warning.ok()) return warning.status();
    std::optional<int64_t> shutdown_flag;
    std::string shutdown_text;
    if (options.stall_shutdown_s) {
      shutdown_flag = *options.stall_shutdown_s;
      shutdown_text = absl::StrCat("--stall-check-shutdown-time-seconds ", *shutdown_flag);
    }
    absl::StatusOr<int64_t> shutdown =
        ActedOn(env::kStallShutdownSeconds, shutdown_flag, shutdown_text, spec.exported, env);
    if (!shutdown.ok()) return shutdown.status();
    spec.stall_warning = std::chrono::seconds(*warning);
    spec.stall_shutdown = std::chrono::seconds(*shutdown);
    if (spec.stall_shutdown.count() > 0 && spec.stall_warning.count() > 0 &&
        spec.stall_shutdown < spec.stall_warning) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stall-check-shutdown-time-seconds ", spec.stall_shutdown.count(),
                       " is less than the warning time ", spec.stall_warning.count(),
                       "; give a shutdown time at least as long"));
    }
    if (spec.stall_shutdown.count() > 0 && spec.stall_warning.count() == 0) {
      // The shutdown needs the ranks' reports, which the warning time starts.
      spec.stall_warning = spec.stall_shutdown;
    }
  }
  if (!options.monitor.empty()) {
    if (absl::Status checked = launcher::CheckMonitorAddress(options.monitor); !checked.ok()) {
      return checked;
    }
    spec.monitor = options.monitor;
  }
  if (options.straggler_threshold) spec.straggler_threshold = *options.straggler_threshold / 100;
  if (options.straggler_window_s) {
    spec.straggler_window = std::chrono::seconds(*options.straggler_window_s);
  }
  if (absl::Status placed = ApplyPlacement(options, spec); !placed.ok()) return placed;
  spec.start_timeout = std::chrono::seconds(options.start_timeout_s);
  spec.dry_run = options.dry_run;
  spec.dry_run_probe = !options.no_probe;
  spec.verbose = options.verbose;
  spec.quiet = options.quiet;
  spec.network_interfaces = options.network_interfaces;
  spec.rendezvous_port = options.rendezvous_port;
  spec.rendezvous_addr = options.rendezvous_addr;
  spec.ssh_port = options.ssh_port;
  spec.ssh_identity_file = options.ssh_identity_file;
  absl::StatusOr<launcher::SshClient> client = launcher::ParseSshClient(options.ssh_client);
  if (!client.ok()) return client.status();
  spec.ssh_client = *client;
  absl::StatusOr<launcher::HostKeyPolicy> policy =
      launcher::ParseHostKeyPolicy(options.ssh_host_key_checking);
  if (!policy.ok()) return policy.status();
  spec.ssh_host_key_checking = *policy;
  spec.remote_trainrun = options.remote_trainrun;
  absl::StatusOr<launcher::Launcher> how =
      launcher::ParseLauncher(options.launcher == "sge" ? "rsh" : options.launcher);
  if (!how.ok()) return how.status();
  spec.launcher = *how;
  if (absl::Status rsh = ApplyRshAgent(options, env, spec); !rsh.ok()) return rsh;
  spec.max_restarts = options.max_restarts;
  absl::StatusOr<std::optional<launcher::ElasticSpec>> elastic =
      MakeElasticSpec(options, spec.plan.size(), per_node->spec.has_value());
  if (!elastic.ok()) return elastic.status();
  spec.elastic = *elastic;
  if (per_node->spec && per_node->spec->min_nnodes > 0 &&
      per_node->spec->min_nnodes < per_node->spec->nnodes && spec.max_restarts == 0) {
    // --nnodes MIN:MAX is an elastic job: nodes that join later are grown onto, a node that leaves
    // is a membership change while MIN remain (trainrun's elastic API re-forms without a restart).
    launcher::ElasticSpec range;
    range.min_nodes = per_node->spec->min_nnodes;
    range.max_np = per_node->spec->nnodes * hostfile::kMaxSlotsPerHost;
    spec.elastic = range;
  }
  if (per_node->spec) {
    // Node 0 serves the job's rendezvous at the endpoint's address (where every node reaches it),
    // on a port of its own: the endpoint's port stays the join port for the whole job, so that a
    // node started twice hears at once that its node rank has joined.
    spec.per_node = per_node->spec;
    spec.rendezvous_addr = per_node->spec->endpoint_host;
    spec.rendezvous_port = 0;
  }
  if (absl::Status synced = ApplySync(options, spec); !synced.ok()) return synced;
  spec.hosts_from_slurm = !per_node->spec && !options.hosts && !options.hostfile &&
                          options.launcher != "local" && env(env::kSlurmJobNodelist).has_value();
  if (spec.launcher == launcher::Launcher::kLocal) {
    for (const HostSpec& host : spec.plan.hosts) {
      if (!launcher::IsLocalHost(host.host)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--launcher local runs every rank on this host, but host ", host.host,
                         " is another one; drop it from the hosts or use --launcher ssh"));
      }
    }
  }
  return spec;
}

}  // namespace trainrun::cli
