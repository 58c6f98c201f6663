"""What shoal cannot do raises a clear Python error, never wrong data (see errors_worker.py).
Mismatched shapes across ranks are caught the way torch catches them for Gloo and NCCL:
TORCH_DISTRIBUTED_DEBUG=DETAIL wraps the shoal group and compares every collective first."""
import pytest

from harness import launch, results_json

CASES = ["bitwise_BAND", "bitwise_BOR", "bitwise_BXOR", "premul_sum", "complex_sum_via_torch",
         "complex", "bool", "non_contiguous", "gather_into_wrong_size", "recv_anysource",
         "usable_after_refusals", "alltoall_split_mismatch", "usable_after_mismatch",
         "count_mismatch", "usable_after_count_mismatch", "batch_refused",
         "broadcast_after_refused_batch", "batch_after_refused_batch", "batch_torch_raised",
         "broadcast_after_torch_raised", "all_reduce_after_torch_raised",
         "batch_after_torch_raised", "wait_inside_batch", "shutdown_pending",
         "call_after_shutdown", "forked_child", "usable_after_fork",
         "callback_drops_backend", "call_racing_shutdown"]
DETAIL_CASES = ["shape_mismatch", "usable_after_shape_mismatch"]
_runs = {}


def _verdicts(mode):
    if mode not in _runs:
        res = launch("errors_worker.py", 2, timeout=120,
                     env={"TORCH_DISTRIBUTED_DEBUG": mode})
        v = results_json(res.outs[0])
        assert v is not None and res.rcs == [0, 0], res.text()[-6000:]
        _runs[mode] = v
    return _runs[mode]


@pytest.mark.parametrize("case", CASES)
def test_refused(case):
    assert _verdicts("OFF")[case] == "ok", _verdicts("OFF")[case]


@pytest.mark.parametrize("case", DETAIL_CASES)
def test_shape_mismatch_detail(case):
    assert _verdicts("DETAIL")[case] == "ok", _verdicts("DETAIL")[case]
