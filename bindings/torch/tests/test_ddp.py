"""DistributedDataParallel, a client nobody here wrote: the same model trained 50 steps on the
same synthetic data over shoal and over Gloo, side by side in the same processes.

Tolerance. With 2 ranks every gradient sum is one IEEE addition a + b, which is commutative:
shoal and Gloo must give bitwise the same gradients, so the losses and the final parameters are
asserted equal exactly. With 4 ranks the two libraries add the four contributions in different
orders (Gloo's ring vs shoal's algorithm), so each float32 sum may differ by a few ulp
(~1e-7 relative); 50 SGD steps carry that along without amplifying it much on this smooth
model. The losses must agree to 1e-5 relative and the parameters to 1e-5 absolute (the
parameters are ~0.2 in size; a wrong reduction - a missing rank, a wrong scale, a stale
bucket - is off by 1e-2 or more within a few steps)."""
import pytest

from harness import launch, results_json

STEPS = 50


def _train(n):
    res = launch("ddp_worker.py", n, timeout=240, env={"DDP_STEPS": str(STEPS)})
    v = results_json(res.outs[0])
    assert v is not None and all(rc == 0 for rc in res.rcs), res.text()[-6000:]
    return v


@pytest.mark.parametrize("n", [2, 4])
def test_ddp_matches_gloo(n):
    v = _train(n)
    ls, lg = v["losses"]["shoal"], v["losses"]["gloo"]
    assert len(ls) == len(lg) == STEPS
    assert ls[-1] < 0.8 * ls[0], "training did not reduce the loss: %s" % ls[::10]
    assert v["replicas_equal"], "DDP replicas diverged across ranks"
    if n == 2:
        assert ls == lg
        assert v["bitwise"] and v["max_param_diff"] == 0.0
    else:
        for step, (a, b) in enumerate(zip(ls, lg)):
            assert abs(a - b) <= 1e-5 * abs(b), "step %d: shoal %r gloo %r" % (step, a, b)
        assert v["max_param_diff"] <= 1e-5, v["max_param_diff"]
