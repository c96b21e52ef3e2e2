"""trainrun.run's tests run in an ordinary process (the caller), not as ranks of a job."""

import os
import sys

try:
    import trainrun  # noqa: F401
except ImportError:  # Not on PYTHONPATH: use the package the build made.
    _root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, os.path.join(os.environ.get("TRAINRUN_BUILD_DIR",
                                                   os.path.join(_root, "build")), "python"))
