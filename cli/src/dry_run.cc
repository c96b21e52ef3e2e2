#include "trainrun/cli/dry_run.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "trainrun/collectives/gpu/loader.h"
#include "trainrun/hostfile/host_list.h"
#include "trainrun/launcher/host_access.h"
#include "trainrun/launcher/job_environment.h"
#include "trainrun/launcher/local_host.h"
#include "trainrun/launcher/shell_quote.h"

namespace trainrun::cli {
namespace {

// Per-node mode: which node this is and where it meets the others; no host is asked anything (the
// other nodes start their own trainrun).
void PrintPerNode(const launcher::PerNodeSpec& node, int max_restarts, std::ostream& out) {
  const std::string endpoint = node.endpoint_host.find(':') != std::string::npos
                                   ? absl::StrCat("[", node.endpoint_host, "]:", node.endpoint_port)
                                   : absl::StrCat(node.endpoint_host, ":", node.endpoint_port);
  const bool range = node.min_nnodes > 0 && node.min_nnodes < node.nnodes;
  out << "per-node mode: this is node " << node.node_rank << " of "
      << (range ? absl::StrCat(node.min_nnodes, ":", node.nnodes) : absl::StrCat(node.nnodes))
      << " (ranks " << node.node_rank * node.nproc_per_node << " to "
      << (node.node_rank + 1) * node.nproc_per_node - 1
      << (node.node_rank == 0 ? ""
                              : absl::StrCat(" when every node runs ", node.nproc_per_node,
                                             "; node 0 numbers them once all have joined"))
      << "); "
      << (node.node_rank == 0 ? absl::StrCat("the other nodes join it at port ", node.endpoint_port,
                                             ", where it then serves the rendezvous")
                              : absl::StrCat("it joins node 0 at ", endpoint))
      << "; --rdzv-id " << node.rdzv_id << ", "
      << (node.token.empty() ? "no token (any node that reaches it may join)" : "a token")
      << (range ? absl::StrCat("; the job starts once ", node.min_nnodes,
                               node.min_nnodes == 1 ? " node has" : " nodes have", " joined and ",
                               node.last_call.count(),
                               " s more have passed (--rdzv-last-call), or once all ", node.nnodes,
                               " have, on the nodes that joined (the plan above is all ",
                               node.nnodes, ")")
                : "")
      << "\n";
  // What changes of nodes do once it runs (torchrun's elastic range).
  const std::string at_least =
      absl::StrCat(node.min_nnodes, node.min_nnodes == 1 ? " node remains" : " nodes remain");
  if (range && max_restarts > 0) {
    out << "per-node mode: a node that joins the running job (up to " << node.nnodes
        << ") makes every node's ranks start again with it (not counted against --max-restarts "
        << max_restarts << "); a failure or a lost node starts them again while at least "
        << at_least << "\n";
  } else if (range) {
    out << "per-node mode: an elastic job (trainrun's elastic API): a node that joins the running "
           "job (up to "
        << node.nnodes << ") is grown onto, a node that leaves is a membership change while at "
        << "least " << at_least << ", fewer end the job; a script without the elastic API needs "
        << "--max-restarts N to start again with the new world size\n";
  } else if (max_restarts > 0) {
    out << "per-node mode: a failure starts every node's ranks again (up to --max-restarts "
        << max_restarts << "), each node joining node 0 again\n";
  }
}

}  // namespace

void PrintPlan(const launcher::LaunchSpec& spec, std::ostream& out) {
  const hostfile::SlotPlan& plan = spec.plan;
  out << absl::StrFormat("trainrun: %s: %d %s on %d %s%s\n", spec.dry_run ? "dry run" : "job map",
                         plan.size(), plan.size() == 1 ? "rank" : "ranks", plan.hosts.size(),
                         plan.hosts.size() == 1 ? "host" : "hosts",
                         spec.dry_run ? "; nothing is started" : "");
  size_t host_width = 4;
  for (const hostfile::HostSpec& host : plan.hosts) {
    host_width = std::max(host_width, hostfile::HostLabel(host).size());
  }
  const int width = static_cast<int>(host_width);
  out << absl::StrFormat("%-*s  %-4s  %-10s  %-10s  %s\n", width, "HOST", "RANK", "LOCAL_RANK",
                         "CROSS_RANK", "COMMAND");
  const std::string command = launcher::ShellJoin(spec.command);
  for (const hostfile::RankAssignment& r : plan.ranks) {
    out << absl::StrFormat("%-*s  %-4d  %-10d  %-10d  %s\n", width,
                           hostfile::HostLabel(plan.hosts[r.host_index]), r.rank, r.local_rank,
                           r.cross_rank, command);
  }
  std::vector<launcher::ExportedVariable> exported = spec.exported;
  for (launcher::ExportedVariable& variable : launcher::JobEnvironment::SpecVariables(spec)) {
    exported.push_back(std::move(variable));
  }
  for (const launcher::ExportedVariable& variable : exported) {
    out << "export " << variable.name
        << (variable.value ? absl::StrCat("=", launcher::ShellQuote(*variable.value))
                           : " (from trainrun's environment)")
        << "\n";
  }
  if (spec.output_dir) out << "output: " << *spec.output_dir << "/rank.<N>/{stdout,stderr}\n";
  if (!spec.working_dir.empty()) out << "working directory: " << spec.working_dir << "\n";
  if (spec.sync) {
    out << "sync: " << spec.sync->src_dir << " to " << spec.sync->dst_dir
        << " on every host before the ranks start (what changed; without .git";
    for (const std::string& pattern : spec.sync->excludes) out << ", " << pattern;
    out << ")\n";
  }
  if (spec.bind_to != launcher::BindTo::kNone) {
    out << "bound to: one " << launcher::BindToName(spec.bind_to) << " per local rank\n";
  }
  if (spec.per_node) return PrintPerNode(*spec.per_node, spec.max_restarts, out);
  // What the ranks of this host will find: GPUs, the driver, NCCL (asked of the libraries with
  // dlopen; the collectives are not linked here). Remote hosts answer `trainrun --gpu-probe` below.
  if (spec.dry_run &&
      std::any_of(plan.hosts.begin(), plan.hosts.end(), [](const hostfile::HostSpec& host) {
        return launcher::IsLocalHost(host.host);
      })) {
    out << "GPUs here: " << collectives::gpu::DescribeProbe(collectives::gpu::ProbeHost()) << "\n";
  }
  // How each host is reached, when any is not this machine.
  bool any_remote = false;
  for (const hostfile::HostSpec& host : plan.hosts) any_remote |= !launcher::IsLocalHost(host.host);
  if (any_remote) {
    out << "hosts:\n";
    const std::vector<std::string> access = launcher::DescribeHostsAccess(spec);
    for (size_t i = 0; i < plan.hosts.size(); ++i) {
      out << "  " << hostfile::HostLabel(plan.hosts[i]) << ": " << access[i] << "\n";
    }
    // The plan is out before the hosts are asked, which may take up to --start-timeout; a job
    // (--display-map) learns the same when it reaches them.
    out << std::flush;
    if (!spec.dry_run || !spec.dry_run_probe) return;
    out << "trainrun on the hosts:" << std::endl;
    // Each host's answer as it comes.
    launcher::ProbeRemoteTrainrun(
        spec, [&out](const std::string& line) { out << "  " << line << std::endl; });
  }
}

}  // namespace trainrun::cli
