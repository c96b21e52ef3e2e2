#include "slurm/srun_host_channel.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "posix/piped_child.h"
#include "rsh/piped_host_stream.h"
#include "ssh/tcp_connect.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::launcher::slurm {
namespace {

using posix::PipedChild;
using ssh::RouteAddresses;

std::vector<std::string> SrunArguments(const std::string& host, const std::string& command) {
  return {"srun",
          "-u",
          "-N1",
          "-n1",
          "-w",
          host,
          "--kill-on-bad-exit=1",
          "--overlap",
          "--job-name=trainrun-agent",
          "sh",
          "-c",
          command};
}

absl::StatusOr<std::unique_ptr<channel::HostStream>> StartStep(const std::string& host,
                                                               const std::string& command) {
  PipedChild::Options options;
  options.argv = SrunArguments(host, command);
  options.exec_failure = "cannot execute srun (is Slurm's client on PATH?)";
  options.exec_failure_status = 127;
  options.where = absl::StrCat("host ", host);
  options.program = "srun";
  options.peer = "the agent's job step";
  options.grace = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<PipedChild>> srun = PipedChild::Start(std::move(options));
  if (!srun.ok()) return srun.status();
  RouteAddresses route = ssh::RouteToHost(host, absl::Now() + absl::Seconds(2));
  rsh::PipedHostStream::Words words{"srun", "the agent's job step (srun)",
                                    [] { return AllocationEnded(); }};
  return std::unique_ptr<channel::HostStream>(std::make_unique<rsh::PipedHostStream>(
      host, *std::move(srun), std::move(route), std::move(words)));
}

class SrunHostChannel final : public channel::HostChannel {
 public:
  std::string Describe(const hostfile::HostSpec& host,
                       const std::string& agent_command) const override {
    return absl::StrCat("srun -u -N1 -n1 -w ", host.host,
                        " (this Slurm allocation); agent: ", agent_command);
  }

  void Start(const std::vector<hostfile::HostSpec>& hosts, const std::string& agent_command,
             absl::Time /*deadline*/, channel::StreamCallback on_stream) override {
    // srun is a child that dies with the thread that forked it (PR_SET_PDEATHSIG): fork here, on
    // the caller's thread, which outlives the job; each srun starts its step in the background.
    for (size_t i = 0; i < hosts.size(); ++i) {
      on_stream(static_cast<int>(i), StartStep(hosts[i].host, agent_command));
    }
  }
};

}  // namespace

std::unique_ptr<channel::HostChannel> MakeSrunHostChannel() {
  return std::make_unique<SrunHostChannel>();
}

// A step killed by the time limit, scancel or a node failure ends with status 143 like any other;
// only the controller knows which it was.
namespace {

// AllocationState: why job `job_id` ended, as scontrol says it now ("" while it runs).
std::string AllocationState(const std::string& job_id) {
  const std::string* job = &job_id;
  std::string command = absl::StrCat("timeout 2 scontrol show job -o ", *job, " 2>/dev/null");
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return "";
  std::string out;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.append(buffer, n);
  ::pclose(pipe);
  auto field = [&](absl::string_view name) -> std::string {
    size_t at = out.find(absl::StrCat(" ", name, "="));
    if (at == std::string::npos) return "";
    at += name.size() + 2;
    return out.substr(at, out.find_first_of(" \n", at) - at);
  };
  const std::string state = field("JobState");
  if (state == "TIMEOUT") {
    return absl::StrCat("Slurm job ", *job,
                        " reached its time limit (TimeLimit=", field("TimeLimit"), ")");
  }
  if (state == "CANCELLED") return absl::StrCat("Slurm job ", *job, " was cancelled (scancel)");
  if (state == "NODE_FAIL") return absl::StrCat("a node of Slurm job ", *job, " failed");
  if (state == "PREEMPTED") return absl::StrCat("Slurm job ", *job, " was preempted");
  return "";
}

}  // namespace

std::string AllocationEnded(absl::Duration settle) {
  std::optional<std::string> job = env::Lookup(env::kSlurmJobId);
  if (!job || job->empty() ||
      !std::all_of(job->begin(), job->end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return "";
  }
  const absl::Time give_up = absl::Now() + settle;
  for (;;) {
    std::string why = AllocationState(*job);
    if (!why.empty() || absl::Now() >= give_up) return why;
    absl::SleepFor(absl::Milliseconds(250));
  }
}

}  // namespace trainrun::launcher::slurm
