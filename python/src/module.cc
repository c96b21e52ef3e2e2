// trainrun._core: the C++ half of the Python package (python/trainrun/ is the other half).
//
// It binds the process's Runtime (collectives/runtime.h: joining, the elastic session, the
// communication thread), and exposes collectives on raw addresses: Python passes (address, count,
// dtype code, and for a GPU buffer its device and stream) taken from a NumPy array, a torch tensor
// or a CUDA Array Interface or DLPack object, so contiguous buffers are never copied and this file
// needs neither NumPy nor torch (gpu_calls.h binds what GPU buffers need besides). Every wait
// releases the GIL and wakes up regularly to let Ctrl-C through. Library exceptions become
// trainrun.Error and its subclasses, with the library's message.
#include <pthread.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fast_calls.h"
#include "gpu_calls.h"
#include "trainrun/collectives/comm_thread.h"
#include "trainrun/collectives/communicator.h"
#include "trainrun/collectives/errors.h"
#include "trainrun/collectives/runtime.h"
#include "trainrun/collectives/types.h"
#include "trainrun/rendezvous/environment.h"

namespace py = pybind11;

namespace trainrun::python {
namespace {

using collectives::CallCheck;
using collectives::CommThread;
using collectives::Communicator;
using collectives::DataType;
using collectives::ReduceOp;
using collectives::Runtime;
using collectives::TensorRef;

// How often a wait lets Python run its signal handlers (Ctrl-C).
constexpr auto kSignalCheckInterval = std::chrono::milliseconds(100);

// TheRuntime is the process's one Runtime (collectives/runtime.h): its connection to the job.
Runtime& TheRuntime() {
  static Runtime runtime;
  return runtime;
}

DataType ToDataType(int code) {
  if (code < 0 || code >= collectives::kDataTypeCount) {
    throw InvalidArgumentError(internal::MakeMessage("unknown dtype code ", code));
  }
  return static_cast<DataType>(code);
}

// Ref is the TensorRef of `count` elements of dtype code `dtype` at `address`: in host memory
// when `device` is -1, else on CUDA device `device`, ordered on `stream` (a cudaStream_t value, as
// PyTorch's cuda_stream and the CUDA Array Interface give it).
TensorRef Ref(uintptr_t address, size_t count, int dtype, int device = -1, uintptr_t stream = 0) {
  TensorRef ref;
  ref.data = reinterpret_cast<void*>(address);
  ref.count = count;
  ref.type = ToDataType(dtype);
  if (device >= 0) {
    ref.device = collectives::DeviceKind::kCuda;
    ref.device_index = device;
    ref.stream = reinterpret_cast<void*>(stream);
  }
  return ref;
}

// Wait blocks until job `handle` has finished, without the GIL, checking for Ctrl-C now and then.
void Wait(CommThread::Handle handle) {
  Runtime& runtime = TheRuntime();
  // A job already done (the 199 others of a fused batch) is collected without giving up the GIL.
  if (runtime.TryCollect(handle)) return;
  while (true) {
    {
      py::gil_scoped_release release;
      if (runtime.WaitFor(handle, kSignalCheckInterval)) return;
    }
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

// Released runs `f` without the GIL (joining, store calls, draining the queue).
template <typename F>
auto Released(F f) {
  py::gil_scoped_release release;
  return f();
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

// GatherResult is what a grouped allgather gathered (GroupedAllgather): every rank's first
// dimension of each tensor, and each tensor's gathered bytes, until Python copies them into
// tensors of the shape they turned out to have.
struct GatherResult {
  size_t tensors = 0;
  std::vector<int64_t> rows;  // rows[r * tensors + i]: rank r's first dimension of tensor i
  std::vector<std::vector<char>> gathered;
};

// GroupedAllgather queues, as one collective named `name`, the allgather of tensors whose first
// dimensions may differ between ranks: the ranks first exchange their first dimensions, then
// gather each tensor; so the whole operation is matched by its name (comm_thread.h) like any
// other, and nothing is waited for at the call.
py::tuple GroupedAllgather(std::vector<uintptr_t> addresses, std::vector<int64_t> rows,
                           std::vector<int64_t> row_elements, std::vector<int> dtypes, int set,
                           std::string name, std::vector<std::vector<int64_t>> shapes) {
  const size_t k = addresses.size();
  if (rows.size() != k || row_elements.size() != k || dtypes.size() != k || shapes.size() != k) {
    throw InvalidArgumentError(
        "grouped allgather: one address, row count, row size, dtype and "
        "shape per tensor");
  }
  std::vector<DataType> types;
  for (int code : dtypes) types.push_back(ToDataType(code));
  Runtime& runtime = TheRuntime();
  auto result = std::make_shared<GatherResult>();
  result->tensors = k;
  const size_t n = static_cast<size_t>(runtime.Set(set).size());
  const CommThread::Handle handle = runtime.SubmitNamed(
      set, name,
      [=, rows = std::move(rows), row_elements = std::move(row_elements),
       shapes = std::move(shapes)](Communicator& c) {
        CallCheck sizes;
        sizes.name = name;
        sizes.has_shape = true;
        sizes.shape = {static_cast<int64_t>(k)};
        result->rows.assign(n * k, 0);
        c.Allgather(rows.data(), result->rows.data(), k, DataType::kInt64, sizes);
        result->gathered.resize(k);
        for (size_t i = 0; i < k; ++i) {
          std::vector<size_t> counts(n);
          size_t total = 0;
          for (size_t r = 0; r < n; ++r) {
            counts[r] =
                static_cast<size_t>(result->rows[r * k + i]) * static_cast<size_t>(row_elements[i]);
            total += counts[r];
          }
          result->gathered[i].resize(total * collectives::ElementSize(types[i]));
          CallCheck check;
          check.name = name;
          check.has_shape = true;
          check.shape = shapes[i];
          c.Allgatherv(reinterpret_cast<const void*>(addresses[i]), result->gathered[i].data(),
                       counts, types[i], check);
        }
      });
  return py::make_tuple(handle, py::cast(result));
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
  pthread_atfork(nullptr, nullptr, [] { TheRuntime().AbandonAfterFork(); });

  py::enum_<ReduceOp>(m, "ReduceOp", py::arithmetic(), "Reduction of allreduce.")
      .value("Sum", ReduceOp::kSum)
      .value("Average", ReduceOp::kAverage, "sum / size (integers: truncating division)")
      .value("Min", ReduceOp::kMin)
      .value("Max", ReduceOp::kMax)
      .value("Product", ReduceOp::kProduct)
      .value("Adasum", ReduceOp::kAdasum,
             "Adasum (Horovod's): orthogonal vectors add, parallel ones average; allreduce of "
             "floating-point tensors only");
  AddFastCalls(m, FastCallHooks{
                      []() -> CommThread& { return TheRuntime().thread(); },
                      []() -> trainrun::collectives::Communicator& { return TheRuntime().world(); },
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
      "int_setting",
      [](const std::string& name) {
        const trainrun::env::SettingRef* setting = trainrun::env::FindSetting(name);
        if (setting == nullptr || setting->int_setting == nullptr) {
          throw trainrun::InvalidArgumentError(name + " is not an integer setting");
        }
        try {
          return setting->int_setting->Get();
        } catch (const trainrun::env::BadSetting& e) {
          throw trainrun::InvalidArgumentError(e.what());
        }
      },
      py::arg("name"),
      "The value of an integer setting (rendezvous/environment.h) as the library reads it.");
  m.def(
      "string_setting",
      [](const std::string& name) {
        const trainrun::env::SettingRef* setting = trainrun::env::FindSetting(name);
        if (setting == nullptr || setting->string_setting == nullptr) {
          throw trainrun::InvalidArgumentError(name + " is not a text setting");
        }
        try {
          return setting->string_setting->Get();
        } catch (const trainrun::env::BadSetting& e) {
          throw trainrun::InvalidArgumentError(e.what());
        }
      },
      py::arg("name"),
      "The value of a text setting (rendezvous/environment.h) as the library reads it.");
  m.def(
      "init", [] { Released([] { TheRuntime().Init(); }); },
      "Joins the job (see trainrun.init); a no-op when already initialized.");
  m.def(
      "shutdown",
      [] {
        if (!TheRuntime().initialized()) return;
        ForgetFastHandles();
        Released([] { TheRuntime().Shutdown(); });
      },
      "Finishes pending operations and stops; init() may follow (the connections stay open).");
  m.def("is_initialized", [] { return TheRuntime().initialized(); });
  m.def(
      "generation", [] { return TheRuntime().generation(); },
      "This worker's generation of an elastic job (0 before any membership change).");
  m.def(
      "latest_generation", [] { return Released([] { return TheRuntime().LatestGeneration(); }); },
      "The elastic job's newest generation, asked of the launcher (0 when not elastic).");
  m.def(
      "latest_generation_adds",
      [] { return Released([] { return TheRuntime().LatestGenerationAdds(); }); },
      "Whether the elastic job's newest generation has a rank this worker's generation lacks.");
  m.def(
      "rank", [] { return TheRuntime().info().rank; }, "This process's global rank.");
  m.def(
      "size", [] { return TheRuntime().info().size; }, "Number of ranks in the job.");
  m.def(
      "local_rank", [] { return TheRuntime().info().local_rank; }, "Rank on this host.");
  m.def(
      "local_size", [] { return TheRuntime().info().local_size; }, "Ranks on this host.");
  m.def(
      "cross_rank", [] { return TheRuntime().info().cross_rank; },
      "Index of this host among hosts with this local_rank.");
  m.def(
      "cross_size", [] { return TheRuntime().info().cross_size; },
      "Number of hosts with this local_rank.");

  // Every collective is queued on the communication thread and returns a handle for wait() and
  // poll(). `set` is a process set id (0: every rank); `name` and `shape` join the agreement check
  // (shape None: not checked beyond the count). Buffers must stay alive until wait() returns.
  m.def(
      "allreduce_async",
      [](uintptr_t input, uintptr_t output, size_t count, int dtype, ReduceOp op, int set,
         std::string name, std::optional<std::vector<int64_t>> shape, bool prompt, int device,
         uintptr_t stream, double prescale, double postscale) {
        return TheRuntime().Allreduce(
            Ref(input, count, dtype, device, stream), Ref(output, count, dtype, device, stream), op,
            set, MakeCheck(std::move(name), std::move(shape)), prompt, prescale, postscale);
      },
      py::arg("input"), py::arg("output"), py::arg("count"), py::arg("dtype"), py::arg("op"),
      py::arg("set") = 0, py::arg("name") = "", py::arg("shape") = py::none(),
      py::arg("prompt") = false, py::arg("device") = -1, py::arg("stream") = 0,
      py::arg("prescale") = 1.0, py::arg("postscale") = 1.0);
  // One allreduce of several buffers of one type, in place, without concatenating them where the
  // transport can (grouped_allreduce); `prescale` and `postscale` as allreduce_async's.
  m.def(
      "grouped_allreduce_async",
      [](std::vector<uintptr_t> addresses, std::vector<int64_t> counts, int dtype, ReduceOp op,
         int set, std::string name, std::optional<std::vector<int64_t>> shape, int device,
         uintptr_t stream, std::optional<std::string> match, double prescale, double postscale) {
        if (addresses.size() != counts.size()) {
          throw trainrun::InvalidArgumentError(
              trainrun::internal::MakeMessage("grouped allreduce got ", addresses.size(),
                                              " buffers and ", counts.size(), " counts"));
        }
        std::vector<size_t> n = ToCounts(counts, "grouped allreduce");
        std::vector<TensorRef> buffers;
        for (size_t i = 0; i < n.size(); ++i) {
          buffers.push_back(Ref(addresses[i], n[i], dtype, device, stream));
        }
        return TheRuntime().GroupedAllreduce(buffers, ToDataType(dtype), op, set,
                                             MakeCheck(std::move(name), std::move(shape)),
                                             match ? &*match : nullptr, prescale, postscale);
      },
      py::arg("addresses"), py::arg("counts"), py::arg("dtype"), py::arg("op"), py::arg("set") = 0,
      py::arg("name") = "", py::arg("shape") = py::none(), py::arg("device") = -1,
      py::arg("stream") = 0, py::arg("match") = py::none(), py::arg("prescale") = 1.0,
      py::arg("postscale") = 1.0);
  m.def(
      "broadcast_async",
      [](uintptr_t address, size_t count, int dtype, int root, int set, std::string name,
         std::optional<std::vector<int64_t>> shape, int device, uintptr_t stream) {
        return TheRuntime().Broadcast(Ref(address, count, dtype, device, stream), root, set,
                                      MakeCheck(std::move(name), std::move(shape)));
      },
      py::arg("address"), py::arg("count"), py::arg("dtype"), py::arg("root"), py::arg("set") = 0,
      py::arg("name") = "", py::arg("shape") = py::none(), py::arg("device") = -1,
      py::arg("stream") = 0);
  m.def(
      "allgatherv_async",
      [](uintptr_t input, uintptr_t output, std::vector<int64_t> counts, int dtype, int set,
         std::string name, std::optional<std::vector<int64_t>> shape, int device,
         uintptr_t stream) {
        std::vector<size_t> n = ToCounts(counts, "allgather");
        size_t total = 0;
        for (size_t c : n) total += c;
        return TheRuntime().Allgatherv(Ref(input, total, dtype, device, stream),
                                       Ref(output, total, dtype, device, stream), std::move(n), set,
                                       MakeCheck(std::move(name), std::move(shape)));
      },
      py::arg("input"), py::arg("output"), py::arg("counts"), py::arg("dtype"), py::arg("set") = 0,
      py::arg("name") = "", py::arg("shape") = py::none(), py::arg("device") = -1,
      py::arg("stream") = 0);
  py::class_<GatherResult, std::shared_ptr<GatherResult>>(m, "GatherResult")
      .def(
          "rows",
          [](const GatherResult& g, size_t i) {
            std::vector<int64_t> out;
            for (size_t r = 0; i < g.tensors && r * g.tensors + i < g.rows.size(); ++r) {
              out.push_back(g.rows[r * g.tensors + i]);
            }
            return out;
          },
          py::arg("i"), "Every rank's first dimension of tensor i (after the wait).")
      .def(
          "copy_to",
          [](const GatherResult& g, size_t i, uintptr_t address) {
            if (i >= g.gathered.size())
              throw trainrun::InvalidArgumentError("no such gathered tensor");
            if (!g.gathered[i].empty()) {
              std::memcpy(reinterpret_cast<void*>(address), g.gathered[i].data(),
                          g.gathered[i].size());
            }
          },
          py::arg("i"), py::arg("address"),
          "Copies tensor i's gathered elements to host memory at address.");
  m.def("grouped_allgather_async", &GroupedAllgather, py::arg("addresses"), py::arg("rows"),
        py::arg("row_elements"), py::arg("dtypes"), py::arg("set"), py::arg("name"),
        py::arg("shapes"),
        "Queues one allgather of host tensors whose first dimensions may differ between ranks; "
        "returns (handle, GatherResult).");
  m.def(
      "reducescatter_async",
      [](uintptr_t input, uintptr_t output, size_t count, int dtype, ReduceOp op, int set,
         std::string name, std::optional<std::vector<int64_t>> shape, int device,
         uintptr_t stream) {
        return TheRuntime().ReduceScatter(Ref(input, count, dtype, device, stream),
                                          Ref(output, count, dtype, device, stream), op, set,
                                          MakeCheck(std::move(name), std::move(shape)));
      },
      py::arg("input"), py::arg("output"), py::arg("count"), py::arg("dtype"), py::arg("op"),
      py::arg("set") = 0, py::arg("name") = "", py::arg("shape") = py::none(),
      py::arg("device") = -1, py::arg("stream") = 0);
  m.def(
      "alltoallv_async",
      [](uintptr_t input, std::vector<int64_t> send_counts, uintptr_t output,
         std::vector<int64_t> recv_counts, int dtype, int set, std::string name,
         std::optional<std::vector<int64_t>> shape, int device, uintptr_t stream) {
        std::vector<size_t> sends = ToCounts(send_counts, "alltoall splits");
        std::vector<size_t> recvs = ToCounts(recv_counts, "alltoall received splits");
        size_t sent = 0;
        size_t received = 0;
        for (size_t c : sends) sent += c;
        for (size_t c : recvs) received += c;
        return TheRuntime().Alltoallv(Ref(input, sent, dtype, device, stream), std::move(sends),
                                      Ref(output, received, dtype, device, stream),
                                      std::move(recvs), set,
                                      MakeCheck(std::move(name), std::move(shape)));
      },
      py::arg("input"), py::arg("send_counts"), py::arg("output"), py::arg("recv_counts"),
      py::arg("dtype"), py::arg("set") = 0, py::arg("name") = "", py::arg("shape") = py::none(),
      py::arg("device") = -1, py::arg("stream") = 0);
  m.def(
      "barrier_async", [](int set) { return TheRuntime().Barrier(set); }, py::arg("set") = 0);
  m.def(
      "refuse_async",
      [](int set, std::string collective, std::string name, std::optional<std::string> match) {
        return TheRuntime().Refuse(set, std::move(collective),
                                   MakeCheck(std::move(name), std::nullopt),
                                   match ? &*match : nullptr);
      },
      py::arg("set"), py::arg("collective"), py::arg("name") = "", py::arg("match") = py::none(),
      "Stands in for a collective this rank refused for its arguments, so that the ranks that "
      "made it raise MismatchError too (Communicator::Refuse).");
  m.def(
      "join",
      [] {
        auto last = std::make_shared<int>(-1);
        Wait(TheRuntime().Submit(0, [last](Communicator& c) { *last = c.Join(); }));
        return *last;
      },
      "Takes part in the other ranks' allreduces with zeros until every rank has joined; returns "
      "the last rank to join.");
  m.def(
      "start_timeline",
      [](std::string path) {
        Wait(TheRuntime().Submit(0, [path](Communicator& c) { c.StartTimeline(path); }));
      },
      py::arg("path"),
      "Records a Chrome trace of later collectives to path (in order with them on every rank).");
  m.def(
      "stop_timeline",
      [] { Wait(TheRuntime().Submit(0, [](Communicator& c) { c.StopTimeline(); })); },
      "Stops recording the timeline.");
  m.def(
      "add_process_set", [](std::vector<int> ranks) { return TheRuntime().AddProcessSet(ranks); },
      py::arg("ranks"), "Registers a process set (every rank calls it alike); returns its id.");
  m.def(
      "remove_process_set", [](int id) { Released([id] { TheRuntime().RemoveProcessSet(id); }); },
      py::arg("id"));
  m.def(
      "set_rank", [](int id) { return TheRuntime().Set(id).rank(); }, py::arg("id"),
      "This rank's index in process set `id`.");
  m.def(
      "set_size", [](int id) { return TheRuntime().Set(id).size(); }, py::arg("id"));
  m.def(
      "poll", [](CommThread::Handle h) { return TheRuntime().Done(h); }, py::arg("handle"),
      "Whether the operation `handle` has finished.");
  AddGpuCalls(m, []() -> Runtime& { return TheRuntime(); });
  m.def("wait", &Wait, py::arg("handle"),
        "Waits for the operation `handle`; raises its error if it failed.");
}
