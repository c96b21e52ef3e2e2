// ElasticController (elastic_controller.h): lost hosts and ranks, discovery, the blacklist and
// generation publishing. Growing onto hosts is in elastic_growth.cc.
#include "elastic_controller.h"

#include <boost/asio/post.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rank_ranges.h"
#include "trainrun/launcher/host_discovery.h"
#include "trainrun/launcher/local_host.h"
#include "trainrun/launcher/logging.h"
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
      channel_(std::move(parts.channel)),
      generation_timer_(parts.io),
      growth_timer_(parts.io) {}

ElasticController::~ElasticController() { Stop(); }

void ElasticController::Stop() {
  if (channel_) channel_->AcceptLateHosts({});
  StopDiscovery();
  // A connection still under way (growing onto a remote host) posts nothing from now on, and
  // closes its agent when it completes; a moment is given for it to end first.
  std::unique_lock<std::mutex> lock(connections_->mu);
  connections_->closed = true;
  connections_->changed.wait_for(lock, std::chrono::seconds(1),
                                 [this] { return connections_->running == 0; });
}

void ElasticController::EndJob(const remote::JobEnd& end) {
  const std::string frame = remote::EncodeJobEnd(end);
  for (remote::RemoteAgent& node : ending_nodes_) {
    (void)node.stream->Write(frame, absl::Seconds(10));
  }
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
