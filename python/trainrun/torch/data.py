"""Sharding a data set across the job's ranks: shard_indices (this rank's indices) and
DistributedSampler (torch's, with the job's size and this rank filled in)."""

import torch
import torch.utils.data

from trainrun.common import basics as _basics
from trainrun.common.basics import rank, size


def shard_indices(n, rank_=None, size_=None, shuffle=False, seed=0, epoch=0, drop_last=False):
    """The indices of a data set of `n` items that this rank should use: every size()-th index
    starting at rank() (after a shuffle that is the same on every rank, given seed and epoch).

    Without drop_last, the list is padded (repeating from the start) so every rank gets
    ceil(n / size) items, as torch's DistributedSampler does, and every rank runs the same number
    of steps.
    """
    rank_ = rank() if rank_ is None else rank_
    size_ = size() if size_ is None else size_
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = torch.randperm(n, generator=g).tolist()
    else:
        order = list(range(n))
    if drop_last:
        order = order[:n - n % size_]
    else:
        per_rank = -(-n // size_)
        pad = per_rank * size_ - n
        order += (order * (pad // max(n, 1) + 1))[:pad]
    return order[rank_::size_]


class DistributedSampler(torch.utils.data.distributed.DistributedSampler):
    """torch's DistributedSampler with num_replicas and rank taken from trainrun.

    Call set_epoch(epoch) before each epoch so the shuffle differs between epochs.
    """

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0,
                 drop_last=False):
        super().__init__(dataset, num_replicas=size() if num_replicas is None else num_replicas,
                         rank=_basics.rank() if rank is None else rank, shuffle=shuffle,
                         seed=seed, drop_last=drop_last)
