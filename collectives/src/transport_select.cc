#include "transport_select.h"

#include <numeric>
#include <sstream>

#include "hierarchical.h"
#include "log.h"
#include "same_host.h"
#include "store_calls.h"
#include "trainrun/collectives/errors.h"

namespace trainrun::collectives::internal {

using ::trainrun::internal::MakeMessage;

namespace {

// The limit of one wait of the start-up: the communicator's timeout, and its interrupt.
WaitLimit StartLimit(const TcpOptions& tcp) {
  return WaitLimit::After(tcp.timeout, &tcp.interrupt);
}

// Maps the segment shared by the ranks [first, first + count) (which this rank belongs to) after
// proving they share memory; null with `why` when they do not.
std::optional<ShmSegment> ProveGroup(rendezvous::Store& store, const std::string& prefix, int rank,
                                     int first, int count, ShmOptions* options,
                                     const TcpOptions& tcp, std::string* why) {
  std::vector<int> members(count);
  std::iota(members.begin(), members.end(), first);
  // The leader's layout wins, so ranks with different tunables still agree.
  std::string layout;
  auto segment = ProveSharedMemory(
      store, prefix, rank, members, ShmTransport::SegmentBytes(count, *options),
      MakeMessage(options->chunk_bytes, " ", options->channel_bytes, " ", options->small_bytes),
      StartLimit(tcp), why, &layout);
  if (!segment) return segment;
  std::istringstream in(layout);
  in >> options->chunk_bytes >> options->channel_bytes >> options->small_bytes;
  TRAINRUN_ENFORCE(segment->bytes() == ShmTransport::SegmentBytes(count, *options),
                   "shared-memory layout '", layout, "' does not match the segment");
  return segment;
}

// Builds the shared-memory transport of a proven group and waits until every member has.
std::unique_ptr<ShmTransport> StartShm(rendezvous::Store& store, const std::string& prefix,
                                       ShmSegment segment, int group_rank, int group_size,
                                       const ShmOptions& options, const TcpOptions& tcp) {
  auto transport =
      std::make_unique<ShmTransport>(std::move(segment), group_rank, group_size, options);
  // Every rank has registered its pid before any starts watching the others. A gather, not a
  // store barrier: a gather may be repeated (the slices of an interruptible wait).
  StoreAllgather(store, prefix + "/ready", group_rank, group_size, "", StartLimit(tcp),
                 MakeMessage("rank ", group_rank + options.rank_offset,
                             ": waiting for every rank to map shared memory"));
  transport->WatchPeers();
  return transport;
}

// Whether the ranks fill hosts evenly, in order (rank = cross_rank * local_size + local_rank, the
// same local_size everywhere), as hierarchical allreduce needs.
bool EvenHosts(rendezvous::Store& store, const RankInfo& info, const TcpOptions& tcp) {
  const auto layouts = StoreAllgather(
      store, MakeMessage("collectives/", tcp.name, "/layout"), info.rank, info.size,
      MakeMessage(info.local_rank, " ", info.local_size, " ", info.cross_rank), StartLimit(tcp),
      MakeMessage("rank ", info.rank, ": waiting for every rank's place"));
  for (int r = 0; r < info.size; ++r) {
    std::istringstream in(std::string(layouts[r]));
    int local_rank = -1, local_size = -1, cross_rank = -1;
    in >> local_rank >> local_size >> cross_rank;
    if (local_size != info.local_size || r != cross_rank * local_size + local_rank) return false;
  }
  return info.size % info.local_size == 0;
}

std::unique_ptr<Transport> MakeHierarchical(rendezvous::Store& store, const RankInfo& info,
                                            const TcpOptions& tcp, ShmOptions shm,
                                            size_t segment_bytes, size_t small_bytes) {
  auto flat = std::make_unique<TcpTransport>(store, info.rank, info.size, tcp);
  // Every rank takes part in the layout check, so all decide alike.
  if (!EvenHosts(store, info, tcp) || info.local_size == 1) return flat;
  const int first = info.rank - info.local_rank;
  // The host's group does only the allreduce across hosts, in chunks large enough that each
  // rank's part crosses the network in pipelined segments while the next chunk is reduced.
  shm.chunk_bytes = shm.across_chunk_bytes;
  const std::string prefix =
      MakeMessage("collectives/", tcp.name, "/host", info.cross_rank, "/shm");
  std::string why;
  auto segment = ProveGroup(store, prefix, info.rank, first, info.local_size, &shm, tcp, &why);
  // All hosts must agree, or some ranks would run hierarchically and others flat.
  const auto verdicts =
      StoreAllgather(store, MakeMessage("collectives/", tcp.name, "/hosts_share_memory"), info.rank,
                     info.size, segment ? "ok" : why, StartLimit(tcp),
                     MakeMessage("rank ", info.rank, ": waiting for hosts"));
  for (size_t r = 0; r < verdicts.size(); ++r) {
    if (verdicts[r] != "ok") {
      if (info.rank == 0) LogWarning(MakeMessage(verdicts[r], "; running flat over TCP"));
      return flat;
    }
  }
  shm.rank_offset = first;
  auto local =
      StartShm(store, prefix, std::move(*segment), info.local_rank, info.local_size, shm, tcp);
  TcpOptions cross_options = tcp;
  cross_options.name = MakeMessage(tcp.name, "/cross", info.local_rank);
  auto cross = std::make_unique<TcpTransport>(store, info.cross_rank, info.size / info.local_size,
                                              cross_options);
  return std::make_unique<HierarchicalTransport>(
      std::move(flat), std::move(local), std::move(cross), info, segment_bytes, small_bytes);
}

}  // namespace

std::unique_ptr<Transport> MakeTransport(rendezvous::Store& store, const RankInfo& info,
                                         const std::string& mode, const TcpOptions& tcp,
                                         const ShmOptions& shm, size_t segment_bytes,
                                         size_t small_allreduce_bytes) {
  const bool all_local = info.local_size == info.size;
  if (mode == "shm" && !all_local) {
    throw InvalidArgumentError(MakeMessage(
        "TRAINRUN_TRANSPORT=shm, but the job spans ", info.size / std::max(1, info.local_size),
        " hosts; shared memory needs every rank on one host (use auto or tcp)"));
  }
  if (mode == "auto" && !all_local) {
    return MakeHierarchical(store, info, tcp, shm, segment_bytes, small_allreduce_bytes);
  }
  if (mode != "tcp" && info.size > 1) {
    const std::string prefix = MakeMessage("collectives/", tcp.name, "/shm");
    ShmOptions options = shm;
    std::string why;
    auto segment = ProveGroup(store, prefix, info.rank, 0, info.size, &options, tcp, &why);
    if (segment) {
      return StartShm(store, prefix, std::move(*segment), info.rank, info.size, options, tcp);
    }
    if (mode == "shm") {
      throw IoError(MakeMessage("TRAINRUN_TRANSPORT=shm, but ", why,
                                "; run the ranks on one host, or use auto or tcp"));
    }
    if (info.rank == 0) LogWarning(MakeMessage("ranks do not share memory (", why, "); using TCP"));
  }
  return std::make_unique<TcpTransport>(store, info.rank, info.size, tcp);
}

}  // namespace trainrun::collectives::internal
