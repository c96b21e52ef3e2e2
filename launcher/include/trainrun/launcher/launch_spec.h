// LaunchSpec: everything the launcher needs to run one job, as the CLI parsed it.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainrun/hostfile/slot_plan.h"

namespace trainrun::launcher {

// ExportedVariable is one `-x NAME` (value taken from trainrun's environment) or `-x NAME=value`.
struct ExportedVariable {
  std::string name;
  std::optional<std::string> value;
};

struct LaunchSpec {
  hostfile::SlotPlan plan;
  // The worker command and its arguments, as typed after trainrun's own flags.
  std::vector<std::string> command;
  std::vector<ExportedVariable> exported;
  // --output-filename DIR: each rank's output also goes to DIR/rank.<N>/{stdout,stderr}.
  std::optional<std::string> output_dir;
  // Prefix worker lines with "[rank]<stdout>:" / "[rank]<stderr>:".
  bool tag_output = true;
  // Prefix worker lines with the time they arrived.
  bool prefix_timestamp = false;
  // Bound on connecting to hosts and starting ranks.
  std::chrono::seconds start_timeout{30};
  // Between SIGTERM and SIGKILL when the job is torn down.
  std::chrono::milliseconds grace_period{3000};
  // Print the plan, start nothing (the CLI prints it; Launch is not called).
  bool dry_run = false;
  bool verbose = false;

  // The job's rendezvous server (rendezvous/server.h). --rendezvous-port: the port it listens on;
  // 0 lets the kernel choose. --rendezvous-addr: the address it binds and workers dial; empty:
  // 127.0.0.1 when every rank is on this host.
  int rendezvous_port = 0;
  std::string rendezvous_addr;

  // Remote hosts (horovodrun's flags; the SSH launcher reads them).
  // --network-interface(s): interfaces for rendezvous and data-plane addresses; empty: automatic.
  std::vector<std::string> network_interfaces;
  // -p/--ssh-port: the SSH port on every host; unset: ssh's default.
  std::optional<int> ssh_port;
  // -i/--ssh-identity-file: the private key to log in with; unset: ssh's defaults.
  std::optional<std::string> ssh_identity_file;
  // --ssh-client: "libssh2" (in-process, the default) or "openssh" (the system `ssh` binary).
  std::string ssh_client = "libssh2";
  // --ssh-strict-host-key-checking: OpenSSH's yes / accept-new / no for ~/.ssh/known_hosts.
  std::string ssh_host_key_checking = "accept-new";
  // --remote-trainrun: trainrun's path on the other hosts; empty: this trainrun's own path.
  std::string remote_trainrun;
};

}  // namespace trainrun::launcher
