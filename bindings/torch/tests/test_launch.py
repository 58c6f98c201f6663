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


def test_timeout_under_a_millisecond_is_not_infinite():
    """shoal takes whole milliseconds, 0 for no deadline: a group timeout of 0.5 ms was
    truncated to 0, an infinite one."""
    import shoal_torch
    from datetime import timedelta
    assert shoal_torch._timeout_ms(timedelta(microseconds=500)) == 1
    assert shoal_torch._timeout_ms(timedelta(seconds=1.5)) == 1500
    assert shoal_torch._timeout_ms(0.0004) == 1
    assert shoal_torch._timeout_ms(timedelta(0)) == 0
    assert shoal_torch._timeout_ms(timedelta(days=30)) == 2**31 - 1


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


_FAILED_INIT = """
import os, subprocess, sys
import torch.distributed as dist
sys.path.insert(0, %r)
import shoal_torch
try:
    dist.init_process_group("shoal", rank=0, world_size=1, store=dist.HashStore())
    print("INIT succeeded")
except dist.DistBackendError:
    pass
child = subprocess.run(["env"], env=dict(os.environ), capture_output=True, text=True).stdout
print("LEFT %%s" %% ("SHOAL_CREDENTIAL" in os.environ or "SHOAL_CREDENTIAL=" in child))
"""


def test_credential_leaves_environ_after_failed_init():
    """An init that fails after libshoal read SHOAL_CREDENTIAL (here one it refuses) left the
    credential in os.environ: a process the script then started with env=os.environ (a retry,
    an error reporter) inherited the tenant's credential. It is removed as on success."""
    rc, out = _run([sys.executable, "-c", _FAILED_INIT % HERE],
                   env={"SHOAL_CREDENTIAL": "shoal-cred-v1:not-a-valid-one"}, timeout=60)
    assert rc == 0 and "LEFT False" in out, out[-3000:]


def test_shoal_vars_disagreeing_with_the_launcher():
    """`mpirun -x SHOAL_NRANKS=3 -np 2`: SHOAL_NRANKS (or SHOAL_RANK) set alone and different
    from the launcher's value is an error naming both, as in shoal_comm_init_env; agreeing or
    -1 (unset) is fine; both set win over the launcher (shoalrun inside an allocation)."""
    import shoal_torch
    ompi = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}
    for extra, words in (({"SHOAL_NRANKS": "3"}, ["SHOAL_NRANKS=3", "OMPI_COMM_WORLD_SIZE=2"]),
                         ({"SHOAL_RANK": "0"}, ["SHOAL_RANK=0", "OMPI_COMM_WORLD_RANK=1"])):
        with pytest.raises(ValueError) as e:
            shoal_torch.launcher_env(dict(ompi, **extra))
        assert all(w in str(e.value) for w in words), str(e.value)
    for extra in ({"SHOAL_NRANKS": "2"}, {"SHOAL_RANK": "1"}, {"SHOAL_NRANKS": "-1"}, {}):
        env = dict(ompi, **extra)
        assert shoal_torch.launcher_env(env) == "ompi"
        assert (env["RANK"], env["WORLD_SIZE"]) == ("1", "2")
    env = dict(ompi, SHOAL_RANK="0", SHOAL_NRANKS="4", SHOAL_UID="x")
    assert shoal_torch.launcher_env(env) == "shoal"
    assert (env["RANK"], env["WORLD_SIZE"]) == ("0", "4")


def test_mpirun_shoal_nranks_disagreeing():
    """The same under mpirun, for a script that only imports torch and shoal_torch: an error
    that names both values, not a job of 2 ranks that was asked to have 3."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.fail("mpirun not found (scripts/deps.sh installs openmpi-bin)")
    env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}
    rc, out = _run([mpirun, "--oversubscribe", "-np", "2", "--bind-to", "none", "-x",
                    "SHOAL_NRANKS=3", sys.executable, SCRIPT], env=env)
    assert rc != 0, out[-3000:]
    assert "SHOAL_NRANKS=3, but the launcher says OMPI_COMM_WORLD_SIZE=2" in out, out[-3000:]
    assert "LAUNCH_OK" not in out, out[-3000:]


def test_local_rank_under_pmi_and_pmix():
    """PMIx and PMI name no local rank: LOCAL_RANK comes from Hydra's MPI_LOCALRANKID or from
    Slurm's SLURM_LOCALID when Slurm's tasks are the ranks, not from the global rank (rank 3
    on the second host of a 2-host job was local rank 3, not 1)."""
    import shoal_torch
    slurm = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1"}
    for env, launcher in (
            (dict(slurm, PMI_RANK="3", PMI_SIZE="4"), "pmi"),           # srun --mpi=pmi2
            (dict(slurm, PMIX_RANK="3", PMIX_SIZE="4"), "pmix"),        # srun --mpi=pmix
            ({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1"}, "pmi")):  # hydra
        assert shoal_torch.launcher_env(env) == launcher
        assert (env["RANK"], env["LOCAL_RANK"]) == ("3", "1"), env
    # mpiexec inside an allocation: Slurm's task is the host's proxy, not this rank
    env = {"PMI_RANK": "3", "PMI_SIZE": "4", "SLURM_PROCID": "1", "SLURM_NTASKS": "2",
           "SLURM_LOCALID": "0"}
    assert shoal_torch.launcher_env(env) == "pmi"
    assert env["LOCAL_RANK"] == "3"
    env = {"PMIX_RANK": "2", "PMIX_SIZE": "4"}  # nothing else: one host, the rank
    assert shoal_torch.launcher_env(env) == "pmix"
    assert env["LOCAL_RANK"] == "2"


def test_slurm_batch_script_is_no_launcher():
    """A Slurm batch script (SLURM_PROCID=0, the allocation's SLURM_NTASKS, no SLURM_STEP_ID)
    is no task of srun: its variables fill nothing, so that init_process_group fails at once
    for want of RANK (it waited for 3 ranks nobody started until torch's timeout); a one-task
    batch job and srun's tasks are launchers as before."""
    import shoal_torch
    batch = {"SLURM_JOB_ID": "5", "SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0"}
    env = dict(batch)
    assert shoal_torch.launcher_env(env) is None
    assert "RANK" not in env and "WORLD_SIZE" not in env
    env = dict(batch, SLURM_NTASKS="1")
    assert shoal_torch.launcher_env(env) == "slurm"
    assert (env["RANK"], env["WORLD_SIZE"]) == ("0", "1")
    env = dict(batch, SLURM_STEP_ID="0", SLURM_PROCID="2", SLURM_LOCALID="2")
    assert shoal_torch.launcher_env(env) == "slurm"
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("2", "4", "2")
