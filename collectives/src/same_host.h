// Proving that ranks share a host's memory, instead of trusting host names: two network
// namespaces or containers can share a hostname and not memory, or share memory under different
// names.
//
// The leader creates an anonymous segment (shm_segment.h), writes a fresh random nonce at its start
// and publishes, through the store, its pid, the segment's descriptor and the nonce. Every other
// member opens /proc/<pid>/fd/<fd> and reads the nonce back: only a process under the same kernel,
// seeing the leader's /proc, can; anyone else fails to open it or reads something else. Each member
// publishes its verdict and all read all verdicts, so they agree on the outcome.
//
//   std::string why;
//   auto segment = ProveSharedMemory(store, "collectives/world/shm", rank, members, bytes, "",
//                                    WaitLimit::After(timeout), &why, &extra);
//   if (!segment) { /* fall back to TCP; `why` says which rank could not see the segment */ }
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "shm_segment.h"
#include "trainrun/rendezvous/store.h"
#include "wait_limit.h"

namespace trainrun::collectives::internal {

// ProveSharedMemory runs the check among `members` (global ranks; members[0] leads) and returns the
// mapped segment of `bytes` bytes on every member when all of them could map it, or nullopt on all
// of them otherwise, with `why` set. The leader publishes `extra` (e.g. its layout), which every
// member gets back in `*extra_out`. Keys go under `prefix`, which must be fresh for each call.
// Throws TimeoutError when a member does not take part within `limit`, InterruptedError when its
// interrupt says so.
std::optional<ShmSegment> ProveSharedMemory(rendezvous::Store& store, const std::string& prefix,
                                            int rank, const std::vector<int>& members, size_t bytes,
                                            const std::string& extra, const WaitLimit& limit,
                                            std::string* why, std::string* extra_out);

// The nonce occupies the first kNonceBytes of the segment.
inline constexpr size_t kNonceBytes = 64;

}  // namespace trainrun::collectives::internal
