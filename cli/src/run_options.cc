#include "trainrun/cli/run_options.h"

#include <algorithm>
#include <filesystem>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "trainrun/cli/config_file.h"
#include "trainrun/cli/foreign_flags.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::cli {
namespace {

constexpr char kFooter[] = R"(Examples:
  trainrun -np 4 python train.py                      # 4 ranks on this host
  trainrun -np 8 -H server1:4,server2:4 python train.py
  trainrun --hostfile hosts.txt python train.py       # every slot of the hostfile
  trainrun -np 2 -x NCCL_DEBUG=INFO -x PATH -- ./worker --flag
  trainrun --dry-run -H a:2,b:2 python train.py       # print the plan, start nothing

Hosts: -H and hostfiles take host, host:slots, user@host:slots and [ipv6]:slots; hostfiles also
`host slots=N [max_slots=M]`. Inside a Slurm allocation, with neither -H nor --hostfile, the hosts
are the allocation's. Without any of these, all ranks run on this host.
)";

// SettingsHelp is the help's section on settings, made from their declarations (env::kSettings):
// one line each, `NAME=DEFAULT (who reads it) meaning`, so that the man page lists them too.
std::string SettingsHelp() {
  std::string text =
      "\nSettings:\n  Environment variables; -x NAME=VALUE gives one to the ranks, and trainrun "
      "acts "
      "on the value it gives.\n";
  for (const env::SettingRef& setting : env::kSettings) {
    const char* side = setting.side() == env::Side::kRank       ? "ranks"
                       : setting.side() == env::Side::kTrainrun ? "trainrun"
                                                                : "trainrun and ranks";
    absl::StrAppend(&text, "  ", setting.name(), "=", setting.DefaultText(), "  (", side, ") ",
                    setting.meaning(), "\n");
  }
  return text;
}

// mpirun's placement flags: where each local rank runs, and in which directory.
void SetupMpirunPlacement(CLI::App& app, RunOptions& options) {
  CLI::Option_group* mpirun = app.add_option_group("mpirun compatibility");
  mpirun
      ->add_option("--bind-to", options.bind_to,
                   "Pin each local rank to CPUs: core (one core each, disjoint while ranks <= "
                   "cores), socket (one socket each), none (default: as trainrun's affinity).")
      ->type_name("WHAT")
      ->transform(CLI::IsMember({"core", "socket", "none"}, CLI::ignore_case));
  mpirun
      ->add_option("--map-by", options.map_by,
                   "slot (ranks fill each host's slots in order, as always); core or socket "
                   "also bind to that unit unless --bind-to says otherwise.")
      ->type_name("WHAT");
  mpirun->add_flag("--report-bindings", options.report_bindings,
                   "Print one line per rank with the CPUs it is bound to.");
  mpirun
      ->add_option("--wdir", options.wdir,
                   "The ranks' working directory on every host (also -wdir, -wd; default: "
                   "trainrun's own).")
      ->type_name("DIR");
  mpirun->add_flag("--oversubscribe", options.oversubscribe,
                   "More ranks than cores on a host is intended: no warning.");
  mpirun->add_flag("--display-map", options.display_map,
                   "Print the plan (as --dry-run), then run the job.");
}

// torchrun's output flags (--no-python, --log-dir, --tee, --redirects). torchrun's per-node flags
// (--nproc-per-node, --nnodes, --rdzv-*) are declared elsewhere, not here.
void SetupTorchrunOutput(CLI::App& app, RunOptions& options) {
  CLI::Option_group* torchrun = app.add_option_group("torchrun compatibility");
  torchrun->add_flag("--no-python,--no_python", options.no_python,
                     "Run the command as given (a .py is not run with python3).");
  torchrun
      ->add_option("--log-dir,--log_dir", options.log_dir,
                   "Write each rank's output to DIR/<rank>/stdout.log and stderr.log (both "
                   "streams, also on the console, unless --tee or --redirects say otherwise).")
      ->type_name("DIR");
  torchrun
      ->add_option("-t,--tee", options.tee,
                   "Streams to write to --log-dir's files and the console: 0 none, 1 stdout, 2 "
                   "stderr, 3 both.")
      ->type_name("0-3");
  torchrun
      ->add_option("-r,--redirects", options.redirects,
                   "Streams to write to --log-dir's files only, not the console: 0 none, 1 "
                   "stdout, 2 stderr, 3 both.")
      ->type_name("0-3");
}

// HelpFormatter is CLI11's help without its internals: the usage line names the command
// (`trainrun [OPTIONS] COMMAND [ARGS...]`), a negatable flag is not shown with its "{false}",
// and a value's range check ("SECONDS:INT in [0 - 86400]") is left to the description. Choices
// ("WHAT:{core,socket,none}") stay: they are what the value may be (and what completion offers).
class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App* app, std::string name) const override {
    (void)app;
    return absl::StrCat(get_label("Usage"), ": ", name, " [OPTIONS] COMMAND [ARGS...]\n");
  }
  std::string make_option_name(const CLI::Option* option, bool positional) const override {
    std::string name = CLI::Formatter::make_option_name(option, positional);
    for (const char* internal : {"{false}", "{true}"}) {
      for (size_t at; (at = name.find(internal)) != std::string::npos;) {
        name.erase(at, std::string(internal).size());
      }
    }
    return name;
  }
  std::string make_option_opts(const CLI::Option* option) const override {
    std::string opts = CLI::Formatter::make_option_opts(option);
    // ":INT in [0 - 86400]", ":FLOAT in [...]", ":POSITIVE": a check, not the value's name.
    size_t colon = opts.find(':');
    if (colon != std::string::npos && colon + 1 < opts.size() && opts[colon + 1] != '{') {
      size_t end = opts.find_first_of("=", colon);
      if (end == std::string::npos) end = opts.find(" ...", colon);
      opts.erase(colon, end == std::string::npos ? std::string::npos : end - colon);
    }
    return opts;
  }
};

// ParseOnce parses `args` (aliases rewritten) into `options`; the command may come out empty.
absl::StatusOr<ParseOutcome> ParseOnce(CLI::App& app, std::vector<std::string> args,
                                       RunOptions& options) {
  std::reverse(args.begin(), args.end());  // CLI11 takes the vector back to front
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    return ParseOutcome::kHelp;
  } catch (const CLI::CallForAllHelp&) {
    return ParseOutcome::kHelp;
  } catch (const CLI::CallForVersion&) {
    return ParseOutcome::kVersion;
  } catch (const CLI::ParseError& e) {
    return absl::InvalidArgumentError(absl::StrCat(e.what(), "; see trainrun --help"));
  }

  // prefix_command leaves everything from the first word it does not know: the command, after
  // an explicit `--` if the user wrote one. An unknown flag before the command lands here too.
  std::vector<std::string> command = app.remaining();
  bool explicit_separator = !command.empty() && command.front() == "--";
  if (explicit_separator) command.erase(command.begin());
  if (!explicit_separator && !command.empty() && command.front().size() > 1 &&
      command.front()[0] == '-') {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown flag '", command.front(),
        "'; see trainrun --help (a worker command that starts with '-' goes after --)"));
  }
  options.command = std::move(command);
  return ParseOutcome::kRun;
}

// MergeConfigFile parses again with --config-file's flags before the command line's (`args`, as
// parsed into `options` already): a flag given on the command line overrides the file's (-x
// adds to it); the file's command is used when the command line has none.
absl::StatusOr<ParseOutcome> MergeConfigFile(CLI::App& app, const std::vector<std::string>& args,
                                             RunOptions& options) {
  absl::StatusOr<ConfigFile> config = ReadConfigFile(*options.config_file);
  if (!config.ok()) return config.status();
  auto given = [&app](const std::string& flag) {
    const CLI::Option* option = app.get_option_no_throw(flag);
    return option != nullptr && option->count() > 0;
  };
  std::vector<std::string> merged;
  for (const std::vector<std::string>& flag : config->flags) {
    if (flag[0] != "-x" && given(flag[0])) continue;
    if (flag[0] == "--hosts" && given("--hostfile")) continue;
    merged.insert(merged.end(), flag.begin(), flag.end());
  }
  const bool command_given = !options.command.empty();
  std::vector<std::string> notes = config->notes;
  // The command line's flags (without its command), then the command.
  std::vector<std::string> flags = args;
  flags.resize(flags.size() - std::min(flags.size(), options.command.size()));
  if (!flags.empty() && flags.back() == "--") flags.pop_back();
  merged.insert(merged.end(), flags.begin(), flags.end());
  merged.push_back("--");
  if (command_given) {
    merged.insert(merged.end(), options.command.begin(), options.command.end());
  } else {
    merged.insert(merged.end(), config->command.begin(), config->command.end());
  }
  // The file's keys name horovodrun's flags, some of which are the compatibility table's.
  absl::StatusOr<Translation> translated = TranslateForeignFlags(app, std::move(merged), {});
  if (!translated.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(translated.status().message(), " (with --config-file's flags)"));
  }
  notes.insert(notes.end(), translated->notes.begin(), translated->notes.end());
  app.clear();
  options = RunOptions{};
  absl::StatusOr<ParseOutcome> outcome = ParseOnce(app, translated->args, options);
  if (!outcome.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(outcome.status().message(), " (with --config-file's flags)"));
  }
  options.notes.insert(options.notes.begin(), notes.begin(), notes.end());
  return outcome;
}

}  // namespace

void SetupRunOptions(CLI::App& app, RunOptions& options) {
  app.name("trainrun");
  app.description(
      "Start a distributed training job, one worker process per slot, and supervise it.");
  app.formatter(std::make_shared<HelpFormatter>());
  app.footer(absl::StrCat(kFooter, SettingsHelp(), "\n", CompatibilityHelp()));
  app.prefix_command();
  app.set_version_flag("-v,--version", absl::StrCat("trainrun ", TRAINRUN_VERSION));

  app.add_option("-n,--num-proc", options.num_proc,
                 "Number of ranks (also -np). Default: every slot of the hosts.")
      ->type_name("N");
  app.add_option("-H,--hosts", options.hosts,
                 "Hosts and their slots: host1:4,host2:4 (also user@host:N, [ipv6]:N).")
      ->type_name("LIST");
  app.add_option("--hostfile", options.hostfile,
                 "File listing hosts, one a line: `host slots=N` or `host:N` (also -hostfile).")
      ->type_name("FILE");
  app.add_option("-x", options.exports,
                 "Export NAME (from this environment) or NAME=value to every rank; repeatable.")
      ->type_name("NAME[=value]")
      ->allow_extra_args(false);
  // The timeline is written by the workers (collectives/src/timeline.h); all this flag does is
  // export TRAINRUN_TIMELINE, with the path made absolute against trainrun's directory.
  app.add_option_function<std::string>(
         "--timeline-filename",
         [&options](const std::string& path) {
           options.exports.push_back(std::string("TRAINRUN_TIMELINE=") +
                                     std::filesystem::absolute(path).string());
         },
         "Write a Chrome trace (chrome://tracing, Perfetto) of every rank's collectives to FILE.")
      ->type_name("FILE");
  app.add_option("--output-filename", options.output_filename,
                 "Also write each rank's output to DIR/rank.<N>/stdout and stderr.")
      ->type_name("DIR");
  app.add_flag("--tag-output,!--no-tag-output", options.tag_output,
               "Prefix worker lines with [rank]<stdout>: (default: on).");
  app.add_flag("--prefix-timestamp,--prefix-output-with-timestamp,--timestamp-output",
               options.prefix_timestamp, "Prefix worker lines with the time they arrived.");
  app.add_flag("--pty,!--no-pty", options.pty,
               "Give each rank's stdout a pseudo-terminal, so its lines arrive as it prints them "
               "(default: on; --no-pty: a pipe). stderr is always a pipe.");
  app.add_flag("--assign-gpus", options.assign_gpus,
               "One GPU per local rank through CUDA_VISIBLE_DEVICES (also TRAINRUN_ASSIGN_GPUS=1). "
               "Default: CUDA_VISIBLE_DEVICES is left as it is.");
  app.add_option("--stall-check-warning-time-seconds", options.stall_warning_s,
                 absl::StrCat("Warn when a collective has waited this long: which ranks wait in "
                              "it, which have not joined (default ",
                              env::kStallWarningSeconds.default_value, ", or ",
                              env::kStallWarningSeconds.name, "; 0: off)."))
      ->type_name("SECONDS")
      ->check(CLI::Range(0, 24 * 3600));
  app.add_option("--stall-check-shutdown-time-seconds", options.stall_shutdown_s,
                 absl::StrCat("End the job, naming the stalled ranks, when a collective has "
                              "waited this long (default ",
                              env::kStallShutdownSeconds.default_value, ": never, or ",
                              env::kStallShutdownSeconds.name, ")."))
      ->type_name("SECONDS")
      ->check(CLI::Range(0, 24 * 3600));
  app.add_flag("--no-stall-check", options.no_stall_check,
               "Turn the stall warning off (as --stall-check-warning-time-seconds 0).");
  app.add_option("--monitor", options.monitor,
                 "Serve a live page of the job (ranks, stragglers, timeline), /metrics for "
                 "Prometheus and `trainrun top` at [ADDR:]PORT (ADDR 127.0.0.1 unless given; off "
                 "loopback it asks for the token it prints).")
      ->type_name("[ADDR:]PORT");
  app.add_option("--straggler-threshold", options.straggler_threshold,
                 "Name a straggler when the other ranks wait for it more than this percent of "
                 "their time (default 10; 0: never).")
      ->type_name("PERCENT")
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--straggler-window", options.straggler_window_s,
                 "Seconds of collectives the straggler line looks at (default 10).")
      ->type_name("SECONDS")
      ->check(CLI::Range(1, 3600));
  app.add_option("--start-timeout", options.start_timeout_s,
                 "Seconds allowed for connecting to hosts and starting every rank.")
      ->type_name("SECONDS")
      ->check(CLI::Range(1, 24 * 3600))
      ->capture_default_str();
  app.add_option("--max-restarts,--max_restarts", options.max_restarts,
                 "When the job fails, start all of it again, up to N times (torchrun's flag); "
                 "ranks see TRAINRUN_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT.")
      ->type_name("N")
      ->check(CLI::Range(0, 1000));
  app.add_option("--min-np,--min_np", options.min_np,
                 "Elastic mode (Horovod's): a lost rank does not end the job while at least N "
                 "ranks remain; the survivors go on as a smaller job (trainrun.torch.elastic).")
      ->type_name("N")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-np,--max_np", options.max_np,
                 "Elastic mode: the most ranks the job may have (default: -np).")
      ->type_name("N")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--host-discovery-script,--host_discovery_script", options.host_discovery_script,
                 "Elastic mode: a script printing the hosts the job may use, one host or "
                 "host:slots a line; run to plan the job, then every second: a host that leaves "
                 "its output has its ranks stopped, and the job grows onto hosts and slots that "
                 "appear, up to --max-np (instead of -H or --hostfile).")
      ->type_name("SCRIPT");
  app.add_option("--slots-per-host,--slots_per_host", options.slots_per_host,
                 "Elastic mode: the slots of a discovered host whose line gives none (default 1).")
      ->type_name("N")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--reset-limit,--reset_limit", options.reset_limit,
                 "Elastic mode: the most membership changes the job survives; one more ends it "
                 "(default: no limit).")
      ->type_name("N")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--blacklist-cooldown-range,--blacklist_cooldown_range",
                 options.blacklist_cooldown_range,
                 "Elastic mode with --host-discovery-script: a host whose rank failed gets no new "
                 "ranks for MIN seconds, twice as long each later time up to MAX (default: never "
                 "again).")
      ->type_name("MIN MAX")
      ->expected(2)
      ->allow_extra_args(false);
  app.add_option("--elastic-timeout,--elastic_timeout", options.elastic_timeout_s,
                 absl::StrCat("Elastic mode: how long to wait for ranks when fewer than --min-np "
                              "remain (default ",
                              env::kDefaultElasticTimeoutSeconds, ")."))
      ->type_name("SECONDS")
      ->check(CLI::Range(1, 7 * 24 * 3600));
  app.add_flag("--verbose", options.verbose, "Print what trainrun does (log level debug).");
  app.add_flag("-q,--quiet", options.quiet,
               "No start line (\"8 ranks on 2 hosts started in 0.41 s\") and no notes; warnings "
               "and errors still print.");
  app.add_option("--log-level", options.log_level, "trainrun's own log level.")
      ->type_name("LEVEL")
      ->transform(CLI::IsMember({"trace", "debug", "info", "warning", "error", "critical", "off"},
                                CLI::ignore_case));
  app.add_flag("--dry-run", options.dry_run,
               "Print the plan (host, rank, local_rank, cross_rank, command), how each remote host "
               "is reached and the trainrun release found there; start no job.");
  app.add_flag("--no-probe", options.no_probe,
               "With --dry-run: the plan alone, at once; no remote host is asked which trainrun "
               "it has.");

  app.add_flag("--tls,!--no-tls", options.tls,
               "Run the job's rendezvous over TLS with a certificate made from the job's token, "
               "so the token never crosses the network (default: on; --no-tls: plain text, to "
               "debug).");
  app.add_option("--rendezvous-port", options.rendezvous_port,
                 "Port of the job's rendezvous server; 0 lets the kernel choose.")
      ->type_name("PORT")
      ->check(CLI::Range(0, 65535));
  app.add_option("--rendezvous-addr", options.rendezvous_addr,
                 "Address the rendezvous server binds and workers dial; default 127.0.0.1 for a "
                 "job on this host.")
      ->type_name("ADDR");

  CLI::Option_group* remote = app.add_option_group("Remote hosts");
  remote
      ->add_option_function<std::vector<std::string>>(
          "--network-interface,--network-interfaces",
          [&options](const std::vector<std::string>& values) {
            for (const std::string& value : values) {
              for (absl::string_view nic : absl::StrSplit(value, ',', absl::SkipEmpty())) {
                options.network_interfaces.emplace_back(nic);
              }
            }
          },
          "Network interface(s) for rendezvous and data traffic, e.g. eth0; repeatable.")
      ->type_name("NIC[,NIC]")
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  remote->add_option("-p,--ssh-port", options.ssh_port, "SSH port on every host.")
      ->type_name("PORT")
      ->check(CLI::Range(1, 65535));
  remote
      ->add_option("-i,--ssh-identity-file", options.ssh_identity_file,
                   "Private key to log in to the hosts with.")
      ->type_name("FILE")
      ->check(CLI::ExistingFile);
  remote
      ->add_option("--ssh-client", options.ssh_client,
                   "How to reach the hosts: libssh2 (in-process, default) or openssh (the system "
                   "`ssh`, for ProxyJump, certificates, Kerberos or RSA keys).")
      ->type_name("CLIENT")
      ->transform(CLI::IsMember({"libssh2", "openssh"}, CLI::ignore_case))
      ->capture_default_str();
  remote
      ->add_option("--ssh-strict-host-key-checking", options.ssh_host_key_checking,
                   "Host keys against ~/.ssh/known_hosts, as OpenSSH's StrictHostKeyChecking: yes "
                   "(must be known), accept-new (learn unknown hosts; default), no.")
      ->type_name("POLICY")
      ->transform(CLI::IsMember({"yes", "accept-new", "no"}, CLI::ignore_case))
      ->capture_default_str();
  remote
      ->add_option("--launcher", options.launcher,
                   "How other hosts are reached: auto (through Slurm, one srun step per node, "
                   "inside an allocation that gave the hosts; through --rsh-agent when given; "
                   "inside a Grid Engine job (PE_HOSTFILE), qrsh -inherit; else SSH), ssh, slurm, "
                   "sge (qrsh -inherit), rsh (--rsh-agent), or local (every rank on this host, "
                   "ignoring an allocation).")
      ->type_name("HOW")
      ->transform(CLI::IsMember({"auto", "ssh", "slurm", "sge", "rsh", "local"}, CLI::ignore_case))
      ->capture_default_str();
  remote
      ->add_option("--rsh-agent", options.rsh_agent,
                   "Reach each host with this remote shell instead of SSH: trainrun runs `CMD "
                   "HOST trainrun --agent` and speaks to the agent over its stdin and stdout "
                   "(mpirun's -mca plm_rsh_agent; also TRAINRUN_RSH_AGENT): qrsh -inherit, a "
                   "kubectl exec wrapper, ...")
      ->type_name("CMD");
  remote
      ->add_option("--remote-trainrun", options.remote_trainrun,
                   "Path of trainrun on the other hosts (default: this trainrun's own path).")
      ->type_name("PATH");
  remote
      ->add_option("--sync-dst-dir", options.sync_dst_dir,
                   "Copy --sync-src-dir to DIR on every host (only what changed since the last "
                   "copy, over the connection that reaches the host; .git left out), and start "
                   "the ranks in DIR (MXNet's launch.py flag).")
      ->type_name("DIR");
  remote
      ->add_option("--sync-src-dir", options.sync_src_dir,
                   "The directory --sync-dst-dir copies (default: trainrun's own).")
      ->type_name("SRC");
  remote
      ->add_option("--sync-exclude", options.sync_excludes,
                   "Leave out of the copy what matches PATTERN (a shell pattern: on each name, or "
                   "on the relative path when it has a '/'); repeatable.")
      ->type_name("PATTERN")
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);

  SetupMpirunPlacement(app, options);
  SetupTorchrunOutput(app, options);
  // torchrun's per-node mode: its own group and rules (per_node_options.h).
  SetupPerNodeOptions(app, options.per_node);

  // horovodrun's tuning flags that trainrun has a knob for; the others are in the compatibility
  // table (foreign_flags.h), which says, once, why they change nothing.
  CLI::Option_group* horovod = app.add_option_group("horovodrun compatibility");
  horovod
      ->add_option("--fusion-threshold-mb", options.fusion_threshold_mb,
                   "Tensor fusion buffer in MB (sets TRAINRUN_FUSION_BYTES for the ranks).")
      ->type_name("MB")
      ->check(CLI::Range(0.0, 1024.0 * 1024));
  horovod
      ->add_option("--config-file", options.config_file,
                   "horovodrun's YAML config (params, timeline, stall_check, ... as the flags of "
                   "the same names) or a job file (hosts, processes_per_host, num_proc, "
                   "environment, command); flags on the command line override it.")
      ->type_name("FILE");
  horovod->add_flag("--tcp", options.tcp,
                    "Use TCP between every pair of ranks, also within a host (sets "
                    "TRAINRUN_TRANSPORT=tcp).");
}

absl::StatusOr<ParseOutcome> ParseRunArgs(CLI::App& app, std::vector<std::string> args,
                                          RunOptions& options, const EnvLookup& env) {
  absl::StatusOr<Translation> translated = TranslateForeignFlags(app, std::move(args), env);
  if (!translated.ok()) return translated.status();
  args = std::move(translated->args);
  absl::StatusOr<ParseOutcome> outcome = ParseOnce(app, args, options);
  if (!outcome.ok() || *outcome != ParseOutcome::kRun) return outcome;
  if (options.config_file) {
    outcome = MergeConfigFile(app, args, options);
    if (!outcome.ok()) return outcome;
  }
  options.notes.insert(options.notes.end(), translated->notes.begin(), translated->notes.end());
  if (options.command.empty()) {
    return absl::InvalidArgumentError(
        "no command to run; put it after the flags, e.g. trainrun -np 4 python train.py");
  }
  return ParseOutcome::kRun;
}

}  // namespace trainrun::cli
