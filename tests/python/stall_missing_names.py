"""A stall of collectives called in different orders: rank 0 submits "stall.a" and rank 1
"stall.c", each without the other's for 3 s. With a 1 s stall warning (CTest sets
TRAINRUN_STALL_CHECK_TIME_SECONDS=1), each rank's warning (on its stderr, which this script reads
back) names the collective the other rank lacks; then each submits the other's, both complete,
and rank 0 prints "stall names ok" once every rank found its warning."""

import os
import re
import sys
import tempfile
import time

import numpy

import trainrun

# The warning comes from the library on this process's stderr: keep a copy of it.
log = tempfile.TemporaryFile()
saved = os.dup(2)
os.dup2(log.fileno(), 2)

trainrun.init()
rank = trainrun.rank()
mine, theirs = ("stall.a", "stall.c") if rank == 0 else ("stall.c", "stall.a")
first = trainrun.allreduce_async(numpy.ones(4), name=mine, op=trainrun.Sum)
time.sleep(3)  # not waiting for it: a rank busy elsewhere, as with a slow data loader
second = trainrun.allreduce_async(numpy.ones(4), name=theirs, op=trainrun.Sum)
assert trainrun.synchronize(first).tolist() == [2.0] * 4
assert trainrun.synchronize(second).tolist() == [2.0] * 4

os.dup2(saved, 2)
log.seek(0)
text = log.read().decode(errors="replace")
sys.stderr.write(text)
other = 1 - rank
expected = (rf"rank {rank}: collectives submitted by this rank have waited more than 1 s for "
            rf"other ranks to submit them \(Horovod's stall check\): '{re.escape(mine)}' "
            rf"\(missing on rank {other}\)")
found = re.search(expected, text) is not None
if not found:
    print(f"rank {rank}: no warning matching {expected!r} in:\n{text}", flush=True)
everyone = trainrun.allreduce(numpy.array([1.0 if found else 0.0]), op=trainrun.Min)
if rank == 0 and everyone[0] == 1.0:
    print("stall names ok", flush=True)
