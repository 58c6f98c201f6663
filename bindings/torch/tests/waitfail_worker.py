"""One rank of the wait-on-a-dead-peer check (3 ranks, CPU tensors). Rank 0 waits for a
receive from rank 2, which is alive but idle (it sleeps, calling nothing); rank 1 dies
(SIGKILL) 1 s after the three ranks' first all_reduce. Rank 0's call waits only for rank 2, so
only the communicator's asynchronous error (shoal_comm_get_async_error, polled by the Work's
wait) can tell it that rank 1 is gone: the wait must raise DistBackendError naming rank 1 long
before rank 2 wakes up or the group's timeout. argv[1]: "timeout" waits with
Work.wait(timeout=...), "plain" with Work.wait(), "short" with Work.wait(timeout=SHORT_S) of
a receive issued 1.5 s after the kill (the communicator has failed by then) behind an
operation that keeps the worker busy: it must raise within that timeout, not up to half a
second later. Rank 0 prints "RESULTS {...}"."""
import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shoal_torch  # noqa: E402,F401

R = int(os.environ["RANK"])
GROUP_TIMEOUT_S = 60
IDLE_S = 15  # rank 2's sleep: the wait must have raised well before it ends
SHORT_S = 0.05  # "short": the wait's timeout
SMALL_N = int(os.environ.get("WAITFAIL_SMALL_N", "400000"))  # "short": the busy worker's tensors


def main():
    small = [torch.ones(1) for _ in range(SMALL_N if sys.argv[1] == "short" and R == 0 else 0)]
    dist.init_process_group("shoal", timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    t = torch.ones(4)
    dist.all_reduce(t)
    t_kill = time.time() + 1.0
    if R == 1:
        time.sleep(max(0.0, t_kill - time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    if R == 2:
        time.sleep(IDLE_S)
        os._exit(0)
    buf = torch.empty(4)
    if sys.argv[1] == "short":
        time.sleep(max(0.0, t_kill + 1.5 - time.time()))  # the communicator has failed
        # the worker flattens the many tensors (about a second) before shoal refuses the call
        dist.distributed_c10d._get_default_group().allreduce_coalesced(
            small, dist.AllreduceCoalescedOptions())
    work = dist.irecv(buf, src=2)
    res = {"raised": None, "message": "", "after_kill_s": None, "wait_s": None}
    t0 = time.monotonic()
    try:
        if sys.argv[1] == "short":
            work.wait(timeout=timedelta(seconds=SHORT_S))
        elif sys.argv[1] == "timeout":
            work.wait(timeout=timedelta(seconds=GROUP_TIMEOUT_S))
        else:
            work.wait()
    except Exception as e:  # noqa: BLE001 - the type is part of the verdict
        res["raised"] = type(e).__name__
        res["message"] = str(e)[:600]
    res["wait_s"] = time.monotonic() - t0
    res["after_kill_s"] = time.time() - t_kill
    # one write: the library's own error line (stderr, same pipe) must not split it
    os.write(1, ("RESULTS " + json.dumps(res) + "\n").encode())
    os._exit(0)  # the communicator is dead; nothing to tear down with the others


if __name__ == "__main__":
    main()
