#include "rsh/rsh_host_channel.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "posix/piped_child.h"
#include "rsh/piped_host_stream.h"
#include "ssh/tcp_connect.h"

namespace trainrun::launcher::rsh {
namespace {

// CommandWords splits the agent command line the launcher gives (`'/opt/my dir/trainrun' --agent`,
// quoted by ShellQuote) back into its words, each still quoted as the remote shell needs it.
std::vector<std::string> CommandWords(const std::string& command) {
  std::vector<std::string> words;
  std::string word;
  bool quoted = false;
  for (char c : command) {
    if (c == '\'') quoted = !quoted;
    if (c == ' ' && !quoted) {
      if (!word.empty()) words.push_back(std::move(word));
      word.clear();
      continue;
    }
    word += c;
  }
  if (!word.empty()) words.push_back(std::move(word));
  return words;
}

class RshHostChannel final : public channel::HostChannel {
 public:
  RshHostChannel(std::vector<std::string> agent, std::function<std::string()> scheduler_ended)
      : agent_(std::move(agent)),
        label_(absl::StrJoin(agent_, " ")),
        scheduler_ended_(std::move(scheduler_ended)) {}

  std::string Describe(const hostfile::HostSpec& host,
                       const std::string& agent_command) const override {
    return absl::StrCat(label_, " ", host.host, " (remote shell); agent: ", agent_command);
  }

  void Start(const std::vector<hostfile::HostSpec>& hosts, const std::string& agent_command,
             absl::Time /*deadline*/, channel::StreamCallback on_stream) override {
    // The programs die with the thread that forked them (PR_SET_PDEATHSIG): fork here, on the
    // caller's thread, which outlives the job. Each connects in the background.
    for (size_t i = 0; i < hosts.size(); ++i) {
      on_stream(static_cast<int>(i), StartOne(hosts[i].host, agent_command));
    }
  }

 private:
  absl::StatusOr<std::unique_ptr<channel::HostStream>> StartOne(const std::string& host,
                                                                const std::string& command) const {
    posix::PipedChild::Options options;
    options.argv = agent_;
    options.argv.push_back(host);
    for (std::string& word : CommandWords(command)) options.argv.push_back(std::move(word));
    options.exec_failure = absl::StrCat("cannot execute the remote shell '", agent_.front(),
                                        "' (--rsh-agent): is it on PATH?");
    options.exec_failure_status = 127;
    options.where = absl::StrCat("host ", host);
    options.program = agent_.front();
    options.peer = absl::StrCat("the agent (through ", label_, ")");
    options.grace = absl::Seconds(5);
    absl::StatusOr<std::unique_ptr<posix::PipedChild>> child =
        posix::PipedChild::Start(std::move(options));
    if (!child.ok()) return child.status();
    ssh::RouteAddresses route = ssh::RouteToHost(host, absl::Now() + absl::Seconds(2));
    PipedHostStream::Words words{agent_.front(), absl::StrCat("its remote shell (", label_, ")"),
                                 scheduler_ended_};
    return std::unique_ptr<channel::HostStream>(std::make_unique<PipedHostStream>(
        host, *std::move(child), std::move(route), std::move(words)));
  }

  const std::vector<std::string> agent_;
  const std::string label_;
  const std::function<std::string()> scheduler_ended_;
};

}  // namespace

std::unique_ptr<channel::HostChannel> MakeRshHostChannel(
    std::vector<std::string> agent, std::function<std::string()> scheduler_ended) {
  return std::make_unique<RshHostChannel>(std::move(agent), std::move(scheduler_ended));
}

}  // namespace trainrun::launcher::rsh
