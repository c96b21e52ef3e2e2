// TcpTransport: a full mesh of TCP connections between the ranks of a communicator, driven by one
// thread (the caller's) with non-blocking sockets and poll(2), so two ranks on two cores do not
// fight for them.
//
// Between each pair of ranks there are `sockets_per_peer` data connections (a large message is
// striped across them) and one control connection. The control connection carries only "bye"
// (a clean close) and "abort" (this rank failed because of rank P), so that when one rank dies
// every other rank learns it at once and names the rank that died, even one that was not talking to
// it.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "handshake.h"
#include "socket.h"
#include "trainrun/rendezvous/store.h"
#include "transport.h"

namespace trainrun::collectives::internal {

struct TcpOptions {
  std::string name;         // the communicator's name (store keys, handshake)
  std::string listen_host;  // numeric address to listen on
  std::string token;
  std::string job_id;
  std::chrono::milliseconds timeout{300000};
  int sockets_per_peer = 1;
  int buffer_bytes = 4 << 20;
  std::chrono::microseconds spin{0};  // busy-poll before sleeping in poll(2)
  // CommunicatorOptions::interrupt: asked while a wait (of the start-up or of a collective) moves
  // nothing; true makes it give up with InterruptedError (wait_limit.h).
  std::function<bool()> interrupt;
};

class TcpTransport : public Transport {
 public:
  // TcpTransport listens, gathers every rank's address (Store::Allgather "collectives/<name>/addr",
  // which also leaves its own under "collectives/<name>/addr/<rank>"), connects to every lower rank
  // and accepts every higher one. Throws TimeoutError, IoError or InterruptedError.
  TcpTransport(rendezvous::Store& store, int rank, int size, TcpOptions options);
  // Sends "bye" to every peer and closes.
  ~TcpTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Request Send(int peer, const void* data, size_t bytes) override;
  Request Recv(int peer, void* data, size_t bytes) override;
  void Wait(Request request) override;
  void WaitAll() override;
  int failed_peer() const override { return failed_peer_; }

  // Abort tells every peer still connected that this rank failed because of `peer` (best effort,
  // never blocks), and closes every connection.
  void Abort(int peer, const std::string& message) override;
  const char* name() const override { return "tcp"; }

  // Between two ranks, a record exchange and a small allreduce travel as one frame each way:
  // [8-byte length of the data that follows the record][record][data]. TryCheckedAllreduce sends
  // its record and data at once, so the call check costs no round trip of its own (an allreduce of
  // 4-64 KiB took two before); TryAllgather (the ordinary record exchange, at most
  // kFrameRecordBytes) sends a length of 0 and drains whatever data the peer's frame carries, so a
  // rank that takes either meets the other's record first and both raise a mismatch, with the
  // streams in step. Above two ranks, or above kFoldBytes of data, neither applies (false).
  static constexpr size_t kFrameRecordBytes = 4096;
  static constexpr size_t kFoldBytes = 64 << 10;
  bool TryAllgather(const void* input, void* output, size_t bytes) override;
  bool TryCheckedAllreduce(const void* input, void* output, size_t count, DataType type,
                           ReduceOp op, const void* record, size_t record_bytes, void* records,
                           FunctionRef<bool(bool)> reduce) override;

 private:
  struct Op {
    char* data;
    size_t left;
    Request request;
  };
  struct Conn {
    Fd fd;
    int peer = -1;
    std::deque<Op> sends;
    std::deque<Op> recvs;
    bool maybe_writable = true;
    bool maybe_readable = true;
  };
  struct Control {
    Fd fd;
    std::string received;  // bytes of a message not yet complete
    bool said_bye = false;
  };

  void Establish(rendezvous::Store& store);
  Conn& DataConn(int peer, int index) { return conns_[peer * options_.sockets_per_peer + index]; }
  Request NewRequest(int parts);
  void Post(std::deque<Op> Conn::*queue, int peer, char* data, size_t bytes, Request request);
  // Moves bytes on every connection that may be ready; returns whether anything moved.
  bool Progress();
  bool ProgressSends(Conn& conn);
  bool ProgressRecvs(Conn& conn);
  void CompletePart(Request request);
  // Blocks in poll(2) until a connection is ready or `timeout_ms` passes; reads control messages.
  bool PollOnce(int timeout_ms);
  void ReadControl(int peer);
  [[noreturn]] void Fail(int peer, const std::string& message);
  // FailLost fails for a data connection to `peer` that broke, unless `peer`'s control connection
  // holds (or brings within a moment) an abort that names the rank that failed first.
  [[noreturn]] void FailLost(int peer, const std::string& message);
  [[noreturn]] void FailTimeout();
  // ExchangeFrames sends frame_out_ (the head: length and record) with `bytes` of `data` after it
  // to the other rank, and receives its frame's head (of the same size) into frame_in_ and the
  // data that head announces into payload_in_; returns that data's length. Two ranks only.
  uint64_t ExchangeFrames(const void* data, size_t bytes);

  int rank_;
  int size_;
  TcpOptions options_;
  HandshakeParams params_;
  std::vector<Conn> conns_;          // size * sockets_per_peer; own entries unused
  std::vector<Control> controls_;    // one per peer
  std::vector<uint32_t> remaining_;  // parts still pending, per request since the last WaitAll
  size_t pending_requests_ = 0;
  int failed_peer_ = -1;
  std::vector<char> frame_out_, frame_in_, payload_in_;  // ExchangeFrames
  // Adaptive spinning (Wait): spinning pays only while the peer runs on another CPU. When the two
  // ranks share one (the scheduler often wakes a sleeper on its waker's CPU, and on a loaded
  // machine they stay together), every spin runs out its TRAINRUN_SPIN_MICROSECONDS while the peer
  // cannot run: 50 µs lost per wait. So the waits after a spin that ran out sleep at once, more of
  // them the more spins ran out in a row; one spin that pays turns spinning back on.
  int spin_misses_ = 0;  // spins that ran out in a row (at most 6)
  int spin_skip_ = 0;    // waits left that sleep at once
};

}  // namespace trainrun::collectives::internal
