"""horovod.torch, resolved to trainrun.torch (this shim implements nothing)."""
import sys

import trainrun.torch

sys.modules[__name__] = trainrun.torch
