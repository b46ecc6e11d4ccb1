"""Environment variable names and their parsing: the one place both the runtime and
hccl-launch read them from.

HCCL and MindSpore name ranks ``RANK_ID``/``RANK_SIZE``/``DEVICE_ID``; torchrun names them
``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE``. hccl-launch sets both.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .errors import HcclParamError

RANK_ID = "RANK_ID"
RANK_SIZE = "RANK_SIZE"
DEVICE_ID = "DEVICE_ID"
RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"

# hccl-py's own
JOB_ID = "HCCL_PY_JOB_ID"  # this job's identity (store keys, socket directory); set by the launcher, or by hand
JOB_SECRET = "HCCL_PY_JOB_SECRET"  # required on every store request; set by the launcher, else the per-user file
RUN_DIR = "HCCL_PY_RUN_DIR"  # this user's 0700 directory for job sockets and the secret file
STORE_HOSTED = "HCCL_PY_STORE_HOSTED"  # "1": someone else (hccl-launch, spawn) hosts the store

HCCL_PY_TOPOLOGY = "HCCL_PY_TOPOLOGY"  # preset name (hccl-launch --topology)
RANK_TABLE_FILE = "RANK_TABLE_FILE"  # HCCL's rank-table path (hccl-launch --rank-table)
HCCL_PY_FIGURES = "HCCL_PY_FIGURES"  # JSON file overriding link/card figures
HCCL_PY_TRACE_DIR = "HCCL_PY_TRACE_DIR"  # each rank writes its Chrome trace here at exit
HCCL_PY_FAULTS = "HCCL_PY_FAULTS"  # fault specs separated by ';' (hccl-launch --fault)
HCCL_PY_FLIGHT_DIR = "HCCL_PY_FLIGHT_DIR"  # ranks dump their flight recorder here on failure
HCCL_PY_CMA = "HCCL_PY_CMA"  # "0": no single-copy reads between ranks, every payload through the slots
HCCL_PY_MODELED_TIME = "HCCL_PY_MODELED_TIME"  # "0": no modeled clock (measures the bookkeeping's own cost)
HCCL_PY_WALL_ORIGIN = "HCCL_PY_WALL_ORIGIN"  # time.monotonic() the job started: aligns wall timelines
HCCL_PY_TRANSPORT = "HCCL_PY_TRANSPORT"  # shm | tcp | mpi: overrides the automatic transport choice
HCCL_PY_HOST_ID = "HCCL_PY_HOST_ID"  # which ranks share a host (shared memory); default: this kernel + namespaces
HCCL_PY_NNODES = "HCCL_PY_NNODES"  # hccl-launch --nnodes (set for every rank)
HCCL_PY_NODE_RANK = "HCCL_PY_NODE_RANK"  # hccl-launch --node-rank (set for every rank)

# Started by an MPI launcher or Slurm: (rank, size, local rank) variables, first match wins
MPI_LAUNCH_VARS = (
    ("mpiexec (MPICH/Hydra)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ("mpiexec (Open MPI)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("srun (Slurm)", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
)

# Other launchers' job identities (see launcher_job_id)
TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"  # torchrun's --rdzv-id ("none" when not given)
SLURM_JOB_ID = "SLURM_JOB_ID"
SLURM_STEP_ID = "SLURM_STEP_ID"
XDG_RUNTIME_DIR = "XDG_RUNTIME_DIR"

# HCCL's, with HCCL's defaults
HCCL_CONNECT_TIMEOUT = "HCCL_CONNECT_TIMEOUT"  # seconds, default 120
HCCL_EXEC_TIMEOUT = "HCCL_EXEC_TIMEOUT"  # seconds, default 1836; 0 = no limit
HCCL_BUFFSIZE = "HCCL_BUFFSIZE"  # MB of staging per rank
HCCL_ALGO = "HCCL_ALGO"
HCCL_IF_IP = "HCCL_IF_IP"  # the address this rank's TCP transport listens on (HCCL: NIC for host traffic)

DEFAULT_CONNECT_TIMEOUT_S = 120.0
DEFAULT_EXEC_TIMEOUT_S = 1836.0
# HCCL's default is 200 MB per communicator on device memory. Here every card shares one
# host's memory, so the default is smaller; large payloads stream through it in slices.
DEFAULT_BUFFSIZE_MB = 32


def _number(name: str, default: float, *, allow_zero: bool) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise HcclParamError(f"{name}={raw!r} is not a number of seconds/MB; unset it or give e.g. {name}={int(default)}") from None
    if value < 0 or (value == 0 and not allow_zero):
        raise HcclParamError(f"{name}={raw!r} must be {'>= 0' if allow_zero else '> 0'}")
    return value


def connect_timeout_s() -> float:
    """HCCL_CONNECT_TIMEOUT in seconds (any positive value)."""
    return _number(HCCL_CONNECT_TIMEOUT, DEFAULT_CONNECT_TIMEOUT_S, allow_zero=False)


def exec_timeout_s() -> float | None:
    """HCCL_EXEC_TIMEOUT in seconds; ``None`` for 0 (no limit)."""
    value = _number(HCCL_EXEC_TIMEOUT, DEFAULT_EXEC_TIMEOUT_S, allow_zero=True)
    return None if value == 0 else value


def buffsize_bytes() -> int:
    """HCCL_BUFFSIZE (MB) in bytes."""
    return int(_number(HCCL_BUFFSIZE, DEFAULT_BUFFSIZE_MB, allow_zero=False) * 1024 * 1024)


def launcher_job_id(environ: Mapping[str, str] = os.environ) -> tuple[str, str] | None:
    """(job id, where it came from) when a launcher names this job: ``HCCL_PY_JOB_ID``
    (hccl-launch, ``launch.spawn``, or the user), torchrun's ``TORCHELASTIC_RUN_ID`` (unless
    its default ``none``), Slurm's ``SLURM_JOB_ID`` + ``SLURM_STEP_ID`` inside an srun step;
    else ``None`` (the ranks take the id of the store they meet at)::

        launcher_job_id({"SLURM_JOB_ID": "812", "SLURM_STEP_ID": "0"})   # ("slurm-812.0", "SLURM_JOB_ID/SLURM_STEP_ID")
    """
    own = (environ.get(JOB_ID) or "").strip()
    if own:
        return own, JOB_ID
    run = (environ.get(TORCHELASTIC_RUN_ID) or "").strip()
    if run and run != "none":
        return f"torchrun-{run}", TORCHELASTIC_RUN_ID
    job, step = (environ.get(SLURM_JOB_ID) or "").strip(), (environ.get(SLURM_STEP_ID) or "").strip()
    if job and step:
        return f"slurm-{job}.{step}", f"{SLURM_JOB_ID}/{SLURM_STEP_ID}"
    return None


def job_secret(environ: Mapping[str, str] = os.environ) -> str | None:
    """``HCCL_PY_JOB_SECRET`` if set (hccl-launch and ``launch.spawn`` set one per job), else None."""
    secret = environ.get(JOB_SECRET)
    return secret if secret else None
