// Runtime: a worker process's hold on its job, the same for every language. It joins the job
// (the communicator choice: trainrun's rendezvous, a shared directory, or a job of one), owns the
// world communicator, the process sets and the communication thread that runs collectives in call
// order (comm_thread.h), and, in an elastic job (trainrun --min-np), the worker's side of the
// membership protocol: after a rank is lost, Init() joins the job's next generation with a new rank
// and size. The Python package binds one Runtime per process (python/src/module.cc); a C++ worker
// makes its own:
//
//   trainrun::collectives::Runtime runtime;
//   runtime.Init();                          // joins the job
//   while (true) {
//     try {
//       Train(runtime.world());              // collectives throw IoError when a rank is lost
//       break;
//     } catch (const trainrun::IoError&) {   // (TimeoutError too)
//       RestoreLastCommit();
//       runtime.Shutdown();
//       runtime.Init();                      // elastic: the survivors' next generation
//     }
//   }
//
// (examples/collectives/elastic_worker.cc is that loop in full.) Buffers are handed to the
// runtime as a TensorRef: where the elements are (host memory, or a GPU and its stream), so that
// one call path serves every kind of memory. GPU buffers go to the communicator's
// gpu::DeviceCollectives (gpu/device_collectives.h: NCCL, or staged through pinned host memory),
// over CUDA's runtime opened at run time (gpu/runtime.h); WaitFor of a GPU collective also waits
// for its results on the GPU and orders the buffer's stream after them, and Done (a poll) is true
// only once they are there. In-place GPU allreduces fuse with each other as host ones do.
//
// A Runtime is driven by one thread at a time (the caller's), besides its communication thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trainrun/collectives/comm_thread.h"
#include "trainrun/collectives/communicator.h"
#include "trainrun/collectives/gpu/device_collectives.h"
#include "trainrun/collectives/gpu/runtime.h"
#include "trainrun/collectives/types.h"

namespace trainrun::collectives {

class ElasticSession;

// DeviceKind says where a buffer's elements live.
enum class DeviceKind : int { kHost = 0, kCuda = 1 };

// TensorRef describes a buffer a caller hands the runtime: `count` elements of `type` at `data`,
// on `device` (kHost: `device_index` and `stream` unused; kCuda: the GPU's index and the stream,
// a cudaStream_t (0: the legacy default stream): the caller's work on it is ordered before the
// collective, and its later work after the collective's results).
struct TensorRef {
  void* data = nullptr;
  size_t count = 0;
  DataType type = DataType::kFloat32;
  DeviceKind device = DeviceKind::kHost;
  int device_index = -1;
  void* stream = nullptr;
};

class Runtime {
 public:
  using Handle = CommThread::Handle;

  // Runtime joins nothing yet (Init does).
  Runtime();
  // ~Runtime finishes the submitted collectives, then closes the connections.
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Init joins the job on the first call, and starts the communication thread; a no-op while
  // initialized. After Shutdown, Init takes part again with the same rank over the same
  // connections, except in an elastic job (TRAINRUN_ELASTIC=1) when a collective failed
  // (NoteFailure, or the world communicator is broken) or the job has a newer generation: then it
  // closes the old connections and joins the next generation (new rank and size). Blocks until
  // connected. Throws Error when the environment is wrong or no generation has this rank (the
  // elastic job is over for it), IoError or TimeoutError when a peer is lost meanwhile (call Init
  // again: the job's next generation comes).
  void Init();
  // Shutdown finishes the submitted collectives, stops the communication thread and forgets the
  // process sets; the connections stay open for a later Init. A no-op when not initialized.
  void Shutdown();
  // initialized: Init has run (and no Shutdown since), in this process (not a fork's child).
  bool initialized() const { return thread_ != nullptr && !forked_; }

  // elastic: this worker is one of an elastic job.
  bool elastic() const { return elastic_ != nullptr; }
  // generation is this worker's generation of an elastic job (0 otherwise, or before a change).
  int generation() const;
  // slot is this worker's place at the start of an elastic job (its rank in generation 0, or the
  // slot trainrun started it for when the job grew), which no membership change alters; the
  // world rank when not elastic. Needs Init.
  int slot();
  // LatestGeneration is the elastic job's newest generation, asked of the rendezvous (0 when not
  // elastic). Throws IoError when it cannot be asked.
  int LatestGeneration();
  // LatestGenerationAdds: the job's newest generation has a rank that this worker's generation
  // lacks (the job grew; its newcomers need the state). False when not elastic.
  bool LatestGenerationAdds();
  // NoteFailure records that a collective failed with IoError or TimeoutError, so that the next
  // Init of an elastic worker joins the next generation. WaitFor and TryCollect note their own.
  void NoteFailure() { failed_ = true; }

  // AbandonAfterFork is for the child of a fork(): the communication thread does not exist there,
  // so it must never be joined or destroyed; the runtime leaks it (the parent still owns it) and
  // every later call throws Error.
  void AbandonAfterFork();

  // thread is the communication thread. Throws Error when not initialized or in a fork's child.
  CommThread& thread();
  // world is the communicator of every rank (process set 0); Set(id) that of process set `id`.
  // A caller may run their collectives itself (as examples/collectives/elastic_worker.cc does)
  // while nothing it submitted to the runtime is still running.
  // Throw Error when not initialized, InvalidArgumentError for a set that does not exist or that
  // this rank is not a member of.
  Communicator& world() { return Set(0); }
  Communicator& Set(int id);
  // info is this rank's place in the job (or its generation).
  const RankInfo& info() { return thread().comm().info(); }

  // AddProcessSet registers the ranks `ranks` (ascending) as the next process set and returns its
  // id; every rank of the job calls it alike. No communication.
  int AddProcessSet(const std::vector<int>& ranks);
  // RemoveProcessSet removes process set `id` once the collectives queued before it have run.
  void RemoveProcessSet(int id);

  // The collectives, queued on the communication thread in call order; each returns a handle for
  // WaitFor, TryCollect and Done. `set` is a process set id (0: every rank); `check` joins the
  // agreement check (communicator.h). Buffers stay alive until the collective has finished.
  // A buffer on a device this build cannot reduce throws InvalidArgumentError at the call.
  // Allreduce in place (input.data == output.data) may be fused with its neighbours (comm_thread.h;
  // `prompt`: run without waiting for more to fuse).
  // `prescale` and `postscale` (GPU buffers only: host ones the caller scales) multiply each
  // rank's input before the reduction and the result after (gpu::DeviceCall).
  Handle Allreduce(const TensorRef& input, const TensorRef& output, ReduceOp op, int set,
                   CallCheck check, bool prompt = false, double prescale = 1.0,
                   double postscale = 1.0);
  // GroupedAllreduce: one allreduce of `buffers` (each of element type `type`), in place.
  // `match`: the name it is matched (and refused as a duplicate) by, when not check.name (a
  // grouped call's first part goes by the call's name, its messages by the part's).
  // `prescale` and `postscale` scale every buffer as Allreduce's do (GPU buffers only).
  Handle GroupedAllreduce(const std::vector<TensorRef>& buffers, DataType type, ReduceOp op,
                          int set, CallCheck check, const std::string* match = nullptr,
                          double prescale = 1.0, double postscale = 1.0);
  Handle Broadcast(const TensorRef& data, int root, int set, CallCheck check);
  // Allgatherv: `counts[r]` elements from rank r; input.count is this rank's.
  Handle Allgatherv(const TensorRef& input, const TensorRef& output, std::vector<size_t> counts,
                    int set, CallCheck check);
  Handle ReduceScatter(const TensorRef& input, const TensorRef& output, ReduceOp op, int set,
                       CallCheck check);
  Handle Alltoallv(const TensorRef& input, std::vector<size_t> send_counts, const TensorRef& output,
                   std::vector<size_t> recv_counts, int set, CallCheck check);
  Handle Barrier(int set);
  // Refuse queues Communicator::Refuse for a `collective` named check.name that this rank refused
  // for its arguments, matched by `match` when given (a grouped allreduce's call name), else by
  // check.name, so the ranks that made the call raise too.
  Handle Refuse(int set, std::string collective, CallCheck check,
                const std::string* match = nullptr);
  // Submit queues `job` on process set `set`'s communicator (checked now, so a bad set fails at
  // the call).
  Handle Submit(int set, std::function<void(Communicator&)> job);
  // SubmitNamed is Submit of a collective named `name` ("": unnamed), matched by that name
  // across ranks (comm_thread.h). Throws InvalidArgumentError when one of that name is pending.
  Handle SubmitNamed(int set, const std::string& name, std::function<void(Communicator&)> job);

  // WaitFor waits up to `timeout` for `handle`; false while it runs. Once it has finished, forgets
  // the handle and rethrows the collective's exception (noting an IoError or TimeoutError).
  bool WaitFor(Handle handle, std::chrono::milliseconds timeout);
  // TryCollect is WaitFor without waiting, and without ending the thread's wait for more
  // allreduces to fuse.
  bool TryCollect(Handle handle);
  // Done: the collective `handle` has finished (successfully or not); for GPU buffers, once its
  // results are in place on the GPU (the copy back or NCCL's work complete), as Horovod's poll().
  bool Done(Handle handle);

  // UseGpuRuntime makes `runtime` the GPU runtime of later GPU collectives instead of CUDA's (the
  // tests' CPU fake, tests/gpu/fake_gpu_runtime.h, which no shipped binary contains). Call it
  // before the first GPU collective.
  void UseGpuRuntime(std::shared_ptr<gpu::GpuRuntime> runtime);
  // Gpu returns the GPU runtime (UseGpuRuntime's, else CUDA's), or throws InvalidArgumentError
  // saying why there is none.
  gpu::GpuRuntime& Gpu();
  // GpuPath: the path process set `set`'s GPU collectives take (kUndecided before its first one
  // ran), and why, a phrase.
  gpu::Path GpuPath(int set, std::string* why = nullptr);
  // GpuFused: how many of process set `set`'s GPU allreduces ran fused with others so far
  // (gpu::DeviceCollectives::fused).
  size_t GpuFused(int set);

 private:
  // HostBuffer returns `ref`'s host address, checked (null with a count, a device buffer).
  static void* HostBuffer(const TensorRef& ref);
  // Device: `comm`'s DeviceCollectives, made at its first GPU collective.
  gpu::DeviceCollectives& Device(Communicator& comm);
  // SubmitDevice starts `call` on process set `set`'s DeviceCollectives and queues its Run on the
  // communication thread.
  Handle SubmitDevice(int set, gpu::DeviceCall call);
  // FinishDevice waits for the GPU half of `handle` (if it is a GPU collective) once the thread
  // is through with it, noting an IoError or TimeoutError.
  void FinishDevice(Handle handle);
  // ForgetDevice drops the DeviceCollectives of `comm` and the works still on it.
  void ForgetDevice(const Communicator* comm);

  std::unique_ptr<Communicator> world_;
  std::map<int, std::unique_ptr<Communicator>> sets_;  // null: this rank is not a member
  int next_set_ = 1;
  std::unique_ptr<CommThread> thread_;
  bool forked_ = false;
  std::unique_ptr<ElasticSession> elastic_;
  bool failed_ = false;
  std::shared_ptr<gpu::GpuRuntime> gpu_runtime_;  // set: UseGpuRuntime's, else CUDA's once used
  std::map<const Communicator*, std::unique_ptr<gpu::DeviceCollectives>> device_;
  std::map<Handle, std::shared_ptr<gpu::DeviceWork>> device_work_;
};

}  // namespace trainrun::collectives
