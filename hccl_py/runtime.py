"""``hccl_py.init``: the world communicator of this process.

``init`` reads the environment once (``job.read_job``: rank, size, store address, HCCL
settings), connects this rank to the others (``rendezvous/connect.py``: the rendezvous store and
shared memory or TCP, or MPI under mpiexec/srun), builds the rank's shared state
(``context.make_context``: card, topology, cost model, flight recorder, faults) and returns the
world communicator. Run plainly, the world is this one process.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections import deque

from . import tracefile
from .communicator import Communicator
from .engine.context import RankContext, make_context
from .engine.executor import Engine
from .errors import HcclInternalError, HcclParamError
from .job import JobConfig, read_job
from .records import DEFAULT_RECORDS, install_dump_hooks, write_rank_trace
from .transport.base import Transport

WORLD_COMM_ID = 1

_world: Communicator | None = None


def init() -> Communicator:
    """Join the job and return the world communicator (``HcclCommInitClusterInfo``).

    Blocks until every rank has joined, at most ``HCCL_CONNECT_TIMEOUT`` seconds; then raises
    :class:`HcclTimeoutError` naming the ranks that never came. Calling it again returns the
    same communicator until that one is destroyed; after ``destroy()`` it joins anew (ranks may
    do so at different moments)::

        import numpy as np, hccl_py as hccl
        comm = hccl.init()
        x = np.full(1000, comm.rank, np.float32)
        comm.all_reduce(x)
    """
    return join()


def join(job: JobConfig | None = None, store=None) -> Communicator:
    """:func:`init` for adapters (the torch backend): ``job`` instead of the environment's (torch
    gives the rank, the size and the timeout), ``store`` a store client to meet through (the
    c10d store torch hands its backend, ``hccl_py.rendezvous.torch.C10dStore``). A live world
    communicator is returned as it is."""
    global _world
    if _world is not None and _world.issuer.engine.forked:
        raise HcclInternalError(
            f"init: this process ({os.getpid()}) is a child forked from rank {_world.rank}'s process "
            f"({_world.issuer.engine.owner_pid}), which is already in the job as that rank; a forked child cannot join the job "
            "nor use the parent's communicators. Start ranks with hccl-launch or launch.spawn, and give workers of a "
            "rank multiprocessing's 'spawn' start method"
        )
    if _world is not None and _world.closed_reason is None:
        return _world
    _world = open_world(read_job() if job is None else job, store)
    return _world


def open_world(job: JobConfig, store=None, *, announce: bool = True) -> Communicator:
    """A new world communicator of ``job`` (this rank joins it, blocking as :func:`init`), not the
    process's own: for hosts of several ranks or several jobs in one process (HCCL's C API: a
    thread per device, a communicator per root info). ``announce``: rank 0 prints the transport.
    Destroying it closes its transport; at exit it closes too."""
    if job.trace_dir:
        _check_trace_dir(job.trace_dir)
    transport = None
    if job.size > 1:
        # lazy: zmq (the store), needed by worlds of 2 or more; import hccl_py stays cheap
        from .rendezvous.connect import connect

        transport, description = connect(job, store)
        if job.rank == 0 and announce:
            print(f"hccl-py: transport {description}", file=sys.stderr, flush=True)
    try:
        rc = make_context(job, Engine(transport))
    except BaseException:
        if transport is not None:
            transport.close()
        raise
    install_dump_hooks(rc)
    if job.trace_dir:
        rc.device.kernels = deque(maxlen=DEFAULT_RECORDS)  # the compute stream's spans, for the trace
    return Communicator(
        rc, range(job.size), job.rank, WORLD_COMM_ID, "world", on_destroy=_finisher(rc, transport, job.trace_dir)
    )


def current() -> Communicator | None:
    """The world communicator of this process while it is usable (joined, not destroyed), else None."""
    usable = _world is not None and _world.closed_reason is None and not _world.issuer.engine.forked
    return _world if usable else None


def _check_trace_dir(trace_dir: str) -> None:
    """HCCL_PY_TRACE_DIR can be made and written, checked before the rank joins (not at exit)."""
    try:
        os.makedirs(trace_dir, exist_ok=True)
        probe = os.path.join(trace_dir, f".hccl-py-probe.{os.getpid()}")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as err:
        raise HcclParamError(
            f"init: HCCL_PY_TRACE_DIR={trace_dir!r} cannot be made or written ({err.strerror or err}); "
            "give a folder this user can write",
            variable="HCCL_PY_TRACE_DIR",
            value=trace_dir,
            rule="writable",
            path=trace_dir,
            errno=err.errno,
        ) from None


def _finisher(rc: RankContext, transport: Transport | None, trace_dir: str | None) -> "callable":
    """What ends this rank's part in the job, once: the trace file, then sockets and memory
    (a store this process hosts stays until exit, for ranks that re-initialise later)."""
    done = []
    owner = os.getpid()

    def finish() -> None:
        if done or os.getpid() != owner:  # a forked child exits without touching the parent's job
            return
        done.append(True)
        try:
            if trace_dir:
                write_rank_trace(
                    os.path.join(trace_dir, tracefile.rank_file(rc.device.rank)),
                    rc.device.rank,
                    rc.recorder.records,
                    rc.wall_origin,
                    rc.device.kernels or (),
                )
        except OSError as err:  # the folder went away after init checked it: say so, still release the job
            print(
                f"hccl-py: rank {rc.device.rank}: could not write its trace into {trace_dir} ({err.strerror or err})",
                file=sys.stderr,
                flush=True,
            )
        finally:
            if transport is not None:
                rc.engine.linger()
                transport.close()

    atexit.register(finish)
    return finish
