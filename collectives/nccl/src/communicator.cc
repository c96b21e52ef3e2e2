#include "trainrun/collectives/nccl/communicator.h"

#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "library.h"
#include "trainrun/collectives/errors.h"
#include "trainrun/collectives/nccl/check.h"
#include "trainrun/collectives/nccl/unique_id_exchange.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::collectives::nccl {
namespace {

using Clock = std::chrono::steady_clock;
using internal::Cuda;
using internal::Nccl;
using ::trainrun::internal::MakeMessage;

ncclDataType_t ToNccl(DataType type) {
  switch (type) {
    case DataType::kInt8:
      return ncclInt8;
    case DataType::kUint8:
      return ncclUint8;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kBfloat16:
      return ncclBfloat16;
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
  }
  throw InvalidArgumentError(MakeMessage("unknown DataType ", static_cast<int>(type)));
}

ncclRedOp_t ToNccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kProd:
      return ncclProd;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kAvg:
      return ncclAvg;
  }
  throw InvalidArgumentError(MakeMessage("unknown ReduceOp ", static_cast<int>(op)));
}

// Results after which NCCL's documentation says the communicator must be aborted; a rejected
// argument leaves it usable.
bool BreaksCommunicator(ncclResult_t result) {
  return result != ncclInvalidArgument && result != ncclInvalidUsage;
}

// Polling backs off from 10 us to 1 ms: short collectives return fast, long waits cost little CPU.
class Backoff {
 public:
  void Sleep() {
    std::this_thread::sleep_for(delay_);
    delay_ = std::min(delay_ * 2, std::chrono::microseconds(1000));
  }

 private:
  std::chrono::microseconds delay_{10};
};

// DeviceGuard makes `device` current for one call and restores the caller's device afterwards,
// so a communicator used from a thread that works on another GPU still launches on its own.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    TRAINRUN_CUDA_CHECK(Cuda().get_device(&previous_), "reading the current CUDA device");
    if (previous_ != device) {
      TRAINRUN_CUDA_CHECK(Cuda().set_device(device), "selecting CUDA device ", device);
    }
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() { Cuda().set_device(previous_); }

 private:
  int previous_ = 0;
};

std::chrono::milliseconds ResolveTimeout(std::chrono::milliseconds timeout) {
  if (timeout.count() > 0) return timeout;
  return std::chrono::seconds(env::kTimeoutSeconds.Get());
}

std::string MakeUniqueIdBlob(const std::string& name, int rank) {
  ncclUniqueId id;
  TRAINRUN_NCCL_CHECK(Nccl().get_unique_id(&id), "rank ", rank, " creating the unique ID of NCCL ",
                      "communicator '", name, "'");
  return std::string(id.internal, sizeof(id.internal));
}

}  // namespace

void Communicator::StreamDeleter::operator()(cudaStream_t stream) const noexcept {
  Cuda().stream_destroy(stream);
}

std::unique_ptr<Communicator> Communicator::Create(rendezvous::Store& store, int rank, int size,
                                                   int device, const CommunicatorOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw InvalidArgumentError(MakeMessage("NCCL communicator '", options.name, "': rank ", rank,
                                           " is outside a communicator of size ", size,
                                           "; check TRAINRUN_RANK and TRAINRUN_SIZE"));
  }
  if (device < 0) {
    throw InvalidArgumentError(MakeMessage("NCCL communicator '", options.name, "': rank ", rank,
                                           " was given CUDA device ", device));
  }
  const std::chrono::milliseconds timeout = ResolveTimeout(options.timeout);
  TRAINRUN_CUDA_CHECK(Cuda().set_device(device), "rank ", rank, " could not use CUDA device ",
                      device, " (check the NVIDIA driver and CUDA_VISIBLE_DEVICES)");

  const std::string blob = ExchangeUniqueId(
      store, options.name, rank, /*root=*/0, [&] { return MakeUniqueIdBlob(options.name, rank); },
      timeout);
  ncclUniqueId id;
  if (blob.size() != sizeof(id.internal)) {
    throw InvalidArgumentError(MakeMessage("rank ", rank, " received an NCCL unique ID of ",
                                           blob.size(), " bytes for communicator '", options.name,
                                           "', expected ", sizeof(id.internal),
                                           "; are all ranks running the same trainrun and NCCL?"));
  }
  std::memcpy(id.internal, blob.data(), sizeof(id.internal));

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = options.name.c_str();
  ncclComm_t comm = nullptr;
  const ncclResult_t started = Nccl().comm_init_rank_config(&comm, size, id, rank, &config);
  const std::string what = MakeMessage("joining NCCL communicator '", options.name, "' as rank ",
                                       rank, " of ", size, " on CUDA device ", device);
  if (comm == nullptr) {
    TRAINRUN_NCCL_CHECK(started, what);
    TRAINRUN_ENFORCE(comm != nullptr, "ncclCommInitRankConfig succeeded without a communicator");
  }
  // From here the Communicator owns `comm`: a failure below aborts it.
  auto communicator =
      std::make_unique<Communicator>(Passkey{}, comm, rank, size, device, options.name, timeout);
  communicator->Check(started, what);

  cudaStream_t stream = nullptr;
  TRAINRUN_CUDA_CHECK(Cuda().stream_create_with_flags(&stream, cudaStreamNonBlocking), "rank ",
                      rank, " creating the stream of NCCL communicator '", options.name, "'");
  communicator->stream_.reset(stream);
  return communicator;
}

std::unique_ptr<Communicator> Communicator::FromSession(const rendezvous::WorkerSession& session,
                                                        const CommunicatorOptions& options) {
  const rendezvous::Assignment& me = session.assignment;
  TRAINRUN_ENFORCE(session.store != nullptr, "a rendezvous session without a store");
  int devices = 0;
  TRAINRUN_CUDA_CHECK(Cuda().get_device_count(&devices), "rank ", me.rank,
                      " looking for its GPU; check the NVIDIA driver and CUDA_VISIBLE_DEVICES");
  return Create(*session.store, me.rank, me.size, DeviceForLocalRank(me.local_rank, devices),
                options);
}

std::unique_ptr<Communicator> Communicator::FromEnvironment(const CommunicatorOptions& options) {
  const std::chrono::milliseconds timeout = ResolveTimeout(options.timeout);
  absl::StatusOr<rendezvous::WorkerSession> session = rendezvous::JoinFromEnvironment(timeout);
  if (!session.ok()) {
    const std::string message =
        MakeMessage("could not join the job's rendezvous for NCCL communicator '", options.name,
                    "': ", session.status().message());
    if (absl::IsFailedPrecondition(session.status()) || absl::IsInvalidArgument(session.status())) {
      throw InvalidArgumentError(message + " (start the worker with trainrun)");
    }
    if (absl::IsDeadlineExceeded(session.status())) throw TimeoutError(message);
    throw IoError(message);
  }
  return FromSession(*session, options);
}

Communicator::Communicator(Passkey, ncclComm* comm, int rank, int size, int device,
                           std::string name, std::chrono::milliseconds timeout)
    : comm_(comm),
      rank_(rank),
      size_(size),
      device_(device),
      name_(std::move(name)),
      timeout_(timeout) {}

Communicator::~Communicator() {
  if (comm_ == nullptr) return;
  try {
    DeviceGuard guard(device_);
    // Finalize flushes outstanding work and lets peers leave cleanly; it is non-blocking here, so
    // a dead peer costs at most the timeout before the abort below.
    Check(Nccl().comm_finalize(comm_), "finalizing");
    Nccl().comm_destroy(comm_);
    comm_ = nullptr;
  } catch (const Error&) {
    Abort();
  }
}

void Communicator::Abort() noexcept {
  if (comm_ == nullptr) return;
  Nccl().comm_abort(comm_);
  comm_ = nullptr;
}

ncclComm* Communicator::Live(const char* operation) const {
  if (comm_ == nullptr) {
    throw Error(MakeMessage("rank ", rank_, ": ", operation, " on NCCL communicator '", name_,
                            "', which was aborted after an earlier failure; create a new one"));
  }
  return comm_;
}

void Communicator::CheckRoot(int root, const char* operation) const {
  if (root < 0 || root >= size_) {
    throw InvalidArgumentError(MakeMessage("rank ", rank_, ": ", operation, " root ", root,
                                           " is outside NCCL communicator '", name_, "' of size ",
                                           size_));
  }
}

void Communicator::Check(int result, const std::string& what) {
  const auto status = static_cast<ncclResult_t>(result);
  if (status == ncclSuccess) return;
  if (status == ncclInProgress) {
    WaitReady(what);
    return;
  }
  Fail(status, what);
}

void Communicator::WaitReady(const std::string& what) {
  const auto deadline = Clock::now() + timeout_;
  Backoff backoff;
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t queried = Nccl().comm_get_async_error(comm_, &state);
    if (queried != ncclSuccess) Fail(queried, what);
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) Fail(state, what);
    if (Clock::now() >= deadline) FailTimeout(what);
    backoff.Sleep();
  }
}

void Communicator::Fail(int result, const std::string& what) {
  const auto status = static_cast<ncclResult_t>(result);
  const std::string context =
      MakeMessage("rank ", rank_, " ", what, " (NCCL communicator '", name_, "')");
  if (BreaksCommunicator(status)) Abort();
  internal::ThrowNcclError(status, "NCCL", __FILE__, __LINE__,
                           BreaksCommunicator(status)
                               ? context +
                                     "; the communicator was aborted, a peer rank may have "
                                     "failed"
                               : context);
}

void Communicator::FailTimeout(const std::string& what) {
  Abort();
  throw TimeoutError(MakeMessage(
      "rank ", rank_, " ", what, " on NCCL communicator '", name_, "' did not finish within ",
      timeout_.count(), " ms, so the communicator was aborted; a peer rank may have failed or ",
      "never started (raise TRAINRUN_TIMEOUT if the work is just slow)"));
}

void Communicator::Allreduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                             cudaStream_t stream) {
  ncclComm_t comm = Live("allreduce");
  DeviceGuard guard(device_);
  Check(Nccl().all_reduce(send, recv, count, ToNccl(type), ToNccl(op), comm, Resolve(stream)),
        MakeMessage("enqueueing an allreduce (", ReduceOpName(op), ") of ", count, " ",
                    DataTypeName(type)));
}

void Communicator::Broadcast(const void* send, void* recv, size_t count, DataType type, int root,
                             cudaStream_t stream) {
  ncclComm_t comm = Live("broadcast");
  CheckRoot(root, "broadcast");
  DeviceGuard guard(device_);
  Check(Nccl().broadcast(send, recv, count, ToNccl(type), root, comm, Resolve(stream)),
        MakeMessage("enqueueing a broadcast from rank ", root, " of ", count, " ",
                    DataTypeName(type)));
}

void Communicator::Allgather(const void* send, void* recv, size_t send_count, DataType type,
                             cudaStream_t stream) {
  ncclComm_t comm = Live("allgather");
  DeviceGuard guard(device_);
  Check(
      Nccl().all_gather(send, recv, send_count, ToNccl(type), comm, Resolve(stream)),
      MakeMessage("enqueueing an allgather of ", send_count, " ", DataTypeName(type), " per rank"));
}

void Communicator::ReduceScatter(const void* send, void* recv, size_t recv_count, DataType type,
                                 ReduceOp op, cudaStream_t stream) {
  ncclComm_t comm = Live("reduce-scatter");
  DeviceGuard guard(device_);
  Check(Nccl().reduce_scatter(send, recv, recv_count, ToNccl(type), ToNccl(op), comm,
                              Resolve(stream)),
        MakeMessage("enqueueing a reduce-scatter (", ReduceOpName(op), ") of ", recv_count, " ",
                    DataTypeName(type), " per rank"));
}

void Communicator::Synchronize(cudaStream_t stream) {
  Live("synchronize");
  DeviceGuard guard(device_);
  cudaStream_t target = Resolve(stream);
  const auto deadline = Clock::now() + timeout_;
  Backoff backoff;
  // cudaStreamSynchronize would block forever behind a collective whose peer died; polling the
  // stream and NCCL's async error together lets a peer's failure or the deadline end the wait.
  while (true) {
    const cudaError_t done = Cuda().stream_query(target);
    if (done == cudaSuccess) return;
    if (done != cudaErrorNotReady) {
      Abort();
      TRAINRUN_CUDA_CHECK(done, "rank ", rank_, " waiting for NCCL communicator '", name_,
                          "' (the communicator was aborted)");
    }
    ncclResult_t state = ncclSuccess;
    const ncclResult_t queried = Nccl().comm_get_async_error(comm_, &state);
    if (queried != ncclSuccess) Fail(queried, "waiting for its stream");
    if (state != ncclSuccess && state != ncclInProgress) Fail(state, "waiting for its stream");
    if (Clock::now() >= deadline) FailTimeout("waiting for its stream");
    backoff.Sleep();
  }
}

}  // namespace trainrun::collectives::nccl
