#include "elastic_controller.h"

#include <boost/asio/post.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "rank_ranges.h"
#include "remote/host_access.h"
#include "trainrun/launcher/cpu_binding.h"
#include "trainrun/launcher/gpu_assignment.h"
#include "trainrun/launcher/host_discovery.h"
#include "trainrun/launcher/local_host.h"
#include "trainrun/launcher/logging.h"
#include "trainrun/rendezvous/environment.h"
#include "trainrun/rendezvous/generation.h"

namespace trainrun::launcher {

ElasticController::ElasticController(JobParts parts)
    : spec_(parts.spec),
      plan_(parts.plan),
      io_(parts.io),
      slots_(parts.slots),
      views_(parts.views),
      supervisor_(parts.supervisor),
      server_(parts.server),
      local_ranks_(parts.local_ranks),
      remote_ranks_(parts.remote_ranks),
      output_(parts.output),
      bind_address_(parts.bind_address),
      host_failed_(parts.host_failed),
      remote_job_(std::move(parts.remote_job)),
      seen_through_(std::move(parts.seen_through)),
      generation_timer_(parts.io),
      growth_timer_(parts.io) {}

ElasticController::~ElasticController() { Stop(); }

void ElasticController::Stop() {
  StopDiscovery();
  // A connection still under way (growing onto a remote host) posts nothing from now on, and
  // closes its agent when it completes; a moment is given for it to end first.
  std::unique_lock<std::mutex> lock(connections_->mu);
  connections_->closed = true;
  connections_->changed.wait_for(lock, std::chrono::seconds(1),
                                 [this] { return connections_->running == 0; });
}

// An elastic job survives a lost host: its ranks are lost ranks, and the launcher notices within
// kElasticSilenceLimit (the agent kills its ranks after the same silence).
remote::RemoteTiming ElasticController::Timing() const {
  remote::RemoteTiming timing;
  timing.heartbeat = remote::kElasticHeartbeatInterval;
  timing.silence = remote::kElasticSilenceLimit;
  return timing;
}

void ElasticController::Configure(remote::Job& job) const {
  job.silence_limit_ms = static_cast<uint32_t>(remote::kElasticSilenceLimit.count());
}

std::function<void(const std::vector<int>&, const std::string&)>
ElasticController::HostLostHandler() {
  return [this](const std::vector<int>& ranks, const std::string& why) {
    if (server_) {
      for (int rank : ranks) server_->NoteRankExit(rank, why);
    }
    host_failed_ = true;
    const bool blacklist = !ranks.empty() && !supervisor_->StoppedOnPurpose(ranks.front());
    if (blacklist) {
      Blacklist(slots_.HostOf(ranks.front()).host, absl::StrCat("it was lost (", why, ")"));
    }
    supervisor_->OnHostLost(ranks, why);
    if (blacklist)
      EndIfEveryHostBlacklisted(absl::StrCat(why, ": ", RankRanges(ranks), " lost"), 1);
  };
}

void ElasticController::OnRankExit(int rank, const ExitInfo& exit) {
  // A rank that failed on its own blacklists its host (Horovod's rule).
  const bool host_failure =
      !exit.ok() && !supervisor_->StoppedOnPurpose(rank) && supervisor_->Live(rank);
  supervisor_->OnRankExit(rank, exit);
  if (host_failure) {
    Blacklist(slots_.HostOf(rank).host, absl::StrCat("rank ", rank, " ", exit.Describe()));
    EndIfEveryHostBlacklisted(
        absl::StrCat("rank ", rank, " on ", slots_.HostOf(rank).host, " ", exit.Describe()),
        exit.ExitCode());
  }
}

void ElasticController::EndIfEveryHostBlacklisted(const std::string& failure, int code) {
  // Only hosts blacklisted for good (no --blacklist-cooldown-range): with a cooldown they return.
  if (spec_.elastic->discovery_script.empty() || spec_.elastic->blacklist_cooldown.has_value() ||
      supervisor_->done() || supervisor_->ending() || supervisor_->finishing()) {
    return;
  }
  std::set<std::string> hosts = listed_;
  if (hosts.empty()) {
    for (const hostfile::HostSpec& host : slots_.hosts) hosts.insert(host.host);
  }
  const auto now = std::chrono::steady_clock::now();
  for (const std::string& host : hosts) {
    if (!Blacklisted(host, now)) return;
  }
  std::vector<std::string> names(hosts.begin(), hosts.end());
  supervisor_->EndFor(EveryHostBlacklisted{
      absl::StrCat(failure,
                   "; every host of the host discovery script's output is now blacklisted (",
                   absl::StrJoin(names, ", "),
                   "), so no host is left to go on with: Horovod detected that one or more "
                   "processes exited with non-zero status, and the job was stopped"),
      code == 0 ? 1 : code});
}

void ElasticController::StartDiscovery() {
  if (spec_.elastic->discovery_script.empty()) return;
  Logger().debug(
      "elastic: a failing rank blacklists its host for new ranks, as Horovod's, but its other "
      "ranks go on (Horovod stops every rank of a blacklisted host); the job fails once every "
      "host is blacklisted");
  discovery_thread_ = std::thread([this] {
    const ElasticSpec& elastic = *spec_.elastic;
    std::unique_lock<std::mutex> lock(discovery_mutex_);
    for (;;) {
      if (discovery_wake_.wait_for(lock, elastic.discovery_interval,
                                   [this] { return discovery_stop_; })) {
        return;
      }
      lock.unlock();
      const auto when = std::chrono::steady_clock::now();
      absl::StatusOr<std::vector<hostfile::HostSpec>> hosts =
          RunDiscoveryScript(elastic.discovery_script, elastic.slots_per_host);
      boost::asio::post(io_, [this, hosts = std::move(hosts), when] { OnDiscovered(hosts, when); });
      lock.lock();
    }
  });
}

void ElasticController::StopDiscovery() {
  {
    std::lock_guard<std::mutex> lock(discovery_mutex_);
    discovery_stop_ = true;
  }
  discovery_wake_.notify_all();
  if (discovery_thread_.joinable()) discovery_thread_.join();
}

void ElasticController::OnDiscovered(const absl::StatusOr<std::vector<hostfile::HostSpec>>& hosts,
                                     std::chrono::steady_clock::time_point when) {
  if (supervisor_->done() || supervisor_->ending()) return;
  if (!hosts.ok()) {
    const std::string message(hosts.status().message());
    if (discovery_said_.insert(message).second) {
      Logger().warn("{}; the job keeps its hosts meanwhile", message);
    }
    return;
  }
  // A host gone from the output: its ranks are stopped (the job shrinks).
  std::set<std::string> listed;
  for (const hostfile::HostSpec& host : *hosts) listed.insert(host.host);
  auto live_on = [this](const std::string& name) {
    std::vector<int> ranks;
    for (const hostfile::RankAssignment& a : slots_.ranks) {
      if (slots_.hosts[a.host_index].host == name && supervisor_->Live(a.rank)) {
        ranks.push_back(a.rank);
      }
    }
    return ranks;
  };
  for (const hostfile::HostSpec& known : slots_.hosts) {
    if (listed.count(known.host) > 0) continue;
    if (std::vector<int> ranks = live_on(known.host); !ranks.empty()) {
      supervisor_->OnRanksRemoved(
          ranks, absl::StrCat("host ", known.host, " left the host discovery script's output"));
    }
  }
  // A host that appeared, or has free slots: the job grows onto it, up to --max-np, unless it is
  // blacklisted or the job is finishing.
  listed_ = listed;
  if (supervisor_->finishing()) return;
  int room = spec_.elastic->max_np - LiveOrConnecting();
  const auto now = std::chrono::steady_clock::now();
  for (const hostfile::HostSpec& host : *hosts) {
    if (room <= 0) break;
    auto connecting = connecting_.find(host.host);
    const int here = static_cast<int>(live_on(host.host).size()) +
                     (connecting != connecting_.end() ? connecting->second : 0);
    const int count = std::min(host.slots - here, room);
    if (count <= 0 || Blacklisted(host.host, now)) continue;
    if (IsLocalHost(host.host)) {
      Grow(host, count, here == 0, when);
    } else if (std::string why = CannotReachFromRanks(host.host); !why.empty()) {
      if (discovery_said_.insert(why).second) Logger().warn("{}", why);
      continue;
    } else {
      ConnectToGrow(host, count, here == 0, when);
    }
    room -= count;
  }
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
                                      std::chrono::steady_clock::time_point since) {
  connecting_[host.host] += count;
  Logger().debug(
      "host {} appeared in the host discovery script's output: connecting to it for {} "
      "ranks",
      host.host, count);
  // The channel and the greeting of the start (SSH options, host keys, the agent), on a thread of
  // its own: the io thread goes on meanwhile.
  std::shared_ptr<channel::HostChannel> channel = remote::MakeHostChannel(spec_);
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
  const std::string why =
      absl::StrCat("host ", host.host, joined_host ? " joined" : " has more slots",
                   " (from the host discovery script): ", RankRanges(ranks), " started");
  if (!spec_.quiet) {
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

bool ElasticController::Blacklisted(const std::string& host,
                                    std::chrono::steady_clock::time_point now) const {
  auto it = blacklist_.find(host);
  return it != blacklist_.end() && (it->second.forever || now < it->second.until);
}

void ElasticController::Blacklist(const std::string& host, const std::string& what) {
  if (spec_.elastic->discovery_script.empty()) return;
  const auto now = std::chrono::steady_clock::now();
  if (Blacklisted(host, now)) return;  // the same failure's other ranks
  Blacklisting& entry = blacklist_[host];
  ++entry.times;
  if (!spec_.elastic->blacklist_cooldown.has_value()) {
    entry.forever = true;
    Logger().warn(
        "host {} blacklisted after {}; the job does not grow onto it again "
        "(--blacklist-cooldown-range MIN MAX would retry it)",
        host, what);
    return;
  }
  // MIN, then twice as long each time the host is blacklisted again, up to MAX.
  const auto [low, high] = *spec_.elastic->blacklist_cooldown;
  std::chrono::seconds cooldown = low;
  for (int i = 1; i < entry.times && cooldown < high; ++i) cooldown *= 2;
  cooldown = std::min(cooldown, high);
  entry.until = now + cooldown;
  Logger().warn("host {} blacklisted after {}; not retried for {} s", host, what, cooldown.count());
}

void ElasticController::PublishGeneration(const MembershipChange& change) {
  rendezvous::Generation generation;
  generation.number = change.generation;
  for (int slot : change.members) {
    generation.members.push_back({slot, slots_.HostOf(slot).host});
  }
  // The value first, then the counter: a rank that reads the counter finds the value there.
  if (absl::Status set =
          server_->Set(rendezvous::GenerationKey(generation.number), generation.Encode());
      !set.ok()) {
    Logger().error("cannot publish the job's generation {}: {}", generation.number,
                   std::string(set.message()));
    supervisor_->OnStartFailure(change.members.front(), std::string(set.message()));
    return;
  }
  server_->SetCounter(rendezvous::kLatestGenerationKey, generation.number);
  published_generation_ = generation.number;
  Logger().debug("published generation {}: {}", generation.number, generation.Encode());
  WatchGenerations();
}

void ElasticController::WatchGenerations() {
  generation_timer_.expires_after(std::chrono::milliseconds(5));
  generation_timer_.async_wait([this](const boost::system::error_code& error) {
    if (error || supervisor_->done()) return;
    while (forming_generation_ <= published_generation_) {
      const MembershipChange& change = supervisor_->MembershipChanges()[forming_generation_ - 1];
      const size_t joined =
          server_->ValuesWithPrefix(rendezvous::GenerationJoinedPrefix(forming_generation_)).size();
      if (joined < change.members.size()) {
        // A newer generation replaces this one when a member was lost before it formed.
        if (forming_generation_ == published_generation_) break;
        Logger().warn("{}; generation {} was replaced by {} before it formed", change.why,
                      forming_generation_, forming_generation_ + 1);
      } else {
        Logger().warn("{}", supervisor_->OnGenerationFormed(forming_generation_));
      }
      ++forming_generation_;
    }
    if (forming_generation_ <= published_generation_) WatchGenerations();
  });
}

}  // namespace trainrun::launcher
