#!/usr/bin/env python3
"""Where a rank's CPU goes during perf/torch_bench.py's DDP step (the mlp model, SGD, batch 8,
one intra-op thread): median step and backward time, and the CPU time per step of each thread
of the rank (from /proc/self/task: the main thread, the shoal backend's worker, Gloo's
threads), for one backend at a time.

  python3 perf/torch_ddp_threads.py shoal|gloo|nocomm [--ranks 2] [--steps 10]

nocomm: DDP over Gloo with a communication hook that communicates nothing (DDP's own bucket
copies, no backend). Every rank prints one "SUMMARY" line: step, main thread CPU, CPU of the
other threads (the backend's)."""
import argparse
import os
import socket
import subprocess
import sys
import time


def thread_cpu():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/stat" % tid) as f:
                st = f.read()
            with open("/proc/self/task/%s/comm" % tid) as f:
                name = f.read().strip()
        except OSError:
            continue
        rest = st[st.rindex(")") + 2:].split()
        out[tid] = (name, (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK"))
    return out


def worker(be, steps):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import shoal_torch  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group("gloo" if be == "nocomm" else be)
    rank, n = dist.get_rank(), dist.get_world_size()
    sync = dist.new_group(backend="gloo") if be == "shoal" else None
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                      nn.Linear(4096, 1024))
    ddp = nn.parallel.DistributedDataParallel(m)
    if be == "nocomm":
        def no_comm(state, bucket):
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer().div_(n))
            return fut
        ddp.register_comm_hook(None, no_comm)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    x, y = torch.randn(8, 1024), torch.randn(8, 1024)
    times, bwd, cpu0 = [], [], None
    for s in range(steps + 2):
        dist.barrier(group=sync)
        if s == 2:
            cpu0 = thread_cpu()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        if s >= 2:
            times.append(time.perf_counter() - t0)
            bwd.append(t2 - t1)
    cpu1, me = thread_cpu(), str(os.getpid())
    per = {t: (nm, (c - cpu0.get(t, (nm, 0.0))[1]) / steps) for t, (nm, c) in cpu1.items()}
    busy = ", ".join("%s/%s %.1f ms" % (nm, t, 1e3 * c) for t, (nm, c) in per.items() if c > 5e-4)
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    print("SUMMARY rank %d %s: median step %.4f s, backward %.4f s, CPU per step: main %.4f s, "
          "other threads %.4f s (%s)" % (rank, be, med(times), med(bwd), per[me][1],
                                         sum(c for t, (nm, c) in per.items() if t != me), busy),
          flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("backend", choices=("shoal", "gloo", "nocomm"))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a.backend, a.steps)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), a.backend, "--worker",
                               "--steps", str(a.steps)],
                              env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.ranks),
                                       LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=str(port), OMP_NUM_THREADS="1"))
             for r in range(a.ranks)]
    return max((p.wait() for p in procs), key=abs)


if __name__ == "__main__":
    sys.exit(main())
