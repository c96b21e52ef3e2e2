// Transport: the seam between algorithms and the wire. An algorithm posts sends and receives of byte
// ranges to peer ranks and waits for them; TCP is one transport, shared memory comes later.
//
//   Request r = transport.Recv(left, tmp, bytes);
//   transport.Send(right, data, bytes);
//   transport.Wait(r);
//   transport.WaitAll();
#pragma once

#include <cstddef>
#include <cstdint>

namespace trainrun::collectives::internal {

// Request identifies one posted send or receive until the next WaitAll.
using Request = uint64_t;

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Send queues `bytes` bytes at `data` for rank `peer`; `data` must stay valid and unchanged until
  // the request completes. Sends to one peer go out in the order they were posted.
  virtual Request Send(int peer, const void* data, size_t bytes) = 0;

  // Recv queues a receive of exactly `bytes` bytes from `peer` into `data`. Receives from one peer
  // complete in the order posted, and each must match, in size, the peer's Send in the same
  // position of its sequence to this rank.
  virtual Request Recv(int peer, void* data, size_t bytes) = 0;

  // Wait makes progress on every queued request until `request` has completed. Throws IoError when a
  // peer's connection breaks and TimeoutError when nothing moved for the timeout; failed_peer() then
  // names the peer.
  virtual void Wait(Request request) = 0;

  // WaitAll waits until every queued request has completed.
  virtual void WaitAll() = 0;

  // failed_peer returns the rank whose connection failed or stalled in the last error, or -1.
  virtual int failed_peer() const = 0;
};

}  // namespace trainrun::collectives::internal
