"""Environment variable names and their parsing: the one place both the runtime and
hccl-launch read them from (the job's whole configuration, assembled from them: ``job.py``).

HCCL and MindSpore name ranks ``RANK_ID``/``RANK_SIZE``/``DEVICE_ID``; torchrun names them
``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE``. hccl-launch sets both.

Where ranks meet: hccl-py's own store is at ``HCCL_PY_STORE_ADDR``/``HCCL_PY_STORE_PORT``
(hccl-launch and ``launch.spawn`` set them and host it), else at ``MASTER_ADDR``/``MASTER_PORT``
(started by hand or by a plain launcher: rank 0 hosts it). ``MASTER_ADDR``/``MASTER_PORT`` belong
to torch when hccl-launch starts the job (a free port for torch's ``env://`` rendezvous); under
torchrun (``TORCHELASTIC_USE_AGENT_STORE=True``) they name torchrun's agent store, which
hccl-py then meets through with torch's own client (``hccl_py/rendezvous/torch.py``).
"""

from __future__ import annotations

import math
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
STORE_ADDR = "HCCL_PY_STORE_ADDR"  # hccl-py's store (set by hccl-launch, spawn); unset: MASTER_ADDR
STORE_PORT = "HCCL_PY_STORE_PORT"  # unset: MASTER_PORT (then rank 0 hosts the store there)

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
HCCL_PY_NPU_DEVICES = "HCCL_PY_NPU_DEVICES"  # simulated NPUs this host shows torch (hccl-npu --devices N)
HCCL_PY_NPU_STRICT = "HCCL_PY_NPU_STRICT"  # "1": the hccl backend refuses what Ascend refuses (set by hccl-npu)
HCCL_PY_CACHE = "HCCL_PY_CACHE"  # where the npu device's compiled extension is kept (default ~/.cache/hccl-py)
PYTORCH_NPU_ALLOC_CONF = "PYTORCH_NPU_ALLOC_CONF"  # torch_npu's allocator settings (key:value,...)

# Started by an MPI launcher or Slurm: (rank, size, local rank) variables, first match wins
PMI_RANK, PMI_SIZE, MPI_LOCALRANKID = "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"  # MPICH/Hydra
OMPI_COMM_WORLD_RANK = "OMPI_COMM_WORLD_RANK"
OMPI_COMM_WORLD_SIZE = "OMPI_COMM_WORLD_SIZE"
OMPI_COMM_WORLD_LOCAL_RANK = "OMPI_COMM_WORLD_LOCAL_RANK"
SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID = "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"
MPI_LAUNCH_VARS = (
    ("mpiexec (MPICH/Hydra)", PMI_RANK, PMI_SIZE, MPI_LOCALRANKID),
    ("mpiexec (Open MPI)", OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK),
    ("srun (Slurm)", SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID),
)

# Other launchers' job identities (see launcher_job_id)
TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"  # torchrun's --rdzv-id ("none" when not given)
# torchrun: "True" in every worker; MASTER_ADDR:MASTER_PORT is then its agent's c10d TCPStore
TORCHELASTIC_USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
SLURM_JOB_ID = "SLURM_JOB_ID"
SLURM_STEP_ID = "SLURM_STEP_ID"
SLURM_STEPID = "SLURM_STEPID"  # older Slurm's spelling of SLURM_STEP_ID
XDG_RUNTIME_DIR = "XDG_RUNTIME_DIR"

# HCCL's, with HCCL's defaults
HCCL_CONNECT_TIMEOUT = "HCCL_CONNECT_TIMEOUT"  # seconds, default 120
HCCL_EXEC_TIMEOUT = "HCCL_EXEC_TIMEOUT"  # seconds, default 1836; 0 = no limit
HCCL_BUFFSIZE = "HCCL_BUFFSIZE"  # MB of staging per rank
HCCL_ALGO = "HCCL_ALGO"
HCCL_DETERMINISTIC = "HCCL_DETERMINISTIC"  # false (default), true or strict: which executors HCCL selects
DETERMINISTIC_VALUES = ("false", "true", "strict")  # platform/common/externalinput.cc L578-603
HCCL_IF_IP = "HCCL_IF_IP"  # the address this rank's TCP transport listens on (HCCL: NIC for host traffic)

DEFAULT_CONNECT_TIMEOUT_S = 120.0
DEFAULT_EXEC_TIMEOUT_S = 1836.0
# HCCL_EXEC_TIMEOUT's upper bound on Atlas A2 (a signed 32-bit count of seconds).
MAX_TIMEOUT_S = 2147483647.0
# HCCL's default is 200 MB per communicator on device memory. Here every card shares one
# host's memory, so the default is smaller; large payloads stream through it in slices.
DEFAULT_BUFFSIZE_MB = 32
MAX_WORLD_SIZE = 65535  # ranks of one job (the wire header's rank field is 16 bits)
MIN_BUFFSIZE_MB = 1  # as HCCL: HCCL_BUFFSIZE >= 1 (MB)
MAX_BUFFSIZE_MB = 64 * 1024  # a staging area beyond host memory sizes is a typo
HCCL_PY_SPIN_US = "HCCL_PY_SPIN_US"  # microseconds a waiting rank spins before it sleeps
DEFAULT_SPIN_US = 50.0

# Variables a user (or hccl-launch's caller) sets and hccl-launch passes through to every rank:
# checked by hccl-launch before any rank starts (``check_user_settings``).
USER_SETTINGS = (
    HCCL_CONNECT_TIMEOUT,
    HCCL_EXEC_TIMEOUT,
    HCCL_BUFFSIZE,
    HCCL_ALGO,
    HCCL_DETERMINISTIC,
    HCCL_PY_SPIN_US,
    HCCL_PY_MODELED_TIME,
    HCCL_PY_CMA,
    HCCL_PY_TRANSPORT,
)


def given(environ: Mapping[str, str], name: str) -> str | None:
    """Variable ``name``'s value without surrounding blanks; None when it is unset or blank."""
    value = environ.get(name)
    return None if value is None or value.strip() == "" else value.strip()


def _refuse_blank(name: str, give: str, default: str, environ: Mapping[str, str] | None, **fields: object) -> None:
    """A setting that is set but empty (``HCCL_EXEC_TIMEOUT=``) is an error, not the default: it is
    most often a variable meant to hold a value that did not (``HCCL_EXEC_TIMEOUT=$T``)."""
    raw = (os.environ if environ is None else environ).get(name)
    if raw is not None:
        raise HcclParamError(
            f"{name} is set but empty: give {give}, or unset it for the default ({default})",
            variable=name,
            value=raw,
            **fields,
        )


def number(
    name: str,
    default: float,
    *,
    low: float,
    high: float,
    low_open: bool = False,
    unit: str = "",
    environ: Mapping[str, str] | None = None,
) -> float:
    """``name`` as a finite number in ``[low, high]`` (``(low, high]`` with ``low_open``), or
    ``default`` when unset; HcclParamError naming the variable and the accepted range otherwise
    (``nan``, ``inf``, words and an empty value included)."""
    raw = given(os.environ if environ is None else environ, name)
    accepted = f"{'(' if low_open else '['}{low:.10g}, {high:.10g}]{(' ' + unit) if unit else ''}"
    if raw is None:
        _refuse_blank(name, f"a number in {accepted}", f"{default:.10g}", environ, rule="range", expected=accepted)
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < low or (low_open and value == low) or value > high:
        raise HcclParamError(
            f"{name}={raw!r} is not accepted: give a number in {accepted}, or unset it for the default "
            f"({default:.10g})",
            variable=name,
            value=raw,
            rule="range",
            expected=accepted,
        )
    return value


def integer(name: str, *, low: int, high: int, environ: Mapping[str, str] | None = None) -> int | None:
    """``name`` as an integer in ``[low, high]``, ``None`` when unset; HcclParamError naming the
    variable and the accepted range otherwise."""
    raw = given(os.environ if environ is None else environ, name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise HcclParamError(
            f"{name}={raw!r} is not accepted: give an integer in [{low}, {high}]",
            variable=name,
            value=raw,
            rule="range",
            expected=f"[{low}, {high}]",
        )
    return value


def flag(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    """``name`` as "0" (off) or "1" (on), ``default`` when unset; HcclParamError for anything
    else (an empty value included)."""
    raw = given(os.environ if environ is None else environ, name)
    if raw is None:
        _refuse_blank(name, "0 (off) or 1 (on)", str(int(default)), environ, rule="choices", choices=["0", "1"])
        return default
    if raw not in ("0", "1"):
        raise HcclParamError(
            f"{name}={raw!r} is not accepted: give 0 (off) or 1 (on), or unset it (default {int(default)})",
            variable=name,
            value=raw,
            rule="choices",
            choices=["0", "1"],
        )
    return raw == "1"


def connect_timeout_s(environ: Mapping[str, str] | None = None) -> float:
    """HCCL_CONNECT_TIMEOUT in seconds, in (0, MAX_TIMEOUT_S]."""
    return number(
        HCCL_CONNECT_TIMEOUT,
        DEFAULT_CONNECT_TIMEOUT_S,
        low=0,
        high=MAX_TIMEOUT_S,
        low_open=True,
        unit="s",
        environ=environ,
    )


def exec_timeout_s(environ: Mapping[str, str] | None = None) -> float | None:
    """HCCL_EXEC_TIMEOUT in seconds; ``None`` for 0 (no limit)."""
    value = number(
        HCCL_EXEC_TIMEOUT, DEFAULT_EXEC_TIMEOUT_S, low=0, high=MAX_TIMEOUT_S, unit="s (0: no limit)", environ=environ
    )
    return None if value == 0 else value


def buffsize_bytes(environ: Mapping[str, str] | None = None) -> int:
    """HCCL_BUFFSIZE (MB) in bytes."""
    mb = number(
        HCCL_BUFFSIZE, DEFAULT_BUFFSIZE_MB, low=MIN_BUFFSIZE_MB, high=MAX_BUFFSIZE_MB, unit="MB", environ=environ
    )
    return int(mb * 1024 * 1024)


def spin_s(environ: Mapping[str, str] | None = None) -> float:
    """HCCL_PY_SPIN_US in seconds."""
    return number(HCCL_PY_SPIN_US, DEFAULT_SPIN_US, low=0, high=1e6, unit="us", environ=environ) * 1e-6


def modeled_time(environ: Mapping[str, str] | None = None) -> bool:
    """HCCL_PY_MODELED_TIME: False keeps every clock at 0 (measures the bookkeeping's cost)."""
    return flag(HCCL_PY_MODELED_TIME, True, environ)


def deterministic(environ: Mapping[str, str] | None = None) -> str:
    """HCCL_DETERMINISTIC as HCCL reads it: ``false`` (unset), ``true`` or ``strict``, any case::

    deterministic({"HCCL_DETERMINISTIC": "TRUE"})   # "true"
    """
    raw = given(os.environ if environ is None else environ, HCCL_DETERMINISTIC)
    if raw is None:
        return "false"
    if raw.lower() not in DETERMINISTIC_VALUES:
        raise HcclParamError(
            f"{HCCL_DETERMINISTIC}={raw!r} is not accepted: give false, true or strict, as HCCL takes, "
            "or unset it (default false)",
            variable=HCCL_DETERMINISTIC,
            value=raw,
            rule="choices",
            choices=list(DETERMINISTIC_VALUES),
        )
    return raw.lower()


def single_copy(environ: Mapping[str, str] | None = None) -> bool:
    """HCCL_PY_CMA: False sends every payload through the shared slots (no direct reads)."""
    return flag(HCCL_PY_CMA, True, environ)


def wall_origin(environ: Mapping[str, str] | None = None) -> float | None:
    """HCCL_PY_WALL_ORIGIN (a ``time.monotonic()`` reading of the launcher), ``None`` when unset."""
    value = (
        number(HCCL_PY_WALL_ORIGIN, math.nan, low=0, high=math.inf, environ=environ)
        if given(os.environ if environ is None else environ, HCCL_PY_WALL_ORIGIN) is not None
        else None
    )
    return value


def master_port(environ: Mapping[str, str] | None = None) -> int | None:
    """MASTER_PORT, ``None`` when unset."""
    return integer(MASTER_PORT, low=1, high=65535, environ=environ)


def store_address(environ: Mapping[str, str] | None = None) -> tuple[str, int | None, bool]:
    """(host, port, torchrun's) of the store this rank meets its peers at: hccl-py's own at
    HCCL_PY_STORE_ADDR/PORT (hccl-launch, spawn), else MASTER_ADDR/MASTER_PORT; the last item
    says that store is torchrun's agent TCPStore (TORCHELASTIC_USE_AGENT_STORE=True, no
    HCCL_PY_STORE_PORT), met with torch's client. Port ``None``: none named::

        store_address({"HCCL_PY_STORE_PORT": "41000", "MASTER_PORT": "29500"})   # ("127.0.0.1", 41000, False)
    """
    environ = os.environ if environ is None else environ
    port = integer(STORE_PORT, low=1, high=65535, environ=environ)
    if port is not None:
        return given(environ, STORE_ADDR) or given(environ, MASTER_ADDR) or "127.0.0.1", port, False
    torchrun = environ.get(TORCHELASTIC_USE_AGENT_STORE) == "True"
    return given(environ, MASTER_ADDR) or "127.0.0.1", master_port(environ), torchrun


def rank_and_size(environ: Mapping[str, str] | None = None) -> tuple[int | None, int | None]:
    """(rank, world size) from RANK_ID/RANK and RANK_SIZE/WORLD_SIZE (HCCL's names first);
    ``None`` for what is unset."""
    environ = os.environ if environ is None else environ
    rank = size = None
    for name in (RANK_ID, RANK):
        if given(environ, name) is not None:
            rank = integer(name, low=0, high=MAX_WORLD_SIZE - 1, environ=environ)
            break
    for name in (RANK_SIZE, WORLD_SIZE):
        if given(environ, name) is not None:
            size = integer(name, low=1, high=MAX_WORLD_SIZE, environ=environ)
            break
    return rank, size


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


ALLOC_CONF_KEYS = ("max_split_size_mb", "garbage_collection_threshold", "expandable_segments")
_MAX_SPLIT_MB_LIMIT = 2**43  # MiB: 2**63 bytes, what the device's pool counts in


def alloc_conf(environ: Mapping[str, str] | None = None) -> dict[str, float | bool]:
    """``PYTORCH_NPU_ALLOC_CONF`` ("key:value,key:value"), checked: the keys hccl-py's npu device
    honours; an unknown key or a bad value is refused by name (torch_npu refuses unknown keys
    too), never a raw OverflowError at ``import torch``. ``max_split_size_mb``: a finite number
    of MiB above 20; ``garbage_collection_threshold``: between 0 and 1; ``expandable_segments``:
    True or False::

        alloc_conf({"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"})   # {'expandable_segments': True}
    """
    text = (os.environ if environ is None else environ).get(PYTORCH_NPU_ALLOC_CONF)
    conf: dict[str, float | bool] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, _, value = item.partition(":")
        key, value = key.strip(), value.strip()
        if key not in ALLOC_CONF_KEYS:
            raise HcclParamError(
                f"{PYTORCH_NPU_ALLOC_CONF}: unrecognized key {key!r}; hccl-py's npu device "
                f"honours {', '.join(ALLOC_CONF_KEYS)}",
                arg=PYTORCH_NPU_ALLOC_CONF,
                value=key,
                rule="choices",
                choices=list(ALLOC_CONF_KEYS),
            )
        try:
            if key == "expandable_segments":
                if value not in ("True", "False"):
                    raise ValueError(value)
                conf[key] = value == "True"
            elif key == "max_split_size_mb":
                conf[key] = float(value)
                # torch_npu's floor: a split size below the large segment is meaningless
                if not (math.isfinite(conf[key]) and 20 < conf[key] < _MAX_SPLIT_MB_LIMIT):
                    raise ValueError(value)
            else:
                conf[key] = float(value)
                if not 0.0 < conf[key] < 1.0:
                    raise ValueError(value)
        except ValueError:
            raise HcclParamError(
                f"{PYTORCH_NPU_ALLOC_CONF}: bad value {value!r} for {key} (expandable_segments: "
                "True or False; max_split_size_mb: a finite number of MB above 20; garbage_collection_threshold: "
                "between 0 and 1)",
                arg=key,
                value=value,
                rule="value",
            ) from None
    return conf
