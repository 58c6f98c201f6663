"""One rank of the op x dtype check: every operation runs on the shoal default group and on a
Gloo group of the same ranks, on data whose exact result is known. Prints one line
"RESULTS {case: "ok" | reason}"; rank 0's line covers the cases every rank checked (a case
fails if it failed on any rank: the ranks agree through a Gloo all_gather of their verdicts)."""
import json
import os
import sys
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shoal_torch  # noqa: E402,F401  registers "shoal"
from cases import DTYPES, MOVE_DTYPES, MOVE_OPS, OPS, case_name  # noqa: E402

R = int(os.environ["RANK"])
N = int(os.environ["WORLD_SIZE"])
COUNT = 1031  # odd, not a multiple of any world size: uneven chunks inside the algorithms
RED = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}


def data(rank, dtype, count=COUNT, kind="sum"):
    """Small integers, exact in every dtype (fp16/bf16 included) and in every reduction."""
    i = torch.arange(count, dtype=torch.int64)
    if kind == "product":  # 1 or 2: at most 2^4 for 4 ranks
        v = 1 + (i + rank) % 2
    elif kind == "avg":  # a multiple of N: the sum divides exactly
        v = N * ((i + 3 * rank) % 5)
    else:
        v = (i * 7 + rank * 3) % 11 + (1 if dtype.is_floating_point else 0)
        if not dtype.is_floating_point and dtype != torch.uint8:
            v = v - 5  # negatives for signed types
    return v.to(dtype)


def expect_reduce(dtype, kind, count=COUNT):
    ts = [data(r, dtype, count, kind).to(torch.float64 if dtype.is_floating_point
                                          else torch.int64) for r in range(N)]
    st = torch.stack(ts)
    if kind == "sum":
        out = st.sum(0)
    elif kind == "product":
        out = st.prod(0)
    elif kind == "min":
        out = st.min(0).values
    elif kind == "max":
        out = st.max(0).values
    else:
        out = st.sum(0) / N if dtype.is_floating_point else st.sum(0) // N
    return out.to(dtype)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def check(name, got, want, gloo_fn):
    """got: shoal's result; want: the exact result; gloo_fn: runs the same op on Gloo, returns
    its result or None when Gloo has no such op / dtype."""
    if not same(got, want):
        bad = (got.to(torch.float64) != want.to(torch.float64)).nonzero()
        return "shoal result wrong at %s: got %s want %s" % (
            bad[:3].flatten().tolist(), got.flatten()[:6].tolist(), want.flatten()[:6].tolist())
    try:
        g = gloo_fn()
    except (RuntimeError, ValueError, NotImplementedError) as e:  # Gloo lacks this op/dtype
        return "ok (gloo: %s)" % str(e).splitlines()[0][:80]
    if g is not None and not same(got, g):
        return "shoal and gloo differ"
    return "ok"


def run_case(op, dtype, gloo):
    kind = op.split("_")[-1]
    if op.startswith("all_reduce"):
        t = data(R, dtype, kind=kind)
        w = dist.all_reduce(t, op=RED[kind], async_op=True)  # async: the future completes
        fut_val = w.get_future().wait()
        assert fut_val[0] is t or torch.equal(fut_val[0], t), "future value is not the tensor"

        def g():
            if kind == "avg":  # Gloo has no AVG: SUM then divide
                u = data(R, dtype, kind=kind)
                dist.all_reduce(u, op=dist.ReduceOp.SUM, group=gloo)
                return (u // N) if not dtype.is_floating_point else (u / N).to(dtype)
            u = data(R, dtype, kind=kind)
            dist.all_reduce(u, op=RED[kind], group=gloo)
            return u
        return check(op, t, expect_reduce(dtype, kind), g)
    if op == "broadcast":
        root = N - 1
        t = data(R, dtype)
        dist.broadcast(t, src=root)

        def g():
            u = data(R, dtype)
            dist.broadcast(u, src=root, group=gloo)
            return u
        return check(op, t, data(root, dtype), g)
    if op == "reduce_sum":
        root = N // 2
        t = data(R, dtype)
        dist.reduce(t, dst=root, op=dist.ReduceOp.SUM)
        g = _gloo_reduce(dtype, root, gloo)  # on every rank: Gloo's reduce is collective too
        if R != root:
            return "ok"  # a non-root's tensor is unspecified after reduce
        return check(op, t, expect_reduce(dtype, "sum"), lambda: g)
    if op == "all_gather":
        t = data(R, dtype)
        outs = [torch.empty_like(t) for _ in range(N)]
        dist.all_gather(outs, t)

        def g():
            o = [torch.empty_like(t) for _ in range(N)]
            dist.all_gather(o, t, group=gloo)
            return torch.stack(o)
        return check(op, torch.stack(outs), torch.stack([data(r, dtype) for r in range(N)]), g)
    if op == "all_gather_into_tensor":
        t = data(R, dtype).view(-1, 1)
        out = torch.empty(N * COUNT, 1, dtype=dtype)
        dist.all_gather_into_tensor(out, t)

        def g():
            o = torch.empty_like(out)
            dist.all_gather_into_tensor(o, t, group=gloo)
            return o
        return check(op, out, torch.cat([data(r, dtype).view(-1, 1) for r in range(N)]), g)
    if op == "reduce_scatter_sum":
        ins = [data(R, dtype, kind="sum")[k:k + 97].clone() for k in range(N)]
        out = torch.empty(97, dtype=dtype)
        dist.reduce_scatter(out, ins, op=dist.ReduceOp.SUM)

        def g():
            o = torch.empty_like(out)
            dist.reduce_scatter(o, ins, op=dist.ReduceOp.SUM, group=gloo)
            return o
        return check(op, out, expect_reduce(dtype, "sum")[R:R + 97], g)
    if op == "reduce_scatter_tensor_sum":
        t = data(R, dtype, count=N * 257)
        out = torch.empty(257, dtype=dtype)
        dist.reduce_scatter_tensor(out, t, op=dist.ReduceOp.SUM)

        def g():
            o = torch.empty_like(out)
            dist.reduce_scatter_tensor(o, t, op=dist.ReduceOp.SUM, group=gloo)
            return o
        want = expect_reduce(dtype, "sum", N * 257)[R * 257:(R + 1) * 257]
        return check(op, out, want, g)
    if op == "all_to_all_single_equal":
        t = data(R, dtype, count=N * 6).view(N * 3, 2)  # 3 rows of 2 to each rank
        out = torch.empty_like(t)
        dist.all_to_all_single(out, t)

        def g():
            o = torch.empty_like(t)
            dist.all_to_all_single(o, t, group=gloo)
            return o
        want = torch.cat([data(r, dtype, count=N * 6).view(N * 3, 2)[3 * R:3 * R + 3]
                          for r in range(N)])
        return check(op, out, want, g)
    if op == "all_to_all_single_unequal":
        # rank r sends (r + d + 1) rows of 3 to rank d
        def splits_from(r):
            return [r + d + 1 for d in range(N)]

        def rows(r):
            s = splits_from(r)
            return data(r, dtype, count=sum(s) * 3).view(-1, 3)
        ins = splits_from(R)
        outs = [r + R + 1 for r in range(N)]
        t = rows(R)
        out = torch.empty(sum(outs), 3, dtype=dtype)
        dist.all_to_all_single(out, t, outs, ins)

        def g():
            o = torch.empty_like(out)
            dist.all_to_all_single(o, t, outs, ins, group=gloo)
            return o
        want = torch.cat([rows(r)[sum(splits_from(r)[:R]):sum(splits_from(r)[:R + 1])]
                          for r in range(N)])
        return check(op, out, want, g)
    if op == "all_to_all":  # lists: rank r sends (r + d + 1) elements to rank d
        ins = [data(R, dtype, count=R + d + 1) for d in range(N)]
        outs = [torch.empty(r + R + 1, dtype=dtype) for r in range(N)]
        dist.all_to_all(outs, ins)

        def g():
            o = [torch.empty_like(x) for x in outs]
            dist.all_to_all(o, ins, group=gloo)
            return torch.cat(o)
        return check(op, torch.cat(outs), torch.cat([data(r, dtype, count=r + R + 1)
                                                     for r in range(N)]), g)
    if op == "gather":
        root = N - 1
        t = data(R, dtype)
        outs = [torch.empty_like(t) for _ in range(N)] if R == root else None
        dist.gather(t, outs, dst=root)
        o = [torch.empty_like(t) for _ in range(N)] if R == root else None
        g = _ran_now(lambda: dist.gather(t, o, dst=root, group=gloo))
        if R != root:
            return "ok"
        return check(op, torch.stack(outs), torch.stack([data(r, dtype) for r in range(N)]),
                     lambda: g() or torch.stack(o))
    if op == "scatter":
        root = 0
        ins = [data(10 + r, dtype) for r in range(N)] if R == root else None
        out = torch.empty(COUNT, dtype=dtype)
        dist.scatter(out, ins, src=root)
        o = torch.empty_like(out)
        g = _ran_now(lambda: dist.scatter(o, ins, src=root, group=gloo))
        return check(op, out, data(10 + R, dtype), lambda: g() or o)
    if op == "send_recv":
        if N == 1:
            return "ok"
        t = data(R, dtype)
        got = torch.empty_like(t)
        nxt, prv = (R + 1) % N, (R - 1) % N
        if R % 2 == 0:  # even ranks send first: a ring that cannot deadlock
            dist.send(t, nxt)
            dist.recv(got, prv)
        else:
            dist.recv(got, prv)
            dist.send(t, nxt)
        return check(op, got, data(prv, dtype), lambda: None)
    raise AssertionError("unknown op " + op)


def all_to_all_issue_order():
    """all_to_all of the chunks of a tensor that an async all_reduce queued just before writes:
    the group runs its operations in issue order, so all_to_all sends the reduced chunks. The
    last rank joins the all_reduce 0.2 s late, so the others' all_reduce is still running when
    they issue all_to_all (its inputs were copied then: the chunks before the reduction)."""
    x = torch.full((N * 3,), float(R + 1))
    if R == N - 1:
        time.sleep(0.2)
    w = dist.all_reduce(x, async_op=True)
    outs = [torch.empty(3) for _ in range(N)]
    dist.all_to_all(outs, list(x.chunk(N)))
    w.wait()
    got = torch.cat(outs)
    want = torch.full((N * 3,), float(N * (N + 1) // 2))
    return "ok" if torch.equal(got, want) else "got %s want %s" % (got.tolist(), want.tolist())


def collective_in_future_callback():
    """A callback chained on a work's future issues another collective and waits for it, as
    DDP's PowerSGD hook does. The callback runs on the group's worker thread when the first
    all_reduce completes there (the last rank joins it 0.2 s late, so the others chain the
    callback before it completes); the worker must still run the callback's all_reduce (it
    waited for itself: the callback's wait timed out, or without a timeout hung for ever)."""
    t = torch.full((2,), float(R + 1))
    if R == N - 1:
        time.sleep(0.2)
    fut = dist.all_reduce(t, async_op=True).get_future()

    def callback(f):
        u = f.value()[0] * 2
        w = dist.all_reduce(u, async_op=True)
        w.wait(timeout=timedelta(seconds=10))
        return u
    try:
        got = fut.then(callback).wait()
    except Exception as e:  # noqa: BLE001 - the error is the verdict
        return "raised %s: %s" % (type(e).__name__, str(e)[:300])
    want = torch.full((2,), float(N * N * (N + 1)))
    return "ok" if torch.equal(got, want) else "got %s want %s" % (got.tolist(), want.tolist())


def _chain_on_later_work(make_callback):
    """Two all_reduces in flight, w1 of R + 1 and w2 of R + 2 (the last rank joins w1 0.2 s
    late, so the others chain the callback before w1 completes); w1's future chains
    make_callback(w2, b), b being w2's tensor. Returns what the chained future gives, or a
    verdict string when it raised."""
    a = torch.full((2,), float(R + 1))
    b = torch.full((2,), float(R + 2))
    if R == N - 1:
        time.sleep(0.2)
    w1 = dist.all_reduce(a, async_op=True)
    w2 = dist.all_reduce(b, async_op=True)
    try:
        return w1.get_future().then(make_callback(w2, b)).wait()
    except Exception as e:  # noqa: BLE001 - the error is the verdict
        return "raised %s: %s" % (type(e).__name__, str(e)[:300])


def wait_in_future_callback():
    """A callback chained on a work's future waits for a work issued after it (w2.wait()),
    which is queued behind it on the group's worker thread. The callback ran on the worker,
    which never came back to its queue, so the callback's wait timed out (without a timeout it
    hung for ever). Futures are now marked, and their callbacks run, on completion threads."""
    def make_callback(w2, b):
        def callback(f):
            w2.wait(timeout=timedelta(seconds=10))
            return f.value()[0] + b
        return callback
    got = _chain_on_later_work(make_callback)
    if isinstance(got, str):
        return got
    want = torch.full((2,), float(N * (N + 1) + N))
    return "ok" if torch.equal(got, want) else "got %s want %s" % (got.tolist(), want.tolist())


def future_wait_in_future_callback():
    """A callback chained on a work's future waits for the future of a work issued after it
    (w2.get_future().wait(), as a DDP hook that chains on another bucket's future does). The
    callbacks ran on the group's worker thread, which alone completes w2: its future was never
    marked and the callback's wait hung for ever, with the worker (and destroy_process_group,
    which joins it). The wait here polls done() for at most 10 s (the same wait, bounded, so
    that a hang is a verdict and the worker goes on), then takes the value with wait()."""
    def make_callback(w2, b):
        def callback(f):
            f2 = w2.get_future()
            deadline = time.monotonic() + 10
            while not f2.done() and time.monotonic() < deadline:
                time.sleep(0.01)
            if not f2.done():
                raise RuntimeError("the later work's future was not done after 10 s")
            return f.value()[0] + f2.wait()[0]
        return callback
    got = _chain_on_later_work(make_callback)
    if isinstance(got, str):
        return got
    want = torch.full((2,), float(N * (N + 1) // 2 + N * (N + 3) // 2))
    return "ok" if torch.equal(got, want) else "got %s want %s" % (got.tolist(), want.tolist())


def future_marked_after_wait():
    """work.wait() returned when the worker finished the work, a moment before its future was
    marked: get_future().value() right after it raised torch's INTERNAL ASSERT "completed()"
    (1 call in 3000 with the future marked on the worker; a completion thread widens the gap).
    wait() now returns once the future is marked."""
    t = torch.ones(4)
    for i in range(1000):
        w = dist.all_reduce(t, async_op=True)
        w.wait()
        try:
            w.get_future().value()
        except Exception as e:  # noqa: BLE001 - the error is the verdict
            return "call %d: raised %s: %s" % (i, type(e).__name__, str(e)[:200])
    return "ok"


def completion_threads_few():
    """2000 async all_reduces, each with a then-callback, then all waited for: a completion
    thread was added for every completion that found the others busy, 178 threads on rank 0
    (2 ranks). One thread marks them now; another only when every one is stuck in a callback
    (100 ms), at most 16. The process may grow by a few threads (at most 4 here)."""
    before = len(os.listdir("/proc/self/task"))
    works = []
    for _ in range(2000):
        w = dist.all_reduce(torch.ones(1), async_op=True)
        w.get_future().then(lambda f: f.value()[0] * 2)
        works.append(w)
    for w in works:
        w.wait()
    grown = len(os.listdir("/proc/self/task")) - before
    return "ok" if grown <= 4 else "%d threads more after 2000 works with callbacks" % grown


def all_to_all_single_empty_ranks(gloo):
    """all_to_all_single with splits where the odd ranks send and receive nothing (their
    tensors have 0 rows of 3) and the even ranks exchange 2 rows with each other, as expert
    parallelism does with a rank that got no tokens: an empty rank took its rows to be 0
    elements wide (the width came from numel / rows), so its padded shoal_alltoall moved 0
    elements while the others waited for it (until the group's timeout). Here on a group of
    its own with a 10 s timeout, so that such a wait fails this case alone."""
    sub = dist.new_group(backend="shoal", timeout=timedelta(seconds=10))
    busy = [r for r in range(N) if r % 2 == 0]
    splits = [2 if R in busy and d in busy else 0 for d in range(N)]
    t = torch.arange(sum(splits) * 3, dtype=torch.float32).view(-1, 3) + 100 * R
    out = torch.full((sum(splits), 3), -1.0)
    want = torch.full_like(out, -1.0)
    dist.all_to_all_single(want, t, splits, splits, group=gloo)  # first: every rank gets here
    try:
        dist.all_to_all_single(out, t, splits, splits, group=sub)
    except Exception as e:  # noqa: BLE001 - the error is the verdict
        return "raised %s: %s" % (type(e).__name__, str(e)[:300])
    finally:
        dist.destroy_process_group(sub)
    return "ok" if same(out, want) else "got %s want %s" % (out.tolist(), want.tolist())


def _ran_now(fn):
    """Runs a Gloo call now (a collective every rank enters, whatever shoal's verdict) and
    returns what check() calls in its place: None, or the raise of what Gloo raised (a dtype
    it lacks, such as int16 in gather and scatter)."""
    try:
        fn()
    except (RuntimeError, ValueError, NotImplementedError) as e:
        def again(err=e):
            raise err
        return again
    return lambda: None


def _gloo_reduce(dtype, root, gloo):
    u = data(R, dtype)
    dist.reduce(u, dst=root, op=dist.ReduceOp.SUM, group=gloo)
    return u


def main():
    dist.init_process_group("shoal")
    gloo = dist.new_group(backend="gloo")
    res = {}
    cases = [(op, dt) for op in OPS for dt in DTYPES]
    cases += [(op, dt) for op in MOVE_OPS for dt in MOVE_DTYPES]
    for op, dtype in cases:
        name = case_name(op, dtype, N)
        if os.environ.get("OPS_VERBOSE"):
            print("case", name, flush=True)
        try:
            res[name] = run_case(op, dtype, gloo)
        except Exception as e:  # a failure is a verdict, the next case still runs
            res[name] = "raised %s: %s" % (type(e).__name__, e)
            traceback.print_exc()
    # barrier: every rank leaves only after every rank entered
    t = torch.tensor([time.time()], dtype=torch.float64)
    dist.barrier()
    after = time.time()
    enter = [torch.zeros(1, dtype=torch.float64) for _ in range(N)]
    dist.all_gather(enter, t, group=gloo)
    res[case_name("barrier", None, N)] = (
        "ok" if all(e.item() <= after for e in enter) else "left before a rank entered")
    res[case_name("all_to_all_issue_order", None, N)] = all_to_all_issue_order()
    res[case_name("collective_in_future_callback", None, N)] = collective_in_future_callback()
    res[case_name("wait_in_future_callback", None, N)] = wait_in_future_callback()
    res[case_name("future_wait_in_future_callback", None, N)] = \
        future_wait_in_future_callback()
    res[case_name("future_marked_after_wait", None, N)] = future_marked_after_wait()
    res[case_name("completion_threads_few", None, N)] = completion_threads_few()
    res[case_name("all_to_all_single_empty_ranks", None, N)] = \
        all_to_all_single_empty_ranks(gloo)
    verdicts = [None] * N
    dist.all_gather_object(verdicts, res, group=gloo)
    merged = {}
    for k in res:
        bad = [(r, v[k]) for r, v in enumerate(verdicts) if not v[k].startswith("ok")]
        merged[k] = res[k] if not bad else "rank %d: %s" % bad[0]
    if R == 0:
        print("RESULTS " + json.dumps(merged), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
