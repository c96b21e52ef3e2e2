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

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "comm_thread.h"
#include "trainrun/collectives/communicator.h"
#include "trainrun/collectives/errors.h"
#include "trainrun/collectives/types.h"
#include "trainrun/rendezvous/environment.h"
#include "trainrun/rendezvous/file_store.h"
#include "trainrun/rendezvous/memory_store.h"

namespace py = pybind11;

namespace trainrun::python {
namespace {

using collectives::Communicator;
using collectives::DataType;
using collectives::RankInfo;
using collectives::ReduceOp;

constexpr int kDataTypeCount = 8;  // DataType's values are 0 .. kDataTypeCount - 1.
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

// Runtime is the process's one connection to the job, between init() and shutdown().
class Runtime {
 public:
  static Runtime& Get() {
    static Runtime runtime;
    return runtime;
  }

  void Init() {
    if (thread_) return;
    // A rank joins its job once (the rendezvous refuses a second join of the same rank).
    if (shut_down_) {
      throw Error(
          "trainrun.init() was called after trainrun.shutdown(); a process joins its job once, so "
          "call shutdown() only when it is done with collectives");
    }
    std::unique_ptr<Communicator> comm;
    {
      py::gil_scoped_release release;
      comm = Connect();
    }
    thread_ = std::make_unique<CommThread>(std::move(comm));
  }

  void Shutdown() {
    if (!thread_) return;
    shut_down_ = true;
    py::gil_scoped_release release;
    thread_.reset();  // Finishes what was submitted, then closes the connections.
  }

  bool initialized() const { return thread_ != nullptr; }

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
    if (thread_) {
      (void)thread_.release();
      forked_ = true;
    }
  }

  const RankInfo& info() { return thread().comm().info(); }

 private:
  std::unique_ptr<CommThread> thread_;
  bool shut_down_ = false;
  bool forked_ = false;
};

DataType ToDataType(int code) {
  if (code < 0 || code >= kDataTypeCount) {
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
  while (true) {
    {
      py::gil_scoped_release release;
      if (thread.WaitFor(handle, kSignalCheckInterval)) return;
    }
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

CommThread::Handle Submit(CommThread::Job job) {
  return Runtime::Get().thread().Submit(std::move(job));
}

void Run(CommThread::Job job) { Wait(Submit(std::move(job))); }

CommThread::Job AllreduceJob(uintptr_t address, size_t count, int dtype, ReduceOp op) {
  void* data = ToPointer(address, count);
  DataType type = ToDataType(dtype);
  return [=](Communicator& c) { c.Allreduce(data, count, type, op); };
}

CommThread::Job BroadcastJob(uintptr_t address, size_t count, int dtype, int root) {
  void* data = ToPointer(address, count);
  DataType type = ToDataType(dtype);
  return [=](Communicator& c) { c.Broadcast(data, count, type, root); };
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

void RegisterExceptions(py::module_& m) {
  // Kept alive by the module's attributes for as long as the translator can run.
  static PyObject* error = nullptr;
  static PyObject* io_error = nullptr;
  static PyObject* timeout_error = nullptr;
  static PyObject* invalid_argument_error = nullptr;
  py::object base = NewException(m, "Error", py::make_tuple(py::handle(PyExc_RuntimeError)));
  error = base.ptr();
  io_error = NewException(m, "IoError", py::make_tuple(base)).ptr();
  timeout_error = NewException(m, "TimeoutError", py::make_tuple(base)).ptr();
  invalid_argument_error =
      NewException(m, "InvalidArgumentError", py::make_tuple(base, py::handle(PyExc_ValueError)))
          .ptr();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const IoError& e) {
      PyErr_SetString(io_error, e.what());
    } catch (const TimeoutError& e) {
      PyErr_SetString(timeout_error, e.what());
    } catch (const InvalidArgumentError& e) {
      PyErr_SetString(invalid_argument_error, e.what());
    } catch (const Error& e) {
      PyErr_SetString(error, e.what());
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

  m.def(
      "dtypes",
      [] {
        py::dict codes;
        for (int code = 0; code < kDataTypeCount; ++code) {
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
      "Finishes pending operations and leaves the job (for good: no init() after it).");
  m.def("is_initialized", [] { return Runtime::Get().initialized(); });
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

  m.def(
      "allreduce",
      [](uintptr_t address, size_t count, int dtype, ReduceOp op) {
        Run(AllreduceJob(address, count, dtype, op));
      },
      py::arg("address"), py::arg("count"), py::arg("dtype"), py::arg("op"),
      "Reduces count elements at address in place; returns when done.");
  m.def(
      "allreduce_async",
      [](uintptr_t address, size_t count, int dtype, ReduceOp op) {
        return Submit(AllreduceJob(address, count, dtype, op));
      },
      py::arg("address"), py::arg("count"), py::arg("dtype"), py::arg("op"),
      "Starts an in-place allreduce; returns a handle for wait() and poll().");
  m.def(
      "broadcast",
      [](uintptr_t address, size_t count, int dtype, int root) {
        Run(BroadcastJob(address, count, dtype, root));
      },
      py::arg("address"), py::arg("count"), py::arg("dtype"), py::arg("root"));
  m.def(
      "broadcast_async",
      [](uintptr_t address, size_t count, int dtype, int root) {
        return Submit(BroadcastJob(address, count, dtype, root));
      },
      py::arg("address"), py::arg("count"), py::arg("dtype"), py::arg("root"));
  m.def(
      "allgather",
      [](uintptr_t input, uintptr_t output, size_t count, int dtype) {
        const void* in = ToPointer(input, count);
        void* out = ToPointer(output, count);
        DataType type = ToDataType(dtype);
        Run([=](trainrun::collectives::Communicator& c) { c.Allgather(in, out, count, type); });
      },
      py::arg("input"), py::arg("output"), py::arg("count"), py::arg("dtype"),
      "Gathers count elements from every rank, in rank order, into output.");
  m.def(
      "barrier", [] { Run([](trainrun::collectives::Communicator& c) { c.Barrier(); }); },
      "Returns once every rank has called barrier().");
  m.def(
      "poll", [](CommThread::Handle h) { return Runtime::Get().thread().Done(h); },
      py::arg("handle"), "Whether the operation `handle` has finished.");
  m.def("wait", &Wait, py::arg("handle"),
        "Waits for the operation `handle`; raises its error if it failed.");
}
