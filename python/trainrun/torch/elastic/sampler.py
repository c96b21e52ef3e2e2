"""ElasticSampler: a sampler that shards a data set over the ranks and, after the job's ranks
change, resumes the epoch where it stopped, re-sharded for the new size (horovod.torch.elastic's).

Every rank draws the same shuffle of the epoch (seed + epoch), leaves out what was already
processed this epoch, pads the rest to a multiple of size() and takes every size()-th index from
rank(). What was processed is recorded in either of Horovod's two ways:
  - record_batch(batch_idx, batch_size) (Horovod's since 2021): processed_num grows by
    batch_size * size(), the samples every rank took this step from the front of the remaining
    order;
  - record_indices(indices) (Horovod's earlier API, with get_indices): the data set indices
    processed, kept in processed_indices and left out wherever they are in the order.
commit() saves both with the model (state_dict), and after a reset the rest of the epoch is
re-sharded for the new size. Use one way per epoch: processed_num counts from the front of the
order once the recorded indices are left out.
"""

import math
import random

import torch.utils.data

from trainrun.common import basics as _basics

__all__ = ["ElasticSampler"]


class ElasticSampler(torch.utils.data.Sampler):
    """ElasticSampler(dataset, shuffle=True, seed=0): yields this rank's indices of `dataset` (any
    object with a len()) for the current epoch's remaining samples."""

    def __init__(self, dataset, shuffle=True, seed=0):
        super().__init__(dataset)
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.processed_indices = set()
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.indices = []
        self.reset()

    def set_epoch(self, epoch):
        """Starts epoch `epoch`: nothing processed yet. Call it at the end of an epoch, so that a
        reset in the middle of one does not process its samples again."""
        self.epoch = epoch
        self.processed_num = 0
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Records that every rank processed one batch of `batch_size` samples (Horovod's:
        processed_num grows by batch_size * size(); `batch_idx` is not needed)."""
        del batch_idx
        self.processed_num += batch_size * self.num_replicas

    def record_indices(self, indices):
        """Records that the data set indices `indices` were processed (e.g. this rank's batch,
        from get_indices); sync() unites every rank's."""
        self.processed_indices.update(indices)

    def get_indices(self, batch_idx, batch_size):
        """This rank's indices of batch `batch_idx` (of `batch_size`) of the current iteration."""
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def state_dict(self):
        return {"epoch": self.epoch, "processed_num": self.processed_num,
                "processed_indices": set(self.processed_indices)}

    def load_state_dict(self, state_dict):
        """Loads a state_dict() (Horovod's, with processed_num only, or its earlier one, with
        processed_indices only) and re-shards the rest of the epoch."""
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict.get("processed_num", 0)
        self.processed_indices = set(state_dict.get("processed_indices", ()))
        self.reset()

    def reset(self):
        """Re-shards the epoch's remaining indices for the job's current size and this rank."""
        self.num_replicas = _basics.size()
        self.rank = _basics.rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        if self.processed_indices:
            order = [i for i in order if i not in self.processed_indices]
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas
        padded = self.remaining_indices[:]
        while padded and len(padded) < self.total_size:
            padded += padded[:self.total_size - len(padded)]
        self.indices = padded[self.rank:self.total_size:self.num_replicas]

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
