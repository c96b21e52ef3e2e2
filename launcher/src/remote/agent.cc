#include "remote/agent.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "posix/resolve_on_path.h"
#include "remote/agent_protocol.h"
#include "remote/file_sync.h"
#include "trainrun/launcher/agent.h"
#include "trainrun/launcher/cpu_binding.h"
#include "trainrun/launcher/gpu_assignment.h"
#include "trainrun/launcher/launch_spec.h"
#include "trainrun/launcher/process_set.h"
#include "trainrun/rendezvous/environment.h"
#include "trainrun/rendezvous/relay.h"

namespace trainrun::launcher {
namespace remote {
namespace {

// Proxy to write(2) until all is written, with EINTR retry. The launcher reads continuously, so a
// blocking write only waits while it catches up.
bool WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += n;
  }
  return true;
}

// The rank's PATH, as execvp would search it.
std::string PathOf(const std::vector<std::string>& env) {
  const std::string prefix = absl::StrCat(::trainrun::env::kPath, "=");
  for (const std::string& entry : env) {
    if (absl::StartsWith(entry, prefix)) return entry.substr(prefix.size());
  }
  return posix::kDefaultPath;
}

// The value of `name` in an environment list, or nullopt.
std::optional<std::string> EnvValue(const std::vector<std::string>& env, const char* name) {
  const std::string prefix = absl::StrCat(name, "=");
  for (const std::string& entry : env) {
    if (absl::StartsWith(entry, prefix)) return entry.substr(prefix.size());
  }
  return std::nullopt;
}

std::string Hostname() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

// MachineIdentity is this boot of this machine's kernel and the network namespace the agent runs
// in ("<boot id> net:[<inode>]"): the same for two names of one machine, different for two
// containers (or test namespaces) on one kernel, which trainrun treats as hosts of their own.
// "" when either cannot be read.
std::string MachineIdentity() {
  char boot[64] = {};
  FILE* file = std::fopen("/proc/sys/kernel/random/boot_id", "re");
  if (file == nullptr) return "";
  const bool read = std::fgets(boot, sizeof boot, file) != nullptr;
  std::fclose(file);
  char net[64] = {};
  const ssize_t length = ::readlink("/proc/self/ns/net", net, sizeof net - 1);
  if (!read || length <= 0) return "";
  std::string id(boot);
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return absl::StrCat(id, " ", absl::string_view(net, static_cast<size_t>(length)));
}

class Agent {
 public:
  Agent(std::string release, const AgentOptions& options)
      : release_(std::move(release)),
        options_(options),
        input_(io_, ::dup(options.in_fd)),
        silence_(io_),
        grace_(io_),
        ranks_(io_, Callbacks()) {}

  AgentOutcome Run() {
    Hello hello;
    hello.release = release_;
    hello.hostname = Hostname();
    hello.machine = MachineIdentity();
    hello.pid = static_cast<uint32_t>(::getpid());
    hello.gpu_count = static_cast<uint32_t>(CountHostGpus());
    if (std::optional<std::string> connection =
            ::trainrun::env::Lookup(::trainrun::env::kSshConnection)) {
      hello.ssh_client_address = connection->substr(0, connection->find(' '));
    }
    AgentOutcome outcome;
    if (!Send(EncodeHello(hello))) {
      outcome.exit_code = 1;
      outcome.launcher_gone = true;
      return outcome;
    }
    ReadMore();
    ArmSilence(options_.first_silence);
    io_.run();
    outcome.exit_code = failed_ ? 1 : 0;
    outcome.job_end = job_end_;
    outcome.launcher_gone = launcher_gone_ && !job_end_;
    return outcome;
  }

 private:
  RankProcessSet::Callbacks Callbacks() {
    RankProcessSet::Callbacks callbacks;
    callbacks.on_output = [this](int rank, OutputStream stream, std::string_view bytes) {
      if (options_.on_output) options_.on_output(rank, stream, bytes);
      Send(EncodeOutput({static_cast<uint32_t>(rank),
                         static_cast<uint8_t>(stream == OutputStream::kStderr ? 1 : 0),
                         std::string(bytes)}));
    };
    callbacks.on_exit = [this](int rank, const ExitInfo& exit) {
      if (!exit.ok()) failed_ = true;
      Send(EncodeExit({static_cast<uint32_t>(rank), exit.code, exit.signal, exit.exec_errno}));
      MaybeDone();
    };
    return callbacks;
  }

  bool Send(const std::string& frame) {
    if (launcher_gone_) return false;
    if (!WriteAll(options_.out_fd, frame)) {
      LauncherGone();
      return false;
    }
    return true;
  }

  void ReadMore() {
    input_.async_read_some(boost::asio::buffer(buffer_),
                           [this](const boost::system::error_code& error, size_t n) {
                             if (error || n == 0) {
                               LauncherGone();
                               return;
                             }
                             ArmSilence();
                             reader_.Append(absl::string_view(buffer_, n));
                             if (HandleFrames()) ReadMore();
                           });
  }

  // Handles every whole frame received; false when the stream is unusable.
  bool HandleFrames() {
    for (;;) {
      auto frame = reader_.Next();
      if (!frame.ok()) {
        LauncherGone();
        return false;
      }
      if (!frame->has_value()) return true;
      switch ((*frame)->type) {
        case MessageType::kJob:
          StartJob((*frame)->payload);
          break;
        case MessageType::kTerminate:
          Terminate();
          break;
        case MessageType::kKill:
          ranks_.KillAll();
          break;
        case MessageType::kHeartbeat:
          Send(EncodeFrame(MessageType::kHeartbeat));
          break;
        case MessageType::kSyncOffer:
        case MessageType::kSyncData:
        case MessageType::kSyncEnd:
          Sync(**frame);
          break;
        case MessageType::kJobEnd:
          if (auto end = DecodeJobEnd((*frame)->payload); end.ok()) job_end_ = *end;
          ranks_.KillAll();  // nothing should run by now; never leave a rank behind
          Finish();
          return false;
        default:
          break;
      }
    }
  }

  // Sync writes --sync-dst-dir's files (file_sync.h). After an error, the pieces still coming are
  // dropped until SyncEnd; the launcher reads the Error and ends the job.
  void Sync(const Frame& frame) {
    absl::Status status;
    if (frame.type == MessageType::kSyncOffer) {
      sync_ = std::make_unique<SyncReceiver>();
      auto offer = DecodeSyncOffer(frame.payload);
      absl::StatusOr<std::vector<uint32_t>> wanted =
          offer.ok() ? sync_->Offer(*std::move(offer)) : offer.status();
      if (wanted.ok()) {
        Send(EncodeSyncWant(*wanted));
        return;
      }
      status = wanted.status();
    } else if (sync_ == nullptr) {
      return;  // after a failure
    } else if (frame.type == MessageType::kSyncData) {
      auto data = DecodeSyncData(frame.payload);
      status = data.ok() ? sync_->Data(data->index, data->offset, data->bytes) : data.status();
      if (status.ok()) return;
    } else {
      absl::StatusOr<SyncDone> done = sync_->End();
      sync_.reset();
      if (done.ok()) {
        Send(EncodeSyncDone(*done));
        return;
      }
      status = done.status();
    }
    sync_.reset();
    Send(EncodeError(status.message()));
  }

  void StartJob(absl::string_view payload) {
    auto job = DecodeJob(payload);
    if (!job.ok()) {
      Send(EncodeError(job.status().message()));
      return Finish();
    }
    grace_period_ = std::chrono::milliseconds(job->grace_period_ms);
    if (job->silence_limit_ms > 0) {
      silence_limit_ = std::chrono::milliseconds(job->silence_limit_ms);
      ArmSilence();
    }
    if (!job->cwd.empty() && ::chdir(job->cwd.c_str()) != 0) {
      Send(EncodeError(absl::StrCat("host ", Hostname(), ": cannot change to the directory '",
                                    job->cwd, "': ", std::strerror(errno),
                                    "; the job runs in the launcher's directory on every host")));
      return Finish();
    }
    // --bind-to on this host's CPUs: the ranks arrive in local-rank order.
    const CpuTopology cpus = ReadCpuTopology();
    const BindTo bind_to = job->bind_to <= static_cast<uint32_t>(BindTo::kSocket)
                               ? static_cast<BindTo>(job->bind_to)
                               : BindTo::kNone;
    const int local_size = static_cast<int>(job->ranks.size());
    const std::string token_entry = absl::StrCat(::trainrun::env::kJobToken, "=");
    for (RankJob& rank : job->ranks) {
      for (std::string& entry : rank.env) {
        if (options_.unseal_token && absl::StartsWith(entry, token_entry)) {
          entry = token_entry + options_.unseal_token(entry.substr(token_entry.size()));
        }
      }
    }
    StartRelay(*job);
    for (RankJob& rank : job->ranks) {
      // The ranks call this host's relay (see StartRelay), not the launcher's server directly.
      const std::string relay_prefix = absl::StrCat(::trainrun::env::kRendezvousRelay, "=");
      rank.env.erase(std::remove_if(rank.env.begin(), rank.env.end(),
                                    [&](const std::string& entry) {
                                      return absl::StartsWith(entry, relay_prefix);
                                    }),
                     rank.env.end());
      if (relay_ != nullptr) rank.env.push_back(relay_prefix + relay_->socket());
      const int local_rank = started_;
      ProcessSpec spec;
      spec.cpus = CpusForRank(cpus, bind_to, local_rank, local_size);
      spec.argv = job->argv;
      spec.env = rank.env;
      spec.stdout_pty = job->stdout_pty;
      // A name found nowhere is passed as it is: its exec failure reaches the launcher as the
      // rank's Exit.
      spec.executable =
          posix::ResolveOnPath(job->argv.empty() ? "" : job->argv[0], PathOf(rank.env)).path;
      if (absl::Status started = ranks_.Start(static_cast<int>(rank.rank), spec); !started.ok()) {
        Send(EncodeError(absl::StrCat("host ", Hostname(), ": cannot start rank ", rank.rank, ": ",
                                      started.message())));
        failed_ = true;
        ranks_.KillAll();
        break;
      }
      ++started_;
      Send(EncodeStarted({rank.rank, DescribeBinding(cpus, bind_to, local_rank, local_size)}));
    }
    job_received_ = true;
    MaybeDone();
  }

  // StartRelay starts the relay that serves this host's ranks' rendezvous calls
  // (rendezvous/relay.h): one gRPC connection to the launcher per host, the ranks' start-up calls
  // batched, instead of a connection and three calls per rank. Its socket is in the abstract
  // namespace of this host's network namespace, where the ranks run. Without it (a rank
  // environment that says TRAINRUN_RENDEZVOUS_RELAY=off, or no rendezvous) the ranks dial the
  // server themselves, as they also do when the relay cannot listen.
  void StartRelay(const Job& job) {
    if (relay_ != nullptr || job.ranks.empty()) return;
    const std::vector<std::string>& env = job.ranks[0].env;
    std::optional<std::string> address = EnvValue(env, ::trainrun::env::kRendezvousAddr);
    std::optional<std::string> token = EnvValue(env, ::trainrun::env::kJobToken);
    std::optional<std::string> job_id = EnvValue(env, ::trainrun::env::kJobId);
    std::optional<std::string> wanted = EnvValue(env, ::trainrun::env::kRendezvousRelay);
    if (!address || address->empty() || !token || token->empty() ||
        (wanted.has_value() && *wanted == "off")) {
      return;
    }
    rendezvous::RelayOptions options;
    options.socket = absl::StrCat("@trainrun-relay-", job_id.value_or("job"), "-", ::getpid());
    options.server_address = *address;
    options.job_id = job_id.value_or("");
    options.token = *token;
    options.tls = EnvValue(env, ::trainrun::env::kRendezvousTls).value_or("") != "off";
    options.host = EnvValue(env, ::trainrun::env::kHostname).value_or(Hostname());
    options.local_ranks = static_cast<int>(job.ranks.size());
    auto relay = rendezvous::Relay::Start(options);
    if (relay.ok()) relay_ = *std::move(relay);
  }

  void Terminate() {
    ranks_.TerminateAll();
    grace_.expires_after(grace_period_);
    grace_.async_wait([this](const boost::system::error_code& error) {
      if (!error) ranks_.KillAll();
    });
  }

  // The launcher is gone (end-of-file, a broken pipe, silence): nobody will collect this host's
  // output, so its ranks end now, without a grace period.
  void LauncherGone() {
    if (launcher_gone_) return;
    launcher_gone_ = true;
    ranks_.KillAll();
    if (ranks_.running() == 0) Finish();
  }

  void MaybeDone() {
    if (ranks_.running() > 0) return;
    if (launcher_gone_ || job_received_) {
      if (done_sent_) return;
      done_sent_ = true;
      Send(EncodeFrame(MessageType::kDone));
      // A per-node agent stays for the job's outcome, which its trainrun prints.
      if (launcher_gone_ || !options_.await_job_end) Finish();
    }
  }

  void Finish() { io_.stop(); }

  void ArmSilence() { ArmSilence(silence_limit_); }
  void ArmSilence(std::chrono::milliseconds limit) {
    silence_.expires_after(limit);
    silence_.async_wait([this](const boost::system::error_code& error) {
      if (!error) LauncherGone();
    });
  }

  const std::string release_;
  const AgentOptions options_;
  boost::asio::io_context io_;
  boost::asio::posix::stream_descriptor input_;
  boost::asio::steady_timer silence_;
  boost::asio::steady_timer grace_;
  RankProcessSet ranks_;
  // Serves the ranks' rendezvous calls for the agent's session (StartRelay).
  std::unique_ptr<rendezvous::Relay> relay_;
  // --sync-dst-dir's receiver, between SyncOffer and SyncEnd.
  std::unique_ptr<SyncReceiver> sync_;
  FrameReader reader_;
  char buffer_[64 * 1024];
  std::chrono::milliseconds grace_period_ = kDefaultGracePeriod;
  std::chrono::milliseconds silence_limit_ = kSilenceLimit;
  int started_ = 0;
  bool job_received_ = false;
  bool launcher_gone_ = false;
  bool failed_ = false;
  bool done_sent_ = false;
  std::optional<JobEnd> job_end_;
};

}  // namespace
}  // namespace remote

int RunAgent() { return RunAgent(remote::TrainrunRelease()); }

int RunAgent(const std::string& release) {
  return remote::RunAgentOn(release, remote::AgentOptions{}).exit_code;
}

namespace remote {

AgentOutcome RunAgentOn(const std::string& release, const AgentOptions& options) {
  if (options.watch_parent) {
    // The SSH session (our parent) ending means the connection is gone.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() == 1) return AgentOutcome{1, std::nullopt, true};
  }
  // A broken pipe to the launcher is an error from write(), handled as "launcher gone".
  ::signal(SIGPIPE, SIG_IGN);
  Agent agent(release, options);
  return agent.Run();
}

}  // namespace remote

}  // namespace trainrun::launcher
