"""Starts N ranks of a worker script the way torch's env:// init expects them (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT), each under a deadline; collects exit codes and output."""
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(extra=None):
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


class Result:
    def __init__(self, rcs, outs, elapsed):
        self.rcs, self.outs, self.elapsed = rcs, outs, elapsed

    def text(self):
        return "\n".join("--- rank %d (rc %s)\n%s" % (r, rc, o)
                         for r, (rc, o) in enumerate(zip(self.rcs, self.outs)))


def _no_core():
    # a rank aborted on timeout (SIGABRT, below) leaves its stack in the output, no core file
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def launch(script, n, args=(), timeout=120, env=None, expendable=()):
    """Runs n copies of tests/<script> as ranks 0..n-1; kills what is left after timeout
    (their rc is then None). Ranks in expendable are killed (rc None) as soon as all the
    others have ended."""
    port = free_port()
    procs = []
    t0 = time.monotonic()
    for r in range(n):
        e = worker_env(env)
        e.update(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, script)] + list(args),
                                      env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, preexec_fn=_no_core))
    rcs, outs = [None] * n, [""] * n
    order = [r for r in range(n) if r not in expendable] + list(expendable)
    for r in order:
        p = procs[r]
        if r in expendable and p.poll() is None:
            p.kill()
            outs[r] = p.communicate()[0]
            continue
        left = max(1.0, timeout - (time.monotonic() - t0))
        try:
            outs[r] = p.communicate(timeout=left)[0]
            rcs[r] = p.returncode
        except subprocess.TimeoutExpired:
            # SIGABRT first: faulthandler (PYTHONFAULTHANDLER) prints where every thread of
            # the hung rank is, which the test's message then shows
            p.send_signal(signal.SIGABRT)
            try:
                outs[r] = p.communicate(timeout=10)[0]
            except subprocess.TimeoutExpired:
                p.kill()
                outs[r] = p.communicate()[0]
    return Result(rcs, outs, time.monotonic() - t0)


def results_json(out):
    """The JSON object a worker printed on its line starting with RESULTS."""
    for line in out.splitlines():
        if line.startswith("RESULTS "):
            return json.loads(line[len("RESULTS "):])
    return None
