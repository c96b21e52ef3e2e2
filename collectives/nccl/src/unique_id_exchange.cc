#include "trainrun/collectives/nccl/unique_id_exchange.h"

#include "absl/status/status.h"
#include "trainrun/collectives/errors.h"

namespace trainrun::collectives::nccl {

std::string UniqueIdKey(const std::string& name) { return "nccl/" + name + "/unique_id"; }

std::string ExchangeUniqueId(rendezvous::Store& store, const std::string& name, int rank, int root,
                             const std::function<std::string()>& make_id,
                             std::chrono::milliseconds timeout) {
  if (rank < 0 || root < 0) {
    throw InvalidArgumentError(internal::MakeMessage(
        "NCCL communicator '", name, "': rank ", rank, " and root ", root,
        " must be non-negative; check TRAINRUN_RANK and the communicator's root"));
  }
  const std::string key = UniqueIdKey(name);
  if (rank == root) {
    std::string id = make_id();
    if (id.empty()) {
      throw InvalidArgumentError(internal::MakeMessage(
          "NCCL communicator '", name, "': rank ", rank, " created an empty unique ID"));
    }
    absl::Status published = store.Set(key, id);
    if (!published.ok()) {
      throw IoError(internal::MakeMessage("rank ", rank, " could not publish the NCCL unique ID of ",
                                          "communicator '", name, "' to the rendezvous: ",
                                          published.message()));
    }
    return id;
  }
  auto got = store.Get({key}, timeout);
  if (got.ok()) return got->front();
  if (absl::IsDeadlineExceeded(got.status())) {
    throw TimeoutError(internal::MakeMessage(
        "rank ", rank, " waited ", timeout.count(), " ms for the NCCL unique ID of communicator '",
        name, "' from rank ", root, ", which never published it; check that rank ", root,
        " started and did not fail before creating its communicator (rendezvous: ",
        got.status().message(), ")"));
  }
  throw IoError(internal::MakeMessage("rank ", rank, " could not fetch the NCCL unique ID of ",
                                      "communicator '", name, "' from the rendezvous: ",
                                      got.status().message()));
}

int DeviceForLocalRank(int local_rank, int device_count) {
  if (device_count < 1) {
    throw InvalidArgumentError(internal::MakeMessage(
        "local rank ", local_rank, " sees no CUDA device; check CUDA_VISIBLE_DEVICES and that the "
        "host has GPUs, or use the TCP collectives"));
  }
  if (local_rank < 0) {
    throw InvalidArgumentError(
        internal::MakeMessage("local rank ", local_rank, " is negative; check TRAINRUN_LOCAL_RANK"));
  }
  return local_rank % device_count;
}

}  // namespace trainrun::collectives::nccl
