"""A worker for the timeline test: run under `trainrun --timeline-filename FILE`, it runs a few
collectives, then rank 0 reads FILE and checks the Chrome trace: valid JSON (array format, closing
bracket optional), one named track per rank, every collective with its name, bytes and dtype on
every rank, its two phases nested inside it, and process-set collectives on their own track.
Prints "timeline ok" on success; exits 1 naming what is wrong otherwise."""

import json
import os
import sys

import torch

import trainrun.torch as hvd

hvd.init()
path = os.environ["TRAINRUN_TIMELINE"]
size = hvd.size()
hvd.allreduce(torch.ones(1000), name="grads")        # 4000 bytes of float32
hvd.allgather(torch.ones(2, 3, dtype=torch.float64), name="features")
pair = hvd.add_process_set([0, 1]) if size >= 2 else None
if pair is not None and hvd.rank() < 2:
    hvd.broadcast(torch.ones(5, dtype=torch.int16), root_rank=1, name="pair", process_set=pair)
hvd.barrier()  # every rank has written the events above before any rank passes this
if hvd.rank() == 0:
    text = open(path).read().rstrip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")

    def fail(why):
        print(f"timeline wrong: {why}", file=sys.stderr)
        sys.exit(1)

    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    if names != {r: f"rank {r}" for r in range(size)}:
        fail(f"track names {names}")
    ops = [e for e in events if e["ph"] == "X" and e.get("cat") != "phase"]
    for rank in range(size):
        mine = {e["name"]: e for e in ops if e["pid"] == rank}
        grads = mine.get("allreduce grads")
        if grads is None or grads["args"]["bytes"] != 4000 or grads["args"]["dtype"] != "float32":
            fail(f"rank {rank}'s allreduce event: {grads}")
        features = mine.get("allgather features")
        if features is None or features["args"]["dtype"] != "float64":
            fail(f"rank {rank}'s allgather event: {features}")
        if pair is not None and rank < 2:
            pair_event = mine.get("broadcast pair")
            if pair_event is None or pair_event["tid"] == 0 or pair_event["args"]["bytes"] != 10:
                fail(f"rank {rank}'s process-set broadcast event: {pair_event}")
        phases = [e for e in events if e["pid"] == rank and e.get("cat") == "phase"
                  and e["tid"] == 0]
        for op in (grads, features):
            inside = [p for p in phases
                      if op["ts"] <= p["ts"] and p["ts"] + p["dur"] <= op["ts"] + op["dur"]]
            if sorted(p["name"] for p in inside) != ["transfer and reduce", "wait for peers"]:
                fail(f"phases of rank {rank}'s {op['name']}: {inside}")
    print("timeline ok")
hvd.shutdown()
