"""What shoal cannot do raises a clear Python error, never wrong data (see errors_worker.py).
Mismatched shapes across ranks are caught the way torch catches them for Gloo and NCCL:
TORCH_DISTRIBUTED_DEBUG=DETAIL wraps the shoal group and compares every collective first."""
import pytest

from harness import launch, results_json

CASES = ["bitwise_BAND", "bitwise_BOR", "bitwise_BXOR", "premul_sum", "complex_sum_via_torch",
         "complex", "bool", "non_contiguous", "channels_last",
         "channels_last_all_gather", "gather_into_wrong_size", "recv_anysource",
         "usable_after_refusals", "alltoall_split_mismatch", "usable_after_mismatch",
         "count_mismatch", "usable_after_count_mismatch", "batch_refused",
         "broadcast_after_refused_batch", "batch_after_refused_batch", "batch_torch_raised",
         "broadcast_after_torch_raised", "all_reduce_after_torch_raised",
         "batch_after_torch_raised", "wait_inside_batch", "wait_long_timeout",
         "wait_max_timeout", "shutdown_pending",
         "call_after_shutdown", "destroy_releases_comm", "destroyed_works_answer",
         "forked_child", "future_before_fork", "usable_after_fork",
         "callback_drops_backend", "call_racing_shutdown"]
DETAIL_CASES = ["shape_mismatch", "usable_after_shape_mismatch"]
# run with SHOAL_CHECK_ARGS=1 (shoal refuses a call whose counts differ across the ranks)
CHECK_ARGS_CASES = ["coalesced_all_gather_first_fails", "coalesced_all_gather_ok",
                    "coalesced_reduce_scatter_first_fails", "coalesced_reduce_scatter_ok",
                    "usable_after_coalesced"]
_runs = {}


def _verdicts(mode):
    if mode not in _runs:
        env = ({"SHOAL_CHECK_ARGS": "1"} if mode == "CHECK_ARGS" else
               {"TORCH_DISTRIBUTED_DEBUG": mode})
        res = launch("errors_worker.py", 2, timeout=120, env=env)
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


@pytest.mark.parametrize("case", CHECK_ARGS_CASES)
def test_check_args(case):
    assert _verdicts("CHECK_ARGS")[case] == "ok", _verdicts("CHECK_ARGS")[case]
