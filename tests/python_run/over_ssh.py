"""trainrun.run over SSH: run by tests/python_run/ssh_run_test.cc in a NetnsCluster's client
namespace, with HOSTS (two hosts, 2 slots each) and the SSH key to log in with.

    over_ssh.py 10.213.1.11:2,10.213.1.12:2 KEY
"""

import os
import sys

import numpy

import trainrun


def where(offset):
    trainrun.init()
    total = trainrun.allreduce(numpy.array([float(trainrun.rank())]), op=trainrun.Sum)
    return trainrun.rank(), os.environ["TRAINRUN_HOSTNAME"], offset + float(total[0])


def fail_on_rank_3():
    if trainrun_rank() == 3:
        raise KeyError("rank 3 has no key")
    return 0


def trainrun_rank():
    return int(os.environ["TRAINRUN_RANK"])


def main():
    hosts, key = sys.argv[1], sys.argv[2]
    names = [h.rsplit(":", 1)[0] for h in hosts.split(",")]
    options = {"hosts": hosts, "start_timeout": 20, "extra_args": ("-i", key)}
    results = trainrun.run(where, args=(10,), np=4, **options)
    expected = [(0, names[0], 16.0), (1, names[0], 16.0), (2, names[1], 16.0),
                (3, names[1], 16.0)]
    assert results == expected, f"{results} != {expected}"
    print("values:", results)
    try:
        trainrun.run(fail_on_rank_3, np=4, **options)
    except KeyError as exc:
        assert exc.rank == 3, exc.rank
        assert "fail_on_rank_3" in exc.remote_traceback, exc.remote_traceback
        print("rank 3's KeyError came back:", exc)
    else:
        raise AssertionError("no exception from rank 3")
    print("over ssh: OK")


if __name__ == "__main__":
    main()
