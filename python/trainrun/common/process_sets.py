"""Process sets (Horovod's horovod.common.process_sets): subsets of the job's ranks that run
collectives among themselves, and the registry that turns a ProcessSet into the core's set id.

Every rank registers the same sets in the same order (add_process_set checks it); set id 0 is the
whole job (global_process_set). A collective's `process_set=` is resolved here (_set_id), and so
is its root (_check_root: a rank of the job, as Horovod's, made an index in the set).
"""

from trainrun import _core
from trainrun.common.exceptions import InvalidArgumentError
from trainrun.common.exchange import allgather_pickled

_rank = _core.rank
_size = _core.size


class ProcessSet:
    """A subset of the job's ranks that runs collectives among themselves (Horovod's ProcessSet).

    Make it with add_process_set(ranks) on every rank; pass it as `process_set=` to a collective,
    which then runs only among its ranks, over the job's connections, numbered in ascending order.
    """

    def __init__(self, ranks=None):
        self.ranks = None if ranks is None else sorted(int(r) for r in ranks)
        self.process_set_id = None

    def size(self):
        return _size() if self.ranks is None else len(self.ranks)

    def rank(self):
        """This rank's index in the set (-1 when it is not a member)."""
        if self.ranks is None:
            return _rank()
        return self.ranks.index(_rank()) if _rank() in self.ranks else -1

    def included(self):
        return self.ranks is None or _rank() in self.ranks

    def __repr__(self):
        who = "all ranks" if self.ranks is None else f"ranks {self.ranks}"
        return f"ProcessSet(id={self.process_set_id}, {who})"


global_process_set = ProcessSet()
global_process_set.process_set_id = 0
_process_sets = {}  # id -> ProcessSet, besides the global one


def add_process_set(process_set):
    """Registers a process set (a ProcessSet or a list of ranks) and returns it.

    Every rank of the job must call it, with the same ranks, in the same order as other ranks
    call add_process_set and remove_process_set.
    """
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.ranks is None or not ps.ranks:
        raise InvalidArgumentError("add_process_set needs a non-empty list of ranks")
    if len(set(ps.ranks)) != len(ps.ranks) or not all(0 <= r < _size() for r in ps.ranks):
        raise InvalidArgumentError(f"add_process_set: ranks {ps.ranks} must be distinct ranks "
                                   f"of this job (0..{_size() - 1})")
    if ps.process_set_id is not None:
        raise InvalidArgumentError(f"{ps!r} is already registered")
    if any(other.ranks == ps.ranks for other in _process_sets.values()):
        raise InvalidArgumentError(f"a process set of ranks {ps.ranks} already exists")
    everyone = allgather_pickled(ps.ranks, 0, "add_process_set")
    if any(r != ps.ranks for r in everyone):
        differ = next(i for i, r in enumerate(everyone) if r != ps.ranks)
        raise InvalidArgumentError(f"add_process_set: rank {differ} asked for ranks "
                                   f"{everyone[differ]}, this rank for {ps.ranks}; every rank "
                                   "must add the same process sets in the same order")
    ps.process_set_id = _core.add_process_set(ps.ranks)
    _process_sets[ps.process_set_id] = ps
    return ps


def remove_process_set(process_set):
    """Unregisters `process_set` (on every rank); returns True if it was registered."""
    pid = process_set.process_set_id
    if pid is None or pid not in _process_sets:
        return False
    _core.remove_process_set(pid)
    del _process_sets[pid]
    process_set.process_set_id = None
    return True


def _forget_all():
    """At shutdown: every registered set becomes unregistered (the core forgets them too)."""
    for ps in _process_sets.values():
        ps.process_set_id = None
    _process_sets.clear()


def _set_id(process_set, what):
    if process_set is None or process_set is global_process_set:
        return 0
    if not isinstance(process_set, ProcessSet) or process_set.process_set_id is None:
        raise InvalidArgumentError(f"{what}: process_set {process_set!r} is not registered; make "
                                   "it with add_process_set()")
    return process_set.process_set_id


def _set_size(set_id):
    return _size() if set_id == 0 else _core.set_size(set_id)


def _set_rank(set_id):
    return _rank() if set_id == 0 else _core.set_rank(set_id)


def _check_root(root_rank, set_id, what):
    """Returns the root's index in the process set; root_rank is a rank of the job, as Horovod's."""
    if isinstance(root_rank, bool) or not isinstance(root_rank, int):
        raise InvalidArgumentError(f"{what}: root_rank must be an int, got {root_rank!r}")
    if set_id == 0:
        if not 0 <= root_rank < _size():
            raise InvalidArgumentError(
                f"{what}: root_rank {root_rank} is not a rank of this job (0..{_size() - 1})")
        return root_rank
    ranks = _process_sets[set_id].ranks
    if root_rank not in ranks:
        raise InvalidArgumentError(
            f"{what}: root_rank {root_rank} is not in the process set (ranks {ranks})")
    return ranks.index(root_rank)
