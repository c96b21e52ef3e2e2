// trainrun._core: the C++ half of the Python package (python/trainrun/ is the other half).
//
// It owns the process's Communicator, behind a CommThread, and exposes collectives on raw
// addresses: Python passes (address, count, dtype code) taken from a NumPy array or a torch
// tensor, so contiguous buffers are never copied and this file needs neither NumPy nor torch.
// Every wait releases the GIL and wakes up regularly to let Ctrl-C through. Library exceptions
// become trainrun.Error and its subclasses, with the library's message.
#include <pthread.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm_thread.h"
#include "fast_calls.h"
#include "trainrun/collectives/communicator.h"
#include "trainrun/collectives/errors.h"
#include "trainrun/collectives/types.h"
#include "trainrun/rendezvous/client.h"
#include "trainrun/rendezvous/environment.h"
#include "trainrun/rendezvous/file_store.h"
#include "trainrun/rendezvous/generation.h"
#include "trainrun/rendezvous/memory_store.h"

namespace py = pybind11;

namespace trainrun::python {
namespace {

using collectives::CallCheck;
using collectives::Communicator;
using collectives::DataType;
using collectives::RankInfo;
using collectives::ReduceOp;

// How often a wait lets Python run its signal handlers (Ctrl-C).
constexpr auto kSignalCheckInterval = std::chrono::milliseconds(100);

std::optional<std::string> GetEnv(const char* name) {
  std::optional<std::string> value = env::Lookup(name);
  if (!value || value->empty()) return std::nullopt;
  return value;
}

int GetIntEnv(const char* name, std::optional<int> fallback, const char* why) {
  auto value = GetEnv(name);
  if (!value) {
    if (fallback) return *fallback;
    throw Error(internal::MakeMessage(name, " is not set; ", why));
  }
  try {
    size_t used = 0;
    int parsed = std::stoi(*value, &used);
    if (used == value->size()) return parsed;
  } catch (const std::exception&) {
  }
  throw Error(internal::MakeMessage(name, "=", *value, " is not an integer"));
}

// Connect builds the communicator the environment asks for: the job of the trainrun that
// started this process; else the ranks meeting in TRAINRUN_FILE_STORE; else a job of one.
std::unique_ptr<Communicator> Connect() {
  if (GetEnv(env::kRendezvousAddr)) return Communicator::FromEnvironment();
  if (auto directory = GetEnv(env::kFileStore)) {
    const char* why = "TRAINRUN_FILE_STORE needs every rank's TRAINRUN_RANK and TRAINRUN_SIZE";
    RankInfo info;
    info.rank = GetIntEnv(env::kRank, std::nullopt, why);
    info.size = GetIntEnv(env::kSize, std::nullopt, why);
    info.local_rank = GetIntEnv(env::kLocalRank, info.rank, why);
    info.local_size = GetIntEnv(env::kLocalSize, info.size, why);
    info.cross_rank = GetIntEnv(env::kCrossRank, 0, why);
    info.cross_size = GetIntEnv(env::kCrossSize, 1, why);
    collectives::CommunicatorOptions options;
    if (!GetEnv(env::kJobToken)) options.job_token = "file-store:" + *directory;
    if (!GetEnv(env::kJobId)) options.job_id = *directory;
    ::mkdir(directory->c_str(), 0700);  // Already there is fine; the store reports real trouble.
    return std::make_unique<Communicator>(std::make_shared<rendezvous::FileStore>(*directory), info,
                                          options);
  }
  // A job of one, unless the environment says this process is one rank of several: then the
  // launcher did not give us its rendezvous, and running alone would silently train wrong.
  if (GetIntEnv(env::kSize, 1, "") > 1) {
    throw Error(internal::MakeMessage(
        env::kSize, "=", *GetEnv(env::kSize), " but ", env::kRendezvousAddr,
        " is not set, so this rank cannot find the others; start the job with trainrun (or set ",
        env::kFileStore, " to a directory shared by the ranks)"));
  }
  collectives::CommunicatorOptions options;
  options.job_token = "single-process";
  options.job_id = "single-process";
  options.listen_address = "127.0.0.1";
  return std::make_unique<Communicator>(std::make_shared<rendezvous::MemoryStore>(), 0, 1, options);
}

// FusionBytes is the most bytes of in-place allreduces the communication thread fuses into one:
// TRAINRUN_FUSION_BYTES (`--fusion-threshold-mb`; 0 turns fusion off), else 64 MiB, Horovod's
// default fusion threshold.
size_t FusionBytes() {
  constexpr int64_t kDefault = int64_t{64} << 20;
  auto value = GetEnv(env::kFusionBytes.name);
  if (!value) return kDefault;
  try {
    size_t used = 0;
    long long parsed = std::stoll(*value, &used);
    if (used == value->size() && parsed >= 0) return static_cast<size_t>(parsed);
  } catch (const std::exception&) {
  }
  throw Error(internal::MakeMessage(env::kFusionBytes.name, "=", *value,
                                    " is not a number of bytes (0 or more)"));
}

// ElasticWorld is an elastic worker's hold on its job (TRAINRUN_ELASTIC=1): the rendezvous store it
// joined through, its slot (its rank at the start), and the generation its communicator is of.
struct ElasticWorld {
  std::shared_ptr<rendezvous::Store> store;
  int slot = 0;
  int generation = 0;
  std::chrono::milliseconds timeout{0};  // the longest wait for a next generation
  std::vector<int> members;              // the slots of `generation`, in rank order
};

// LosesMember answers CommunicatorOptions::interrupt for an elastic worker's communicator of
// generation `generation` (members `members`): true once a newer generation has been published
// that leaves one of them out (a lost rank or host; a generation that only adds ranks is not a
// reason to give up a collective). Remembers the newest generation it found harmless.
std::function<bool()> LosesMember(std::shared_ptr<rendezvous::Store> store, int generation,
                                  std::vector<int> members) {
  auto checked = std::make_shared<int>(generation);
  return [store = std::move(store), members = std::move(members), checked]() {
    absl::StatusOr<int> latest = rendezvous::LatestGeneration(*store);
    if (!latest.ok() || *latest <= *checked) return false;
    absl::StatusOr<std::vector<std::string>> text =
        store->Get({rendezvous::GenerationKey(*latest)}, std::chrono::milliseconds(1000));
    if (!text.ok()) return false;
    absl::StatusOr<rendezvous::Generation> next =
        rendezvous::Generation::Decode(*latest, (*text)[0]);
    if (!next.ok()) return false;
    for (int slot : members) {
      if (!next->PlaceOf(slot)) return true;
    }
    *checked = *latest;
    return false;
  };
}

bool ElasticRequested() {
  auto value = GetEnv(env::kElastic);
  return value && *value == "1" && GetEnv(env::kRendezvousAddr);
}

std::unique_ptr<Communicator> JoinNextGeneration(ElasticWorld& elastic, bool first_with_me);

// JoinElastic joins the job like Communicator::FromEnvironment, but keeps the store for the later
// generations.
std::unique_ptr<Communicator> JoinElastic(ElasticWorld& elastic) {
  const auto timeout = std::chrono::milliseconds(env::kTimeoutSeconds.Get() * 1000);
  auto session = rendezvous::JoinFromEnvironment(timeout);
  if (!session.ok()) {
    throw Error(
        internal::MakeMessage("cannot join the trainrun job: ", session.status().message()));
  }
  elastic.store = session->store;
  elastic.slot = session->assignment.rank;
  elastic.generation = 0;
  // trainrun always sets it; the fallback is its default (600 s) and margin (30 s).
  elastic.timeout =
      std::chrono::milliseconds(int64_t{GetIntEnv(env::kElasticTimeout, 630, "")} * 1000);
  // A rank the job grew by (started while the job ran) joins the first generation that has it.
  if (GetEnv(env::kElasticSlot)) return JoinNextGeneration(elastic, /*first_with_me=*/true);
  const RankInfo& info = session->assignment;
  elastic.members.clear();
  for (int slot = 0; slot < info.size; ++slot) elastic.members.push_back(slot);
  collectives::CommunicatorOptions options;
  options.job_id = session->assignment.job_id;
  options.interrupt = LosesMember(elastic.store, 0, elastic.members);
  return std::make_unique<Communicator>(elastic.store, info, options);
}

// JoinNextGeneration waits for the job's next generation (generation.h), then connects to its
// members with a communicator of its own. Throws Error (not an InternalError, which the elastic
// loop would answer by waiting again) when none comes in time or this rank is not a member, and
// what the communicator throws when a member is lost while it connects. `first_with_me` (a rank
// the job grew by): generations without this rank are passed over, up to the first that has it.
std::unique_ptr<Communicator> JoinNextGeneration(ElasticWorld& elastic, bool first_with_me) {
  absl::StatusOr<rendezvous::Generation> next =
      rendezvous::WaitForGeneration(*elastic.store, elastic.generation + 1, elastic.timeout);
  while (first_with_me && next.ok() && !next->PlaceOf(elastic.slot)) {
    elastic.generation = next->number;
    next = rendezvous::WaitForGeneration(*elastic.store, elastic.generation + 1, elastic.timeout);
  }
  if (!next.ok()) {
    throw Error(internal::MakeMessage("the rank that started as rank ", elastic.slot,
                                      " found no generation of the elastic job after generation ",
                                      elastic.generation, ": ", next.status().message()));
  }
  std::optional<RankInfo> place = next->PlaceOf(elastic.slot);
  if (!place) {
    throw Error(internal::MakeMessage("slot ", elastic.slot, " is not a member of generation ",
                                      next->number, " of the elastic job"));
  }
  // From here on a failure waits for the generation after this one.
  elastic.generation = next->number;
  elastic.members.clear();
  for (const rendezvous::GenerationMember& member : next->members) {
    elastic.members.push_back(member.slot);
  }
  collectives::CommunicatorOptions options;
  options.name = internal::MakeMessage("world.g", next->number);
  options.interrupt = LosesMember(elastic.store, next->number, elastic.members);
  auto comm = std::make_unique<Communicator>(elastic.store, *place, options);
  (void)elastic.store->Set(
      internal::MakeMessage(rendezvous::GenerationJoinedPrefix(next->number), elastic.slot), "");
  return comm;
}

// Runtime is the process's one connection to the job. init() joins the job once; shutdown() stops
// the communication thread and forgets the process sets, but keeps the connections, so a later
// init() (as Horovod's test suite and elastic programs do) takes part again with the same rank.
// An elastic worker's init() after a failed collective, or after the job's membership changed,
// joins the job's next generation instead: a new rank and size, a new data plane.
class Runtime {
 public:
  static Runtime& Get() {
    static Runtime runtime;
    return runtime;
  }

  void Init() {
    if (thread_) return;
    {
      py::gil_scoped_release release;
      if (elastic_ && (!world_ || failed_ || world_->broken() || GenerationMoved())) {
        world_.reset();  // Closes the old data plane first.
        failed_ = false;
        world_ = JoinNextGeneration(*elastic_, /*first_with_me=*/false);
      } else if (!world_) {
        if (ElasticRequested()) {
          elastic_.emplace();
          world_ = JoinElastic(*elastic_);
        } else {
          world_ = Connect();
        }
      }
    }
    thread_ = std::make_unique<CommThread>(*world_, FusionBytes());
  }

  // NoteFailure: a collective failed with IoError or TimeoutError (of the world or a process set).
  void NoteFailure() { failed_ = true; }
  // generation is this worker's generation of an elastic job (0 otherwise, or before a change).
  int generation() const { return elastic_ ? elastic_->generation : 0; }
  // LatestGeneration is the job's newest generation (a store call; generation() when not
  // elastic).
  int LatestGeneration() {
    if (!elastic_) return 0;
    py::gil_scoped_release release;
    absl::StatusOr<int> latest = rendezvous::LatestGeneration(*elastic_->store);
    if (!latest.ok()) {
      throw IoError(internal::MakeMessage("cannot read the elastic job's generation: ",
                                          latest.status().message()));
    }
    return *latest;
  }

  // LatestGenerationAdds: the job's newest generation has a rank that this worker's generation
  // lacks (the job grew; its newcomers need the state, HostsUpdatedInterrupt's sync). A store call.
  bool LatestGenerationAdds() {
    if (!elastic_) return false;
    py::gil_scoped_release release;
    absl::StatusOr<int> latest = rendezvous::LatestGeneration(*elastic_->store);
    if (!latest.ok() || *latest <= elastic_->generation) return false;
    absl::StatusOr<std::vector<std::string>> text = elastic_->store->Get(
        {rendezvous::GenerationKey(*latest)}, std::chrono::milliseconds(10000));
    if (!text.ok()) {
      throw IoError(internal::MakeMessage("cannot read the elastic job's generation ", *latest,
                                          ": ", text.status().message()));
    }
    absl::StatusOr<rendezvous::Generation> next =
        rendezvous::Generation::Decode(*latest, (*text)[0]);
    if (!next.ok()) throw IoError(std::string(next.status().message()));
    for (const rendezvous::GenerationMember& member : next->members) {
      if (std::find(elastic_->members.begin(), elastic_->members.end(), member.slot) ==
          elastic_->members.end()) {
        return true;
      }
    }
    return false;
  }

  void Shutdown() {
    if (!thread_) return;
    ForgetFastHandles();
    py::gil_scoped_release release;
    thread_.reset();  // Finishes what was submitted.
    sets_.clear();
    next_set_ = 1;
  }

  bool initialized() const { return thread_ != nullptr && !forked_; }

  CommThread& thread() {
    if (forked_) {
      throw Error(
          "trainrun cannot be used in a process forked after trainrun.init() (e.g. a DataLoader "
          "worker); only the rank's own process takes part in collectives");
    }
    if (!thread_) {
      throw Error("trainrun is not initialized; call trainrun.init() first");
    }
    return *thread_;
  }

  // AbandonAfterFork runs in the child of a fork(): the communication thread does not exist there,
  // so the child must never join or destroy it; it leaks it instead (the parent still owns it).
  void AbandonAfterFork() {
    if (thread_ || world_) {
      (void)thread_.release();
      (void)world_.release();
      for (auto& [id, set] : sets_) (void)set.release();
      forked_ = true;
    }
  }

  const RankInfo& info() { return thread().comm().info(); }

 private:
  bool GenerationMoved() {
    absl::StatusOr<int> latest = rendezvous::LatestGeneration(*elastic_->store);
    return latest.ok() && *latest > elastic_->generation;
  }

 public:
  // AddProcessSet registers the ranks `ranks` (ascending) as the next process set and returns its
  // id; every rank of the job calls it, members get a communicator over the world's connections.
  int AddProcessSet(const std::vector<int>& ranks) {
    thread();
    const int id = next_set_++;
    std::unique_ptr<Communicator> comm;
    if (std::binary_search(ranks.begin(), ranks.end(), world_->rank())) {
      comm = world_->Subset(ranks, internal::MakeMessage("process set ", id));
    }
    sets_[id] = std::move(comm);
    return id;
  }

  void RemoveProcessSet(int id) {
    CommThread& comm_thread = thread();
    if (id == 0) throw InvalidArgumentError("the global process set (id 0) cannot be removed");
    auto it = sets_.find(id);
    if (it == sets_.end()) {
      throw InvalidArgumentError(internal::MakeMessage("process set ", id, " does not exist"));
    }
    // Operations on the set may still be queued: let them finish before its communicator goes.
    const CommThread::Handle drained = comm_thread.Submit([](Communicator&) {});
    {
      py::gil_scoped_release release;
      while (!comm_thread.WaitFor(drained, std::chrono::milliseconds(100))) {
      }
    }
    sets_.erase(it);
  }

  // Set returns process set `id`'s communicator (0: the world). Throws when this rank is not in it.
  Communicator& Set(int id) {
    thread();
    if (id == 0) return *world_;
    auto it = sets_.find(id);
    if (it == sets_.end()) {
      throw InvalidArgumentError(internal::MakeMessage(
          "process set ", id, " does not exist (removed, or made before the last shutdown())"));
    }
    if (!it->second) {
      throw InvalidArgumentError(internal::MakeMessage("rank ", world_->rank(),
                                                       " is not a member of process set ", id,
                                                       "; only its members may use it"));
    }
    return *it->second;
  }

 private:
  std::unique_ptr<Communicator> world_;
  std::map<int, std::unique_ptr<Communicator>> sets_;  // null: this rank is not a member
  int next_set_ = 1;
  std::unique_ptr<CommThread> thread_;
  bool forked_ = false;
  std::optional<ElasticWorld> elastic_;
  bool failed_ = false;
};

DataType ToDataType(int code) {
  if (code < 0 || code >= collectives::kDataTypeCount) {
    throw InvalidArgumentError(internal::MakeMessage("unknown dtype code ", code));
  }
  return static_cast<DataType>(code);
}

void* ToPointer(uintptr_t address, size_t count) {
  if (address == 0 && count != 0) throw InvalidArgumentError("null buffer address");
  return reinterpret_cast<void*>(address);
}

// Wait blocks until job `handle` has finished, without the GIL, checking for Ctrl-C now and then.
void Wait(CommThread::Handle handle) {
  CommThread& thread = Runtime::Get().thread();
  // A job already done (the 199 others of a fused batch) is collected without giving up the GIL.
  bool first = true;
  while (true) {
    try {
      if (first) {
        if (thread.TryCollect(handle)) return;
      } else {
        py::gil_scoped_release release;
        if (thread.WaitFor(handle, kSignalCheckInterval)) return;
      }
    } catch (const IoError&) {
      Runtime::Get().NoteFailure();
      throw;
    } catch (const TimeoutError&) {
      Runtime::Get().NoteFailure();
      throw;
    }
    if (!first && PyErr_CheckSignals() != 0) throw py::error_already_set();
    first = false;
  }
}

// Submit queues `job` for process set `set` (checked now, so a bad set fails at the call).
CommThread::Handle Submit(int set, std::function<void(Communicator&)> job) {
  Communicator* comm = &Runtime::Get().Set(set);
  return Runtime::Get().thread().Submit(
      [comm, job = std::move(job)](Communicator&) { job(*comm); });
}

CallCheck MakeCheck(std::string name, std::optional<std::vector<int64_t>> shape) {
  CallCheck check;
  check.name = std::move(name);
  if (shape) {
    check.has_shape = true;
    check.shape = std::move(*shape);
  }
  return check;
}

std::vector<size_t> ToCounts(const std::vector<int64_t>& counts, const char* what) {
  std::vector<size_t> out;
  for (int64_t c : counts) {
    if (c < 0) throw InvalidArgumentError(internal::MakeMessage(what, " has a negative count"));
    out.push_back(static_cast<size_t>(c));
  }
  return out;
}

// NewException makes a Python exception class `trainrun.<name>` deriving from `bases`.
py::object NewException(py::module_& m, const char* name, py::tuple bases) {
  std::string qualified = std::string("trainrun.") + name;
  py::object type = py::reinterpret_steal<py::object>(
      PyErr_NewException(qualified.c_str(), bases.ptr(), nullptr));
  if (!type) throw py::error_already_set();
  m.attr(name) = type;
  return type;
}

// The Python exception classes of the library's errors (kept alive by the module's attributes).
struct ErrorTypes {
  PyObject* error = nullptr;
  PyObject* io_error = nullptr;
  PyObject* timeout_error = nullptr;
  PyObject* invalid_argument_error = nullptr;
  PyObject* mismatch_error = nullptr;
};
ErrorTypes error_types;

// SetPythonError sets the Python error for a library exception (what the module's exception
// translator does for pybind11's functions; the fast calls use it directly).
void SetPythonError(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const IoError& e) {
    PyErr_SetString(error_types.io_error, e.what());
  } catch (const TimeoutError& e) {
    PyErr_SetString(error_types.timeout_error, e.what());
  } catch (const MismatchError& e) {
    PyErr_SetString(error_types.mismatch_error, e.what());
  } catch (const InvalidArgumentError& e) {
    PyErr_SetString(error_types.invalid_argument_error, e.what());
  } catch (const Error& e) {
    PyErr_SetString(error_types.error, e.what());
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
}

void RegisterExceptions(py::module_& m) {
  py::object base = NewException(m, "Error", py::make_tuple(py::handle(PyExc_RuntimeError)));
  error_types.error = base.ptr();
  // InternalError: the job's communication failed (a peer died or stalled); what Horovod calls
  // HorovodInternalError, which elastic training catches to restart.
  py::object internal_error = NewException(m, "InternalError", py::make_tuple(base));
  error_types.io_error = NewException(m, "IoError", py::make_tuple(internal_error)).ptr();
  error_types.timeout_error = NewException(m, "TimeoutError", py::make_tuple(internal_error)).ptr();
  py::object invalid =
      NewException(m, "InvalidArgumentError", py::make_tuple(base, py::handle(PyExc_ValueError)));
  error_types.invalid_argument_error = invalid.ptr();
  error_types.mismatch_error = NewException(m, "MismatchError", py::make_tuple(invalid)).ptr();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error&) {
      SetPythonError(std::current_exception());
    }
  });
}

}  // namespace
}  // namespace trainrun::python

PYBIND11_MODULE(_core, m) {
  using namespace trainrun::python;  // NOLINT: the module body names its own helpers
  using trainrun::collectives::DataType;
  using trainrun::collectives::ReduceOp;
  m.doc() = "trainrun's collectives on raw buffers; use the trainrun package, not this module.";
  RegisterExceptions(m);
  pthread_atfork(nullptr, nullptr, [] { Runtime::Get().AbandonAfterFork(); });

  py::enum_<ReduceOp>(m, "ReduceOp", py::arithmetic(), "Reduction of allreduce.")
      .value("Sum", ReduceOp::kSum)
      .value("Average", ReduceOp::kAverage, "sum / size (integers: truncating division)")
      .value("Min", ReduceOp::kMin)
      .value("Max", ReduceOp::kMax)
      .value("Product", ReduceOp::kProduct);
  AddFastCalls(m,
               FastCallHooks{
                   []() -> CommThread& { return Runtime::Get().thread(); },
                   []() -> trainrun::collectives::Communicator& { return Runtime::Get().Set(0); },
                   [](CommThread::Handle h) { Wait(h); },
                   [](std::exception_ptr p) { SetPythonError(p); },
               });

  m.def(
      "dtypes",
      [] {
        py::dict codes;
        for (int code = 0; code < trainrun::collectives::kDataTypeCount; ++code) {
          codes[trainrun::collectives::DataTypeName(static_cast<DataType>(code))] = code;
        }
        return codes;
      },
      "Element type names the library supports, with their codes.");

  m.def(
      "init", [] { Runtime::Get().Init(); },
      "Joins the job (see trainrun.init); a no-op when already initialized.");
  m.def(
      "shutdown", [] { Runtime::Get().Shutdown(); },
      "Finishes pending operations and stops; init() may follow (the connections stay open).");
  m.def("is_initialized", [] { return Runtime::Get().initialized(); });
  m.def(
      "generation", [] { return Runtime::Get().generation(); },
      "This worker's generation of an elastic job (0 before any membership change).");
  m.def(
      "latest_generation", [] { return Runtime::Get().LatestGeneration(); },
      "The elastic job's newest generation, asked of the launcher (0 when not elastic).");
  m.def(
      "latest_generation_adds", [] { return Runtime::Get().LatestGenerationAdds(); },
      "Whether the elastic job's newest generation has a rank this worker's generation lacks.");
  m.def(
      "rank", [] { return Runtime::Get().info().rank; }, "This process's global rank.");
  m.def(
      "size", [] { return Runtime::Get().info().size; }, "Number of ranks in the job.");
  m.def(
      "local_rank", [] { return Runtime::Get().info().local_rank; }, "Rank on this host.");
  m.def(
      "local_size", [] { return Runtime::Get().info().local_size; }, "Ranks on this host.");
  m.def(
      "cross_rank", [] { return Runtime::Get().info().cross_rank; },
      "Index of this host among hosts with this local_rank.");
  m.def(
      "cross_size", [] { return Runtime::Get().info().cross_size; },
      "Number of hosts with this local_rank.");

  // Every collective is queued on the communication thread and returns a handle for wait() and
  // poll(). `set` is a process set id (0: every rank); `name` and `shape` join the agreement check
  // (shape None: not checked beyond the count). Buffers must stay alive until wait() returns.
  m.def(
      "allreduce_async",
      [](uintptr_t input, uintptr_t output, size_t count, int dtype, ReduceOp op, int set,
         std::string name, std::optional<std::vector<int64_t>> shape, bool prompt) {
        const void* in = ToPointer(input, count);
        void* out = ToPointer(output, count);
        DataType type = ToDataType(dtype);
        CallCheck check = MakeCheck(std::move(name), std::move(shape));
        if (in == out) {  // in place: may be fused with the allreduces queued next to it
          Communicator* comm = &Runtime::Get().Set(set);
          return Runtime::Get().thread().SubmitAllreduce(
              {comm, out, count, type, op, std::move(check)}, prompt);
        }
        return Submit(set, [=](Communicator& c) { c.Allreduce(in, out, count, type, op, check); });
      },
      py::arg("input"), py::arg("output"), py::arg("count"), py::arg("dtype"), py::arg("op"),
      py::arg("set") = 0, py::arg("name") = "", py::arg("shape") = py::none(),
      py::arg("prompt") = false);
  // One allreduce of several buffers of one type, in place, without concatenating them where the
  // transport can (grouped_allreduce).
  m.def(
      "grouped_allreduce_async",
      [](std::vector<uintptr_t> addresses, std::vector<int64_t> counts, int dtype, ReduceOp op,
         int set, std::string name, std::optional<std::vector<int64_t>> shape) {
        if (addresses.size() != counts.size()) {
          throw trainrun::InvalidArgumentError(
              trainrun::internal::MakeMessage("grouped allreduce got ", addresses.size(),
                                              " buffers and ", counts.size(), " counts"));
        }
        std::vector<size_t> n = ToCounts(counts, "grouped allreduce");
        std::vector<Communicator::Buffer> buffers;
        for (size_t i = 0; i < n.size(); ++i) {
          buffers.push_back({ToPointer(addresses[i], n[i]), n[i]});
        }
        DataType type = ToDataType(dtype);
        CallCheck check = MakeCheck(std::move(name), std::move(shape));
        return Submit(set, [=](Communicator& c) { c.GroupedAllreduce(buffers, type, op, check); });
      },
      py::arg("addresses"), py::arg("counts"), py::arg("dtype"), py::arg("op"), py::arg("set") = 0,
      py::arg("name") = "", py::arg("shape") = py::none());
  m.def(
      "broadcast_async",
      [](uintptr_t address, size_t count, int dtype, int root, int set, std::string name,
         std::optional<std::vector<int64_t>> shape) {
        void* data = ToPointer(address, count);
        DataType type = ToDataType(dtype);
        CallCheck check = MakeCheck(std::move(name), std::move(shape));
        return Submit(set, [=](Communicator& c) { c.Broadcast(data, count, type, root, check); });
      },
      py::arg("address"), py::arg("count"), py::arg("dtype"), py::arg("root"), py::arg("set") = 0,
      py::arg("name") = "", py::arg("shape") = py::none());
  m.def(
      "allgatherv_async",
      [](uintptr_t input, uintptr_t output, std::vector<int64_t> counts, int dtype, int set,
         std::string name, std::optional<std::vector<int64_t>> shape) {
        std::vector<size_t> n = ToCounts(counts, "allgather");
        size_t total = 0;
        for (size_t c : n) total += c;
        const void* in = ToPointer(input, total);
        void* out = ToPointer(output, total);
        DataType type = ToDataType(dtype);
        CallCheck check = MakeCheck(std::move(name), std::move(shape));
        return Submit(set, [=](Communicator& c) { c.Allgatherv(in, out, n, type, check); });
      },
      py::arg("input"), py::arg("output"), py::arg("counts"), py::arg("dtype"), py::arg("set") = 0,
      py::arg("name") = "", py::arg("shape") = py::none());
  m.def(
      "reducescatter_async",
      [](uintptr_t input, uintptr_t output, size_t count, int dtype, ReduceOp op, int set,
         std::string name, std::optional<std::vector<int64_t>> shape) {
        const void* in = ToPointer(input, count);
        void* out = ToPointer(output, count);
        DataType type = ToDataType(dtype);
        CallCheck check = MakeCheck(std::move(name), std::move(shape));
        return Submit(set,
                      [=](Communicator& c) { c.ReduceScatter(in, out, count, type, op, check); });
      },
      py::arg("input"), py::arg("output"), py::arg("count"), py::arg("dtype"), py::arg("op"),
      py::arg("set") = 0, py::arg("name") = "", py::arg("shape") = py::none());
  m.def(
      "alltoallv_async",
      [](uintptr_t input, std::vector<int64_t> send_counts, uintptr_t output,
         std::vector<int64_t> recv_counts, int dtype, int set, std::string name,
         std::optional<std::vector<int64_t>> shape) {
        std::vector<size_t> sends = ToCounts(send_counts, "alltoall splits");
        std::vector<size_t> recvs = ToCounts(recv_counts, "alltoall received splits");
        size_t sent = 0;
        size_t received = 0;
        for (size_t c : sends) sent += c;
        for (size_t c : recvs) received += c;
        const void* in = ToPointer(input, sent);
        void* out = ToPointer(output, received);
        DataType type = ToDataType(dtype);
        CallCheck check = MakeCheck(std::move(name), std::move(shape));
        return Submit(set,
                      [=](Communicator& c) { c.Alltoallv(in, sends, out, recvs, type, check); });
      },
      py::arg("input"), py::arg("send_counts"), py::arg("output"), py::arg("recv_counts"),
      py::arg("dtype"), py::arg("set") = 0, py::arg("name") = "", py::arg("shape") = py::none());
  m.def(
      "barrier_async", [](int set) { return Submit(set, [](Communicator& c) { c.Barrier(); }); },
      py::arg("set") = 0);
  m.def(
      "join",
      [] {
        auto last = std::make_shared<int>(-1);
        Wait(Submit(0, [last](Communicator& c) { *last = c.Join(); }));
        return *last;
      },
      "Takes part in the other ranks' allreduces with zeros until every rank has joined; returns "
      "the last rank to join.");
  m.def(
      "start_timeline",
      [](std::string path) { Wait(Submit(0, [path](Communicator& c) { c.StartTimeline(path); })); },
      py::arg("path"),
      "Records a Chrome trace of later collectives to path (in order with them on every rank).");
  m.def(
      "stop_timeline", [] { Wait(Submit(0, [](Communicator& c) { c.StopTimeline(); })); },
      "Stops recording the timeline.");
  m.def(
      "add_process_set", [](std::vector<int> ranks) { return Runtime::Get().AddProcessSet(ranks); },
      py::arg("ranks"), "Registers a process set (every rank calls it alike); returns its id.");
  m.def(
      "remove_process_set", [](int id) { Runtime::Get().RemoveProcessSet(id); }, py::arg("id"));
  m.def(
      "set_rank", [](int id) { return Runtime::Get().Set(id).rank(); }, py::arg("id"),
      "This rank's index in process set `id`.");
  m.def(
      "set_size", [](int id) { return Runtime::Get().Set(id).size(); }, py::arg("id"));
  m.def(
      "poll", [](CommThread::Handle h) { return Runtime::Get().thread().Done(h); },
      py::arg("handle"), "Whether the operation `handle` has finished.");
  m.def("wait", &Wait, py::arg("handle"),
        "Waits for the operation `handle`; raises its error if it failed.");
}
