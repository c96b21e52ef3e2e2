"""Run as 2 ranks by run_ranks.py: rank 1 vanishes mid-training; rank 0 must get trainrun.IoError
naming rank 1 promptly (not hang), and exit 0 to say so."""

import os
import sys
import time

import numpy as np

import trainrun

trainrun.init()
x = np.ones(100000, dtype=np.float32)
for step in range(100):
    if trainrun.rank() == 1 and step == 10:
        os._exit(0)  # no goodbye; exit 0 so the runner lets rank 0 finish
    start = time.monotonic()
    try:
        trainrun.allreduce_(x)
    except trainrun.IoError as e:
        waited = time.monotonic() - start
        print(f"rank 0 got IoError at step {step} after {waited:.2f} s: {e}", flush=True)
        if "rank 1" in str(e) and waited < 10:
            print("peer failure detected promptly", flush=True)
            sys.exit(0)
        sys.exit(1)
print("rank 0 finished without noticing rank 1 was gone", flush=True)
sys.exit(1)
