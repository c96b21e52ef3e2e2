#include "same_host.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "store_calls.h"
#include "trainrun/collectives/errors.h"

namespace trainrun::collectives::internal {

using ::trainrun::internal::MakeMessage;

std::optional<ShmSegment> ProveSharedMemory(rendezvous::Store& store, const std::string& prefix,
                                            int rank, const std::vector<int>& members, size_t bytes,
                                            const std::string& extra, const WaitLimit& limit,
                                            std::string* why, std::string* extra_out) {
  TRAINRUN_ENFORCE(!members.empty() && bytes >= kNonceBytes, "bad shared-memory group");
  const bool leader = rank == members[0];
  const std::string segment_key = prefix + "/segment";
  std::optional<ShmSegment> segment;
  std::string verdict = "ok";
  if (leader) {
    std::string nonce;
    try {
      segment = ShmSegment::Create(bytes);
      nonce = RandomNonce(kNonceBytes / 2);
      std::memcpy(segment->data(), nonce.data(), kNonceBytes);
    } catch (const Error& e) {
      segment.reset();
      verdict = e.what();
    }
    StorePut(store, segment_key,
             segment
                 ? MakeMessage(::getpid(), " ", segment->fd(), " ", bytes, " ", nonce, " ", extra)
                 : std::string("none"));
    if (extra_out != nullptr) *extra_out = extra;
  } else {
    const std::string published = StoreGet(store, {segment_key}, limit,
                                           MakeMessage("rank ", rank, ": waiting for rank ",
                                                       members[0], "'s shared-memory segment"))[0];
    std::istringstream in(published);
    long pid = 0;
    int fd = -1;
    size_t size = 0;
    std::string nonce;
    if (!(in >> pid >> fd >> size >> nonce) || size != bytes || nonce.size() != kNonceBytes) {
      verdict =
          MakeMessage("rank ", members[0], " could not create a segment of ", bytes, " bytes");
    } else {
      std::string rest;
      std::getline(in >> std::ws, rest);
      if (extra_out != nullptr) *extra_out = rest;
      try {
        segment = ShmSegment::Open(static_cast<pid_t>(pid), fd, size);
        if (std::memcmp(segment->data(), nonce.data(), kNonceBytes) != 0) {
          segment.reset();
          verdict = MakeMessage("/proc/", pid, "/fd/", fd, " is not rank ", members[0],
                                "'s segment (its nonce differs): not the same host");
        }
      } catch (const Error& e) {
        verdict = e.what();
      }
    }
  }
  const int index =
      static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
  const auto verdicts =
      StoreAllgather(store, prefix + "/verdict", index, static_cast<int>(members.size()), verdict,
                     limit, MakeMessage("rank ", rank, ": waiting for the same-host check"));
  // Every member has mapped the segment (or given up): the descriptor is no longer needed.
  if (segment) segment->CloseFd();
  for (size_t i = 0; i < verdicts.size(); ++i) {
    if (verdicts[i] != "ok") {
      if (why != nullptr) {
        *why = MakeMessage("rank ", members[i], " cannot share memory with rank ", members[0], ": ",
                           verdicts[i]);
      }
      return std::nullopt;
    }
  }
  return segment;
}

}  // namespace trainrun::collectives::internal
