// Transport: the seam between algorithms and the wire. An algorithm posts sends and receives of
// byte ranges to peer ranks and waits for them; TCP is one transport, shared memory
// (shm_transport.h) another.
//
//   Request r = transport.Recv(left, tmp, bytes);
//   transport.Send(right, data, bytes);
//   transport.Wait(r);
//   transport.WaitAll();
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "function_ref.h"
#include "trainrun/collectives/types.h"

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

  // Wait makes progress on every queued request until `request` has completed. Throws IoError when
  // a peer's connection breaks and TimeoutError when nothing moved for the timeout; failed_peer()
  // then names the peer.
  virtual void Wait(Request request) = 0;

  // WaitAll waits until every queued request has completed.
  virtual void WaitAll() = 0;

  // failed_peer returns the rank whose connection failed or stalled in the last error, or -1.
  virtual int failed_peer() const = 0;

  // Abort tells every peer that this rank failed because of `peer` (-1: unknown), best effort and
  // without blocking, so that they raise too instead of waiting for it.
  virtual void Abort(int peer, const std::string& message) = 0;

  // TryAllreduce runs a whole allreduce the transport's own way and returns true, or returns false
  // when the transport has no such path (the algorithms in algorithms.h then run over Send/Recv).
  // The Try* allreduces are element-wise: ReduceOp::kAdasum never reaches TryAllreduce and
  // TryAllreducePieces (the communicator runs adasum.h over Send/Recv), and TryCheckedAllreduce
  // returns false for it.
  virtual bool TryAllreduce(const void* /*input*/, void* /*output*/, size_t /*count*/,
                            DataType /*type*/, ReduceOp /*op*/) {
    return false;
  }

  // Piece is one buffer of an allreduce of several (TryAllreducePieces), reduced in place.
  struct Piece {
    char* data;
    size_t count;
  };
  // TryAllreducePieces allreduces in place the elements of `pieces` one after another (`count` in
  // all; the pieces do not overlap) as TryAllreduce would their concatenation, without
  // concatenating them, and returns true; or returns false when it has no such path for this
  // count (every rank decides alike from `count`), and the caller concatenates.
  virtual bool TryAllreducePieces(const std::vector<Piece>& /*pieces*/, size_t /*count*/,
                                  DataType /*type*/, ReduceOp /*op*/) {
    return false;
  }
  // TryAllgather gathers `bytes` bytes from every rank into `output` (rank order, `bytes` apart)
  // the transport's own way and returns true, or returns false when it has no such path for this
  // size (every rank decides alike from `bytes`). `input` may be this rank's place in `output`.
  virtual bool TryAllgather(const void* /*input*/, void* /*output*/, size_t /*bytes*/) {
    return false;
  }
  // TryCheckedAllreduce is TryAllreduce with the call-record exchange (call_check.h) folded into
  // the same step, so that a small allreduce synchronises the ranks once instead of twice: every
  // rank publishes `record` (`record_bytes`) with its input, and the reduction into `output`
  // happens only when `reduce(same)` returns true. `same` true says every rank's record is the
  // same bytes as `record` (`records` may or may not hold them); false, that the records of all
  // ranks were copied to `records` (rank order, `record_bytes` apart) for `reduce` to read. The
  // common case so costs a comparison per peer, no copies. Returns false, having done nothing, when
  // the transport has no such path for this count. A rank that takes the path and one that
  // exchanges records the ordinary way (TryAllgather of one record: a different call, a count
  // too large) stay in step: both publish their record at the same place and synchronise once,
  // so each sees the other's record and both raise the mismatch.
  virtual bool TryCheckedAllreduce(const void* /*input*/, void* /*output*/, size_t /*count*/,
                                   DataType /*type*/, ReduceOp /*op*/, const void* /*record*/,
                                   size_t /*record_bytes*/, void* /*records*/,
                                   FunctionRef<bool(bool)> /*reduce*/) {
    return false;
  }
  // CanAllreduceCopies says whether TryAllreduceCopies and TryCheckedAllreduceCopies take an
  // in-place allreduce of `count` elements of a buffer reached through copies (BufferCopies, a GPU
  // buffer) straight through the transport's own memory (every rank decides alike). Where it says
  // yes, a rank with the buffer in host memory running TryAllreduce or TryCheckedAllreduce of the
  // same count takes the same steps, so the two kinds mix in one collective.
  virtual bool CanAllreduceCopies(size_t /*count*/, DataType /*type*/, ReduceOp /*op*/) const {
    return false;
  }
  // TryAllreduceCopies is TryAllreduce (in place) of the buffer `copies` reaches; every copy it
  // enqueues has completed when it returns. False, having done nothing, where CanAllreduceCopies
  // says no.
  virtual bool TryAllreduceCopies(BufferCopies& /*copies*/, size_t /*count*/, DataType /*type*/,
                                  ReduceOp /*op*/) {
    return false;
  }
  // TryCheckedAllreduceCopies is TryCheckedAllreduce (in place) of the buffer `copies` reaches.
  virtual bool TryCheckedAllreduceCopies(BufferCopies& /*copies*/, size_t /*count*/,
                                         DataType /*type*/, ReduceOp /*op*/, const void* /*record*/,
                                         size_t /*record_bytes*/, void* /*records*/,
                                         FunctionRef<bool(bool)> /*reduce*/) {
    return false;
  }
  // Finished says a collective is over: until the next one this rank computes, so a peer's
  // shared-memory waiter must not spin on it (Send/Recv/Wait leave it marked as working, since an
  // algorithm's next step follows at once).
  virtual void Finished() {}
  // name says which transport this is ("tcp", "shm"), for logs and benchmarks.
  virtual const char* name() const = 0;
};

}  // namespace trainrun::collectives::internal
