"""The launcher the other tests stand on (harness.launch): a launch whose ranks stop
reporting progress is aborted after `stall` seconds, not at its whole timeout, and what the
ranks printed before, and where they hung (faulthandler on SIGABRT), comes back."""
import time

from harness import launch


def test_stalled_launch_is_aborted_early_and_keeps_its_output():
    t0 = time.monotonic()
    res = launch("stall_worker.py", 2, timeout=120, stall=3, env={"STALL_LINES": "2"})
    took = time.monotonic() - t0
    assert res.rcs == [None, None], res.text()[-3000:]  # aborted, not exited
    assert took < 20, "the launch took %.1f s with stall=3 (timeout 120)" % took
    for r, out in enumerate(res.outs):
        assert out.count("VERDICT ") == r + 2, out[-2000:]
        assert "stall_worker.py" in out, out[-2000:]  # the stack faulthandler printed


def test_timeout_still_applies_without_stall():
    t0 = time.monotonic()
    res = launch("stall_worker.py", 1, timeout=2)
    assert res.rcs == [None] and time.monotonic() - t0 < 15, res.text()[-2000:]
    assert "VERDICT case0" in res.outs[0]


def test_progress_resets_the_stall_clock():
    # rank 1 prints 11 lines 0.2 s apart (2.2 s) under stall=1.5: only the gaps count
    res = launch("stall_worker.py", 2, timeout=60, stall=1.5, env={"STALL_LINES": "10"})
    assert res.outs[1].count("VERDICT ") == 11, res.text()[-3000:]
