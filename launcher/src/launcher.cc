#include "trainrun/launcher/launcher.h"

#include <signal.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "job_plan.h"
#include "job_run.h"
#include "node_joiner.h"
#include "nodes/node_join.h"
#include "reach_hosts.h"
#include "remote/host_access.h"
#include "start_deadline.h"
#include "sync_files.h"
#include "trainrun/launcher/failure_policy.h"
#include "trainrun/launcher/logging.h"
#include "trainrun/launcher/output_forwarder.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::launcher {
namespace {

// Ignores SIGPIPE while alive (a rank that closed its stdin, a console that went away) and
// restores the previous disposition.
class IgnoreSigpipe {
 public:
  IgnoreSigpipe() {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ignore, &previous_);
  }
  ~IgnoreSigpipe() { sigaction(SIGPIPE, &previous_, nullptr); }

 private:
  struct sigaction previous_ {};
};

absl::StatusOr<std::unique_ptr<OutputForwarder>> OpenOutput(const LaunchSpec& spec) {
  OutputOptions options;
  options.tag = spec.tag_output;
  options.prefix_timestamp = spec.prefix_timestamp;
  options.output_dir = spec.output_dir;
  options.world_size = spec.plan.size();
  options.log_dir = spec.log_dir;
  options.log_streams = spec.tee | spec.redirects;
  options.console_off = spec.redirects & ~spec.tee;
  return OutputForwarder::Create(options);
}

// WithRestartCount is `spec` for start `restart` of the job (0 the first): its ranks are told which
// (TRAINRUN_RESTART_COUNT, and torchrun's TORCHELASTIC_RESTART_COUNT) and how many may follow.
LaunchSpec WithRestartCount(const LaunchSpec& spec, int restart) {
  LaunchSpec attempt = spec;
  attempt.restart = restart;
  for (const char* name : {env::kRestartCount, env::kTorchRestartCount}) {
    attempt.exported.push_back({name, std::to_string(restart)});
  }
  for (const char* name : {env::kMaxRestarts, env::kTorchMaxRestarts}) {
    attempt.exported.push_back({name, std::to_string(spec.max_restarts)});
  }
  return attempt;
}

// MergeNamesOfOneMachine makes remote hosts whose agents say they are one machine (Hello.machine:
// the same boot and network namespace; e.g. a name and an address of one host) one host, at the
// first one's place with all their slots, so its ranks get one numbering of local ranks, as
// MergeNamesOfThisMachine does for this machine's names before anything is reached; one line says
// so. `agents[i]` is host `plan.remote_hosts[i]`; the agents of merged names are let go (their
// ranks start through the first name's). False when no two agents are one machine.
absl::StatusOr<bool> MergeNamesOfOneMachine(LaunchSpec& spec, const JobPlan& plan,
                                            std::vector<remote::RemoteAgent>& agents) {
  std::map<std::string, int> first;  // machine -> the host index of its first name
  std::map<int, int> into;           // host index -> the host index it merges into
  for (size_t i = 0; i < agents.size() && i < plan.remote_hosts.size(); ++i) {
    const std::string& machine = agents[i].hello.machine;
    if (machine.empty()) continue;
    auto [it, fresh] = first.emplace(machine, plan.remote_hosts[i]);
    if (!fresh) into[plan.remote_hosts[i]] = it->second;
  }
  if (into.empty()) return false;
  std::vector<hostfile::HostSpec> hosts;
  std::map<int, size_t> kept;  // old host index -> index in `hosts`
  std::map<int, std::vector<std::string>> names;
  for (int h = 0; h < static_cast<int>(spec.plan.hosts.size()); ++h) {
    const hostfile::HostSpec& host = spec.plan.hosts[h];
    auto merged = into.find(h);
    if (merged == into.end()) {
      kept[h] = hosts.size();
      hosts.push_back(host);
      continue;
    }
    hostfile::HostSpec& target = hosts[kept.at(merged->second)];
    if (names[merged->second].empty()) names[merged->second].push_back(target.host);
    names[merged->second].push_back(host.host);
    target.slots += host.slots;
    if (target.max_slots || host.max_slots) {
      target.max_slots = target.max_slots.value_or(target.slots - host.slots) +
                         host.max_slots.value_or(host.slots);
    }
  }
  absl::StatusOr<hostfile::SlotPlan> replanned = hostfile::PlanSlots(hosts, spec.plan.size());
  if (!replanned.ok()) return replanned.status();
  for (const auto& [host, list] : names) {
    Logger().info(
        "{} are one machine (one boot and network namespace, as their agents say): one host with "
        "{} slots, its local ranks numbered across them",
        absl::StrJoin(list, ", "), hosts[kept.at(host)].slots);
  }
  spec.plan = *std::move(replanned);
  // The agents of the hosts still planned, in their order; the others end as they are dropped.
  std::vector<remote::RemoteAgent> remaining;
  for (const hostfile::HostSpec& host : spec.plan.hosts) {
    for (size_t i = 0; i < agents.size(); ++i) {
      if (agents[i].stream && agents[i].host.host == host.host &&
          !into.count(plan.remote_hosts[i])) {
        remaining.push_back(std::move(agents[i]));
        break;
      }
    }
  }
  agents = std::move(remaining);
  return true;
}

struct Attempt {
  int exit_code = 0;
  bool interrupted = false;  // trainrun got SIGINT, SIGTERM or SIGHUP
  std::string cause;         // the summary's first line; "" when the job succeeded
  // Per-node mode: a node joined (the job starts again with it), and the nodes still there.
  bool nodes_changed = false;
  int nodes = 0;
};

// RunOnce runs the job once: plan, reach the hosts, serve the rendezvous, start the ranks,
// supervise them, summarize. A status is a failure before any rank started.
absl::StatusOr<Attempt> RunOnce(const LaunchSpec& given, OutputForwarder& output) {
  // --sync-dst-dir: DIR is the ranks' directory here too, so it is filled before the plan checks
  // it and the command in it.
  if (given.sync && RanksHere(given)) {
    if (absl::Status synced = SyncHere(given); !synced.ok()) return synced;
  }
  absl::StatusOr<JobPlan> plan = PlanJob(given);
  if (!plan.ok()) return plan.status();
  // --start-timeout: one deadline, from the first connection to the last rank's start.
  StartDeadline deadline = StartDeadline::From(given.start_timeout);
  // The job's channel lives as long as the job: hosts that come by themselves (per-node mode's
  // nodes joining a running --nnodes MIN:MAX job) arrive through it.
  std::shared_ptr<channel::HostChannel> channel;
  if (!plan->remote_hosts.empty()) channel = remote::MakeHostChannel(given);
  absl::StatusOr<std::vector<remote::RemoteAgent>> agents =
      ReachHosts(given, *plan, deadline, channel.get());
  if (!agents.ok()) return agents.status();
  LaunchSpec spec = given;
  if (given.per_node) {
    // Per-node mode: each node said its --nproc-per-node as it joined; the job is planned again
    // when they differ from node 0's, or when (--nnodes MIN:MAX) some nodes did not join: the
    // agents are the nodes that joined, in node order, each host named "node<K>".
    std::vector<int> counts(given.per_node->nnodes, 0);
    counts[0] = given.per_node->nproc_per_node;
    for (const remote::RemoteAgent& agent : *agents) {
      int node = 0;
      if (absl::SimpleAtoi(absl::StripPrefix(agent.name(), "node"), &node) && node > 0 &&
          node < given.per_node->nnodes) {
        counts[node] = agent.stream->JoinedSlots();
      }
    }
    bool differ = agents->size() + 1 != counts.size();
    for (int count : counts) differ = differ || count != given.per_node->nproc_per_node;
    if (differ) {
      absl::StatusOr<hostfile::SlotPlan> replanned = PerNodeSlotPlan(*given.per_node, counts);
      if (!replanned.ok()) return replanned.status();
      spec.plan = *std::move(replanned);
      plan = PlanJob(spec);
      if (!plan.ok()) return plan.status();
      if (!spec.quiet) {
        std::vector<std::string> shown;
        for (size_t node = 0; node < counts.size(); ++node) {
          if (counts[node] > 0) shown.push_back(absl::StrCat(counts[node]));
        }
        Logger().info("the nodes run {} ranks: {} in all, numbered by node",
                      absl::StrJoin(shown, ", "), spec.plan.size());
      }
    }
  } else if (!given.elastic) {
    // (An elastic job's hosts keep their names: its discovery script's later runs are compared by
    // name.)
    absl::StatusOr<bool> merged = MergeNamesOfOneMachine(spec, *plan, *agents);
    if (!merged.ok()) return merged.status();
    if (*merged) {
      plan = PlanJob(spec);
      if (!plan.ok()) return plan.status();
    }
  }
  if (spec.sync) {
    // The copy's time is not the start's: the deadline moves by it.
    const auto before = std::chrono::steady_clock::now();
    if (absl::Status synced = SyncRemote(spec, *agents); !synced.ok()) return synced;
    const auto took = std::chrono::steady_clock::now() - before;
    deadline.when += took;
    deadline.at += absl::FromChrono(took);
  }

  JobRun run(spec, *plan, output, *std::move(agents), channel);
  if (absl::Status served = run.ServeRendezvous(); !served.ok()) return served;
  run.StartRanks(deadline);
  if (absl::Status ready = run.RendezvousReady(); !ready.ok()) return ready;
  run.Supervise();
  Attempt attempt;
  attempt.exit_code = run.Summarize();
  attempt.interrupted = run.interrupted();
  attempt.cause = run.cause();
  if (spec.per_node) {
    attempt.nodes_changed = run.nodes_changed();
    attempt.nodes = run.nodes();
  }
  return attempt;
}

}  // namespace

// A job is a pipeline: plan, reach the hosts, serve the rendezvous, start the ranks, supervise
// them, summarize. Each phase is named in job_plan.h, reach_hosts.h and job_run.h.
absl::StatusOr<int> Launch(const LaunchSpec& spec) {
  if (spec.per_node) {
    if (spec.per_node->token.empty()) {
      Logger().warn(
          "no --rdzv-token (nor TRAINRUN_RDZV_TOKEN): any host that reaches {} may join this job "
          "as a node, as with torchrun",
          nodes::EndpointText(*spec.per_node));
    }
    // Per-node mode: node 0 runs the pipeline below, with the other nodes as its agents.
    if (spec.per_node->node_rank != 0) return RunJoinedNode(spec);
  }
  absl::StatusOr<std::unique_ptr<OutputForwarder>> output = OpenOutput(spec);
  if (!output.ok()) return output.status();
  IgnoreSigpipe ignore_sigpipe;
  // Fail fast and elastic run the job once (the failure policy is the supervisor's); restart runs
  // it again after each failure.
  if (FailureModeOf(spec) != FailureMode::kRestart) {
    absl::StatusOr<Attempt> attempt = RunOnce(spec, **output);
    if (!attempt.ok()) return attempt.status();
    return attempt->exit_code;
  }

  // --max-restarts: the whole job again, on the same hosts with a new rendezvous, until it
  // succeeds, trainrun is told to stop, or the restarts are spent. Per-node mode: every node joins
  // again; with --nnodes MIN:MAX a node that joins the running job makes it start again with it,
  // which is no failure (torchrun's rule), and fewer than MIN nodes left end it.
  std::vector<std::string> causes;
  int nodes = 0;  // per-node mode: the nodes of the last start still there
  for (int restart = 0;;) {
    LaunchSpec start = WithRestartCount(spec, restart);
    if (start.per_node) start.per_node->expect_nodes = nodes;
    absl::StatusOr<Attempt> attempt = RunOnce(start, **output);
    if (!attempt.ok()) return attempt.status();
    nodes = attempt->nodes;
    if (attempt->nodes_changed && !attempt->interrupted) {
      Logger().info(
          "starting the job again with {} nodes ({} of --max-restarts {} left: a "
          "change of nodes is not counted)",
          nodes, spec.max_restarts - restart, spec.max_restarts);
      continue;
    }
    if (attempt->exit_code == 0) {
      if (restart > 0) {
        Logger().info("the job succeeded on its restart {} of {}", restart, spec.max_restarts);
      }
      return 0;
    }
    causes.push_back(absl::StrCat("start ", restart + 1, ": ", attempt->cause));
    if (attempt->interrupted || restart == spec.max_restarts) {
      if (causes.size() > 1) {
        Logger().error("the job failed {} times (--max-restarts {}):\n  {}", causes.size(),
                       spec.max_restarts, absl::StrJoin(causes, "\n  "));
      }
      return attempt->exit_code;
    }
    if (const std::optional<PerNodeSpec>& per_node = spec.per_node;
        per_node && per_node->min_nnodes > 0 && nodes < per_node->min_nnodes) {
      Logger().error(
          "the job failed ({}), and {} {} left, fewer than the {} that --nnodes {} asks for at "
          "least, so it does not start again",
          attempt->cause, nodes, nodes == 1 ? "node is" : "nodes are", per_node->min_nnodes,
          nodes::NnodesText(*per_node));
      return attempt->exit_code;
    }
    ++restart;
    Logger().warn("the job failed ({}); restarting it (restart {} of {})", attempt->cause, restart,
                  spec.max_restarts);
  }
}

}  // namespace trainrun::launcher
