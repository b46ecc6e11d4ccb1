"""``hccl_py.init``: the world communicator of this process, from the launcher's environment.

Under hccl-launch (or ``launch.spawn``) the rank, world size and store address come from the
environment and the launcher hosts the rendezvous store. Started another way with ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set (torchrun style), rank 0 hosts the store.
Started by ``mpiexec`` or ``srun``, rank and size come from MPI and the ranks meet and talk
through it (``transport/mpi.py``). Run plainly, the world is this one process. Which transport
a job uses is decided in ``transport/choice.py`` and printed once by rank 0.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import signal
import socket
import sys
import threading
import time

from topology import Topology, TopologyError, default_preset, load_figures

from . import env
from .algo_select import parse_hccl_algo
from .communicator import Communicator
from .context import RankContext
from .device import Device
from .errors import HcclInternalError, HcclNotSupportedError, HcclParamError, HcclTimeoutError
from .faults import check_ranks, parse_faults
from .executor import Engine
from .records import write_chrome_trace
from .transport.choice import (MpiLaunch, StorePlan, describe_hosts, host_identity, host_label, mpi_launch,
                               plan_store_transport, requested_transport, use_mpi)
from .transport.base import Transport
from .transport.shm import ShmTransport

WORLD_COMM_ID = 1

_world: Communicator | None = None


def init() -> Communicator:
    """Join the job and return the world communicator (``HcclCommInitClusterInfo``).

    Blocks until every rank has joined, at most ``HCCL_CONNECT_TIMEOUT`` seconds; then raises
    :class:`HcclTimeoutError` naming the ranks that never came. Calling it again returns the
    same communicator until that one is destroyed::

        import numpy as np, hccl_py as hccl
        comm = hccl.init()
        x = np.full(1000, comm.rank, np.float32)
        comm.all_reduce(x)
    """
    global _world
    if _world is not None and _world._engine.forked:
        raise HcclInternalError(
            f"init: this process ({os.getpid()}) is a child forked from rank {_world.rank}'s process "
            f"({_world._engine.owner_pid}), which is already in the job as that rank; a forked child cannot join the job "
            "nor use the parent's communicators. Start ranks with hccl-launch or launch.spawn, and give workers of a "
            "rank multiprocessing's 'spawn' start method")
    if _world is not None and _world._closed_reason is None:
        return _world
    env.check_user_settings()  # every setting, also those a world of one never uses: a typo fails at once
    rank, size = env.rank_and_size()
    requested = requested_transport()
    launched = mpi_launch()
    launcher_env = rank is not None or size is not None  # hccl-launch, spawn, torchrun, or a wrapper's choice
    if not launcher_env and launched is not None:  # mpiexec / srun: rank and size from its environment
        rank, size = launched.rank, launched.size
    connect_timeout_s = env.connect_timeout_s()
    exec_timeout_s = env.exec_timeout_s()
    algo_env = parse_hccl_algo(os.environ.get(env.HCCL_ALGO))
    if size is None or size == 1:
        if rank not in (None, 0):
            raise HcclParamError(f"rank {rank} given for a world of size 1 (set RANK_SIZE/WORLD_SIZE)")
        rank, size = 0, 1
    if rank is None or not 0 <= rank < size:
        raise HcclParamError(f"RANK_ID/RANK={rank} is not in 0..{size - 1} (RANK_SIZE/WORLD_SIZE={size})")
    topology = load_topology(size)
    faults = parse_faults(os.environ.get(env.HCCL_PY_FAULTS))
    check_ranks(faults, size)
    wall_origin = env.wall_origin()
    if wall_origin is None:
        wall_origin = time.monotonic()
    modeled = env.modeled_time()

    def context(engine: Engine) -> RankContext:
        rc = RankContext(engine, Device(topology.card(rank), rank), topology, exec_timeout_s, algo_env, wall_origin,
                         modeled=modeled, faults=faults,
                         flight_dir=os.environ.get(env.HCCL_PY_FLIGHT_DIR) or None)
        _install_dump_hooks(rc)
        return rc

    if size == 1:
        rc = context(Engine(None))
        _world = Communicator(rc, [0], 0, WORLD_COMM_ID, "world", on_destroy=_finisher(rc, None, None))
    elif _mpi_serves(requested, launched, launcher_env):
        _world = _connect_mpi(rank, size, launched, connect_timeout_s, context)
    else:
        _world = _connect(rank, size, connect_timeout_s, context, requested, launched)
    return _world


def _have_mpi4py() -> bool:
    try:
        import mpi4py  # noqa: F401  (the package only: MPI is initialised by mpi4py.MPI)
    except ImportError:
        return False
    return True


def _mpi_serves(requested: str | None, launched: MpiLaunch | None, launcher_env: bool) -> bool:
    """Whether this job meets and moves bytes through MPI (see ``transport/choice.py``); started
    by mpiexec without mpi4py, HcclNotSupportedError says what is missing."""
    if not use_mpi(requested, launched, launcher_env, store_given=bool(os.environ.get(env.MASTER_PORT))):
        return False
    if requested is None and not _have_mpi4py():
        raise HcclNotSupportedError(
            f"init: started by {launched.starter} ({launched.rank_var}={launched.rank}), but mpi4py is not installed, so "
            "hccl-py cannot meet its peers through MPI; install it (`pip install 'hccl-py[mpi]'`), or set "
            f"MASTER_ADDR/MASTER_PORT so the ranks meet through hccl-py's store (rank 0 hosts it)")
    return True


def load_topology(size: int) -> Topology:
    """The modeled cluster: a rank table (RANK_TABLE_FILE), else a preset (HCCL_PY_TOPOLOGY),
    else the default preset for ``size`` cards; figures overridden by HCCL_PY_FIGURES."""
    try:
        figures = load_figures(os.environ[env.HCCL_PY_FIGURES]) if os.environ.get(env.HCCL_PY_FIGURES) else None
        table_path = os.environ.get(env.RANK_TABLE_FILE)
        preset = os.environ.get(env.HCCL_PY_TOPOLOGY) or None
        if table_path:
            from topology import RankTable

            topology = Topology.from_rank_table(RankTable.load(table_path), preset=preset, figures=figures)
        else:
            topology = Topology.preset(preset or default_preset(size), n=size, figures=figures)
    except TopologyError as err:
        raise HcclParamError(f"topology: {err}") from None
    if topology.num_ranks != size:
        raise HcclParamError(f"topology '{topology.name}' has {topology.num_ranks} cards but the job has {size} ranks; "
                             f"choose a preset or rank table with {size} cards")
    return topology


_hooked: list[RankContext] = []


def _install_dump_hooks(rc: RankContext) -> None:
    """Dump the flight recorder when this rank dies of an uncaught exception or is stopped with
    SIGTERM (how hccl-launch stops ranks), so the launcher can say what every rank was doing."""
    _hooked[:] = [rc]
    if not rc.flight_dir or getattr(_install_dump_hooks, "installed", False):
        return
    _install_dump_hooks.installed = True
    previous_hook = sys.excepthook

    def excepthook(kind, value, tb):
        if _hooked and not isinstance(value, KeyboardInterrupt):
            _hooked[0].dump(f"uncaught {kind.__name__}: {value}")
        previous_hook(kind, value, tb)

    sys.excepthook = excepthook
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        def on_sigterm(signum, frame):
            if _hooked:
                _hooked[0].dump("stopped by SIGTERM")
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_sigterm)


def dump_flight_recorder(reason: str = "on demand", path: str | None = None) -> str | None:
    """Write this rank's flight recorder (its latest collective calls, their state, modeled and
    wall times) as JSON: to ``path``, else into HCCL_PY_FLIGHT_DIR (set by hccl-launch).
    Returns the path written, or None when there is nowhere to write::

        hccl_py.dump_flight_recorder(path="flight.json")
    """
    if not _hooked:
        raise HcclInternalError("dump_flight_recorder: call hccl_py.init() first")
    rc = _hooked[0]
    if path is not None:
        return str(rc.recorder.dump(path, rank=rc.device.rank, reason=reason, wall_origin=rc.wall_origin, extra=rc.summary()))
    written = rc.dump(reason)
    return None if written is None else str(written)


def _finisher(rc: RankContext, transport: Transport | None, server) -> "callable":
    """What ends this rank's part in the job, once: the trace file, then sockets and memory."""
    done = []
    owner = os.getpid()

    def finish() -> None:
        if done or os.getpid() != owner:  # a forked child exits without touching the parent's job
            return
        done.append(True)
        trace_dir = os.environ.get(env.HCCL_PY_TRACE_DIR)
        if trace_dir:
            write_chrome_trace(os.path.join(trace_dir, f"rank_{rc.device.rank}.trace.json"), rc.device.rank,
                               rc.recorder.records, rc.wall_origin)
        if transport is not None:
            transport.close()
        if server is not None:
            server.close()

    atexit.register(finish)
    return finish


def _spin_settings(ranks_here: int) -> tuple[float, bool]:
    """(spin seconds, yield while spinning): spin ~50 us before blocking; yield the CPU each turn
    when this host runs more ranks than it has cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return env.spin_s(), ranks_here > cores


def _note_host_layout(rank: int, host_ids: list[str]) -> None:
    """LOCAL_RANK / LOCAL_WORLD_SIZE as torchrun means them, where the launcher did not set them
    (mpiexec, srun): code that sizes per-host resources reads them (e.g. BLAS threads per rank)."""
    here = [r for r, h in enumerate(host_ids) if h == host_ids[rank]]
    os.environ.setdefault(env.LOCAL_WORLD_SIZE, str(len(here)))
    os.environ.setdefault(env.LOCAL_RANK, str(here.index(rank)))


def _announce(rank: int, text: str) -> None:
    """The transport chosen, printed once per job (by rank 0) on stderr."""
    if rank == 0:
        print(f"hccl-py: transport {text}", file=sys.stderr, flush=True)


def _connect(rank: int, size: int, connect_timeout_s: float, context, requested: str | None = None,
             launched: MpiLaunch | None = None) -> Communicator:
    """Meet through the store; shared memory within a host, TCP across hosts."""
    from .store import StoreClient, StoreServer  # only multi-rank jobs need zmq

    deadline = time.monotonic() + connect_timeout_s
    addr = os.environ.get(env.MASTER_ADDR) or "127.0.0.1"
    port = env.master_port()
    server = None
    if port is None and launched is not None:  # under mpiexec without a store address: rank 0 hosts one
        addr, port, server = _store_via_mpi(rank, addr, deadline)
    if port is None:
        raise HcclParamError(f"{env.MASTER_PORT} is not set: run under hccl-launch, or set MASTER_ADDR/MASTER_PORT for the store")
    if server is None and rank == 0 and os.environ.get(env.STORE_HOSTED) != "1":
        server = StoreServer(host=addr, port=port)
        server.start()
    job_id = os.environ.get(env.JOB_ID) or hashlib.blake2b(f"{addr}:{port}".encode(), digest_size=6).hexdigest()
    one_host = os.environ.get(env.LOCAL_WORLD_SIZE) == str(size)  # hccl-launch on one node, launch.spawn
    if one_host and requested in (None, "shm"):
        connect = _connect_one_host
    else:
        connect = _connect_hosts
    client = StoreClient(f"tcp://{addr}:{port}")
    try:
        transport, description = connect(client, job_id, rank, size, deadline, connect_timeout_s, requested, f"{addr}:{port}")
    except BaseException:
        client.close()
        if server is not None:
            server.close()
        raise
    client.close()
    _announce(rank, description)
    rc = context(Engine(transport))
    return Communicator(rc, range(size), rank, WORLD_COMM_ID, "world", on_destroy=_finisher(rc, transport, server))


def _store_via_mpi(rank: int, addr: str, deadline: float):
    """Started by mpiexec but asked for shm/tcp without MASTER_PORT: rank 0 hosts the store on a
    free port and tells the others through MPI."""
    import numpy as np

    from .store import StoreServer
    from .transport.mpi import import_mpi, wait_request

    try:
        MPI = import_mpi()
    except HcclNotSupportedError:
        return addr, None, None
    server = StoreServer(host=addr, port=0).start() if rank == 0 else None
    port = np.array([server.port if server is not None else 0], np.int64)
    try:
        wait_request(MPI.COMM_WORLD.Ibcast([port, MPI.INT64_T], root=0), deadline,
                     f"init: rank {rank}: rank 0 did not share its store address within HCCL_CONNECT_TIMEOUT "
                     "(did every rank of the MPI job call hccl_py.init()?)")
    except BaseException:
        if server is not None:
            server.close()
        raise
    return addr, int(port[0]), server


def _join(client, keys: list[str], rank: int, size: int, deadline: float, connect_timeout_s: float, where: str) -> list[dict]:
    """Wait until every rank has set its key; their values. HcclTimeoutError names the absent."""
    try:
        client.wait(keys, max(deadline - time.monotonic(), 0.0))
    except HcclTimeoutError:
        present = client.check(keys)
        missing = [r for r, ok in enumerate(present) if not ok]
        raise HcclTimeoutError(
            f"init: rank {rank}: rank(s) {missing} of {size} did not join within {connect_timeout_s:g} s "
            f"(HCCL_CONNECT_TIMEOUT); check that they started and reach the store at {where}",
            rank=rank, ranks=missing,
        ) from None
    return [json.loads(client.get(k, max(deadline - time.monotonic(), 0.1))) for k in keys]


def _connect_one_host(client, job_id, rank, size, deadline, connect_timeout_s, requested, where):
    """Every rank on this host (the launcher says so): shared memory between all of them."""
    spin_s, yield_when_spinning = _spin_settings(size)
    transport = ShmTransport(job_id, rank, size, env.buffsize_bytes(), spin_s=spin_s, yield_when_spinning=yield_when_spinning,
                             single_copy=env.single_copy())
    try:
        client.set(f"{job_id}/rank/{rank}", json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode())
        infos = _join(client, [f"{job_id}/rank/{r}" for r in range(size)], rank, size, deadline, connect_timeout_s, where)
        transport.connect({r: info["pid"] for r, info in enumerate(infos) if r != rank}, deadline)
    except BaseException:
        transport.close()
        raise
    return transport, f"shm ({size} ranks, 1 host)"


def _connect_hosts(client, job_id, rank, size, deadline, connect_timeout_s, requested, where):
    """Ranks may sit on several hosts: learn who is where, then shared memory between ranks of
    one host and TCP between hosts (or what HCCL_PY_TRANSPORT asks for)."""
    from .transport.hosts import HostSplitTransport
    from .transport.tcp import TcpTransport, advertised_address

    me = {"pid": os.getpid(), "host": host_label(), "host_id": host_identity()}
    client.set(f"{job_id}/rank/{rank}", json.dumps(me).encode())
    infos = _join(client, [f"{job_id}/rank/{r}" for r in range(size)], rank, size, deadline, connect_timeout_s, where)
    host_ids = [info["host_id"] for info in infos]
    plan: StorePlan = plan_store_transport(rank, host_ids, requested)
    same_host = {r for r, h in enumerate(host_ids) if h == me["host_id"]}
    spin_s, yield_when_spinning = _spin_settings(len(same_host))
    shm = tcp = None
    try:
        if plan.kind != "tcp":
            # Socket names carry the host identity: two "hosts" forced onto one machine
            # (HCCL_PY_HOST_ID) must not meet each other's local ranks.
            host_tag = hashlib.blake2b(me["host_id"].encode(), digest_size=4).hexdigest()
            shm = ShmTransport(f"{job_id}.{host_tag}", plan.local.index(rank), len(plan.local), env.buffsize_bytes(),
                               spin_s=spin_s, yield_when_spinning=yield_when_spinning,
                               single_copy=env.single_copy())
        if plan.remote:
            addr, _, port = where.rpartition(":")
            tcp = TcpTransport(rank, size, list(plan.remote), advertised_address(addr, int(port), os.environ.get(env.HCCL_IF_IP)),
                               env.buffsize_bytes(), local_pids={r: infos[r]["pid"] for r in plan.remote if r in same_host})
        client.set(f"{job_id}/ready/{rank}", json.dumps({"tcp": tcp.endpoint if tcp is not None else None}).encode())
        ready = _join(client, [f"{job_id}/ready/{r}" for r in range(size)], rank, size, deadline, connect_timeout_s, where)
        if shm is not None:
            shm.connect({plan.local.index(r): infos[r]["pid"] for r in plan.local if r != rank}, deadline)
        if tcp is not None:
            tcp.connect({r: ready[r]["tcp"] for r in plan.remote}, deadline)
    except BaseException:
        for t in (shm, tcp):
            if t is not None:
                t.close()
        raise
    _note_host_layout(rank, host_ids)
    if shm is not None and tcp is not None:
        transport = HostSplitTransport(shm, tcp, plan.local, rank, size)
    else:
        transport = shm if shm is not None else tcp
    hosts = describe_hosts([info["host"] for info in infos], host_ids)
    return transport, f"{plan.kind} ({size} ranks, {hosts})"


def _connect_mpi(rank: int, size: int, launched: MpiLaunch | None, connect_timeout_s: float, context) -> Communicator:
    """Started by mpiexec or srun: meet through MPI and move bytes with it."""
    from .transport.mpi import MpiTransport, library_version

    deadline = time.monotonic() + connect_timeout_s
    spin_s, _ = _spin_settings(1)
    transport = MpiTransport.create(env.buffsize_bytes(), deadline, host_id=host_identity(), host_label=host_label(),
                                    spin_s=spin_s, yield_when_spinning=False)
    version = library_version(transport.MPI)
    if (transport.world_rank, transport.world_size) != (rank, size):
        transport.close()
        said = f"{launched.starter} set {launched.rank_var}={rank}, {launched.size_var}={size}" if launched else f"the environment says rank {rank} of {size}"
        raise HcclParamError(
            f"init: {said}, but MPI_COMM_WORLD has rank {transport.world_rank} of {transport.world_size}: mpi4py uses "
            f"{version}, not the MPI whose launcher started this rank; start the job with that MPI's mpiexec "
            "(the mpich wheel's is next to this Python: .venv/bin/mpiexec; under Slurm: srun --mpi=pmix or pmi2), "
            "or set MASTER_ADDR (rank 0's host) and MASTER_PORT so the ranks meet through hccl-py's store instead")
    host_ids = [info["host_id"] for info in transport.infos]
    _, transport.yield_when_spinning = _spin_settings(host_ids.count(host_ids[transport.world_rank]))
    _note_host_layout(rank, host_ids)
    starter = launched.starter if launched is not None else "MPI"
    hosts = describe_hosts([info["host"] for info in transport.infos], host_ids)
    _announce(rank, f"mpi ({version}, started by {starter}; {size} ranks, {hosts})")
    rc = context(Engine(transport))
    return Communicator(rc, range(size), rank, WORLD_COMM_ID, "world", on_destroy=_finisher(rc, transport, None))
