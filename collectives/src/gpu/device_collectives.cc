#include "trainrun/collectives/gpu/device_collectives.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <thread>
#include <type_traits>

#include "element_codec.h"
#include "nccl_api.h"
#include "trainrun/collectives/errors.h"
#include "trainrun/collectives/gpu/loader.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::collectives::gpu {
namespace {

using ::trainrun::internal::MakeMessage;
using Clock = std::chrono::steady_clock;

int NcclTypeOf(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return kNcclFloat32;
    case DataType::kFloat64:
      return kNcclFloat64;
    case DataType::kFloat16:
      return kNcclFloat16;
    case DataType::kBFloat16:
      return kNcclBfloat16;
    case DataType::kInt32:
      return kNcclInt32;
    case DataType::kInt64:
      return kNcclInt64;
    case DataType::kUInt8:
    case DataType::kBool:
      return kNcclUint8;
    case DataType::kInt8:
      return kNcclInt8;
    case DataType::kInt16:
      return -1;
  }
  return -1;
}

bool IsFloat(DataType type) {
  return type == DataType::kFloat32 || type == DataType::kFloat64 || type == DataType::kFloat16 ||
         type == DataType::kBFloat16;
}

int NcclOpOf(ReduceOp op, DataType type) {
  if (type == DataType::kBool) {  // 0/1 bytes: sum and max are or, product and min are and
    return (op == ReduceOp::kSum || op == ReduceOp::kMax) ? kNcclMax : kNcclMin;
  }
  switch (op) {
    case ReduceOp::kSum:
      return kNcclSum;
    case ReduceOp::kAverage:
      return kNcclAvg;
    case ReduceOp::kMin:
      return kNcclMin;
    case ReduceOp::kMax:
      return kNcclMax;
    case ReduceOp::kProduct:
      return kNcclProd;
    case ReduceOp::kAdasum:  // not element-wise: NcclCan keeps it off NCCL
      break;
  }
  return kNcclSum;
}

// float16 and bfloat16 as ScaleHost and the PreMulSum scalar handle them: as the reduction
// kernels load and store them (element_codec.h).
using internal::BFloat16ToFloat;
using internal::FloatToBFloat16;
using internal::Half;

bool Scaled(const DeviceCall& call) { return call.prescale != 1.0 || call.postscale != 1.0; }

// PreMulSumScalar: the scalar of a scaled allreduce's ncclRedOpCreatePreMulSum op, in the call's
// type (NcclCan lets floats only through): each input times prescale * postscale, over `size`
// for an average, so that the sum is the scaled result with no kernel of ours.
std::array<char, 8> PreMulSumScalar(const DeviceCall& call, int size) {
  const double scalar = call.prescale * call.postscale /
                        (call.reduce == ReduceOp::kAverage ? static_cast<double>(size) : 1.0);
  std::array<char, 8> value{};
  switch (call.type) {
    case DataType::kFloat64:
      std::memcpy(value.data(), &scalar, sizeof(double));
      break;
    case DataType::kFloat16: {
      const auto half = static_cast<Half>(static_cast<float>(scalar));
      std::memcpy(value.data(), &half, sizeof(half));
      break;
    }
    case DataType::kBFloat16: {
      const uint16_t bits = FloatToBFloat16(static_cast<float>(scalar));
      std::memcpy(value.data(), &bits, sizeof(bits));
      break;
    }
    default: {  // float32
      const auto single = static_cast<float>(scalar);
      std::memcpy(value.data(), &single, sizeof(single));
      break;
    }
  }
  return value;
}

// ScaleHost multiplies `count` elements of `type` at `data` (host memory) by `factor`: floats in
// their own precision (16-bit ones through float32), integers through float64, truncated toward
// zero, bool as whether the product is non-zero (as trainrun's Python scales host arrays).
void ScaleHost(DataType type, void* data, size_t count, double factor) {
  if (factor == 1.0) return;
  auto each = [&](auto* elements, auto scale) {
    for (size_t i = 0; i < count; ++i) elements[i] = scale(elements[i]);
  };
  auto integers = [&](auto* elements) {
    using T = std::remove_pointer_t<decltype(elements)>;
    each(elements, [&](T v) { return static_cast<T>(static_cast<double>(v) * factor); });
  };
  switch (type) {
    case DataType::kFloat32:
      each(static_cast<float*>(data), [f = static_cast<float>(factor)](float v) { return v * f; });
      return;
    case DataType::kFloat64:
      each(static_cast<double*>(data), [&](double v) { return v * factor; });
      return;
    case DataType::kFloat16:
      each(static_cast<Half*>(data), [f = static_cast<float>(factor)](Half v) {
        return static_cast<Half>(static_cast<float>(v) * f);
      });
      return;
    case DataType::kBFloat16:
      each(static_cast<uint16_t*>(data), [f = static_cast<float>(factor)](uint16_t v) {
        return FloatToBFloat16(BFloat16ToFloat(v) * f);
      });
      return;
    case DataType::kInt32:
      integers(static_cast<int32_t*>(data));
      return;
    case DataType::kInt64:
      integers(static_cast<int64_t*>(data));
      return;
    case DataType::kInt16:
      integers(static_cast<int16_t*>(data));
      return;
    case DataType::kInt8:
      integers(static_cast<int8_t*>(data));
      return;
    case DataType::kUInt8:
      integers(static_cast<uint8_t*>(data));
      return;
    case DataType::kBool:
      each(static_cast<uint8_t*>(data),
           [&](uint8_t v) { return static_cast<uint8_t>(static_cast<double>(v) * factor != 0); });
      return;
  }
}

// HostId: the same number on every process of one machine (its name and boot), so ranks can tell
// which of them share a host and so a GPU.
int64_t HostId() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  return static_cast<int64_t>(std::hash<std::string>()(std::string(name) + "/" + boot) >> 1);
}

// Poll waits until done() is true: yielding for the first 500 us (a copy of a few MiB), then
// sleeping in steps growing to 100 us; `check` runs between polls and may throw.
template <typename Done, typename Check>
void Poll(Done done, Check check) {
  const auto start = Clock::now();
  auto sleep = std::chrono::microseconds(10);
  while (!done()) {
    check();
    if (Clock::now() - start < std::chrono::microseconds(500)) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(100));
  }
}

// The timeout of a wait on the CPU, as an exception.
struct Late {};

}  // namespace

const NcclApi* LoadNcclApi(std::string* why_not) {
  static std::string why;
  static const NcclApi* api = [&]() -> const NcclApi* {
    const LibraryLoad& library = OpenNccl();
    if (library.handle == nullptr) {
      why = library.why_not;
      return nullptr;
    }
    static NcclApi table{};
    std::string missing;
    auto resolve = [&](const char* name, auto& fn) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(library.handle, name));
      if (fn == nullptr && missing.empty()) missing = name;
    };
    resolve("ncclGetVersion", table.get_version);
    resolve("ncclGetUniqueId", table.get_unique_id);
    resolve("ncclCommInitRank", table.comm_init_rank);
    resolve("ncclCommDestroy", table.comm_destroy);
    resolve("ncclCommAbort", table.comm_abort);
    resolve("ncclCommGetAsyncError", table.comm_get_async_error);
    resolve("ncclGetErrorString", table.get_error_string);
    resolve("ncclGetLastError", table.get_last_error);
    resolve("ncclAllReduce", table.all_reduce);
    resolve("ncclBroadcast", table.broadcast);
    resolve("ncclAllGather", table.all_gather);
    resolve("ncclReduceScatter", table.reduce_scatter);
    resolve("ncclSend", table.send);
    resolve("ncclRecv", table.recv);
    resolve("ncclGroupStart", table.group_start);
    resolve("ncclGroupEnd", table.group_end);
    resolve("ncclRedOpCreatePreMulSum", table.red_op_create_pre_mul_sum);
    resolve("ncclRedOpDestroy", table.red_op_destroy);
    if (!missing.empty()) {
      why = MakeMessage(library.path, " lacks ", missing, " (NCCL 2.12 or later needed)");
      return nullptr;
    }
    return &table;
  }();
  if (api == nullptr && why_not != nullptr) *why_not = why;
  return api;
}

bool GpuRuntime::WaitHost(Event event, Clock::time_point deadline) {
  try {
    Poll([&] { return Done(event); },
         [&] {
           if (Clock::now() >= deadline) throw Late{};
         });
  } catch (const Late&) {
    return false;
  }
  return true;
}

const char* PathName(Path path) {
  switch (path) {
    case Path::kNccl:
      return "nccl";
    case Path::kStaged:
      return "staged";
    case Path::kUndecided:
      return "undecided";
  }
  return "?";
}

// --- PinnedPool ----------------------------------------------------------------------------------

int PinnedPool::SizeClass(size_t bytes) {
  int size_class = 0;
  size_t capacity = size_t{64} << 10;
  while (capacity < bytes) {
    capacity <<= 1;
    ++size_class;
  }
  return size_class;
}

void* PinnedPool::Acquire(size_t bytes) {
  const int size_class = SizeClass(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_.size() <= static_cast<size_t>(size_class)) free_.resize(size_class + 1);
  void* buffer = nullptr;
  if (!free_[size_class].empty()) {
    buffer = free_[size_class].back();
    free_[size_class].pop_back();
  } else {
    buffer = runtime_.AllocPinned((size_t{64} << 10) << size_class);
    ++allocations_;
  }
  in_use_.emplace_back(buffer, size_class);
  return buffer;
}

void PinnedPool::Release(void* buffer) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = in_use_.begin(); it != in_use_.end(); ++it) {
    if (it->first == buffer) {
      free_[it->second].push_back(buffer);
      in_use_.erase(it);
      return;
    }
  }
  TRAINRUN_ENFORCE(false, "a pinned buffer the pool did not hand out was given back");
}

size_t PinnedPool::allocations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return allocations_;
}

PinnedPool::~PinnedPool() {
  for (auto& size_class : free_) {
    for (void* buffer : size_class) runtime_.FreePinned(buffer);
  }
  for (auto& [buffer, size_class] : in_use_) runtime_.FreePinned(buffer);
}

// --- NCCL ----------------------------------------------------------------------------------------

struct DeviceCollectives::Nccl {
  const NcclApi* api = nullptr;
  void* comm = nullptr;
  Stream stream = nullptr;
  Event tail = nullptr;  // recorded after the last fused batch's copies out of the fusion buffer
  int version = 0;
  bool aborted = false;

  // Check throws for a failed NCCL call, naming `what`; a peer's failure is an IoError.
  void Check(int result, const std::string& what) {
    if (result == kNcclSuccess) return;
    const char* last = api->get_last_error(comm);
    const std::string message =
        MakeMessage(what, " failed: NCCL: ", api->get_error_string(result),
                    (last && *last) ? std::string(" (") + last + ")" : std::string());
    if (result == kNcclRemoteError || result == kNcclSystemError) {
      Abort();
      throw IoError(message + "; the NCCL communicator was aborted, a peer rank may have failed");
    }
    if (result == kNcclInvalidArgument || result == kNcclInvalidUsage) {
      throw InvalidArgumentError(message);
    }
    throw Error(message);
  }
  void* Live() const {
    if (aborted || comm == nullptr) {
      throw Error(
          "the NCCL communicator was aborted after an earlier failure; "
          "restart the job (or the elastic generation)");
    }
    return comm;
  }
  void Abort() noexcept {
    if (comm != nullptr && !aborted) api->comm_abort(comm);
    aborted = true;
  }

  // ScaledSum owns the PreMulSum op (PreMulSumScalar) of a scaled allreduce or grouped
  // allreduce: one op for every allreduce of the call, created before the first is enqueued and
  // destroyed once the last has returned (a group's: after ncclGroupEnd), as NCCL allows; not
  // on a communicator aborted meanwhile, which took its ops with it.
  class ScaledSum {
   public:
    ScaledSum(Nccl& nccl, const DeviceCall& call, int size, const std::string& what)
        : nccl_(nccl), comm_(nccl.Live()) {
      std::array<char, 8> scalar = PreMulSumScalar(call, size);
      nccl.Check(nccl.api->red_op_create_pre_mul_sum(&op_, scalar.data(), NcclTypeOf(call.type),
                                                     kNcclScalarHostImmediate, comm_),
                 what);
    }
    ~ScaledSum() {
      if (!nccl_.aborted) nccl_.api->red_op_destroy(op_, comm_);
    }
    ScaledSum(const ScaledSum&) = delete;
    ScaledSum& operator=(const ScaledSum&) = delete;
    int op() const { return op_; }

   private:
    Nccl& nccl_;
    void* comm_;
    int op_ = 0;
  };
};

// --- DeviceCollectives ---------------------------------------------------------------------------

DeviceCollectives::DeviceCollectives(Communicator& comm, GpuRuntime& runtime, DeviceOptions options)
    : comm_(comm), runtime_(runtime), options_(std::move(options)), pinned_(runtime) {
  if (options_.path.empty()) options_.path = env::kGpuPath.Get();
  if (absl::StatusOr<std::string> path = env::kGpuPath.Parse(options_.path); !path.ok()) {
    throw InvalidArgumentError(std::string(path.status().message()));
  }
  if (options_.verbose < 0) options_.verbose = env::kVerbose.Get() != 0 ? 1 : 0;
  timeout_ = options_.timeout.count() > 0 ? options_.timeout
                                          : std::chrono::seconds(env::kTimeoutSeconds.Get());
}

DeviceCollectives::~DeviceCollectives() {
  if (nccl_) {
    if (nccl_->comm != nullptr) {
      if (nccl_->aborted) {
        // Already torn down by Abort.
      } else {
        nccl_->api->comm_destroy(nccl_->comm);
      }
    }
    if (nccl_->stream != nullptr) runtime_.DeleteStream(nccl_->stream);
    if (nccl_->tail != nullptr) runtime_.DeleteEvent(nccl_->tail);
  }
  if (up_tail_ != nullptr) runtime_.WaitHost(up_tail_, Clock::now() + timeout_);
  for (const auto& [memory, ok] : registered_) {
    if (ok) runtime_.UnregisterHost(memory);
  }
  if (fusion_ != nullptr) runtime_.FreeDevice(fusion_);
  if (staging_ != nullptr) runtime_.FreePinned(staging_);
  if (up_stream_ != nullptr && up_stream_ != stage_stream_) runtime_.DeleteStream(up_stream_);
  if (stage_stream_ != nullptr) runtime_.DeleteStream(stage_stream_);
  if (up_tail_ != nullptr) runtime_.DeleteEvent(up_tail_);
  for (Event event : events_) runtime_.DeleteEvent(event);
}

Event DeviceCollectives::TakeEvent() {
  {
    std::lock_guard<std::mutex> lock(events_mutex_);
    if (!events_.empty()) {
      Event event = events_.back();
      events_.pop_back();
      return event;
    }
  }
  return runtime_.NewEvent(device_);
}

void DeviceCollectives::GiveEvent(Event event) {
  if (event == nullptr) return;
  std::lock_guard<std::mutex> lock(events_mutex_);
  events_.push_back(event);
}

Stream DeviceCollectives::DownStream(const std::vector<DeviceWork*>& works) {
  if (stage_stream_ == nullptr) stage_stream_ = runtime_.NewStream(device_);
  for (DeviceWork* work : works) {
    if (work->call_.has_stream) runtime_.WaitEvent(stage_stream_, work->ready_);
  }
  if (up_tail_ != nullptr) runtime_.WaitEvent(stage_stream_, up_tail_);
  return stage_stream_;
}

Stream DeviceCollectives::UpStream() {
  if (up_stream_ == nullptr) {
    // A second stream lets the copy back of chunk c run beside the copy down of chunk c + 1 on a
    // device with an engine each way; with one engine they would take turns anyway, and on the
    // stream of the copies down the copies back need no thread (the fake) or queue of their own.
    if (stage_stream_ == nullptr) stage_stream_ = runtime_.NewStream(device_);
    up_stream_ = runtime_.CopyEngines(device_) >= 2 ? runtime_.NewStream(device_) : stage_stream_;
    up_tail_ = runtime_.NewEvent(device_);
  }
  return up_stream_;
}

void DeviceCollectives::FinishStaged(const std::vector<DeviceWork*>& works) {
  Stream up = UpStream();
  // up_tail_ first: once a caller sees its work done, the next collective's copies down need not
  // wait for the record that follows.
  runtime_.Record(up_tail_, up);
  for (DeviceWork* work : works) runtime_.Record(work->done_, up);
}

template <typename Allocate, typename Free>
char* DeviceCollectives::Grow(char** buffer, size_t* capacity, size_t bytes, Allocate allocate,
                              Free free) {
  if (*capacity >= bytes) return *buffer;
  if (*buffer != nullptr) {
    // The copies back of the last collective may still read it.
    WaitCopied(up_tail_);
    if (nccl_ && nccl_->tail != nullptr) WaitCopied(nccl_->tail);
    free(*buffer);
    *buffer = nullptr;
    *capacity = 0;
  }
  // Grown by doubling, so sizes that vary settle after a few steps.
  size_t grown = std::max<size_t>(size_t{64} << 10, options_.fusion_bytes);
  while (grown < bytes) grown <<= 1;
  *buffer = static_cast<char*>(allocate(grown));
  *capacity = grown;
  return *buffer;
}

char* DeviceCollectives::FusionBuffer(size_t bytes) {
  return Grow(
      &fusion_, &fusion_bytes_, bytes, [&](size_t n) { return runtime_.AllocDevice(n, device_); },
      [&](char* p) { runtime_.FreeDevice(p); });
}

char* DeviceCollectives::Staging(size_t bytes) {
  return Grow(
      &staging_, &staging_bytes_, bytes, [&](size_t n) { return runtime_.AllocPinned(n); },
      [&](char* p) { runtime_.FreePinned(p); });
}

std::shared_ptr<DeviceWork> DeviceCollectives::Start(DeviceCall call) {
  std::vector<const void*> pointers(call.inputs.begin(), call.inputs.end());
  pointers.insert(pointers.end(), call.outputs.begin(), call.outputs.end());
  if (pointers.empty()) throw InvalidArgumentError("a GPU collective without buffers");
  int device = call.device;
  for (const void* pointer : pointers) {
    if (pointer == nullptr) continue;
    const int on = runtime_.DeviceOf(pointer);
    if (on < 0) {
      throw InvalidArgumentError(
          MakeMessage("a buffer of ", call.check.name.empty() ? "this collective" : call.check.name,
                      " is host memory, not on a GPU; pass it as a CPU array or tensor"));
    }
    if (device < 0) device = on;
    if (on != device) {
      throw InvalidArgumentError(MakeMessage("the buffers of one collective are on cuda:", device,
                                             " and cuda:", on, "; put them on one GPU"));
    }
  }
  if (device < 0) throw InvalidArgumentError("a GPU collective whose buffers are all empty");
  if (device_ < 0) device_ = device;
  if (device != device_) {
    throw InvalidArgumentError(
        MakeMessage("this buffer is on cuda:", device, " but rank ", comm_.rank(),
                    "'s earlier GPU collectives on this communicator used cuda:", device_,
                    "; a rank uses one GPU (torch.cuda.set_device(local_rank))"));
  }
  call.device = device;
  auto work = std::shared_ptr<DeviceWork>(new DeviceWork(*this, std::move(call)));
  if (work->call_.has_stream) {
    work->ready_ = TakeEvent();
    runtime_.Record(work->ready_, work->call_.stream);
  }
  work->done_ = TakeEvent();
  return work;
}

void DeviceCollectives::Decide(int device) {
  std::string nccl_why;
  const NcclApi* fake = options_.nccl_api_for_tests;
  const bool nccl_loads =
      fake != nullptr || (runtime_.RealDevices() && LoadNcclApi(&nccl_why) != nullptr);
  if (!nccl_loads && !runtime_.RealDevices()) nccl_why = "the GPU runtime is the tests' CPU fake";
  const int64_t forced = options_.path == "nccl" ? 1 : options_.path == "staged" ? 2 : 0;
  const int size = comm_.size();
  // An allgather made of a sum (each rank fills its own row of zeros), so that a rank that has
  // called join() takes part with zeros, as it does in allreduces: its row says "joined".
  // The last column: this rank's communication thread fuses (on the NCCL path every rank must
  // then exchange before each allreduce, NcclAgree).
  constexpr size_t kColumns = 5;
  std::vector<int64_t> all(kColumns * static_cast<size_t>(size), 0);
  const std::array<int64_t, kColumns> mine = {HostId() | 1, device, nccl_loads ? 1 : 0, forced,
                                              options_.fusion_bytes > 0 ? 1 : 0};
  std::copy(mine.begin(), mine.end(),
            all.begin() + kColumns * static_cast<ptrdiff_t>(comm_.rank()));
  CallCheck check;
  check.name = "choosing the GPU path";
  comm_.Allreduce(all.data(), all.size(), DataType::kInt64, ReduceOp::kSum, check);
  std::string why;
  int joined = -1;
  int without_nccl = -1;
  int shared_a = -1;
  int shared_b = -1;
  bool want_nccl = false;
  bool want_staged = false;
  bool every_rank_fuses = true;
  for (int r = 0; r < size; ++r) {
    const int64_t* p = &all[kColumns * static_cast<size_t>(r)];
    if (p[0] == 0 && joined < 0) joined = r;
    if (p[2] == 0 && without_nccl < 0) without_nccl = r;
    want_nccl |= p[3] == 1;
    want_staged |= p[3] == 2;
    every_rank_fuses = every_rank_fuses && p[4] == 1;
    for (int q = 0; q < r && shared_a < 0; ++q) {
      const int64_t* o = &all[kColumns * static_cast<size_t>(q)];
      if (o[0] == p[0] && o[1] == p[1]) {
        shared_a = q;
        shared_b = r;
      }
    }
  }
  if (want_staged) {
    why = MakeMessage(env::kGpuPath.name, "=staged");
  } else if (joined >= 0) {
    why = MakeMessage("rank ", joined,
                      " had called join() when the communicator's first GPU collective "
                      "ran, and NCCL needs every rank");
  } else if (without_nccl >= 0) {
    why = without_nccl == comm_.rank()
              ? nccl_why
              : MakeMessage("rank ", without_nccl, " of the communicator has no NCCL");
  } else if (shared_a >= 0) {
    why = MakeMessage("ranks ", shared_a, " and ", shared_b,
                      " share cuda:", all[kColumns * static_cast<size_t>(shared_b) + 1],
                      " of one host");
  }
  if (!why.empty() && want_nccl) {
    throw InvalidArgumentError(
        MakeMessage(env::kGpuPath.name, "=nccl, but NCCL cannot serve: ", why));
  }
  runtime_.SetDevice(device);
  if (why.empty()) {
    nccl_ = std::make_unique<Nccl>();
    nccl_->api = fake != nullptr ? fake : LoadNcclApi(nullptr);
    nccl_->api->get_version(&nccl_->version);
    // Rank 0 makes the ID; it travels with a status byte, so a failure there fails every rank.
    std::vector<uint8_t> id(kNcclUniqueIdBytes + 1, 0);
    std::string root_error;
    if (comm_.rank() == 0) {
      NcclUniqueId made{};
      const int result = nccl_->api->get_unique_id(&made);
      if (result == kNcclSuccess) {
        id[0] = 1;
        std::memcpy(id.data() + 1, made.internal, kNcclUniqueIdBytes);
      } else {
        root_error = nccl_->api->get_error_string(result);
      }
    }
    CallCheck id_check;
    id_check.name = "NCCL unique ID";
    comm_.Broadcast(id.data(), id.size(), DataType::kUInt8, 0, id_check);
    if (id[0] != 1) {
      throw Error(MakeMessage("rank 0 could not create the NCCL unique ID",
                              root_error.empty() ? "" : ": " + root_error));
    }
    NcclUniqueId unique{};
    std::memcpy(unique.internal, id.data() + 1, kNcclUniqueIdBytes);
    nccl_->Check(
        nccl_->api->comm_init_rank(&nccl_->comm, size, unique, comm_.rank()),
        MakeMessage("rank ", comm_.rank(), " joining NCCL over ", size, " ranks on cuda:", device));
    nccl_->stream = runtime_.NewStream(device);
    nccl_->tail = runtime_.NewEvent(device);
    nccl_fuse_ = every_rank_fuses;
    path_ = Path::kNccl;
    why_ = "every rank has a GPU of its own and NCCL loads";
  } else {
    path_ = Path::kStaged;
    why_ = why;
  }
  if (options_.verbose != 0) {
    std::cerr << "trainrun: rank " << comm_.info().rank << ": GPU buffers of a communicator of "
              << size << (size == 1 ? " rank" : " ranks") << " on cuda:" << device << " go "
              << (path_ == Path::kNccl ? "over NCCL " + VersionString(nccl_->version, true)
                                       : std::string("through pinned host memory (host-staged)"))
              << ": " << why_ << "\n";
  }
}

bool DeviceCollectives::NcclCan(const DeviceCall& call) const {
  const bool reduces = call.op == DeviceOp::kAllreduce || call.op == DeviceOp::kGroupedAllreduce ||
                       call.op == DeviceOp::kReduceScatter;
  if (!reduces) return true;  // moves bytes: any type
  if (NcclTypeOf(call.type) < 0) return false;
  // Adasum is not element-wise: the host's algorithm (adasum.cc) runs it.
  if (call.reduce == ReduceOp::kAdasum) return false;
  // Scaled: one PreMulSum op, a float sum (an average divides the scalar by the size).
  const bool allreduces = call.op == DeviceOp::kAllreduce || call.op == DeviceOp::kGroupedAllreduce;
  if (allreduces && Scaled(call)) {
    return IsFloat(call.type) &&
           (call.reduce == ReduceOp::kSum || call.reduce == ReduceOp::kAverage);
  }
  // NCCL's average of integers is not trainrun's truncating division on every version.
  if (call.reduce == ReduceOp::kAverage && !IsFloat(call.type)) return false;
  return true;
}

bool DeviceCollectives::NcclAgrees(const DeviceCall& call) const {
  return nccl_fuse_ && call.op == DeviceOp::kAllreduce;
}

size_t DeviceCollectives::NcclAgree(const std::vector<DeviceWork*>& works, size_t offered) {
  const DeviceCall& head = works[0]->call_;
  // prefix[j]: a hash of what must be alike on every rank about the first j + 1 allreduces (the
  // head's type and op, which the others share, and every one's element count), positive, so
  // that the min of it and of its negation show whether every rank has the same. The one of all
  // `offered` stands for them all: ranks that offer different numbers have different hashes.
  std::vector<int64_t> prefix;
  prefix.reserve(offered);
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t word) {
    h = (h ^ word) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
  };
  mix(static_cast<uint64_t>(head.type));
  mix(static_cast<uint64_t>(head.reduce));
  for (size_t i = 0; i < offered; ++i) {
    mix(static_cast<uint64_t>(works[i]->call_.input_counts[0]));
    prefix.push_back(static_cast<int64_t>((h >> 2) | 1));
  }
  // Named as the allreduce (its shape left out: the record's count is the words'), so that
  // ranks whose next collectives differ by name get an OrderError and negotiate. A rank that has
  // joined meets a min, which join() refuses: a MismatchError saying it joined.
  CallCheck check;
  check.name = head.check.name;
  // The common case, every rank offering the same allreduces, costs one host allreduce (min) of
  // three words: the number offered and the hash of them all with its negation.
  std::array<int64_t, 3> words = {static_cast<int64_t>(offered), prefix.back(), -prefix.back()};
  comm_.Allreduce(words.data(), words.size(), DataType::kInt64, ReduceOp::kMin, check);
  const size_t fewest =
      static_cast<size_t>(std::clamp<int64_t>(words[0], 1, static_cast<int64_t>(offered)));
  if (words[1] == -words[2]) return fewest;  // all alike: `offered` on every rank
  // Otherwise a second one, of 2 * fewest words: the hash of every prefix up to the fewest any
  // rank offers, and their negations. The longest prefix alike on every rank runs fused (every
  // rank sees the same mins, so every rank takes the same); the first call past it that differs
  // comes to the head of the queue, where its own exchange finds it differing and names it.
  std::vector<int64_t> prefixes(2 * fewest);
  for (size_t j = 0; j < fewest; ++j) {
    prefixes[j] = prefix[j];
    prefixes[fewest + j] = -prefix[j];
  }
  comm_.Allreduce(prefixes.data(), prefixes.size(), DataType::kInt64, ReduceOp::kMin, check);
  size_t alike = 0;
  while (alike < fewest && prefixes[alike] == -prefixes[fewest + alike]) ++alike;
  if (alike == 0) {
    throw MismatchError(MakeMessage(
        "mismatched GPU allreduces",
        head.check.name.empty() ? std::string() : " '" + head.check.name + "'", ": rank ",
        comm_.rank(), " reduces ", head.input_counts[0], " ", DataTypeName(head.type), " (op ",
        ReduceOpName(head.reduce),
        ") but another rank a different count, element type or op; every rank must call the "
        "same collectives in the same order (this call did nothing)"));
  }
  return alike;
}

std::vector<size_t> DeviceCollectives::FusionOffsets(const std::vector<DeviceWork*>& works,
                                                     size_t k) {
  const size_t element = ElementSize(works[0]->call_.type);
  std::vector<size_t> offsets;
  size_t total = 0;
  for (size_t i = 0; i < k; ++i) {
    offsets.push_back(total);
    total += works[i]->call_.input_counts[0] * element;
  }
  offsets.push_back(total);
  return offsets;
}

void DeviceCollectives::GatherFused(const std::vector<DeviceWork*>& works,
                                    const std::vector<size_t>& offsets, char* fusion,
                                    Stream stream) {
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    const size_t bytes = offsets[i + 1] - offsets[i];
    if (bytes > 0) runtime_.Copy(fusion + offsets[i], works[i]->call_.inputs[0], bytes, stream);
  }
}

void DeviceCollectives::ScatterFused(const std::vector<DeviceWork*>& works,
                                     const std::vector<size_t>& offsets, const char* fusion,
                                     Stream stream) {
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    const size_t bytes = offsets[i + 1] - offsets[i];
    if (bytes > 0) runtime_.Copy(works[i]->call_.outputs[0], fusion + offsets[i], bytes, stream);
  }
}

void DeviceCollectives::NcclFused(const std::vector<DeviceWork*>& works, size_t k) {
  Nccl& nccl = *nccl_;
  void* comm = nccl.Live();
  const DeviceCall& head = works[0]->call_;
  const size_t element = ElementSize(head.type);
  const std::vector<size_t> offsets = FusionOffsets(works, k);
  const size_t total = offsets.back();
  char* fusion = FusionBuffer(total);  // before anything is enqueued: it may wait for the stream
  Stream stream = nccl.stream;
  for (size_t i = 0; i < k; ++i) {
    if (works[i]->call_.has_stream) runtime_.WaitEvent(stream, works[i]->ready_);
  }
  // A staged fused batch's copies out of the fusion buffer (another stream) come first.
  if (up_tail_ != nullptr) runtime_.WaitEvent(stream, up_tail_);
  // Gathered and scattered on NCCL's stream: in order with the allreduce, and the next batch's
  // gather comes after this one's scatter, so one fusion buffer serves every batch.
  GatherFused(works, offsets, fusion, stream);
  const std::string what = MakeMessage(
      "rank ", comm_.rank(), " enqueueing ", k, " fused ", DataTypeName(head.type), " allreduces",
      head.check.name.empty() ? std::string() : " from '" + head.check.name + "'");
  for (size_t i = 0; i < k; ++i) {
    works[i]->path_ = Path::kNccl;
    works[i]->ran_ = true;
  }
  nccl.Check(nccl.api->all_reduce(fusion, fusion, total / element, NcclTypeOf(head.type),
                                  NcclOpOf(head.reduce, head.type), comm, stream),
             what);
  ScatterFused(works, offsets, fusion, stream);
  runtime_.Record(nccl.tail, stream);
  for (size_t i = 0; i < k; ++i) runtime_.Record(works[i]->done_, stream);
  fused_ += k;
}

void DeviceCollectives::RunNccl(DeviceWork& work) {
  const DeviceCall& call = work.call_;
  Nccl& nccl = *nccl_;
  void* comm = nccl.Live();
  const NcclApi& api = *nccl.api;
  Stream stream = nccl.stream;
  if (call.has_stream) runtime_.WaitEvent(stream, work.ready_);
  const size_t element = ElementSize(call.type);
  // Byte-moving collectives of types NCCL lacks go as bytes.
  int type = NcclTypeOf(call.type);
  size_t scale = 1;
  if (type < 0) {
    type = kNcclUint8;
    scale = element;
  }
  const int op = NcclOpOf(call.reduce, call.type);
  const int size = comm_.size();
  const int rank = comm_.rank();
  const std::string what =
      MakeMessage("rank ", rank, " enqueueing a ", DataTypeName(call.type), " collective",
                  call.check.name.empty() ? std::string() : " '" + call.check.name + "'");
  switch (call.op) {
    case DeviceOp::kAllreduce:
    case DeviceOp::kGroupedAllreduce: {
      // Scaled: each input times the factors within NCCL's sum, one op for the whole call.
      std::optional<Nccl::ScaledSum> scaled_sum;
      if (Scaled(call)) scaled_sum.emplace(nccl, call, size, what);
      const int reduce = scaled_sum ? scaled_sum->op() : op;
      if (call.op == DeviceOp::kAllreduce) {
        nccl.Check(api.all_reduce(call.inputs[0], call.outputs[0], call.input_counts[0], type,
                                  reduce, comm, stream),
                   what);
        break;
      }
      nccl.Check(api.group_start(), what);
      for (size_t i = 0; i < call.inputs.size(); ++i) {
        nccl.Check(api.all_reduce(call.inputs[i], call.inputs[i], call.input_counts[i], type,
                                  reduce, comm, stream),
                   what);
      }
      nccl.Check(api.group_end(), what);
      break;
    }
    case DeviceOp::kBroadcast:
      nccl.Check(api.broadcast(call.inputs[0], call.inputs[0], call.input_counts[0] * scale, type,
                               call.root, comm, stream),
                 what);
      break;
    case DeviceOp::kReduceScatter:
      nccl.Check(api.reduce_scatter(call.inputs[0], call.outputs[0], call.output_count, type, op,
                                    comm, stream),
                 what);
      break;
    case DeviceOp::kAllgatherv: {
      const bool even = std::all_of(call.counts.begin(), call.counts.end(),
                                    [&](size_t c) { return c == call.counts[0]; });
      if (even) {
        nccl.Check(api.all_gather(call.inputs[0], call.outputs[0], call.counts[0] * scale, type,
                                  comm, stream),
                   what);
        break;
      }
      // Uneven blocks: one broadcast per rank, as one group.
      nccl.Check(api.group_start(), what);
      size_t offset = 0;
      for (int r = 0; r < size; ++r) {
        char* block = static_cast<char*>(call.outputs[0]) + offset * element;
        nccl.Check(api.broadcast(r == rank ? call.inputs[0] : block, block, call.counts[r] * scale,
                                 type, r, comm, stream),
                   what);
        offset += call.counts[r];
      }
      nccl.Check(api.group_end(), what);
      break;
    }
    case DeviceOp::kAlltoallv: {
      nccl.Check(api.group_start(), what);
      size_t sent = 0;
      size_t received = 0;
      for (int r = 0; r < size; ++r) {
        if (call.send_counts[r] > 0) {
          nccl.Check(api.send(static_cast<const char*>(call.inputs[0]) + sent * element,
                              call.send_counts[r] * scale, type, r, comm, stream),
                     what);
        }
        if (call.counts[r] > 0) {
          nccl.Check(api.recv(static_cast<char*>(call.outputs[0]) + received * element,
                              call.counts[r] * scale, type, r, comm, stream),
                     what);
        }
        sent += call.send_counts[r];
        received += call.counts[r];
      }
      nccl.Check(api.group_end(), what);
      break;
    }
  }
  runtime_.Record(work.done_, stream);
}

// DeviceCopies: a device buffer as the transport reaches it (BufferCopies), every copy on one
// stream, so that a Wait for the latest covers all before it.
class DeviceCollectives::DeviceCopies final : public BufferCopies {
 public:
  DeviceCopies(DeviceCollectives& owner, const void* input, void* output, size_t element,
               Stream stream)
      : owner_(owner),
        input_(static_cast<const char*>(input)),
        output_(static_cast<char*>(output)),
        element_(element),
        stream_(stream) {}
  ~DeviceCopies() { owner_.GiveEvent(landed_); }
  DeviceCopies(const DeviceCopies&) = delete;
  DeviceCopies& operator=(const DeviceCopies&) = delete;

  void In(void* to, size_t begin, size_t count) override {
    if (count > 0) owner_.runtime_.Copy(to, input_ + begin * element_, count * element_, stream_);
  }
  void Out(const void* from, size_t begin, size_t count) override {
    if (count > 0)
      owner_.runtime_.Copy(output_ + begin * element_, from, count * element_, stream_);
  }
  void Wait() override {
    if (landed_ == nullptr) landed_ = owner_.TakeEvent();  // none where the transport declines
    owner_.runtime_.Record(landed_, stream_);
    owner_.WaitCopied(landed_);
  }
  void UseHostMemory(void* memory, size_t bytes) override {
    for (const auto& [registered, ok] : owner_.registered_) {
      if (registered == memory) return;
    }
    owner_.registered_.emplace_back(memory, owner_.runtime_.RegisterHost(memory, bytes));
  }

 private:
  DeviceCollectives& owner_;
  const char* input_;
  char* output_;
  size_t element_;
  Stream stream_;
  Event landed_ = nullptr;
};

void DeviceCollectives::StagedAllreduce(DeviceWork& work) {
  const DeviceCall& call = work.call_;
  const size_t element = ElementSize(call.type);
  const size_t count = call.input_counts[0];
  Stream down = DownStream({&work});
  Stream up = UpStream();
  const bool scaled = Scaled(call);
  if (options_.copy_through_transport && !scaled) {
    // Straight between the device and the transport's memory, on the stream of the copies down;
    // every copy has landed when it returns, so the end is reached on that stream at once.
    DeviceCopies copies(*this, call.inputs[0], call.outputs[0], element, down);
    if (comm_.TryAllreduceCopies(copies, count, call.type, call.reduce, call.check)) {
      runtime_.Record(up_tail_, down);
      runtime_.Record(work.done_, down);
      return;
    }
  }
  char* host = Staging(count * element);
  // Chunks are cut alike on every rank (from the count and the options alone), each its own host
  // allreduce: the copy down of chunk c + 1 and the copy back of chunk c - 1 (another stream, so
  // another copy engine on a GPU) run while chunk c is reduced. Fewer, larger chunks where a
  // chunk would fall under min_chunk_bytes: each costs a host allreduce's synchronisation.
  const size_t most =
      std::clamp<size_t>(static_cast<size_t>(std::max(1, options_.max_chunks)), 1, 64);
  const size_t fit = count * element / std::max<size_t>(options_.min_chunk_bytes, 1);
  // Not Adasum's: a chunk alone would have dot products of its own, not the tensor's.
  const size_t chunks = call.reduce == ReduceOp::kAdasum ? 1 : std::clamp<size_t>(fit, 1, most);
  const size_t per_chunk = (count + chunks - 1) / std::max<size_t>(chunks, 1);
  const auto* in = static_cast<const char*>(call.inputs[0]);
  auto* out = static_cast<char*>(call.outputs[0]);
  std::array<Event, 64> copied{};
  size_t used = 0;
  struct Give {
    DeviceCollectives& self;
    std::array<Event, 64>& events;
    size_t& used;
    ~Give() {
      for (size_t i = 0; i < used; ++i) self.GiveEvent(events[i]);
    }
  } give{*this, copied, used};
  for (size_t begin = 0; begin < count && used < copied.size(); begin += per_chunk) {
    const size_t n = std::min(per_chunk, count - begin);
    runtime_.Copy(host + begin * element, in + begin * element, n * element, down);
    copied[used] = TakeEvent();
    runtime_.Record(copied[used++], down);
  }
  if (count == 0) {
    comm_.Allreduce(host, 0, call.type, call.reduce, call.check);
  }
  for (size_t c = 0, begin = 0; begin < count; ++c, begin += per_chunk) {
    const size_t n = std::min(per_chunk, count - begin);
    WaitCopied(copied[c]);
    if (scaled) ScaleHost(call.type, host + begin * element, n, call.prescale);
    comm_.Allreduce(host + begin * element, n, call.type, call.reduce, call.check);
    if (scaled) ScaleHost(call.type, host + begin * element, n, call.postscale);
    runtime_.Copy(out + begin * element, host + begin * element, n * element, up);
  }
  FinishStaged({&work});
}

void DeviceCollectives::RunStaged(DeviceWork& work) {
  const DeviceCall& call = work.call_;
  if (call.op == DeviceOp::kAllreduce) {
    StagedAllreduce(work);
    return;
  }
  Stream stream = DownStream({&work});
  Stream up = UpStream();
  const size_t element = ElementSize(call.type);
  auto pinned = [&](size_t count) {
    void* buffer = pinned_.Acquire(count * element);
    work.pinned_.push_back(buffer);
    return buffer;
  };
  auto down = [&](void* host, const void* device, size_t count) {
    if (count > 0) runtime_.Copy(host, device, count * element, stream);
  };
  auto back = [&](void* device, const void* host, size_t count) {
    if (count > 0) runtime_.Copy(device, host, count * element, up);
  };
  // The copies down must have landed before the host collective reads them.
  auto landed = [&] {
    runtime_.Record(work.done_, stream);
    WaitCopied(work.done_);
  };
  const size_t size = static_cast<size_t>(comm_.size());
  const size_t rank = static_cast<size_t>(comm_.rank());
  switch (call.op) {
    case DeviceOp::kAllreduce:
      break;  // StagedAllreduce
    case DeviceOp::kGroupedAllreduce: {
      size_t total = 0;
      for (size_t c : call.input_counts) total += c;
      char* host = static_cast<char*>(pinned(total));
      std::vector<Communicator::Buffer> buffers;
      size_t offset = 0;
      for (size_t i = 0; i < call.inputs.size(); ++i) {
        down(host + offset * element, call.inputs[i], call.input_counts[i]);
        buffers.push_back({host + offset * element, call.input_counts[i]});
        offset += call.input_counts[i];
      }
      landed();
      // Scaled as StagedAllreduce scales: the host allreduce divides an average between.
      ScaleHost(call.type, host, total, call.prescale);
      comm_.GroupedAllreduce(buffers, call.type, call.reduce, call.check);
      ScaleHost(call.type, host, total, call.postscale);
      offset = 0;
      for (size_t i = 0; i < call.inputs.size(); ++i) {
        back(call.inputs[i], host + offset * element, call.input_counts[i]);
        offset += call.input_counts[i];
      }
      break;
    }
    case DeviceOp::kBroadcast: {
      const size_t count = call.input_counts[0];
      void* host = pinned(count);
      const bool root = static_cast<int>(rank) == call.root;
      if (root) down(host, call.inputs[0], count);
      landed();
      comm_.Broadcast(host, count, call.type, call.root, call.check);
      if (!root) back(call.inputs[0], host, count);
      break;
    }
    case DeviceOp::kAllgatherv: {
      size_t total = 0;
      for (size_t c : call.counts) total += c;
      void* in = pinned(call.counts[rank]);
      void* out = pinned(total);
      down(in, call.inputs[0], call.counts[rank]);
      landed();
      comm_.Allgatherv(in, out, call.counts, call.type, call.check);
      back(call.outputs[0], out, total);
      break;
    }
    case DeviceOp::kReduceScatter: {
      const size_t count = call.output_count;
      void* in = pinned(count * size);
      void* out = pinned(count);
      down(in, call.inputs[0], count * size);
      landed();
      comm_.ReduceScatter(in, out, count, call.type, call.reduce, call.check);
      back(call.outputs[0], out, count);
      break;
    }
    case DeviceOp::kAlltoallv: {
      size_t sent = 0;
      size_t received = 0;
      for (size_t c : call.send_counts) sent += c;
      for (size_t c : call.counts) received += c;
      void* in = pinned(sent);
      void* out = pinned(received);
      down(in, call.inputs[0], sent);
      landed();
      comm_.Alltoallv(in, call.send_counts, out, call.counts, call.type, call.check);
      back(call.outputs[0], out, received);
      break;
    }
  }
  FinishStaged({&work});
}

size_t DeviceCollectives::StagedFused(const std::vector<DeviceWork*>& works,
                                      std::exception_ptr* error) {
  const DeviceCall& head = works[0]->call_;
  for (DeviceWork* work : works) work->path_ = Path::kStaged;
  // In bytes, into the fusion buffer and the pinned one.
  const std::vector<size_t> offsets = FusionOffsets(works, works.size());
  const size_t total = offsets.back();
  Stream down = DownStream(works);
  // On a NCCL communicator (here with a type NCCL lacks), its fused batches' copies out of the
  // fusion buffer come first.
  if (nccl_ && nccl_->tail != nullptr) runtime_.WaitEvent(down, nccl_->tail);
  char* fusion = FusionBuffer(total);
  // Gathered on the device, then one copy down: a copy over PCIe costs ~10 us before its first
  // byte, a copy within the device far less.
  GatherFused(works, offsets, fusion, down);
  char* host = Staging(total);
  if (total > 0) runtime_.Copy(host, fusion, total, down);
  Event copied = TakeEvent();
  runtime_.Record(copied, down);
  size_t k = 1;
  try {
    WaitCopied(copied);
    std::vector<Communicator::ReadyAllreduce> ready;
    ready.reserve(works.size());
    for (size_t i = 0; i < works.size(); ++i) {
      ready.push_back({host + offsets[i], works[i]->call_.input_counts[0], &works[i]->call_.check});
    }
    k = comm_.AllreduceReady(ready, head.type, head.reduce, error);
  } catch (...) {
    *error = std::current_exception();
  }
  GiveEvent(copied);
  for (size_t i = 0; i < k; ++i) works[i]->ran_ = true;
  if (*error) return k;
  // The k that ran: one copy back of their prefix, then scattered on the device.
  Stream up = UpStream();
  if (offsets[k] > 0) runtime_.Copy(fusion, host, offsets[k], up);
  ScatterFused(works, {offsets.begin(), offsets.begin() + static_cast<std::ptrdiff_t>(k) + 1},
               fusion, up);
  std::vector<DeviceWork*> ran(works.begin(), works.begin() + static_cast<std::ptrdiff_t>(k));
  FinishStaged(ran);
  if (k > 1) fused_ += k;
  return k;
}

void DeviceCollectives::WaitDone(DeviceWork& work) { WaitEvent(work, work.done_); }

void DeviceCollectives::WaitEvent(DeviceWork& work, Event event) {
  const auto deadline = Clock::now() + timeout_;
  Nccl* nccl = work.path_ == Path::kNccl ? nccl_.get() : nullptr;
  auto late = [&] {
    if (nccl != nullptr) nccl->Abort();
    return TimeoutError(MakeMessage(
        "rank ", comm_.rank(), " waited ", timeout_.count(), " ms for a GPU collective (",
        PathName(work.path_), " path) that did not finish",
        nccl != nullptr ? "; the NCCL communicator was aborted" : "",
        "; a peer rank may have failed (raise TRAINRUN_TIMEOUT if the work is just slow)"));
  };
  if (nccl == nullptr) {
    // Staged: the host collective is over, what is left are local copies; no peer to watch.
    if (!runtime_.WaitHost(event, deadline)) throw late();
    return;
  }
  Poll([&] { return runtime_.Done(event); },
       [&] {
         if (nccl->comm != nullptr && !nccl->aborted) {
           int state = kNcclSuccess;
           nccl->api->comm_get_async_error(nccl->comm, &state);
           if (state != kNcclSuccess && state != kNcclInProgress) {
             nccl->Check(state,
                         MakeMessage("rank ", comm_.rank(), " waiting for an NCCL collective"));
           }
         }
         if (Clock::now() >= deadline) throw late();
       });
}

void DeviceCollectives::WaitCopied(Event event) {
  if (runtime_.WaitHost(event, Clock::now() + timeout_)) return;
  throw TimeoutError(MakeMessage(
      "rank ", comm_.rank(), " waited ", timeout_.count(),
      " ms for the copy of a GPU buffer to host memory; the work on the buffer's stream "
      "before the collective did not finish (raise TRAINRUN_TIMEOUT if it is just slow)"));
}

// --- DeviceWork ----------------------------------------------------------------------------------

DeviceWork::DeviceWork(DeviceCollectives& owner, DeviceCall call)
    : owner_(owner), call_(std::move(call)) {}

DeviceWork::~DeviceWork() {
  for (void* buffer : pinned_) owner_.pinned_.Release(buffer);
  owner_.GiveEvent(ready_);
  owner_.GiveEvent(done_);
}

void DeviceWork::Run() {
  if (owner_.path_ == Path::kUndecided) owner_.Decide(call_.device);
  path_ = owner_.path_ == Path::kNccl && owner_.NcclCan(call_) ? Path::kNccl : Path::kStaged;
  ran_ = true;
  if (path_ == Path::kNccl) {
    if (owner_.NcclAgrees(call_)) owner_.NcclAgree({this}, 1);  // alone: 1 whatever the others
    owner_.RunNccl(*this);
  } else {
    owner_.RunStaged(*this);
  }
}

bool DeviceWork::fusable() const {
  // Adasum's dot products are each tensor's own: fused, they would be the buffer's.
  return call_.op == DeviceOp::kAllreduce && call_.reduce != ReduceOp::kAdasum && !Scaled(call_) &&
         call_.inputs.size() == 1 && call_.outputs.size() == 1 &&
         call_.inputs[0] == call_.outputs[0];
}

size_t DeviceWork::RunFused(const std::vector<DeviceWork*>& works, std::exception_ptr* error) {
  TRAINRUN_ENFORCE(!works.empty(), "DeviceWork::RunFused of nothing");
  DeviceWork& head = *works[0];
  DeviceCollectives& owner = head.owner_;
  size_t alike = 0;  // how many from the head may run together
  try {
    if (owner.path_ == Path::kUndecided) owner.Decide(head.call_.device);
    for (DeviceWork* work : works) {
      if (&work->owner_ != &owner || !work->fusable() || work->call_.type != head.call_.type ||
          work->call_.reduce != head.call_.reduce) {
        break;
      }
      ++alike;
    }
    const bool nccl = owner.path_ == Path::kNccl && owner.NcclCan(head.call_);
    if (nccl && alike > 0 && owner.NcclAgrees(head.call_)) {
      // Every rank exchanges here, however many it has queued: the one decision they all make.
      const size_t k = owner.NcclAgree(works, alike);
      if (k == 1) {
        head.path_ = Path::kNccl;
        head.ran_ = true;
        owner.RunNccl(head);
        return 1;
      }
      try {
        owner.NcclFused(works, k);
      } catch (...) {  // the k agreed on fail together, as on the staged path
        for (size_t i = 0; i < k; ++i) works[i]->ran_ = true;
        *error = std::current_exception();
      }
      return k;
    }
    if (nccl || alike != works.size() || works.size() == 1) {
      head.Run();
      return 1;
    }
  } catch (...) {
    head.ran_ = true;
    *error = std::current_exception();
    return 1;
  }
  try {
    return owner.StagedFused(works, error);
  } catch (...) {  // before the host collective (a copy refused): the head fails alone
    head.ran_ = true;
    *error = std::current_exception();
    return 1;
  }
}

bool DeviceWork::Done() {
  if (!ran_) return false;
  return owner_.runtime_.Done(done_);
}

void DeviceWork::Wait() {
  if (waited_) return;
  TRAINRUN_ENFORCE(path_ != Path::kUndecided, "DeviceWork::Wait before Run");
  owner_.WaitDone(*this);
  if (call_.has_stream) owner_.runtime_.WaitEvent(call_.stream, done_);
  waited_ = true;
  for (void* buffer : pinned_) owner_.pinned_.Release(buffer);
  pinned_.clear();
}

}  // namespace trainrun::collectives::gpu
