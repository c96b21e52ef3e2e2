// Communicator: an NCCL communicator over the GPUs of a trainrun job, one rank per GPU.
//
// Rank 0 creates the NCCL unique ID and publishes it through the rendezvous; the others wait for it
// (ExchangeUniqueId), then every rank joins with ncclCommInitRankConfig on its device. Collectives
// take device buffers and are enqueued on a CUDA stream: the caller's, or the communicator's own
// when the stream argument is nullptr (pass cudaStreamLegacy for the legacy default stream).
// Synchronize() waits for a stream while watching for a peer's failure.
//
//   auto comm = Communicator::FromEnvironment();          // inside a worker started by trainrun
//   comm->Allreduce(grads, grads, n, DataType::kFloat32, ReduceOp::kAvg);
//   comm->Synchronize();
//
// No rank hangs: the communicator is non-blocking (NCCL's config.blocking = 0), so creation,
// enqueueing and Synchronize() poll ncclCommGetAsyncError against the deadline
// (CommunicatorOptions::timeout, TRAINRUN_TIMEOUT by default). When a peer fails or the deadline
// passes, the communicator is aborted (ncclCommAbort) and the call throws IoError or TimeoutError;
// every later call then throws Error.
//
// NCCL and CUDA's runtime are opened at run time (gpu/loader.h's search: TRAINRUN_NCCL_LIBRARY,
// a copy already loaded, the nvidia-* wheels, the loader's path), not linked: where either does
// not open, the first call throws Error saying what was tried and why not.
//
// A Communicator is not thread-safe: use it from one thread at a time.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>

#include "trainrun/collectives/nccl/types.h"
#include "trainrun/rendezvous/client.h"
#include "trainrun/rendezvous/store.h"

struct ncclComm;  // nccl.h: typedef struct ncclComm* ncclComm_t.

namespace trainrun::collectives::nccl {

struct CommunicatorOptions {
  // Names the communicator in the rendezvous (its unique-ID key) and in NCCL's logs. Every rank
  // must pass the same name, and a name serves one communicator per job.
  std::string name = "world";
  // Bound on every wait: for the unique ID, for creation, and for each collective to be enqueued
  // or synchronized. Zero means TRAINRUN_TIMEOUT (env::kTimeoutSeconds).
  std::chrono::milliseconds timeout{0};
};

class Communicator {
  struct Passkey {};

 public:
  // Create makes rank `rank` of a communicator of `size` ranks on CUDA device `device`, exchanging
  // the unique ID through `store`. It makes `device` the calling thread's current device. Every
  // rank calls it at the same time; it returns once all have joined, or throws (TimeoutError naming
  // the missing root, or NCCL's error) and leaves nothing behind.
  static std::unique_ptr<Communicator> Create(rendezvous::Store& store, int rank, int size,
                                              int device, const CommunicatorOptions& options = {});

  // FromSession creates the communicator over all of a joined job's ranks, through the session's
  // Store, on device DeviceForLocalRank(local_rank, visible device count). Use it when the process
  // has already joined the rendezvous (a rank joins once), e.g. for the TCP collectives too.
  static std::unique_ptr<Communicator> FromSession(const rendezvous::WorkerSession& session,
                                                   const CommunicatorOptions& options = {});

  // FromEnvironment joins the job's rendezvous (rendezvous::JoinFromEnvironment: the
  // TRAINRUN_RENDEZVOUS_ADDR, TRAINRUN_JOB_TOKEN, ... the launcher set) and calls FromSession.
  // Throws InvalidArgumentError outside a trainrun job, TimeoutError or IoError when the rendezvous
  // cannot be reached.
  static std::unique_ptr<Communicator> FromEnvironment(const CommunicatorOptions& options = {});

  Communicator(Passkey, ncclComm* comm, int rank, int size, int device, std::string name,
               std::chrono::milliseconds timeout);
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // The destructor finalizes and destroys the communicator, aborting it when that does not finish
  // within the timeout.
  ~Communicator();

  // Allreduce combines `count` elements of every rank's `send` with `op` into every rank's `recv`.
  // send == recv works in place.
  void Allreduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                 cudaStream_t stream = nullptr);

  // Broadcast copies `count` elements of `root`'s `send` into every rank's `recv` (`send` is read
  // on the root only).
  void Broadcast(const void* send, void* recv, size_t count, DataType type, int root,
                 cudaStream_t stream = nullptr);

  // Allgather concatenates every rank's `send_count` elements, in rank order, into every rank's
  // `recv`, which holds send_count * size() elements.
  void Allgather(const void* send, void* recv, size_t send_count, DataType type,
                 cudaStream_t stream = nullptr);

  // ReduceScatter combines every rank's `send` (recv_count * size() elements) with `op` and leaves
  // block `rank()` of the result, `recv_count` elements, in `recv`.
  void ReduceScatter(const void* send, void* recv, size_t recv_count, DataType type, ReduceOp op,
                     cudaStream_t stream = nullptr);

  // Synchronize waits until all work enqueued on `stream` (nullptr: the communicator's own) is
  // done. Throws IoError when a peer failed, TimeoutError when the timeout passed; both abort.
  void Synchronize(cudaStream_t stream = nullptr);

  // Abort tears the communicator down at once (ncclCommAbort), releasing this rank from any
  // collective that waits for a failed peer. Later calls throw Error. Safe to call twice.
  void Abort() noexcept;

  bool aborted() const { return comm_ == nullptr; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  const std::string& name() const { return name_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // stream returns the communicator's own stream (non-blocking with respect to the legacy stream).
  cudaStream_t stream() const { return stream_.get(); }

 private:
  struct StreamDeleter {
    void operator()(cudaStream_t stream) const noexcept;
  };
  using StreamHandle = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDeleter>;

  // Check turns the result of an NCCL call on this communicator into success, a wait (for
  // ncclInProgress) or an exception; `what` names the call for the message.
  void Check(int result, const std::string& what);
  // WaitReady polls ncclCommGetAsyncError until the communicator is no longer in progress.
  void WaitReady(const std::string& what);
  // Fail aborts when `result` means the communicator is broken, and throws.
  [[noreturn]] void Fail(int result, const std::string& what);
  [[noreturn]] void FailTimeout(const std::string& what);
  ncclComm* Live(const char* operation) const;
  cudaStream_t Resolve(cudaStream_t stream) const { return stream ? stream : stream_.get(); }
  void CheckRoot(int root, const char* operation) const;

  ncclComm* comm_;
  int rank_;
  int size_;
  int device_;
  std::string name_;
  std::chrono::milliseconds timeout_;
  StreamHandle stream_;
};

}  // namespace trainrun::collectives::nccl
