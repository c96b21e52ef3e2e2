// Slurm's SLURM_JOB_NODELIST and SLURM_TASKS_PER_NODE: the input is the node list, then
// optionally a newline and the tasks per node; then the slot plan of what was accepted.
#include <cstdint>
#include <optional>
#include <string>

#include "fuzz_budget.h"
#include "trainrun/hostfile/slurm.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // 1 s: ten bytes (`a[0-65535]`) legitimately make the largest list accepted, 65536 names and a
  // 65536-rank plan: about 25 ms natively, 200-450 ms under ASan (whose allocator touches fresh
  // pages for each) on a loaded machine. The quadratic and expand-before-refusing bugs of issue 22
  // cost 6 to 18 s; hostfile_test bounds the 65536-node case at 1 s without sanitizers.
  trainrun::fuzz::FuzzBudget budget("slurm", 1000);
  std::string text(reinterpret_cast<const char*>(data), size);
  std::optional<std::string> tasks;
  if (size_t newline = text.find('\n'); newline != std::string::npos) {
    tasks = text.substr(newline + 1);
    text.resize(newline);
  }
  (void)trainrun::hostfile::ExpandSlurmTasksPerNode(tasks.value_or(text));
  auto hosts = trainrun::hostfile::SlurmHosts(
      text, tasks.has_value() ? std::optional<absl::string_view>(*tasks) : std::nullopt);
  if (hosts.ok()) (void)trainrun::hostfile::PlanSlots(*hosts, std::nullopt);
  return 0;
}
