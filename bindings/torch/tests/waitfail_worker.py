"""One rank of the wait-on-a-dead-peer check (3 ranks, CPU tensors). Rank 0 waits for a
receive from rank 2, which is alive but idle (it sleeps, calling nothing); rank 1 dies
(SIGKILL) 1 s after the three ranks' first all_reduce. Rank 0's call waits only for rank 2, so
only the communicator's asynchronous error (shoal_comm_get_async_error, polled by the Work's
wait) can tell it that rank 1 is gone: the wait must raise DistBackendError naming rank 1 long
before rank 2 wakes up or the group's timeout. argv[1]: "timeout" waits with
Work.wait(timeout=...), "plain" with Work.wait(). Rank 0 prints "RESULTS {...}"."""
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


def main():
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
    work = dist.irecv(buf, src=2)
    res = {"raised": None, "message": "", "after_kill_s": None}
    try:
        if sys.argv[1] == "timeout":
            work.wait(timeout=timedelta(seconds=GROUP_TIMEOUT_S))
        else:
            work.wait()
    except Exception as e:  # noqa: BLE001 - the type is part of the verdict
        res["raised"] = type(e).__name__
        res["message"] = str(e)[:600]
    res["after_kill_s"] = time.time() - t_kill
    # one write: the library's own error line (stderr, same pipe) must not split it
    os.write(1, ("RESULTS " + json.dumps(res) + "\n").encode())
    os._exit(0)  # the communicator is dead; nothing to tear down with the others


if __name__ == "__main__":
    main()
