"""One rank (of 2) of the unique id's rendezvous through a store of our own: after the
backend is created, the store no longer holds the id (it carries the job secret, and torch's
TCPStore answers anyone who connects, for the whole job). Prints "UID_LEFT <bool>"."""
import os
import sys
import time
from datetime import timedelta

import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shoal_torch  # noqa: E402

rank = int(os.environ["RANK"])
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), 2, rank == 0,
                      timeout=timedelta(seconds=60))
pg = dist.PrefixStore("uidtest", store)
backend = shoal_torch._C.create_backend(pg, rank, 2, 30000)
# both ranks' backends are up (rank 0 deletes the key before it says so)
store.add("up", 1)
deadline = time.monotonic() + 30
while store.add("up", 0) < 2 and time.monotonic() < deadline:
    time.sleep(0.01)
print("UID_LEFT %s" % pg.check(["shoal_uid"]), flush=True)
store.add("checked", 1)
while store.add("checked", 0) < 2 and time.monotonic() < deadline:
    time.sleep(0.01)
del backend
