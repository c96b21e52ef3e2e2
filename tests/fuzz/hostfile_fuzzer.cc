// Hostfiles (`host slots=N max_slots=M`, comments, blank lines), then the slot plan.
#include <cstdint>
#include <string>

#include "fuzz_budget.h"
#include "trainrun/hostfile/hostfile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trainrun::fuzz::FuzzBudget budget("hostfile");
  std::string text(reinterpret_cast<const char*>(data), size);
  auto hosts = trainrun::hostfile::ParseHostfile(text, "fuzz.hosts");
  if (hosts.ok()) (void)trainrun::hostfile::PlanSlots(*hosts, std::nullopt);
  return 0;
}
