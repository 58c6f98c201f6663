"""CUDA tensors on the shoal backend (stream-ordered shoal calls on the current stream).

Without a GPU the CUDA checks skip (torch cannot make a CUDA tensor there: it raises before
any backend sees one); what runs everywhere: the extension was built with CUDA exactly when
torch, the toolkit and libshoal allow it, the backend is registered for "cuda", and a CUDA
build's CPU collectives never initialise CUDA (cuda_worker.py, CUDA_MODE=cpu).

Where a GPU exists: every operation x dtype on CUDA tensors for 1, 2 and 4 ranks against the
exact result and the same operation on CPU tensors; a side stream (wait() orders the caller's
stream after the collective without blocking the host, is_completed() follows the stream);
the caching allocator does not reuse a pending collective's block; CUDA futures chain;
mixed CPU/CUDA calls are refused; a batch_isend_irecv of CPU and CUDA tensors returns a Work
that covers both; DDP on CUDA over shoal against DDP on the CPU over Gloo;
a dead rank makes the survivor's CUDA collectives raise within the timeout."""
import json
import os
import re
import subprocess

import pytest
import torch
import torch.distributed as dist

import shoal_torch
from cases import DTYPES, OPS, case_name
from harness import launch, results_json

GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not GPU, reason="no CUDA GPU here")
CUDA_SIZES = [1, 2, 4]
_runs = {}


def _libshoal_cuda():
    """What shoal_info -b of the tested build says about CUDA (None: unknown)."""
    shoalrun = os.environ.get("SHOALRUN")
    if not shoalrun:
        return None
    info = os.path.join(os.path.dirname(shoalrun), "shoal_info")
    try:
        out = subprocess.run([info, "-b"], capture_output=True, text=True, timeout=60).stdout
    except OSError:
        return None
    m = re.search(r"^#\s+cuda\s+found:\s+(yes|no)", out, re.M)
    return None if m is None else m.group(1) == "yes"


def test_extension_built_with_cuda_where_possible():
    from torch.utils.cpp_extension import CUDA_HOME
    shoal = _libshoal_cuda()
    if shoal is None:
        pytest.skip("SHOALRUN unset: cannot ask the tested libshoal about CUDA")
    mode = os.environ.get("SHOAL_TORCH_CUDA", "auto").lower()
    toolkit = CUDA_HOME is not None and os.path.exists(
        os.path.join(CUDA_HOME, "include", "cuda_runtime_api.h"))
    want = torch.version.cuda is not None and toolkit and shoal and mode not in ("0", "no",
                                                                                  "off", "false")
    assert shoal_torch.CUDA == bool(want), (
        "extension CUDA=%s; torch CUDA %s, toolkit %s, libshoal CUDA %s, SHOAL_TORCH_CUDA=%s"
        % (shoal_torch.CUDA, torch.version.cuda, CUDA_HOME, shoal, mode))


def test_registered_for_cpu_and_cuda():
    assert dist.Backend.backend_capability["shoal"] == ["cpu", "cuda"]


def test_cpu_collectives_leave_cuda_alone():
    res = launch("cuda_worker.py", 2, timeout=120, env={"CUDA_MODE": "cpu"})
    v = results_json(res.outs[0])
    assert v is not None and res.rcs == [0, 0], res.text()[-6000:]
    for r, rv in enumerate(v["per_rank"]):
        assert rv["sum_ok"] and rv["usable_after"], (r, rv)
        if not rv["gpu"]:
            assert rv["cuda_initialized"] is False, (r, rv)
            # torch refuses to make a CUDA tensor without a GPU, before any backend sees it
            assert rv["cuda_tensor"].startswith(("RuntimeError", "AssertionError")), (r, rv)


def _streamed(res):
    """Per case, what every rank printed on its VERDICT lines as it went (cuda_worker.record):
    "ok" where every rank said ok, else the first other verdict; a case some rank did not
    reach is missing. For a launch that printed no RESULTS (it hung or died later)."""
    per_rank = []
    for out in res.outs:
        v = {}
        for line in out.splitlines():
            if line.startswith("VERDICT "):
                name, _, text = line[len("VERDICT "):].partition(" ")
                try:
                    v[name] = json.loads(text)
                except ValueError:  # a line cut by the abort: that case counts as not reached
                    pass
        per_rank.append(v)
    names = set().union(*per_rank) if per_rank else set()
    return {k: next(("rank %d: %s" % (r, v[k]) for r, v in enumerate(per_rank)
                     if v.get(k, "ok") != "ok"), "ok")
            for k in names if all(k in v for v in per_rank)}


def _ops(n):
    """The ops launch of n ranks, once: (result, verdicts from RESULTS or None, streamed).
    Aborted when no rank reports a case for 45 s (a case takes seconds; the first one also
    starts CUDA), so a hang costs that, not the whole timeout."""
    if n not in _runs:
        res = launch("cuda_worker.py", n, timeout=150, stall=45, env={"CUDA_MODE": "ops"})
        _runs[n] = (res, results_json(res.outs[0]), _streamed(res))
    return _runs[n]


CUDA_CASES = ["cuda-" + case_name(op, dt, n) for n in CUDA_SIZES for op in OPS for dt in DTYPES]
CUDA_CASES += ["cuda-%s-ws%d" % (c, n) for n in CUDA_SIZES
               for c in ("side_stream", "record_stream", "future_then", "mixed_devices",
                         "usable_after_mixed", "interleaved_cpu", "mixed_batch")]


@needs_gpu
@pytest.mark.parametrize("case", CUDA_CASES)
def test_cuda_op(case):
    n = int(case.rsplit("ws", 1)[1])
    res, verdicts, streamed = _ops(n)
    if verdicts is None:
        # the launch did not finish: each case every rank reached keeps its own verdict
        key = case if case in streamed else case.rsplit("-ws", 1)[0]
        assert key in streamed, ("not reached on every rank: the launch hung or died in this "
                                 "case or an earlier one (rcs %s, %.0f s):\n%s"
                                 % (res.rcs, res.elapsed, res.text()[-6000:]))
        assert streamed[key].startswith("ok"), streamed[key]
        return
    assert all(rc == 0 for rc in res.rcs), res.text()[-6000:]
    key = case if case in verdicts else case.rsplit("-ws", 1)[0]
    assert verdicts[key].startswith("ok"), verdicts[key]


@needs_gpu
@pytest.mark.parametrize("n", [2, 4])
def test_cuda_ddp_matches_gloo_cpu(n):
    """Tolerance: the CUDA and CPU runs do the same float32 arithmetic in different kernels
    (cuBLAS vs the CPU's GEMM sum in other orders), a few ulp per operation, carried through
    50 SGD steps of a smooth model: losses to 1e-4 relative, parameters (~0.2) to 1e-4
    absolute; a wrong reduction is off by 1e-2 within a few steps."""
    res = launch("cuda_worker.py", n, timeout=200, stall=60, progress="STEP ",
                 env={"CUDA_MODE": "ddp", "DDP_STEPS": "50"})
    v = results_json(res.outs[0])
    assert v is not None and all(rc == 0 for rc in res.rcs), res.text()[-6000:]
    ls, lg = v["losses"]["shoal_cuda"], v["losses"]["gloo_cpu"]
    assert len(ls) == len(lg) == 50
    assert ls[-1] < 0.8 * ls[0], ls[::10]
    for step, (a, b) in enumerate(zip(ls, lg)):
        assert abs(a - b) <= 1e-4 * abs(b), "step %d: shoal/cuda %r gloo/cpu %r" % (step, a, b)
    assert v["max_param_diff"] <= 1e-4, v["max_param_diff"]
    assert all(r["replicas_equal"] for r in v["per_rank"]), "CUDA replicas diverged"


@needs_gpu
def test_cuda_dead_rank_raises():
    timeout_s = 10
    res = launch("cuda_worker.py", 2, timeout=120,
                 env={"CUDA_MODE": "fail", "CUDA_TIMEOUT_S": str(timeout_s)})
    v = results_json(res.outs[0])
    assert v is not None, res.text()[-6000:]
    assert v["raised"] == "DistBackendError", v
    assert "rank 1" in v["message"], v
    assert v["elapsed"] < 3 * timeout_s, v
