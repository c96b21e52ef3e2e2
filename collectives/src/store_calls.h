// The store calls of a communicator's start-up: each names what it waited for when it fails, and
// waits within a WaitLimit (wait_limit.h), so that CommunicatorOptions::interrupt can end it.
//
//   auto addresses = StoreAllgather(store, "collectives/world/addr", rank, size, mine,
//                                   WaitLimit::After(timeout, &interrupt),
//                                   "rank 3 exchanged addresses with the other ranks");
//   std::string_view rank0 = addresses[0];
#pragma once

#include <string>
#include <vector>

#include "trainrun/rendezvous/store.h"
#include "wait_limit.h"

namespace trainrun::collectives::internal {

// StoreGet waits for `keys` in `store` within `limit` (wait_limit.h); a failure throws TimeoutError
// (deadline), InterruptedError or IoError, with `what` (e.g. "rank 3: waiting for the same-host
// check") in front of the store's message.
std::vector<std::string> StoreGet(rendezvous::Store& store, const std::vector<std::string>& keys,
                                  const WaitLimit& limit, const std::string& what);
// StoreAllgather contributes `value` as `rank` of `count` to the gather `name` and returns every
// contribution in rank order (Store::AllgatherTable: one call, where a Get would read `count`
// keys, answered in one buffer rather than `count` strings); fails as StoreGet does.
rendezvous::GatherTable StoreAllgather(rendezvous::Store& store, const std::string& name, int rank,
                                       int count, const std::string& value, const WaitLimit& limit,
                                       const std::string& what);
// StorePut sets `key` to `value` in `store`, or throws IoError naming the key.
void StorePut(rendezvous::Store& store, const std::string& key, const std::string& value);

}  // namespace trainrun::collectives::internal
