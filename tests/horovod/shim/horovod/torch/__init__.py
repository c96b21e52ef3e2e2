"""horovod.torch, resolved to trainrun.torch. The shim implements nothing, with one exception that
only a test asks for: with TRAINRUN_SHIM_MPI_ENABLED=1, hvd.mpi_enabled() answers True. Horovod's
test_adasum_pytorch.py runs its CPU tests only "if hvd.mpi_enabled()", because Horovod's Adasum
needs MPI; trainrun's runs over its own transports, so those runs (tests/horovod/CMakeLists.txt)
let Horovod's tests check it. trainrun.torch.mpi_enabled() itself stays False: no MPI is used."""
import os
import sys

import trainrun.torch

if os.environ.get("TRAINRUN_SHIM_MPI_ENABLED") == "1":
    trainrun.torch.mpi_enabled = lambda: True

sys.modules[__name__] = trainrun.torch
