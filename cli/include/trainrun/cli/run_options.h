// The `trainrun` command line: one options struct, the CLI11 setup that fills it, and the parse
// step that also takes the worker command (everything after trainrun's flags, or after `--`).
//
//   CLI::App app;
//   trainrun::cli::RunOptions options;
//   trainrun::cli::SetupRunOptions(app, options);
//   auto outcome = trainrun::cli::ParseRunArgs(app, {"-np", "4", "python", "train.py"}, options);
//   // options.num_proc == 4, options.command == {"python", "train.py"}
//
// Flags follow horovodrun's names (-np, -H, --hostfile, --start-timeout, --output-filename,
// --network-interface, -p/--ssh-port, -i/--ssh-identity-file, ...) and mpirun's -x.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainrun/cli/foreign_flags.h"
#include "trainrun/cli/per_node_options.h"
#include "trainrun/launcher/launch_spec.h"

namespace trainrun::cli {

// RunOptions is every flag of `trainrun`, as typed; MakeLaunchSpec checks and resolves them. Its
// defaults are the LaunchSpec's (trainrun/launcher/launch_spec.h), stated there once.
struct RunOptions {
  std::optional<int> num_proc;                 // -np/--num-proc
  std::optional<std::string> hosts;            // -H/--hosts, unparsed
  std::optional<std::string> hostfile;         // --hostfile
  std::vector<std::string> exports;            // -x NAME[=value], repeatable, unparsed
  std::optional<std::string> output_filename;  // --output-filename DIR
  bool tag_output = true;                      // --tag-output / --no-tag-output
  bool prefix_timestamp = false;               // --prefix-timestamp
  bool pty = true;                             // --pty / --no-pty
  bool tls = true;                             // --tls / --no-tls
  bool assign_gpus = false;                    // --assign-gpus
  std::optional<int> stall_warning_s;          // --stall-check-warning-time-seconds
  std::optional<int> stall_shutdown_s;         // --stall-check-shutdown-time-seconds
  bool no_stall_check = false;                 // --no-stall-check
  std::string monitor;                         // --monitor [ADDR:]PORT
  std::optional<double> straggler_threshold;   // --straggler-threshold PERCENT
  std::optional<int> straggler_window_s;       // --straggler-window SECONDS
  std::optional<double> fusion_threshold_mb;   // --fusion-threshold-mb (horovodrun)
  bool tcp = false;                            // --tcp (horovodrun): TCP even within a host
  std::optional<std::string> config_file;      // --config-file (horovodrun's YAML, a job file)
  // mpirun's placement flags (--bind-to, --map-by, --report-bindings, -wdir, --oversubscribe,
  // --display-map).
  std::optional<std::string> bind_to;  // --bind-to core|socket|none
  std::optional<std::string> map_by;   // --map-by slot|core|socket
  bool report_bindings = false;        // --report-bindings
  std::optional<std::string> wdir;     // -wdir/--wdir DIR
  bool oversubscribe = false;          // --oversubscribe
  bool display_map = false;            // --display-map: the plan, then the job
  // torchrun's output flags (--no-python, --log-dir, --tee, --redirects), as typed.
  bool no_python = false;                // --no-python
  std::optional<std::string> log_dir;    // --log-dir DIR
  std::optional<std::string> tee;        // --tee 0-3
  std::optional<std::string> redirects;  // --redirects 0-3
  // horovodrun's flags that trainrun accepts but that change nothing here: one line each, why.
  std::vector<std::string> notes;
  int start_timeout_s =  // --start-timeout SECONDS
      static_cast<int>(launcher::kDefaultStartTimeout.count());
  int max_restarts = 0;                              // --max-restarts N
  std::optional<int> min_np;                         // --min-np N (Horovod elastic)
  std::optional<int> max_np;                         // --max-np N
  std::optional<std::string> host_discovery_script;  // --host-discovery-script SCRIPT
  std::optional<int> slots_per_host;                 // --slots-per-host N
  std::optional<int> reset_limit;                    // --reset-limit N
  std::vector<int> blacklist_cooldown_range;         // --blacklist-cooldown-range MIN MAX
  std::optional<int> elastic_timeout_s;              // --elastic-timeout SECONDS
  bool verbose = false;                              // --verbose
  bool quiet = false;                                // -q/--quiet: no start line, no notes
  std::optional<std::string> log_level;              // --log-level
  bool dry_run = false;                              // --dry-run
  bool no_probe = false;                             // --no-probe: the plan alone
  int rendezvous_port = 0;                           // --rendezvous-port
  std::string rendezvous_addr;                       // --rendezvous-addr
  std::vector<std::string> network_interfaces;       // --network-interface(s)
  std::optional<int> ssh_port;                       // -p/--ssh-port
  std::optional<std::string> ssh_identity_file;      // -i/--ssh-identity-file
  std::string ssh_client =                           // --ssh-client libssh2|openssh
      std::string(launcher::SshClientName(launcher::kDefaultSshClient));
  std::string ssh_host_key_checking =  // --ssh-strict-host-key-checking
      std::string(launcher::HostKeyPolicyName(launcher::kDefaultHostKeyPolicy));
  std::string remote_trainrun;           // --remote-trainrun PATH
  std::string launcher = "auto";         // --launcher auto|ssh|slurm|rsh|local
  std::optional<std::string> rsh_agent;  // --rsh-agent CMD
  // MXNet's launch.py: copy a directory to every host before the ranks start there.
  std::optional<std::string> sync_dst_dir;  // --sync-dst-dir DIR
  std::optional<std::string> sync_src_dir;  // --sync-src-dir SRC
  std::vector<std::string> sync_excludes;   // --sync-exclude PATTERN, repeatable
  std::vector<std::string> command;         // the worker command and its arguments

  // Per-node mode (--nnodes, --node-rank, --rdzv-endpoint, ...): per_node_options.h.
  PerNodeOptions per_node;
};

// SetupRunOptions declares trainrun's flags, help text and examples on `app`, bound to `options`
// (which must outlive `app`'s parsing).
void SetupRunOptions(CLI::App& app, RunOptions& options);

// ParseOutcome says what the user asked for.
enum class ParseOutcome {
  kRun,      // options are filled; start (or dry-run) the job
  kHelp,     // print app.help()
  kVersion,  // print the version
};

// ParseRunArgs parses `args` (argv without argv[0]) into the `options` SetupRunOptions bound to
// `app`. The spellings mpirun, torchrun and horovodrun users type (`-np 4`, `-host a:2`,
// `--standalone`, `-mca plm_rsh_agent CMD`) are read through the compatibility table
// (foreign_flags.h), and `env` (may be empty) gives flags from torchrun's PET_* variables and the
// like. Errors (InvalidArgument, one sentence): any flag error, an unknown flag before the command
// (never help: `-host` is not `-h`), no command.
absl::StatusOr<ParseOutcome> ParseRunArgs(CLI::App& app, std::vector<std::string> args,
                                          RunOptions& options, const EnvLookup& env = {});

}  // namespace trainrun::cli
