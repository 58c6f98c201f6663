"""A training script as a user writes it: one word names the backend. Run by torchrun,
shoalrun or mpirun; prints "LAUNCH_OK rank R of N via <launcher>" when the checks pass."""
import os
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shoal_torch  # noqa: E402  (also autoloaded by torch; fills RANK etc. under shoalrun/mpirun)

launcher = shoal_torch.LAUNCHER or ("torchrun" if "TORCHELASTIC_RUN_ID" in os.environ
                                     else "env")
# secrets the backend never uses (shoalrun's SHOAL_UID) are gone at import: a process started
# before init_process_group inherits none of them
env_child = subprocess.run(["env"], capture_output=True, text=True).stdout
early = [k for k in ("SHOAL_UID", "SHOAL_SECRET") if k in os.environ or k + "=" in env_child]
assert not early, "secret variables a child inherits before init: %s" % early
dist.init_process_group("shoal")
rank, n = dist.get_rank(), dist.get_world_size()
# the job's secrets are gone from Python's copy of the environment too (shoalrun sets SHOAL_UID)
leaked = [k for k in ("SHOAL_UID", "SHOAL_SECRET", "SHOAL_CREDENTIAL") if k in os.environ]
assert not leaked, "secret variables left in os.environ: %s" % leaked
t = torch.full((1000,), float(rank + 1))
dist.all_reduce(t)
assert t[0].item() == n * (n + 1) / 2, t[0]
torch.manual_seed(0)
m = nn.parallel.DistributedDataParallel(nn.Linear(8, 4))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for step in range(5):
    opt.zero_grad()
    m(torch.randn(4, 8) + rank).pow(2).mean().backward()
    opt.step()
w = m.module.weight.detach().clone()
ref = w.clone()
dist.broadcast(ref, 0)
assert torch.equal(w, ref), "replicas differ"
print("LAUNCH_OK rank %d of %d via %s" % (rank, n, launcher), flush=True)
dist.destroy_process_group()
