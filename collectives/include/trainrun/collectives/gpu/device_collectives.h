// DeviceCollectives: a communicator's collectives on GPU buffers, by one of two paths chosen once
// per communicator (at its first GPU collective, by an exchange among its ranks):
//
//  - NCCL, when every rank has a GPU of its own (no two ranks of a host on one device) and NCCL
//    loads on every rank (loader.h). Each collective is enqueued on the communicator's own stream
//    after an event recorded on the buffer's stream at the call; the caller's stream then waits on
//    the collective's completion event (Wait), as PyTorch's NCCL process group does. In-place
//    allreduces queued together run as one NCCL allreduce of a device fusion buffer, as many as
//    every rank has queued alike (RunFused; NcclAgree exchanges the number and a hash of their
//    element counts over the host communicator).
//  - host-staged otherwise (no NCCL, ranks sharing a GPU, or TRAINRUN_GPU_PATH=staged): the
//    buffers are copied, in the same stream order, into pinned host buffers that are reused from
//    call to call (an allreduce's: one staging buffer per communicator, grown to the largest;
//    other collectives': PinnedPool), the host Communicator's collective runs on them, and the
//    results are copied back (on a second stream where the device has two copy engines); the
//    caller's stream waits on the copy back. An allreduce over shared memory larger than the
//    transport's one-step size skips the staging buffer: the transport copies each chunk from the
//    device straight into its own memory and the results straight back
//    (Communicator::TryAllreduceCopies, all on the stream of the copies down), so the CPU moves no
//    more bytes than for a host buffer. Elsewhere (TCP), an allreduce of at least 2 MiB goes in
//    chunks (DeviceOptions::max_chunks of at least min_chunk_bytes), so the copy down of chunk i +
//    1 overlaps the host reduction of chunk i and the copy back of chunk i the reduction of i + 1.
//    In-place allreduces queued one after another run as one staged collective (RunFused:
//    gathered into a fusion buffer on the device, one copy down, one host allreduce, one copy
//    back, scattered on the device).
//
// A collective has three steps on two threads, so that the caller (Python) goes on while it runs:
//
//   auto work = gpu.Start(spec);           // caller: records where the buffers are ready
//   thread.Submit([work] { work->Run(); });  // the communication thread, in call order
//   ...
//   work->Done();                          // caller: a poll, true once the results are in place
//   work->Wait();                          // caller, after the thread ran it: waits for the
//                                          // completion on the CPU, orders the stream after it
//
// Every GPU call goes through a GpuRuntime (runtime.h), so the tests run all of this over a CPU
// fake. A DeviceCollectives is used by one caller thread and one communication thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "trainrun/collectives/communicator.h"
#include "trainrun/collectives/gpu/runtime.h"
#include "trainrun/collectives/types.h"

namespace trainrun::collectives::gpu {

enum class Path { kUndecided, kNccl, kStaged };

// PathName: "nccl", "staged" or "undecided".
const char* PathName(Path path);

// PinnedPool hands out pinned host buffers by size class (powers of two from 64 KiB) and keeps
// those given back for the next call of that class, so a training loop allocates during its first
// steps only. Thread-safe.
class PinnedPool {
 public:
  explicit PinnedPool(GpuRuntime& runtime) : runtime_(runtime) {}
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // Acquire returns a buffer of at least `bytes` bytes.
  void* Acquire(size_t bytes);
  // Release gives back a buffer Acquire returned.
  void Release(void* buffer);
  // allocations: how many buffers the pool has allocated from the runtime so far.
  size_t allocations() const;

 private:
  static int SizeClass(size_t bytes);
  GpuRuntime& runtime_;
  mutable std::mutex mutex_;
  std::vector<std::vector<void*>> free_;  // by size class
  std::vector<std::pair<void*, int>> in_use_;
  size_t allocations_ = 0;
};

// The kinds of collective a GPU buffer takes part in.
enum class DeviceOp {
  kAllreduce,
  kGroupedAllreduce,
  kBroadcast,
  kAllgatherv,
  kReduceScatter,
  kAlltoallv
};

// DeviceCall describes one collective on device buffers. Counts are elements of `type`.
struct DeviceCall {
  DeviceOp op = DeviceOp::kAllreduce;
  // kAllreduce, kReduceScatter: inputs[0] -> outputs[0] (the same pointer: in place).
  // kGroupedAllreduce: inputs[i], in place (outputs empty). kBroadcast: inputs[0], in place.
  // kAllgatherv: inputs[0] (counts[rank] elements) -> outputs[0] (sum of counts).
  // kAlltoallv: inputs[0] (sum of send_counts) -> outputs[0] (sum of counts).
  std::vector<void*> inputs;
  std::vector<size_t> input_counts;
  std::vector<void*> outputs;
  size_t output_count = 0;
  std::vector<size_t> counts;       // kAllgatherv: per rank; kAlltoallv: received per rank
  std::vector<size_t> send_counts;  // kAlltoallv
  DataType type = DataType::kFloat32;
  ReduceOp reduce = ReduceOp::kSum;
  int root = 0;
  // kAllreduce, kGroupedAllreduce: each rank's input is multiplied by `prescale` before the
  // reduction and the result by `postscale` after (Horovod's prescale_factor and
  // postscale_factor), for arrays that cannot scale themselves: over NCCL a float sum or average
  // as one ncclRedOpCreatePreMulSum op (a group's allreduces all use the one op), else staged and
  // scaled in pinned host memory (integers through float64, truncated, as Python's).
  double prescale = 1.0;
  double postscale = 1.0;
  CallCheck check;
  // The device the buffers are on (-1: ask the runtime), and the stream their producers and
  // consumers are ordered on (has_stream false: the data is ready now, nothing to order after).
  int device = -1;
  bool has_stream = false;
  Stream stream = nullptr;
};

class DeviceCollectives;
struct NcclApi;  // src/gpu/nccl_api.h

// DeviceOptions tunes a DeviceCollectives.
struct DeviceOptions {
  // "auto", "nccl" or "staged" (env::kGpuPath when empty).
  std::string path;
  // Say the path once on stderr (env::kVerbose when unset).
  int verbose = -1;
  // Bound on Wait (zero: TRAINRUN_TIMEOUT).
  std::chrono::milliseconds timeout{0};
  // The staged allreduce's pipeline: a buffer is cut into as many chunks of at least
  // `min_chunk_bytes` as fit, at most `max_chunks` (1: no pipeline). Every rank must use the same
  // (the chunks are separate host allreduces). docs/performance.md has the measurements.
  size_t min_chunk_bytes = size_t{1} << 20;
  int max_chunks = 4;
  // An allreduce the communicator takes through copies (Communicator::TryAllreduceCopies: shared
  // memory, above its one-step size) skips the staging buffer and the pipeline above: each piece
  // goes from the device straight into the transport's memory and back. false: always staged
  // (every rank must use the same).
  bool copy_through_transport = true;
  // The most bytes RunFused gathers (the communication thread's fusion cap; 0: the thread fuses
  // nothing). The staging and fusion buffers are made at least that large at once, so a loop
  // whose fused groups vary from step to step (they depend on timing) allocates at its start
  // only. On the NCCL path, fusion runs only where every rank's cap is above 0 (agreed with the
  // path): each NCCL allreduce then costs a host exchange first (RunFused).
  size_t fusion_bytes = 0;
  // For C++ tests only: the NCCL to use instead of libnccl (tests/gpu/fake_nccl.h), whose
  // presence also lets the NCCL path serve the runtime's devices although RealDevices() is false
  // (the tests' fake). Neither the Runtime nor the Python binding sets it, so a job never runs
  // the fake.
  const NcclApi* nccl_api_for_tests = nullptr;
};

// DeviceWork: one collective in flight (see the file comment for its three steps).
class DeviceWork {
 public:
  ~DeviceWork();
  DeviceWork(const DeviceWork&) = delete;
  DeviceWork& operator=(const DeviceWork&) = delete;

  // Run performs the collective; on the communication thread, in call order. Throws what the
  // collective throws (the caller's Wait on the thread's handle rethrows it).
  void Run();
  // Done: the collective's results are in the output buffers (its copy back, or NCCL's work, has
  // completed on the GPU); false before Run has returned. Does not block.
  bool Done();
  // Wait waits on the CPU until the collective's results are in the output buffers, then makes the
  // caller's stream wait for them. Throws TimeoutError (and aborts NCCL) past the timeout, IoError
  // when NCCL reports a peer's failure. Call it after Run has returned; safe to call twice.
  void Wait();
  // path: the path this collective took (kUndecided before Run).
  Path path() const { return path_; }
  // owner: the DeviceCollectives that started it.
  const DeviceCollectives& owner() const { return owner_; }
  // fusable: an in-place allreduce without scaling, which RunFused may fuse with its neighbours.
  bool fusable() const;

  // RunFused runs `works` (in-place allreduces queued one after another on one DeviceCollectives,
  // of one element type and op, buffers apart; each Start-ed, none Run yet) on the communication
  // thread, as many together as every rank has queued, and returns how many ran, from the first
  // (at least one); the others stay to be run later. What those that ran failed with goes to
  // `*error`. On the staged path they go as one staged collective (Communicator::AllreduceReady
  // agrees on how many); on the NCCL path a host allreduce of three words agrees on how many
  // (NcclAgree: as many as every rank has queued alike, count by count; a second exchange where
  // the ranks' queues differ), and they go as one NCCL allreduce of a device fusion buffer.
  static size_t RunFused(const std::vector<DeviceWork*>& works, std::exception_ptr* error);

 private:
  friend class DeviceCollectives;
  DeviceWork(DeviceCollectives& owner, DeviceCall call);

  DeviceCollectives& owner_;
  DeviceCall call_;
  Event ready_ = nullptr;  // recorded on the caller's stream at Start
  Event done_ = nullptr;   // recorded after the last copy or NCCL call
  std::vector<void*> pinned_;
  Path path_ = Path::kUndecided;
  std::atomic<bool> ran_{false};  // Done may ask from the caller's thread
  bool waited_ = false;
};

class DeviceCollectives {
 public:
  // DeviceCollectives serves `comm` (which outlives it) through `runtime`. Nothing is exchanged
  // until the first collective runs.
  DeviceCollectives(Communicator& comm, GpuRuntime& runtime, DeviceOptions options = {});
  ~DeviceCollectives();
  DeviceCollectives(const DeviceCollectives&) = delete;
  DeviceCollectives& operator=(const DeviceCollectives&) = delete;

  // Start checks `call` and records where its buffers are ready on their stream; the caller then
  // has the returned work Run on the communication thread. Throws InvalidArgumentError for a
  // buffer that is not on a GPU, or on another GPU than this communicator's earlier ones.
  std::shared_ptr<DeviceWork> Start(DeviceCall call);

  // path: the path chosen (kUndecided before the first collective ran); why: the reason, a phrase.
  Path path() const { return path_; }
  const std::string& why() const { return why_; }
  int device() const { return device_; }
  PinnedPool& pinned() { return pinned_; }
  GpuRuntime& runtime() { return runtime_; }
  // fused: how many collectives ran fused with others (RunFused), for tests, the timeline and
  // trainrun.gpu_info(); read from any thread.
  size_t fused() const { return fused_.load(std::memory_order_relaxed); }

 private:
  friend class DeviceWork;
  struct Nccl;
  class DeviceCopies;

  // Decide runs the exchange that picks the path (communication thread, first collective).
  void Decide(int device);
  void RunStaged(DeviceWork& work);
  // StagedAllreduce: the pipelined allreduce of one buffer (see the file comment).
  void StagedAllreduce(DeviceWork& work);
  // StagedFused: RunFused's staged case (works.size() > 1).
  size_t StagedFused(const std::vector<DeviceWork*>& works, std::exception_ptr* error);
  void RunNccl(DeviceWork& work);
  // NcclCan: whether NCCL can run `call` itself (types and ops it has); else it is staged.
  bool NcclCan(const DeviceCall& call) const;
  // NcclAgrees: an allreduce that runs over NCCL exchanges with NcclAgree first (fusion is on
  // on every rank), whether fused or alone, so that every rank makes the same host exchanges.
  bool NcclAgrees(const DeviceCall& call) const;
  // NcclAgree returns how many of the first `offered` (at least 1) of `works`, this rank's queue
  // (one type and op), run fused: the longest prefix of them that every rank offers alike (the
  // same element count each), so that no two ranks post NCCL calls of different counts. Where
  // every rank offers the same, one host allreduce (min) of three words; otherwise a second, of
  // two words per allreduce the fewest offered. Named as the first (so ranks whose next
  // collectives have other names negotiate their order, as on the staged path); where the first
  // differs (element count, type or op), a MismatchError on every rank naming it.
  size_t NcclAgree(const std::vector<DeviceWork*>& works, size_t offered);
  // NcclFused: RunFused's NCCL case, for the first k of `works` (k > 1).
  void NcclFused(const std::vector<DeviceWork*>& works, size_t k);
  void WaitDone(DeviceWork& work);
  // WaitEvent waits on the CPU for `event` (of `work`), within the timeout.
  void WaitEvent(DeviceWork& work, Event event);
  // WaitCopied waits on the CPU for a staging copy's `event` (local work: no peer to watch).
  void WaitCopied(Event event);
  Event TakeEvent();
  void GiveEvent(Event event);
  // DownStream: the stream of the copies into pinned memory, ordered after `works`' buffers are
  // ready and after the previous staged collective's copies back (which may have written them).
  Stream DownStream(const std::vector<DeviceWork*>& works);
  // UpStream: the stream of the copies back. Finish records `done` of each work there, and the
  // point the next collective's copies down wait for.
  Stream UpStream();
  void FinishStaged(const std::vector<DeviceWork*>& works);
  // FusionBuffer: the device buffer RunFused gathers into, of at least `bytes` bytes.
  char* FusionBuffer(size_t bytes);
  // FusionOffsets: where each of the first `k` works' buffers (in-place allreduces of one type)
  // starts in a fusion buffer, in bytes, then where the last ends (k + 1 values).
  static std::vector<size_t> FusionOffsets(const std::vector<DeviceWork*>& works, size_t k);
  // GatherFused enqueues on `stream` the copies of the works' buffers into `fusion` at `offsets`
  // (as many works as offsets has ends); ScatterFused the copies back out of it.
  void GatherFused(const std::vector<DeviceWork*>& works, const std::vector<size_t>& offsets,
                   char* fusion, Stream stream);
  void ScatterFused(const std::vector<DeviceWork*>& works, const std::vector<size_t>& offsets,
                    const char* fusion, Stream stream);
  // Staging: the pinned buffer allreduces are staged in, of at least `bytes` bytes. One suffices:
  // collectives run one after another, and a copy down waits for the copies back before it
  // (DownStream), so the next never overwrites what is still being copied back.
  char* Staging(size_t bytes);
  // Grow replaces `*buffer` (`*capacity` bytes) with one of at least `bytes` (and of the fusion
  // cap), once the copies back that may read it are done (up_tail_, and the NCCL stream's last
  // fused batch); `allocate` and `free` are the runtime's.
  template <typename Allocate, typename Free>
  char* Grow(char** buffer, size_t* capacity, size_t bytes, Allocate allocate, Free free);

  Communicator& comm_;
  GpuRuntime& runtime_;
  DeviceOptions options_;
  std::chrono::milliseconds timeout_;
  PinnedPool pinned_;
  Path path_ = Path::kUndecided;
  std::string why_;
  int device_ = -1;
  Stream stage_stream_ = nullptr;  // copies down (and the whole of non-allreduce collectives)
  Stream up_stream_ = nullptr;     // copies back
  Event up_tail_ = nullptr;        // recorded after the last copies back
  char* fusion_ = nullptr;         // RunFused's device buffer
  size_t fusion_bytes_ = 0;
  char* staging_ = nullptr;  // pinned
  size_t staging_bytes_ = 0;
  std::atomic<size_t> fused_{0};
  bool nccl_fuse_ = false;  // NCCL allreduces agree with NcclAgree (every rank fuses)
  // Host memory the transport copies to and from (BufferCopies::UseHostMemory), and whether the
  // runtime page-locked it; undone at the end (the communicator, which maps it, outlives this).
  std::vector<std::pair<void*, bool>> registered_;
  std::unique_ptr<Nccl> nccl_;
  std::mutex events_mutex_;
  std::vector<Event> events_;
};

}  // namespace trainrun::collectives::gpu
