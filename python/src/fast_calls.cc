#include "fast_calls.h"

#include <Python.h>

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "buffer_reader.h"

namespace trainrun::python {
namespace {

namespace py = pybind11;
using collectives::CallCheck;
using collectives::Communicator;
using collectives::DataType;
using collectives::ReduceOp;

// Pending is an operation a fast call started and synchronize has not yet collected.
struct Pending {
  // The communication thread's jobs: `first`, then `rest` (more element types of a grouped
  // allreduce; one allreduce_async_ has none, and allocates nothing for them).
  CommThread::Handle first = 0;
  std::vector<CommThread::Handle> rest;
  PyObject* result = nullptr;    // strong: what synchronize returns
  PyObject* name_key = nullptr;  // strong or null: its name, in the names in flight
};

// Arguments of allreduce_async_, by position or keyword (interned, for the usual keyword names
// of a call, which are interned too).
constexpr const char* kAllreduceArgs[] = {
    "tensor", "op", "name", "process_set", "prescale_factor", "postscale_factor"};
constexpr int kAllreduceArgCount = 6;

constexpr int kOps = 6;  // ReduceOp's values are 0 .. kOps - 1

// State is the fast calls' half of the module: never destroyed (it holds Python references).
struct State {
  FastCallHooks hooks;
  BufferReader reader;
  std::unordered_map<int64_t, Pending> pending;
  int64_t next_handle = 1;
  PyObject* ops[kOps] = {};                      // ReduceOp's members (trainrun.Sum, ...), by value
  PyObject* arg_names[kAllreduceArgCount] = {};  // kAllreduceArgs, interned
  // From bind(): trainrun's set of names in flight and the Python implementations.
  PyObject* names = nullptr;
  PyObject* allreduce_py = nullptr;
  PyObject* synchronize_py = nullptr;
  PyObject* poll_py = nullptr;
};

State& S() {
  static State& state = *new State;
  return state;
}

// CollectArgs places the call's arguments by position and keyword; false (no error set) for one it
// does not know or a duplicate: the Python implementation then raises Python's TypeError.
bool CollectArgs(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
                 PyObject* (&out)[kAllreduceArgCount]) {
  if (nargs > kAllreduceArgCount) return false;
  for (Py_ssize_t i = 0; i < nargs; ++i) out[i] = args[i];
  const Py_ssize_t keywords = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t k = 0; k < keywords; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    int slot = -1;
    for (int j = 0; j < kAllreduceArgCount && slot < 0; ++j) {
      if (key == S().arg_names[j]) slot = j;
    }
    for (int j = 0; j < kAllreduceArgCount && slot < 0; ++j) {
      if (PyUnicode_CompareWithASCIIString(key, kAllreduceArgs[j]) == 0) slot = j;
    }
    if (slot < 0 || out[slot] != nullptr) return false;
    out[slot] = args[nargs + k];
  }
  return out[0] != nullptr;
}

// ParseOp: None (Average) or one of ReduceOp's members; anything else goes the Python way.
bool ParseOp(PyObject* op, ReduceOp* out) {
  if (op == nullptr || op == Py_None) {
    *out = ReduceOp::kAverage;
    return true;
  }
  for (int i = 0; i < kOps; ++i) {
    if (S().ops[i] == op) {
      *out = static_cast<ReduceOp>(i);
      return true;
    }
  }
  return false;
}

// ParseName: None (no name) or a str.
bool ParseName(PyObject* name, std::string* out) {
  if (name == nullptr || name == Py_None) {
    out->clear();
    return true;
  }
  if (!PyUnicode_Check(name)) return false;
  Py_ssize_t size = 0;
  const char* text = PyUnicode_AsUTF8AndSize(name, &size);
  if (text == nullptr) {
    PyErr_Clear();
    return false;
  }
  out->assign(text, static_cast<size_t>(size));
  return true;
}

// IsOne: the scaling factor 1 (absent, 1.0 or 1), i.e. no scaling.
bool IsOne(PyObject* factor) {
  if (factor == nullptr) return true;
  if (PyFloat_CheckExact(factor)) return PyFloat_AS_DOUBLE(factor) == 1.0;
  if (PyLong_CheckExact(factor)) {
    int overflow = 0;
    return PyLong_AsLongAndOverflow(factor, &overflow) == 1 && overflow == 0;
  }
  return false;
}

// ClaimableKey returns a new reference to the key of `name` (a str) in the names in flight (for
// the whole job, the name itself: see trainrun/common/handles.py's _claim_name) when it is not in
// flight; null, with no error set, when there is nothing to claim (no name) or when it is in flight
// (`*in_flight` set: the Python way raises).
PyObject* ClaimableKey(PyObject* name, bool* in_flight) {
  *in_flight = false;
  if (name == nullptr || name == Py_None || PyUnicode_GET_LENGTH(name) == 0) return nullptr;
  const int found = PySet_Contains(S().names, name);
  if (found != 0) {
    if (found < 0) PyErr_Clear();
    *in_flight = true;
    return nullptr;
  }
  Py_INCREF(name);
  return name;
}

// Register records a started operation and returns its handle (a new reference to an int).
PyObject* Register(CommThread::Handle first, std::vector<CommThread::Handle> rest, PyObject* result,
                   PyObject* name_key) {
  State& s = S();
  if (name_key != nullptr && PySet_Add(s.names, name_key) != 0) PyErr_Clear();
  const int64_t handle = s.next_handle++;
  Py_INCREF(result);
  s.pending.emplace(handle, Pending{first, std::move(rest), result, name_key});
  return PyLong_FromLongLong(handle);
}

// Fails sets the Python error for the C++ exception being handled; returns null.
PyObject* Fail() {
  try {
    throw;
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (...) {
    S().hooks.set_error(std::current_exception());
  }
  return nullptr;
}

PyObject* AllreduceAsync(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargsf,
                         PyObject* kwnames) {
  State& s = S();
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  PyObject* a[kAllreduceArgCount] = {};
  ReduceOp op;
  std::string name;
  BufferView view;
  bool in_flight = false;
  PyObject* key = nullptr;
  if (s.allreduce_py == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "trainrun._core.bind() was not called");
    return nullptr;
  }
  const bool fast = CollectArgs(args, nargs, kwnames, a) && (a[3] == nullptr || a[3] == Py_None) &&
                    IsOne(a[4]) && IsOne(a[5]) && ParseOp(a[1], &op) && ParseName(a[2], &name) &&
                    s.reader.Read(a[0], /*writable=*/true, &view) &&
                    (view.data != nullptr || view.count == 0) &&
                    ((key = ClaimableKey(a[2], &in_flight)) != nullptr || !in_flight);
  if (!fast) return PyObject_Vectorcall(s.allreduce_py, args, nargs, kwnames);
  try {
    CommThread& thread = s.hooks.thread();
    Communicator* comm = &s.hooks.world();
    CallCheck check;
    check.name = std::move(name);
    check.has_shape = true;
    check.shape = std::move(view.shape);
    const CommThread::Handle core =
        thread.SubmitAllreduce({comm, view.data, view.count, view.type, op, std::move(check)});
    return Register(core, {}, a[0], key);
  } catch (...) {
    Py_XDECREF(key);
    return Fail();
  }
}

PyObject* Synchronize(PyObject* /*module*/, PyObject* handle) {
  State& s = S();
  auto it = PyLong_CheckExact(handle) ? s.pending.find(PyLong_AsLongLong(handle)) : s.pending.end();
  if (PyErr_Occurred()) PyErr_Clear();  // not a handle of ours: the Python way says so
  if (it == s.pending.end()) return PyObject_CallOneArg(s.synchronize_py, handle);
  Pending op = std::move(it->second);
  s.pending.erase(it);
  if (op.name_key != nullptr) {
    if (PySet_Discard(s.names, op.name_key) < 0) PyErr_Clear();
    Py_DECREF(op.name_key);
  }
  // Wait for all, then raise the first error; Ctrl-C at once.
  std::exception_ptr error;
  for (size_t i = 0; i <= op.rest.size(); ++i) {
    try {
      s.hooks.wait(i == 0 ? op.first : op.rest[i - 1]);
    } catch (py::error_already_set& e) {
      Py_DECREF(op.result);
      e.restore();
      return nullptr;
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) {
    Py_DECREF(op.result);
    s.hooks.set_error(error);
    return nullptr;
  }
  return op.result;
}

PyObject* Poll(PyObject* /*module*/, PyObject* handle) {
  State& s = S();
  auto it = PyLong_CheckExact(handle) ? s.pending.find(PyLong_AsLongLong(handle)) : s.pending.end();
  if (PyErr_Occurred()) PyErr_Clear();
  if (it == s.pending.end()) return PyObject_CallOneArg(s.poll_py, handle);
  try {
    CommThread& thread = s.hooks.thread();
    const Pending& op = it->second;
    if (!thread.Done(op.first)) Py_RETURN_FALSE;
    for (CommThread::Handle core : op.rest) {
      if (!thread.Done(core)) Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
  } catch (...) {
    return Fail();
  }
}

// GroupedAllreduceFast(tensors, op, name): grouped_allreduce_async_'s common case (a list or
// tuple of tensors the reader reads, no process set, no scaling): one collective per element type,
// in the order the types first appear, exactly as the Python way makes them (name "NAME#float32",
// shape [k, count...]); returns the handle, or None for the Python way.
PyObject* GroupedAllreduceFast(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargsf) {
  State& s = S();
  if (PyVectorcall_NARGS(nargsf) != 3) {
    PyErr_SetString(PyExc_TypeError, "grouped_allreduce_fast(tensors, op, name)");
    return nullptr;
  }
  PyObject* tensors = args[0];
  ReduceOp op;
  std::string name;
  if (!(PyList_CheckExact(tensors) || PyTuple_CheckExact(tensors)) ||
      PySequence_Fast_GET_SIZE(tensors) == 0 || !ParseOp(args[1], &op) ||
      !ParseName(args[2], &name)) {
    Py_RETURN_NONE;
  }
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(tensors);
  PyObject** items = PySequence_Fast_ITEMS(tensors);
  // Local: reading a tensor may run Python code (a subclass's attributes), which may call here.
  std::vector<BufferView> views(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    BufferView& v = views[static_cast<size_t>(i)];
    if (!s.reader.Read(items[i], /*writable=*/true, &v) || (v.data == nullptr && v.count != 0)) {
      Py_RETURN_NONE;
    }
  }
  bool in_flight = false;
  PyObject* key = ClaimableKey(args[2], &in_flight);
  if (in_flight) Py_RETURN_NONE;
  PyObject* result = PySequence_List(tensors);
  if (result == nullptr) {
    Py_XDECREF(key);
    return nullptr;
  }
  // Element types in the order they first appear, each with its tensors.
  std::vector<std::pair<DataType, std::vector<size_t>>> groups;
  for (size_t i = 0; i < views.size(); ++i) {
    const DataType type = views[i].type;
    auto group = groups.begin();
    while (group != groups.end() && group->first != type) ++group;
    if (group == groups.end()) group = groups.insert(groups.end(), {type, {}});
    group->second.push_back(i);
  }
  std::vector<CommThread::Handle> core;
  try {
    CommThread& thread = s.hooks.thread();
    Communicator* comm = &s.hooks.world();
    for (auto& [type, members] : groups) {
      std::vector<Communicator::Buffer> buffers;
      CallCheck check;
      // Unnamed stays unnamed (matched in call order, and never a duplicate).
      if (!name.empty()) check.name = name + "#" + collectives::DataTypeName(type);
      check.has_shape = true;
      check.shape.push_back(static_cast<int64_t>(members.size()));
      for (size_t i : members) {
        buffers.push_back({views[i].data, views[i].count});
        check.shape.push_back(static_cast<int64_t>(views[i].count));
      }
      const DataType t = type;
      // Matched (and refused as a duplicate) by the call's name for its first part.
      std::string core_name = core.empty() ? name : check.name;
      core.push_back(thread.Submit(
          [comm, buffers = std::move(buffers), t, op, check = std::move(check)](Communicator&) {
            comm->GroupedAllreduce(buffers, t, op, check);
          },
          comm, std::move(core_name)));
    }
  } catch (...) {
    for (CommThread::Handle h : core) {  // what was queued runs: wait for it before raising
      try {
        s.hooks.wait(h);
      } catch (...) {
      }
    }
    Py_DECREF(result);
    Py_XDECREF(key);
    return Fail();
  }
  const CommThread::Handle first = core.front();
  core.erase(core.begin());
  PyObject* handle = Register(first, std::move(core), result, key);
  Py_DECREF(result);
  return handle;
}

constexpr char kAllreduceDoc[] =
    "allreduce_async_($module, /, tensor, op=None, name=None, process_set=None, "
    "prescale_factor=1.0, postscale_factor=1.0)\n--\n\n"
    "Starts reducing `tensor` across ranks in place with `op` (default Average); returns a\n"
    "handle for synchronize(), which returns the tensor. The tensor must stay untouched until "
    "then.\n\n"
    "prescale_factor and postscale_factor multiply the tensor before and the result after.\n"
    "Allreduces started one after another run fused, as one (Horovod's tensor fusion: up to\n"
    "TRAINRUN_FUSION_THRESHOLD_BYTES bytes, 0 for none); the background thread waits for more "
    "while\nthey keep coming (within 1 ms of each other) and no synchronize() waits.";

constexpr char kSynchronizeDoc[] =
    "synchronize($module, handle, /)\n--\n\n"
    "Waits for the async operation `handle` (GIL released) and returns its result.\n\n"
    "Raises the operation's error, if it failed.";

constexpr char kPollDoc[] =
    "poll($module, handle, /)\n--\n\n"
    "True when the async operation `handle` has finished (synchronize() then returns at once).";

PyMethodDef kMethods[] = {
    {"allreduce_async_",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&AllreduceAsync)),
     METH_FASTCALL | METH_KEYWORDS, kAllreduceDoc},
    {"synchronize", &Synchronize, METH_O, kSynchronizeDoc},
    {"poll", &Poll, METH_O, kPollDoc},
    {"grouped_allreduce_fast",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&GroupedAllreduceFast)),
     METH_FASTCALL, "grouped_allreduce_async_'s common case in one pass; None: go the Python way"},
};

}  // namespace

void AddFastCalls(py::module_& m, FastCallHooks hooks) {
  State& s = S();
  s.hooks = std::move(hooks);
  py::object ops = m.attr("ReduceOp");
  const char* members[kOps] = {"Sum", "Average", "Min", "Max", "Product", "Adasum"};
  for (int i = 0; i < kOps; ++i) {
    py::object member = ops.attr(members[i]);
    if (py::cast<ReduceOp>(member) != static_cast<ReduceOp>(i)) {
      throw std::logic_error("ReduceOp's members are not in value order");
    }
    s.ops[i] = member.release().ptr();
  }
  for (int j = 0; j < kAllreduceArgCount; ++j) {
    s.arg_names[j] = PyUnicode_InternFromString(kAllreduceArgs[j]);
  }
  for (PyMethodDef& def : kMethods) {
    PyObject* function = PyCFunction_NewEx(&def, m.ptr(), m.attr("__name__").ptr());
    if (function == nullptr) throw py::error_already_set();
    // Named as trainrun's functions (their __name__ and signature), kept in _core as fast_*
    // (except grouped_allreduce_fast, an internal call) beside the core's own poll.
    const std::string name = def.ml_name;
    m.attr((name == "grouped_allreduce_fast" ? name : "fast_" + name).c_str()) =
        py::reinterpret_steal<py::object>(function);
  }
  m.def(
      "bind",
      [](py::object names, py::object allreduce, py::object synchronize, py::object poll) {
        State& state = S();
        if (!PySet_Check(names.ptr())) throw py::type_error("bind: names must be a set");
        Py_XDECREF(state.names);
        Py_XDECREF(state.allreduce_py);
        Py_XDECREF(state.synchronize_py);
        Py_XDECREF(state.poll_py);
        state.names = names.release().ptr();
        state.allreduce_py = allreduce.release().ptr();
        state.synchronize_py = synchronize.release().ptr();
        state.poll_py = poll.release().ptr();
      },
      py::arg("names"), py::arg("allreduce_async_"), py::arg("synchronize"), py::arg("poll"),
      "Gives the fast calls trainrun's names in flight and the Python implementations they fall "
      "back on.");
  m.def(
      "new_handle", [] { return S().next_handle++; },
      "A handle number for an operation of the Python way (the fast calls share the counter).");
}

void ForgetFastHandles() {
  State& s = S();
  auto pending = std::move(s.pending);
  s.pending.clear();
  for (auto& [handle, op] : pending) {
    Py_XDECREF(op.result);
    Py_XDECREF(op.name_key);
  }
}

}  // namespace trainrun::python
