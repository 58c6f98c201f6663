"""The same unmodified script under torchrun, shoalrun and mpirun (2 ranks each)."""
import os
import shutil
import subprocess
import sys

import pytest

from harness import HERE, free_port, launch, worker_env

TOP = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
SCRIPT = os.path.join(HERE, "launch_worker.py")


def _run(cmd, env=None, timeout=120):
    p = subprocess.run(cmd, env=worker_env(env), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return p.returncode, p.stdout


def _check(rc, out, n=2):
    assert rc == 0, out[-5000:]
    for r in range(n):
        assert "LAUNCH_OK rank %d of %d" % (r, n) in out, out[-5000:]


def test_torchrun():
    torchrun = shutil.which("torchrun") or None
    cmd = [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]
    rc, out = _run(cmd + ["--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                          "--master-port", str(free_port()), SCRIPT])
    _check(rc, out)
    assert "via torchrun" in out, out[-3000:]


def test_shoalrun():
    shoalrun = os.environ.get("SHOALRUN") or os.path.join(TOP, "build", "shoalrun")
    if not os.access(shoalrun, os.X_OK):
        shoalrun = shutil.which("shoalrun")
    assert shoalrun, "no shoalrun: build shoal (scripts/build.sh) or set SHOALRUN"
    rc, out = _run([shoalrun, "-n", "2", "--timeout", "100", sys.executable, SCRIPT])
    _check(rc, out)
    assert "via shoal" in out, out[-3000:]


def test_mpirun():
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.fail("mpirun not found (scripts/deps.sh installs openmpi-bin)")
    env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}
    rc, out = _run([mpirun, "--oversubscribe", "-np", "2", "--bind-to", "none",
                    sys.executable, SCRIPT], env=env)
    _check(rc, out)
    assert "via ompi" in out, out[-3000:]


def test_master_port_outside_ephemeral_range(tmp_path):
    """The MASTER_PORT derived under a launcher lies outside the kernel's ephemeral port range
    (a port an outgoing connection holds made torch's store fail with EADDRINUSE)."""
    import shoal_torch
    f = tmp_path / "range"
    f.write_text("32768\t60999\n")
    assert shoal_torch._port_span(str(f)) == (20000, 12768)
    f.write_text("10000 60999\n")
    assert shoal_torch._port_span(str(f)) == (61000, 4536)
    f.write_text("1024 65000\n")
    assert shoal_torch._port_span(str(f)) == (20000, 30000)
    f.write_text("garbage\n")
    assert shoal_torch._port_span(str(f)) == (20000, 12768)
    with open("/proc/sys/net/ipv4/ip_local_port_range") as r:
        lo, hi = (int(v) for v in r.read().split()[:2])
    for uid in range(200):
        env = {"SHOAL_RANK": "0", "SHOAL_NRANKS": "2", "SHOAL_UID": "job%d" % uid}
        assert shoal_torch.launcher_env(env) == "shoal"
        port = int(env["MASTER_PORT"])
        assert 1024 <= port <= 65535 and not lo <= port <= hi, (port, lo, hi)


def test_unique_id_leaves_the_store():
    """The store torch hands the backend no longer holds the unique id (the job secret) once
    the group is up: rank 0 deletes it after its init, which no rank finishes without it."""
    res = launch("uid_worker.py", 2, timeout=90)
    assert res.rcs == [0, 0], res.text()[-5000:]
    for r in range(2):
        assert "UID_LEFT False" in res.outs[r], res.text()[-5000:]
