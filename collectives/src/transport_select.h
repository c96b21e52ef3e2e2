// Choosing a communicator's transport: shared memory for ranks proven to share this host's
// memory (same_host.h), TCP otherwise, or what TRAINRUN_TRANSPORT forces.
#pragma once

#include <memory>
#include <string>

#include "shm_transport.h"
#include "tcp_transport.h"
#include "trainrun/collectives/communicator.h"
#include "trainrun/rendezvous/store.h"

namespace trainrun::collectives::internal {

// MakeTransport connects rank `info.rank` to the others. `mode` is "auto", "tcp" or "shm" (one of
// env::kTransport's choices, parsed by the caller). In "auto", an all-local job runs over shared
// memory when the same-host check passes and over TCP when it does not (logged once by rank 0); a
// multi-host job with the same number of ranks on every host runs hierarchically (hierarchical.h;
// `segment_bytes` and `small_allreduce_bytes` tune its allreduce across hosts) when every host
// passes the check, and over TCP otherwise. In "shm", a failed check throws IoError naming the rank
// that could not share memory.
std::unique_ptr<Transport> MakeTransport(rendezvous::Store& store, const RankInfo& info,
                                         const std::string& mode, const TcpOptions& tcp,
                                         const ShmOptions& shm, size_t segment_bytes,
                                         size_t small_allreduce_bytes);

}  // namespace trainrun::collectives::internal
