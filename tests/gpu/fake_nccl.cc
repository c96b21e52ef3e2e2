#include "fake_nccl.h"

#include <condition_variable>
#include <cstring>
#include <map>
#include <sstream>
#include <utility>

#include "trainrun/collectives/errors.h"
#include "trainrun/collectives/testing/elements.h"

namespace trainrun::collectives::gpu::testing {
namespace {

using ::trainrun::collectives::testing::Get;
using ::trainrun::collectives::testing::Put;
using Clock = std::chrono::steady_clock;

enum class Kind { kAllReduce, kBroadcast, kAllGather, kReduceScatter, kSend, kRecv };

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kAllReduce:
      return "allreduce";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kAllGather:
      return "allgather";
    case Kind::kReduceScatter:
      return "reducescatter";
    case Kind::kSend:
      return "send";
    case Kind::kRecv:
      return "recv";
  }
  return "?";
}

// NCCL's first op number past its own (ncclNumOps): where ncclRedOpCreatePreMulSum's start.
constexpr int kFirstCustomOp = 5;

// One NCCL call as a rank posted it. `peer`: broadcast's root, send's and recv's other rank;
// `scalar`: a PreMulSum op's (each input is multiplied by it, then summed).
struct Post {
  Kind kind;
  const void* send;
  void* recv;
  size_t count;
  int type;
  int op;
  int peer;
  double scalar = 1.0;
};

bool P2p(const Post& p) { return p.kind == Kind::kSend || p.kind == Kind::kRecv; }

// TypeOf: NCCL's type as trainrun's (what Get and Put read and write), or false for one NCCL
// has that trainrun never passes.
bool TypeOf(int nccl, DataType* type) {
  switch (nccl) {
    case kNcclInt8:
      *type = DataType::kInt8;
      return true;
    case kNcclUint8:
      *type = DataType::kUInt8;
      return true;
    case kNcclInt32:
      *type = DataType::kInt32;
      return true;
    case kNcclInt64:
      *type = DataType::kInt64;
      return true;
    case kNcclFloat16:
      *type = DataType::kFloat16;
      return true;
    case kNcclFloat32:
      *type = DataType::kFloat32;
      return true;
    case kNcclFloat64:
      *type = DataType::kFloat64;
      return true;
    case kNcclBfloat16:
      *type = DataType::kBFloat16;
      return true;
    default:
      return false;
  }
}

std::string Describe(const Post& p) {
  DataType type = DataType::kUInt8;
  TypeOf(p.type, &type);
  std::ostringstream out;
  out << KindName(p.kind) << " of " << p.count << " " << DataTypeName(type);
  if (p.kind == Kind::kAllReduce || p.kind == Kind::kReduceScatter) {
    out << " (op " << p.op;
    if (p.op >= kFirstCustomOp) out << ": PreMulSum by " << p.scalar;
    out << ")";
  }
  if (p.kind == Kind::kBroadcast) out << " from root " << p.peer;
  if (p.kind == Kind::kSend) out << " to rank " << p.peer;
  if (p.kind == Kind::kRecv) out << " from rank " << p.peer;
  return out.str();
}

std::string Describe(const std::vector<Post>& posts) {
  std::string out = "[";
  for (size_t i = 0; i < posts.size(); ++i) out += (i ? ", " : "") + Describe(posts[i]);
  return out + "]";
}

bool Same(const Post& a, const Post& b) {
  return a.kind == b.kind && a.count == b.count && a.type == b.type && a.op == b.op &&
         a.peer == b.peer && a.scalar == b.scalar;
}

struct World;

struct Comm {
  World* world;
  int rank;
  uint64_t next = 0;  // the sequence number of this rank's next call
  // Under the world's mutex:
  int error = kNcclSuccess;
  std::string last_error;
  bool released = false;      // destroyed or aborted: a failed call's hold ends
  std::map<int, double> ops;  // PreMulSum ops not destroyed yet, with their scalars
  int next_op = kFirstCustomOp;
};

struct Meeting {
  std::vector<std::vector<Post>> posts;  // by rank
  int arrived = 0;
  int computed = 0;
  int left = 0;
  bool checked = false;
  std::string why;  // not empty: the ranks' calls differ, or one gave up waiting
};

struct World {
  int size = 0;
  std::mutex mutex;
  std::condition_variable changed;
  std::map<uint64_t, Meeting> meetings;  // by sequence number
};

// Check returns why the ranks' calls of one meeting do not fit together, or "".
std::string Check(const std::vector<std::vector<Post>>& posts) {
  const int size = static_cast<int>(posts.size());
  std::vector<std::vector<Post>> collectives(size);
  for (int r = 0; r < size; ++r) {
    for (const Post& p : posts[r]) {
      if (!P2p(p)) collectives[r].push_back(p);
    }
  }
  for (int r = 1; r < size; ++r) {
    bool same = collectives[r].size() == collectives[0].size();
    for (size_t i = 0; same && i < collectives[r].size(); ++i) {
      same = Same(collectives[r][i], collectives[0][i]);
    }
    if (!same) {
      return "rank 0 posted " + Describe(collectives[0]) + " but rank " + std::to_string(r) +
             " posted " + Describe(collectives[r]);
    }
  }
  // Sends from a to b pair, in order, with b's receives from a.
  for (int a = 0; a < size; ++a) {
    for (int b = 0; b < size; ++b) {
      std::vector<Post> sends, receives;
      for (const Post& p : posts[a]) {
        if (p.kind == Kind::kSend && p.peer == b) sends.push_back(p);
      }
      for (const Post& p : posts[b]) {
        if (p.kind == Kind::kRecv && p.peer == a) receives.push_back(p);
      }
      bool same = sends.size() == receives.size();
      for (size_t i = 0; same && i < sends.size(); ++i) {
        same = sends[i].count == receives[i].count && sends[i].type == receives[i].type;
      }
      if (!same) {
        return "rank " + std::to_string(a) + " sent " + Describe(sends) + " but rank " +
               std::to_string(b) + " received " + Describe(receives);
      }
    }
  }
  return "";
}

double Combine(int op, double a, double b) {
  switch (op) {
    case kNcclProd:
      return a * b;
    case kNcclMax:
      return std::max(a, b);
    case kNcclMin:
      return std::min(a, b);
    default:  // sum, average (divided at the end)
      return a + b;
  }
}

// Result: bytes to write at `to` once every rank has read its inputs.
struct Result {
  void* to;
  std::vector<char> bytes;
};

// Compute works out `rank`'s outputs of a meeting whose calls fit together (Check).
std::vector<Result> Compute(const std::vector<std::vector<Post>>& posts, int rank) {
  const int size = static_cast<int>(posts.size());
  std::vector<std::vector<const Post*>> collectives(size);
  for (int r = 0; r < size; ++r) {
    for (const Post& p : posts[r]) {
      if (!P2p(p)) collectives[r].push_back(&p);
    }
  }
  std::vector<Result> results;
  auto reduce = [&](size_t i, const Post& mine, size_t offset, std::vector<char>& out) {
    DataType type = DataType::kUInt8;
    TypeOf(mine.type, &type);
    for (size_t e = 0; e < mine.count; ++e) {
      double acc = Get(type, collectives[0][i]->send, offset + e) * mine.scalar;
      for (int r = 1; r < size; ++r) {
        acc = Combine(mine.op, acc, Get(type, collectives[r][i]->send, offset + e) * mine.scalar);
      }
      if (mine.op == kNcclAvg) acc /= size;
      Put(type, out.data(), e, acc);
    }
  };
  for (size_t i = 0; i < collectives[rank].size(); ++i) {
    const Post& mine = *collectives[rank][i];
    DataType type = DataType::kUInt8;
    TypeOf(mine.type, &type);
    const size_t bytes = mine.count * ElementSize(type);
    Result result{mine.recv, {}};
    switch (mine.kind) {
      case Kind::kAllReduce:
        result.bytes.resize(bytes);
        reduce(i, mine, 0, result.bytes);
        break;
      case Kind::kReduceScatter:
        result.bytes.resize(bytes);
        reduce(i, mine, static_cast<size_t>(rank) * mine.count, result.bytes);
        break;
      case Kind::kBroadcast: {
        const auto* from = static_cast<const char*>(collectives[mine.peer][i]->send);
        result.bytes.assign(from, from + bytes);
        break;
      }
      case Kind::kAllGather:
        for (int r = 0; r < size; ++r) {
          const auto* from = static_cast<const char*>(collectives[r][i]->send);
          result.bytes.insert(result.bytes.end(), from, from + bytes);
        }
        break;
      case Kind::kSend:
      case Kind::kRecv:
        break;
    }
    results.push_back(std::move(result));
  }
  // Each receive from a takes a's next send to this rank.
  std::vector<size_t> taken(size, 0);
  for (const Post& p : posts[rank]) {
    if (p.kind != Kind::kRecv) continue;
    size_t seen = 0;
    for (const Post& s : posts[p.peer]) {
      if (s.kind != Kind::kSend || s.peer != rank || seen++ != taken[p.peer]) continue;
      DataType type = DataType::kUInt8;
      TypeOf(s.type, &type);
      const auto* from = static_cast<const char*>(s.send);
      results.push_back({p.recv, std::vector<char>(from, from + s.count * ElementSize(type))});
      ++taken[p.peer];
      break;
    }
  }
  return results;
}

// The group a thread has open (ncclGroupStart), as NCCL keeps it: per thread.
struct Group {
  int depth = 0;
  Comm* comm = nullptr;
  Stream stream = nullptr;
  std::vector<Post> posts;
};
thread_local Group group;

FakeNccl::State* active = nullptr;

}  // namespace

struct FakeNccl::State {
  FakeGpuRuntime& runtime;
  std::chrono::milliseconds timeout;
  NcclApi table{};
  // Locks are taken in one order: mutex, then a world's; a world's, then stats_mutex.
  std::mutex mutex;  // worlds, comms, next_world
  std::map<uint64_t, std::unique_ptr<World>> worlds;
  std::vector<std::unique_ptr<Comm>> comms;  // kept to the end: a stream may still hold one
  uint64_t next_world = 1;
  mutable std::mutex stats_mutex;  // what follows
  size_t meetings = 0;
  size_t pre_mul_sums = 0;
  size_t ops_created = 0;
  size_t ops_destroyed = 0;
  std::vector<size_t> allreduce_counts;
  std::vector<std::string> failures;

  State(FakeGpuRuntime& runtime, std::chrono::milliseconds timeout)
      : runtime(runtime), timeout(timeout) {}

  // Fail records `why` for `comm` (world's mutex held), fails `stream` (FailStream: what was
  // enqueued after this call does nothing) and holds it until the communicator is destroyed or
  // aborted, so that a Wait sees the collective unfinished and asks for the error.
  void Fail(Comm& comm, Stream stream, std::unique_lock<std::mutex>& lock, const std::string& why) {
    runtime.FailStream(stream);
    comm.error = kNcclInvalidUsage;
    comm.last_error = "fake NCCL: rank " + std::to_string(comm.rank) + ": " + why;
    {
      std::lock_guard<std::mutex> guard(stats_mutex);
      failures.push_back(comm.last_error);
    }
    comm.world->changed.wait(lock, [&] { return comm.released; });
  }

  // Meet runs call `seq` of `comm`'s rank (on its stream's thread): meets the other ranks' same
  // call, checks, reads every input, then writes this rank's outputs.
  void Meet(Comm& comm, Stream stream, uint64_t seq, const std::vector<Post>& mine) {
    World& world = *comm.world;
    std::unique_lock<std::mutex> lock(world.mutex);
    Meeting& meeting = world.meetings[seq];
    if (meeting.posts.empty()) meeting.posts.resize(world.size);
    meeting.posts[comm.rank] = mine;
    ++meeting.arrived;
    world.changed.notify_all();
    const auto deadline = Clock::now() + timeout;
    const bool all = world.changed.wait_until(lock, deadline, [&] {
      return meeting.arrived == world.size || comm.released || !meeting.why.empty();
    });
    if (comm.released) return;
    if (!all) {
      std::string missing;
      for (int r = 0; r < world.size; ++r) {
        if (meeting.posts[r].empty()) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      meeting.why = "call #" + std::to_string(seq) + " " + Describe(mine) +
                    " met nothing from rank(s) " + missing + " within " +
                    std::to_string(timeout.count()) + " ms";
      world.changed.notify_all();
    }
    if (!meeting.checked && meeting.why.empty()) {
      meeting.checked = true;
      const std::string why = Check(meeting.posts);
      if (!why.empty()) meeting.why = "call #" + std::to_string(seq) + ": " + why;
    }
    if (!meeting.why.empty()) {
      Fail(comm, stream, lock, meeting.why);
      return;
    }
    lock.unlock();
    std::vector<Result> results = Compute(meeting.posts, comm.rank);
    lock.lock();
    ++meeting.computed;
    world.changed.notify_all();
    world.changed.wait(lock, [&] { return meeting.computed == world.size || comm.released; });
    if (comm.released) return;
    lock.unlock();
    for (Result& result : results) {
      if (!result.bytes.empty()) std::memcpy(result.to, result.bytes.data(), result.bytes.size());
    }
    lock.lock();
    if (comm.rank == 0) {
      std::lock_guard<std::mutex> guard(stats_mutex);
      ++meetings;
      for (const Post& p : mine) {
        if (p.kind == Kind::kAllReduce) allreduce_counts.push_back(p.count);
        if (p.op >= kFirstCustomOp) ++pre_mul_sums;
      }
    }
    if (++meeting.left == world.size) world.meetings.erase(seq);
  }

  int Enqueue(Comm* comm, Stream stream, std::vector<Post> posts) {
    const uint64_t seq = comm->next++;
    runtime.Launch(stream, [this, comm, stream, seq, posts = std::move(posts)] {
      Meet(*comm, stream, seq, posts);
    });
    return kNcclSuccess;
  }

  int Submit(void* handle, Stream stream, Post post) {
    DataType type = DataType::kUInt8;
    if (handle == nullptr || !TypeOf(post.type, &type)) return kNcclInvalidArgument;
    auto* comm = static_cast<Comm*>(handle);
    if (post.op >= kFirstCustomOp) {
      std::lock_guard<std::mutex> lock(comm->world->mutex);
      auto op = comm->ops.find(post.op);
      if (op == comm->ops.end()) return kNcclInvalidArgument;
      post.scalar = op->second;
    }
    if (group.depth > 0) {
      if (group.comm != nullptr && group.comm != comm) return kNcclInvalidUsage;  // not needed
      group.comm = comm;
      group.stream = stream;
      group.posts.push_back(post);
      return kNcclSuccess;
    }
    return Enqueue(comm, stream, {post});
  }

  void Release(Comm* comm) {
    std::lock_guard<std::mutex> lock(comm->world->mutex);
    comm->released = true;
    comm->world->changed.notify_all();
  }
};

namespace {

FakeNccl::State& Active() {
  TRAINRUN_ENFORCE(active != nullptr, "the fake NCCL was called with no FakeNccl alive");
  return *active;
}

int GetVersion(int* version) {
  *version = 22304;
  return kNcclSuccess;
}

int GetUniqueId(NcclUniqueId* id) {
  FakeNccl::State& state = Active();
  std::lock_guard<std::mutex> lock(state.mutex);
  const uint64_t number = state.next_world++;
  state.worlds[number] = std::make_unique<World>();
  std::memset(id->internal, 0, sizeof(id->internal));
  std::memcpy(id->internal, "fake-nccl", 9);
  std::memcpy(id->internal + 16, &number, sizeof(number));
  return kNcclSuccess;
}

int CommInitRank(void** handle, int size, NcclUniqueId id, int rank) {
  FakeNccl::State& state = Active();
  uint64_t number = 0;
  std::memcpy(&number, id.internal + 16, sizeof(number));
  std::lock_guard<std::mutex> lock(state.mutex);
  auto it = state.worlds.find(number);
  if (std::memcmp(id.internal, "fake-nccl", 9) != 0 || it == state.worlds.end() || size < 1 ||
      rank < 0 || rank >= size) {
    return kNcclInvalidArgument;
  }
  World& world = *it->second;
  {
    std::lock_guard<std::mutex> world_lock(world.mutex);
    if (world.size != 0 && world.size != size) return kNcclInvalidUsage;
    world.size = size;
  }
  state.comms.push_back(std::make_unique<Comm>());
  state.comms.back()->world = &world;
  state.comms.back()->rank = rank;
  *handle = state.comms.back().get();
  return kNcclSuccess;
}

int CommRelease(void* handle) {
  if (handle == nullptr) return kNcclInvalidArgument;
  Active().Release(static_cast<Comm*>(handle));
  return kNcclSuccess;
}

int CommGetAsyncError(void* handle, int* error) {
  auto* comm = static_cast<Comm*>(handle);
  std::lock_guard<std::mutex> lock(comm->world->mutex);
  *error = comm->error;
  return kNcclSuccess;
}

const char* GetErrorString(int result) {
  switch (result) {
    case kNcclSuccess:
      return "no error";
    case kNcclInvalidArgument:
      return "invalid argument";
    case kNcclInvalidUsage:
      return "invalid usage";
    default:
      return "fake NCCL error";
  }
}

const char* GetLastError(void* handle) {
  if (handle == nullptr) return "";
  auto* comm = static_cast<Comm*>(handle);
  std::lock_guard<std::mutex> lock(comm->world->mutex);
  return comm->last_error.c_str();  // kept until the next failure, which holds the stream
}

int AllReduce(const void* send, void* recv, size_t count, int type, int op, void* comm,
              void* stream) {
  return Active().Submit(comm, stream, {Kind::kAllReduce, send, recv, count, type, op, -1});
}
int Broadcast(const void* send, void* recv, size_t count, int type, int root, void* comm,
              void* stream) {
  return Active().Submit(comm, stream, {Kind::kBroadcast, send, recv, count, type, -1, root});
}
int AllGather(const void* send, void* recv, size_t count, int type, void* comm, void* stream) {
  return Active().Submit(comm, stream, {Kind::kAllGather, send, recv, count, type, -1, -1});
}
int ReduceScatter(const void* send, void* recv, size_t count, int type, int op, void* comm,
                  void* stream) {
  return Active().Submit(comm, stream, {Kind::kReduceScatter, send, recv, count, type, op, -1});
}
int Send(const void* send, size_t count, int type, int peer, void* comm, void* stream) {
  return Active().Submit(comm, stream, {Kind::kSend, send, nullptr, count, type, -1, peer});
}
int Recv(void* recv, size_t count, int type, int peer, void* comm, void* stream) {
  return Active().Submit(comm, stream, {Kind::kRecv, nullptr, recv, count, type, -1, peer});
}

int RedOpCreatePreMulSum(int* op, void* scalar, int nccl_type, int residence, void* handle) {
  DataType type = DataType::kUInt8;
  if (handle == nullptr || !TypeOf(nccl_type, &type) || residence != kNcclScalarHostImmediate) {
    return kNcclInvalidArgument;
  }
  auto* comm = static_cast<Comm*>(handle);
  FakeNccl::State& state = Active();
  std::lock_guard<std::mutex> lock(comm->world->mutex);
  *op = comm->next_op++;
  comm->ops[*op] = Get(type, scalar, 0);
  std::lock_guard<std::mutex> guard(state.stats_mutex);
  ++state.ops_created;
  return kNcclSuccess;
}

int RedOpDestroy(int op, void* handle) {
  auto* comm = static_cast<Comm*>(handle);
  FakeNccl::State& state = Active();
  std::lock_guard<std::mutex> lock(comm->world->mutex);
  if (comm->ops.erase(op) != 1) return kNcclInvalidArgument;
  std::lock_guard<std::mutex> guard(state.stats_mutex);
  ++state.ops_destroyed;
  return kNcclSuccess;
}

int GroupStart() {
  ++group.depth;
  return kNcclSuccess;
}

int GroupEnd() {
  if (group.depth == 0) return kNcclInvalidUsage;
  if (--group.depth > 0 || group.posts.empty()) return kNcclSuccess;
  std::vector<Post> posts = std::move(group.posts);
  group.posts.clear();
  Comm* comm = group.comm;
  group.comm = nullptr;
  return Active().Enqueue(comm, group.stream, std::move(posts));
}

}  // namespace

FakeNccl::FakeNccl(FakeGpuRuntime& runtime, std::chrono::milliseconds meet_timeout)
    : state_(std::make_unique<State>(runtime, meet_timeout)) {
  TRAINRUN_ENFORCE(active == nullptr, "one FakeNccl at a time");
  active = state_.get();
  NcclApi& t = state_->table;
  t.get_version = GetVersion;
  t.get_unique_id = GetUniqueId;
  t.comm_init_rank = CommInitRank;
  t.comm_destroy = CommRelease;
  t.comm_abort = CommRelease;
  t.comm_get_async_error = CommGetAsyncError;
  t.get_error_string = GetErrorString;
  t.get_last_error = GetLastError;
  t.all_reduce = AllReduce;
  t.broadcast = Broadcast;
  t.all_gather = AllGather;
  t.reduce_scatter = ReduceScatter;
  t.send = Send;
  t.recv = Recv;
  t.group_start = GroupStart;
  t.group_end = GroupEnd;
  t.red_op_create_pre_mul_sum = RedOpCreatePreMulSum;
  t.red_op_destroy = RedOpDestroy;
}

FakeNccl::~FakeNccl() {
  for (auto& comm : state_->comms) state_->Release(comm.get());
  active = nullptr;
}

const NcclApi* FakeNccl::api() const { return &state_->table; }

size_t FakeNccl::allreduces() const {
  std::lock_guard<std::mutex> lock(state_->stats_mutex);
  return state_->allreduce_counts.size();
}

std::vector<size_t> FakeNccl::allreduce_counts() const {
  std::lock_guard<std::mutex> lock(state_->stats_mutex);
  return state_->allreduce_counts;
}

size_t FakeNccl::pre_mul_sums() const {
  std::lock_guard<std::mutex> lock(state_->stats_mutex);
  return state_->pre_mul_sums;
}

size_t FakeNccl::pre_mul_sum_ops() const {
  std::lock_guard<std::mutex> lock(state_->stats_mutex);
  return state_->ops_created;
}

size_t FakeNccl::live_ops() const {
  std::lock_guard<std::mutex> lock(state_->stats_mutex);
  return state_->ops_created - state_->ops_destroyed;
}

size_t FakeNccl::meetings() const {
  std::lock_guard<std::mutex> lock(state_->stats_mutex);
  return state_->meetings;
}

std::vector<std::string> FakeNccl::failures() const {
  std::lock_guard<std::mutex> lock(state_->stats_mutex);
  return state_->failures;
}

}  // namespace trainrun::collectives::gpu::testing
