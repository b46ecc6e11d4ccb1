"""How the ranks of a job meet and which transport joins them: the connection strategies,
next to the transports they build.

``connect(job)`` returns this rank's transport and a one-line description (printed once by rank
0). Ranks started by hccl-launch or ``launch.spawn`` meet through the rendezvous store
(``hccl_py/rendezvous/store.py``): shared memory between ranks of one host (``shm.py``), TCP across hosts
(``tcp.py``), both at once (``hosts.py``). Ranks started by ``mpiexec`` or ``srun`` meet and move
bytes through MPI (``mpi.py``). Which applies is decided in ``choice.py``. Ranks started by
torchrun meet through torchrun's agent store (a c10d TCPStore, reached with torch's client), and
the torch backend passes the c10d store torch hands it (``connect(job, store)``): both through
``hccl_py/rendezvous/torch.py``, which offers the store client's calls over a c10d store.

Who belongs to a job: its id is the launcher's (``env.launcher_job_id``: HCCL_PY_JOB_ID,
torchrun's run id, Slurm's job and step), else the id of the store the ranks meet at (a random
one when rank 0 hosts it). A rank whose id differs from its store's is refused at once, and every
rank claims its slot atomically in the store, so a second process claiming the same rank (two
jobs on one MASTER_PORT) fails with HcclConnectError naming the holder. Without a launcher's id
the ranks then agree, before the first call, that no other job met them halfway
(``membership.py``): two jobs started by hand on one port fail on every rank that met, naming
the ranks and the other job's processes, instead of computing with each other's data. Each
connection of a process is a new generation: store keys and socket names carry it, so ranks may
destroy and re-initialise at different moments. Rank 0 without a launcher hosts the store and
keeps it for the life of its process, so ranks that re-initialise later still find it.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import secrets
import time

from .. import env, rundir
from ..errors import (
    CANN_CONNECT_TIMEOUT,
    HcclConnectError,
    HcclError,
    HcclNotSupportedError,
    HcclParamError,
    HcclTimeoutError,
)
from ..job import JobConfig
from ..transport.base import Transport
from ..transport.choice import (
    StorePlan,
    describe_hosts,
    host_identity,
    host_label,
    plan_store_transport,
    use_mpi,
)
from ..transport.hosts import HostSplitTransport
from ..transport.mpi import MpiTransport, import_mpi, library_version, wait_request
from ..transport.shm import ShmTransport
from ..transport.tcp import TcpTransport, advertised_address
from . import membership
from .store import StoreClient, StoreServer, store_address
from .torch import C10dStore  # torch's store client (imports torch only when used), not the adapter package

# (job id, rank) -> how often this process joined that job as that rank: the generation in keys and
# socket names. Counted per rank, not per process, so that ranks hosted as threads of one process
# (HCCL's C API: a thread per device) agree on it as ranks in processes of their own do.
_generations: dict[tuple[str, int], int] = {}
_hosted: dict[tuple[str, int], object] = {}  # stores this process hosts (rank 0, no launcher), kept until exit


def connect(job: JobConfig, store=None) -> tuple[Transport, str]:
    """This rank's transport to every other rank of ``job`` (blocks until all have joined, at
    most ``job.connect_timeout_s``), and what it is, e.g. ``"shm (4 ranks, 1 host)"``.
    ``store``: a store client to meet through instead of the one the job names (the torch
    backend's c10d store, ``hccl_py.rendezvous.torch.C10dStore``); it stays open."""
    if store is None and _mpi_serves(job):
        return _connect_mpi(job)
    return _connect_store(job, store)


def _have_mpi4py() -> bool:
    try:
        import mpi4py  # noqa: F401  (the package only: MPI is initialised by mpi4py.MPI)
    except ImportError:
        return False
    return True


def _mpi_serves(job: JobConfig) -> bool:
    """Whether this job meets and moves bytes through MPI (see ``choice.py``); started by
    mpiexec without mpi4py, HcclNotSupportedError says what is missing."""
    if not use_mpi(job.transport, job.mpi, job.launcher_env, store_given=job.store_port is not None):
        return False
    if job.transport is None and not _have_mpi4py():
        launched = job.mpi
        raise HcclNotSupportedError(
            f"init: started by {launched.starter} ({launched.rank_var}={launched.rank}), but mpi4py is not installed, so "
            "hccl-py cannot meet its peers through MPI; install it (`pip install 'hccl-py[mpi]'`), or set "
            f"MASTER_ADDR/MASTER_PORT so the ranks meet through hccl-py's store (rank 0 hosts it)"
        )
    return True


def _yield_when_spinning(ranks_here: int) -> bool:
    """Whether a waiting rank yields the CPU each turn of its spin: when this host runs more
    ranks than it has cores (a spin would keep the rank that must run off the core)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return ranks_here > cores


def _note_host_layout(rank: int, host_ids: list[str]) -> None:
    """LOCAL_RANK / LOCAL_WORLD_SIZE as torchrun means them, where the launcher did not set them
    (mpiexec, srun): code that sizes per-host resources reads them (e.g. BLAS threads per rank)."""
    here = [r for r, h in enumerate(host_ids) if h == host_ids[rank]]
    os.environ.setdefault(env.LOCAL_WORLD_SIZE, str(len(here)))
    os.environ.setdefault(env.LOCAL_RANK, str(here.index(rank)))


def _sweeps(job: JobConfig, hosting: bool) -> bool:
    """Whether this rank sweeps the run directory at the job's start: the first rank of its host
    (LOCAL_RANK 0, as torchrun sets it), or rank 0 (or the store's host) where nobody says."""
    local_rank = os.environ.get(env.LOCAL_RANK)
    if local_rank is not None:
        return local_rank.strip() == "0"
    return hosting or job.rank == 0


def _connect_store(job: JobConfig, store=None) -> tuple[Transport, str]:
    """Meet through the store; shared memory within a host, TCP across hosts."""
    rank, size = job.rank, job.size
    deadline = time.monotonic() + job.connect_timeout_s
    hosting = False
    if store is not None:  # the torch backend's c10d store
        client, where, owned = store, store.where, False
    elif job.torch_store and job.store_port is not None:  # under torchrun: its agent's store, with torch's client
        client, owned = C10dStore.connect(job.store_addr, job.store_port, job.size, job.connect_timeout_s), True
        where = client.where
    else:
        client, hosting = _zmq_store(job, deadline)
        where, owned = client.address.removeprefix("tcp://"), True
    one_host = job.local_world_size == size  # hccl-launch on one node, launch.spawn
    strategy = _connect_one_host if one_host and job.transport in (None, "shm") else _connect_hosts
    try:
        job_id = _job_identity(client, job.launcher_id, rank, where)
        if _sweeps(job, hosting):
            rundir.sweep_dead_jobs(keep=job_id)  # torchrun, env://, mpiexec: no launcher of ours cleans up
        generation = _generations[(job_id, rank)] = _generations.get((job_id, rank), 0) + 1
        transport, description = strategy(client, _Rendezvous(job_id, generation, where), job, deadline)
    finally:
        if owned:
            client.close()
    return transport, description


def _zmq_store(job: JobConfig, deadline: float):
    """A client of hccl-py's own store (hosted here by rank 0 when no launcher does), and whether
    this process hosts it."""

    addr, port, secret = job.store_addr, job.store_port, job.secret  # secret None: this user's secret file
    hosting = False
    if port is None and job.mpi is not None:  # under mpiexec without a store address: rank 0 hosts one
        addr, port, secret = _store_via_mpi(job.rank, addr, deadline, secret, job.launcher_id)
    elif port is not None and job.rank == 0 and not job.store_hosted:
        try:
            _host_store(addr, port, job.launcher_id, secret)
        except HcclConnectError as err:
            _report_port_taken(addr, port, secret, job.launcher_id, err, deadline)
            raise HcclConnectError(
                f"init: rank 0 hosts the job's store at MASTER_ADDR:MASTER_PORT={addr}:{port}, but "
                f"{err.message}; if another job runs there, give each job its own MASTER_PORT"
            ) from None
        hosting = True
    if port is None:
        raise HcclParamError(
            f"{env.MASTER_PORT} is not set: run under hccl-launch, or set MASTER_ADDR/MASTER_PORT for the store",
            variable=env.MASTER_PORT,
        )
    return StoreClient(store_address(addr, port), secret=secret), hosting


def _host_store(addr: str, port: int, own_id: tuple[str, str] | None, secret: str | None):
    """The store this process hosts at ``addr:port`` (rank 0 without a launcher), made once and
    kept until the process exits: ranks that re-initialise later still find it."""

    server = _hosted.get((addr, port))
    if server is None:
        server = StoreServer(host=addr, port=port, job_id=own_id[0] if own_id else None, secret=secret).start()
        if not _hosted:
            atexit.register(_close_hosted)
        _hosted[(addr, port)] = server
    return server


def _report_port_taken(
    addr: str, port: int, secret: str | None, own_id: tuple[str, str] | None, err: HcclConnectError, deadline: float
) -> None:
    """A rank 0 that cannot host its job's store because another store holds the port: if that
    store would admit this job's ranks (same secret, no other job id), record this process there
    as a rival, so the ranks that meet at it stop rather than compute with this job's ranks."""
    import zmq

    if err.errno != zmq.EADDRINUSE:
        return
    try:
        with StoreClient(
            store_address(addr, port), timeout_s=max(min(2.0, deadline - time.monotonic()), 0.1), secret=secret
        ) as client:
            store_id = client.job_id()
            if own_id is not None and own_id[0] != store_id:
                return  # the store refuses this job's ranks: nothing can mix
            membership.report_rival(
                client,
                f"{store_id}/g{_generations.get((store_id, 0), 0) + 1}",
                0,
                "could not host its job's store: the port was taken",
            )
    except HcclError:
        pass  # not a store this job's ranks can reach either


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
            rank=rank,
            store_job_id=store_id,
            job_id=own_id[0],
        )
    return store_id


def _store_via_mpi(rank: int, addr: str, deadline: float, secret: str | None, own_id: tuple[str, str] | None):
    """Started by mpiexec but asked for shm/tcp without MASTER_PORT: rank 0 hosts the store on a
    free port (once per process) and tells the others its port and the job secret through MPI
    (HCCL_PY_JOB_SECRET if set, else a fresh one)."""
    import numpy as np

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
    wait_request(
        MPI.COMM_WORLD.Ibcast([message, MPI.BYTE], root=0),
        deadline,
        f"init: rank {rank}: rank 0 did not share its store address within HCCL_CONNECT_TIMEOUT "
        "(did every rank of the MPI job call hccl_py.init()?)",
    )
    port = int(message[:8].view(np.int64)[0])
    length = int(message[8:10].view(np.uint16)[0])
    return addr, port, message[10 : 10 + length].tobytes().decode()


def _join(
    client,
    rdv: _Rendezvous,
    what: str,
    rank: int,
    size: int,
    deadline: float,
    connect_timeout_s: float,
    *,
    check_conflict: bool = True,
) -> list[dict]:
    """Wait until every rank has set its ``what`` key; their values. HcclTimeoutError names the
    absent; HcclConnectError if a process of another job tried to take a rank of this one
    (``check_conflict``; the membership check decides that on every rank alike, see ``_members``)."""
    keys = [rdv.key(what, r) for r in range(size)]
    try:
        client.wait(keys, max(deadline - time.monotonic(), 0.0))
    except HcclTimeoutError:
        present = client.check(keys)
        missing = [r for r, ok in enumerate(present) if not ok]
        raise HcclTimeoutError(
            f"init: rank {rank}: rank(s) {missing} of {size} did not join within {connect_timeout_s:g} s "
            f"(HCCL_CONNECT_TIMEOUT; CANN: {CANN_CONNECT_TIMEOUT} Get Socket Timeout); check that they started and "
            f"reach the store at {rdv.where}",
            rank=rank,
            ranks=missing,
            error_id=CANN_CONNECT_TIMEOUT,
        ) from None
    conflict = f"{rdv.prefix}/conflict"
    if check_conflict and client.check([conflict])[0]:
        raise HcclConnectError(
            f"init: rank {rank}: {client.get(conflict, 1.0).decode(errors='replace')}; this job "
            f"stops rather than mix with it"
        )
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
    # the holder's job stops if it is still joining (membership.agree)
    membership.report_rival(
        client,
        rdv.prefix,
        rank,
        f"found rank {rank} held by {membership.describe(holder)}: two jobs share the store at {rdv.where}",
    )
    raise HcclConnectError(
        f"init: rank {rank} of job {rdv.job_id!r} is already taken by {membership.describe(holder)} "
        f"(store {rdv.where}): two jobs probably share MASTER_PORT. Give each job its own "
        f"MASTER_PORT, set {env.JOB_ID} to a distinct value per job (the same on all its ranks), or start with hccl-launch",
        rank=rank,
        holder=holder,
    )


def _members(client, rdv: _Rendezvous, job: JobConfig, deadline: float) -> list[dict]:
    """Every rank's claim, once all have claimed; without a launcher's job id, only once the ranks
    agree that no other job met them halfway (``membership.agree``)."""
    alone_unless_told = job.launcher_id is None
    infos = _join(
        client, rdv, "rank", job.rank, job.size, deadline, job.connect_timeout_s, check_conflict=not alone_unless_told
    )
    if alone_unless_told:
        host, _, port = rdv.where.rpartition(":")
        membership.agree(
            client, rdv.prefix, job.rank, job.size, infos, rdv.where, host, int(port) if port.isdigit() else 0, deadline
        )
    return infos


def _connect_one_host(client, rdv: _Rendezvous, job: JobConfig, deadline: float):
    """Every rank on this host (the launcher says so): shared memory between all of them."""
    rank, size = job.rank, job.size
    transport = ShmTransport(
        rdv.job_id,
        rank,
        size,
        job.buffsize_bytes,
        spin_s=job.spin_s,
        yield_when_spinning=_yield_when_spinning(size),
        single_copy=job.single_copy,
        tag=rdv.tag,
    )
    try:
        _claim(client, rdv, rank, membership.identity())
        infos = _members(client, rdv, job, deadline)
        transport.connect({r: info["pid"] for r, info in enumerate(infos) if r != rank}, deadline)
    except BaseException:
        transport.close()
        raise
    return transport, f"shm ({size} ranks, 1 host)"


def _connect_hosts(client, rdv: _Rendezvous, job: JobConfig, deadline: float):
    """Ranks may sit on several hosts: learn who is where, then shared memory between ranks of
    one host and TCP between hosts (or what HCCL_PY_TRANSPORT asks for)."""

    rank, size, connect_timeout_s = job.rank, job.size, job.connect_timeout_s
    me = {**membership.identity(), "host": host_label(), "host_id": host_identity()}
    _claim(client, rdv, rank, me)
    infos = _members(client, rdv, job, deadline)
    host_ids = [info["host_id"] for info in infos]
    plan: StorePlan = plan_store_transport(rank, host_ids, job.transport)
    same_host = {r for r, h in enumerate(host_ids) if h == me["host_id"]}
    shm = tcp = None
    try:
        if plan.kind != "tcp":
            # Socket names carry the host identity: two "hosts" forced onto one machine
            # (HCCL_PY_HOST_ID) must not meet each other's local ranks.
            host_tag = hashlib.blake2b(me["host_id"].encode(), digest_size=4).hexdigest()
            shm = ShmTransport(
                rdv.job_id,
                plan.local.index(rank),
                len(plan.local),
                job.buffsize_bytes,
                spin_s=job.spin_s,
                yield_when_spinning=_yield_when_spinning(len(same_host)),
                single_copy=job.single_copy,
                tag=f"{rdv.tag}.{host_tag}",
            )
        if plan.remote:
            addr, _, port = rdv.where.rpartition(":")
            tcp = TcpTransport(
                rank,
                size,
                list(plan.remote),
                advertised_address(addr, int(port), job.if_ip),
                job.buffsize_bytes,
                local_pids={r: infos[r]["pid"] for r in plan.remote if r in same_host},
            )
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


def _connect_mpi(job: JobConfig) -> tuple[Transport, str]:
    """Started by mpiexec or srun: meet through MPI and move bytes with it."""

    rank, size, launched = job.rank, job.size, job.mpi
    deadline = time.monotonic() + job.connect_timeout_s
    transport = MpiTransport.create(
        job.buffsize_bytes,
        deadline,
        host_id=host_identity(),
        host_label=host_label(),
        spin_s=job.spin_s,
        yield_when_spinning=False,
    )
    version = library_version(transport.MPI)
    if (transport.world_rank, transport.world_size) != (rank, size):
        transport.close()
        said = (
            f"{launched.starter} set {launched.rank_var}={rank}, {launched.size_var}={size}"
            if launched
            else f"the environment says rank {rank} of {size}"
        )
        raise HcclParamError(
            f"init: {said}, but MPI_COMM_WORLD has rank {transport.world_rank} of {transport.world_size}: mpi4py uses "
            f"{version}, not the MPI whose launcher started this rank; start the job with that MPI's mpiexec "
            "(the mpich wheel's is next to this Python: .venv/bin/mpiexec; under Slurm: srun --mpi=pmix or pmi2), "
            "or set MASTER_ADDR (rank 0's host) and MASTER_PORT so the ranks meet through hccl-py's store instead"
        )
    host_ids = [info["host_id"] for info in transport.infos]
    transport.yield_when_spinning = _yield_when_spinning(host_ids.count(host_ids[transport.world_rank]))
    _note_host_layout(rank, host_ids)
    starter = launched.starter if launched is not None else "MPI"
    hosts = describe_hosts([info["host"] for info in transport.infos], host_ids)
    return transport, f"mpi ({version}, started by {starter}; {size} ranks, {hosts})"
