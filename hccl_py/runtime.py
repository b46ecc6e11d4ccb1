"""``hccl_py.init``: the world communicator of this process, from the launcher's environment.

Under hccl-launch (or ``launch.spawn``) the rank, world size and store address come from the
environment and the launcher hosts the rendezvous store. Started another way with ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set (torchrun style), rank 0 hosts the store.
Run plainly, the world is this one process.
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
from .errors import HcclInternalError, HcclParamError, HcclTimeoutError
from .faults import check_ranks, parse_faults
from .executor import Engine
from .records import write_chrome_trace
from .transport.shm import ShmTransport

WORLD_COMM_ID = 1
DEFAULT_SPIN_US = 50.0

_world: Communicator | None = None


def _int_env(*names: str) -> int | None:
    for name in names:
        raw = os.environ.get(name)
        if raw not in (None, ""):
            try:
                return int(raw)
            except ValueError:
                raise HcclParamError(f"{name}={raw!r} is not an integer") from None
    return None


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
    if _world is not None and _world._closed_reason is None:
        return _world
    rank = _int_env(env.RANK_ID, env.RANK)
    size = _int_env(env.RANK_SIZE, env.WORLD_SIZE)
    connect_timeout_s = env.connect_timeout_s()
    exec_timeout_s = env.exec_timeout_s()
    algo_env = parse_hccl_algo(os.environ.get(env.HCCL_ALGO))
    if size is None or size == 1:
        if rank not in (None, 0):
            raise HcclParamError(f"rank {rank} given for a world of size 1 (set RANK_SIZE/WORLD_SIZE)")
        rank, size = 0, 1
    if rank is None or not 0 <= rank < size:
        raise HcclParamError(f"RANK_ID/RANK={rank} is not in 0..{size - 1} (RANK_SIZE/WORLD_SIZE={size})")
    if size > 65535:
        raise HcclParamError(f"world size {size} exceeds the 65535 ranks one host can run")
    topology = load_topology(size)
    faults = parse_faults(os.environ.get(env.HCCL_PY_FAULTS))
    check_ranks(faults, size)
    wall_origin = float(os.environ.get(env.HCCL_PY_WALL_ORIGIN) or time.monotonic())

    def context(engine: Engine) -> RankContext:
        rc = RankContext(engine, Device(topology.card(rank), rank), topology, exec_timeout_s, algo_env, wall_origin,
                         modeled=os.environ.get(env.HCCL_PY_MODELED_TIME, "1") != "0", faults=faults,
                         flight_dir=os.environ.get(env.HCCL_PY_FLIGHT_DIR) or None)
        _install_dump_hooks(rc)
        return rc

    if size == 1:
        rc = context(Engine(None))
        _world = Communicator(rc, [0], 0, WORLD_COMM_ID, "world", on_destroy=_finisher(rc, None, None))
    else:
        _world = _connect(rank, size, connect_timeout_s, context)
    return _world


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


def _finisher(rc: RankContext, transport: ShmTransport | None, server) -> "callable":
    """What ends this rank's part in the job, once: the trace file, then sockets and memory."""
    done = []

    def finish() -> None:
        if done:
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


def _connect(rank: int, size: int, connect_timeout_s: float, context) -> Communicator:
    from .store import StoreClient, StoreServer  # only multi-rank jobs need zmq

    addr = os.environ.get(env.MASTER_ADDR) or "127.0.0.1"
    port = _int_env(env.MASTER_PORT)
    if port is None:
        raise HcclParamError(f"{env.MASTER_PORT} is not set: run under hccl-launch, or set MASTER_ADDR/MASTER_PORT for the store")
    deadline = time.monotonic() + connect_timeout_s
    server = None
    if rank == 0 and os.environ.get(env.STORE_HOSTED) != "1":
        server = StoreServer(host=addr, port=port)
        server.start()
    job_id = os.environ.get(env.JOB_ID) or hashlib.blake2b(f"{addr}:{port}".encode(), digest_size=6).hexdigest()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    spin_us = float(os.environ.get("HCCL_PY_SPIN_US", DEFAULT_SPIN_US))
    transport = ShmTransport(job_id, rank, size, env.buffsize_bytes(), spin_s=spin_us * 1e-6, yield_when_spinning=size > cores,
                             single_copy=os.environ.get(env.HCCL_PY_CMA, "1") != "0")
    client = StoreClient(f"tcp://{addr}:{port}")
    try:
        client.set(f"{job_id}/rank/{rank}", json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode())
        keys = [f"{job_id}/rank/{r}" for r in range(size)]
        try:
            client.wait(keys, max(deadline - time.monotonic(), 0.0))
        except HcclTimeoutError:
            present = client.check(keys)
            missing = [r for r, ok in enumerate(present) if not ok]
            raise HcclTimeoutError(
                f"init: rank {rank}: rank(s) {missing} of {size} did not join within {connect_timeout_s:g} s "
                f"(HCCL_CONNECT_TIMEOUT); check that they started and reach the store at {addr}:{port}"
            ) from None
        infos = {r: json.loads(client.get(k, max(deadline - time.monotonic(), 0.1))) for r, k in enumerate(keys)}
        transport.connect({r: info["pid"] for r, info in infos.items() if r != rank}, deadline)
    except BaseException:
        transport.close()
        client.close()
        if server is not None:
            server.close()
        raise
    client.close()
    rc = context(Engine(transport))
    return Communicator(rc, range(size), rank, WORLD_COMM_ID, "world", on_destroy=_finisher(rc, transport, server))
