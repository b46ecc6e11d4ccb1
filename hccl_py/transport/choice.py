"""Which transport a job uses, and who started it: the one place that decides.

Ranks started by hccl-launch (or torchrun, ``launch.spawn``) meet through the rendezvous store
and then use shared memory between ranks of one host and TCP between hosts. Ranks started by
``mpiexec`` or ``srun`` meet through MPI and move bytes with MPI. ``HCCL_PY_TRANSPORT=shm|tcp|mpi``
overrides the choice; a request the job cannot serve raises :class:`HcclNotSupportedError`
saying why, never a silent fallback::

    plan_store_transport(0, ["a", "a", "b", "b"], None).kind        # 'shm+tcp'
    plan_store_transport(0, ["a", "a"], "tcp").kind                 # 'tcp'
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .. import env
from ..errors import HcclNotSupportedError, HcclParamError

TRANSPORTS = ("shm", "tcp", "mpi")


def requested_transport(environ: Mapping[str, str] = os.environ) -> str | None:
    """``HCCL_PY_TRANSPORT`` (``shm``, ``tcp`` or ``mpi``), or ``None`` for the automatic choice."""
    raw = (environ.get(env.HCCL_PY_TRANSPORT) or "").strip().lower()
    if raw in ("", "auto"):
        return None
    if raw not in TRANSPORTS:
        raise HcclParamError(
            f"{env.HCCL_PY_TRANSPORT}={environ[env.HCCL_PY_TRANSPORT]!r} is not one of "
            f"{', '.join(TRANSPORTS)} (or auto); unset it for the automatic choice",
            variable=env.HCCL_PY_TRANSPORT,
            value=environ[env.HCCL_PY_TRANSPORT],
            rule="choices",
            choices=[*TRANSPORTS, "auto"],
        )
    return raw


@dataclass(frozen=True)
class MpiLaunch:
    """This process was started by an MPI launcher or Slurm: what its environment says."""

    starter: str  # "mpiexec (MPICH/Hydra)", "mpiexec (Open MPI)", "srun (Slurm)"
    rank: int
    size: int
    local_rank: int | None
    rank_var: str
    size_var: str


def mpi_launch(environ: Mapping[str, str] = os.environ) -> MpiLaunch | None:
    """The MPI launcher (MPICH/Hydra ``PMI_RANK``, Open MPI ``OMPI_COMM_WORLD_RANK``, Slurm
    ``SLURM_PROCID`` inside an ``srun`` step) that started this process, or ``None``."""
    for starter, rank_var, size_var, local_var in env.MPI_LAUNCH_VARS:
        if rank_var not in environ or size_var not in environ:
            continue
        if rank_var == env.SLURM_PROCID and not (environ.get(env.SLURM_STEP_ID) or environ.get(env.SLURM_STEPID)):
            continue  # a batch script (not an srun step) also has SLURM_PROCID=0
        try:
            rank, size = int(environ[rank_var]), int(environ[size_var])
            local = int(environ[local_var]) if environ.get(local_var) else None
        except ValueError:
            bad = next(v for v in (rank_var, size_var, local_var) if environ.get(v) and not _is_int(environ[v]))
            raise HcclParamError(
                f"{starter}: {rank_var}={environ[rank_var]!r} / {size_var}={environ[size_var]!r} are not integers",
                variable=bad,
                value=environ[bad],
                rule="type",
                expected="int",
            ) from None
        return MpiLaunch(starter, rank, size, local, rank_var, size_var)
    return None


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def use_mpi(requested: str | None, launched: MpiLaunch | None, launcher_env: bool, store_given: bool = False) -> bool:
    """Whether ranks meet and talk through MPI: when started by mpiexec/srun, unless the
    environment names another way to meet. ``launcher_env``: RANK_ID/RANK are set (hccl-launch,
    torchrun, or a wrapper under mpiexec, e.g. hccl-bench); ``store_given``: MASTER_PORT is set
    (the ranks meet through hccl-py's store; e.g. srun without an MPI plugin). Either way only
    an explicit ``mpi`` request still uses MPI.
    """
    if requested == "mpi":
        if launched is None:
            raise HcclNotSupportedError(
                f"{env.HCCL_PY_TRANSPORT}=mpi needs ranks started by mpiexec or srun (no PMI_RANK, "
                "OMPI_COMM_WORLD_RANK or SLURM_PROCID in the environment); run `mpiexec -n N python prog.py`, "
                f"or unset {env.HCCL_PY_TRANSPORT} under hccl-launch",
                variable=env.HCCL_PY_TRANSPORT,
                value=requested,
            )
        return True
    return requested is None and launched is not None and not launcher_env and not store_given


def host_identity(environ: Mapping[str, str] = os.environ) -> str:
    """Ranks with equal identities can share memory: same hostname, kernel boot, network namespace
    and pid namespace (peer pids). ``HCCL_PY_HOST_ID`` overrides it,
    e.g. to make two launchers on one machine behave as two hosts."""
    forced = environ.get(env.HCCL_PY_HOST_ID)
    if forced:
        return forced
    parts = [socket.gethostname()]
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read().strip())
    except OSError:
        pass
    for ns in ("net", "pid"):
        try:
            parts.append(f"{ns}:{os.stat(f'/proc/self/ns/{ns}').st_ino}")
        except OSError:
            pass
    return hashlib.blake2b("|".join(parts).encode(), digest_size=8).hexdigest()


def host_label(environ: Mapping[str, str] = os.environ) -> str:
    """How a host is named in messages: ``HCCL_PY_HOST_ID`` if set, else the hostname."""
    return environ.get(env.HCCL_PY_HOST_ID) or socket.gethostname()


@dataclass(frozen=True)
class StorePlan:
    """How one rank of a store-rendezvous job reaches its peers."""

    kind: str  # "shm", "tcp" or "shm+tcp"
    local: tuple[int, ...]  # world ranks sharing memory with this rank (itself included), ascending
    remote: tuple[int, ...]  # world ranks reached over TCP
    num_hosts: int


def plan_store_transport(rank: int, host_ids: Sequence[str], requested: str | None) -> StorePlan:
    """Shared memory between ranks of one host, TCP across hosts; ``requested`` forces one."""
    mine = host_ids[rank]
    same = tuple(r for r, h in enumerate(host_ids) if h == mine)
    other = tuple(r for r, h in enumerate(host_ids) if h != mine)
    hosts = len(set(host_ids))
    if requested == "tcp":
        return StorePlan("tcp", (rank,), tuple(r for r in range(len(host_ids)) if r != rank), hosts)
    if requested == "shm" and other:
        raise HcclNotSupportedError(
            f"{env.HCCL_PY_TRANSPORT}=shm: rank(s) {_ranges(other)} run on another host than rank {rank}, and shared "
            f"memory reaches only ranks of one host; unset {env.HCCL_PY_TRANSPORT} (shared memory within a host, "
            "TCP across hosts) or set it to tcp",
            variable=env.HCCL_PY_TRANSPORT,
            value=requested,
            rank=rank,
            ranks=list(other),
        )
    if not other:
        return StorePlan("shm", same, (), hosts)
    if len(same) == 1:
        return StorePlan("tcp", same, other, hosts)
    return StorePlan("shm+tcp", same, other, hosts)


def describe_hosts(host_labels: Sequence[str], host_ids: Sequence[str]) -> str:
    """``"2 hosts: node0 ranks 0-1, node1 ranks 2-3"``; ``"1 host"`` when there is one."""
    by_host: dict[str, list[int]] = {}
    label: dict[str, str] = {}
    for r, (lab, hid) in enumerate(zip(host_labels, host_ids)):
        by_host.setdefault(hid, []).append(r)
        label.setdefault(hid, lab)
    if len(by_host) == 1:
        return "1 host"
    shown = [
        f"{label[h]} rank{'s' if len(ranks) > 1 else ''} {_ranges(ranks)}" for h, ranks in list(by_host.items())[:8]
    ]
    more = f", +{len(by_host) - 8} more" if len(by_host) > 8 else ""
    return f"{len(by_host)} hosts: {', '.join(shown)}{more}"


def _ranges(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    out: list[str] = []
    start = prev = None
    for r in sorted(ranks):
        if prev is not None and r == prev + 1:
            prev = r
            continue
        if start is not None:
            out.append(f"{start}-{prev}" if prev != start else f"{start}")
        start = prev = r
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ",".join(out)
