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
#include "absl/strings/strip.h"
#include "trainrun/launcher/shell_quote.h"

namespace trainrun::launcher::remote {

std::string AgentCommand(const std::string& remote_trainrun) {
  return absl::StrCat(ShellQuote(remote_trainrun), " --agent");
}

namespace {

absl::StatusOr<std::unique_ptr<ssh::RemoteChannel>> OpenBounded(const ssh::SshTarget& target,
                                                                const std::string& command,
                                                                const ssh::SshOptions& options,
                                                                absl::Time deadline) {
  ssh::SshOptions bounded = options;
  bounded.connect_timeout = std::max(absl::Milliseconds(1), deadline - absl::Now());
  return ssh::OpenRemoteCommand(target, command, bounded);
}

// GreetAgent waits on an open channel for the agent's Hello.
absl::StatusOr<RemoteAgent> GreetAgent(const ssh::SshTarget& target,
                                       std::unique_ptr<ssh::RemoteChannel> channel,
                                       const std::string& command, absl::Time deadline,
                                       const std::function<bool()>& cancelled) {
  RemoteAgent agent;
  agent.target = target;
  agent.channel = std::move(channel);
  char buffer[4096];
  for (;;) {
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("host ", target.alias, ": timed out waiting for the agent (`", command,
                       "`) to start; raise --start-timeout"));
    }
    if (cancelled && cancelled()) return absl::CancelledError("another host failed");
    // Short slices, so that an attempt abandoned because another host failed ends promptly.
    auto n = agent.channel->Read(buffer, sizeof buffer, std::min(left, absl::Milliseconds(100)));
    if (!n.ok() && absl::IsDeadlineExceeded(n.status())) continue;
    if (!n.ok() || *n == 0) {
      // The connection or the agent ended before saying hello: the openssh client's failures, or a
      // remote shell that could not run trainrun.
      absl::Status end = agent.channel->EndStatus();
      if (!end.ok() && end.message().find("exited with status 127") != absl::string_view::npos) {
        return absl::FailedPreconditionError(absl::StrCat(
            "host ", target.alias, ": could not start the agent (`", command,
            "`): trainrun is not installed at that path there; install it at the same path on "
            "every host, or pass --remote-trainrun PATH (",
            end.message(), ")"));
      }
      if (!end.ok()) return end;
      return n.ok() ? absl::UnavailableError(absl::StrCat(
                          "host ", target.alias, ": the agent (`", command,
                          "`) exited before it started; is trainrun there the same version?"))
                    : n.status();
    }
    agent.reader.Append(absl::string_view(buffer, *n));
    auto frame = agent.reader.Next();
    if (!frame.ok()) {
      return absl::DataLossError(
          absl::StrCat("host ", target.alias, ": ", frame.status().message()));
    }
    if (!frame->has_value()) continue;
    if ((*frame)->type != MessageType::kHello) {
      return absl::DataLossError(
          absl::StrCat("host ", target.alias, ": the agent did not start with a greeting"));
    }
    auto hello = DecodeHello((*frame)->payload);
    if (!hello.ok()) return hello.status();
    if (hello->version != kProtocolVersion) {
      return absl::FailedPreconditionError(absl::StrCat(
          "host ", target.alias, ": its trainrun speaks agent protocol ", hello->version,
          ", this one ", kProtocolVersion, "; install the same trainrun version on every host"));
    }
    agent.hello = *std::move(hello);
    return agent;
  }
}

}  // namespace

absl::StatusOr<RemoteAgent> ConnectAgent(const ssh::SshTarget& target, const std::string& command,
                                         const ssh::SshOptions& options, absl::Time deadline,
                                         const std::function<bool()>& cancelled) {
  auto channel = OpenBounded(target, command, options, deadline);
  if (!channel.ok()) return channel.status();
  return GreetAgent(target, *std::move(channel), command, deadline, cancelled);
}

absl::StatusOr<std::vector<RemoteAgent>> ConnectAgents(
    const std::vector<ssh::SshTarget>& targets, const std::string& command,
    const ssh::SshOptions& options, absl::Time deadline,
    const std::function<void(int connected, int total)>& on_progress) {
  // The threads may outlive this call when it returns at the first failure; what they share
  // lives as long as the last of them. An agent connected after that is dropped, which closes it.
  struct Shared {
    std::mutex mu;
    std::condition_variable changed;
    std::vector<std::optional<RemoteAgent>> agents;
    std::optional<absl::Status> failure;
    std::atomic<bool> abandoned{false};
    int connected = 0;
    int running = 0;  // threads not finished yet
  };
  auto shared = std::make_shared<Shared>();
  shared->agents.resize(targets.size());
  // The openssh client is a child `ssh` that dies with the thread that forked it
  // (PR_SET_PDEATHSIG), so it is forked here, on the caller's thread, which outlives the job; it
  // connects in the background, so this costs no parallelism. libssh2 connects in the threads.
  std::vector<std::unique_ptr<ssh::RemoteChannel>> opened(targets.size());
  if (options.client == ssh::SshClient::kOpenssh) {
    for (size_t i = 0; i < targets.size(); ++i) {
      auto channel = OpenBounded(targets[i], command, options, deadline);
      if (!channel.ok()) return channel.status();
      opened[i] = *std::move(channel);
    }
  }
  shared->running = static_cast<int>(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    std::thread([shared, i, target = targets[i], command, options, deadline,
                 channel = std::move(opened[i])]() mutable {
      auto cancelled = [&] { return shared->abandoned.load(); };
      absl::StatusOr<RemoteAgent> agent =
          channel ? GreetAgent(target, std::move(channel), command, deadline, cancelled)
                  : ConnectAgent(target, command, options, deadline, cancelled);
      std::lock_guard<std::mutex> lock(shared->mu);
      if (!agent.ok()) {
        if (!shared->failure) shared->failure = agent.status();
      } else if (!shared->failure) {
        shared->agents[i] = *std::move(agent);
        ++shared->connected;
      }
      --shared->running;
      shared->changed.notify_all();
    }).detach();
  }
  std::unique_lock<std::mutex> lock(shared->mu);
  int reported = 0;
  for (;;) {
    if (shared->failure) {
      // Close what is open now; threads still connecting drop theirs when they finish.
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
      if (on_progress) on_progress(reported, static_cast<int>(targets.size()));
    }
    if (shared->connected == static_cast<int>(targets.size())) break;
    // Every ConnectAgent returns by the deadline; the margin covers its last read.
    if (!shared->changed.wait_until(lock, absl::ToChronoTime(deadline + absl::Seconds(2)), [&] {
          return shared->failure || shared->connected != reported;
        })) {
      return absl::DeadlineExceededError(
          "timed out connecting to the hosts; raise --start-timeout");
    }
  }
  std::vector<RemoteAgent> agents;
  for (auto& agent : shared->agents) agents.push_back(*std::move(agent));
  return agents;
}

std::string RendezvousBindAddress(const std::vector<RemoteAgent>& agents) {
  std::string address;
  for (const RemoteAgent& agent : agents) {
    std::string local = agent.channel->LocalAddress();
    if (local.empty()) local = agent.hello.ssh_client_address;
    if (local.empty()) continue;
    if (address.empty()) {
      address = local;
    } else if (address != local) {
      return "0.0.0.0";
    }
  }
  return address.empty() ? "0.0.0.0" : address;
}

}  // namespace trainrun::launcher::remote
