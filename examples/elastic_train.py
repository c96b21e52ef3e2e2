"""Elastic data-parallel training of examples/train.py's digits MLP, the Horovod way: the job goes
on with the ranks that remain when one is lost.

    build/bin/trainrun -np 4 --min-np 2 /usr/bin/python3 examples/elastic_train.py

The model, the optimizer, an ElasticSampler and the step and epoch counters are a TorchState;
state.commit() every --batches-per-commit steps saves them. When a rank dies, the survivors'
collective raises HorovodInternalError; hvd.elastic.run restores the last commit, joins the job's
next generation (new rank and size), rescales the learning rate for the new size (a reset
callback), broadcasts rank 0's state, and the epoch resumes where it stopped, re-sharded.

For tests and the benchmark: --kill-rank R --kill-at-step S makes the rank that started as R kill
itself with SIGKILL after step S (mid-epoch); --kill-in-reset R makes the rank that started as R
kill itself in the reset that follows (once the launcher has published the next generation, before
this rank connects to it: the others are then forming a generation that has lost a member);
--times FILE appends "kill T" (just before each kill)
and "step T" (after the first step completed in each new generation) lines, wall-clock seconds;
--fail-on-host HOST makes every rank started on HOST exit 1 at once (a flapping host). A rank that
trainrun starts while the job runs (it grew onto a host of --host-discovery-script) joins the
newest generation and gets the state from rank 0 by the sync, as Horovod's do, and prints
"rank R (slot S, on HOST): joined at step N of epoch E on SIZE ranks".
Every rank checks that it resumed at the last commit (exit 3 otherwise); at the end rank 0 checks
that the parameters are bit-identical on every rank (exit 2 otherwise) and prints the accuracy
(exit 1 below --min-accuracy).
"""

import argparse
import functools
import hashlib
import os
import signal
import sys
import time

if "--fail-on-host" in sys.argv[:-1]:
    # Before the heavy imports: a broken machine fails fast.
    if os.environ.get("TRAINRUN_HOSTNAME") == sys.argv[sys.argv.index("--fail-on-host") + 1]:
        print("failing on purpose (--fail-on-host)", file=sys.stderr, flush=True)
        sys.exit(1)

try:
    import trainrun.torch as hvd
except ImportError:
    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(os.environ.get("TRAINRUN_BUILD_DIR",
                                                   os.path.join(_root, "build")), "python"))
    import trainrun.torch as hvd

import torch
import torch.nn.functional as F
from trainrun import _core
from trainrun.common.elastic import run_fn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import evaluate, load_data, make_model, parameter_hash  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.02, help="for one rank; scaled by size")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--batches-per-commit", type=int, default=4)
    parser.add_argument("--min-accuracy", type=float, default=0.0)
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--kill-at-step", type=int, default=-1)
    parser.add_argument("--kill-in-reset", type=int, default=-1)
    parser.add_argument("--times", default="")
    parser.add_argument("--step-sleep", type=float, default=0.0,
                        help="seconds each step sleeps from epoch --sleep-from-epoch on (tests: "
                             "keeps the job running while the launcher reacts)")
    parser.add_argument("--sleep-from-epoch", type=int, default=0)
    parser.add_argument("--sleep-until-size", type=int, default=0,
                        help="with --step-sleep: sleep only while the job has fewer ranks (tests: "
                             "waits for the job to grow, however long its new ranks take)")
    parser.add_argument("--fail-on-host", default="",
                        help="tests: a rank started on this host (TRAINRUN_HOSTNAME) exits 1 at "
                             "once, as on a broken machine")
    return parser.parse_args()


def note_time(path, what):
    if path:
        with open(path, "a") as f:
            f.write(f"{what} {time.time():.6f}\n")


def main():
    args = parse_args()
    hvd.init()
    start_rank = hvd.rank()  # this process's slot: its rank in the job's first generation
    torch.manual_seed(args.seed + hvd.rank())  # different on purpose: the sync fixes it
    x_train, y_train, x_test, y_test = load_data()

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(range(len(x_train)), shuffle=True, seed=args.seed)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0,
                                   step=0)
    # A rank started while the job runs (TRAINRUN_ELASTIC_SLOT) says where it joined, once.
    progress = {"last_commit": 0, "resumed": False, "timed": True,
                "joined": os.environ.get("TRAINRUN_ELASTIC_SLOT")}

    def on_reset():
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()
        progress["resumed"] = True
        progress["timed"] = False

    state.register_reset_callbacks([on_reset])

    def die_in_reset():
        # Waits for the generation the survivors now form, then dies before joining it.
        while _core.latest_generation() <= _core.generation():
            time.sleep(0.01)
        note_time(args.times, "kill")
        os.kill(os.getpid(), signal.SIGKILL)

    elastic_run = hvd.elastic.run
    if start_rank == args.kill_in_reset:
        elastic_run = functools.partial(run_fn, reset=die_in_reset)

    @elastic_run
    def train(state):
        if progress["joined"] is not None:
            print(f"rank {hvd.rank()} (slot {progress['joined']}, on "
                  f"{os.environ.get('TRAINRUN_HOSTNAME')}): joined at step {state.step} of epoch "
                  f"{state.epoch} on {hvd.size()} ranks", flush=True)
            progress["joined"] = None
        if progress["resumed"]:
            progress["resumed"] = False
            if state.step != progress["last_commit"]:
                print(f"rank {hvd.rank()}: resumed at step {state.step}, but the last commit was "
                      f"at step {progress['last_commit']}", file=sys.stderr, flush=True)
                sys.exit(3)
            print(f"rank {hvd.rank()} (started as {start_rank}): resumed at step {state.step} "
                  f"of epoch {state.epoch} on {hvd.size()} ranks (last commit: step "
                  f"{progress['last_commit']})", flush=True)
        while state.epoch < args.epochs:
            model.train()
            for batch_idx, b in enumerate(range(0, len(state.sampler), args.batch_size)):
                batch = torch.tensor(state.sampler.indices[b:b + args.batch_size])
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x_train[batch]), y_train[batch])
                loss.backward()
                optimizer.step()
                state.sampler.record_batch(batch_idx, args.batch_size)
                state.step += 1
                if args.step_sleep > 0 and state.epoch >= args.sleep_from_epoch and \
                        (args.sleep_until_size == 0 or
                                             hvd.size() < args.sleep_until_size):
                    time.sleep(args.step_sleep)
                if not progress["timed"]:
                    progress["timed"] = True
                    if hvd.rank() == 0:
                        note_time(args.times, "step")
                if start_rank == args.kill_rank and state.step == args.kill_at_step:
                    note_time(args.times, "kill")
                    os.kill(os.getpid(), signal.SIGKILL)
                if state.step % args.batches_per_commit == 0:
                    # commit() saves, then checks for host updates, which may raise: the state
                    # is committed once it is called.
                    progress["last_commit"] = state.step
                    state.commit()
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            progress["last_commit"] = state.step
            state.commit()
            if hvd.rank() == 0 and (state.epoch % 5 == 0 or state.epoch == args.epochs):
                accuracy = evaluate(model, x_test, y_test)
                print(f"epoch {state.epoch:3d}  step {state.step}  test accuracy "
                      f"{accuracy:.4f}  on {hvd.size()} ranks", flush=True)
            elif state.epoch % 5 == 0 or state.epoch == args.epochs:
                evaluate(model, x_test, y_test)

    start = time.perf_counter()
    train(state)
    elapsed = time.perf_counter() - start
    accuracy = evaluate(model, x_test, y_test)
    digest = parameter_hash(model)
    digests = hvd.allgather_object(digest)
    identical = all(d == digests[0] for d in digests)
    if hvd.rank() == 0:
        print(f"final test accuracy {accuracy:.4f} on {hvd.size()} rank(s) after {state.step} "
              f"steps in {elapsed:.2f} s; parameters "
              f"{'bit-identical on every rank' if identical else 'DIFFER across ranks'}",
              flush=True)
    hvd.shutdown()
    if not identical:
        sys.exit(2)
    if accuracy < args.min_accuracy:
        print(f"accuracy {accuracy:.4f} is below --min-accuracy {args.min_accuracy}",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
