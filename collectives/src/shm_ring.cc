// ShmTransport's point-to-point path: a single-producer single-consumer ring per ordered pair of
// ranks (Send, Recv, Wait), for broadcast, allgather, reduce-scatter and barrier.
#include <cstring>

#include "shm_internal.h"
#include "trainrun/collectives/errors.h"

namespace trainrun::collectives::internal {

using namespace shm;  // NOLINT: this transport's own internals

// --- Point to point ---------------------------------------------------------------------------

Request ShmTransport::NewRequest(size_t bytes) {
  done_.push_back(bytes == 0 ? 1 : 0);
  if (bytes > 0) ++pending_;
  return done_.size() - 1;
}

Request ShmTransport::Send(int peer, const void* data, size_t bytes) {
  TRAINRUN_ENFORCE(peer >= 0 && peer < size_ && peer != rank_, "send to rank ", peer);
  Request request = NewRequest(bytes);
  SetState(kWorking);
  if (bytes > 0) {
    sends_[peer].push_back(Op{static_cast<char*>(const_cast<void*>(data)), bytes, request});
    ProgressSend(peer);
  }
  return request;
}

Request ShmTransport::Recv(int peer, void* data, size_t bytes) {
  TRAINRUN_ENFORCE(peer >= 0 && peer < size_ && peer != rank_, "receive from rank ", peer);
  Request request = NewRequest(bytes);
  SetState(kWorking);
  if (bytes > 0) recvs_[peer].push_back(Op{static_cast<char*>(data), bytes, request});
  return request;
}

void ShmTransport::Ring(int peer) {
  Control& c = control(peer);
  c.doorbell.fetch_add(1);
  if (c.doorbell_waiters.load() != 0) FutexWakeAll(&c.doorbell);
}

bool ShmTransport::ProgressSend(int peer) {
  bool moved = false;
  Channel& ch = channel(rank_, peer);
  char* base = ring(rank_, peer);
  const size_t capacity = options_.channel_bytes;
  while (!sends_[peer].empty()) {
    Op& op = sends_[peer].front();
    const uint64_t head = ch.head.load(std::memory_order_relaxed);
    const uint64_t tail = ch.tail.load(std::memory_order_acquire);
    size_t space = capacity - static_cast<size_t>(head - tail);
    if (space == 0) break;
    size_t k = std::min(space, op.left);
    size_t at = static_cast<size_t>(head % capacity);
    size_t first = std::min(k, capacity - at);
    std::memcpy(base + at, op.data, first);
    if (k > first) std::memcpy(base, op.data + first, k - first);
    ch.head.store(head + k, std::memory_order_release);
    op.data += k;
    op.left -= k;
    moved = true;
    if (op.left == 0) {
      done_[op.request] = 1;
      --pending_;
      sends_[peer].pop_front();
    }
  }
  if (moved) Ring(peer);
  return moved;
}

bool ShmTransport::ProgressRecv(int peer) {
  bool moved = false;
  Channel& ch = channel(peer, rank_);
  const char* base = ring(peer, rank_);
  const size_t capacity = options_.channel_bytes;
  while (!recvs_[peer].empty()) {
    Op& op = recvs_[peer].front();
    const uint64_t tail = ch.tail.load(std::memory_order_relaxed);
    const uint64_t head = ch.head.load(std::memory_order_acquire);
    size_t avail = static_cast<size_t>(head - tail);
    if (avail == 0) break;
    size_t k = std::min(avail, op.left);
    size_t at = static_cast<size_t>(tail % capacity);
    size_t first = std::min(k, capacity - at);
    std::memcpy(op.data, base + at, first);
    if (k > first) std::memcpy(op.data + first, base, k - first);
    ch.tail.store(tail + k, std::memory_order_release);
    op.data += k;
    op.left -= k;
    moved = true;
    if (op.left == 0) {
      done_[op.request] = 1;
      --pending_;
      recvs_[peer].pop_front();
    }
  }
  if (moved) Ring(peer);
  return moved;
}

bool ShmTransport::Progress() {
  bool moved = false;
  for (int p = 0; p < size_; ++p) {
    if (!recvs_[p].empty()) moved |= ProgressRecv(p);
    if (!sends_[p].empty()) moved |= ProgressSend(p);
  }
  return moved;
}

void ShmTransport::Wait(Request request) {
  TRAINRUN_ENFORCE(request < done_.size(), "unknown request ", request);
  Control& me = control(rank_);
  if (done_[request] != 0 || (Progress() && done_[request] != 0)) {
    SetState(kWorking);
    return;
  }
  WaitClock clock(options_, MaySpin());
  while (done_[request] == 0) {
    const uint32_t seen = me.doorbell.load();
    if (Progress()) {
      clock.Moved(options_);
      continue;
    }
    // Blame a peer this rank still waits on: the first pending receive, else the first send.
    int blame = -1;
    for (int p = 0; p < size_ && blame < 0; ++p) {
      if (!recvs_[p].empty()) blame = p;
    }
    for (int p = 0; p < size_ && blame < 0; ++p) {
      if (!sends_[p].empty()) blame = p;
    }
    Idle(me.doorbell, me.doorbell_waiters, seen, clock, blame);
  }
  EndWait(clock);
  SetState(kWorking);
}

void ShmTransport::WaitAll() {
  for (Request r = 0; r < done_.size(); ++r) {
    if (done_[r] == 0) Wait(r);
  }
  done_.clear();
  pending_ = 0;
}

}  // namespace trainrun::collectives::internal
