#include "trainrun/collectives/runtime.h"

#include <algorithm>
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

}  // namespace

Runtime::Runtime() = default;

Runtime::~Runtime() {
  thread_.reset();  // Finishes what was submitted while the communicators are still there.
  sets_.clear();
}

void Runtime::Init() {
  if (thread_) return;
  if (forked_) throw Error(kForkedChild);
  if (elastic_ && (!world_ || failed_ || world_->broken() || elastic_->Moved())) {
    world_.reset();  // Closes the old data plane first.
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
  sets_.erase(it);
}

void* Runtime::HostBuffer(const TensorRef& ref) {
  if (ref.device != DeviceKind::kHost) {
    // Device buffers are dispatched here once a device backend is built in.
    throw InvalidArgumentError(MakeMessage("a buffer on ", DeviceName(ref.device), ":",
                                           ref.device_index,
                                           " was given, but this build's runtime reduces host "
                                           "memory only"));
  }
  if (ref.data == nullptr && ref.count != 0) throw InvalidArgumentError("null buffer address");
  return ref.data;
}

Runtime::Handle Runtime::Submit(int set, std::function<void(Communicator&)> job) {
  Communicator* comm = &Set(set);
  return thread().Submit([comm, job = std::move(job)](Communicator&) { job(*comm); });
}

Runtime::Handle Runtime::Allreduce(const TensorRef& input, const TensorRef& output, ReduceOp op,
                                   int set, CallCheck check, bool prompt) {
  const void* in = HostBuffer(input);
  void* out = HostBuffer(output);
  const size_t count = output.count;
  const DataType type = output.type;
  if (in == out) {  // in place: may be fused with the allreduces queued next to it
    Communicator* comm = &Set(set);
    return thread().SubmitAllreduce({comm, out, count, type, op, std::move(check)}, prompt);
  }
  return Submit(set, [=](Communicator& c) { c.Allreduce(in, out, count, type, op, check); });
}

Runtime::Handle Runtime::GroupedAllreduce(const std::vector<TensorRef>& buffers, DataType type,
                                          ReduceOp op, int set, CallCheck check) {
  std::vector<Communicator::Buffer> views;
  views.reserve(buffers.size());
  for (const TensorRef& ref : buffers) {
    if (ref.type != type) {
      throw InvalidArgumentError(MakeMessage("a grouped allreduce of ", DataTypeName(type),
                                             " got a buffer of ", DataTypeName(ref.type)));
    }
    views.push_back({HostBuffer(ref), ref.count});
  }
  return Submit(set, [=](Communicator& c) { c.GroupedAllreduce(views, type, op, check); });
}

Runtime::Handle Runtime::Broadcast(const TensorRef& data, int root, int set, CallCheck check) {
  void* p = HostBuffer(data);
  const size_t count = data.count;
  const DataType type = data.type;
  return Submit(set, [=](Communicator& c) { c.Broadcast(p, count, type, root, check); });
}

Runtime::Handle Runtime::Allgatherv(const TensorRef& input, const TensorRef& output,
                                    std::vector<size_t> counts, int set, CallCheck check) {
  const void* in = HostBuffer(input);
  void* out = HostBuffer(output);
  const DataType type = output.type;
  return Submit(set, [=, counts = std::move(counts)](Communicator& c) {
    c.Allgatherv(in, out, counts, type, check);
  });
}

Runtime::Handle Runtime::ReduceScatter(const TensorRef& input, const TensorRef& output, ReduceOp op,
                                       int set, CallCheck check) {
  const void* in = HostBuffer(input);
  void* out = HostBuffer(output);
  const size_t count = output.count;
  const DataType type = output.type;
  return Submit(set, [=](Communicator& c) { c.ReduceScatter(in, out, count, type, op, check); });
}

Runtime::Handle Runtime::Alltoallv(const TensorRef& input, std::vector<size_t> send_counts,
                                   const TensorRef& output, std::vector<size_t> recv_counts,
                                   int set, CallCheck check) {
  const void* in = HostBuffer(input);
  void* out = HostBuffer(output);
  const DataType type = output.type;
  return Submit(set, [=, sends = std::move(send_counts), recvs = std::move(recv_counts)](
                         Communicator& c) { c.Alltoallv(in, sends, out, recvs, type, check); });
}

Runtime::Handle Runtime::Barrier(int set) {
  return Submit(set, [](Communicator& c) { c.Barrier(); });
}

bool Runtime::WaitFor(Handle handle, std::chrono::milliseconds timeout) {
  try {
    return thread().WaitFor(handle, timeout);
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
    return thread().TryCollect(handle);
  } catch (const IoError&) {
    NoteFailure();
    throw;
  } catch (const TimeoutError&) {
    NoteFailure();
    throw;
  }
}

}  // namespace trainrun::collectives
