#include "shm_transport.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

#include "shm_internal.h"
#include "trainrun/collectives/errors.h"

namespace trainrun::collectives::internal {

using ::trainrun::internal::MakeMessage;
using namespace shm;  // NOLINT: this transport's own internals

size_t ShmTransport::SegmentBytes(int size, const ShmOptions& options) {
  const size_t n = static_cast<size_t>(size);
  size_t bytes = kHeaderBytes;
  bytes += RoundUp(sizeof(Shared) + n * sizeof(Control), kPage);
  bytes += RoundUp(n * n * sizeof(Channel), kPage);
  bytes += n * n * RoundUp(options.channel_bytes, kPage);
  bytes += n * 2 * SlotStride(options.chunk_bytes);
  return bytes;
}

ShmTransport::ShmTransport(ShmSegment segment, int rank, int size, ShmOptions options)
    : segment_(std::move(segment)),
      rank_(rank),
      size_(size),
      options_(options),
      sends_(size),
      recvs_(size),
      last_beat_(size),
      last_change_(size) {
  cpu_set_t cpus;
  oversubscribed_ = ::sched_getaffinity(0, sizeof(cpus), &cpus) == 0 && size_ > CPU_COUNT(&cpus);
  options_.channel_bytes = RoundUp(options_.channel_bytes, kPage);
  options_.chunk_bytes = RoundUp(options_.chunk_bytes, kPage);
  const size_t n = static_cast<size_t>(size);
  TRAINRUN_ENFORCE(segment_.bytes() == SegmentBytes(size, options_), "segment of ",
                   segment_.bytes(), " bytes for a layout of ", SegmentBytes(size, options_));
  controls_offset_ = kHeaderBytes;
  channels_offset_ = controls_offset_ + RoundUp(sizeof(Shared) + n * sizeof(Control), kPage);
  rings_offset_ = channels_offset_ + RoundUp(n * n * sizeof(Channel), kPage);
  slots_offset_ = rings_offset_ + n * n * options_.channel_bytes;
  pid_ = ::getpid();
  control(rank_).pid.store(pid_);
}

ShmTransport::~ShmTransport() {
  if (watcher_.joinable()) {
    const uint64_t one = 1;
    (void)!::write(stop_fd_, &one, sizeof one);
    watcher_.join();
  }
  if (stop_fd_ >= 0) ::close(stop_fd_);
  Control& me = control(rank_);
  me.closed.store(1);
  me.doorbell.fetch_add(1);
  FutexWakeAll(&me.doorbell);
}

void ShmTransport::WatchPeers() {
  watches_.resize(size_);
  std::vector<int> pidfds;
  for (int p = 0; p < size_; ++p) {
    const pid_t pid = control(p).pid.load();
    if (p != rank_ && pid != pid_) {
      watches_[p] = ProcessWatch(pid);
      if (watches_[p].fd() >= 0) pidfds.push_back(watches_[p].fd());
    }
  }
  if (pidfds.empty()) return;
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (stop_fd_ < 0) return;  // the periodic checks in Idle still notice, within a sleep slice
  watcher_ = std::thread([this, pidfds] { Watch(pidfds); });
}

void ShmTransport::Watch(std::vector<int> pidfds) {
  for (;;) {
    std::vector<pollfd> fds{{stop_fd_, POLLIN, 0}};
    for (int fd : pidfds) fds.push_back({fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents != 0) return;
    std::vector<int> alive;
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) alive.push_back(fds[i].fd);
    }
    pidfds.swap(alive);
    // Wake this rank wherever it sleeps: on its doorbell, or on a peer's step.
    peer_ended_.store(true);
    FutexWakeAll(&control(rank_).doorbell);
    shared().epoch.fetch_add(1);
    FutexWakeAll(&shared().epoch);
    if (pidfds.empty()) return;
  }
}

// --- Peers and failure --------------------------------------------------------------------------

void ShmTransport::CheckPeers(int blame) {
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    Control& c = control(p);
    const int32_t culprit_plus_one = c.culprit.load(std::memory_order_acquire);
    if (culprit_plus_one != 0) {
      int culprit = culprit_plus_one - 1;
      if (culprit < 0 || culprit >= size_) culprit = p;
      // A peer that timed out waiting on this rank blames it, but this rank is alive and waiting
      // too: pass the blame on to whoever this rank waits on.
      if (culprit == rank_) FailTimeout(blame >= 0 ? blame : p);
      Fail(culprit, culprit == p ? MakeMessage("rank ", Global(p), " failed")
                                 : MakeMessage("rank ", Global(culprit), " failed, as rank ",
                                               Global(p), " reports"));
    }
    // A peer that closed its communicator may have finished its part; it is an error only when
    // this rank still waits on it. One that ended without closing failed, whoever waits on whom.
    const bool waiting_on = p == blame || !recvs_[p].empty() || !sends_[p].empty();
    const bool closed = c.closed.load() != 0;
    // What a peer sent before closing is visible once `closed` is: use it before blaming.
    if (closed && waiting_on && awaiting_step_ && Reached(c.step.load(), awaited_step_)) continue;
    if (closed && waiting_on && !awaiting_step_ && Progress()) continue;
    if (closed && waiting_on) {
      Fail(p, MakeMessage("rank ", Global(p),
                          " closed its communicator while this rank still waited on it"));
    }
    if (!closed && static_cast<size_t>(p) < watches_.size() && !watches_[p].Alive()) {
      Fail(p, MakeMessage("rank ", Global(p), " exited or was killed"));
    }
  }
}

void ShmTransport::Fail(int peer, const std::string& message) {
  failed_peer_ = peer;
  throw IoError(MakeMessage("rank ", Global(rank_), ": ", message));
}

void ShmTransport::FailTimeout(int peer) {
  failed_peer_ = peer;
  throw TimeoutError(MakeMessage("rank ", Global(rank_), ": no progress from rank ", Global(peer),
                                 " for ", options_.timeout.count() / 1000.0,
                                 " s over shared memory; is it stuck outside the collective?"));
}

void ShmTransport::Abort(int peer, const std::string& message) {
  Control& me = control(rank_);
  me.culprit.store(peer >= 0 ? peer + 1 : rank_ + 1, std::memory_order_release);
  me.step.fetch_add(0x10000000);  // wakes whoever waits on this rank's steps
  shared().epoch.fetch_add(1);
  FutexWakeAll(&shared().epoch);
  for (int p = 0; p < size_; ++p) {
    if (p != rank_) Ring(p);
  }
}

}  // namespace trainrun::collectives::internal
