#include "transport_select.h"

#include <numeric>
#include <sstream>

#include "log.h"
#include "same_host.h"
#include "trainrun/collectives/errors.h"

namespace trainrun::collectives::internal {

using ::trainrun::internal::MakeMessage;

namespace {

// Proves the group and builds the shared-memory transport on it, or returns null with `why`.
std::unique_ptr<ShmTransport> TryShm(rendezvous::Store& store, const RankInfo& info,
                                     const std::string& name, ShmOptions options,
                                     std::chrono::milliseconds timeout, std::string* why) {
  std::vector<int> members(info.size);
  std::iota(members.begin(), members.end(), 0);
  const std::string prefix = MakeMessage("collectives/", name, "/shm");
  // The leader's layout wins, so ranks with different tunables still agree.
  std::string layout;
  auto segment = ProveSharedMemory(
      store, prefix, info.rank, members, ShmTransport::SegmentBytes(info.size, options),
      MakeMessage(options.chunk_bytes, " ", options.channel_bytes, " ", options.small_bytes),
      timeout, why, &layout);
  if (!segment) return nullptr;
  std::istringstream in(layout);
  in >> options.chunk_bytes >> options.channel_bytes >> options.small_bytes;
  TRAINRUN_ENFORCE(segment->bytes() == ShmTransport::SegmentBytes(info.size, options),
                   "shared-memory layout '", layout, "' does not match the segment");
  auto transport = std::make_unique<ShmTransport>(std::move(*segment), info.rank, info.size,
                                                  options);
  // Every rank has registered its pid before any starts watching the others.
  auto status = store.Barrier(prefix + "/ready", info.size, timeout);
  if (!status.ok()) {
    throw TimeoutError(MakeMessage("rank ", info.rank,
                                   ": waiting for every rank to map shared memory: ",
                                   status.message()));
  }
  transport->WatchPeers();
  return transport;
}

}  // namespace

std::unique_ptr<Transport> MakeTransport(rendezvous::Store& store, const RankInfo& info,
                                         const std::string& mode, const TcpOptions& tcp,
                                         const ShmOptions& shm) {
  if (mode != "auto" && mode != "tcp" && mode != "shm") {
    throw InvalidArgumentError(MakeMessage("TRAINRUN_TRANSPORT is '", mode,
                                           "'; set it to auto, tcp or shm"));
  }
  const bool all_local = info.local_size == info.size;
  if (mode == "shm" && !all_local) {
    throw InvalidArgumentError(MakeMessage(
        "TRAINRUN_TRANSPORT=shm, but the job spans ", info.size / std::max(1, info.local_size),
        " hosts; shared memory needs every rank on one host (use auto or tcp)"));
  }
  if (mode != "tcp" && all_local && info.size > 1) {
    std::string why;
    auto transport = TryShm(store, info, tcp.name, shm, tcp.timeout, &why);
    if (transport != nullptr) return transport;
    if (mode == "shm") {
      throw IoError(MakeMessage("TRAINRUN_TRANSPORT=shm, but ", why,
                                "; run the ranks on one host, or use auto or tcp"));
    }
    if (info.rank == 0) {
      LogWarning(MakeMessage("ranks do not share memory (", why, "); using TCP"));
    }
  }
  return std::make_unique<TcpTransport>(store, info.rank, info.size, tcp);
}

}  // namespace trainrun::collectives::internal
