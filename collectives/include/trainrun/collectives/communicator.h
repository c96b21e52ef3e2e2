// Communicator: a group of ranks that run collectives together, over shared memory between ranks
// of one host and TCP otherwise.
//
// Inside a worker that `trainrun` started:
//
//   auto comm = trainrun::collectives::Communicator::FromEnvironment();
//   comm->Allreduce(grads.data(), grads.size(), DataType::kFloat32, ReduceOp::kAverage);
//
// In tests, ranks as threads meeting through one in-memory store:
//
//   auto store = std::make_shared<trainrun::rendezvous::MemoryStore>();
//   // on each of `size` threads:
//   Communicator comm(store, rank, size);
//   comm.Allreduce(in.data(), out.data(), in.size(), DataType::kFloat32, ReduceOp::kSum);
//
// Every rank of a communicator must call the same collectives in the same order with matching
// arguments (count, type, op, root). Before each collective the ranks exchange one small record
// saying what each is about to do, so a rank that disagrees (an allreduce against a barrier, other
// shapes, types, names or roots) makes every rank throw MismatchError for that call, and the
// communicator goes on working (TRAINRUN_CHECK_SHAPES=0 skips the exchange; a mismatch is then
// undefined behaviour). A Communicator is not thread-safe: one thread drives it at a
// time. Errors are exceptions (errors.h): IoError when a peer's connection breaks (naming the
// peer's rank), TimeoutError when a peer stalls past `timeout`, InvalidArgumentError for bad
// arguments. After an IoError or TimeoutError the communicator is broken: every later call throws
// IoError at once.
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trainrun/collectives/errors.h"
#include "trainrun/collectives/types.h"
#include "trainrun/rendezvous/rank_place.h"
#include "trainrun/rendezvous/store.h"

namespace trainrun::collectives {

// CommunicatorOptions tunes how a communicator connects. Defaults come from the environment
// (rendezvous/environment.h), so a field left as is follows TRAINRUN_* variables.
struct CommunicatorOptions {
  // Store keys are put under "collectives/<name>/"; communicators sharing a store need distinct
  // names.
  std::string name = "world";
  // Address to listen on (a numeric IPv4/IPv6 address). Empty: the address of
  // TRAINRUN_NETWORK_INTERFACE, else the local address that routes to TRAINRUN_RENDEZVOUS_ADDR,
  // else loopback.
  std::string listen_address;
  // The job's secret and id; every data connection proves both. Empty: TRAINRUN_JOB_TOKEN and
  // TRAINRUN_JOB_ID.
  std::string job_token;
  std::string job_id;
  // How long any single wait (connecting, a peer's data) may take. Zero: TRAINRUN_TIMEOUT.
  std::chrono::milliseconds timeout{0};
  // "auto", "tcp" or "shm" (see TRAINRUN_TRANSPORT in rendezvous/environment.h). Empty:
  // TRAINRUN_TRANSPORT, whose default is auto: shared memory when every rank is on one host and
  // proven to share its memory, else TCP.
  std::string transport;
  // When set, every wait of the communicator's start-up (the store's gathers and gets, TCP
  // connects, handshakes and accepts, the shared-memory ranks meeting) and every wait of a
  // collective over TCP asks it once it has waited 100 ms for nothing, then every 100 ms, and gives
  // up with an IoError ("interrupted: ...") when it returns true, as if a peer were lost; the
  // constructor then throws that IoError. An elastic worker answers true once the job's next
  // generation leaves out one of this communicator's members: a host lost behind a cut link sends
  // no end-of-file, and a member lost while the others start up never comes, so its peers would
  // otherwise wait for the timeout. Called on the thread that runs the collective or constructs
  // the communicator. Unset, the waits are those of the timeout alone, with no added cost.
  std::function<bool()> interrupt;
};

// RankInfo is a rank's place in the job (DESIGN.md, "Rank layout"): the rendezvous client's
// RankPlace, so that a worker has one struct for it. A communicator built from an explicit store
// treats all ranks as one host: local = global, cross_rank 0, cross_size 1.
using RankInfo = rendezvous::RankPlace;

// CallCheck is what a caller may add to a collective's agreement check beyond count, type, op and
// root: a name and a shape that must be the same on every rank (for Allgather and Alltoall, the
// shape after its first dimension).
struct CallCheck {
  std::string name;
  bool has_shape = false;
  std::vector<int64_t> shape;
};

class Communicator {
 public:
  // Communicator connects rank `rank` of `size` to every other rank, meeting through `store`.
  // Blocks until all ranks have connected; throws TimeoutError when one does not come within the
  // timeout, InvalidArgumentError for a bad rank or size.
  Communicator(std::shared_ptr<rendezvous::Store> store, int rank, int size,
               CommunicatorOptions options = {});
  // Communicator as above, with the full rank layout (info.rank, info.size name the rank).
  Communicator(std::shared_ptr<rendezvous::Store> store, const RankInfo& info,
               CommunicatorOptions options = {});

  // FromEnvironment joins the job of the trainrun that started this process (TRAINRUN_* variables)
  // through its rendezvous server and connects to every rank. Throws Error naming the missing
  // variable when the process was not started by trainrun.
  static std::unique_ptr<Communicator> FromEnvironment(CommunicatorOptions options = {});

  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  const RankInfo& info() const;
  // broken: a collective failed with IoError or TimeoutError, so every later call throws (an
  // elastic worker then joins the job's next generation with a new communicator).
  bool broken() const;
  // transport names the transport in use: "shm" or "tcp".
  const char* transport() const;
  // set_name is the name Subset gave this communicator ("" for one of its own).
  const std::string& set_name() const;

  // Allreduce reduces `count` elements of `input` across ranks with `op` and writes the result to
  // `output` on every rank. `input == output` reduces in place; otherwise the buffers must not
  // overlap. Every rank gets bit-identical results.
  void Allreduce(const void* input, void* output, size_t count, DataType type, ReduceOp op,
                 const CallCheck& check = {});
  // Allreduce in place.
  void Allreduce(void* data, size_t count, DataType type, ReduceOp op,
                 const CallCheck& check = {}) {
    Allreduce(data, data, count, type, op, check);
  }

  // TryAllreduceCopies allreduces in place a buffer the CPU reaches by copies only (a GPU buffer):
  // over shared memory, each piece is copied from it straight into the transport's memory and the
  // results straight back, without a host copy of the whole buffer; every copy has completed when
  // it returns. Returns false, having done nothing, where the transport has no such path (TCP, one
  // rank, Adasum, an allreduce small enough to go in one step): every rank decides alike from the
  // count, type and op, and the caller then copies the buffer to host memory and calls Allreduce.
  // A rank that calls Allreduce of a host buffer instead takes part as in any allreduce.
  bool TryAllreduceCopies(BufferCopies& copies, size_t count, DataType type, ReduceOp op,
                          const CallCheck& check = {});

  // GroupedAllreduce reduces every buffer of `buffers` in place, as one allreduce of their
  // elements one after another (Horovod's grouped allreduce: one collective, one call record with
  // the total count), without copying them into one buffer first where the transport can (shared
  // memory); elsewhere, or for buffers that overlap, through one contiguous copy.
  struct Buffer {
    void* data;
    size_t count;
  };
  void GroupedAllreduce(const std::vector<Buffer>& buffers, DataType type, ReduceOp op,
                        const CallCheck& check = {});

  // AllreduceReady is tensor fusion (Horovod's) for a caller that holds several in-place
  // allreduces queued, in the order every rank calls them (the Python bindings' communication
  // thread): it reduces the first k of `ready` as one allreduce of their elements, where k >= 1 is
  // the fewest any rank has ready, and returns k. The ranks agree on k within the exchange of call
  // records that every collective makes, so one allreduce alone costs what Allreduce does, and k
  // of them one exchange more (which checks names and shapes of the other k - 1). Each entry is
  // checked as if called alone: when the ranks disagree on ready[0], *error is its MismatchError
  // and k = 1; when they disagree on a later one, only ready[0] is reduced (k = 1), so the caller
  // comes to the culprit one call at a time and gets its own message. A failure of the k together
  // is stored in *error (it applies to all k); nothing is thrown. A rank whose next collective is
  // a plain Allreduce of the same buffer description takes part as one with one ready entry.
  // Callers keep every entry's buffer apart from the others' (k stops before one that overlaps).
  struct ReadyAllreduce {
    void* data;
    size_t count;
    const CallCheck* check;  // not null
  };
  size_t AllreduceReady(const std::vector<ReadyAllreduce>& ready, DataType type, ReduceOp op,
                        std::exception_ptr* error);

  // Broadcast copies `count` elements of `data` on rank `root` into `data` on every other rank.
  void Broadcast(void* data, size_t count, DataType type, int root, const CallCheck& check = {});

  // Allgather concatenates every rank's `count` elements of `input`, in rank order, into `output`
  // (size() * count elements) on every rank. `input` may point into `output` at this rank's block.
  void Allgather(const void* input, void* output, size_t count, DataType type,
                 const CallCheck& check = {});

  // Allgatherv is Allgather with a count per rank: `counts[r]` elements from rank r, placed one
  // after another in rank order. `counts` must be the same on every rank; `input` holds
  // counts[rank()] elements.
  void Allgatherv(const void* input, void* output, const std::vector<size_t>& counts, DataType type,
                  const CallCheck& check = {});

  // ReduceScatter reduces size() * `count` elements of `input` across ranks with `op`, and writes
  // block rank() (elements [rank() * count, (rank() + 1) * count)) of the result to `output`.
  void ReduceScatter(const void* input, void* output, size_t count, DataType type, ReduceOp op,
                     const CallCheck& check = {});

  // Alltoallv sends `send_counts[r]` elements of `input` (blocks in rank order) to rank r and
  // receives `recv_counts[r]` elements from rank r into `output` (blocks in rank order).
  // recv_counts[r] on this rank must equal send_counts[rank()] on rank r.
  void Alltoallv(const void* input, const std::vector<size_t>& send_counts, void* output,
                 const std::vector<size_t>& recv_counts, DataType type,
                 const CallCheck& check = {});

  // Barrier returns once every rank has entered it.
  void Barrier();

  // Refuse takes the place of a collective this rank refused for its arguments (`collective`:
  // "allreduce", "broadcast", "allgather", "reducescatter", "alltoall" or "barrier"; `check`: its
  // name): it tells the other ranks in the call check, so that they raise MismatchError for the
  // call they made instead of waiting for this rank, and the communicator stays in step. Returns
  // when every rank refused the same call; throws MismatchError when some made it (the caller
  // then raises its own error, which says what was wrong). Does nothing with the call check off
  // (TRAINRUN_CHECK_SHAPES=0). The collectives below call it for the arguments they refuse.
  void Refuse(const std::string& collective, const CallCheck& check = {});

  // ExchangeKeys allgathers `mine` (the same length on every rank) without a call check and
  // returns every rank's, in rank order: the communication thread's negotiation of the order of
  // named collectives (comm_thread.h), which every rank enters at the same point.
  std::vector<uint64_t> ExchangeKeys(const std::vector<uint64_t>& mine);

  // Join says this rank has no more work (Horovod's join(): e.g. it ran out of data). Until every
  // rank has joined, it takes part in the other ranks' allreduces with zeros (an average still
  // divides by size()) and in their barriers; any other collective called meanwhile throws
  // MismatchError on the ranks that called it. Returns the last rank to join, the same on every
  // rank (of ranks that joined in the same round, the highest).
  int Join();

  // StartTimeline writes a Chrome trace of every later collective of this communicator and its
  // subsets to `path` (one track per rank, all ranks into the one file; rank 0 truncates it).
  // Call it on every rank, between collectives. TRAINRUN_TIMELINE (or HOROVOD_TIMELINE) starts one
  // at construction. Throws InvalidArgumentError when the file cannot be opened.
  void StartTimeline(const std::string& path);
  // StopTimeline stops recording and closes the file.
  void StopTimeline();

  // Subset returns a communicator of the ranks `ranks` (ranks of this one, ascending, this rank
  // among them), numbered 0.. in that order, that runs its collectives over this communicator's
  // connections: no communication happens here. `name` names it in error messages. It must not
  // outlive this communicator, and collectives of several subsets may run concurrently only when
  // the subsets share no rank (one thread drives a rank's communicators).
  std::unique_ptr<Communicator> Subset(const std::vector<int>& ranks, const std::string& name);

  class Impl;

 private:
  explicit Communicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainrun::collectives
