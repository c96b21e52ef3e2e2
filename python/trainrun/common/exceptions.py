"""trainrun's errors, and the exceptions of elastic training with Horovod's names and meanings
(horovod.common.exceptions).

Error is the base of every error the library raises, carrying its message: InternalError (IoError,
TimeoutError: the job's communication failed) and InvalidArgumentError (MismatchError: the ranks
disagreed on a collective, or one was called wrongly).

HorovodInternalError: the job's communication failed (a peer was lost mid-collective): the state
since the last commit cannot be trusted, so elastic.run restores it, joins the job's next
generation and syncs. It is trainrun's InternalError (IoError and TimeoutError are its kinds), so
either name catches it.

HostsUpdatedInterrupt: the job's membership changed while this rank's collectives still worked
(check_host_updates found a newer generation): the state is consistent, so elastic.run joins the
next generation without restoring, and without syncing when skip_sync.
"""

from trainrun import _core

Error = _core.Error
InternalError = _core.InternalError
IoError = _core.IoError
TimeoutError = _core.TimeoutError  # pylint: disable=redefined-builtin
InvalidArgumentError = _core.InvalidArgumentError
MismatchError = _core.MismatchError

HorovodInternalError = InternalError


class HostsUpdatedInterrupt(RuntimeError):
    """The job's ranks changed; raised by State.check_host_updates (and commit) on every rank at
    once. skip_sync: the ranks that remain hold the same state, so elastic.run need not broadcast
    it again (only ranks left, none joined)."""

    def __init__(self, skip_sync=False):
        super().__init__("the elastic job's ranks changed")
        self.skip_sync = skip_sync
