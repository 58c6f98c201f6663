"""A rank dies (SIGKILL) or stops (SIGSTOP) in the middle of DDP training over shoal: every
other rank raises torch.distributed.DistBackendError carrying shoal's sentence, within the
process group's timeout; none hangs."""
import re
import time

import pytest

from harness import launch, results_json

TIMEOUT_S = 10  # the process group's timeout (init_process_group(timeout=...))


def _train_with(sig, n=3, victim=1):
    env = {"DDP_ONLY_SHOAL": "1", "DDP_STEPS": "40", "DDP_KILL_RANK": str(victim),
           "DDP_KILL_STEP": "5", "DDP_KILL_SIGNAL": sig, "DDP_TIMEOUT_S": str(TIMEOUT_S)}
    t0 = time.monotonic()
    res = launch("ddp_worker.py", n, timeout=90, env=env, expendable=(victim,))
    return res, time.monotonic() - t0


def _survivors_raised(res, victim, words):
    for r, (rc, out) in enumerate(zip(res.rcs, res.outs)):
        if r == victim:
            continue
        assert rc is not None, "rank %d hung:\n%s" % (r, res.text()[-4000:])
        assert rc != 0, "rank %d finished training without an error:\n%s" % (r, out[-3000:])
        assert "DistBackendError" in out, out[-3000:]
        for w in words:
            assert re.search(w, out), "rank %d's error lacks %r:\n%s" % (r, w, out[-3000:])


def test_killed_rank():
    res, took = _train_with("SIGKILL")
    assert res.rcs[1] is None or res.rcs[1] == -9, res.text()[-3000:]
    # shoal names the dead peer; a dead process is found at once (not after the timeout)
    _survivors_raised(res, 1, [r"SHOAL_ERR_PEER_FAILED", r"peer 1 .*died|rank 1"])
    assert took < 60, "took %.1f s" % took


def test_stopped_rank_times_out():
    # a stopped rank is alive but silent: only the deadline can end the others' wait
    res, took = _train_with("SIGSTOP")
    assert res.rcs[1] is None  # stopped until the harness killed it after the others ended
    _survivors_raised(res, 1, [r"SHOAL_ERR_TIMEOUT", r"timed out after %d ms" % (TIMEOUT_S * 1000),
                               r"peer 1"])
    assert took < 75, "took %.1f s" % took


@pytest.mark.parametrize("how", ["plain", "timeout", "short"])
def test_wait_sees_dead_peer(how):
    # rank 0 waits for rank 2 (alive, idle); rank 1 dies: the Work's wait raises naming rank 1
    # within a few seconds (rank 2 idles 15 s, the group's timeout is 60 s)
    res = launch("waitfail_worker.py", 3, args=[how], timeout=60, expendable=(2,))
    v = results_json(res.outs[0])
    assert v is not None and res.rcs[0] == 0, res.text()[-4000:]
    assert v["raised"] == "DistBackendError", v
    assert "SHOAL_ERR_PEER_FAILED" in v["message"] and re.search(r"peer 1\b", v["message"]), v
    assert v["after_kill_s"] < 5.0, v
    if how == "short":
        # a wait of 50 ms on the failed communicator: it waited 500 ms more for the worker
        assert v["wait_s"] < 0.35, v
