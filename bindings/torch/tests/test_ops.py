"""Every operation x dtype x world size 1-4 through torch.distributed on the shoal backend,
checked against the exact result and against the same operation on a Gloo group of the same
processes. One launch per world size runs all of its cases (see ops_worker.py)."""
import pytest

from cases import all_cases
from harness import launch, results_json

_runs = {}


def _run(n):
    if n not in _runs:
        res = launch("ops_worker.py", n, timeout=240)
        _runs[n] = (res, results_json(res.outs[0]))
    return _runs[n]


@pytest.mark.parametrize("case", all_cases())
def test_op(case):
    n = int(case.rsplit("ws", 1)[1])
    res, verdicts = _run(n)
    assert verdicts is not None, "the ranks printed no results:\n" + res.text()[-6000:]
    assert all(rc == 0 for rc in res.rcs), res.text()[-6000:]
    assert verdicts[case].startswith("ok"), verdicts[case]

