"""shoal as a torch.distributed backend.

    import shoal_torch                      # registers the backend "shoal"
    torch.distributed.init_process_group("shoal")

CPU tensors run on the group's worker thread (shoal's blocking host calls). In a CUDA build
(shoal_torch.CUDA is True) CUDA tensors run as stream-ordered shoal calls on the current CUDA
stream of their device: the call returns at once, work.wait() makes the current stream wait
for it, and the work's future is CUDA-aware (as NCCL's), so DDP on GPUs needs no host sync.
The backend is registered for the "cpu" and "cuda" device types; in a CPU-only build a CUDA
tensor raises an error that says how to build with CUDA.

Installed with pip, the package also registers itself when torch is imported (the
"torch.backends" entry point), so an unmodified script only changes the backend's name.

Rendezvous goes through the store torch hands the backend (env://, tcp://, file://, torchrun).
Under shoalrun, mpirun or srun, which set no RANK/WORLD_SIZE, importing this package fills them
in from the launcher (see launcher_env), so init_process_group("shoal") works there too.
"""
import contextlib
import ctypes
import functools
import inspect
import hashlib
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from . import _C

__all__ = ["launcher_env", "version", "BACKEND", "CUDA", "LAUNCHER"]

# The launcher whose variables filled RANK / WORLD_SIZE at import ("shoal", "ompi", "pmix",
# "pmi", "slurm"), or None.
LAUNCHER = None

BACKEND = "shoal"

# True when this build takes CUDA tensors (torch with CUDA, the CUDA toolkit and a libshoal
# built with CUDA were found when it was built; see setup.py). Needs no GPU to be True: a CUDA
# call on a machine without one raises shoal's error.
CUDA = bool(_C.cuda_built())

# (rank, size, local rank) variables of the launchers shoal knows, in the order shoal's own
# shoal_comm_init_env reads them (src/core/core_config.c), shoalrun's first.
_LAUNCHERS = (
    ("SHOAL_RANK", "SHOAL_NRANKS", "SHOAL_LOCAL_RANK"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("PMIX_RANK", "PMIX_SIZE", None),
    ("PMI_RANK", "PMI_SIZE", None),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
)

# Variables that are the same on every rank of one launch and differ between launches.
_JOB_IDS = ("SHOAL_UID", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE",
            "SLURM_JOB_ID")


def version():
    """The version of the libshoal this backend was built against and runs on."""
    return _C.version()


def _port_span(path="/proc/sys/net/ipv4/ip_local_port_range"):
    """The ports MASTER_PORT is derived in: 20000 up to the kernel's ephemeral range (whose
    ports outgoing connections take, so that a derived port there can be in use: torch's
    store then fails with EADDRINUSE), else above it, else 20000-49999. (first, count)"""
    lo, hi = 32768, 60999
    try:
        with open(path) as f:
            lo, hi = (int(v) for v in f.read().split()[:2])
    except (OSError, ValueError):
        pass
    if lo - 20000 >= 1000:
        return 20000, lo - 20000
    if 65535 - hi >= 1000:
        return hi + 1, 65535 - hi
    return 20000, 30000


def _check_shoal_vars(env, rank, size):
    """SHOAL_RANK or SHOAL_NRANKS set alone (`mpirun -x SHOAL_NRANKS=3 -np 2`) must agree with
    the launcher's value, as in shoal_comm_init_env: a job of another size than asked for
    (or one that waits for a rank that never comes) is not run silently. ValueError names
    both values. -1 (or any value below 0; 0 for SHOAL_NRANKS) is libshoal's "unset"."""
    if rank == "SHOAL_RANK":
        return
    for mine, theirs, unset_below in (("SHOAL_RANK", rank, 0), ("SHOAL_NRANKS", size, 1)):
        if mine not in env:
            continue
        try:
            v = int(env[mine])
        except ValueError:
            raise ValueError("shoal_torch: %s=%r is not a number" % (mine, env[mine])) from None
        try:
            same = v == int(env[theirs])
        except ValueError:
            same = False
        if v >= unset_below and not same:
            raise ValueError("shoal_torch: %s=%s, but the launcher says %s=%s: unset %s, or "
                             "set both SHOAL_RANK and SHOAL_NRANKS"
                             % (mine, env[mine], theirs, env[theirs], mine))


def _pmi_local_rank(env, rank, size):
    """The local rank under PMIx or PMI, which put none in the environment: Hydra's
    MPI_LOCALRANKID (MPICH's and Intel MPI's mpiexec), else Slurm's SLURM_LOCALID when Slurm's
    tasks are the launcher's ranks (srun --mpi=pmi2 or pmix: the same rank and size; not
    mpiexec inside an allocation, whose tasks are its per-host proxies), else the rank, right
    on one host only. The rank alone made rank 3 of `srun -N 2 -n 4 --mpi=pmi2` local rank 3
    instead of 1: torch.cuda.set_device(LOCAL_RANK) picked another rank's GPU or none."""
    if "MPI_LOCALRANKID" in env:
        return env["MPI_LOCALRANKID"]
    if ("SLURM_LOCALID" in env and env.get("SLURM_PROCID") == rank and
            env.get("SLURM_NTASKS") == size):
        return env["SLURM_LOCALID"]
    return rank


def launcher_env(environ=None):
    """Fills RANK, WORLD_SIZE and LOCAL_RANK from shoalrun / Open MPI / PMI / Slurm variables
    when RANK or WORLD_SIZE is unset, and MASTER_ADDR (127.0.0.1) and MASTER_PORT (a port
    derived from the launch's job id, the same on every rank, below the kernel's ephemeral
    port range: 20000-32767 with Linux's default) when unset. Returns the name of the launcher
    found, or None (then nothing is changed; Slurm's variables in a batch script, which is no
    task of srun, count as none unless SLURM_NTASKS is 1). Set MASTER_ADDR and MASTER_PORT yourself for
    jobs that span hosts. Raises ValueError when SHOAL_RANK or SHOAL_NRANKS is set alone and
    differs from the launcher's value."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return None
    for rank, size, local in _LAUNCHERS:
        if rank == "SLURM_PROCID" and "SLURM_STEP_ID" not in env and env.get(size) != "1":
            # Slurm's batch script (SLURM_PROCID=0, the allocation's SLURM_NTASKS, no step):
            # taken for rank 0 of SLURM_NTASKS, a script run there without srun waited for
            # ranks nobody started until torch's timeout (30 min); unset, RANK fails at once.
            continue
        if rank in env and size in env:
            _check_shoal_vars(env, rank, size)
            env["RANK"] = env[rank]
            env["WORLD_SIZE"] = env[size]
            if "LOCAL_RANK" not in env:
                env["LOCAL_RANK"] = env.get(local, env[rank]) if local else \
                    _pmi_local_rank(env, env[rank], env[size])
            env.setdefault("MASTER_ADDR", "127.0.0.1")
            if "MASTER_PORT" not in env:
                job = "".join(env.get(k, "") for k in _JOB_IDS) + env.get("SLURM_STEP_ID", "")
                if job:
                    first, count = _port_span()
                    # SHA-256, not CRC32: SHOAL_UID holds the job secret, and CRC32 is
                    # linear, so the port (visible to every user of the host) gave away
                    # about 14 bits of it.
                    digest = hashlib.sha256(job.encode()).digest()
                    env["MASTER_PORT"] = str(first + int.from_bytes(digest[:8], "big") % count)
            return rank.split("_")[0].lower()
    return None


# Secret variables: libshoal reads them once and removes them from the C environment, but
# Python keeps its own copy in os.environ, which a subprocess given env=dict(os.environ) would
# inherit.
_SECRETS = ("SHOAL_UID", "SHOAL_SECRET", "SHOAL_CREDENTIAL")
# Those this backend never hands to libshoal (it makes its own unique id and meets through
# torch's store, never through SHOAL_ROOT): removed at import (after launcher_env used SHOAL_UID
# for MASTER_PORT), so that no process the script starts before init_process_group inherits
# them. SHOAL_CREDENTIAL stays until libshoal has read it (_create).
_UNUSED_SECRETS = ("SHOAL_UID", "SHOAL_SECRET")


def _in_c_environ(name):
    """Whether the C environment (which libshoal reads, and removes its secrets from) still
    holds name; os.environ is Python's copy, made at startup."""
    getenv = ctypes.CDLL(None).getenv
    getenv.restype = ctypes.c_char_p
    getenv.argtypes = [ctypes.c_char_p]
    return getenv(name.encode()) is not None


def _timeout_ms(timeout):
    """The group's timeout in whole milliseconds for shoal, where 0 or less is infinite: a
    positive timeout under 1 ms is 1 ms, not 0 (which made it infinite); one over the C
    int's range (about 24 days) is the most it holds."""
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    ms = timeout.total_seconds() * 1000
    return min(max(int(ms), 1), 2**31 - 1) if ms > 0 else 0


def _create(store, rank, size, timeout):
    # the group's timeout becomes every wait's deadline inside shoal (<= 0: infinite)
    try:
        backend = _C.create_backend(store, rank, size, _timeout_ms(timeout))
    except BaseException:
        # A failed init (a refused credential, a peer that never came) left the secrets libshoal
        # had read (and removed from the C environment) in os.environ, which a process started
        # with env=os.environ then inherited. Those it has not read yet stay for a retry.
        for k in _SECRETS:
            if k in os.environ and not _in_c_environ(k):
                os.environ.pop(k, None)
        raise
    for k in _SECRETS:  # read by now (the library's configuration is loaded)
        os.environ.pop(k, None)
    return backend


def _abandon_batch(group, device):
    """After an exception inside torch's coalescing manager on a shoal group: drops torch's
    record of the batch and closes the backend's batch without running it (its operations
    fail). Never raises: the exception on its way out is the one to report."""
    try:
        c10d = dist.distributed_c10d
        pg = group or c10d._get_default_group()
        if dist.get_backend(pg) != BACKEND:
            return
        c10d._world.pg_coalesce_state.pop(pg, None)
        if device is not None:
            backend = pg._get_backend(torch.device(device))
            while hasattr(backend, "wrapped_pg"):  # TORCH_DISTRIBUTED_DEBUG=DETAIL's wrapper
                backend = backend.wrapped_pg
            _C.abandon_batch(backend)
    except Exception:  # noqa: BLE001
        pass


def _guard_coalescing(manager):
    """torch's _coalescing_manager (batch_isend_irecv runs its operations in it) has no cleanup
    for an exception raised inside it by torch's own checks or the caller's code, which the
    backend never sees: the backend's batch stayed open, so every later operation of the group
    joined it and never ran (a broadcast raised "part of a batch that has not ended", the next
    batch_isend_irecv "startCoalescing while a batch is open"), and torch's own record of the
    batch stayed, so that the group's all_reduce was only recorded, never run. On a shoal
    group such an exception now abandons the batch (_abandon_batch); other groups are left as
    torch leaves them."""
    try:
        sig = inspect.signature(manager)
    except (TypeError, ValueError):
        sig = None

    @functools.wraps(manager)
    @contextlib.contextmanager
    def guarded(*args, **kwargs):
        try:
            with manager(*args, **kwargs) as cm:
                yield cm
        except BaseException:
            # the arguments as torch's signature names them, whatever it adds later
            try:
                given = sig.bind_partial(*args, **kwargs).arguments if sig else {}
            except TypeError:
                given = {}
            _abandon_batch(given.get("group"), given.get("device"))
            raise
    guarded._shoal_guarded = True
    return guarded


def _install_batch_guard():
    c10d = dist.distributed_c10d
    manager = c10d._coalescing_manager
    if getattr(manager, "_shoal_guarded", False):
        return
    guarded = _guard_coalescing(manager)
    c10d._coalescing_manager = guarded  # batch_isend_irecv looks it up here when called
    if getattr(dist, "_coalescing_manager", None) is manager:
        dist._coalescing_manager = guarded


def _register():
    if BACKEND not in dist.Backend.backend_list:
        # "cuda" in every build: a CPU-only build then refuses a CUDA tensor with its own
        # sentence (how to build with CUDA) rather than torch's "no backend for cuda"
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])


LAUNCHER = launcher_env()
for _k in _UNUSED_SECRETS:
    os.environ.pop(_k, None)
_register()
_install_batch_guard()
# A future taken from a CPU work before a fork waited for ever in the child (its worker and
# completion threads are the parent's): the child marks it (the work's outcome, or an error
# that says the work completes in the parent) as soon as the fork returns.
os.register_at_fork(after_in_child=_C.settle_forked_works)
