"""One rank of DDP training on synthetic data: the same model (same initial weights), the
same data and the same optimizer, wrapped once in DDP over the shoal default group and once
over a Gloo group of the same ranks, trained STEPS steps side by side. Rank 0 prints
"RESULTS {"shoal": [...], "gloo": [...], "max_param_diff": ..., "bitwise": ...}" where the
losses are the global mean loss per step (all ranks)."""
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shoal_torch  # noqa: E402,F401

STEPS = int(os.environ.get("DDP_STEPS", "50"))
KILL_RANK = int(os.environ.get("DDP_KILL_RANK", "-1"))
KILL_STEP = int(os.environ.get("DDP_KILL_STEP", "5"))
ONLY_SHOAL = os.environ.get("DDP_ONLY_SHOAL") == "1"


def model():
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh(),
                         nn.Linear(128, 10))


_TEACHER = torch.randn(32, 10, generator=torch.Generator().manual_seed(7))


def batch(rank, step):
    """A learnable task (labels from a fixed random linear teacher): the loss falls."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 32, generator=g)
    y = (x @ _TEACHER).argmax(1)
    return x, y


def main():
    if KILL_RANK >= 0:
        print("ready pid %d" % os.getpid(), flush=True)
    timeout = float(os.environ.get("DDP_TIMEOUT_S", "60"))
    from datetime import timedelta
    dist.init_process_group("shoal", timeout=timedelta(seconds=timeout))
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = None if ONLY_SHOAL else dist.new_group(backend="gloo")
    # bucket_cap_mb small: several buckets, so several all_reduce works overlap backward
    runs = {"shoal": DDP(model(), process_group=None, bucket_cap_mb=0.02)}
    if gloo is not None:
        runs["gloo"] = DDP(model(), process_group=gloo, bucket_cap_mb=0.02)
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for k, m in runs.items()}
    losses = {k: [] for k in runs}
    loss_fn = nn.CrossEntropyLoss()
    for step in range(STEPS):
        if step == KILL_STEP and rank == KILL_RANK:
            sig = getattr(signal, os.environ.get("DDP_KILL_SIGNAL", "SIGKILL"))
            print("rank %d: %s to myself at step %d" % (rank, sig.name, step), flush=True)
            os.kill(os.getpid(), sig)
        x, y = batch(rank, step)
        for k, m in runs.items():
            opts[k].zero_grad()
            loss = loss_fn(m(x), y)
            loss.backward()
            opts[k].step()
            t = loss.detach().clone()
            dist.all_reduce(t, group=gloo if k == "gloo" else None)
            losses[k].append(t.item() / n)
        if rank == 0 and step % 10 == 0:
            print("step %d %s" % (step, {k: v[-1] for k, v in losses.items()}), flush=True)
    out = {"losses": losses, "t": time.time()}
    if gloo is not None:
        ps = list(runs["shoal"].parameters())
        pg = list(runs["gloo"].parameters())
        out["max_param_diff"] = max((a - b).abs().max().item() for a, b in zip(ps, pg))
        out["max_param"] = max(a.abs().max().item() for a in ps)
        out["bitwise"] = all(torch.equal(a, b) for a, b in zip(ps, pg))
        # replicas agree across ranks (DDP's own invariant), checked through shoal
        flat = torch.cat([p.detach().flatten() for p in ps])
        ref = flat.clone()
        dist.broadcast(ref, src=0)
        out["replicas_equal"] = bool(torch.equal(flat, ref))
    if rank == 0:
        print("RESULTS " + json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
