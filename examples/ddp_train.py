"""A plain PyTorch DistributedDataParallel script, with no trainrun import.

    build/bin/trainrun -np 2 /usr/bin/python3 examples/ddp_train.py

It runs unchanged under trainrun (as under torchrun) because the launcher sets torchrun's
variables: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, which
init_process_group(init_method="env://") reads.
"""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    dist.init_process_group("gloo", init_method="env://")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.manual_seed(0)

    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0,
                                                        stratify=y)
    train_set = TensorDataset(x_train, y_train)
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True)
    loader = DataLoader(train_set, batch_size=32, sampler=sampler)

    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02 * world_size, momentum=0.9)

    for epoch in range(15):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            optimizer.step()

    with torch.no_grad():
        correct = (model(x_test).argmax(dim=1) == y_test).sum().float()
    dist.all_reduce(correct)  # every rank evaluated the whole test set
    accuracy = correct.item() / world_size / len(y_test)
    print(f"rank {rank} (local rank {local_rank}) of {world_size}: "
          f"test accuracy {accuracy:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
