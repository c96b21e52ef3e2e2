"""The elastic training loop and its state, framework-neutral (Horovod's horovod.common.elastic).

A State is what training must not lose: commit() saves it (and checks whether the job's ranks
changed), restore() goes back to the last save, sync() makes every rank's a copy of rank 0's.
run_fn(func, reset) wraps a training function so that, when a collective fails because a rank was
lost (HorovodInternalError), the state goes back to its last commit, the process joins the job's
next generation (reset: shutdown() then init(), which in an elastic job renumbers the survivors
and rebuilds the data plane), the reset callbacks run (e.g. to rescale the learning rate for the
new size) and training resumes after a sync. Work done since the last commit is done again; no
committed step is lost.
"""

import functools

import numpy

from trainrun import _core
from trainrun.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from trainrun.common.ops import Max, allreduce


class State:
    """The base of elastic states: commit/restore/sync plus reset callbacks.

    bcast_object(obj) returns rank 0's obj on every rank; get_rank() is this rank.
    """

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Functions to call, without arguments, after each reset (the new size is then known)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state as the point to come back to, then check_host_updates()."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every rank when the job has a newer generation than
        this one. Rank 0's view decides, so every rank raises, or none."""
        # Only rank 0 asks the launcher (one call, not one per rank); one allreduce of two numbers
        # tells the others (half the time of a broadcast_object, which takes two): the newest
        # generation, and whether it adds ranks.
        if self._rank() == 0:
            latest = _core.latest_generation()
            adds = latest > _core.generation() and _core.latest_generation_adds()
            asked = numpy.array([latest, int(adds)], numpy.int64)
        else:
            asked = numpy.zeros(2, numpy.int64)
        told = allreduce(asked, op=Max, name="elastic.check_host_updates")
        if int(told[0]) > _core.generation():
            # Horovod's rule: when ranks only left, the survivors' committed state agrees and no
            # sync is needed; ranks that joined get rank 0's state by the sync.
            raise HostsUpdatedInterrupt(skip_sync=not bool(told[1]))

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def reset(self):
        """Called after each reset, before the callbacks; subclasses may refresh what depends on
        the job's size."""


class ObjectState(State):
    """A State of plain picklable attributes: ObjectState(bcast, get_rank, epoch=0, batch=0)
    makes state.epoch and state.batch, saved by commit() and sent from rank 0 by sync()."""

    def __init__(self, bcast_object, get_rank, **kwargs):
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)


def _reset_until_formed(reset):
    # A member lost while the next generation formed breaks it too (InternalError): the launcher
    # then publishes the generation after it, which the next reset joins. No generation at all
    # (below --min-np until the timeout) is a plain Error and ends the loop.
    while True:
        try:
            reset()
            return
        except HorovodInternalError:
            continue


def run_fn(func, reset):
    """Wraps func(state, *args, **kwargs) in the elastic loop; `reset` joins the next generation."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                # What happened since the last commit may differ across ranks: go back to it.
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as interrupt:
                skip_sync = interrupt.skip_sync
            _reset_until_formed(reset)
            state.on_reset()

    return wrapper
