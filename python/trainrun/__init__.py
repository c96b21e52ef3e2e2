"""trainrun: collectives for worker processes that `trainrun -np N python script.py` started.

    import trainrun
    trainrun.init()
    total = trainrun.allreduce(numpy.ones(4), op=trainrun.Sum)   # [size, size, size, size]
    step = trainrun.allreduce(delta, op=trainrun.Adasum)         # Adasum of the ranks' deltas
    trainrun.broadcast_(tensor, root_rank=0)                     # in place, from rank 0
    evens = trainrun.add_process_set([0, 2])                     # every rank calls it
    trainrun.shutdown()                                          # init() may follow

Every collective takes NumPy arrays and PyTorch CPU tensors of the types supported_dtypes()
lists; contiguous buffers are read and written where they are (no copy), and the GIL is released
while a collective waits on the network. Out-of-place calls (allreduce, broadcast, ...) return a
new array or tensor; the ones ending in `_` update their argument and return it. The `*_async`
forms return a handle for synchronize() and poll(); `grouped_*` run a list as one operation.

Every rank must call the same collectives in the same order. Before each one the ranks exchange a
small record of what they are about to do (collective, name, dtype, shape, op, root), so a rank
that disagrees makes every rank raise MismatchError (an InvalidArgumentError) for that call, and
the next call works; TRAINRUN_CHECK_SHAPES=0 skips the exchange when every microsecond counts.

Errors from the library come as trainrun.Error subclasses: InternalError (IoError, TimeoutError:
the job's communication failed) and InvalidArgumentError (MismatchError), carrying the library's
message. For PyTorch training, see trainrun.torch.

To start a job from Python rather than from the shell, trainrun.run(fn, np=4) runs fn on every
rank of a new job and returns the ranks' return values (see trainrun/_launch.py); TrainRunner(np)
.run(fn) is HorovodRunner's spelling.

The package is split by concern as Horovod's is; this file only gathers the public names:
trainrun/common/basics.py (init, shutdown, rank, size, ...), common/process_sets.py,
common/ops.py (the collectives), common/handles.py (synchronize, poll), common/objects.py
(broadcast_object, allgather_object), common/exceptions.py (the errors); trainrun/torch/ builds
horovod.torch's API on them.
"""

from trainrun import _buffers  # noqa: F401  (trainrun._buffers, as before the split)
from trainrun import _core  # noqa: F401
from trainrun._launch import JobError, RemoteTraceback, TrainRunner, run
from trainrun.common.basics import (cross_rank, cross_size, gpu_info, init, is_initialized,
                                    local_rank, local_size, rank, shutdown, size,
                                    supported_dtypes)
from trainrun.common.exceptions import (Error, InternalError, InvalidArgumentError, IoError,
                                        MismatchError, TimeoutError)
from trainrun.common.objects import allgather_object, broadcast_object
from trainrun.common.ops import (Adasum, Average, Max, Min, Product, ReduceOp, Sum, allgather,
                                 allgather_async, allreduce, allreduce_, allreduce_async,
                                 allreduce_async_, alltoall, alltoall_async, barrier, broadcast,
                                 broadcast_, broadcast_async, broadcast_async_, grouped_allgather,
                                 grouped_allgather_async, grouped_allreduce, grouped_allreduce_,
                                 grouped_allreduce_async, grouped_allreduce_async_,
                                 grouped_reducescatter, grouped_reducescatter_async, join, poll,
                                 reducescatter, reducescatter_async, start_timeline,
                                 stop_timeline, synchronize)
from trainrun.common.process_sets import (ProcessSet, add_process_set, global_process_set,
                                          remove_process_set)

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "broadcast",
    "broadcast_", "broadcast_async", "broadcast_async_", "allgather", "allgather_async",
    "reducescatter", "reducescatter_async", "alltoall", "alltoall_async", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "grouped_allgather", "grouped_allgather_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "join", "barrier", "start_timeline", "stop_timeline", "synchronize", "poll", "broadcast_object",
    "allgather_object", "supported_dtypes", "gpu_info", "ProcessSet", "global_process_set",
    "add_process_set",
    "remove_process_set", "ReduceOp", "Sum", "Average", "Min", "Max", "Product", "Adasum", "Error",
    "InternalError", "IoError", "TimeoutError", "InvalidArgumentError", "MismatchError",
    "run", "TrainRunner", "JobError", "RemoteTraceback",
]
