"""Data-parallel training of a small MLP on scikit-learn's digits, the Horovod way.

    scripts/setup.sh
    build/bin/trainrun -np 4 /usr/bin/python3 examples/train.py

Each rank trains on its shard of the training set; DistributedOptimizer averages the gradients
across ranks while backward runs; the learning rate is scaled by the number of ranks (the global
batch grows with it); rank 0's initial parameters and optimizer state are broadcast so all ranks
start alike; loss and accuracy are averaged across ranks. At the end every rank prints a hash of
its parameters, and rank 0 checks (through an allgather) that they are bit-identical.

Run from the repository root: when `trainrun` is not importable (not installed, no PYTHONPATH),
the script looks for the package the build made in build/python (or $TRAINRUN_BUILD_DIR/python).
Options: --epochs N, --batch-size B (per rank), --lr LR (for one rank), --min-accuracy A (exit 1
below it), --device cuda (each rank trains on GPU local_rank % GPUs; the gradients are reduced on
the GPU, over NCCL when every rank has a GPU of its own, else through pinned host memory),
--use-adasum (DistributedOptimizer(op=Adasum), with Horovod's rule: the learning rate is not
scaled by the number of ranks).
"""

import argparse
import hashlib
import os
import sys
import time

try:
    import trainrun.torch as hvd
except ImportError:
    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(os.environ.get("TRAINRUN_BUILD_DIR",
                                                   os.path.join(_root, "build")), "python"))
    import trainrun.torch as hvd

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.02,
                        help="for one rank; scaled by size (not with --use-adasum)")
    parser.add_argument("--use-adasum", action="store_true",
                        help="combine the ranks' updates by Adasum instead of averaging")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--min-accuracy", type=float, default=0.0,
                        help="exit with status 1 when the final test accuracy is lower")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: train on GPU local_rank %% the host's GPUs")
    return parser.parse_args()


def load_data():
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0,
                                                        stratify=y)
    return (torch.from_numpy(x_train), torch.from_numpy(y_train), torch.from_numpy(x_test),
            torch.from_numpy(y_test))


def make_model():
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 10))


def parameter_hash(model):
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def evaluate(model, x, y):
    """Accuracy on this rank's shard of (x, y), summed over ranks: (correct, count) of all."""
    idx = torch.arange(hvd.rank(), len(x), hvd.size(), device=x.device)  # each item once
    with torch.no_grad():
        correct = (model(x[idx]).argmax(dim=1) == y[idx]).sum()
    totals = hvd.allreduce(torch.tensor([int(correct), len(idx)], dtype=torch.int64,
                                        device=x.device),
                           op=hvd.Sum, name="accuracy")
    return int(totals[0]) / int(totals[1])


def main():
    args = parse_args()
    hvd.init()
    torch.manual_seed(args.seed + hvd.rank())  # different on purpose: the broadcast fixes it
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
        torch.cuda.set_device(device)
    x_train, y_train, x_test, y_test = (t.to(device) for t in load_data())

    model = make_model().to(device)
    # Horovod's rule: averaging scales the rate with the global batch; Adasum does not need it.
    lr_scaler = 1 if args.use_adasum else hvd.size()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         op=hvd.Adasum if args.use_adasum else hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    start = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        shard = torch.tensor(hvd.shard_indices(len(x_train), shuffle=True, seed=args.seed,
                                               epoch=epoch), device=device)
        loss_sum = torch.zeros(1, device=device)
        batches = 0
        for b in range(0, len(shard), args.batch_size):
            batch = shard[b:b + args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_train[batch]), y_train[batch])
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach()
            batches += 1
        train_loss = hvd.allreduce(loss_sum / batches, name="train_loss").item()
        if epoch % 5 == 4 or epoch == args.epochs - 1:
            accuracy = evaluate(model, x_test, y_test)
            if hvd.rank() == 0:
                print(f"epoch {epoch + 1:3d}  train loss {train_loss:.4f}  "
                      f"test accuracy {accuracy:.4f}", flush=True)
    elapsed = time.perf_counter() - start

    accuracy = evaluate(model, x_test, y_test)
    digest = parameter_hash(model)
    rank = hvd.rank()
    print(f"rank {rank}: parameters sha256 {digest}", flush=True)
    digests = hvd.allgather_object(digest)
    identical = all(d == digests[0] for d in digests)
    if rank == 0:
        print(f"final test accuracy {accuracy:.4f} on {hvd.size()} rank(s) ({device.type}) in "
              f"{elapsed:.2f} s; "
              f"parameters {'bit-identical on every rank' if identical else 'DIFFER across ranks'}",
              flush=True)
    hvd.shutdown()
    if not identical:
        sys.exit(2)
    if accuracy < args.min_accuracy:
        print(f"rank {rank}: accuracy {accuracy:.4f} is below --min-accuracy "
              f"{args.min_accuracy}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
