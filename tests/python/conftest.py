"""Shared set-up of the Python tests: every pytest process is one rank of a job.

CTest runs `pytest` under `trainrun -np N` (or run_ranks.py), so all ranks run the same tests in
the same order and their collectives pair up. A test that fails on one rank must not skip a
collective the others make, or they would wait for it until TRAINRUN_TIMEOUT.
"""

import os
import sys

import pytest

try:
    import trainrun
except ImportError:  # Not on PYTHONPATH: use the package the build made.
    _root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, os.path.join(os.environ.get("TRAINRUN_BUILD_DIR",
                                                   os.path.join(_root, "build")), "python"))
    import trainrun


@pytest.fixture(scope="session", autouse=True)
def job():
    trainrun.init()
    yield
    trainrun.barrier()
    trainrun.shutdown()
