"""One rank of the error checks (2 ranks): what shoal cannot do raises a clear error in the
caller, a collective whose ranks disagree fails on every rank, and nothing hangs. Prints
"RESULTS {case: "ok" | reason}" on rank 0 (rank 1's verdicts are merged through Gloo)."""
import gc
import json
import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shoal_torch  # noqa: E402,F401

R = int(os.environ["RANK"])
TIMEOUT_S = 8


def expect(exc_types, words, fn):
    try:
        fn()
    except exc_types as e:
        msg = str(e)
        missing = [w for w in words if w not in msg]
        return "ok" if not missing else "message lacks %s: %s" % (missing, msg[:300])
    except Exception as e:  # noqa: BLE001 - any other type is a wrong verdict
        return "raised %s instead: %s" % (type(e).__name__, str(e)[:300])
    return "did not raise"


def works(fn):
    """fn's verdict ("ok" or what it got), or the exception it raised."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the error is the verdict
        return "%s: %s" % (type(e).__name__, str(e)[:300])


def broadcast_works():
    """A broadcast from rank 1 of 2 brings 2.0 to every rank."""
    b = torch.full((4,), float(R + 1))
    dist.broadcast(b, src=1, async_op=True).wait(timeout=timedelta(seconds=TIMEOUT_S))
    return "ok" if b.tolist() == [2.0] * 4 else "got %s" % b.tolist()


def batch_works(peer):
    """A batch_isend_irecv with peer exchanges the ranks' numbers."""
    got = torch.zeros(4)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((4,), float(R)), peer),
                                   dist.P2POp(dist.irecv, got, peer)])
    for q in reqs:
        q.wait(timeout=timedelta(seconds=TIMEOUT_S))
    return "ok" if got.tolist() == [float(peer)] * 4 else "got %s" % got.tolist()


def all_reduce_works():
    """An all_reduce of 2 ranks' R + 1 gives 3.0."""
    u = torch.full((4,), float(R + 1))
    dist.all_reduce(u)
    return "ok" if u.tolist() == [3.0] * 4 else "got %s" % u.tolist()


def wait_long_timeout():
    """A wait with a timeout of 200000 days (beyond the 292 years steady_clock holds in
    nanoseconds) for an all_reduce that rank 1 joins 0.3 s late: the deadline overflowed into
    the past, and rank 0's wait raised at once "did not complete within the wait's timeout"."""
    t = torch.ones(2)
    if R == 1:
        time.sleep(0.3)
    w = dist.all_reduce(t, async_op=True)
    try:
        w.wait(timeout=timedelta(days=200000))
    except Exception as e:  # noqa: BLE001 - the error is the verdict
        w.wait()
        return "raised %s: %s" % (type(e).__name__, str(e)[:300])
    return "ok" if t.tolist() == [2.0, 2.0] else "got %s" % t.tolist()


def channels_last():
    """Tensors in torch.channels_last (dense in their memory format, as NCCL and Gloo take
    them) in the element-wise calls: all_reduce, reduce, broadcast, send and recv. They were
    refused as "not contiguous"."""
    def nchw(k):
        return (torch.arange(16, dtype=torch.float32).reshape(2, 2, 2, 2) * k).to(
            memory_format=torch.channels_last)
    peer = 1 - R
    try:
        a = nchw(R + 1)
        dist.all_reduce(a)
        b = nchw(R + 1)
        dist.reduce(b, dst=0)
        c = nchw(R + 1)
        dist.broadcast(c, src=1)
        d = nchw(R + 1) if R == 0 else nchw(0)
        if R == 0:
            dist.send(d, dst=peer)
        else:
            dist.recv(d, src=peer)
    except Exception as e:  # noqa: BLE001 - the error is the verdict
        return "raised %s: %s" % (type(e).__name__, str(e)[:300])
    want = {"all_reduce": (a, nchw(3)), "reduce": (b, nchw(3) if R == 0 else nchw(R + 1)),
            "broadcast": (c, nchw(2)), "send/recv": (d, nchw(1))}
    for name, (got, exp) in want.items():
        if not got.is_contiguous(memory_format=torch.channels_last) or not torch.equal(got, exp):
            return "%s gave %s" % (name, got.tolist())
    return "ok"


def wait_max_timeout():
    """A wait with timeout=timedelta.max (as "no limit") for an all_reduce that rank 1 joins
    0.3 s late: torch's conversion to milliseconds overflows (its microseconds do), the count
    arrived negative, and rank 0's wait raised at once "did not complete within the wait's
    timeout of -... ms"."""
    t = torch.ones(2)
    if R == 1:
        time.sleep(0.3)
    w = dist.all_reduce(t, async_op=True)
    try:
        w.wait(timeout=timedelta.max)
    except Exception as e:  # noqa: BLE001 - the error is the verdict
        w.wait()
        return "raised %s: %s" % (type(e).__name__, str(e)[:300])
    return "ok" if t.tolist() == [2.0, 2.0] else "got %s" % t.tolist()


def batch_refused(res, pg):
    """batch_isend_irecv whose second operation the backend refuses (a non-contiguous
    tensor): torch's coalescing manager never ends that batch. The batch left open took
    every later operation of the group, which never ran (a broadcast waited forever); the
    next batch raised "startCoalescing while a batch is open"."""
    peer = 1 - R
    res["batch_refused"] = expect(
        ValueError, ["not contiguous"],
        lambda: dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(4), peer),
                                        dist.P2POp(dist.irecv, torch.ones(2, 2).t(), peer)]))
    # torch kept its own record of the batch too (the group's all_reduce was then only
    # recorded, never run): shoal_torch drops it (batch_torch_raised checks all_reduce)
    res["broadcast_after_refused_batch"] = works(broadcast_works)
    res["batch_after_refused_batch"] = works(lambda: batch_works(peer))


def batch_torch_raised(res):
    """An exception raised inside torch's coalescing manager by torch itself, not the backend
    (here torch's check of an isend's arguments, after an isend joined the batch): torch's
    manager has no cleanup, so nothing ended the backend's batch. The broadcast after it joined
    the open batch and raised "has not ended", the next batch_isend_irecv raised
    "startCoalescing while a batch is open", and torch's left-over record of the batch made
    the group's all_reduce a silent no-op."""
    peer = 1 - R

    def body():
        with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True):
            dist.isend(torch.ones(4), peer)
            dist.isend(torch.ones(4), dst=peer, group_dst=peer)  # torch: "Can't specify both"
    res["batch_torch_raised"] = expect(ValueError, ["Can't specify both"], body)
    res["broadcast_after_torch_raised"] = works(broadcast_works)
    res["all_reduce_after_torch_raised"] = works(all_reduce_works)
    res["batch_after_torch_raised"] = works(lambda: batch_works(peer))


def wait_inside_batch():
    """A blocking broadcast inside torch's coalescing manager waits for an operation that runs
    only when the batch ends: it raises at once, naming the batch (it waited for ever, past
    the group's timeout: the worker never had it)."""
    t0 = time.monotonic()
    b = torch.full((4,), float(R))
    verdict = expect(dist.DistBackendError, ["broadcast", "batch", "has not ended"],
                     lambda: _broadcast_in_batch(b))
    took = time.monotonic() - t0
    return verdict if took < TIMEOUT_S / 2 else "took %.1f s: %s" % (took, verdict)


def _broadcast_in_batch(b):
    with dist._coalescing_manager(device=torch.device("cpu")):
        dist.broadcast(b, src=0)


def shutdown_pending(res, gloo):
    """destroy_process_group of a shoal group while a thread waits for its receive from a rank
    that never sends: torch calls the backend's shutdown, which did nothing, so the waiter
    waited until the group's timeout (or for ever with a longer one). It now returns at once
    with the aborted receive's error, and the backend refuses later calls."""
    sub = dist.new_group(backend="shoal", timeout=timedelta(seconds=TIMEOUT_S))
    if R == 0:
        backend = sub._get_backend(torch.device("cpu"))
        w = dist.irecv(torch.zeros(4), src=1, group=sub)
        got = {}

        def waiter():
            try:
                w.wait()
                got["v"] = "the receive completed"
            except Exception as e:  # noqa: BLE001 - the error is the verdict
                got["v"] = e
        th = threading.Thread(target=waiter, daemon=True)
        th.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        dist.destroy_process_group(sub)
        th.join(TIMEOUT_S * 2)
        took = time.monotonic() - t0
        v = got.get("v", "the waiter still waits")
        if isinstance(v, dist.DistBackendError) and "ABORTED" in str(v) and took < TIMEOUT_S / 2:
            res["shutdown_pending"] = "ok"
        else:
            res["shutdown_pending"] = "after %.1f s: %s" % (took, str(v)[:300])
        res["call_after_shutdown"] = expect(dist.DistBackendError, ["shut down"],
                                            lambda: backend.allreduce([torch.ones(2)]).wait())
    dist.barrier(group=gloo)
    if R != 0:
        dist.destroy_process_group(sub)
        res["shutdown_pending"] = res["call_after_shutdown"] = "ok"


def _live_comms():
    """The shoal communicators alive in this process: each holds its meter page (a memfd
    named shoal-meter, which the node agent meters it by) until it is destroyed."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink("/proc/self/fd/" + fd).startswith("/memfd:shoal-meter")
        except OSError:  # the listing's own descriptor, gone by now
            pass
    return n


def destroy_releases_comm(res):
    """destroy_process_group of a group whose Works (and their futures) the script still
    holds, one finished and one receive pending at the destroy: every Work held the
    communicator, so it stayed alive, and metered, until Python dropped the last of them (a
    training loop's handles, kept in a list, kept it for the life of the process). The destroy
    now releases it; the held Works still answer: the finished one's wait() returns and its
    future holds its tensor, the aborted one's wait() and future raise, none hangs."""
    gc.collect()  # what earlier cases left
    before = _live_comms()
    sub = dist.new_group(backend="shoal", timeout=timedelta(seconds=TIMEOUT_S))
    done = dist.all_reduce(torch.ones(2), group=sub, async_op=True)
    done.wait()
    pend = dist.irecv(torch.zeros(4), src=1 - R, group=sub)  # never sent
    futs = (done.get_future(), pend.get_future())
    alive = _live_comms()
    dist.destroy_process_group(sub)
    del sub
    gc.collect()
    left = _live_comms()
    if alive != before + 1 or left != before:
        res["destroy_releases_comm"] = ("%d communicators before the group, %d with it, %d "
                                        "after its destroy" % (before, alive, left))
    else:
        res["destroy_releases_comm"] = "ok"

    def answers():
        t0 = time.monotonic()
        if not done.wait(timeout=timedelta(seconds=TIMEOUT_S)):
            return "the finished work's wait() returned False"
        if futs[0].wait()[0].tolist() != [2.0, 2.0]:
            return "the finished work's future holds %s" % futs[0].value()
        for what, fn in (("wait()", pend.wait), ("future", futs[1].wait)):
            v = expect(dist.DistBackendError, [], fn)
            if v != "ok":
                return "the aborted receive's %s: %s" % (what, v)
        took = time.monotonic() - t0
        return "ok" if took < TIMEOUT_S / 2 else "took %.1f s" % took
    res["destroyed_works_answer"] = works(answers)


def forked_child(res):
    """A process forked after the group was made (a DataLoader worker, a subprocess started
    with fork) holds a copy of the backend but not its threads: a collective there was queued
    for a worker that does not exist (its wait raised "the communicator failed:
    SHOAL_ERR_INVALID_ARG: no error"), and dropping the group hung the child in the backend's
    destructor (pthread_cond_destroy of a condition variable the parent's worker waited on).
    A work pending at the fork, waited for in the child, raised the same sentence (its worker
    and completion threads are the parent's), and its get_future().wait() waited for ever. The
    coalescing entry points had no check at all.
    Now the collective, that wait and the coalescing calls raise at once saying why,
    destroying the group and dropping the backend return, and the parent's group still
    works. abort() raises there too (it returned as if it had aborted the group).
    A future taken from the pending work before the fork (and one chained on it with then())
    waited for ever in the child: nothing there would ever mark it. The fork now fails it in
    the child (it completes in the parent, with the data)."""
    sub = dist.new_group(backend="shoal", timeout=timedelta(seconds=TIMEOUT_S))
    dist.all_reduce(torch.ones(2), group=sub)  # the worker thread has run
    # pending at the fork: rank 1 sends only after its child ended
    pend = dist.irecv(torch.zeros(4), src=1, group=sub) if R == 0 else None
    pre = pend.get_future() if pend else None
    chained = pre.then(lambda f: f.value()[0] + 1) if pre else None
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        try:
            v = expect(dist.DistBackendError, ["forked"],
                       lambda: dist.all_reduce(torch.ones(2), group=sub))
            os.write(wfd, ("call:" + v + "\n").encode())
            v = expect(dist.DistBackendError, ["forked"], pend.wait) if pend else "ok"
            os.write(wfd, ("pending:" + v + "\n").encode())
            # its future is never marked here: get_future().wait() waited for ever
            v = expect(dist.DistBackendError, ["forked"],
                       lambda: pend.get_future().wait()) if pend else "ok"
            os.write(wfd, ("future:" + v + "\n").encode())
            # the coalescing entry points (batch_isend_irecv's) had no fork check: the batch
            # opened on the parent's copied state, and its end said "without startCoalescing"
            cpu = torch.device("cpu")
            v = expect(dist.DistBackendError, ["forked", "startCoalescing"],
                       lambda: sub._start_coalescing(cpu))
            os.write(wfd, ("start:" + v + "\n").encode())
            v = expect(dist.DistBackendError, ["forked", "endCoalescing"],
                       lambda: sub._end_coalescing(cpu))
            os.write(wfd, ("end:" + v + "\n").encode())
            # abort had no fork check: shoal refused it (a line on stderr), the call returned
            # as if the group were aborted
            v = expect(dist.DistBackendError, ["forked", "abort"],
                       lambda: sub._get_backend(cpu).abort())
            os.write(wfd, ("abort:" + v + "\n").encode())
            dist.destroy_process_group(sub)
            os.write(wfd, b"destroyed\n")
            del sub  # the last reference: the backend's destructor runs
            gc.collect()
            os.write(wfd, b"released\n")
            got = ["waited 3 s"]

            def wait_pre():  # on a thread: a future never marked waits for ever
                v = expect(dist.DistBackendError, ["forked"], pre.wait)
                # torch's then(): the callback's error (f.value() raised) as RuntimeError
                got[0] = v if v != "ok" else expect(RuntimeError, ["forked"], chained.wait)
            if pre:
                th = threading.Thread(target=wait_pre, daemon=True)
                th.start()
                th.join(3)
            os.write(wfd, ("prefuture:" + (got[0] if pre else "ok") + "\n").encode())
        finally:
            os._exit(0)
    os.close(wfd)
    deadline = time.monotonic() + 20
    hung = True
    while hung and time.monotonic() < deadline:
        hung = os.waitpid(pid, os.WNOHANG) == (0, 0)
        time.sleep(0.05)
    if hung:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    with os.fdopen(rfd) as f:
        lines = f.read().split("\n")
    if lines[:8] != ["call:ok", "pending:ok", "future:ok", "start:ok", "end:ok",
                     "abort:ok", "destroyed", "released"]:
        res["forked_child"] = "child %s, said %s" % ("hung" if hung else "ended", lines)
    else:
        res["forked_child"] = "ok"
    if hung or lines[8:9] != ["prefuture:ok"]:
        res["future_before_fork"] = "child %s, said %s" % ("hung" if hung else "ended",
                                                          lines[8:])
    else:
        res["future_before_fork"] = "ok"
    if R == 1:
        dist.send(torch.ones(4), dst=0, group=sub)
    else:
        pend.wait()
        # in the parent the future taken before the fork completes, with the data
        got = [pre.wait()[0].tolist(), chained.wait().tolist()]
        if got != [[1.0] * 4, [2.0] * 4] and res["future_before_fork"] == "ok":
            res["future_before_fork"] = "in the parent: got %s" % got
    u = torch.full((4,), float(R + 1))
    dist.all_reduce(u, group=sub)
    res["usable_after_fork"] = "ok" if u.tolist() == [3.0] * 4 else "got %s" % u.tolist()
    dist.destroy_process_group(sub)


def callback_drops_backend(res, gloo):
    """A then-callback that destroys its process group and drops the last reference to it
    (rank 0's runs on a completion thread: its receive completes only after the callback was
    chained): the backend's destructor ran on that completion thread and joined it, which
    killed the process (std::terminate). The callback now returns its value and the backend's
    worker is gone by then."""
    sub = dist.new_group(backend="shoal", timeout=timedelta(seconds=TIMEOUT_S))
    holder = [sub]
    del sub
    seen = {}

    def callback(f):
        before = len(os.listdir("/proc/self/task"))
        dist.destroy_process_group(holder.pop())
        gc.collect()  # the last reference: the backend's destructor runs here
        seen["threads_ended"] = before - len(os.listdir("/proc/self/task"))
        return f.value()[0] * 2
    if R == 0:
        w = dist.irecv(torch.zeros(4), src=1, group=holder[0])
        fut = w.get_future().then(callback)
        del w
        dist.barrier(group=gloo)
    else:
        dist.barrier(group=gloo)
        w = dist.isend(torch.full((4,), 3.0), dst=0, group=holder[0])
        fut = w.get_future().then(callback)
        del w
    try:
        got = fut.wait()
    except Exception as e:  # noqa: BLE001 - the error is the verdict
        res["callback_drops_backend"] = "raised %s: %s" % (type(e).__name__, str(e)[:300])
        return
    want = [6.0] * 4  # 3.0 sent by rank 1, doubled
    if got.tolist() != want:
        res["callback_drops_backend"] = "got %s" % got.tolist()
    elif holder or seen.get("threads_ended", 0) < 1:
        res["callback_drops_backend"] = "the backend was not destroyed in the callback: %s" % seen
    else:
        res["callback_drops_backend"] = "ok"


def call_racing_shutdown(trials=30):
    """destroy_process_group of a group (of rank 0 alone) while another thread keeps issuing
    all_reduces on it: a call that passed the backend's "shut down" check just before the
    shutdown was queued after the worker had ended, so it never ran, and its wait() without a
    timeout waited for ever (here: did not complete within 2 s, in 5-7 groups of 30). Every
    call now either runs (or fails with the group's abort) or raises "shut down"."""
    lost = 0
    for _ in range(trials):
        sub = dist.new_group(ranks=[0], backend="shoal", timeout=timedelta(seconds=TIMEOUT_S))
        if R != 0:
            continue
        backend = sub._get_backend(torch.device("cpu"))
        works, stop = [], threading.Event()

        def issue():
            t = torch.ones(1)
            while not stop.is_set():
                try:
                    works.append(backend.allreduce([t]))
                except Exception:  # noqa: BLE001 - "shut down": the end of this trial
                    return
        th = threading.Thread(target=issue, daemon=True)
        th.start()
        time.sleep(0.01)
        dist.destroy_process_group(sub)
        stop.set()
        th.join(TIMEOUT_S)
        for w in works[-5:]:
            try:
                w.wait(timeout=timedelta(seconds=2))
            except Exception as e:  # noqa: BLE001 - a failure (the abort) is fine, not a hang
                lost += "did not complete" in str(e)
    return "ok" if lost == 0 else "%d calls of %d groups never ran" % (lost, trials)


def coalesced_first_fails(res):
    """all_gather_into_tensor / reduce_scatter_tensor in torch's coalescing manager, the first
    one refused by shoal (its counts differ across the ranks: SHOAL_CHECK_ARGS=1 makes that
    SHOAL_ERR_INVALID_ARG on every rank), the second fine: the backend returned the last
    operation's Work only, so cm.wait() returned as if the batch had succeeded and the first
    output was never written. The Work now covers every operation of the batch: it raises the
    first failure, and one that succeeds holds every output."""
    for name, fn in (("all_gather", dist.all_gather_into_tensor),
                     ("reduce_scatter", dist.reduce_scatter_tensor)):
        gather = name == "all_gather"
        bad = torch.ones(2 + R) if gather else torch.ones(2 * (2 + R))
        bad_out = torch.zeros(2 * (2 + R)) if gather else torch.zeros(2 + R)
        good = torch.full((4,) if gather else (8,), float(R + 1))
        good_out = torch.zeros(8 if gather else 4)

        def batch(pairs):
            with dist._coalescing_manager(async_ops=True) as cm:
                for out, inp in pairs:
                    fn(out, inp)
            cm.wait()
            return cm.works
        res["coalesced_%s_first_fails" % name] = expect(
            dist.DistBackendError, ["INVALID_ARG"], lambda: batch([(bad_out, bad),
                                                                   (good_out, good)]))
        outs = [torch.zeros(8 if gather else 4) for _ in range(2)]
        ins = [torch.full((4,) if gather else (8,), float(R + 1) * (i + 1)) for i in range(2)]
        done = batch(list(zip(outs, ins)))
        want = [[1.0] * 4 + [2.0] * 4, [2.0] * 4 + [4.0] * 4] if gather else \
            [[3.0] * 4, [6.0] * 4]
        got = [o.tolist() for o in outs]
        held = [t.data_ptr() for w in done for t in w.result()]
        if got != want:
            res["coalesced_%s_ok" % name] = "got %s" % got
        elif sorted(held) != sorted(o.data_ptr() for o in outs):
            res["coalesced_%s_ok" % name] = "the Work holds %d of the 2 outputs" % len(held)
        else:
            res["coalesced_%s_ok" % name] = "ok"
    res["usable_after_coalesced"] = works(all_reduce_works)


def main():
    dist.init_process_group("shoal", timeout=timedelta(seconds=TIMEOUT_S))
    gloo = dist.new_group(backend="gloo")
    res = {}
    if os.environ.get("SHOAL_CHECK_ARGS") == "1":
        coalesced_first_fails(res)
        finish(res, gloo)
        return
    t = torch.ones(8)
    for op in ("BAND", "BOR", "BXOR"):
        res["bitwise_" + op] = expect(
            NotImplementedError, [op, "not supported"],
            lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32),
                                    op=getattr(dist.ReduceOp, op)))
    res["premul_sum"] = expect(
        NotImplementedError, ["PREMUL_SUM"],
        lambda: dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0)))
    # torch.distributed views a complex tensor as real pairs itself where the op allows it
    # (SUM): the data is right; where it does not, it refuses before the backend
    c = torch.full((4,), complex(1, 2 * R + 1))
    dist.all_reduce(c)
    res["complex_sum_via_torch"] = ("ok" if c.tolist() == [complex(2, 4)] * 4
                                    else "got %s" % c.tolist())
    # a complex tensor handed to the backend directly (ProcessGroup API): shoal refuses it
    pg = dist.distributed_c10d._get_default_group()
    res["complex"] = expect(NotImplementedError, ["complex"],
                            lambda: pg.allreduce([torch.ones(4, dtype=torch.complex64)]).wait())
    res["bool"] = expect(NotImplementedError, ["bool"],
                         lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool)))
    res["non_contiguous"] = expect(ValueError, ["not contiguous"],
                                   lambda: dist.all_reduce(torch.ones(4, 4).t()))
    res["channels_last"] = channels_last()
    res["channels_last_all_gather"] = expect(
        ValueError, ["not contiguous", "all_gather"],
        lambda: dist.all_gather([torch.empty(1, 2, 2, 2) for _ in range(2)],
                                torch.ones(1, 2, 2, 2).to(memory_format=torch.channels_last)))
    res["gather_into_wrong_size"] = expect(
        ValueError, ["all_gather_into_tensor", "expected"],
        lambda: dist.all_gather_into_tensor(torch.empty(3), torch.ones(2)))
    res["recv_anysource"] = expect((NotImplementedError, RuntimeError, ValueError), ["source"],
                                   lambda: dist.recv(torch.empty(2)))
    # the communicator still works after the refused calls
    u = torch.full((4,), float(R + 1))
    dist.all_reduce(u)
    res["usable_after_refusals"] = "ok" if u.tolist() == [3.0] * 4 else "got %s" % u.tolist()
    # all_to_all_single whose splits disagree across ranks: every rank fails the same way
    ins = [1, 1] if R == 0 else [2, 1]
    outs = [1, 1] if R == 0 else [1, 1]  # rank 0 expects 1 row from rank 1, which sends 2
    src = torch.ones(sum(ins), 2)
    dst = torch.empty(sum(outs), 2)
    res["alltoall_split_mismatch"] = expect(
        dist.DistBackendError, ["split sizes do not match"],
        lambda: dist.all_to_all_single(dst, src, outs, ins))
    # the binding's own check failed the call on both ranks; the communicator still works
    u = torch.full((4,), float(R + 1))
    dist.all_reduce(u)
    res["usable_after_mismatch"] = "ok" if u.tolist() == [3.0] * 4 else "got %s" % u.tolist()
    if os.environ.get("TORCH_DISTRIBUTED_DEBUG") != "DETAIL":
        # without DETAIL shoal itself finds the counts differ: the error says what to look at
        # (it said only "SHOAL_ERR_INVALID_ARG (invalid argument)"), the group stays usable
        v = torch.ones(1000 + R)
        res["count_mismatch"] = expect(dist.DistBackendError,
                                       ["INVALID_ARG", "differ", "TORCH_DISTRIBUTED_DEBUG"],
                                       lambda: dist.all_reduce(v))
        u = torch.full((4,), float(R + 1))
        dist.all_reduce(u)
        res["usable_after_count_mismatch"] = ("ok" if u.tolist() == [3.0] * 4
                                              else "got %s" % u.tolist())
    # mismatched shapes: rank 0 reduces 1000 elements, rank 1 1001. With
    # TORCH_DISTRIBUTED_DEBUG=DETAIL torch wraps the shoal group (as it wraps Gloo and NCCL)
    # and compares every collective's shapes, dtypes and op across ranks first (test_errors
    # runs this worker that way): a clear error on every rank, the communicator untouched.
    if os.environ.get("TORCH_DISTRIBUTED_DEBUG") == "DETAIL":
        v = torch.ones(1000 + R)
        res["shape_mismatch"] = expect(RuntimeError, ["mismatch", "1000", "1001"],
                                       lambda: dist.all_reduce(v))
        u = torch.full((4,), float(R + 1))
        dist.all_reduce(u)
        res["usable_after_shape_mismatch"] = ("ok" if u.tolist() == [3.0] * 4
                                              else "got %s" % u.tolist())
    if os.environ.get("TORCH_DISTRIBUTED_DEBUG") != "DETAIL":
        batch_refused(res, pg)
        batch_torch_raised(res)
        res["wait_inside_batch"] = wait_inside_batch()
        res["wait_long_timeout"] = wait_long_timeout()
        res["wait_max_timeout"] = wait_max_timeout()
        shutdown_pending(res, gloo)
        destroy_releases_comm(res)
        forked_child(res)
        callback_drops_backend(res, gloo)
        res["call_racing_shutdown"] = call_racing_shutdown()
    finish(res, gloo)


def finish(res, gloo):
    """Prints the verdicts of both ranks (rank 0) and ends the groups."""
    verdicts = [None, None]
    dist.all_gather_object(verdicts, res, group=gloo)
    merged = {k: next(("rank %d: %s" % (r, v[k]) for r, v in enumerate(verdicts)
                       if v[k] != "ok"), "ok") for k in res}
    if R == 0:
        print("RESULTS " + json.dumps(merged), flush=True)
    dist.barrier(group=gloo)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
