#include "trainrun/collectives/nccl/unique_id_exchange.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainrun/collectives/errors.h"
#include "trainrun/rendezvous/client.h"

namespace trainrun::collectives::nccl {

// The rendezvous's ShareFromRoot stores under "share/<name>"; the NCCL prefix keeps communicator
// names apart from other shared blobs.
std::string UniqueIdKey(const std::string& name) { return "share/" + ShareName(name); }

std::string ShareName(const std::string& name) { return "nccl/" + name; }

std::string ExchangeUniqueId(rendezvous::Store& store, const std::string& name, int rank, int root,
                             const std::function<std::string()>& make_id,
                             std::chrono::milliseconds timeout) {
  if (rank < 0 || root < 0) {
    throw InvalidArgumentError(internal::MakeMessage(
        "NCCL communicator '", name, "': rank ", rank, " and root ", root,
        " must be non-negative; check TRAINRUN_RANK and the communicator's root"));
  }
  auto make_checked = [&] {
    std::string id = make_id();
    if (id.empty()) {
      throw InvalidArgumentError(internal::MakeMessage("NCCL communicator '", name, "': rank ",
                                                       rank, " created an empty unique ID"));
    }
    return id;
  };
  absl::StatusOr<std::string> shared =
      rendezvous::ShareFromRoot(store, ShareName(name), rank, root, make_checked, timeout);
  if (shared.ok()) return *std::move(shared);
  if (rank == root) {
    throw IoError(internal::MakeMessage("rank ", rank, " could not publish the NCCL unique ID of ",
                                        "communicator '", name,
                                        "' to the rendezvous: ", shared.status().message()));
  }
  if (absl::IsDeadlineExceeded(shared.status())) {
    // The store's message says which key is missing and, from the server, which ranks never joined.
    throw TimeoutError(internal::MakeMessage(
        "rank ", rank, " waited ", timeout.count(), " ms for the NCCL unique ID of communicator '",
        name, "' from rank ", root, ", which never published it; check that rank ", root,
        " started and did not fail before creating its communicator (rendezvous: ",
        shared.status().message(), ")"));
  }
  throw IoError(internal::MakeMessage("rank ", rank, " could not fetch the NCCL unique ID of ",
                                      "communicator '", name,
                                      "' from the rendezvous: ", shared.status().message()));
}

int DeviceForLocalRank(int local_rank, int device_count) {
  if (device_count < 1) {
    throw InvalidArgumentError(
        internal::MakeMessage("local rank ", local_rank,
                              " sees no CUDA device; check CUDA_VISIBLE_DEVICES and that the "
                              "host has GPUs, or use the TCP collectives"));
  }
  if (local_rank < 0) {
    throw InvalidArgumentError(internal::MakeMessage("local rank ", local_rank,
                                                     " is negative; check TRAINRUN_LOCAL_RANK"));
  }
  return local_rank % device_count;
}

}  // namespace trainrun::collectives::nccl
