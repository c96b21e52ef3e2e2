// --sync-dst-dir (MXNet's tools/launch.py flag): before the ranks start, the source directory
// (--sync-src-dir, default trainrun's own) is copied to DIR on every host of the job, over the
// agent connection that already reaches each host (SSH, a remote shell, srun): no second login, no
// rsync needed there. Only what differs is sent: the launcher offers its listing (path, type, size,
// mtime), each agent answers with the files whose size or mtime differ on its side (as rsync's
// quick check), and the launcher streams those, all hosts in parallel. `.git` and the
// --sync-exclude patterns are left out; nothing is deleted on the hosts (as `rsync -a`, which
// launch.py runs). A host's files are written to a temporary name and renamed when whole, with the
// source's mode and mtime, so that an interrupted sync leaves no half file under a real name.
//
//   auto offer = ScanSource("/home/me/job", "/tmp/job", {"*.ckpt"});       // the listing
//   SyncStats stats = SyncToAgents(*offer, "/home/me/job", agents, progress); // every host
//
// The agent's side is SyncReceiver (agent.cc feeds it the frames); a job with ranks on this machine
// uses the same receiver in-process (SyncLocally), so that every rank starts in DIR.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "remote/agent_connector.h"
#include "remote/agent_protocol.h"

namespace trainrun::launcher::remote {

// Excluded says whether `path` (relative, '/'-separated) is left out: its name is `.git`, or a
// pattern matches it as fnmatch(3) does: a pattern without '/' against its last name (as rsync),
// one with '/' against the whole relative path.
bool Excluded(absl::string_view path, const std::vector<std::string>& excludes);

// ScanSource lists `src` (an absolute directory) for the host directory `dir`: directories before
// what they hold, symbolic links as links, other special files skipped. A directory that is `dir`
// itself (DIR inside SRC on this machine) is left out. Errors: `src` missing or unreadable, one
// sentence naming it.
absl::StatusOr<SyncOffer> ScanSource(const std::string& src, const std::string& dir,
                                     const std::vector<std::string>& excludes);

// SyncReceiver writes an offer into its directory: Offer, then Data for each wanted file in order,
// then End. Each error is one sentence naming the path (the caller names the host).
class SyncReceiver {
 public:
  SyncReceiver() = default;
  ~SyncReceiver();
  SyncReceiver(const SyncReceiver&) = delete;
  SyncReceiver& operator=(const SyncReceiver&) = delete;

  // Offer makes the directory and what the offer's directories and links need, and returns the
  // indices of the files to send (missing, or another size or mtime).
  absl::StatusOr<std::vector<uint32_t>> Offer(SyncOffer offer);
  // Data writes a piece of a wanted file; the piece that completes it puts it in place.
  absl::Status Data(uint32_t index, uint64_t offset, absl::string_view bytes);
  // End checks that every wanted file arrived whole.
  absl::StatusOr<SyncDone> End();

 private:
  absl::Status Finish();
  void Abandon();

  SyncOffer offer_;
  std::vector<uint32_t> wanted_;
  size_t next_wanted_ = 0;  // wanted_[next_wanted_] is the file being written or next
  int fd_ = -1;
  std::string temp_path_;
  uint64_t written_ = 0;
  SyncDone done_;
};

// SyncStats is what a sync did, summed over the hosts.
struct SyncStats {
  int hosts = 0;
  uint64_t files = 0;      // files written
  uint64_t bytes = 0;      // their bytes
  uint64_t unchanged = 0;  // files already there with the same size and mtime
};

// SyncProgress counts the bytes sent to every host so far (for a progress line) and the bytes the
// sync will send in all (known once every host answered its offer).
struct SyncProgress {
  std::atomic<uint64_t> sent{0};
  std::atomic<uint64_t> total{0};
};

// SyncToAgents syncs `offer` (ScanSource of `src`) to every agent in parallel, before their Job;
// returns the sums, or the first failure as one line naming the host (the others stop).
absl::StatusOr<SyncStats> SyncToAgents(const SyncOffer& offer, const std::string& src,
                                       std::vector<RemoteAgent>& agents, SyncProgress& progress);

// SyncLocally syncs `offer` into its directory on this machine, with the agents' receiver.
absl::StatusOr<SyncStats> SyncLocally(const SyncOffer& offer, const std::string& src,
                                      SyncProgress& progress);

}  // namespace trainrun::launcher::remote
