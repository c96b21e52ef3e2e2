"""horovod.torch.mpi_ops, by name: the module Horovod's own tests and some scripts import the
collectives from (`from horovod.torch.mpi_ops import synchronize`). The same functions as
trainrun.torch's; nothing is defined here."""

# pylint: disable=unused-import
from trainrun.common.basics import (ccl_built, cuda_built, ddl_built, gloo_built, gloo_enabled,
                                    init, is_initialized, local_rank, local_size, mpi_built,
                                    mpi_enabled, mpi_threads_supported, nccl_built, rank,
                                    rocm_built, shutdown, size)
from trainrun.common.ops import (Adasum, Average, Max, Min, Product, ReduceOp, Sum, barrier, poll,
                                 synchronize)
from trainrun.common.process_sets import global_process_set
from trainrun.torch.ops import (allgather, allgather_async, allreduce, allreduce_, allreduce_async,
                                allreduce_async_, alltoall, alltoall_async, broadcast, broadcast_,
                                broadcast_async, broadcast_async_, grouped_allgather,
                                grouped_allgather_async, grouped_allreduce, grouped_allreduce_,
                                grouped_allreduce_async, grouped_allreduce_async_,
                                grouped_reducescatter, grouped_reducescatter_async, join,
                                reducescatter, reducescatter_async, sparse_allreduce_async)
