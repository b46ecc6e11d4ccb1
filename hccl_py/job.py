"""The job's configuration: everything a rank takes from its environment, assembled once when it
joins from the variables ``env.py`` names and parses, and the grammars that live with what they
configure (``env.HCCL_ALGO`` in ``algo_select``, faults in ``faults``, the transport in
``transport.choice``)::

    job = read_job()
    job.rank, job.size, job.exec_timeout_s, job.algo
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from . import env
from .choice.names import parse_hccl_algo
from .errors import HcclParamError
from .faults import check_ranks, parse_faults
from .transport.choice import mpi_launch, requested_transport


def check_user_settings(environ: Mapping[str, str] | None = None) -> None:
    """Parse every variable of ``env.USER_SETTINGS``: what hccl-launch checks before it starts a
    rank, so a typo fails once, up front, instead of in every rank."""
    env.connect_timeout_s(environ)
    env.exec_timeout_s(environ)
    env.buffsize_bytes(environ)
    env.spin_s(environ)
    env.modeled_time(environ)
    env.single_copy(environ)
    env.deterministic(environ)
    environ = os.environ if environ is None else environ
    parse_hccl_algo(environ.get(env.HCCL_ALGO))  # the grammars live with what they configure
    requested_transport(environ)


@dataclass(frozen=True)
class JobConfig:
    """Everything a rank takes from its environment, read once by :func:`read_job` when it
    joins (as torchrun's ``config_from_args``): who it is, where the job meets, and the HCCL
    settings. Nothing else in the runtime reads the environment afterwards::

        job = read_job()
        job.rank, job.size, job.exec_timeout_s, job.algo
    """

    rank: int
    size: int
    mpi: object | None  # transport.choice.MpiLaunch when mpiexec or srun started this process
    launcher_env: bool  # RANK_ID/RANK or RANK_SIZE/WORLD_SIZE set: hccl-launch, spawn, torchrun or a wrapper chose
    store_addr: str  # hccl-py's store: HCCL_PY_STORE_ADDR, else MASTER_ADDR (see store_address)
    store_port: int | None  # HCCL_PY_STORE_PORT, else MASTER_PORT; None: not named
    torch_store: bool  # store_addr:store_port is torchrun's agent TCPStore: meet through it with torch's client
    store_hosted: bool  # the launcher hosts the store (HCCL_PY_STORE_HOSTED=1); else rank 0 does
    local_world_size: int | None  # ranks on this host, when the launcher says
    launcher_id: tuple[str, str] | None  # (job id, the variable it came from), see launcher_job_id
    secret: str | None  # HCCL_PY_JOB_SECRET; None: this user's secret file
    transport: str | None  # HCCL_PY_TRANSPORT: shm, tcp, mpi, or None for the automatic choice
    if_ip: str | None  # HCCL_IF_IP
    connect_timeout_s: float
    exec_timeout_s: float | None
    buffsize_bytes: int
    spin_s: float
    single_copy: bool
    modeled_time: bool
    algo: dict  # HCCL_ALGO parsed: {collective: algorithm}, '*' for every operator
    deterministic: str  # HCCL_DETERMINISTIC: "false", "true" or "strict"
    faults: tuple  # HCCL_PY_FAULTS parsed (faults.Fault)
    wall_origin: float | None
    topology: str | None  # HCCL_PY_TOPOLOGY (a preset)
    rank_table: str | None  # RANK_TABLE_FILE
    figures: str | None  # HCCL_PY_FIGURES
    trace_dir: str | None  # HCCL_PY_TRACE_DIR
    flight_dir: str | None  # HCCL_PY_FLIGHT_DIR


def read_job(environ: Mapping[str, str] | None = None) -> JobConfig:
    """This rank's :class:`JobConfig` from ``environ`` (default ``os.environ``): every value
    parsed and checked (HcclParamError naming the variable and its accepted range)."""
    environ = os.environ if environ is None else environ
    check_user_settings(environ)
    rank, size = env.rank_and_size(environ)
    launcher_env = rank is not None or size is not None
    mpi = mpi_launch(environ)
    if not launcher_env and mpi is not None:  # mpiexec / srun: rank and size from its environment
        rank, size = mpi.rank, mpi.size
    if size is None or size == 1:
        if rank not in (None, 0):
            raise HcclParamError(
                f"{env.RANK_ID}/{env.RANK}={rank} given for a world of size 1 (set {env.RANK_SIZE}/{env.WORLD_SIZE})",
                variable=env.RANK_ID if env.given(environ, env.RANK_ID) is not None else env.RANK,
                value=rank,
                rule="range",
                expected="0..0",
            )
        rank, size = 0, 1
    if rank is None or not 0 <= rank < size:
        raise HcclParamError(
            f"{env.RANK_ID}/{env.RANK}={rank} is not in 0..{size - 1} ({env.RANK_SIZE}/{env.WORLD_SIZE}={size})",
            variable=env.RANK_ID if env.given(environ, env.RANK_ID) is not None else env.RANK,
            value=rank,
            rule="range",
            expected=f"0..{size - 1}",
        )
    faults = tuple(parse_faults(environ.get(env.HCCL_PY_FAULTS)))
    check_ranks(list(faults), size)
    store_addr, store_port, torch_store = env.store_address(environ)
    return JobConfig(
        rank=rank,
        size=size,
        mpi=mpi,
        launcher_env=launcher_env,
        store_addr=store_addr,
        store_port=store_port,
        torch_store=torch_store,
        store_hosted=environ.get(env.STORE_HOSTED) == "1",
        local_world_size=env.integer(env.LOCAL_WORLD_SIZE, low=1, high=env.MAX_WORLD_SIZE, environ=environ),
        launcher_id=env.launcher_job_id(environ),
        secret=env.job_secret(environ),
        transport=requested_transport(environ),
        if_ip=env.given(environ, env.HCCL_IF_IP),
        connect_timeout_s=env.connect_timeout_s(environ),
        exec_timeout_s=env.exec_timeout_s(environ),
        buffsize_bytes=env.buffsize_bytes(environ),
        spin_s=env.spin_s(environ),
        single_copy=env.single_copy(environ),
        modeled_time=env.modeled_time(environ),
        algo=parse_hccl_algo(environ.get(env.HCCL_ALGO)),
        deterministic=env.deterministic(environ),
        faults=faults,
        wall_origin=env.wall_origin(environ),
        topology=env.given(environ, env.HCCL_PY_TOPOLOGY),
        rank_table=env.given(environ, env.RANK_TABLE_FILE),
        figures=env.given(environ, env.HCCL_PY_FIGURES),
        trace_dir=env.given(environ, env.HCCL_PY_TRACE_DIR),
        flight_dir=env.given(environ, env.HCCL_PY_FLIGHT_DIR),
    )
