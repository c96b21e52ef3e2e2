#include "trainrun/launcher/gpu_assignment.h"

#include <cctype>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace trainrun::launcher {
namespace {

// SplitDevices splits a CUDA_VISIBLE_DEVICES value into its entries, trimmed, empty ones dropped.
std::vector<std::string> SplitDevices(const std::string& value) {
  std::vector<std::string> entries;
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    absl::string_view entry = absl::StripAsciiWhitespace(part);
    if (!entry.empty()) entries.emplace_back(entry);
  }
  return entries;
}

// IsGpuDeviceNode: "nvidia0", "nvidia12"; not "nvidiactl", "nvidia-uvm", "nvidia-modeset".
bool IsGpuDeviceNode(const std::string& name) {
  constexpr absl::string_view kPrefix = "nvidia";
  if (name.size() <= kPrefix.size() || !absl::StartsWith(name, kPrefix)) return false;
  for (size_t i = kPrefix.size(); i < name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::optional<std::string>> AssignGpu(const GpuAssignmentRequest& request) {
  if (request.local_size < 1 || request.local_rank < 0 ||
      request.local_rank >= request.local_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("local rank ", request.local_rank, " is outside the ", request.local_size,
                     " ranks of its host; this is a bug in the slot plan"));
  }
  if (request.host_gpu_count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host GPU count ", request.host_gpu_count, " is negative"));
  }
  if (!request.enabled) return std::nullopt;
  if (request.user_visible_devices.has_value()) {
    std::vector<std::string> entries = SplitDevices(*request.user_visible_devices);
    if (entries.empty()) return std::nullopt;
    return entries[request.local_rank % entries.size()];
  }
  if (request.host_gpu_count == 0) return std::nullopt;
  return std::to_string(request.local_rank % request.host_gpu_count);
}

int CountHostGpus(const std::string& dev_dir, const std::string& proc_gpus_dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  int nodes = 0;
  for (fs::directory_iterator it(dev_dir, error), end; !error && it != end; it.increment(error)) {
    if (IsGpuDeviceNode(it->path().filename().string())) ++nodes;
  }
  if (nodes > 0) return nodes;
  int gpus = 0;
  error.clear();
  for (fs::directory_iterator it(proc_gpus_dir, error), end; !error && it != end;
       it.increment(error)) {
    ++gpus;
  }
  return gpus;
}

}  // namespace trainrun::launcher
