"""One rank of the CUDA checks (test_cuda.py); CUDA_MODE says which:

  ops     every operation x dtype on CUDA tensors, against the exact result and against the
          same operation on CPU tensors through shoal (the CPU reference); then CUDA futures,
          mixed devices, a batch of CPU and CUDA tensors, and last stream order (a side
          stream), the caching allocator (recordStream). Each verdict is printed as it comes
          (VERDICT lines).
  ddp     DDP on CUDA over shoal vs DDP on the CPU over Gloo, same model and data.
  fail    rank 1 dies; rank 0's CUDA collectives must raise, naming it, within the timeout.
  cpu     (runs without a GPU) CPU collectives of a CUDA build never initialise CUDA; a CUDA
          tensor cannot even be made without a GPU, and the group still works after trying.

Rank r uses cuda:(r % device count). Rank 0 prints "RESULTS {...}"."""
import json
import os
import sys
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shoal_torch  # noqa: E402,F401
from cases import DTYPES, OPS, case_name  # noqa: E402
from ops_worker import COUNT, RED, data, expect_reduce  # noqa: E402

R = int(os.environ["RANK"])
N = int(os.environ["WORLD_SIZE"])
MODE = os.environ.get("CUDA_MODE", "ops")


def run_op(op, dtype, dev):
    """Runs op through shoal with tensors on dev. Returns (result, exact) on the CPU, or None
    where the result is unspecified on this rank (a non-root of reduce / gather)."""
    kind = op.split("_")[-1]

    def d(rank, count=COUNT, k="sum"):
        return data(rank, dtype, count, k).to(dev)

    if op.startswith("all_reduce"):
        t = d(R, k=kind)
        w = dist.all_reduce(t, op=RED[kind], async_op=True)
        v = w.get_future().wait()  # CUDA: the current stream waits for the event
        assert v[0] is t or torch.equal(v[0], t), "future value is not the tensor"
        w.wait()
        return t.cpu(), expect_reduce(dtype, kind)
    if op == "broadcast":
        t = d(R)
        dist.broadcast(t, src=N - 1)
        return t.cpu(), data(N - 1, dtype)
    if op == "reduce_sum":
        t = d(R)
        dist.reduce(t, dst=N // 2, op=dist.ReduceOp.SUM)
        return (t.cpu(), expect_reduce(dtype, "sum")) if R == N // 2 else None
    if op == "all_gather":
        t = d(R)
        outs = [torch.empty_like(t) for _ in range(N)]
        dist.all_gather(outs, t)
        return torch.stack(outs).cpu(), torch.stack([data(r, dtype) for r in range(N)])
    if op == "all_gather_into_tensor":
        t = d(R).view(-1, 1)
        out = torch.empty(N * COUNT, 1, dtype=dtype, device=dev)
        dist.all_gather_into_tensor(out, t)
        return out.cpu(), torch.cat([data(r, dtype).view(-1, 1) for r in range(N)])
    if op == "reduce_scatter_sum":
        ins = [d(R)[k:k + 97].clone() for k in range(N)]
        out = torch.empty(97, dtype=dtype, device=dev)
        dist.reduce_scatter(out, ins, op=dist.ReduceOp.SUM)
        return out.cpu(), expect_reduce(dtype, "sum")[R:R + 97]
    if op == "reduce_scatter_tensor_sum":
        t = d(R, count=N * 257)
        out = torch.empty(257, dtype=dtype, device=dev)
        dist.reduce_scatter_tensor(out, t, op=dist.ReduceOp.SUM)
        return out.cpu(), expect_reduce(dtype, "sum", N * 257)[R * 257:(R + 1) * 257]
    if op == "all_to_all_single_equal":
        t = d(R, count=N * 6).view(N * 3, 2)
        out = torch.empty_like(t)
        dist.all_to_all_single(out, t)
        return out.cpu(), torch.cat([data(r, dtype, N * 6).view(N * 3, 2)[3 * R:3 * R + 3]
                                     for r in range(N)])
    if op == "all_to_all_single_unequal":
        def splits_from(r):
            return [r + k + 1 for k in range(N)]

        def rows(r):
            return data(r, dtype, sum(splits_from(r)) * 3).view(-1, 3)
        outs = [r + R + 1 for r in range(N)]
        out = torch.empty(sum(outs), 3, dtype=dtype, device=dev)
        dist.all_to_all_single(out, rows(R).to(dev), outs, splits_from(R))
        return out.cpu(), torch.cat([rows(r)[sum(splits_from(r)[:R]):sum(splits_from(r)[:R + 1])]
                                     for r in range(N)])
    if op == "all_to_all":
        ins = [d(R, count=R + k + 1) for k in range(N)]
        outs = [torch.empty(r + R + 1, dtype=dtype, device=dev) for r in range(N)]
        dist.all_to_all(outs, ins)
        return torch.cat(outs).cpu(), torch.cat([data(r, dtype, r + R + 1) for r in range(N)])
    if op == "gather":
        t = d(R)
        outs = [torch.empty_like(t) for _ in range(N)] if R == N - 1 else None
        dist.gather(t, outs, dst=N - 1)
        return (torch.stack(outs).cpu(), torch.stack([data(r, dtype) for r in range(N)])
                if R == N - 1 else None)
    if op == "scatter":
        ins = [d(10 + r) for r in range(N)] if R == 0 else None
        out = torch.empty(COUNT, dtype=dtype, device=dev)
        dist.scatter(out, ins, src=0)
        return out.cpu(), data(10 + R, dtype)
    if op == "send_recv":
        if N == 1:
            return None
        t = d(R)
        got = torch.empty_like(t)
        nxt, prv = (R + 1) % N, (R - 1) % N
        if R % 2 == 0:
            dist.send(t, nxt)
            dist.recv(got, prv)
        else:
            dist.recv(got, prv)
            dist.send(t, nxt)
        return got.cpu(), data(prv, dtype)
    raise AssertionError("unknown op " + op)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def verdict(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a failure is a verdict; the next case still runs
        traceback.print_exc()
        return "raised %s: %s" % (type(e).__name__, str(e)[:400])


def op_case(op, dtype, dev):
    got = run_op(op, dtype, dev)
    ref = run_op(op, dtype, torch.device("cpu"))  # the same operation on CPU tensors
    if got is None:
        return "ok"
    if not same(got[0], got[1]):
        return "CUDA result wrong: got %s want %s" % (got[0].flatten()[:6].tolist(),
                                                      got[1].flatten()[:6].tolist())
    if not same(got[0], ref[0]):
        return "CUDA and CPU results differ"
    return "ok"


def side_stream(dev):
    """The collective runs on the side stream behind a long kernel; wait() makes the default
    stream wait for it, the host does not block, and is_completed() follows the stream."""
    t = torch.zeros(1 << 20, device=dev)
    s = torch.cuda.Stream(device=dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(s):
        torch.cuda._sleep(int(3e8))  # ~0.1-0.2 s of GPU time before the collective
        t.fill_(R + 1)
        w = dist.all_reduce(t, async_op=True)
    t0 = time.monotonic()
    pending = not w.is_completed()
    w.wait()  # the default stream waits for the side stream's event
    host_s = time.monotonic() - t0
    got = t.clone()  # on the default stream: after the collective
    torch.cuda.synchronize(dev)
    done_after_sync = w.is_completed()
    want = N * (N + 1) / 2
    if not bool((got == want).all()):
        return "default stream read %s, want %s: wait() did not order it" % (
            got[:4].tolist(), want)
    if not pending:
        return "is_completed() was true while the side stream was still sleeping"
    if host_s > 0.05:
        return "wait() blocked the host %.3f s" % host_s
    if not done_after_sync or not w.is_success():
        return "not completed after synchronize"
    return "ok"


def record_stream(dev):
    """A tensor freed on the host while its collective waits on a side stream must not be
    handed to a new tensor before the stream passed the collective."""
    n = 1 << 18
    u = torch.full((n,), float(R + 1), device=dev)  # allocated on the default stream
    s = torch.cuda.Stream(device=dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(s):
        torch.cuda._sleep(int(3e8))
        dist.all_reduce(u, async_op=True)
    ptr = u.data_ptr()
    del u  # without recordStream the block would be free for the default stream now
    v = torch.full((n,), 7.0, device=dev)  # default stream, same size
    torch.cuda.synchronize(dev)
    if v.data_ptr() == ptr:
        return "the block was reused while its collective was pending"
    if not bool((v == 7.0).all()):
        return "a new tensor was overwritten by a pending collective"
    return "ok"


def future_then(dev):
    t = torch.full((1000,), float(R + 1), device=dev)
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    got = fut.wait()
    want = N * (N + 1)
    return "ok" if bool((got == want).all()) else "got %s want %s" % (got[:3].tolist(), want)


def mixed(dev):
    try:
        dist.all_gather_into_tensor(torch.empty(N * 4), torch.ones(4, device=dev))
    except ValueError as e:
        return "ok" if "mixes CPU and CUDA" in str(e) else "message: %s" % e
    except Exception as e:  # noqa: BLE001
        return "raised %s: %s" % (type(e).__name__, e)
    return "did not raise"


def mixed_batch(dev):
    """batch_isend_irecv of CPU and CUDA tensors issued on a side stream behind a long kernel:
    the one Work it returns must cover both kinds. It was the CPU batch's alone: result() and
    its future held the CPU tensors only, and its wait() did not order the caller's stream
    after the CUDA receive, so the default stream could read the buffer before the data."""
    if N == 1:
        return "ok"
    nxt, prv = (R + 1) % N, (R - 1) % N
    cpu_out, cpu_in = torch.full((64,), float(R)), torch.zeros(64)
    gpu_out = torch.full((1 << 16,), float(R + 10), device=dev)
    gpu_in = torch.zeros(1 << 16, device=dev)
    # the CUDA pair in an order that needs no buffering: even ranks send first
    gpu_ops = [dist.P2POp(dist.isend, gpu_out, nxt), dist.P2POp(dist.irecv, gpu_in, prv)]
    ops = [dist.P2POp(dist.isend, cpu_out, nxt), dist.P2POp(dist.irecv, cpu_in, prv)]
    ops += gpu_ops if R % 2 == 0 else gpu_ops[::-1]
    s = torch.cuda.Stream(device=dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(s):
        torch.cuda._sleep(int(3e8))  # ~0.1-0.2 s of GPU time before the CUDA operations
        reqs = dist.batch_isend_irecv(ops)
    for q in reqs:
        q.wait()  # the default stream waits for the CUDA part, the host for the CPU part
    got = gpu_in.clone()  # on the default stream
    value = [t.data_ptr() for q in reqs for t in q.get_future().wait()]
    torch.cuda.synchronize(dev)
    held = sorted(t.data_ptr() for q in reqs for t in q.result())
    want = sorted(t.data_ptr() for t in (cpu_out, cpu_in, gpu_out, gpu_in))
    if held != want:
        return "the batch's Works hold %d of its 4 tensors" % len(held)
    if sorted(value) != want:
        return "the batch's futures hold %d of its 4 tensors" % len(value)
    if not torch.equal(cpu_in, torch.full((64,), float(prv))):
        return "CPU receive got %s" % cpu_in[:4].tolist()
    if not bool((got == prv + 10).all()):
        return "default stream read %s, want %s: wait() did not order it" % (
            got[:4].tolist(), prv + 10)
    return "ok"


def record(res, name, fn):
    """res[name] = fn's verdict, also printed at once ("VERDICT name json"): if a later case
    hangs, test_cuda.py still has this one's, and the harness sees the launch progress."""
    res[name] = verdict(fn)
    print("VERDICT %s %s" % (name, json.dumps(res[name])), flush=True)


def ops_mode(dev, gloo):
    res = {}
    for op in OPS:
        for dtype in DTYPES:
            record(res, "cuda-" + case_name(op, dtype, N), lambda: op_case(op, dtype, dev))
    record(res, "cuda-future_then", lambda: future_then(dev))
    record(res, "cuda-mixed_devices", lambda: mixed(dev))
    record(res, "cuda-usable_after_mixed", lambda: future_then(dev))
    # CPU and CUDA calls interleaved, async: one issue order on every rank
    a = torch.full((64,), float(R + 1))
    b = torch.full((64,), float(R + 1), device=dev)
    wa = dist.all_reduce(a, async_op=True)
    wb = dist.all_reduce(b, async_op=True)
    wa.wait()
    wb.wait()
    want = N * (N + 1) / 2
    record(res, "cuda-interleaved_cpu",
           lambda: ("ok" if bool((a == want).all()) and bool((b.cpu() == want).all())
                    else "got %s / %s" % (a[0].item(), b[0].item())))
    record(res, "cuda-mixed_batch", lambda: mixed_batch(dev))
    # Last: a side stream holding the call while the default stream waits on its event (the
    # shape not yet seen working on a GPU; if it hangs, the cases above have their verdicts).
    record(res, "cuda-side_stream", lambda: side_stream(dev))
    record(res, "cuda-record_stream", lambda: record_stream(dev))
    return res


def ddp_mode(dev, gloo):
    """DDP on CUDA over shoal and DDP on the CPU over Gloo, same model, data and steps."""
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from ddp_worker import batch, model
    steps = int(os.environ.get("DDP_STEPS", "50"))
    runs = {"shoal_cuda": DDP(model().to(dev), device_ids=[dev.index], bucket_cap_mb=0.02),
            "gloo_cpu": DDP(model(), process_group=gloo, bucket_cap_mb=0.02)}
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for k, m in runs.items()}
    losses = {k: [] for k in runs}
    loss_fn = nn.CrossEntropyLoss()
    for step in range(steps):
        x, y = batch(R, step)
        for k, m in runs.items():
            xd, yd = (x.to(dev), y.to(dev)) if k == "shoal_cuda" else (x, y)
            opts[k].zero_grad()
            loss = loss_fn(m(xd), yd)
            loss.backward()
            opts[k].step()
            t = loss.detach().clone()
            dist.all_reduce(t, group=gloo if k == "gloo_cpu" else None)
            losses[k].append(t.item() / N)
        print("STEP %d" % step, flush=True)  # progress for the harness (stall)
    ps = [p.detach() for p in runs["shoal_cuda"].parameters()]
    pg = list(runs["gloo_cpu"].parameters())
    flat = torch.cat([p.flatten() for p in ps])
    ref = flat.clone()
    dist.broadcast(ref, src=0)  # CUDA broadcast through shoal
    return {"losses": losses,
            "max_param_diff": max((a.cpu() - b).abs().max().item() for a, b in zip(ps, pg)),
            "replicas_equal": bool(torch.equal(flat, ref))}


def fail_mode(dev, gloo):
    """Rank 1 exits without a word after the first collective; rank 0 keeps issuing CUDA
    collectives and must get shoal's error (naming rank 1) within the group's timeout."""
    t = torch.ones(1 << 16, device=dev)
    dist.all_reduce(t)
    torch.cuda.synchronize(dev)
    if R == 1:
        os._exit(0)
    t0 = time.monotonic()
    err = None
    try:
        for _ in range(100000):
            w = dist.all_reduce(t, async_op=True)
            w.wait()
            torch.cuda.synchronize(dev)
            if time.monotonic() - t0 > 120:
                break
    except Exception as e:  # noqa: BLE001
        err = e
    return {"raised": type(err).__name__ if err else None, "message": str(err)[:600],
            "elapsed": time.monotonic() - t0}


def cpu_mode():
    """No GPU: a CUDA build's CPU collectives never touch CUDA."""
    out = {"cuda_built": shoal_torch.CUDA, "gpu": torch.cuda.is_available()}
    t = torch.full((100,), float(R + 1))
    dist.all_reduce(t)
    w = dist.all_reduce(t, async_op=True)
    w.get_future().wait()
    out["sum_ok"] = bool((t == (N * (N + 1) / 2) * N).all())
    out["cuda_initialized"] = torch.cuda.is_initialized()  # before anything asks for CUDA
    try:
        torch.ones(4, device="cuda")
        out["cuda_tensor"] = "made"
    except Exception as e:  # noqa: BLE001 - what torch says without a GPU
        out["cuda_tensor"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:200])
    u = torch.ones(10)
    dist.all_reduce(u)
    out["usable_after"] = bool((u == N).all())
    return out


def main():
    timeout = float(os.environ.get("CUDA_TIMEOUT_S", "60"))
    dist.init_process_group("shoal", timeout=timedelta(seconds=timeout))
    gloo = dist.new_group(backend="gloo")
    if MODE == "cpu":
        res = cpu_mode()
    else:
        dev = torch.device("cuda", R % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        res = {"ops": ops_mode, "ddp": ddp_mode, "fail": fail_mode}[MODE](dev, gloo)
    if MODE == "fail":
        if R == 0:
            print("RESULTS " + json.dumps(res), flush=True)
        os._exit(0)  # the group is broken: no collective teardown
    verdicts = [None] * N
    dist.all_gather_object(verdicts, res, group=gloo)
    if MODE == "ops":
        res = {k: next(("rank %d: %s" % (r, v[k]) for r, v in enumerate(verdicts)
                        if v[k] != "ok"), "ok") for k in res}
    else:
        res["per_rank"] = verdicts
    if R == 0:
        print("RESULTS " + json.dumps(res), flush=True)
    dist.barrier(group=gloo)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
