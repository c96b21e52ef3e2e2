#include "remote/remote_ranks.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "remote/agent.h"
#include "trainrun/launcher/local_host.h"
#include "trainrun/launcher/logging.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::launcher::remote {
namespace {

constexpr absl::Duration kWriteTimeout = absl::Seconds(10);
constexpr absl::Duration kReadSlice = absl::Seconds(1);

}  // namespace

absl::StatusOr<std::string> NetworkInterfaceAddress(const std::string& name) {
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot list network interfaces: ", std::strerror(errno)));
  }
  std::string address;
  for (ifaddrs* it = all; it != nullptr && address.empty(); it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET || name != it->ifa_name)
      continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr, text,
                sizeof text);
    address = text;
  }
  ::freeifaddrs(all);
  if (address.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--network-interface ", name, ": this host has no interface '", name,
                     "' with an IPv4 address; see `ip -4 addr` for the names"));
  }
  return address;
}

absl::StatusOr<std::vector<RemoteAgent>> ConnectRemoteHosts(const LaunchSpec& spec,
                                                            const std::vector<int>& host_indices) {
  auto options = SshOptionsFor(spec);
  if (!options.ok()) return options.status();
  std::vector<ssh::SshTarget> targets;
  for (int index : host_indices) {
    const hostfile::HostSpec& host = spec.plan.hosts[index];
    auto target = ssh::ResolveSshTarget(host.user, host.host, *options);
    if (!target.ok()) return target.status();
    targets.push_back(*std::move(target));
  }
  const std::string command = AgentCommand(RemoteTrainrunPath(spec));
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + absl::FromChrono(spec.start_timeout);

  // The progress line: on a terminal only, once connecting has taken a second.
  struct Progress {
    std::mutex mu;
    std::condition_variable finished_cv;
    bool finished = false;
    int connected = 0;
  } progress;
  const int total = static_cast<int>(targets.size());
  bool shown = false;
  std::thread ticker;
  if (::isatty(2)) {
    ticker = std::thread([&] {
      std::unique_lock<std::mutex> lock(progress.mu);
      while (!progress.finished_cv.wait_for(lock, std::chrono::seconds(1),
                                            [&] { return progress.finished; })) {
        std::fprintf(stderr, "\rtrainrun: hosts %d/%d connected (%llds)", progress.connected, total,
                     static_cast<long long>(absl::ToInt64Seconds(absl::Now() - start)));
        std::fflush(stderr);
        shown = true;
      }
    });
  }
  Logger().debug("connecting to {} hosts: {}", total, command);
  auto agents = ConnectAgents(targets, command, *options, deadline, [&](int connected, int) {
    std::lock_guard<std::mutex> lock(progress.mu);
    progress.connected = connected;
  });
  if (ticker.joinable()) {
    {
      std::lock_guard<std::mutex> lock(progress.mu);
      progress.finished = true;
    }
    progress.finished_cv.notify_all();
    ticker.join();
    if (shown) std::fprintf(stderr, "\r\033[K");
  }
  if (agents.ok()) {
    Logger().debug("{} hosts connected in {}", total, absl::FormatDuration(absl::Now() - start));
  }
  return agents;
}

namespace {

std::string AgentLocalAddress(const RemoteAgent& agent) {
  std::string local = agent.channel->LocalAddress();
  return local.empty() ? agent.hello.ssh_client_address : local;
}

}  // namespace

std::string AdvertiseHost(const std::vector<RemoteAgent>& agents) {
  for (const RemoteAgent& agent : agents) {
    if (std::string local = AgentLocalAddress(agent); !local.empty()) return local;
  }
  return "127.0.0.1";
}

std::vector<Job> MakeJobs(const LaunchSpec& spec, const JobEnvironment& environment,
                          const std::vector<RemoteAgent>& agents,
                          const std::vector<int>& host_indices, const std::string& bind_address,
                          int port) {
  char cwd[4096] = {};
  std::string directory = ::getcwd(cwd, sizeof cwd - 1) ? cwd : "";
  const bool wildcard = bind_address == "0.0.0.0" || bind_address == "::";
  const std::string prefix = absl::StrCat(::trainrun::env::kRendezvousAddr, "=");
  const std::string master_prefix = absl::StrCat(::trainrun::env::kTorchMasterAddr, "=");
  std::vector<Job> jobs;
  for (size_t i = 0; i < host_indices.size() && i < agents.size(); ++i) {
    Job job;
    job.cwd = directory;
    job.argv = spec.command;
    job.grace_period_ms = static_cast<uint32_t>(spec.grace_period.count());
    // This machine as host i sees it.
    const std::string launcher_address = AgentLocalAddress(agents[i]);
    std::string local = wildcard ? launcher_address : "";
    if (local.find(':') != std::string::npos) local = absl::StrCat("[", local, "]");
    // MASTER_ADDR names rank 0's host as the user typed it; "localhost" means something else there.
    const bool master_here = IsLocalHost(spec.plan.HostOf(0).host) && !launcher_address.empty();
    for (const hostfile::RankAssignment& a : spec.plan.ranks) {
      if (a.host_index != host_indices[i]) continue;
      RankJob rank;
      rank.rank = static_cast<uint32_t>(a.rank);
      rank.env = environment.ForRank(a.rank);
      for (std::string& entry : rank.env) {
        if (!local.empty() && absl::StartsWith(entry, prefix)) {
          entry = absl::StrCat(prefix, local, ":", port);
        } else if (master_here && absl::StartsWith(entry, master_prefix)) {
          entry = absl::StrCat(master_prefix, launcher_address);
        }
      }
      job.ranks.push_back(std::move(rank));
    }
    jobs.push_back(std::move(job));
  }
  return jobs;
}

struct RemoteRanks::Host {
  RemoteAgent* agent = nullptr;
  std::vector<int> ranks;
  std::set<int> started;
  std::set<int> exited;
  bool done = false;    // the agent said Done
  bool ended = false;   // its stream ended (or was given up on)
  bool failed = false;  // a failure was reported for it
  std::thread reader;

  const std::string& name() const { return agent->target.alias; }
  bool Owns(int rank) const { return std::find(ranks.begin(), ranks.end(), rank) != ranks.end(); }
};

RemoteRanks::RemoteRanks(boost::asio::io_context& io, std::vector<RemoteAgent> agents,
                         RemoteEvents events)
    : io_(io),
      agents_(std::move(agents)),
      events_(std::move(events)),
      heartbeat_(io),
      start_deadline_(io) {
  for (RemoteAgent& agent : agents_) {
    auto host = std::make_unique<Host>();
    host->agent = &agent;
    hosts_.push_back(std::move(host));
  }
}

RemoteRanks::~RemoteRanks() {
  stopping_ = true;
  heartbeat_.cancel();
  start_deadline_.cancel();
  for (auto& host : hosts_) host->agent->channel->Interrupt();
  for (auto& host : hosts_) {
    if (host->reader.joinable()) host->reader.join();
  }
  // agents_ goes next: closing each connection makes its agent kill what it still runs.
}

void RemoteRanks::Start(std::vector<Job> jobs, std::chrono::seconds start_timeout) {
  for (size_t i = 0; i < hosts_.size() && i < jobs.size(); ++i) {
    Host& host = *hosts_[i];
    for (const RankJob& rank : jobs[i].ranks) host.ranks.push_back(static_cast<int>(rank.rank));
    Send(host, EncodeJob(jobs[i]));
  }
  for (auto& host : hosts_) {
    host->reader = std::thread([this, h = host.get()] { ReaderLoop(*h); });
  }
  Heartbeat();
  start_deadline_.expires_after(start_timeout);
  start_deadline_.async_wait([this, start_timeout](const boost::system::error_code& error) {
    if (error) return;
    for (auto& host : hosts_) {
      size_t reported = host->started.size();
      for (int rank : host->exited) reported += host->started.count(rank) ? 0 : 1;
      if (host->ended || host->failed || reported >= host->ranks.size()) continue;
      Fail(*host, absl::StrCat("host ", host->name(), ": only ", reported, " of its ",
                               host->ranks.size(), " ranks started within ", start_timeout.count(),
                               " s; raise --start-timeout"));
    }
  });
}

void RemoteRanks::TerminateAll() {
  for (auto& host : hosts_) Send(*host, EncodeFrame(MessageType::kTerminate));
}

void RemoteRanks::KillAll() {
  for (auto& host : hosts_) Send(*host, EncodeFrame(MessageType::kKill));
}

void RemoteRanks::Send(Host& host, const std::string& frame) {
  if (host.ended || stopping_) return;
  absl::Status written = host.agent->channel->Write(frame, kWriteTimeout);
  if (!written.ok()) {
    // The reader sees the same connection end and reports it.
    Logger().debug("host {}: cannot write to its agent: {}", host.name(),
                   std::string(written.message()));
  }
}

void RemoteRanks::Heartbeat() {
  for (auto& host : hosts_) Send(*host, EncodeFrame(MessageType::kHeartbeat));
  heartbeat_.expires_after(kHeartbeatInterval);
  heartbeat_.async_wait([this](const boost::system::error_code& error) {
    if (!error) Heartbeat();
  });
}

void RemoteRanks::ReaderLoop(Host& host) {
  ssh::RemoteChannel& channel = *host.agent->channel;
  FrameReader& reader = host.agent->reader;  // may hold bytes that came with the Hello
  auto end = [this, &host](std::string reason) {
    boost::asio::post(io_, [this, &host, reason = std::move(reason)] { OnEnd(host, reason); });
  };
  std::vector<char> buffer(64 * 1024);
  auto last_heard = std::chrono::steady_clock::now();
  for (;;) {
    for (;;) {
      auto frame = reader.Next();
      if (!frame.ok())
        return end(absl::StrCat("its agent sent garbage: ", frame.status().message()));
      if (!frame->has_value()) break;
      boost::asio::post(io_, [this, &host, f = std::move(**frame)] { OnFrame(host, f); });
    }
    if (stopping_) return;
    auto n = channel.Read(buffer.data(), buffer.size(), kReadSlice);
    if (!n.ok() && absl::IsDeadlineExceeded(n.status())) {
      if (std::chrono::steady_clock::now() - last_heard > kSilenceLimit) {
        return end(absl::StrCat("no word from its agent for ", kSilenceLimit.count(),
                                " s (network lost, or the host is down)"));
      }
      continue;
    }
    if (!n.ok() && absl::IsCancelled(n.status())) return;
    if (!n.ok()) return end(std::string(n.status().message()));
    if (*n == 0) {
      absl::Status why = channel.EndStatus();
      return end(why.ok() ? "its agent exited" : std::string(why.message()));
    }
    last_heard = std::chrono::steady_clock::now();
    reader.Append(absl::string_view(buffer.data(), *n));
  }
}

void RemoteRanks::OnFrame(Host& host, const Frame& frame) {
  if (stopping_ || host.ended) return;
  Logger().trace("host {}: frame type {} ({} bytes)", host.name(), static_cast<int>(frame.type),
                 frame.payload.size());
  switch (frame.type) {
    case MessageType::kStarted: {
      auto rank = DecodeStarted(frame.payload);
      if (rank.ok() && host.Owns(static_cast<int>(*rank)))
        host.started.insert(static_cast<int>(*rank));
      break;
    }
    case MessageType::kOutput: {
      auto output = DecodeOutput(frame.payload);
      if (!output.ok() || !host.Owns(static_cast<int>(output->rank))) break;
      events_.on_output(static_cast<int>(output->rank),
                        output->stream == 1 ? OutputStream::kStderr : OutputStream::kStdout,
                        output->bytes);
      break;
    }
    case MessageType::kExit: {
      auto exit = DecodeExit(frame.payload);
      if (!exit.ok()) break;
      int rank = static_cast<int>(exit->rank);
      if (!host.Owns(rank) || !host.exited.insert(rank).second) break;
      ExitInfo info;
      info.code = exit->code;
      info.signal = exit->signal;
      info.exec_errno = exit->exec_errno;
      info.time = std::chrono::steady_clock::now();
      events_.on_exit(rank, info);
      break;
    }
    case MessageType::kError: {
      auto message = DecodeError(frame.payload);
      std::string text = message.ok() ? *message : "its agent reported an unreadable error";
      // The agent names the host by its own hostname; the user knows it by the name they typed.
      absl::string_view rest = text;
      absl::ConsumePrefix(&rest, absl::StrCat("host ", host.agent->hello.hostname, ": "));
      Fail(host, absl::StrCat("host ", host.name(), ": ", rest));
      break;
    }
    case MessageType::kDone:
      host.done = true;
      break;
    default:
      break;
  }
}

void RemoteRanks::OnEnd(Host& host, const std::string& reason) {
  if (host.ended || stopping_) return;
  host.ended = true;
  Logger().debug("host {}: connection ended: {}", host.name(), reason);
  std::vector<int> missing;
  for (int rank : host.ranks) {
    if (!host.exited.count(rank)) missing.push_back(rank);
  }
  if (missing.empty()) return;  // every rank reported its end: a normal finish
  absl::string_view why = reason;
  absl::ConsumePrefix(&why, absl::StrCat("host ", host.name(), ": "));
  Fail(host, absl::StrCat("host ", host.name(), ": lost its agent before its ranks ended (", why,
                          "); its ranks there are presumed gone"));
  // Stamped after the failure started the teardown, so these are its consequence.
  for (int rank : missing) {
    host.exited.insert(rank);
    ExitInfo info;
    info.signal = SIGKILL;
    info.time = std::chrono::steady_clock::now();
    events_.on_exit(rank, info);
  }
}

void RemoteRanks::Fail(Host& host, const std::string& message) {
  if (host.failed) return;
  host.failed = true;
  events_.on_failure(host.ranks.empty() ? 0 : host.ranks.front(), message);
}

}  // namespace trainrun::launcher::remote
