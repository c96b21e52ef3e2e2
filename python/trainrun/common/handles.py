"""Handles (Horovod's handles of async operations): a handle stands for one Python-level
operation, one or more operations of the core's thread plus a `finish` that makes the result
(copying out, scaling, reshaping) once they are done; synchronize() waits for them and returns it.

The per-tensor fast calls keep their handles in C++ (python/src/fast_calls.h) and pass the ones
made here to _synchronize_py and _poll_py; both sides share _names_in_flight, a hint of the names
flight once whichever side started it.
"""

from trainrun import _core
from trainrun.common.exceptions import Error, InvalidArgumentError

_ops = {}  # the Python way's handles; the fast calls' live in _core (fast_calls.h)
# Names of the fast calls' operations not yet synchronized (the name itself: a str hashes once,
# and 200 allreduce_async_ calls in a row each add and remove one). Only a hint: a call whose name
# is here goes the Python way, and the core decides whether the name is still pending.
_names_in_flight = set()


class _Op:
    __slots__ = ("core", "finish", "keep", "name")

    def __init__(self, core, finish, keep, name):
        self.core = core
        self.finish = finish
        self.keep = keep  # buffers the core reads or writes: kept alive until done
        self.name = name


def _claim_name(set_id, name, what):
    """The key of an operation's name, or None. A second pending operation with the same name is
    refused by the core when it is queued (InvalidArgumentError, a ValueError, on that rank only),
    and a name is free again once its operation has run (not only once synchronized), as in
    Horovod; so nothing is claimed here."""
    return None


def _part(name, i, n):
    """The core's name of part i of n of an operation named `name` (each pending name is one
    operation's): the name itself for a single part, else name[i]; unnamed stays unnamed."""
    if not name:
        return ""
    return name if n == 1 else f"{name}[{i}]"


def _register(core, finish, keep, name_key=None):
    h = _core.new_handle()
    _ops[h] = _Op(list(core), finish, keep, name_key)
    return h


def _poll_py(handle):
    """poll() of a handle the Python way made (poll itself is _core.fast_poll)."""
    op = _ops.get(handle)
    if op is None:
        raise InvalidArgumentError(f"handle {handle!r} is not a pending operation")
    return all(_core.poll(h) for h in op.core)


def _synchronize_py(handle):
    """synchronize() of a handle the Python way made (synchronize itself is
    _core.fast_synchronize, which takes every handle and passes these on)."""
    op = _ops.pop(handle, None)
    if op is None:
        raise InvalidArgumentError(f"handle {handle!r} is not a pending operation (already "
                                   "synchronized, or never started)")
    if op.name is not None:
        _names_in_flight.discard(op.name)
    if len(op.core) == 1:  # the common case, without the loop's bookkeeping
        _core.wait(op.core[0])
        return op.finish()
    error = None
    for h in op.core:
        try:
            _core.wait(h)
        except Error as e:  # Wait for all, then raise the first.
            error = error or e
    if error is not None:
        raise error
    return op.finish()



def _forget_all():
    """At shutdown: pending handles and names are dropped (the core has finished or failed them)."""
    _ops.clear()
    _names_in_flight.clear()
