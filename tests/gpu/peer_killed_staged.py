"""Run as 2 ranks by trainrun: both loop on staged allreduces of a 16 MiB fake GPU array; rank 1
is SIGKILLed 0.3 s in, in the middle of one (each takes some 10 ms of copies and reduction). The
job must end at once with trainrun's usual summary naming rank 1 (CMakeLists.txt checks it)."""

import os
import signal
import threading

import numpy

import fake_cuda
import trainrun

fake_cuda.install()
trainrun.init()
x = fake_cuda.from_host(numpy.ones(4 << 20, numpy.float32))
if trainrun.rank() == 1:
    threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
while True:
    trainrun.allreduce_(x, op=trainrun.Max)
