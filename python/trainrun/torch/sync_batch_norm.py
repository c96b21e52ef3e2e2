"""SyncBatchNorm: batch normalization whose batch statistics are those of every rank's batch
together, as horovod.torch.SyncBatchNorm (and torch.nn.SyncBatchNorm) compute them.

    model = torch.nn.Sequential(torch.nn.Linear(8, 4), trainrun.torch.SyncBatchNorm(4))

In training, each rank sums its inputs, their squares and its element count per channel; one
allreduce (Sum) gives the global mean and variance. The allreduce is trainrun.torch's
differentiable one, whose gradient is an allreduce of the gradient, so backward is exact without a
hand-written gradient. In evaluation it is plain batch norm over the running statistics.
"""

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from trainrun.common.ops import Sum
from trainrun.common.process_sets import global_process_set
from trainrun.torch.ops import allreduce


class SyncBatchNorm(_BatchNorm):
    """Batch norm over the batches of every rank (of `process_set`, default the job)."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):  # pylint: disable=redefined-builtin
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input):  # pylint: disable=redefined-builtin
        self._check_input_dim(input)
        if not self.training and self.track_running_stats:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                                False, 0.0, self.eps)
        channels = input.shape[1]
        flat = input.transpose(0, 1).reshape(channels, -1)
        count = torch.full((1,), float(flat.shape[1]), dtype=input.dtype)
        stats = torch.cat([flat.sum(1), (flat * flat).sum(1), count])
        total = allreduce(stats, op=Sum, name="SyncBatchNorm",
                          process_set=self.process_set or global_process_set)
        n = total[-1]
        mean = total[:channels] / n
        var = total[channels:2 * channels] / n - mean * mean
        if self.track_running_stats:
            momentum = self.momentum if self.momentum is not None else 0.0
            with torch.no_grad():
                self.num_batches_tracked += 1
                if self.momentum is None:
                    momentum = 1.0 / float(self.num_batches_tracked)
                unbiased = var.detach() * (n.detach() / (n.detach() - 1).clamp(min=1))
                self.running_mean.mul_(1 - momentum).add_(mean.detach() * momentum)
                self.running_var.mul_(1 - momentum).add_(unbiased * momentum)
        shape = [1, channels] + [1] * (input.dim() - 2)
        out = (input - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out
