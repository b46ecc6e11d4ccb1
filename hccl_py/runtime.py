"""``hccl_py.init``: the world communicator of this process, from the launcher's environment.

Under hccl-launch (or ``launch.spawn``) the rank, world size and store address come from the
environment and the launcher hosts the rendezvous store. Started another way with ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set (torchrun style), rank 0 hosts the store,
and keeps it for the life of its process, so ranks that re-initialise later still find it.
Started by ``mpiexec`` or ``srun``, rank and size come from MPI and the ranks meet and talk
through it (``transport/mpi.py``). Run plainly, the world is this one process. Which transport
a job uses is decided in ``transport/choice.py`` and printed once by rank 0.

Who belongs to a job: its id is the launcher's (``env.launcher_job_id``: HCCL_PY_JOB_ID,
torchrun's run id, Slurm's job and step), else the id of the store the ranks meet at (a random
one when rank 0 hosts it). A rank whose id differs from its store's is refused at once, and every
rank claims its slot atomically in the store, so a second process claiming the same rank (two
jobs on one MASTER_PORT) fails with HcclConnectError naming the holder. Each ``init()`` of a
process is a new generation: store keys and socket names carry it, so ranks may destroy and
re-initialise at different moments.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import secrets
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
from .errors import HcclConnectError, HcclInternalError, HcclNotSupportedError, HcclParamError, HcclTimeoutError
from .faults import check_ranks, parse_faults
from .executor import Engine
from .records import write_chrome_trace
from .transport.choice import (MpiLaunch, StorePlan, describe_hosts, host_identity, host_label, mpi_launch,
                               plan_store_transport, requested_transport, use_mpi)
from .transport.base import Transport
from .transport.shm import ShmTransport

WORLD_COMM_ID = 1

_world: Communicator | None = None
_generation = 0  # store rendezvous this process has made: the generation in keys and socket names
_hosted: dict[tuple[str, int], object] = {}  # stores this process hosts (rank 0, no launcher), kept until exit


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
        _world = Communicator(rc, [0], 0, WORLD_COMM_ID, "world", on_destroy=_finisher(rc, None))
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


def _finisher(rc: RankContext, transport: Transport | None) -> "callable":
    """What ends this rank's part in the job, once: the trace file, then sockets and memory
    (a store this process hosts stays until exit, for ranks that re-initialise later)."""
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
    global _generation
    from .store import StoreClient, store_address  # only multi-rank jobs need zmq
    from .transport import rundir

    deadline = time.monotonic() + connect_timeout_s
    addr = os.environ.get(env.MASTER_ADDR) or "127.0.0.1"
    port = env.master_port()
    secret = env.job_secret()  # None: this user's secret file (store.default_secret)
    own_id = env.launcher_job_id()
    hosting = False
    if port is None and launched is not None:  # under mpiexec without a store address: rank 0 hosts one
        addr, port, secret = _store_via_mpi(rank, addr, deadline, secret, own_id)
    elif port is not None and rank == 0 and os.environ.get(env.STORE_HOSTED) != "1":
        try:
            _host_store(addr, port, own_id, secret)
        except HcclConnectError as err:
            raise HcclConnectError(f"init: rank 0 hosts the job's store at MASTER_ADDR:MASTER_PORT={addr}:{port}, but "
                                   f"{err.message}; if another job runs there, give each job its own MASTER_PORT") from None
        hosting = True
    if port is None:
        raise HcclParamError(f"{env.MASTER_PORT} is not set: run under hccl-launch, or set MASTER_ADDR/MASTER_PORT for the store")
    _generation += 1
    where = f"{addr}:{port}"
    one_host = os.environ.get(env.LOCAL_WORLD_SIZE) == str(size)  # hccl-launch on one node, launch.spawn
    if one_host and requested in (None, "shm"):
        connect = _connect_one_host
    else:
        connect = _connect_hosts
    client = StoreClient(store_address(addr, port), secret=secret)
    try:
        job_id = _job_identity(client, own_id, rank, where)
        if hosting:
            rundir.sweep_stale(keep=job_id)  # no launcher cleans up after this user's crashed jobs
        transport, description = connect(client, _Rendezvous(job_id, _generation, where), rank, size, deadline,
                                         connect_timeout_s, requested)
    finally:
        client.close()
    _announce(rank, description)
    rc = context(Engine(transport))
    return Communicator(rc, range(size), rank, WORLD_COMM_ID, "world", on_destroy=_finisher(rc, transport))


def _host_store(addr: str, port: int, own_id: tuple[str, str] | None, secret: str | None):
    """The store this process hosts at ``addr:port`` (rank 0 without a launcher), made once and
    kept until the process exits: ranks that re-initialise later still find it."""
    from .store import StoreServer

    server = _hosted.get((addr, port))
    if server is None:
        server = StoreServer(host=addr, port=port, job_id=own_id[0] if own_id else None, secret=secret).start()
        if not _hosted:
            atexit.register(_close_hosted)
        _hosted[(addr, port)] = server
    return server


def _close_hosted() -> None:
    for server in _hosted.values():
        server.close()
    _hosted.clear()


class _Rendezvous:
    """One generation of one job at one store: names its keys and socket files."""

    def __init__(self, job_id: str, generation: int, where: str):
        self.job_id = job_id
        self.generation = generation
        self.where = where  # host:port of the store
        self.prefix = f"{job_id}/g{generation}"
        self.tag = f"g{generation}"

    def key(self, what: str, rank: int) -> str:
        return f"{self.prefix}/{what}/{rank}"


def _job_identity(client, own_id: tuple[str, str] | None, rank: int, where: str) -> str:
    """This job's id: the store's, which must equal the launcher's when there is one."""
    store_id = client.job_id()
    if own_id is not None and own_id[0] != store_id:
        raise HcclConnectError(
            f"init: rank {rank}: the store at {where} belongs to another job (its job id is {store_id!r}; this rank's "
            f"{own_id[1]} is {own_id[0]!r}): two jobs probably share MASTER_PORT; give each job its own MASTER_PORT",
            rank=rank, store_job_id=store_id, job_id=own_id[0])
    return store_id


def _store_via_mpi(rank: int, addr: str, deadline: float, secret: str | None, own_id: tuple[str, str] | None):
    """Started by mpiexec but asked for shm/tcp without MASTER_PORT: rank 0 hosts the store on a
    free port (once per process) and tells the others its port and the job secret through MPI
    (HCCL_PY_JOB_SECRET if set, else a fresh one)."""
    import numpy as np

    from .store import StoreServer
    from .transport.mpi import import_mpi, wait_request

    try:
        MPI = import_mpi()
    except HcclNotSupportedError:
        return addr, None, secret
    if rank == 0:
        server = _hosted.get((addr, 0))
        if server is None:
            secret = secret or secrets.token_hex(16)
            server = StoreServer(host=addr, port=0, job_id=own_id[0] if own_id else None, secret=secret).start()
            if not _hosted:
                atexit.register(_close_hosted)
            _hosted[(addr, 0)] = server
        secret = server.secret
    message = np.zeros(8 + 2 + 256, np.uint8)  # port (int64), secret length (uint16), secret
    if rank == 0:
        raw = secret.encode()
        message[:8] = np.frombuffer(np.int64(server.port).tobytes(), np.uint8)
        message[8:10] = np.frombuffer(np.uint16(len(raw)).tobytes(), np.uint8)
        message[10 : 10 + len(raw)] = np.frombuffer(raw, np.uint8)
    wait_request(MPI.COMM_WORLD.Ibcast([message, MPI.BYTE], root=0), deadline,
                 f"init: rank {rank}: rank 0 did not share its store address within HCCL_CONNECT_TIMEOUT "
                 "(did every rank of the MPI job call hccl_py.init()?)")
    port = int(message[:8].view(np.int64)[0])
    length = int(message[8:10].view(np.uint16)[0])
    return addr, port, message[10 : 10 + length].tobytes().decode()


def _join(client, rdv: _Rendezvous, what: str, rank: int, size: int, deadline: float, connect_timeout_s: float) -> list[dict]:
    """Wait until every rank has set its ``what`` key; their values. HcclTimeoutError names the
    absent; HcclConnectError if a process of another job tried to take a rank of this one."""
    keys = [rdv.key(what, r) for r in range(size)]
    try:
        client.wait(keys, max(deadline - time.monotonic(), 0.0))
    except HcclTimeoutError:
        present = client.check(keys)
        missing = [r for r, ok in enumerate(present) if not ok]
        raise HcclTimeoutError(
            f"init: rank {rank}: rank(s) {missing} of {size} did not join within {connect_timeout_s:g} s "
            f"(HCCL_CONNECT_TIMEOUT); check that they started and reach the store at {rdv.where}",
            rank=rank, ranks=missing,
        ) from None
    conflict = f"{rdv.prefix}/conflict"
    if client.check([conflict])[0]:
        raise HcclConnectError(f"init: rank {rank}: {client.get(conflict, 1.0).decode(errors='replace')}; this job "
                               f"stops rather than mix with it")
    return [json.loads(client.get(k, max(deadline - time.monotonic(), 0.1))) for k in keys]


def _claim(client, rdv: _Rendezvous, rank: int, me: dict) -> None:
    """Take this rank's slot (set only if absent): a second claimant, a process of another job
    on the same MASTER_PORT, gets HcclConnectError naming the holder (``err.holder``)."""
    won, current = client.set_if_absent(rdv.key("rank", rank), json.dumps(me).encode())
    if won:
        return
    try:
        holder = json.loads(current)
    except ValueError:
        holder = {}
    told = (f"pid {me['pid']} on {me['host']} tried to take rank {rank}, held by pid {holder.get('pid', '?')} "
            f"on {holder.get('host', '?')}: two jobs share the store at {rdv.where}")
    try:
        client.set(f"{rdv.prefix}/conflict", told.encode())  # the holder's job stops if it is still joining
    except HcclConnectError:
        pass
    raise HcclConnectError(
        f"init: rank {rank} of job {rdv.job_id!r} is already taken by pid {holder.get('pid', '?')} on "
        f"{holder.get('host', '?')} (store {rdv.where}): two jobs probably share MASTER_PORT. Give each job its own "
        f"MASTER_PORT, set {env.JOB_ID} to a distinct value per job (the same on all its ranks), or start with hccl-launch",
        rank=rank, holder=holder)


def _connect_one_host(client, rdv: _Rendezvous, rank, size, deadline, connect_timeout_s, requested):
    """Every rank on this host (the launcher says so): shared memory between all of them."""
    spin_s, yield_when_spinning = _spin_settings(size)
    transport = ShmTransport(rdv.job_id, rank, size, env.buffsize_bytes(), spin_s=spin_s, yield_when_spinning=yield_when_spinning,
                             single_copy=env.single_copy(), tag=rdv.tag)
    try:
        _claim(client, rdv, rank, {"pid": os.getpid(), "host": socket.gethostname()})
        infos = _join(client, rdv, "rank", rank, size, deadline, connect_timeout_s)
        transport.connect({r: info["pid"] for r, info in enumerate(infos) if r != rank}, deadline)
    except BaseException:
        transport.close()
        raise
    return transport, f"shm ({size} ranks, 1 host)"


def _connect_hosts(client, rdv: _Rendezvous, rank, size, deadline, connect_timeout_s, requested):
    """Ranks may sit on several hosts: learn who is where, then shared memory between ranks of
    one host and TCP between hosts (or what HCCL_PY_TRANSPORT asks for)."""
    from .transport.hosts import HostSplitTransport
    from .transport.tcp import TcpTransport, advertised_address

    me = {"pid": os.getpid(), "host": host_label(), "host_id": host_identity()}
    _claim(client, rdv, rank, me)
    infos = _join(client, rdv, "rank", rank, size, deadline, connect_timeout_s)
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
            shm = ShmTransport(rdv.job_id, plan.local.index(rank), len(plan.local), env.buffsize_bytes(),
                               spin_s=spin_s, yield_when_spinning=yield_when_spinning,
                               single_copy=env.single_copy(), tag=f"{rdv.tag}.{host_tag}")
        if plan.remote:
            addr, _, port = rdv.where.rpartition(":")
            tcp = TcpTransport(rank, size, list(plan.remote), advertised_address(addr, int(port), os.environ.get(env.HCCL_IF_IP)),
                               env.buffsize_bytes(), local_pids={r: infos[r]["pid"] for r in plan.remote if r in same_host})
        client.set(rdv.key("ready", rank), json.dumps({"tcp": tcp.endpoint if tcp is not None else None}).encode())
        ready = _join(client, rdv, "ready", rank, size, deadline, connect_timeout_s)
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
    return Communicator(rc, range(size), rank, WORLD_COMM_ID, "world", on_destroy=_finisher(rc, transport))
