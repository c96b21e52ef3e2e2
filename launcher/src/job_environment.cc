#include "trainrun/launcher/job_environment.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "posix/unique_fd.h"
#include "trainrun/launcher/gpu_assignment.h"
#include "trainrun/rendezvous/environment.h"
#include "trainrun/rendezvous/server.h"

extern char** environ;

namespace trainrun::launcher {
namespace {

// A job id is this many hex digits (a token's first ones): short enough to read in logs.
constexpr size_t kJobIdDigits = 12;

std::map<std::string, std::string> ToMap(const std::vector<std::string>& entries) {
  std::map<std::string, std::string> out;
  for (const std::string& entry : entries) {
    size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    out.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return out;
}

// FreePort asks the kernel for a TCP port nobody listens on now (torchrun does the same; another
// process may take it before rank 0 binds it, a window we cannot close from here).
absl::StatusOr<int> FreePort() {
  posix::UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) {
    return absl::InternalError(absl::StrCat("cannot create a socket: ", std::strerror(errno)));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (port < 0) {
    return absl::InternalError(absl::StrCat("cannot find a free port: ", std::strerror(errno)));
  }
  return port;
}

// RankValueOf is `value` for the rank placed at `a` in a job of `size` ranks, on host `host`.
std::string RankValueOf(env::RankValue value, const hostfile::RankAssignment& a, int size,
                        const std::string& host) {
  switch (value) {
    case env::RankValue::kRank:
      return absl::StrCat(a.rank);
    case env::RankValue::kSize:
      return absl::StrCat(size);
    case env::RankValue::kLocalRank:
      return absl::StrCat(a.local_rank);
    case env::RankValue::kLocalSize:
      return absl::StrCat(a.local_size);
    case env::RankValue::kCrossRank:
      return absl::StrCat(a.cross_rank);
    case env::RankValue::kCrossSize:
      return absl::StrCat(a.cross_size);
    case env::RankValue::kHostname:
      return host;
    case env::RankValue::kHostIndex:
      return absl::StrCat(a.host_index);
  }
  return "";
}

}  // namespace

std::vector<std::string> CurrentEnvironment() {
  std::vector<std::string> out;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry)
    out.emplace_back(*entry);
  return out;
}

absl::StatusOr<JobEnvironment> JobEnvironment::Create(const LaunchSpec& spec,
                                                      const std::vector<std::string>& base) {
  JobEnvironment job;
  job.plan_ = spec.plan;
  job.base_ = ToMap(base);
  for (const ExportedVariable& variable : spec.exported) {
    if (variable.value.has_value()) {
      job.forced_[variable.name] = *variable.value;
      continue;
    }
    auto it = job.base_.find(variable.name);
    if (it == job.base_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("-x ", variable.name, ": ", variable.name,
                       " is not set in trainrun's environment; set it, or give it a value with -x ",
                       variable.name, "=VALUE"));
    }
    job.forced_[variable.name] = it->second;
  }
  for (const ExportedVariable& variable : SpecVariables(spec)) {
    job.forced_[variable.name] = *variable.value;
  }
  absl::StatusOr<std::string> id = rendezvous::RandomToken();
  if (!id.ok()) return id.status();
  absl::StatusOr<std::string> token = rendezvous::RandomToken();
  if (!token.ok()) return token.status();
  absl::StatusOr<int> port = FreePort();
  if (!port.ok()) return port.status();
  job.job_id_ = id->substr(0, kJobIdDigits);
  job.token_ = *std::move(token);
  job.master_port_ = *port;
  // Per-node mode's --master-port is the port the ranks see (a firewall may open only that one).
  if (spec.per_node && spec.per_node->master_port != 0)
    job.master_port_ = spec.per_node->master_port;
  // The warning time trainrun acts on (a -x value of it included: MakeLaunchSpec read it there).
  job.forced_[env::kStallWarningSeconds.name] = absl::StrCat(spec.stall_warning.count());
  if (!job.forced_.count(env::kMonitorPeriodMs.name)) {
    // Ranks report once a straggler window, or every second for a live page (monitor/).
    job.forced_[env::kMonitorPeriodMs.name] =
        absl::StrCat(spec.monitor.empty() ? spec.straggler_window.count() * 1000 : int64_t{1000});
  }
  job.assign_gpus_ = spec.assign_gpus || env::kAssignGpus.Get() != 0;
  // The ranks speak to the rendezvous as the launcher serves it; an enclosing job's setting must
  // not leak in.
  job.base_.erase(env::kRendezvousTls);
  if (!spec.rendezvous_tls) job.forced_[env::kRendezvousTls] = "off";
  if (spec.verbose && !job.forced_.count(env::kVerbose.name)) job.forced_[env::kVerbose.name] = "1";
  return job;
}

std::vector<ExportedVariable> JobEnvironment::SpecVariables(const LaunchSpec& spec) {
  auto given = [&spec](const char* name) {
    return std::any_of(spec.exported.begin(), spec.exported.end(),
                       [name](const ExportedVariable& v) { return v.name == name; });
  };
  std::vector<ExportedVariable> out;
  if (spec.fusion_threshold_bytes && !given(env::kOldFusionBytes)) {
    out.push_back({env::kOldFusionBytes, absl::StrCat(*spec.fusion_threshold_bytes)});
  }
  if (spec.tcp && !given(env::kTransport.name)) out.push_back({env::kTransport.name, "tcp"});
  if (spec.elastic.has_value()) {
    out.push_back({env::kElastic, "1"});
    out.push_back({env::kHorovodElastic, "1"});
    // A rank waits a little longer than trainrun does, so that trainrun ends a job below --min-np
    // with its own message rather than each rank with a timeout.
    out.push_back(
        {env::kElasticTimeoutSeconds.name,
         absl::StrCat(spec.elastic->timeout.count() + env::kElasticTimeoutMarginSeconds)});
  }
  return out;
}

std::optional<std::string> JobEnvironment::Lookup(const std::string& name) const {
  if (auto it = forced_.find(name); it != forced_.end()) return it->second;
  if (auto it = base_.find(name); it != base_.end()) return it->second;
  return std::nullopt;
}

std::vector<std::string> JobEnvironment::ForRank(int rank, const HostView& host_view) const {
  return ForPlace(plan_.ranks[rank], plan_.size(), host_view);
}

std::vector<std::string> JobEnvironment::ForPlace(const hostfile::RankAssignment& a, int size,
                                                  const HostView& host_view) const {
  const std::string& host = host_view.name;
  std::map<std::string, std::string> vars = base_;
  auto set = [&vars](const char* name, const auto& value) {
    if constexpr (std::is_arithmetic_v<std::decay_t<decltype(value)>>) {
      vars[name] = absl::StrCat(value);
    } else {
      vars[name] = std::string(value);
    }
  };
  for (const env::RankVariable& variable : env::kRankVariables) {
    vars[variable.name] = RankValueOf(variable.value, a, size, host);
  }
  set(env::kJobId, job_id_);
  set(env::kJobToken, token_);
  if (!host_view.rendezvous_addr.empty()) {
    set(env::kRendezvousAddr, host_view.rendezvous_addr);
  } else {
    vars.erase(env::kRendezvousAddr);  // a stale one from an enclosing job would mislead
  }
  if (!host_view.rendezvous_socket.empty()) {
    set(env::kRendezvousSocket, host_view.rendezvous_socket);
  } else {
    vars.erase(env::kRendezvousSocket);  // another host's, or an enclosing job's
  }
  // A host's agent points its ranks at its relay (rendezvous/relay.h); one inherited from an
  // enclosing job would send these ranks to that job's. -x TRAINRUN_RENDEZVOUS_RELAY=off stays
  // (below): it tells the agents to start none.
  vars.erase(env::kRendezvousRelay);
  set(env::kTorchMasterAddr, host_view.master_addr);
  set(env::kTorchMasterPort, master_port_);

  if (a.local_size > 1 && !vars.count(env::kOmpNumThreads) && !forced_.count(env::kOmpNumThreads)) {
    set(env::kOmpNumThreads, "1");
  }
  if (!vars.count(env::kPythonUnbuffered)) set(env::kPythonUnbuffered, "1");
  for (const auto& [name, value] : forced_) vars[name] = value;

  // One GPU per local rank (gpu_assignment.h); a CUDA_VISIBLE_DEVICES the user set, in trainrun's
  // environment or with -x, is the list the ranks share out.
  GpuAssignmentRequest gpu;
  gpu.local_rank = a.local_rank;
  gpu.local_size = a.local_size;
  gpu.user_visible_devices = Lookup(env::kCudaVisibleDevices);
  gpu.host_gpu_count = host_view.gpu_count;
  gpu.enabled = assign_gpus_;
  if (absl::StatusOr<std::optional<std::string>> device = AssignGpu(gpu); device.ok() && *device) {
    vars[env::kCudaVisibleDevices] = **device;
  }

  std::vector<std::string> out;
  out.reserve(vars.size());
  for (const auto& [name, value] : vars) out.push_back(absl::StrCat(name, "=", value));
  return out;
}

}  // namespace trainrun::launcher
