"""trainrun.torch: horovod.torch's API over trainrun, so a Horovod script ports by its import.

    import trainrun.torch as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size()),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    sampler = hvd.DistributedSampler(train_set)          # this rank's shard
    ...
    loss_avg = hvd.allreduce(loss.detach(), name="loss")  # averaged across ranks

As Horovod's horovod.torch, this file only gathers the public names: ops.py (the differentiable
collectives), functions.py (broadcast_parameters, broadcast_optimizer_state, objects), data.py
(sharding), optimizer.py, compression.py, sync_batch_norm.py and elastic/; what is not specific
to torch comes from trainrun.common.
"""

from trainrun.common.basics import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built,
                                    gloo_built, gloo_enabled, init, is_initialized, local_rank,
                                    local_size, mpi_built, mpi_enabled, mpi_threads_supported,
                                    nccl_built, rank, rocm_built, shutdown, size)
from trainrun.common.exceptions import (Error, HorovodInternalError, InternalError,
                                        InvalidArgumentError, IoError, MismatchError,
                                        TimeoutError)
from trainrun.common.ops import (Average, Max, Min, Product, ReduceOp, Sum, barrier, poll,
                                 synchronize)
from trainrun.common.process_sets import (ProcessSet, add_process_set, global_process_set,
                                          remove_process_set)
from trainrun.torch import elastic
from trainrun.torch.compression import Compression
from trainrun.torch.data import DistributedSampler, shard_indices
from trainrun.torch.functions import (allgather_object, broadcast_object,
                                      broadcast_optimizer_state, broadcast_parameters)
from trainrun.torch.ops import (Adasum, allgather, allgather_async, allreduce, allreduce_,
                                allreduce_async, allreduce_async_, alltoall, alltoall_async,
                                broadcast, broadcast_, broadcast_async, broadcast_async_,
                                grouped_allgather, grouped_allgather_async, grouped_allreduce,
                                grouped_allreduce_, grouped_allreduce_async,
                                grouped_allreduce_async_, grouped_reducescatter,
                                grouped_reducescatter_async, join, reducescatter,
                                reducescatter_async, sparse_allreduce_async, start_timeline,
                                stop_timeline)
from trainrun.torch.optimizer import DistributedOptimizer
from trainrun.torch.sync_batch_norm import SyncBatchNorm

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "sparse_allreduce_async", "allgather", "allgather_async",
    "grouped_allgather", "grouped_allgather_async", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "grouped_reducescatter_async", "join", "barrier", "synchronize",
    "poll", "broadcast_object", "allgather_object", "broadcast_parameters",
    "broadcast_optimizer_state", "DistributedOptimizer", "DistributedSampler", "SyncBatchNorm",
    "shard_indices", "Compression", "ProcessSet", "global_process_set", "add_process_set",
    "remove_process_set", "start_timeline", "stop_timeline", "nccl_built", "mpi_built",
    "mpi_enabled", "mpi_threads_supported", "gloo_built", "gloo_enabled", "ddl_built",
    "ccl_built", "cuda_built", "rocm_built", "ReduceOp", "Sum", "Average", "Adasum", "Min", "Max",
    "Product", "Error", "InternalError", "HorovodInternalError", "IoError", "TimeoutError",
    "InvalidArgumentError", "MismatchError",
]
