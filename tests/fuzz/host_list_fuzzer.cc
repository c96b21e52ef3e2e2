// -H's host list: ParseHostList, then the slot plan of what it accepted.
#include <cstdint>
#include <string>

#include "fuzz_budget.h"
#include "trainrun/hostfile/host_list.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trainrun::fuzz::FuzzBudget budget("host_list");
  std::string text(reinterpret_cast<const char*>(data), size);
  auto hosts = trainrun::hostfile::ParseHostList(text);
  if (hosts.ok()) {
    for (const auto& host : *hosts) (void)trainrun::hostfile::HostLabel(host);
    (void)trainrun::hostfile::PlanSlots(*hosts, std::nullopt);
  }
  return 0;
}
