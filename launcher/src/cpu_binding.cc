#include "trainrun/launcher/cpu_binding.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"

namespace trainrun::launcher {
namespace {

// ReadSysfsInt reads one integer from a topology file; -1 when it cannot.
int ReadSysfsInt(int cpu, const char* name) {
  std::ifstream in(absl::StrCat("/sys/devices/system/cpu/cpu", cpu, "/topology/", name));
  int value = -1;
  if (!(in >> value)) return -1;
  return value;
}

// The socket (index) of local rank `local_rank` of `local_size` under kSocket.
int SocketOfRank(const CpuTopology& topology, int local_rank, int local_size) {
  const int sockets = std::max(topology.sockets, 1);
  if (local_size <= sockets) return local_rank % sockets;
  return static_cast<int>(static_cast<long>(local_rank) * sockets / local_size);
}

}  // namespace

CpuTopology ReadCpuTopology() {
  CpuTopology topology;
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return topology;
  std::map<int, int> socket_index;                // physical_package_id -> index
  std::map<std::pair<int, int>, int> core_index;  // (package, core_id) -> index
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    const int package = ReadSysfsInt(cpu, "physical_package_id");
    int core_id = ReadSysfsInt(cpu, "core_id");
    if (core_id < 0) core_id = 1000000 + cpu;  // unknown: a core of its own
    auto socket = socket_index.emplace(package, static_cast<int>(socket_index.size())).first;
    auto core = core_index.emplace(std::make_pair(package, core_id),
                                   static_cast<int>(topology.cores.size()));
    if (core.second) topology.cores.push_back({socket->second, {}});
    topology.cores[core.first->second].cpus.push_back(cpu);
  }
  topology.sockets = static_cast<int>(socket_index.size());
  return topology;
}

std::vector<int> CpusForRank(const CpuTopology& topology, BindTo bind_to, int local_rank,
                             int local_size) {
  if (topology.cores.empty()) return {};
  switch (bind_to) {
    case BindTo::kNone:
      return {};
    case BindTo::kCore:
      return topology.cores[local_rank % topology.cores.size()].cpus;
    case BindTo::kSocket: {
      const int socket = SocketOfRank(topology, local_rank, local_size);
      std::vector<int> cpus;
      for (const CpuTopology::Core& core : topology.cores) {
        if (core.socket == socket) cpus.insert(cpus.end(), core.cpus.begin(), core.cpus.end());
      }
      std::sort(cpus.begin(), cpus.end());
      return cpus;
    }
  }
  return {};
}

std::string CpuListString(std::vector<int> cpus) {
  std::sort(cpus.begin(), cpus.end());
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j == i ? absl::StrCat(cpus[i]) : absl::StrCat(cpus[i], "-", cpus[j]);
    i = j + 1;
  }
  return out;
}

std::string DescribeBinding(const CpuTopology& topology, BindTo bind_to, int local_rank,
                            int local_size) {
  std::vector<int> cpus = CpusForRank(topology, bind_to, local_rank, local_size);
  if (cpus.empty()) {
    std::vector<int> all;
    for (const CpuTopology::Core& core : topology.cores) {
      all.insert(all.end(), core.cpus.begin(), core.cpus.end());
    }
    return absl::StrCat("to nothing (any cpu this host allows: ", CpuListString(all), ")");
  }
  if (bind_to == BindTo::kCore) {
    return absl::StrCat("to core ", local_rank % topology.cores.size(), " (cpus ",
                        CpuListString(cpus), ")");
  }
  return absl::StrCat("to socket ", SocketOfRank(topology, local_rank, local_size), " (cpus ",
                      CpuListString(cpus), ")");
}

}  // namespace trainrun::launcher
