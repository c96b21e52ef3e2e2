#include "trainrun/collectives/runtime.h"

#include <algorithm>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <string>
#include <utility>

#include "elastic_session.h"
#include "rank_setting.h"
#include "trainrun/rendezvous/environment.h"
#include "worker_connect.h"

namespace trainrun::collectives {
namespace {

using ::trainrun::internal::MakeMessage;

constexpr char kForkedChild[] =
    "trainrun cannot be used in a process forked after trainrun.init() (e.g. a DataLoader "
    "worker); only the rank's own process takes part in collectives";

const char* DeviceName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kHost:
      return "host";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

// OnGpu: the collective's buffers are on a GPU (every one: a mix is refused by HostBuffer).
bool OnGpu(std::initializer_list<const TensorRef*> refs) {
  for (const TensorRef* ref : refs) {
    if (ref->device == DeviceKind::kHost) return false;
  }
  return true;
}
bool OnGpu(const std::vector<const TensorRef*>& refs) {
  for (const TensorRef* ref : refs) {
    if (ref->device == DeviceKind::kHost) return false;
  }
  return true;
}

// RefuseHostScaling throws for prescale or postscale factors other than 1 given to `what` (a
// collective of host buffers): the caller scales a host buffer itself, where it can.
void RefuseHostScaling(const char* what, double prescale, double postscale) {
  if (prescale == 1.0 && postscale == 1.0) return;
  throw InvalidArgumentError(MakeMessage(
      what, " got prescale or postscale factors; they are for GPU buffers, and the caller ",
      "scales a host buffer itself"));
}

// DeviceCallOf describes a collective of GPU buffers `inputs` -> `outputs` for DeviceCollectives.
gpu::DeviceCall DeviceCallOf(gpu::DeviceOp op, const std::vector<TensorRef>& inputs,
                             const std::vector<TensorRef>& outputs, const CallCheck& check) {
  gpu::DeviceCall call;
  call.op = op;
  call.check = check;
  const TensorRef& first = inputs.front();
  call.type = first.type;
  call.device = first.device_index;
  call.has_stream = true;
  call.stream = first.stream;
  for (const TensorRef& ref : inputs) {
    if (ref.data == nullptr && ref.count != 0) throw InvalidArgumentError("null buffer address");
    call.inputs.push_back(ref.data);
    call.input_counts.push_back(ref.count);
  }
  for (const TensorRef& ref : outputs) {
    if (ref.data == nullptr && ref.count != 0) throw InvalidArgumentError("null buffer address");
    call.outputs.push_back(ref.data);
    call.output_count = ref.count;
  }
  return call;
}

}  // namespace

Runtime::Runtime() = default;

Runtime::~Runtime() {
  thread_.reset();  // Finishes what was submitted while the communicators are still there.
  device_work_.clear();
  device_.clear();
  sets_.clear();
}

void Runtime::Init() {
  if (thread_) return;
  if (forked_) throw Error(kForkedChild);
  if (elastic_ && (!world_ || failed_ || world_->broken() || elastic_->Moved())) {
    device_work_.clear();
    device_.clear();  // NCCL communicators of the old generation go with it
    world_.reset();   // Closes the old data plane first.
    failed_ = false;
    world_ = elastic_->JoinNext();
  } else if (!world_) {
    if (ElasticSession::Requested()) {
      elastic_ = std::make_unique<ElasticSession>();
      world_ = elastic_->Join();
    } else {
      world_ = ConnectWorld();
    }
  }
  thread_ = std::make_unique<CommThread>(
      *world_, static_cast<size_t>(RankSetting(env::kFusionThresholdBytes)));
}

void Runtime::Shutdown() {
  if (!thread_) return;
  thread_.reset();  // Finishes what was submitted.
  device_work_.clear();
  for (auto& [id, set] : sets_) ForgetDevice(set.get());  // the world's stays, as its connections
  sets_.clear();
  next_set_ = 1;
}

int Runtime::generation() const { return elastic_ ? elastic_->generation() : 0; }

int Runtime::slot() { return elastic_ ? elastic_->slot() : world().rank(); }

int Runtime::LatestGeneration() { return elastic_ ? elastic_->LatestGeneration() : 0; }

bool Runtime::LatestGenerationAdds() { return elastic_ && elastic_->LatestAdds(); }

void Runtime::AbandonAfterFork() {
  if (thread_ || world_) {
    (void)thread_.release();
    (void)world_.release();
    for (auto& [id, set] : sets_) (void)set.release();
    for (auto& [comm, device] : device_) (void)device.release();
    for (auto& [handle, work] : device_work_) new std::shared_ptr<gpu::DeviceWork>(work);  // leak
    forked_ = true;
  }
}

CommThread& Runtime::thread() {
  if (forked_) throw Error(kForkedChild);
  if (!thread_) throw Error("trainrun is not initialized; call trainrun.init() first");
  return *thread_;
}

Communicator& Runtime::Set(int id) {
  thread();
  if (id == 0) return *world_;
  auto it = sets_.find(id);
  if (it == sets_.end()) {
    throw InvalidArgumentError(MakeMessage(
        "process set ", id, " does not exist (removed, or made before the last shutdown())"));
  }
  if (!it->second) {
    throw InvalidArgumentError(MakeMessage("rank ", world_->rank(),
                                           " is not a member of process set ", id,
                                           "; only its members may use it"));
  }
  return *it->second;
}

int Runtime::AddProcessSet(const std::vector<int>& ranks) {
  thread();
  const int id = next_set_++;
  std::unique_ptr<Communicator> comm;
  if (std::binary_search(ranks.begin(), ranks.end(), world_->rank())) {
    comm = world_->Subset(ranks, MakeMessage("process set ", id));
  }
  sets_[id] = std::move(comm);
  return id;
}

void Runtime::RemoveProcessSet(int id) {
  CommThread& comm_thread = thread();
  if (id == 0) throw InvalidArgumentError("the global process set (id 0) cannot be removed");
  auto it = sets_.find(id);
  if (it == sets_.end()) {
    throw InvalidArgumentError(MakeMessage("process set ", id, " does not exist"));
  }
  // Operations on the set may still be queued: let them finish before its communicator goes.
  const Handle drained = comm_thread.Submit([](Communicator&) {});
  while (!comm_thread.WaitFor(drained, std::chrono::milliseconds(100))) {
  }
  ForgetDevice(it->second.get());
  sets_.erase(it);
}

void* Runtime::HostBuffer(const TensorRef& ref) {
  if (ref.device != DeviceKind::kHost) {
    throw InvalidArgumentError(MakeMessage("one collective got a buffer on ",
                                           DeviceName(ref.device), ":", ref.device_index,
                                           " and one in host memory; put them on one device"));
  }
  if (ref.data == nullptr && ref.count != 0) throw InvalidArgumentError("null buffer address");
  return ref.data;
}

Runtime::Handle Runtime::Submit(int set, std::function<void(Communicator&)> job) {
  Communicator* comm = &Set(set);
  return thread().Submit([comm, job = std::move(job)](Communicator&) { job(*comm); }, comm);
}

Runtime::Handle Runtime::SubmitNamed(int set, const std::string& name,
                                     std::function<void(Communicator&)> job) {
  Communicator* comm = &Set(set);
  return thread().Submit([comm, job = std::move(job)](Communicator&) { job(*comm); }, comm, name);
}

Runtime::Handle Runtime::Allreduce(const TensorRef& input, const TensorRef& output, ReduceOp op,
                                   int set, CallCheck check, bool prompt, double prescale,
                                   double postscale) {
  if (OnGpu({&input, &output})) {
    gpu::DeviceCall call = DeviceCallOf(gpu::DeviceOp::kAllreduce, {input}, {output}, check);
    call.reduce = op;
    call.prescale = prescale;
    call.postscale = postscale;
    if (input.data != output.data) return SubmitDevice(set, std::move(call));
    // In place: may be fused with the GPU allreduces queued next to it.
    Communicator* comm = &Set(set);
    std::shared_ptr<gpu::DeviceWork> work = Device(*comm).Start(std::move(call));
    const Handle handle = thread().SubmitAllreduce(
        {comm, output.data, output.count, output.type, op, std::move(check), work}, prompt);
    device_work_[handle] = std::move(work);
    return handle;
  }
  const void* in = HostBuffer(input);
  void* out = HostBuffer(output);
  RefuseHostScaling("an allreduce of a host buffer", prescale, postscale);
  const size_t count = output.count;
  const DataType type = output.type;
  if (in == out) {  // in place: may be fused with the allreduces queued next to it
    Communicator* comm = &Set(set);
    return thread().SubmitAllreduce({comm, out, count, type, op, std::move(check)}, prompt);
  }
  return SubmitNamed(set, check.name,
                     [=](Communicator& c) { c.Allreduce(in, out, count, type, op, check); });
}

Runtime::Handle Runtime::GroupedAllreduce(const std::vector<TensorRef>& buffers, DataType type,
                                          ReduceOp op, int set, CallCheck check,
                                          const std::string* match, double prescale,
                                          double postscale) {
  std::vector<const TensorRef*> refs;
  for (const TensorRef& ref : buffers) refs.push_back(&ref);
  if (!buffers.empty() && OnGpu(refs)) {
    for (const TensorRef& ref : buffers) {
      if (ref.type != type) {
        throw InvalidArgumentError(MakeMessage("a grouped allreduce of ", DataTypeName(type),
                                               " got a buffer of ", DataTypeName(ref.type)));
      }
    }
    gpu::DeviceCall call = DeviceCallOf(gpu::DeviceOp::kGroupedAllreduce, buffers, {}, check);
    call.reduce = op;
    call.prescale = prescale;
    call.postscale = postscale;
    return SubmitDevice(set, std::move(call));
  }
  std::vector<Communicator::Buffer> views;
  views.reserve(buffers.size());
  for (const TensorRef& ref : buffers) {
    if (ref.type != type) {
      throw InvalidArgumentError(MakeMessage("a grouped allreduce of ", DataTypeName(type),
                                             " got a buffer of ", DataTypeName(ref.type)));
    }
    views.push_back({HostBuffer(ref), ref.count});
  }
  RefuseHostScaling("a grouped allreduce of host buffers", prescale, postscale);
  return SubmitNamed(set, match != nullptr ? *match : check.name,
                     [=](Communicator& c) { c.GroupedAllreduce(views, type, op, check); });
}

Runtime::Handle Runtime::Refuse(int set, std::string collective, CallCheck check,
                                const std::string* match) {
  const std::string key = match != nullptr ? *match : check.name;
  return SubmitNamed(
      set, key, [collective = std::move(collective), check = std::move(check)](Communicator& c) {
        c.Refuse(collective, check);
      });
}

Runtime::Handle Runtime::Broadcast(const TensorRef& data, int root, int set, CallCheck check) {
  if (OnGpu({&data})) {
    gpu::DeviceCall call = DeviceCallOf(gpu::DeviceOp::kBroadcast, {data}, {}, check);
    call.root = root;
    return SubmitDevice(set, std::move(call));
  }
  void* p = HostBuffer(data);
  const size_t count = data.count;
  const DataType type = data.type;
  return SubmitNamed(set, check.name,
                     [=](Communicator& c) { c.Broadcast(p, count, type, root, check); });
}

Runtime::Handle Runtime::Allgatherv(const TensorRef& input, const TensorRef& output,
                                    std::vector<size_t> counts, int set, CallCheck check) {
  if (OnGpu({&input, &output})) {
    gpu::DeviceCall call = DeviceCallOf(gpu::DeviceOp::kAllgatherv, {input}, {output}, check);
    call.counts = std::move(counts);
    return SubmitDevice(set, std::move(call));
  }
  const void* in = HostBuffer(input);
  void* out = HostBuffer(output);
  const DataType type = output.type;
  return SubmitNamed(set, check.name, [=, counts = std::move(counts)](Communicator& c) {
    c.Allgatherv(in, out, counts, type, check);
  });
}

Runtime::Handle Runtime::ReduceScatter(const TensorRef& input, const TensorRef& output, ReduceOp op,
                                       int set, CallCheck check) {
  if (OnGpu({&input, &output})) {
    gpu::DeviceCall call = DeviceCallOf(gpu::DeviceOp::kReduceScatter, {input}, {output}, check);
    call.reduce = op;
    // The input holds size() blocks of the output's count.
    call.input_counts = {output.count * static_cast<size_t>(Set(set).size())};
    return SubmitDevice(set, std::move(call));
  }
  const void* in = HostBuffer(input);
  void* out = HostBuffer(output);
  const size_t count = output.count;
  const DataType type = output.type;
  return SubmitNamed(set, check.name,
                     [=](Communicator& c) { c.ReduceScatter(in, out, count, type, op, check); });
}

Runtime::Handle Runtime::Alltoallv(const TensorRef& input, std::vector<size_t> send_counts,
                                   const TensorRef& output, std::vector<size_t> recv_counts,
                                   int set, CallCheck check) {
  if (OnGpu({&input, &output})) {
    gpu::DeviceCall call = DeviceCallOf(gpu::DeviceOp::kAlltoallv, {input}, {output}, check);
    call.send_counts = std::move(send_counts);
    call.counts = std::move(recv_counts);
    return SubmitDevice(set, std::move(call));
  }
  const void* in = HostBuffer(input);
  void* out = HostBuffer(output);
  const DataType type = output.type;
  return SubmitNamed(set, check.name,
                     [=, sends = std::move(send_counts), recvs = std::move(recv_counts)](
                         Communicator& c) { c.Alltoallv(in, sends, out, recvs, type, check); });
}

Runtime::Handle Runtime::Barrier(int set) {
  return Submit(set, [](Communicator& c) { c.Barrier(); });
}

bool Runtime::WaitFor(Handle handle, std::chrono::milliseconds timeout) {
  try {
    bool done = false;
    try {
      done = thread().WaitFor(handle, timeout);
    } catch (const Error&) {
      device_work_.erase(handle);  // its Run threw: nothing of it is left to wait for
      throw;
    }
    if (!done) return false;
    FinishDevice(handle);
    return true;
  } catch (const IoError&) {
    NoteFailure();
    throw;
  } catch (const TimeoutError&) {
    NoteFailure();
    throw;
  }
}

bool Runtime::TryCollect(Handle handle) {
  try {
    bool done = false;
    try {
      done = thread().TryCollect(handle);
    } catch (const Error&) {
      device_work_.erase(handle);  // its Run threw: nothing of it is left to wait for
      throw;
    }
    if (!done) return false;
    FinishDevice(handle);
    return true;
  } catch (const IoError&) {
    NoteFailure();
    throw;
  } catch (const TimeoutError&) {
    NoteFailure();
    throw;
  }
}

void Runtime::UseGpuRuntime(std::shared_ptr<gpu::GpuRuntime> runtime) {
  gpu_runtime_ = std::move(runtime);
}

gpu::GpuRuntime& Runtime::Gpu() {
  if (!gpu_runtime_) {
    const gpu::RuntimeLoad& cuda = gpu::CudaRuntime();
    if (!cuda.runtime) {
      throw InvalidArgumentError(MakeMessage("a GPU buffer was given, but ", cuda.why_not));
    }
    gpu_runtime_ = cuda.runtime;
  }
  return *gpu_runtime_;
}

gpu::Path Runtime::GpuPath(int set, std::string* why) {
  auto it = device_.find(&Set(set));
  if (it == device_.end()) return gpu::Path::kUndecided;
  if (why != nullptr) *why = it->second->why();
  return it->second->path();
}

size_t Runtime::GpuFused(int set) {
  auto it = device_.find(&Set(set));
  return it == device_.end() ? 0 : it->second->fused();
}

gpu::DeviceCollectives& Runtime::Device(Communicator& comm) {
  std::unique_ptr<gpu::DeviceCollectives>& device = device_[&comm];
  if (!device) {
    gpu::DeviceOptions options;
    // As the communication thread's fusion cap (Init), so the staging buffers fit a fused batch.
    options.fusion_bytes = static_cast<size_t>(RankSetting(env::kFusionThresholdBytes));
    device = std::make_unique<gpu::DeviceCollectives>(comm, Gpu(), options);
  }
  return *device;
}

bool Runtime::Done(Handle handle) {
  if (!thread().Done(handle)) return false;
  // A GPU collective is done once its results are in place on the GPU, not when the
  // communication thread is through with it (the copy back may still be under way).
  auto it = device_work_.find(handle);
  return it == device_work_.end() || it->second->Done();
}

Runtime::Handle Runtime::SubmitDevice(int set, gpu::DeviceCall call) {
  Communicator& comm = Set(set);
  const std::string name = call.check.name;
  std::shared_ptr<gpu::DeviceWork> work = Device(comm).Start(std::move(call));
  const Handle handle = thread().Submit([work](Communicator&) { work->Run(); }, &comm, name);
  device_work_[handle] = std::move(work);
  return handle;
}

void Runtime::FinishDevice(Handle handle) {
  auto it = device_work_.find(handle);
  if (it == device_work_.end()) return;
  std::shared_ptr<gpu::DeviceWork> work = std::move(it->second);
  device_work_.erase(it);
  work->Wait();
}

void Runtime::ForgetDevice(const Communicator* comm) {
  auto it = device_.find(comm);
  if (it == device_.end()) return;
  for (auto w = device_work_.begin(); w != device_work_.end();) {
    w = &w->second->owner() == it->second.get() ? device_work_.erase(w) : std::next(w);
  }
  device_.erase(it);
}

}  // namespace trainrun::collectives
