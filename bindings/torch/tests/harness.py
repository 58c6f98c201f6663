"""Starts N ranks of a worker script the way torch's env:// init expects them (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT), each under a deadline; collects exit codes and output."""
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
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


def _abort(procs):
    """SIGABRT first: faulthandler (PYTHONFAULTHANDLER) prints where every thread of a hung
    rank is, which the test's message then shows; SIGKILL for what is left 10 s later."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        p.send_signal(signal.SIGABRT)
    deadline = time.monotonic() + 10
    for p in alive:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def launch(script, n, args=(), timeout=120, env=None, expendable=(), stall=None,
           progress="VERDICT "):
    """Runs n copies of tests/<script> as ranks 0..n-1; aborts what is left after timeout
    (their rc is then None). Ranks in expendable are killed (rc None) as soon as all the
    others have ended. stall (seconds): also abort the ranks left when no rank has printed a
    line starting with progress for that long (from the start, then from the last such
    line), so that a launch that hangs in one case costs stall seconds, not timeout."""
    port = free_port()
    procs, readers = [], []
    t0 = time.monotonic()
    bufs = [[] for _ in range(n)]
    last = [t0]
    for r in range(n):
        e = worker_env(env)
        e.update(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, script)] + list(args),
                                      env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, preexec_fn=_no_core))

    def read(r):
        for line in procs[r].stdout:
            bufs[r].append(line)
            if line.startswith(progress):
                last[0] = time.monotonic()

    for r in range(n):
        th = threading.Thread(target=read, args=(r,), daemon=True)
        th.start()
        readers.append(th)
    rcs = [None] * n
    main = [r for r in range(n) if r not in expendable]
    while True:
        now = time.monotonic()
        if all(procs[r].poll() is not None for r in main):
            break
        if now - t0 >= timeout or (stall is not None and now - last[0] >= stall):
            break
        time.sleep(0.05)
    killed = set()
    for r in expendable:
        if procs[r].poll() is None:
            procs[r].kill()
            procs[r].wait()
            killed.add(r)
    hung = [r for r in range(n) if procs[r].poll() is None]
    for r in range(n):
        if r not in killed and r not in hung:
            rcs[r] = procs[r].returncode
    _abort([procs[r] for r in hung])
    for th in readers:
        th.join(timeout=10)
    for p in procs:
        if p.stdout is not None:
            p.stdout.close()
    return Result(rcs, ["".join(b) for b in bufs], time.monotonic() - t0)


def results_json(out):
    """The JSON object a worker printed on its line starting with RESULTS."""
    for line in out.splitlines():
        if line.startswith("RESULTS "):
            return json.loads(line[len("RESULTS "):])
    return None
