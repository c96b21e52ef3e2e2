"""Joining and leaving the job, and where this rank stands in it (Horovod's
horovod.common.basics): init, shutdown, rank, size and their kin, what GPU support loaded
(gpu_info), the element types every collective takes, and what this build has (nccl_built,
mpi_built, ...: Horovod's names, which trainrun.torch exports)."""

import sys as _sys

from trainrun import _buffers
from trainrun import _core
from trainrun.common import handles as _handles
from trainrun.common import process_sets as _process_sets
from trainrun.common.exceptions import InvalidArgumentError

is_initialized = _core.is_initialized
rank = _core.rank
size = _core.size
local_rank = _core.local_rank
local_size = _core.local_size
cross_rank = _core.cross_rank
cross_size = _core.cross_size

supported_dtypes = _buffers.supported_dtypes


def gpu_info():
    """What GPU support loaded in this process, and why not: a dict with `cuda` (CUDA's runtime
    loaded), `cuda_runtime`, `cuda_why_not`, `devices`, `nccl` (libnccl.so.2 loaded),
    `nccl_version`, `nccl_path`, `nccl_why_not`, `path`/`path_why`: how the job's GPU
    collectives go ("nccl", "staged", or "undecided" before the first one), and `fused`: how many
    of its GPU allreduces have run fused with others so far."""
    return _core.gpu_info()


# The Python nvidia-* wheels (nvidia/nccl/lib, ...) are looked for under every sys.path folder.
_core.add_gpu_search_dirs([p for p in _sys.path if isinstance(p, str) and p])


def init(comm=None, process_sets=None):
    """Joins the job (a no-op when already initialized; after shutdown() it takes part again).

    comm: as Horovod's, a list of ranks would make the job a subset; trainrun refuses it (make
    the subset with add_process_set instead). process_sets: ProcessSets to add once initialized.
    """
    if comm is not None:
        raise InvalidArgumentError("init(comm=...) is not supported: trainrun's job is every rank "
                                   "trainrun started; use add_process_set(ranks) for a subset")
    _core.init()
    for ps in process_sets or ():
        _process_sets.add_process_set(ps)


def shutdown():
    """Finishes pending operations and stops; process sets are forgotten; init() may follow."""
    _core.shutdown()
    _process_sets._forget_all()  # pylint: disable=protected-access
    _handles._forget_all()  # pylint: disable=protected-access


# --- What this build has (CUDA and NCCL are opened at run time: gpu_info() says what loaded) ----


def nccl_built():
    """NCCL's version as Horovod gives it (e.g. 22809 for 2.28.9), or 0: trainrun opens
    libnccl.so.2 at run time (TRAINRUN_NCCL_LIBRARY, the nvidia-* wheels, the loader's path), so
    this is the version of the NCCL that loads in this process, 0 where none does (gpu_info() says
    why); without it CUDA tensors go through pinned host memory."""
    return _core.nccl_version()


def mpi_built():
    """False: trainrun needs no MPI."""
    return False


def mpi_enabled():
    return False


def mpi_threads_supported():
    return False


def gloo_built():
    """False: trainrun has its own TCP and shared-memory collectives, not Gloo."""
    return False


def gloo_enabled():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    """True: CUDA tensors are reduced (CUDA's runtime is opened at run time; gpu_info())."""
    return True


def rocm_built():
    return False

