// Handing an NCCL communicator's unique ID from its root rank to the others, through the Store.
//
// NCCL needs every rank of a communicator to hold the same ncclUniqueId before ncclCommInitRank.
// The root creates it (ncclGetUniqueId) and publishes it; the others wait for it with the
// rendezvous deadline. This file needs no CUDA: the ID travels as an opaque blob, so tests run the
// exchange with blobs that are not real IDs.
//
//   std::string id = ExchangeUniqueId(store, "world", rank, /*root=*/0,
//                                     [] { return MakeRealNcclIdBlob(); },
//                                     std::chrono::seconds(60));
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "trainrun/rendezvous/store.h"

namespace trainrun::collectives::nccl {

// ShareName is the name communicator `name` shares its ID under (rendezvous::ShareFromRoot), and
// UniqueIdKey the Store key that ends up holding it.
std::string ShareName(const std::string& name);
std::string UniqueIdKey(const std::string& name);

// ExchangeUniqueId returns communicator `name`'s unique ID on every rank, through the rendezvous's
// ShareFromRoot: on `root` it calls `make_id` and publishes the result under UniqueIdKey(name); on
// the other ranks it waits up to `timeout` for the root's blob. A name names one communicator for
// the life of the Store.
//
// Throws InvalidArgumentError when rank/root are negative or `make_id` returns an empty blob,
// TimeoutError naming the root rank (and the store's own account of what is missing) when the ID
// does not arrive in time, and IoError when the Store itself fails.
std::string ExchangeUniqueId(rendezvous::Store& store, const std::string& name, int rank, int root,
                             const std::function<std::string()>& make_id,
                             std::chrono::milliseconds timeout);

// DeviceForLocalRank returns the CUDA device ordinal a rank uses: `local_rank` modulo the number of
// devices the process sees. With the launcher's one-GPU-per-rank CUDA_VISIBLE_DEVICES that count is
// 1, so every rank uses its device 0; without it, local ranks spread over the visible devices.
// Throws InvalidArgumentError when `device_count` < 1 or `local_rank` < 0.
int DeviceForLocalRank(int local_rank, int device_count);

}  // namespace trainrun::collectives::nccl
