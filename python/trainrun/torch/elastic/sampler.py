"""ElasticSampler: a sampler that shards a data set over the ranks and, after the job's ranks
change, resumes the epoch where it stopped, re-sharded for the new size (horovod.torch.elastic's).

Every rank draws the same shuffle of the epoch (seed + epoch), leaves out the indices already
processed this epoch, pads the rest to a multiple of size() and takes every size()-th index from
rank(). record_batch(batch_idx, batch_size) marks batch `batch_idx` processed on every rank at once
(each rank can compute the others' shards), so the indices of a rank that is lost afterwards are
not trained on twice; commit() saves the record with the model.
"""

import math
import random

import torch.utils.data

import trainrun

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
        self.processed_indices = set()
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self._padded = []
        self.indices = []
        self.reset()

    def set_epoch(self, epoch):
        """Starts epoch `epoch`: nothing processed yet."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Marks batch `batch_idx` (of `batch_size` per rank) of the current iteration processed,
        on every rank's shard."""
        start = batch_idx * batch_size
        end = min(start + batch_size, self.num_samples)
        for r in range(self.num_replicas):
            self.processed_indices.update(self._padded[r::self.num_replicas][start:end])

    def record_indices(self, indices):
        """Marks `indices` (data set indices) processed."""
        self.processed_indices.update(indices)

    def get_indices(self, batch_idx, batch_size):
        """This rank's indices of batch `batch_idx` of the current iteration."""
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def state_dict(self):
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices)}

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def reset(self):
        """Re-shards the epoch's remaining indices for the job's current size and this rank."""
        self.num_replicas = trainrun.size()
        self.rank = trainrun.rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = [i for i in order if i not in self.processed_indices]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas
        padded = self.remaining_indices[:]
        while padded and len(padded) < self.total_size:
            padded += padded[:self.total_size - len(padded)]
        self._padded = padded
        self.indices = padded[self.rank:self.total_size:self.num_replicas]

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
