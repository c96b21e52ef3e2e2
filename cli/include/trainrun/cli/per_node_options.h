// Per-node mode's flags (torchrun's model): `trainrun --nnodes 2 --node-rank 0 --rdzv-endpoint
// HOST:PORT --nproc-per-node 4 python train.py`, started once on each node. Kept apart from the
// other flags (run_options.h) because they form one mode with its own rules:
//
//   PerNodeOptions node;
//   SetupPerNodeOptions(app, node);          // called by SetupRunOptions
//   ... parse ...
//   auto spec = MakePerNodeSpec(options, env);  // nullopt: not per-node mode
//
// torchrun's spellings are accepted: --nnodes, --node-rank/--node_rank,
// --rdzv-endpoint/--rdzv_endpoint, --rdzv-id/--rdzv_id, --master-addr/--master_addr with
// --master-port/--master_port, --nproc-per-node/--nproc_per_node.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "trainrun/launcher/launch_spec.h"

namespace trainrun::cli {

// PerNodeOptions is per-node mode's flags, as typed.
struct PerNodeOptions {
  std::optional<std::string> nnodes;           // --nnodes N or MIN:MAX (torchrun's range)
  std::optional<int> node_rank;                // --node-rank
  std::optional<int> nproc_per_node;           // --nproc-per-node: this node's ranks
  std::optional<std::string> rdzv_endpoint;    // --rdzv-endpoint HOST[:PORT]
  std::optional<std::string> rdzv_id;          // --rdzv-id
  std::optional<std::string> rdzv_token;       // --rdzv-token
  std::optional<std::string> rdzv_token_file;  // --rdzv-token-file
  std::optional<std::string> master_addr;      // --master-addr
  std::optional<int> master_port;              // --master-port
  std::optional<std::string> rdzv_backend;     // --rdzv-backend: accepted when c10d or static
  std::optional<int> rdzv_last_call;           // --rdzv-last-call SECONDS (--nnodes MIN:MAX)
};

// SetupPerNodeOptions declares per-node mode's flags on `app`, bound to `options`.
void SetupPerNodeOptions(CLI::App& app, PerNodeOptions& options);

// PerNodeFacts is what MakePerNodeSpec needs besides per-node flags: the other flags it must agree
// with, and trainrun's environment.
struct PerNodeFacts {
  std::optional<int> num_proc;    // -np: the job's total
  bool hosts_given = false;       // -H or --hostfile
  bool rendezvous_given = false;  // --rendezvous-port or --rendezvous-addr
  std::string launcher = "auto";  // --launcher
  std::function<std::optional<std::string>(const std::string& name)> env;
};

// PerNodeResult is per-node mode's part of the launch: `spec` when per-node mode is asked for,
// else nullopt; `num_proc` is the -np the rest of the CLI plans with (--nproc-per-node without
// --nnodes is -np on this host).
struct PerNodeResult {
  std::optional<launcher::PerNodeSpec> spec;
  std::optional<int> num_proc;
};

// MakePerNodeSpec checks per-node flags against each other and the rest (InvalidArgument, one
// sentence naming the flag) and resolves them: the endpoint parsed, the token read from
// --rdzv-token, --rdzv-token-file or TRAINRUN_RDZV_TOKEN.
absl::StatusOr<PerNodeResult> MakePerNodeSpec(const PerNodeOptions& options,
                                              const PerNodeFacts& facts);

// PerNodePlan is the whole job's slot plan in per-node mode: host 0 is node 0 (named by the
// endpoint's host), host K is "node<K>", each with nproc_per_node slots.
absl::StatusOr<hostfile::SlotPlan> PerNodePlan(const launcher::PerNodeSpec& spec);

}  // namespace trainrun::cli
