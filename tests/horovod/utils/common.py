"""The three helpers Horovod's test_torch.py imports from its test/utils/common.py, written for
trainrun (they are test plumbing, not Horovod's API)."""

import contextlib
import os
import shutil
import tempfile


def mpi_env_rank_and_size():
    """(rank, size) from an MPI launcher's environment, else (0, 1): trainrun sets
    OMPI_COMM_WORLD_* as mpirun would."""
    for rank_var, size_var in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                               ("PMI_RANK", "PMI_SIZE")):
        if rank_var in os.environ and size_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    return 0, 1


def skip_or_fail_gpu_test(test, message):
    """Fails when HOROVOD_TEST_GPU=1 asks for GPU tests, else skips."""
    if int(os.environ.get("HOROVOD_TEST_GPU", 0)):
        test.fail(message)
    else:
        test.skipTest(message)


@contextlib.contextmanager
def temppath():
    """A path in a fresh temporary directory, removed afterwards."""
    directory = tempfile.mkdtemp()
    try:
        yield os.path.join(directory, "file")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
