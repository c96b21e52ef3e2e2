"""A stall in a named collective: rank 1 never joins the allreduce "grad.fc1.weight", so trainrun's
stall warning names it by its name (run by CTest under trainrun with a 1 s warning time and a 3 s
shutdown time; the job ends as stalled)."""

import time

import numpy

import trainrun

trainrun.init()
trainrun.allreduce(numpy.ones(4), name="warmup")
if trainrun.rank() == 1:
    time.sleep(60)
trainrun.allreduce(numpy.ones(4), name="grad.fc1.weight")
