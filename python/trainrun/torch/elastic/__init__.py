"""Elastic training for PyTorch, as horovod.torch.elastic: a job started with `trainrun --min-np N`
goes on with the ranks that remain when one is lost.

    import trainrun.torch as hvd
    hvd.init()
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0)
    state.register_reset_callbacks([lambda: rescale_lr(hvd.size())])

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for batch_idx, batch in enumerate(batches(state.sampler)):
                ...step...
                state.sampler.record_batch(batch_idx, batch_size)
                if batch_idx % 10 == 0:
                    state.commit()
            state.sampler.set_epoch(state.epoch + 1)

    train(state)

When a rank is lost mid-collective, every survivor's collective raises HorovodInternalError; run
restores the last commit, joins the job's next generation (new rank() and size(), a new data
plane), runs the reset callbacks, broadcasts rank 0's state, and calls train again.
"""

from trainrun.common.basics import init, shutdown
from trainrun.common.elastic import run_fn
from trainrun.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from trainrun.torch.elastic.sampler import ElasticSampler
from trainrun.torch.elastic.state import ObjectState, State, TorchState

__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler", "HorovodInternalError",
           "HostsUpdatedInterrupt"]


def run(func):
    """Decorator: func(state, ...) runs in the elastic loop (see the module's doc)."""
    return run_fn(func, _reset)


def _reset():
    shutdown()
    init()
