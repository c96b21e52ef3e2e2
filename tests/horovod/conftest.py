"""pytest setup for running Horovod's test_torch.py against trainrun.torch.

- `import horovod.torch` resolves to trainrun.torch through shim/ (which implements nothing but
  the mpi_enabled() answer its docstring explains).
- Tests named in skips.py are skipped with the reason written there.
- After each test, the ranks meet at a named point before the next starts. When a test fails on
  one rank before a collective that the other ranks then wait in, those ranks' next calls are
  reported as mismatched (trainrun's call check), and this meeting point absorbs them, so one
  failure is not blamed on every later test.
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "shim"))
sys.path.insert(0, HERE)

from skips import SKIPS, SKIPS_AT_SIZE  # noqa: E402  pylint: disable=wrong-import-position

_MAX_ABSORBED = 100000


def pytest_collection_modifyitems(config, items):
    size = int(os.environ.get("HOROVOD_SIZE", "1"))
    for item in items:
        reason = SKIPS.get(item.name) or SKIPS_AT_SIZE.get(size, {}).get(item.name)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"trainrun: {reason}"))


@pytest.fixture(autouse=True)
def meet_after_each_test(request):
    yield
    import trainrun

    if not trainrun.is_initialized():
        trainrun.init()
    name = f"end of {request.node.name}"
    for _ in range(_MAX_ABSORBED):
        try:
            trainrun.allgather_object(name, name=name)
            return
        except trainrun.MismatchError:
            continue
