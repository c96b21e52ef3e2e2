#include "job_run.h"

#include <signal.h>
#include <unistd.h>

#include <boost/asio/post.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
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
namespace {

bool IsWildcard(const std::string& address) { return address == "0.0.0.0" || address == "::"; }

// HostPort writes "host:port", bracketing an IPv6 address.
std::string HostPort(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port)
                                             : absl::StrCat(host, ":", port);
}

std::string CurrentDirectory() {
  char cwd[4096] = {};
  return ::getcwd(cwd, sizeof cwd - 1) ? cwd : "";
}

}  // namespace

JobRun::JobRun(const LaunchSpec& spec, const JobPlan& plan, OutputForwarder& output,
               std::vector<remote::RemoteAgent> agents)
    : spec_(spec),
      slots_(spec.plan),
      plan_(plan),
      output_(output),
      local_ranks_(io_, {[this](int rank, OutputStream stream, std::string_view bytes) {
                           OnOutput(rank, stream, bytes);
                         },
                         [this](int rank, const ExitInfo& exit) { OnExit(rank, exit); }}),
      remote_ranks_(io_, std::move(agents),
                    {[this](int rank, OutputStream stream, std::string_view bytes) {
                       OnOutput(rank, stream, bytes);
                     },
                     [this](int rank, const ExitInfo& exit) { OnExit(rank, exit); },
                     [this](int rank, std::string message) {
                       host_failed_ = true;
                       supervisor_->OnStartFailure(rank, std::move(message));
                     },
                     [this](int rank, const std::string& binding) { OnStarted(rank, binding); },
                     HostLostHandler(spec)},
                    RemoteTimingFor(spec)),
      all_ranks_({&local_ranks_, &remote_ranks_}),
      signals_(io_, SIGINT, SIGTERM, SIGHUP),
      stall_inspector_(spec.plan.size(), spec.stall_warning, spec.stall_shutdown),
      stall_timer_(io_),
      generation_timer_(io_),
      growth_timer_(io_),
      monitor_(spec, plan, io_) {
  SupervisorOptions options;
  options.command = spec.command[0];
  options.grace_period = spec.grace_period;
  options.elastic = spec.elastic;
  supervisor_.emplace(
      io_, slots_, all_ranks_, options, [this] { io_.stop(); },
      [this](const MembershipChange& change) { PublishGeneration(change); });
  WaitForSignal();
  // trainrun's stdin goes to rank 0 when it runs here; a remote rank 0 gets /dev/null.
  if (plan.rank_is_local[0]) stdin_forwarder_ = internal::StdinForwarder::Create(io_);
}

JobRun::~JobRun() {
  StopDiscovery();
  // A connection still under way (growing onto a remote host) posts nothing from now on, and
  // closes its agent when it completes; a moment is given for it to end first.
  std::unique_lock<std::mutex> lock(connections_->mu);
  connections_->closed = true;
  connections_->changed.wait_for(lock, std::chrono::seconds(1),
                                 [this] { return connections_->running == 0; });
}

void JobRun::StartDiscovery() {
  if (!spec_.elastic.has_value() || spec_.elastic->discovery_script.empty()) return;
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

void JobRun::StopDiscovery() {
  {
    std::lock_guard<std::mutex> lock(discovery_mutex_);
    discovery_stop_ = true;
  }
  discovery_wake_.notify_all();
  if (discovery_thread_.joinable()) discovery_thread_.join();
}

void JobRun::OnDiscovered(const absl::StatusOr<std::vector<hostfile::HostSpec>>& hosts,
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

int JobRun::LiveOrConnecting() const {
  int count = 0;
  for (const hostfile::RankAssignment& a : slots_.ranks) count += supervisor_->Live(a.rank) ? 1 : 0;
  for (const auto& [host, ranks] : connecting_) count += ranks;
  return count;
}

std::string JobRun::CannotReachFromRanks(const std::string& host) const {
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

void JobRun::ConnectToGrow(const hostfile::HostSpec& host, int count, bool joined_host,
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

void JobRun::OnGrowConnected(const hostfile::HostSpec& host, int count, bool joined_host,
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

std::optional<rendezvous::RankPlace> JobRun::PlaceWith(const std::vector<int>& added,
                                                       int slot) const {
  rendezvous::Generation generation;
  for (const hostfile::RankAssignment& a : slots_.ranks) {
    const bool member =
        supervisor_->Live(a.rank) || std::find(added.begin(), added.end(), a.rank) != added.end();
    if (member) generation.members.push_back({a.rank, slots_.hosts[a.host_index].host});
  }
  return generation.PlaceOf(slot);
}

HostView JobRun::GrownHostView(const hostfile::HostSpec& host,
                               const remote::RemoteAgent* agent) const {
  HostView view;
  view.name = host.host;
  view.rendezvous_addr = server_->address();
  view.master_addr = views_.empty() ? host.host : views_[0].master_addr;
  view.gpu_count = CountHostGpus();
  if (agent == nullptr) return view;
  // A remote host: as HostViews sees the start's.
  const int master_host = spec_.plan.ranks[0].host_index;
  if (master_host < static_cast<int>(views_.size())) {
    view.master_addr = views_[master_host].master_addr;
  }
  SeenThrough(*agent, bind_address_, /*master_here=*/plan_.rank_is_local[0], view);
  return view;
}

void JobRun::SeenThrough(const remote::RemoteAgent& agent, const std::string& bind_address,
                         bool master_here, HostView& view) const {
  // This machine as that host sees it.
  const std::string launcher_address = remote::LauncherAddress(agent);
  view.address = agent.stream->RemoteAddress();
  view.gpu_count = static_cast<int>(agent.hello.gpu_count);
  if (IsWildcard(bind_address) && !launcher_address.empty()) {
    view.rendezvous_addr = HostPort(launcher_address, server_->port());
  }
  if (master_here && !launcher_address.empty()) view.master_addr = launcher_address;
}

void JobRun::Grow(const hostfile::HostSpec& host, int count, bool joined_host,
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
  remote::Job job = RemoteJob();
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

void JobRun::WatchGrowth() {
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

bool JobRun::Blacklisted(const std::string& host, std::chrono::steady_clock::time_point now) const {
  auto it = blacklist_.find(host);
  return it != blacklist_.end() && (it->second.forever || now < it->second.until);
}

void JobRun::Blacklist(const std::string& host, const std::string& what) {
  if (!spec_.elastic.has_value() || spec_.elastic->discovery_script.empty()) return;
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

// An elastic job survives a lost host: its ranks are lost ranks, and the launcher notices within
// kElasticSilenceLimit. Other jobs keep the host's loss a failure and the longer limits.
std::function<void(const std::vector<int>&, const std::string&)> JobRun::HostLostHandler(
    const LaunchSpec& spec) {
  if (!spec.elastic.has_value()) return {};
  return [this](const std::vector<int>& ranks, const std::string& why) {
    if (server_) {
      for (int rank : ranks) server_->NoteRankExit(rank, why);
    }
    host_failed_ = true;
    if (!ranks.empty() && !supervisor_->StoppedOnPurpose(ranks.front())) {
      Blacklist(slots_.HostOf(ranks.front()).host, absl::StrCat("it was lost (", why, ")"));
    }
    supervisor_->OnHostLost(ranks, why);
  };
}

remote::RemoteTiming JobRun::RemoteTimingFor(const LaunchSpec& spec) {
  remote::RemoteTiming timing;
  if (spec.elastic.has_value()) {
    timing.heartbeat = remote::kElasticHeartbeatInterval;
    timing.silence = remote::kElasticSilenceLimit;
  }
  return timing;
}

// Local and remote ranks report the same events; output goes to the console (and files) and to the
// supervisor, which keeps each rank's last stderr lines for the summary.
void JobRun::OnOutput(int rank, OutputStream stream, std::string_view bytes) {
  output_.Write(rank, stream, bytes);
  supervisor_->OnOutput(rank, stream, bytes);
  monitor_.OnOutput(rank, bytes);
}

void JobRun::OnExit(int rank, const ExitInfo& exit) {
  if (server_) server_->NoteRankExit(rank, exit.Describe());
  monitor_.OnExit(rank, exit);
  // A rank of an elastic job that failed on its own blacklists its host (Horovod's rule).
  const bool host_failure = spec_.elastic.has_value() && !exit.ok() &&
                            !supervisor_->StoppedOnPurpose(rank) && supervisor_->Live(rank);
  supervisor_->OnRankExit(rank, exit);
  if (host_failure) {
    Blacklist(slots_.HostOf(rank).host, absl::StrCat("rank ", rank, " ", exit.Describe()));
  }
}

void JobRun::OnStarted(int rank, const std::string& binding) {
  monitor_.OnStarted(rank);
  if (spec_.report_bindings) {
    Logger().info("rank {} on {} bound {}", rank, slots_.HostOf(rank).host, binding);
  }
  if (++started_ != spec_.plan.size() || spec_.quiet || supervisor_->done()) return;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - launched_).count();
  const int hosts = static_cast<int>(spec_.plan.hosts.size());
  Logger().info("{} {} on {} {} started in {:.2f} s", started_, started_ == 1 ? "rank" : "ranks",
                hosts, hosts == 1 ? "host" : "hosts", seconds);
}

void JobRun::WaitForSignal() {
  signals_.async_wait([this](const boost::system::error_code& error, int signal) {
    if (error) return;
    supervisor_->OnSignal(signal);
    WaitForSignal();
  });
}

absl::Status JobRun::ServeRendezvous() {
  // Where the server listens: --rendezvous-addr, else --network-interface's address, else the
  // local address of the connections toward the remote hosts, else loopback (every rank is here).
  std::string bind_address = !spec_.rendezvous_addr.empty()     ? spec_.rendezvous_addr
                             : !plan_.interface_address.empty() ? plan_.interface_address
                             : !remote_ranks_.agents().empty()
                                 ? remote::RendezvousBindAddress(remote_ranks_.agents())
                                 : "127.0.0.1";
  rendezvous::ServerOptions options;
  options.bind_address = bind_address;
  // A wildcard bind advertises this machine's side of the first connection (or loopback).
  if (IsWildcard(bind_address))
    options.advertise_host = remote::AdvertiseHost(remote_ranks_.agents());
  options.port = spec_.rendezvous_port;
  options.job_id = plan_.environment.job_id();
  options.token = plan_.environment.token();
  for (const hostfile::RankAssignment& a : spec_.plan.ranks) {
    options.ranks.push_back(
        {spec_.plan.HostOf(a.rank).host, a.local_rank, a.local_size, a.cross_rank, a.cross_size});
  }
  // A rank's "I failed because of peer P" arrives on a gRPC thread and is posted to the supervisor,
  // which then blames P rather than the rank that reported it.
  // In an elastic job a rank's number changes with each generation, so a report's ranks cannot be
  // trusted to name slots; the supervisor of an elastic job blames exits alone.
  if (!spec_.elastic.has_value())
    options.on_peer_failure = [this](const rendezvous::PeerFailure& f) {
      boost::asio::post(io_, [this, rank = f.rank, peer = f.peer_rank, message = f.message] {
        supervisor_->ReportPeerFailure(rank, peer, message);
      });
    };
  // Joins go to the supervisor, which sees from them and the exits a rank that exited 0 without
  // ever joining while joined ranks still run (the job cannot finish; it ends naming that rank).
  options.on_join = [this](int rank) {
    boost::asio::post(io_, [this, rank] { supervisor_->OnRankJoined(rank); });
  };
  absl::StatusOr<std::unique_ptr<rendezvous::Server>> server =
      rendezvous::Server::Start(std::move(options));
  if (!server.ok()) {
    return absl::Status(
        server.status().code(),
        absl::StrCat("cannot start the job's rendezvous server: ", server.status().message()));
  }
  server_ = *std::move(server);
  Logger().debug("rendezvous server at {}", server_->address());
  bind_address_ = bind_address;
  views_ = HostViews(bind_address);
  return absl::OkStatus();
}

std::vector<HostView> JobRun::HostViews(const std::string& bind_address) const {
  const std::vector<remote::RemoteAgent>& agents = remote_ranks_.agents();
  auto agent_of = [&](int host_index) -> const remote::RemoteAgent* {
    for (size_t i = 0; i < plan_.remote_hosts.size() && i < agents.size(); ++i) {
      if (plan_.remote_hosts[i] == host_index) return &agents[i];
    }
    return nullptr;
  };
  // MASTER_ADDR: rank 0's host as the user wrote it while every rank is there; once hosts are
  // reached, the address trainrun reached rank 0's host at (an ~/.ssh/config alias is a name only
  // this machine knows), or, when rank 0 is here, this machine's address toward each host.
  const int master_host = spec_.plan.ranks[0].host_index;
  const remote::RemoteAgent* master_agent = agent_of(master_host);
  std::string master_addr = spec_.plan.hosts[master_host].host;
  if (master_agent != nullptr && !master_agent->stream->RemoteAddress().empty()) {
    master_addr = master_agent->stream->RemoteAddress();
  }
  const int local_gpus = CountHostGpus();
  std::vector<HostView> views;
  for (size_t h = 0; h < spec_.plan.hosts.size(); ++h) {
    HostView view;
    view.name = spec_.plan.hosts[h].host;
    view.rendezvous_addr = server_->address();
    view.master_addr = master_addr;
    view.gpu_count = local_gpus;
    if (const remote::RemoteAgent* agent = agent_of(static_cast<int>(h))) {
      SeenThrough(*agent, bind_address, /*master_here=*/master_agent == nullptr, view);
    }
    views.push_back(std::move(view));
  }
  return views;
}

remote::Job JobRun::RemoteJob() const {
  remote::Job job;
  job.cwd = plan_.working_dir.empty() ? CurrentDirectory() : plan_.working_dir;
  job.bind_to = static_cast<uint32_t>(spec_.bind_to);
  job.argv = spec_.command;
  job.grace_period_ms = static_cast<uint32_t>(spec_.grace_period.count());
  job.stdout_pty = spec_.stdout_pty;
  if (spec_.elastic.has_value()) {
    job.silence_limit_ms = static_cast<uint32_t>(remote::kElasticSilenceLimit.count());
  }
  return job;
}

void JobRun::StartRanks(const StartDeadline& deadline) {
  launched_ = deadline.when - deadline.timeout;
  if (!plan_.remote_hosts.empty()) {
    std::vector<remote::Job> jobs;
    for (int host_index : plan_.remote_hosts) {
      remote::Job job = RemoteJob();
      for (const hostfile::RankAssignment& a : spec_.plan.ranks) {
        if (a.host_index != host_index) continue;
        job.ranks.push_back(
            {static_cast<uint32_t>(a.rank), plan_.environment.ForRank(a.rank, views_[host_index])});
        supervisor_->OnRankStarted(a.rank);
      }
      jobs.push_back(std::move(job));
    }
    remote_ranks_.Start(std::move(jobs), deadline);
  }
  StartLocalRanks();
  supervisor_->OnStartsComplete();
  Logger().debug("job {}: started {} local ranks of {} ({} hosts remote)",
                 plan_.environment.job_id(), local_ranks_.running(), spec_.plan.size(),
                 plan_.remote_hosts.size());
}

void JobRun::StartLocalRanks() {
  WarnIfOversubscribed();
  for (const hostfile::RankAssignment& a : spec_.plan.ranks) {
    if (!plan_.rank_is_local[a.rank]) continue;
    ProcessSpec process;
    process.cpus = CpusForRank(plan_.cpus, spec_.bind_to, a.local_rank, a.local_size);
    process.cwd = plan_.working_dir;
    process.executable = plan_.executable.path;
    process.argv = spec_.command;
    process.env = plan_.environment.ForRank(a.rank, views_[a.host_index]);
    process.stdin_fd = a.rank == 0 ? stdin_forwarder_->rank_stdin() : -1;
    process.stdout_pty = spec_.stdout_pty;
    if (absl::Status started = local_ranks_.Start(a.rank, process); !started.ok()) {
      supervisor_->OnStartFailure(a.rank, std::string(started.message()));
      return;
    }
    supervisor_->OnRankStarted(a.rank);
    OnStarted(a.rank, DescribeBinding(plan_.cpus, spec_.bind_to, a.local_rank, a.local_size));
    if (a.rank == 0) stdin_forwarder_->RankStarted();
  }
}

void JobRun::WarnIfOversubscribed() const {
  int local = 0;
  for (bool is_local : plan_.rank_is_local) local += is_local ? 1 : 0;
  const int cores = static_cast<int>(plan_.cpus.cores.size());
  if (spec_.oversubscribe || cores == 0 || local <= cores) return;
  Logger().warn(
      "{} ranks on this host, which has {} {} for them: ranks share cores and each runs slower "
      "(--oversubscribe says this is intended and turns this warning off)",
      local, cores, cores == 1 ? "core" : "cores");
}

void JobRun::InspectStalls() {
  if (spec_.stall_warning.count() <= 0) return;
  stall_timer_.expires_after(std::chrono::seconds(1));
  stall_timer_.async_wait([this](const boost::system::error_code& error) {
    if (error || supervisor_->done() || !server_) return;
    std::map<int, std::string> waiting;
    const std::string prefix = env::kStallKeyPrefix;
    for (const auto& [key, value] : server_->ValuesWithPrefix(prefix)) {
      int rank = -1;
      if (absl::SimpleAtoi(key.substr(prefix.size()), &rank)) waiting[rank] = value;
    }
    const auto now = std::chrono::steady_clock::now();
    std::string warning = stall_inspector_.Update(waiting, now);
    const std::string link = monitor_.OnStalls(waiting, stall_inspector_, warning);
    if (!warning.empty()) Logger().warn("{}{}", warning, link);
    if (stall_inspector_.ShutdownDue(now)) {
      supervisor_->OnStall(stall_inspector_.Stalled(), stall_inspector_.Describe(now));
      return;
    }
    InspectStalls();
  });
}

void JobRun::PublishGeneration(const MembershipChange& change) {
  monitor_.OnMembershipChanges(change.generation);
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

void JobRun::WatchGenerations() {
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

void JobRun::Supervise() {
  monitor_.Serve(*server_);
  InspectStalls();
  StartDiscovery();
  if (!supervisor_->done()) io_.run();
}

int JobRun::Summarize() {
  StopDiscovery();
  monitor_.Finish(supervisor_->Summary());
  server_->Shutdown();
  output_.EndLines();
  if (spec_.elastic.has_value() && supervisor_->exit_code() == 0) {
    if (std::string changes = supervisor_->ElasticSummary(); !changes.empty()) {
      Logger().info("{}", changes);
    }
  }
  if (std::string summary = supervisor_->Summary(); !summary.empty()) {
    // Slurm ends every step of an allocation past its time limit, on scancel or when a node fails:
    // what the ranks did then is its consequence, and the summary says so first.
    // A lost host or a rank killed by a signal may be the scheduler's doing, which its controller
    // records a moment after the steps end: then it is given up to 3 s to say so.
    const bool maybe_scheduler = host_failed_ || supervisor_->exit_code() > 128;
    if (std::string why = remote::SchedulerEnded(spec_, maybe_scheduler);
        !why.empty() && summary.find(why) == std::string::npos) {
      summary = absl::StrCat(why, ", which ended the job; what trainrun saw then:\n", summary);
    }
    Logger().error("{}", absl::StrReplaceAll(summary, {{"\n", "\n  "}}));
  }
  // Per-node mode: every joined node's trainrun prints the same summary and exits the same way.
  if (spec_.per_node) remote_ranks_.EndJob({supervisor_->exit_code(), supervisor_->Summary()});
  return supervisor_->exit_code();
}

bool JobRun::interrupted() const { return supervisor_->interrupted(); }

std::string JobRun::cause() const {
  std::string summary = supervisor_->Summary();
  return summary.substr(0, summary.find('\n'));
}

}  // namespace trainrun::launcher
