"""batch_isend_irecv on CPU tensors larger than shoal's transport buffers, every rank sending
first (batch_worker.py): the backend runs a batch inside one shoal group, so it completes
instead of waiting for the group's timeout."""
import pytest

from harness import launch, results_json


@pytest.mark.parametrize("n", [2, 3])
def test_batch_isend_irecv(n):
    res = launch("batch_worker.py", n, timeout=90)
    v = results_json(res.outs[0])
    assert v is not None, "the ranks printed no results:\n" + res.text()[-6000:]
    assert all(rc == 0 for rc in res.rcs), res.text()[-6000:]
    for case, verdict in v.items():
        assert verdict == "ok", "%s: %s" % (case, verdict)
    assert len(v) == (4 if n == 2 else 2), v
