"""TorchState: an elastic State holding a model, an optimizer, ElasticSamplers and plain values
(horovod.torch.elastic.state's). commit() keeps a copy of each in memory; restore() loads the
copies back; sync() broadcasts rank 0's parameters, optimizer state, samplers and values."""

import copy

import torch

from trainrun.common.basics import rank
from trainrun.common.elastic import ObjectState, State
from trainrun.torch.elastic.sampler import ElasticSampler
from trainrun.torch.functions import (allgather_object, broadcast_object,
                                      broadcast_optimizer_state, broadcast_parameters)

__all__ = ["State", "ObjectState", "TorchState"]


class _Handler:
    """Saves, restores and syncs one value of a TorchState that plain pickling would not."""

    def __init__(self, value):
        self.value = value
        self.save()

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()


class _ModelHandler(_Handler):
    def save(self):
        self._saved = {k: v.detach().clone() for k, v in self.value.state_dict().items()}

    def restore(self):
        self.value.load_state_dict(self._saved)

    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(copy.deepcopy(self._saved))

    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_Handler):
    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(copy.deepcopy(self._saved))

    def sync(self):
        # Rank 0's epoch and processed_num (every rank records the same batches, as Horovod's
        # sync broadcasts), with the union of the indices every rank recorded; each rank then
        # re-shards the rest of the epoch for the new size.
        processed = set().union(*allgather_object(set(self.value.processed_indices)))
        state = self.value.state_dict()
        state["processed_indices"] = processed
        self.value.load_state_dict(broadcast_object(state, root_rank=0))


def _handler_for(value):
    if isinstance(value, torch.nn.Module):
        return _ModelHandler(value)
    if isinstance(value, torch.optim.Optimizer):
        return _OptimizerHandler(value)
    if isinstance(value, ElasticSampler):
        return _SamplerHandler(value)
    return None


class TorchState(ObjectState):
    """TorchState(model=, optimizer=, **kwargs): the model's parameters and buffers, the
    optimizer's state, any ElasticSampler, and every other keyword as a plain attribute
    (state.epoch, state.step), all saved by commit() and restored after a lost rank."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        self._handlers = {}
        plain = {}
        for name, value in kwargs.items():
            handler = _handler_for(value)
            if handler is not None:
                self._handlers[name] = handler
                object.__setattr__(self, name, value)
            else:
                plain[name] = value
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **plain)

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self):
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers")
        if handlers is not None and name in handlers:
            handlers[name].value = value
        super().__setattr__(name, value)
