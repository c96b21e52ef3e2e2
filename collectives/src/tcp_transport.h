// TcpTransport: a full mesh of TCP connections between the ranks of a communicator, driven by one
// thread (the caller's) with non-blocking sockets and poll(2), so two ranks on two cores do not
// fight for them.
//
// Between each pair of ranks there are `sockets_per_peer` data connections (a large message is
// striped across them) and one control connection. The control connection carries "bye" (a clean
// close) and "abort" (this rank failed because of rank P), so that when one rank dies every other
// rank learns it at once and names the rank that died, even one that was not talking to it; and,
// when a rank times out, its question "whom do you wait on?" and the answers of the peers that
// wait inside a collective, so that the timeout names the rank in none (FailTimeout).
#pragma once

#include <poll.h>

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

  // A record exchange and a small allreduce travel in the same frames, so that the call check
  // costs no synchronisation of its own: recursive doubling (the pairs beyond a power of two folded
  // in first and unfolded last, as algorithms.cc's), each step's frame being
  //   [8-byte length of the data that follows the records][the records the sender knows][data],
  // the records of a contiguous range of ranks that doubles every step, so that after log2(n)
  // steps every rank holds every rank's record. TryCheckedAllreduce sends its data in the same
  // frames and reduces into a buffer of its own; only once every record is known (the last step's
  // head) does it decide, through `reduce`, whether the result goes into `output`: a mismatched
  // call leaves the output as it was. TryAllgather (the ordinary record exchange, at most
  // kFrameRecordBytes a rank) sends lengths of 0 and drains whatever data a peer's frames carry, so
  // a rank that takes either meets the others' records in the same frames and every rank raises a
  // mismatch, with the streams in step. At n = 2 this is one frame each way, built by
  // ExchangeFrames (the head whole in one buffer: fewer instructions than the general path). Above
  // FoldBytes(n) of data TryCheckedAllreduce does not apply (false): recursive doubling sends all
  // the data log2(n) times in log2(n) steps, and every rank reduces all of it, where the ring
  // sends 2(n-1)/n of it in 2(n-1) steps and reduces 1/n, so the frames win while a step costs
  // more than the bytes and the reduction (on loopback, docs/performance.md: to 256 KiB at n = 2
  // to 4, not at 512 KiB beside a busy process; beyond 4 ranks 64 KiB, as before).
  static constexpr size_t kFrameRecordBytes = 4096;
  static constexpr size_t FoldBytes(int size) {
    return size <= 4 ? size_t{256} << 10 : size_t{64} << 10;
  }
  bool TryAllgather(const void* input, void* output, size_t bytes) override;
  bool TryCheckedAllreduce(const void* input, void* output, size_t count, DataType type,
                           ReduceOp op, const void* record, size_t record_bytes, void* records,
                           FunctionRef<bool(bool)> reduce) override;

 private:
  struct Op {
    char* data;
    size_t left;
    Request request;
    // A receive may take up to `extra` bytes beyond `left` that are already there (RecvHead: a
    // frame's head and the data it most likely announces in one recv); what it took is the
    // connection's `overread`.
    size_t extra = 0;
  };
  struct Conn {
    Fd fd;
    int peer = -1;
    std::deque<Op> sends;
    std::deque<Op> recvs;
    bool maybe_writable = true;
    bool maybe_readable = true;
    size_t overread = 0;  // bytes the last receive with `extra` took beyond its `left`
    // Bytes read from the socket past the frame they came with (a peer's next frame, when its
    // head announced less data than RecvHead let the receive take): the next receives on this
    // connection take them first, so the stream stays in step.
    std::vector<char> stash;
    size_t stash_from = 0;
  };
  struct Control {
    Fd fd;
    std::string received;  // bytes of a message not yet complete
    bool said_bye = false;
    // The peer's answer to FailTimeout's question (kWaits): the ranks it waits on.
    bool answered = false;
    std::vector<int> waits;
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
  // FailTimeout throws TimeoutError naming the rank this rank's wait is stuck behind: it asks every
  // peer whom it waits on (AskWhomPeersWait) and follows the waits from the peers this rank waits
  // on (WaitedOn) to the ranks that did not answer, those in no collective; when every rank so
  // reached answered (they wait on each other: calls that do not match), it names the peers this
  // rank waits on.
  [[noreturn]] void FailTimeout();
  // WaitedOn: the peers this rank waits to receive from; when none, those it waits to send to.
  std::vector<int> WaitedOn() const;
  // AnswerQuery tells `peer`, which asked (kQuery), whom this rank waits on (kWaits: WaitedOn).
  void AnswerQuery(int peer);
  // AskWhomPeersWait asks every peer whom it waits on and reads the control connections until
  // each has answered (Control::answered) or a tenth of the timeout (50 ms to 1 s) has passed,
  // answering the peers' own questions meanwhile. Throws, as ReadControl does, on an abort that
  // names another rank or a connection that closed.
  void AskWhomPeersWait();
  // FramedExchange at n = 2: ExchangeFrames sends frame_out_ (the head: length and record) with
  // `bytes` of `data` after it to the other rank, and receives its frame's head (of the same size)
  // into frame_in_ and the data that head announces (payload_); returns that data's length.
  uint64_t ExchangeFrames(const void* data, size_t bytes);
  // AnnouncedBytes: the data length in the head just received into frame_in_ from `peer`; fails
  // (IoError naming the peer) when it is more than any rank sends (FoldBytes).
  uint64_t AnnouncedBytes(int peer);
  // FramedExchange runs the frames above: `all` holds this rank's record (`record_bytes`) at its
  // place and gets every rank's. With `reduce` (TryCheckedAllreduce), `count` elements of `type`
  // at `input` travel with the records and, when reduce(same) says so once every record is known,
  // their reduction by `op` lands in `output`; `same`: every record is the same bytes as this
  // rank's.
  void FramedExchange(const char* input, char* output, size_t count, DataType type, ReduceOp op,
                      char* all, size_t record_bytes, FunctionRef<bool(bool)>* reduce);
  // SendFrame queues a frame to `peer`: the records of ranks [first, end) from `all`, then
  // `bytes` of `data`. A frame whose data is small (kCopyFrameBytes) is copied into one buffer
  // and queued as one send; a larger one goes as its parts, in one sendmsg, without a copy.
  // Where ranks share cores, each queued part's bookkeeping is CPU on the other ranks' path.
  void SendFrame(int peer, const char* all, size_t record_bytes, int first, int end,
                 const void* data, size_t bytes);
  // RecvHead receives a frame's head from `peer`, its records (ranks [first, end)) into `all`, and
  // returns the length of the data that follows. The receive may take up to `expected` bytes of
  // that data with the head (one system call where the peer's data is as long as this rank's:
  // RecvFrameHead); RecvData takes the rest.
  uint64_t RecvHead(int peer, char* all, size_t record_bytes, int first, int end, size_t expected);
  // RecvFrameHead receives `head` bytes from `peer` into frame_in_, and up to `expected` more
  // that are already there (frame_got_ says how many).
  void RecvFrameHead(int peer, size_t head, size_t expected);
  // RecvData receives the `theirs` bytes of data the head just received announced: into `into`
  // when it is not null (`theirs` is then what was expected), else into frame_in_ or payload_in_;
  // payload_ points at them. Bytes the head's receive took past them go back to the connection
  // (Conn::stash). Waits for everything queued.
  void RecvData(int peer, uint64_t theirs, char* into);

  int rank_;
  int size_;
  TcpOptions options_;
  HandshakeParams params_;
  std::vector<Conn> conns_;          // size * sockets_per_peer; own entries unused
  std::vector<Control> controls_;    // one per peer
  std::vector<uint32_t> remaining_;  // parts still pending, per request since the last WaitAll
  size_t pending_requests_ = 0;
  int failed_peer_ = -1;
  // The frames' buffers: a head going out (n = 2) and one coming in, a peer's data, a sum.
  std::vector<char> frame_out_, frame_in_, payload_in_, sum_;
  std::vector<char> frame_send_;  // a small frame being sent (SendFrame), head and data
  // SendBuffer returns frame_send_ with room for `bytes`.
  char* SendBuffer(size_t bytes);
  // The head just received lies at frame_in_[frame_at_, frame_at_ + frame_head_), frame_at_
  // chosen so that the data received after it starts 16-byte aligned, as payload_in_'s does.
  size_t frame_at_ = 0;
  size_t frame_head_ = 0;
  size_t frame_got_ = 0;           // data bytes received with the head, after it
  const char* payload_ = nullptr;  // the data RecvData received when `into` was null
  const char* FrameHead() const { return frame_in_.data() + frame_at_; }
  // PollOnce's lists, kept between calls (no allocation a wait): the descriptors, and whose each
  // is (an index into conns_, or -(peer + 1) for a control connection).
  std::vector<pollfd> poll_fds_;
  std::vector<int> poll_owner_;
  uint64_t length_out_ = 0;  // the length word of the frame being sent (n > 2)
  bool resolving_ = false;   // FailTimeout is asking the peers whom they wait on
  // Adaptive spinning (Wait): spinning pays only while the peer runs on another CPU. When the two
  // ranks share one (the scheduler often wakes a sleeper on its waker's CPU, and on a loaded
  // machine they stay together), every spin runs out its TRAINRUN_SPIN_MICROSECONDS while the peer
  // cannot run: 50 µs lost per wait. So the waits after a spin that ran out sleep at once, more of
  // them the more spins ran out in a row; one spin that pays turns spinning back on.
  int spin_misses_ = 0;  // spins that ran out in a row (at most 6)
  int spin_skip_ = 0;    // waits left that sleep at once
};

}  // namespace trainrun::collectives::internal
