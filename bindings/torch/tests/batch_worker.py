"""One rank of the batch_isend_irecv checks (CPU tensors). Every rank sends before it receives
in each batch, with tensors larger than shoal's transport buffers (1M float32, 4 MiB; the
shared-memory buffers hold 256 KiB): the batch runs inside one shoal group, which posts its
sends and receives at once. Run one after the other, both ranks sat in their send until the
group's timeout (10 s here). Cases: 2 ranks exchange both ways with one peer; on 3 ranks a
ring (to next, from prev); then an all_reduce and a plain send/recv in order, to show the
group left the channels in step. Rank 0 prints "RESULTS {...}" (case -> "ok" or why not)."""
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shoal_torch  # noqa: E402,F401

R = int(os.environ["RANK"])
N = int(os.environ["WORLD_SIZE"])
COUNT = 1 << 20
TIMEOUT_S = 10


def payload(rank, k):
    return torch.arange(COUNT, dtype=torch.float32) + rank * 1000.0 + k * 0.5


def check(res, name, fn):
    t0 = time.monotonic()
    try:
        why = fn()
    except Exception as e:  # noqa: BLE001 - the error is the verdict
        why = "%s: %s" % (type(e).__name__, str(e)[:400])
    took = time.monotonic() - t0
    if why is None and took > TIMEOUT_S / 2:
        why = "took %.1f s" % took
    res[name] = "ok" if why is None else why


def both_ways():
    peer = 1 - R
    out = payload(R, 0)
    got = torch.zeros(COUNT)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, out, peer),
                                   dist.P2POp(dist.irecv, got, peer)])
    for q in reqs:
        q.wait()
    return None if torch.equal(got, payload(peer, 0)) else "wrong data from rank %d" % peer


def ring():
    nxt, prv = (R + 1) % N, (R - 1) % N
    a, b = payload(R, 1), payload(R, 2)
    ga, gb = torch.zeros(COUNT), torch.zeros(COUNT)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, a, nxt),
                                   dist.P2POp(dist.isend, b, prv),
                                   dist.P2POp(dist.irecv, ga, prv),
                                   dist.P2POp(dist.irecv, gb, nxt)])
    for q in reqs:
        q.wait()
    if not torch.equal(ga, payload(prv, 1)):
        return "wrong data from rank %d" % prv
    return None if torch.equal(gb, payload(nxt, 2)) else "wrong data from rank %d" % nxt


def after():
    t = torch.ones(8)
    dist.all_reduce(t)
    if not torch.equal(t, torch.full((8,), float(N))):
        return "all_reduce after the batches: %s" % t
    x = torch.full((4,), float(R))
    if R == 0:
        dist.send(x, 1)
    elif R == 1:
        dist.recv(x, 0)
        if not torch.equal(x, torch.zeros(4)):
            return "recv after the batches: %s" % x
    return None


def main():
    dist.init_process_group("shoal", timeout=timedelta(seconds=TIMEOUT_S))
    res = {}
    if N == 2:
        check(res, "both_ways", both_ways)
        check(res, "both_ways_again", both_ways)
    check(res, "ring", ring)
    check(res, "after", after)
    if R == 0:
        print("RESULTS " + json.dumps(res), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
