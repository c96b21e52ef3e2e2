// ElasticController's growth (elastic_controller.h): starting ranks on a host the discovery
// script added, on this machine under their shims or on a remote host through an agent of its own,
// or on a node that joined a per-node job, and making each batch one membership change once its
// ranks joined the rendezvous. Discovery, the blacklist and generation publishing are in
// elastic_controller.cc.
#include <boost/asio/post.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "elastic_controller.h"
#include "rank_ranges.h"
#include "remote/host_access.h"
#include "trainrun/launcher/cpu_binding.h"
#include "trainrun/launcher/gpu_assignment.h"
#include "trainrun/launcher/logging.h"
#include "trainrun/rendezvous/environment.h"
#include "trainrun/rendezvous/generation.h"

namespace trainrun::launcher {

void ElasticController::AcceptNodes() {
  if (!spec_.per_node || !channel_) return;
  channel_->AcceptLateHosts([this, connections = connections_](channel::LateHost node) {
    // From the join port's thread: to the io thread, unless the job is over (the stream closes).
    std::lock_guard<std::mutex> lock(connections->mu);
    if (connections->closed) return;
    boost::asio::post(io_,
                      [this, node = std::move(node)]() mutable { OnNodeJoined(std::move(node)); });
  });
}

void ElasticController::OnNodeJoined(channel::LateHost node) {
  // It counts as listed (OnGrowConnected grows only onto listed hosts) while the job knows it.
  // One that joins as the job ends is greeted too, and told the job's end (OnGrowConnected).
  listed_.insert(node.host.host);
  ConnectToGrow(node.host, node.host.slots, /*joined_host=*/true, std::chrono::steady_clock::now(),
                remote::JoinedHostChannel(std::move(node.stream)));
}

int ElasticController::LiveOrConnecting() const {
  int count = 0;
  for (const hostfile::RankAssignment& a : slots_.ranks) count += supervisor_->Live(a.rank) ? 1 : 0;
  for (const auto& [host, ranks] : connecting_) count += ranks;
  return count;
}

std::string ElasticController::CannotReachFromRanks(const std::string& host) const {
  const std::string said =
      absl::StrCat("host ", host,
                   " appeared in the host discovery script's output, but the job goes on without "
                   "it: ");
  if (spec_.per_node) {
    return absl::StrCat(said,
                        "a job started per node (--nnodes) grows only onto this machine's host");
  }
  const bool loopback = absl::StartsWith(bind_address_, "127.") || bind_address_ == "::1" ||
                        bind_address_ == "localhost";
  if (loopback) {
    return absl::StrCat(said, "the job's rendezvous server listens on ", bind_address_,
                        ", which only this machine reaches (every rank of the start ran here); "
                        "--rendezvous-addr ADDRESS or --network-interface NAME makes it reachable");
  }
  return "";
}

void ElasticController::ConnectToGrow(const hostfile::HostSpec& host, int count, bool joined_host,
                                      std::chrono::steady_clock::time_point since,
                                      std::shared_ptr<channel::HostChannel> channel) {
  connecting_[host.host] += count;
  Logger().debug(
      "host {} {}: connecting to it for {} ranks", host.host,
      spec_.per_node ? "joined the job" : "appeared in the host discovery script's output", count);
  // The channel and the greeting of the start (SSH options, host keys, the agent), on a thread of
  // its own: the io thread goes on meanwhile.
  if (!channel) channel = remote::MakeHostChannel(spec_);
  const std::string command = remote::AgentCommand(remote::RemoteTrainrunPath(spec_));
  const absl::Time deadline = absl::Now() + absl::FromChrono(spec_.start_timeout);
  {
    std::lock_guard<std::mutex> lock(connections_->mu);
    ++connections_->running;
  }
  std::thread([this, connections = connections_, channel, host, command, deadline, count,
               joined_host, since] {
    const absl::Time start = absl::Now();
    absl::StatusOr<remote::RemoteAgent> agent =
        remote::ConnectAgent(*channel, host, command, deadline);
    Logger().debug("host {}: {} in {}", host.host, agent.ok() ? "agent connected" : "no agent",
                   absl::FormatDuration(absl::Now() - start));
    std::lock_guard<std::mutex> lock(connections->mu);
    --connections->running;
    connections->changed.notify_all();
    if (connections->closed) return;  // the job is over: `agent` closes here
    boost::asio::post(io_,
                      [this, host, count, joined_host, since, agent = std::move(agent)]() mutable {
                        OnGrowConnected(host, count, joined_host, since, std::move(agent));
                      });
  }).detach();
}

void ElasticController::OnGrowConnected(const hostfile::HostSpec& host, int count, bool joined_host,
                                        std::chrono::steady_clock::time_point since,
                                        absl::StatusOr<remote::RemoteAgent> agent) {
  if (auto it = connecting_.find(host.host);
      it != connecting_.end() && (it->second -= count) <= 0) {
    connecting_.erase(it);
  }
  const bool ending = supervisor_->done() || supervisor_->ending() || supervisor_->finishing();
  if (ending && spec_.per_node && agent.ok()) {
    // A node that joined as the job ends runs nothing; it hears the job's end with the others.
    Logger().info("{} joined as the job was ending; it runs nothing", host.host);
    ending_nodes_.push_back(*std::move(agent));
    return;
  }
  if (supervisor_->done() || supervisor_->ending()) return;  // an agent closes with `agent`
  if (!agent.ok()) {
    // Not the job's failure: the pending ranks are given up, and the host waits its cooldown.
    // The message names the host ("host h: why", "host h (address:port): why"): said once.
    absl::string_view message = agent.status().message();
    std::string why(message);
    if (absl::ConsumePrefix(&message, absl::StrCat("host ", host.host))) {
      const size_t address_end = message.find("): ");
      if (absl::ConsumePrefix(&message, ": ")) {
        why = std::string(message);
      } else if (absl::StartsWith(message, " (") && address_end != absl::string_view::npos) {
        why =
            absl::StrCat(message.substr(2, address_end - 2), ": ", message.substr(address_end + 3));
      }
    }
    const std::string what =
        absl::StrCat("trainrun could not reach its agent to grow the job onto it (", why, ")");
    if (Blacklisted(host.host, std::chrono::steady_clock::now())) {
      Logger().warn("host {}: {}; the job goes on without it", host.host, what);
    } else {
      Blacklist(host.host, what);
    }
    return;
  }
  // The job may have changed meanwhile: finishing, the host gone from the output or blacklisted,
  // or fewer free places. The agent then closes unused.
  if (supervisor_->finishing() || listed_.count(host.host) == 0 ||
      Blacklisted(host.host, std::chrono::steady_clock::now())) {
    Logger().debug("host {} connected, but the job no longer grows onto it", host.host);
    return;
  }
  const int fit = std::min(count, spec_.elastic->max_np - LiveOrConnecting());
  if (fit <= 0) return;
  Grow(host, fit, joined_host, since, std::move(*agent));
}

std::optional<rendezvous::RankPlace> ElasticController::PlaceWith(const std::vector<int>& added,
                                                                  int slot) const {
  rendezvous::Generation generation;
  for (const hostfile::RankAssignment& a : slots_.ranks) {
    const bool member =
        supervisor_->Live(a.rank) || std::find(added.begin(), added.end(), a.rank) != added.end();
    if (member) generation.members.push_back({a.rank, slots_.hosts[a.host_index].host});
  }
  return generation.PlaceOf(slot);
}

HostView ElasticController::GrownHostView(const hostfile::HostSpec& host,
                                          const remote::RemoteAgent* agent) const {
  HostView view;
  view.name = host.host;
  view.rendezvous_addr = server_->address();
  view.master_addr = views_.empty() ? host.host : views_[0].master_addr;
  view.gpu_count = CountHostGpus();
  if (agent == nullptr) {
    view.rendezvous_socket = server_->socket_path();
    return view;
  }
  // A remote host: as HostViews sees the start's.
  const int master_host = spec_.plan.ranks[0].host_index;
  if (master_host < static_cast<int>(views_.size())) {
    view.master_addr = views_[master_host].master_addr;
  }
  seen_through_(*agent, /*master_here=*/plan_.rank_is_local[0], view);
  return view;
}

void ElasticController::Grow(const hostfile::HostSpec& host, int count, bool joined_host,
                             std::chrono::steady_clock::time_point since,
                             std::optional<remote::RemoteAgent> agent) {
  // The host's index among the job's hosts; a new one gets its view.
  int host_index = -1;
  for (size_t h = 0; h < slots_.hosts.size(); ++h) {
    if (slots_.hosts[h].host == host.host) host_index = static_cast<int>(h);
  }
  if (host_index < 0) {
    host_index = static_cast<int>(slots_.hosts.size());
    slots_.hosts.push_back(host);
    views_.push_back(GrownHostView(host, agent ? &*agent : nullptr));
  }
  std::vector<int> ranks;
  std::vector<rendezvous::RankSlot> server_slots;
  for (int i = 0; i < count; ++i) {
    hostfile::RankAssignment a;
    a.rank = slots_.size();
    a.host_index = host_index;
    slots_.ranks.push_back(a);
    ranks.push_back(a.rank);
    server_slots.push_back({host.host, 0, 1, 0, 1});
  }
  if (const int first = server_->AddRanks(server_slots); first != ranks.front()) {
    Logger().error("the rendezvous numbered the new ranks from {}, not {}; not growing", first,
                   ranks.front());
    return;
  }
  supervisor_->OnRanksAdded(ranks);
  // Per-node mode grows only onto nodes that joined (--nnodes MIN:MAX); other jobs onto the
  // hosts of the discovery script's output.
  const std::string why =
      spec_.per_node
          ? absl::StrCat(host.host, " joined the job (--nnodes ", spec_.per_node->min_nnodes, ":",
                         spec_.per_node->nnodes, "): ", RankRanges(ranks), " started")
          : absl::StrCat("host ", host.host, joined_host ? " joined" : " has more slots",
                         " (from the host discovery script): ", RankRanges(ranks), " started");
  if (!spec_.quiet && spec_.per_node) {
    Logger().info("{} joined the job: starting {} on it", host.host, RankRanges(ranks));
  } else if (!spec_.quiet) {
    Logger().info("host {} {} the host discovery script's output: starting {} on it", host.host,
                  joined_host ? "appeared in" : "has more slots in", RankRanges(ranks));
  }
  remote::Job job = remote_job_();
  for (int slot : ranks) {
    // --output-filename and --log-dir files, as for the start's ranks.
    if (absl::Status files = output_.AddRank(slot); !files.ok()) {
      const std::string note =
          absl::StrCat(files.message(), "; rank ", slot, "'s output goes to the console only");
      if (discovery_said_.insert(std::string(files.message())).second) {
        Logger().warn("{}", note);
      }
    }
    // Its environment says its place in the generation it will join.
    hostfile::RankAssignment& a = slots_.ranks[slot];
    std::optional<rendezvous::RankPlace> place = PlaceWith(ranks, slot);
    a.local_rank = place->local_rank;
    a.local_size = place->local_size;
    a.cross_rank = place->cross_rank;
    a.cross_size = place->cross_size;
    hostfile::RankAssignment in_generation = a;
    in_generation.rank = place->rank;
    std::vector<std::string> env =
        plan_.environment.ForPlace(in_generation, place->size, views_[host_index]);
    env.push_back(absl::StrCat(env::kElasticSlot, "=", slot));
    if (agent.has_value()) {
      // The token crosses as the agent's stream hides it (channel/host_channel.h's Seal).
      const std::string token_entry = absl::StrCat(env::kJobToken, "=");
      for (std::string& entry : env) {
        if (absl::StartsWith(entry, token_entry)) {
          entry = token_entry + agent->stream->Seal(entry.substr(token_entry.size()));
        }
      }
      job.ranks.push_back({static_cast<uint32_t>(slot), std::move(env)});
      continue;
    }
    ProcessSpec process;
    process.cpus = CpusForRank(plan_.cpus, spec_.bind_to, a.local_rank, a.local_size);
    process.cwd = plan_.working_dir;
    process.executable = plan_.executable.path;
    process.argv = spec_.command;
    process.env = std::move(env);
    process.stdout_pty = spec_.stdout_pty;
    if (absl::Status started = local_ranks_.Start(slot, process); !started.ok()) {
      Logger().warn("cannot start rank {} on {}: {}", slot, host.host,
                    std::string(started.message()));
      ExitInfo exit;
      exit.code = 1;
      exit.time = std::chrono::steady_clock::now();
      supervisor_->OnRankExit(slot, exit);
    }
  }
  // A remote host's ranks: one Job to the agent connected for them (RemoteRanks::Add).
  if (agent.has_value()) remote_ranks_.Add(*std::move(agent), job);
  growing_.push_back({ranks, host.host, why, since, std::chrono::steady_clock::now()});
  WatchGrowth();
}

void ElasticController::WatchGrowth() {
  growth_timer_.expires_after(std::chrono::milliseconds(10));
  growth_timer_.async_wait([this](const boost::system::error_code& error) {
    if (error || supervisor_->done()) return;
    const std::vector<rendezvous::RankState> states = server_->Ranks();
    const auto now = std::chrono::steady_clock::now();
    for (auto it = growing_.begin(); it != growing_.end();) {
      std::vector<int> alive;
      bool all_joined = true;
      for (int rank : it->ranks) {
        if (!supervisor_->Live(rank)) continue;  // it ended before joining: given up
        alive.push_back(rank);
        if (rank >= static_cast<int>(states.size()) || !states[rank].joined) all_joined = false;
      }
      if (!alive.empty() && !all_joined && now - it->started > spec_.start_timeout) {
        supervisor_->OnRanksRemoved(
            alive,
            absl::StrCat(
                RankRanges(alive), " on ", it->host,
                " did not join the job within --start-timeout ",
                std::chrono::duration_cast<std::chrono::seconds>(spec_.start_timeout).count(),
                " s"));
        Logger().warn("{} on {} did not join the job within --start-timeout; stopped them",
                      RankRanges(alive), it->host);
        it = growing_.erase(it);
        continue;
      }
      if (!all_joined) {
        ++it;
        continue;
      }
      if (!alive.empty()) {
        const std::string why = alive.size() == it->ranks.size()
                                    ? it->why
                                    : absl::StrCat(it->why, " (", alive.size(), " of them joined)");
        supervisor_->OnRanksJoined(alive, why, it->since, it->host);
      }
      it = growing_.erase(it);
    }
    if (!growing_.empty()) WatchGrowth();
  });
}

}  // namespace trainrun::launcher
