#include "remote/remote_ranks.h"

#include <signal.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "remote/agent.h"
#include "trainrun/launcher/logging.h"

namespace trainrun::launcher::remote {
namespace {

constexpr absl::Duration kWriteTimeout = absl::Seconds(10);
constexpr absl::Duration kReadSlice = absl::Seconds(1);

}  // namespace

struct RemoteRanks::Host {
  RemoteAgent* agent = nullptr;
  std::vector<int> ranks;
  std::set<int> started;
  std::set<int> exited;
  bool done = false;    // the agent said Done
  bool ended = false;   // its stream ended (or was given up on)
  bool failed = false;  // a failure was reported for it
  bool added = false;   // connected while the job ran (RemoteRanks::Add)
  std::thread reader;

  const std::string& name() const { return agent->name(); }
  bool Owns(int rank) const { return std::find(ranks.begin(), ranks.end(), rank) != ranks.end(); }
};

RemoteRanks::RemoteRanks(boost::asio::io_context& io, std::vector<RemoteAgent> agents,
                         RemoteEvents events, RemoteTiming timing)
    : io_(io),
      agents_(std::move(agents)),
      events_(std::move(events)),
      timing_(timing),
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
  for (auto& host : hosts_) host->agent->stream->Interrupt();
  for (auto& host : hosts_) {
    if (host->reader.joinable()) host->reader.join();
  }
  // agents_ goes next: closing each connection makes its agent kill what it still runs.
}

void RemoteRanks::Start(std::vector<Job> jobs, const StartDeadline& deadline) {
  for (size_t i = 0; i < hosts_.size() && i < jobs.size(); ++i) SendJob(*hosts_[i], jobs[i]);
  for (size_t i = 0; i < agents_.size(); ++i) {
    hosts_[i]->reader = std::thread([this, h = hosts_[i].get()] { ReaderLoop(*h); });
  }
  if (!heartbeating_) Heartbeat();
  start_deadline_.expires_at(deadline.when);
  start_deadline_.async_wait([this,
                              timeout = deadline.timeout](const boost::system::error_code& error) {
    if (error) return;
    for (auto& host : hosts_) {
      size_t reported = host->started.size();
      for (int rank : host->exited) reported += host->started.count(rank) ? 0 : 1;
      if (host->added || host->ended || host->failed || reported >= host->ranks.size()) continue;
      Fail(*host,
           absl::StrCat("host ", host->name(), ": only ", reported, " of its ", host->ranks.size(),
                        " ranks started within ", timeout.count(), " s; raise --start-timeout"));
    }
  });
}

void RemoteRanks::Add(RemoteAgent agent, const Job& job) {
  if (stopping_) return;  // the connection closes with `agent`
  added_agents_.push_back(std::make_unique<RemoteAgent>(std::move(agent)));
  auto host = std::make_unique<Host>();
  host->agent = added_agents_.back().get();
  host->added = true;
  SendJob(*host, job);
  host->reader = std::thread([this, h = host.get()] { ReaderLoop(*h); });
  hosts_.push_back(std::move(host));
  if (!heartbeating_) Heartbeat();
}

void RemoteRanks::TerminateAll() {
  for (auto& host : hosts_) Send(*host, EncodeFrame(MessageType::kTerminate));
}

void RemoteRanks::KillAll() {
  for (auto& host : hosts_) Send(*host, EncodeFrame(MessageType::kKill));
}

void RemoteRanks::TerminateRanks(const std::vector<int>& ranks) {
  for (auto& host : hosts_) {
    if (std::any_of(ranks.begin(), ranks.end(), [&](int r) { return host->Owns(r); })) {
      Send(*host, EncodeFrame(MessageType::kTerminate));
    }
  }
}

void RemoteRanks::KillRanks(const std::vector<int>& ranks) {
  for (auto& host : hosts_) {
    if (std::any_of(ranks.begin(), ranks.end(), [&](int r) { return host->Owns(r); })) {
      Send(*host, EncodeFrame(MessageType::kKill));
    }
  }
}

void RemoteRanks::EndJob(const JobEnd& end) {
  const std::string frame = EncodeJobEnd(end);
  for (auto& host : hosts_) Send(*host, frame);
}

int RemoteRanks::Connected() const {
  return static_cast<int>(
      std::count_if(hosts_.begin(), hosts_.end(), [](const auto& host) { return !host->ended; }));
}

void RemoteRanks::Send(Host& host, const std::string& frame) {
  if (host.ended || stopping_) return;
  absl::Status written = host.agent->stream->Write(frame, kWriteTimeout);
  if (!written.ok()) {
    // The reader sees the same connection end and reports it.
    Logger().debug("host {}: cannot write to its agent: {}", host.name(),
                   std::string(written.message()));
  }
}

void RemoteRanks::SendJob(Host& host, const Job& job) {
  for (const RankJob& rank : job.ranks) host.ranks.push_back(static_cast<int>(rank.rank));
  Send(host, EncodeJob(job));
}

void RemoteRanks::Heartbeat() {
  heartbeating_ = true;
  for (auto& host : hosts_) Send(*host, EncodeFrame(MessageType::kHeartbeat));
  heartbeat_.expires_after(timing_.heartbeat);
  heartbeat_.async_wait([this](const boost::system::error_code& error) {
    if (!error) Heartbeat();
  });
}

void RemoteRanks::ReaderLoop(Host& host) {
  channel::HostStream& channel = *host.agent->stream;
  FrameReader& reader = host.agent->reader;  // may hold bytes that came with the Hello
  auto end = [this, &host](std::string reason) {
    boost::asio::post(io_, [this, &host, reason = std::move(reason)] { OnEnd(host, reason); });
  };
  std::vector<char> buffer(64 * 1024);
  auto last_heard = std::chrono::steady_clock::now();
  const absl::Duration slice = std::min(kReadSlice, absl::FromChrono(timing_.silence) / 4);
  for (;;) {
    for (;;) {
      auto frame = reader.Next();
      if (!frame.ok())
        return end(absl::StrCat("its agent sent garbage: ", frame.status().message()));
      if (!frame->has_value()) break;
      boost::asio::post(io_, [this, &host, f = std::move(**frame)] { OnFrame(host, f); });
    }
    if (stopping_) return;
    auto n = channel.Read(buffer.data(), buffer.size(), slice);
    if (!n.ok() && absl::IsDeadlineExceeded(n.status())) {
      if (std::chrono::steady_clock::now() - last_heard > timing_.silence) {
        return end(absl::StrCat("no word from its agent for ",
                                absl::FormatDuration(absl::FromChrono(timing_.silence)),
                                " (network lost, or the host is down)"));
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
      auto started = DecodeStarted(frame.payload);
      if (started.ok() && host.Owns(static_cast<int>(started->rank)) &&
          host.started.insert(static_cast<int>(started->rank)).second && events_.on_started) {
        events_.on_started(static_cast<int>(started->rank), started->binding);
      }
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
  if (Lost(host, absl::StrCat("host ", host.name(), " lost its agent or its link (", why, ")"))) {
    return;
  }
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

bool RemoteRanks::Lost(Host& host, const std::string& why) {
  if (!events_.on_host_lost) return false;
  std::vector<int> missing;
  for (int rank : host.ranks) {
    if (host.exited.insert(rank).second) missing.push_back(rank);
  }
  host.failed = true;
  if (!missing.empty()) events_.on_host_lost(missing, why);
  return true;
}

void RemoteRanks::Fail(Host& host, const std::string& message) {
  if (host.failed) return;
  // An agent added while the job runs that cannot start its ranks: they are lost, the job goes on.
  if (host.added && Lost(host, message)) return;
  host.failed = true;
  events_.on_failure(host.ranks.empty() ? 0 : host.ranks.front(), message);
}

}  // namespace trainrun::launcher::remote
