#include "remote/agent_connector.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "trainrun/launcher/logging.h"
#include "trainrun/launcher/shell_quote.h"

namespace trainrun::launcher::remote {

std::string AgentCommand(const std::string& remote_trainrun) {
  return absl::StrCat(ShellQuote(remote_trainrun), " --agent");
}

namespace {

// GreetAgent waits on a host's stream for its agent's Hello. `cancelled` is polled meanwhile.
absl::StatusOr<RemoteAgent> GreetAgent(const hostfile::HostSpec& host,
                                       std::unique_ptr<channel::HostStream> stream,
                                       const std::string& command, absl::Time deadline,
                                       const std::function<bool()>& cancelled) {
  RemoteAgent agent;
  agent.host = host;
  agent.stream = std::move(stream);
  const std::string& name = host.host;
  char buffer[4096];
  for (;;) {
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("host ", name, ": timed out waiting for the agent (`", command,
                       "`) to start; raise --start-timeout"));
    }
    if (cancelled()) return absl::CancelledError("another host failed");
    // Short slices, so that an attempt abandoned because another host failed ends promptly.
    auto n = agent.stream->Read(buffer, sizeof buffer, std::min(left, absl::Milliseconds(100)));
    if (!n.ok() && absl::IsDeadlineExceeded(n.status())) continue;
    if (!n.ok() || *n == 0) {
      // The connection or the agent ended before saying hello: the openssh client's failures, or a
      // remote shell that could not run trainrun.
      absl::Status end = agent.stream->EndStatus();
      if (!end.ok() && end.message().find("exited with status 127") != absl::string_view::npos) {
        return absl::FailedPreconditionError(absl::StrCat(
            "host ", name, ": could not start the agent (`", command,
            "`): trainrun is not installed at that path there; install it at the same path on "
            "every host, or pass --remote-trainrun PATH (",
            end.message(), ")"));
      }
      if (!end.ok()) return end;
      return n.ok() ? absl::UnavailableError(absl::StrCat(
                          "host ", name, ": the agent (`", command,
                          "`) exited before it started; is trainrun there the same version?"))
                    : n.status();
    }
    agent.reader.Append(absl::string_view(buffer, *n));
    auto frame = agent.reader.Next();
    if (!frame.ok()) {
      return absl::DataLossError(absl::StrCat("host ", name, ": ", frame.status().message()));
    }
    if (!frame->has_value()) continue;
    if ((*frame)->type != MessageType::kHello) {
      return absl::DataLossError(
          absl::StrCat("host ", name, ": the agent did not start with a greeting"));
    }
    auto hello = DecodeHello((*frame)->payload);
    if (!hello.ok()) return hello.status();
    if (hello->version != kProtocolVersion) {
      // Before protocol 3 an agent did not say its release.
      return absl::FailedPreconditionError(absl::StrCat(
          "host ", name, ": its trainrun ",
          hello->release.empty() ? "(an older release)" : hello->release, " speaks agent protocol ",
          hello->version, ", this trainrun ", TrainrunRelease(), " speaks ", kProtocolVersion,
          "; install the same trainrun version on every host"));
    }
    agent.hello = *std::move(hello);
    return agent;
  }
}

}  // namespace

absl::StatusOr<std::vector<RemoteAgent>> ConnectAgents(
    channel::HostChannel& channel, const std::vector<hostfile::HostSpec>& hosts,
    const std::string& command, absl::Time deadline,
    const std::function<void(int connected, int total)>& on_progress) {
  // The channel's callbacks and the greeting threads may outlive this call when it returns at the
  // first failure; what they share lives as long as the last of them. An agent connected after
  // that is dropped, which closes it.
  struct Shared {
    std::mutex mu;
    std::condition_variable changed;
    std::vector<std::optional<RemoteAgent>> agents;
    std::optional<absl::Status> failure;
    std::atomic<bool> abandoned{false};
    int connected = 0;
    int absent = 0;   // optional hosts that did not come (channel::IsHostAbsent)
    int running = 0;  // hosts not finished yet
  };
  auto shared = std::make_shared<Shared>();
  shared->agents.resize(hosts.size());
  shared->running = static_cast<int>(hosts.size());
  auto finish = [shared](int i, absl::StatusOr<RemoteAgent> agent) {
    std::lock_guard<std::mutex> lock(shared->mu);
    if (!agent.ok() && channel::IsHostAbsent(agent.status())) {
      ++shared->absent;
    } else if (!agent.ok()) {
      if (!shared->failure) shared->failure = agent.status();
    } else if (!shared->failure) {
      shared->agents[i] = *std::move(agent);
      ++shared->connected;
    }
    --shared->running;
    shared->changed.notify_all();
  };
  channel.Start(hosts, command, deadline,
                [shared, finish, hosts, command, deadline](
                    int i, absl::StatusOr<std::unique_ptr<channel::HostStream>> stream) {
                  if (!stream.ok()) return finish(i, stream.status());
                  std::thread([shared, finish, i, host = hosts[i], command, deadline,
                               stream = *std::move(stream)]() mutable {
                    finish(i, GreetAgent(host, std::move(stream), command, deadline,
                                         [&] { return shared->abandoned.load(); }));
                  }).detach();
                });
  std::unique_lock<std::mutex> lock(shared->mu);
  int reported = 0;
  for (;;) {
    if (shared->failure) {
      // Close what is open now; attempts still running drop theirs when they finish.
      shared->abandoned = true;
      for (auto& agent : shared->agents) agent.reset();
      // Give the other attempts a moment to see `abandoned` and end (they check it in short
      // slices), so that few threads are still inside libssh2 or OpenSSL when the process exits.
      shared->changed.wait_for(lock, std::chrono::seconds(1), [&] { return shared->running == 0; });
      for (auto& agent : shared->agents) agent.reset();
      return *shared->failure;
    }
    if (shared->connected != reported) {
      reported = shared->connected;
      if (on_progress) on_progress(reported, static_cast<int>(hosts.size()));
    }
    if (shared->connected + shared->absent == static_cast<int>(hosts.size())) break;
    // Every attempt ends by the deadline; the margin covers its last read.
    if (!shared->changed.wait_until(lock, absl::ToChronoTime(deadline + absl::Seconds(2)), [&] {
          return shared->failure || shared->connected != reported ||
                 shared->connected + shared->absent == static_cast<int>(hosts.size());
        })) {
      return absl::DeadlineExceededError(
          "timed out connecting to the hosts; raise --start-timeout");
    }
  }
  std::vector<RemoteAgent> agents;
  for (auto& agent : shared->agents) {
    if (agent) agents.push_back(*std::move(agent));
  }
  if (std::string mismatch = ReleaseMismatch(agents); !mismatch.empty()) {
    Logger().warn("{}", mismatch);
  }
  return agents;
}

absl::StatusOr<RemoteAgent> ConnectAgent(channel::HostChannel& channel,
                                         const hostfile::HostSpec& host, const std::string& command,
                                         absl::Time deadline) {
  absl::StatusOr<std::vector<RemoteAgent>> agents =
      ConnectAgents(channel, {host}, command, deadline);
  if (!agents.ok()) return agents.status();
  if (agents->empty())
    return absl::UnavailableError(absl::StrCat("host ", host.host, " did not come"));
  return std::move(agents->front());
}

std::string ReleaseMismatch(const std::vector<RemoteAgent>& agents) {
  std::vector<std::string> others;
  for (const RemoteAgent& agent : agents) {
    if (agent.hello.release != TrainrunRelease()) {
      others.push_back(absl::StrCat(agent.name(), " runs trainrun ", agent.hello.release));
    }
  }
  if (others.empty()) return "";
  return absl::StrCat("host ", absl::StrJoin(others, ", host "), ", this is trainrun ",
                      TrainrunRelease(),
                      " (the same agent protocol, so the job goes on); install the same trainrun "
                      "version on every host");
}

std::string LauncherAddress(const RemoteAgent& agent) {
  std::string local = agent.stream->LocalAddress();
  return local.empty() ? agent.hello.ssh_client_address : local;
}

std::string RendezvousBindAddress(const std::vector<RemoteAgent>& agents) {
  std::string address;
  for (const RemoteAgent& agent : agents) {
    std::string local = LauncherAddress(agent);
    if (local.empty()) continue;
    if (address.empty()) {
      address = local;
    } else if (address != local) {
      return "0.0.0.0";
    }
  }
  return address.empty() ? "0.0.0.0" : address;
}

std::string AdvertiseHost(const std::vector<RemoteAgent>& agents) {
  for (const RemoteAgent& agent : agents) {
    if (std::string local = LauncherAddress(agent); !local.empty()) return local;
  }
  return "127.0.0.1";
}

}  // namespace trainrun::launcher::remote
