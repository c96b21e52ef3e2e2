"""trainrun.run(fn) and TrainRunner: real jobs under the trainrun launcher, from this process."""

import os
import signal
import socket
import threading
import time

import numpy
import pytest

import trainrun


def rank_and_sum(offset, scale=1):
    trainrun.init()
    total = trainrun.allreduce(numpy.array([float(trainrun.rank())]), op=trainrun.Sum)
    return trainrun.rank(), trainrun.size(), offset + scale * float(total[0])


def test_return_values_in_rank_order():
    results = trainrun.run(rank_and_sum, args=(100,), kwargs={"scale": 2}, np=4)
    assert results == [(r, 4, 100 + 2 * 6.0) for r in range(4)]


def raise_on_rank_2():
    trainrun.init()
    trainrun.barrier()
    if trainrun.rank() == 2:
        raise ValueError("bad value on rank two")
    trainrun.barrier()  # the others wait here until the job is stopped
    return trainrun.rank()


def test_exception_on_rank_2_is_reraised_with_its_rank_and_traceback():
    with pytest.raises(ValueError, match="bad value on rank two") as caught:
        trainrun.run(raise_on_rank_2, np=4)
    exc = caught.value
    assert exc.rank == 2
    assert "raise_on_rank_2" in exc.remote_traceback
    assert 'raise ValueError("bad value on rank two")' in exc.remote_traceback
    assert isinstance(exc.__cause__, trainrun.RemoteTraceback)
    assert "On rank 2:" in str(exc.__cause__)
    assert any("rank 2" in note for note in getattr(exc, "__notes__", []))


def test_lambda_and_closure():
    assert trainrun.run(lambda a, b: a * b, args=(6, 7), np=2) == [42, 42]

    def make_counter(base):
        seen = [base]

        def count(step):
            rank = int(os.environ["TRAINRUN_RANK"])
            seen.append(step * rank)
            return sum(seen)

        return count

    assert trainrun.run(make_counter(10), args=(3,), np=3) == [10, 13, 16]


def test_env_and_hosts_as_a_list():
    got = trainrun.run(lambda: os.environ["TRAINRUN_TEST_VALUE"], np=2,
                       hosts=["localhost:1", "127.0.0.1:1"], env={"TRAINRUN_TEST_VALUE": "x y"})
    assert got == ["x y", "x y"]


class Unpicklable(Exception):
    def __init__(self, a, b):  # pickle cannot rebuild it from args
        super().__init__(f"{a}/{b}")


def raise_unpicklable():
    raise Unpicklable(1, 2)


def test_an_exception_that_cannot_travel_comes_as_text():
    with pytest.raises(trainrun.JobError, match=r"rank 0 raised Unpicklable: 1/2") as caught:
        trainrun.run(raise_unpicklable, np=1)
    assert "raise_unpicklable" in caught.value.remote_traceback


def exit_on_rank_1():
    if int(os.environ["TRAINRUN_RANK"]) == 1:
        os._exit(3)
    time.sleep(30)


def test_a_rank_that_dies_without_an_exception_gives_job_error():
    start = time.monotonic()
    with pytest.raises(trainrun.JobError, match="rank 1") as caught:
        trainrun.run(exit_on_rank_1, np=3)
    assert caught.value.exit_code != 0
    assert "exited with code 3" in caught.value.summary
    assert time.monotonic() - start < 20


def test_train_runner():
    assert trainrun.TrainRunner(np=-2).run(rank_and_sum, offset=1) == (0, 2, 2.0)
    with pytest.raises(ValueError, match="np must be a non-zero integer"):
        trainrun.TrainRunner(np=0)
    with pytest.raises(ValueError, match="np must be a positive integer"):
        trainrun.run(print, np=0)
    with pytest.raises(TypeError, match="fn must be callable"):
        trainrun.run(42)


def test_a_stranger_gets_nothing():
    from trainrun import _launch  # pylint: disable=import-outside-toplevel

    server = _launch._Server(b"secret payload", 1, "a" * 64, True)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
            conn.sendall(b"b" * 64 + _launch._HEADER.pack(0))
            try:
                answer = conn.recv(100)
            except ConnectionResetError:  # closed with the rank number unread
                answer = b""
            assert answer == b""  # closed without a word
        assert server.outcomes == {}
    finally:
        server.close()


def _descendants():
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def test_fifty_calls_leave_nothing_behind():
    def step(i):
        trainrun.init()
        out = trainrun.allreduce(numpy.full(1024, float(i)), op=trainrun.Sum)
        return float(out[0])

    shm_before = sorted(os.listdir("/dev/shm"))
    fds_before = sorted(os.listdir("/proc/self/fd"))
    threads_before = threading.active_count()
    start = time.monotonic()
    for i in range(50):
        assert trainrun.run(step, args=(i,), np=2) == [2.0 * i] * 2
    seconds = time.monotonic() - start
    print(f"50 calls of trainrun.run(np=2) with an allreduce: {seconds:.1f} s")
    assert _descendants() == []
    assert sorted(os.listdir("/proc/self/fd")) == fds_before
    assert sorted(os.listdir("/dev/shm")) == shm_before
    assert threading.active_count() == threads_before


def test_an_interrupted_call_ends_its_job():
    def sleep_long():
        time.sleep(60)

    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            trainrun.run(sleep_long, np=2)
    finally:
        timer.cancel()
    assert time.monotonic() - start < 30
    assert _descendants() == []
