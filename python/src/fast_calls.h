// Fast calls: the Python API's per-tensor calls done in C++, for the common case, so that many
// small tensors at once cost little more than one fused allreduce of them all.
//
// 200 allreduce_async_ calls, each a few µs in Python (reading the tensor, checking the name,
// making a handle object, then synchronize's dictionary and closure), cost ~0.8 ms at n = 2 beside
// the ~1 ms their fused allreduce takes; grouped_allreduce_ of 200 tensors read them in Python at
// ~2 µs each. Here trainrun.allreduce_async_, synchronize and poll are C functions (METH_FASTCALL,
// no pybind11 argument conversion) that handle the common case (a tensor or array BufferReader
// reads, op None or a ReduceOp, no process set, no scaling, a name not in flight) by themselves,
// and hand every other call, unchanged, to the Python implementation (trainrun/common/ops.py),
// which also raises every error. grouped_allreduce_fast reads a whole list in one pass for
// grouped_allreduce_async_. Handles come from one counter for both ways, so either's synchronize
// takes any handle; names in flight live in one Python set (trainrun/common/handles.py).
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <functional>

#include "trainrun/collectives/comm_thread.h"
#include "trainrun/collectives/communicator.h"

namespace trainrun::python {

using collectives::CommThread;

// FastCallHooks is what the fast calls need of the module (the process's Runtime and module.cc's
// helpers).
struct FastCallHooks {
  // thread returns the communication thread; throws when trainrun is not initialized.
  std::function<CommThread&()> thread;
  // world returns the whole job's communicator (process set 0).
  std::function<collectives::Communicator&()> world;
  // wait waits for a core job (GIL released, Ctrl-C checked) and rethrows its exception.
  std::function<void(CommThread::Handle)> wait;
  // set_error turns a C++ exception into the Python error the module's translator makes.
  std::function<void(std::exception_ptr)> set_error;
};

// AddFastCalls adds to module `m`: bind(names_in_flight, allreduce_async_, synchronize, poll)
// (trainrun's Python set of names in flight and the Python implementations the fast calls fall
// back on), new_handle(), fast_allreduce_async_, fast_synchronize, fast_poll and
// grouped_allreduce_fast (see fast_calls.cc).
void AddFastCalls(pybind11::module_& m, FastCallHooks hooks);

// ForgetFastHandles drops every handle the fast calls made and not yet synchronized (shutdown()).
// Needs the GIL.
void ForgetFastHandles();

}  // namespace trainrun::python
