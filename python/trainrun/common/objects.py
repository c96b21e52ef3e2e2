"""Python objects across ranks (Horovod's broadcast_object and allgather_object): any picklable
object, sent pickled (exchange.py) among the job's ranks or a process set's."""

from trainrun import _core
from trainrun.common.exchange import allgather_pickled, broadcast_pickled
from trainrun.common.ops import _what
from trainrun.common.process_sets import _check_root, _set_id


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """Returns root_rank's `obj` (any picklable object) on every rank."""
    what = _what("broadcast_object", name)
    set_id = _set_id(process_set, what)
    root = _check_root(root_rank, set_id, what)
    return broadcast_pickled(obj, root, _core.rank() == root_rank, set_id, name)


def allgather_object(obj, name=None, process_set=None):
    """Returns the list of every rank's `obj` (any picklable object), in rank order."""
    return allgather_pickled(obj, _set_id(process_set, _what("allgather_object", name)), name)
