"""The public communicator: argument checks, call signatures, algorithm choice, sub-groups.

Every argument is checked before a byte moves, so bad input never hangs a peer or half-writes
a buffer. Names follow HCCL's operators in Python style (``HcclAllReduce`` -> ``all_reduce``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
import time
from typing import NamedTuple, Sequence

import numpy as np

from topology import Topology, TopologyError, auto_partition, load_partition, validate_partition

from . import algo_select
from .algorithms import hierarchical, p2p
from .algorithms.registry import ALL_ALGOS, get_schedule
from .algorithms.schedule import Schedule
from .context import RankContext
from .device import Device
from .dtypes import UFUNCS, ReduceOp, check_op_dtype, dtype_code
from .errors import HcclError, HcclInternalError, HcclParamError, HcclTimeoutError
from .collectives import OpKind
from .executor import P2P_SEQ_BIT, CallContext, error_from_notice
from .records import CallRecord, CommStats
from .transport.base import CallSignature

_ALGO_INDEX = {name: i for i, name in enumerate(ALL_ALGOS)}


_CHECKED_OPS: dict[tuple, ReduceOp] = {}  # (op as passed, dtype) -> ReduceOp, for pairs that passed the checks
_BYTE = np.dtype(np.uint8)
_NO_DATA = np.empty(0, _BYTE)


class _Call(NamedTuple):
    """One call shape on one communicator, resolved once (see ``Communicator._prepare``)."""

    collective: str
    algo: str
    schedule: Schedule
    costs: tuple
    ufunc: object
    nbytes: int
    ctx: CallContext  # its seq is set per call
    dtype_name: str = ""  # for the flight record (numpy's dtype.name is slow to compute)
    notify_on_timeout: bool = False  # tell the peers why, when this rank times out (monitored barrier)


def _byte_span(a: np.ndarray) -> tuple[int, int]:
    start = a.__array_interface__["data"][0]
    return start, start + a.nbytes


def _apart_from(src: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``src`` (a contiguous input), or a private copy of it when it shares bytes with ``out``.

    Schedules of out-of-place collectives use OUT as scratch while later steps still read IN,
    so an input that overlaps the output (NCCL's in-place forms, ``recvbuff = sendbuff + rank *
    recvcount``, or any other offset) is copied once first: the result is always right."""
    if not src.nbytes or not out.nbytes:
        return src
    a0, a1 = _byte_span(src)
    b0, b1 = _byte_span(out)
    return src.copy() if a0 < b1 and b0 < a1 else src


def _comm_id(*parts: object) -> int:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # 63 bits: fits the header, never 0 by accident


class Communicator:
    """A group of ranks that run collectives together (an ``HcclComm``).

    Obtain the world communicator from :func:`hccl_py.init`; derive others with
    :meth:`split` or :meth:`create_group`. Usable as a context manager (destroys on exit)::

        with hccl_py.init() as comm:
            x = np.full(4, comm.rank, np.float32)
            comm.all_reduce(x)          # x == sum of ranks on every rank
    """

    def __init__(self, rc: RankContext, world_ranks: Sequence[int], comm_rank: int, comm_id: int, name: str, *, on_destroy=None):
        self._rc = rc
        self._engine = rc.engine
        self._world_ranks = tuple(world_ranks)
        self._rank = comm_rank
        self._id = comm_id
        self.name = name
        self._timeout_s = rc.exec_timeout_s
        self._algo_env = rc.algo_env
        self._seq = 0
        self._calls: dict[tuple, _Call] = {}  # per call shape: algorithm, schedule, costs, signature
        self._p2p_sent: dict[int, int] = {}
        self._p2p_received: dict[int, int] = {}
        self._closed_reason: str | None = None
        self._on_destroy = on_destroy
        self._partition: tuple[tuple[int, ...], ...] | None = None  # groups of algo="hier"; None: auto

    # -- identity -------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's rank in the communicator (0 .. size-1)."""
        return self._rank

    @property
    def size(self) -> int:
        """Number of ranks in the communicator."""
        return len(self._world_ranks)

    @property
    def world_ranks(self) -> tuple[int, ...]:
        """World rank of each member, in communicator-rank order."""
        return self._world_ranks

    @property
    def device(self) -> Device:
        """The simulated card this rank hosts (shared by all its communicators)."""
        return self._rc.device

    @property
    def clock(self) -> float:
        """This rank's modeled clock, in modeled seconds (``device.clock``)."""
        return self._rc.device.clock

    @property
    def topology(self) -> Topology:
        """The modeled cluster."""
        return self._rc.topology

    def stats(self) -> CommStats:
        """Totals of this communicator's calls on this rank: calls, bytes, modeled and wall seconds,
        split per operation in ``by_op``::

            s = comm.stats(); print(s.calls, s.modeled_s, s.by_op["allreduce"].nbytes)
        """
        return self._rc.recorder.totals(self.name)

    def __repr__(self) -> str:
        return f"<Communicator '{self.name}' rank {self.rank} of {self.size}>"

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    # -- lifecycle -------------------------------------------------------------------------------
    def abort(self, reason: str = "abort() was called") -> None:
        """Stop using this communicator: pending messages are dropped, later calls fail at once."""
        if self._closed_reason is None:
            self._closed_reason = f"was aborted ({reason})"
            if self._engine.transport is not None:
                self._engine.abandon(self._id)

    def destroy(self) -> None:
        """Release the communicator (``HcclCommDestroy``); later calls fail at once."""
        if self._closed_reason is None:
            self._closed_reason = "was destroyed"
            if self._engine.transport is not None:
                self._engine.abandon(self._id)
        if self._on_destroy is not None:
            callback, self._on_destroy = self._on_destroy, None
            callback()

    def _check_usable(self, what: str) -> None:
        if self._engine.forked:  # an attribute, set in a forked child: no system call per collective
            raise HcclInternalError(
                f"{what}: communicator '{self.name}' belongs to process {self._engine.owner_pid} (rank {self._world_ranks[self._rank]}); "
                f"this process ({os.getpid()}) is a child forked from it and cannot use it: the sockets and shared memory "
                "are the parent's. Run collectives in the rank's own process; start workers that need their own "
                "communicator as ranks (hccl-launch, launch.spawn) or with multiprocessing's 'spawn' start method")
        if self._closed_reason is not None:
            raise HcclInternalError(f"{what} on communicator '{self.name}': the communicator {self._closed_reason}; create a new one")
        notice = self._engine.pending_notice(self._id)
        if notice is not None:
            self.abort("a peer reported a failed call")
            seq, src, body = notice
            reporter = self._world_ranks.index(src) if src in self._world_ranks else src
            raise error_from_notice(f"{what}: an earlier call failed on a peer", reporter, body, {"rank": self._rank, "comm": self.name})

    # -- argument checks ---------------------------------------------------------------------------
    def _array(self, x, what: str, *, writable: bool) -> np.ndarray:
        if not isinstance(x, np.ndarray):
            raise HcclParamError(f"{what}: buffer must be a numpy.ndarray, got {type(x).__name__}")
        dtype_code(x.dtype, where=what)
        if writable:
            if not x.flags.c_contiguous:
                raise HcclParamError(f"{what}: buffer must be C-contiguous (it is written in place); pass np.ascontiguousarray(x) and copy back")
            if not x.flags.writeable:
                raise HcclParamError(f"{what}: buffer is read-only but the operation writes it in place")
        return x

    def _root(self, root, what: str, name: str = "root") -> int:
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < self.size:
            raise HcclParamError(f"{what}: {name}={root!r} is not a rank of communicator '{self.name}' (0..{self.size - 1})")
        return int(root)

    def _op(self, op, dtype: np.dtype, what: str) -> ReduceOp:
        try:
            return _CHECKED_OPS[(op, dtype)]
        except (KeyError, TypeError):
            pass
        try:
            redop = ReduceOp.parse(op)
        except HcclParamError as err:
            raise HcclParamError(f"{what}: {err.message}") from None
        check_op_dtype(redop, dtype, where=what)
        if isinstance(op, (str, ReduceOp)):
            _CHECKED_OPS[(op, dtype)] = redop
        return redop

    # -- the collective call path ---------------------------------------------------------------------
    def _collective(self, kind: OpKind, collective: str, algo: str, bufs, count: int, dtype: np.dtype,
                    redop: ReduceOp | None = None, root: int = 0) -> None:
        key = (collective, algo, count, root, dtype, redop)
        call = self._calls.get(key)
        if call is None:
            call = self._remember(key, self._prepare(kind, collective, algo, count, dtype, redop, root))
        self._run_call(call, bufs, dtype)

    def _prepare(self, kind: OpKind, collective: str, algo: str, count: int, dtype: np.dtype, redop: ReduceOp | None,
                 root: int) -> "_Call":
        """Everything about a call that depends only on its shape: resolved once per shape."""
        itemsize = dtype.itemsize
        op = redop.name.lower() if redop is not None else "sum"
        name = algo_select.resolve(
            collective, algo,
            lambda: algo_select.auto(self._rc.cost_model, collective, count, itemsize, self._world_ranks, root, dtype.name, op),
            self._algo_env,
        )
        levels = algo_select.hier_levels(name)
        if levels is None:
            fn = get_schedule(collective, name)
        else:  # auto's two-level algorithms run on the partition by server, as HCCL's do
            groups = algo_select.server_partition(self._rc.topology, self._world_ranks) if algo_select.on_servers(name) else self.partition
            fn = hierarchical.schedule_for(collective, groups, *levels)
        sig = CallSignature(kind, _ALGO_INDEX[name.partition(":")[0]], dtype_code(dtype, where=collective), int(redop or 0), count, root)
        costs = (self._rc.cost_model.call_costs(fn, self.size, count, root, itemsize, self._world_ranks, dtype=dtype.name,
                                                op=op)[self._rank]
                 if self._rc.modeled else None)
        nbytes = count * itemsize * (self.size if kind is OpKind.REDUCE_SCATTER else 1)
        return _Call(collective, name, fn(self._rank, self.size, count, root), costs, UFUNCS.get(redop), nbytes,
                     CallContext(self._id, self.name, 0, sig, self._world_ranks, self._rank, ALL_ALGOS, self._timeout_s), dtype.name)

    def _remember(self, key: tuple, call: "_Call") -> "_Call":
        if len(self._calls) >= 1024:  # a program with ever-new shapes keeps the latest ones
            self._calls.clear()
        self._calls[key] = call
        return call

    def _run_call(self, call: "_Call", bufs, dtype: np.dtype, seq: int | None = None) -> None:
        engine = self._engine
        if not engine.busy.acquire(False):
            op, seq, comm, thread = engine.busy_with
            raise HcclParamError(
                f"{call.collective} on communicator '{self.name}' (thread {threading.get_ident()}): this rank's "
                f"communicators are in use by another thread ({op} #{seq} on '{comm}' in thread {thread}); a rank's "
                "communicators belong to one thread at a time (as in HCCL and NCCL): call them from one thread, or "
                "serialize the calls with a lock")
        try:
            if seq is None:
                self._seq += 1
                seq = self._seq
            schedule = call.schedule
            tmp = self._rc.scratch(schedule.tmp_count, dtype) if schedule.tmp_count else None
            rc = self._rc
            device = rc.device
            ctx = call.ctx
            ctx.seq = seq
            engine.busy_with = (call.collective, seq & ~P2P_SEQ_BIT, self.name, threading.get_ident())
            record = rc.recorder.enter(CallRecord(self.name, seq & ~P2P_SEQ_BIT, call.collective, call.algo, call.dtype_name or dtype.name,
                                                  call.ctx.sig.count, call.nbytes, self._world_ranks, device.clock, time.monotonic()))
            if rc.pending_faults:
                rc.inject(record)
            try:
                engine.run(ctx, schedule, (bufs[0], bufs[1], tmp), call.ufunc, call.costs, device)
            except HcclError as err:
                rc.recorder.fail(record, err, device.clock, time.monotonic())
                self.abort(f"{ctx.what} failed: {err.message}")
                if call.notify_on_timeout and isinstance(err, HcclTimeoutError):
                    engine.notify(ctx, err)
                rc.dump(f"{type(err).__name__} in {ctx.what}")
                raise
            rc.recorder.complete(record, device.clock, time.monotonic())
        finally:
            engine.busy.release()

    # -- collectives -----------------------------------------------------------------------------------
    def all_reduce(self, x: np.ndarray, op: ReduceOp | str = "sum", *, algo: str = "auto") -> np.ndarray:
        """Reduce ``x`` over all ranks, in place; returns ``x`` (``HcclAllReduce``).

        >>> comm.all_reduce(np.ones(3, np.float32))   # doctest: +SKIP
        array([4., 4., 4.], dtype=float32)            # with 4 ranks
        """
        what = f"all_reduce on '{self.name}'"
        self._check_usable(what)
        x = self._array(x, what, writable=True)
        redop = self._op(op, x.dtype, what)
        flat = x.reshape(-1)
        self._collective(OpKind.ALLREDUCE, "allreduce", algo, (flat, flat), flat.size, x.dtype, redop)
        return x

    def all_gather(self, x: np.ndarray, *, out: np.ndarray | None = None, algo: str = "auto") -> np.ndarray:
        """Gather every rank's ``x`` into an array of shape ``(size, *x.shape)`` (``HcclAllGather``).

        ``out`` (``HcclAllGather``'s recvBuf): a C-contiguous, writable array of ``size * x.size``
        elements of ``x``'s dtype to gather into, reused across calls; otherwise a new array.
        Returns the result, shaped ``(size, *x.shape)``::

            buf = np.empty((comm.size, 1024), np.float32)
            comm.all_gather(x, out=buf)
        """
        what = f"all_gather on '{self.name}'"
        self._check_usable(what)
        x = self._array(x, what, writable=False)
        flat = np.ascontiguousarray(x).reshape(-1)
        result = self._out(out, self.size * flat.size, x.dtype, what)
        flat = _apart_from(flat, result)
        self._collective(OpKind.ALLGATHER, "allgather", algo, (flat, result.reshape(-1)), flat.size, x.dtype)
        return result.reshape((self.size, *x.shape))

    def broadcast(self, x: np.ndarray, root: int = 0, *, algo: str = "auto") -> np.ndarray:
        """Copy root's ``x`` into ``x`` on every rank, in place; returns ``x`` (``HcclBroadcast``)."""
        what = f"broadcast on '{self.name}'"
        self._check_usable(what)
        x = self._array(x, what, writable=True)
        root = self._root(root, what)
        flat = x.reshape(-1)
        self._collective(OpKind.BROADCAST, "broadcast", algo, (flat, flat), flat.size, x.dtype, root=root)
        return x

    def reduce(self, x: np.ndarray, root: int = 0, op: ReduceOp | str = "sum", *, algo: str = "auto") -> np.ndarray:
        """Reduce ``x`` over all ranks into ``x`` on ``root``, in place (``HcclReduce``).

        Other ranks' ``x`` is left untouched. Returns ``x``.
        """
        what = f"reduce on '{self.name}'"
        self._check_usable(what)
        x = self._array(x, what, writable=True)
        root = self._root(root, what)
        redop = self._op(op, x.dtype, what)
        flat = x.reshape(-1)
        self._collective(OpKind.REDUCE, "reduce", algo, (flat, flat), flat.size, x.dtype, redop, root)
        return x

    def reduce_scatter(self, y: np.ndarray, op: ReduceOp | str = "sum", *, out: np.ndarray | None = None,
                       algo: str = "auto") -> np.ndarray:
        """Reduce ``y`` over all ranks and return this rank's block (``HcclReduceScatter``).

        ``y.size`` must divide by ``size``. The result has shape ``(y.shape[0] // size, *y.shape[1:])``
        when the first axis divides, else ``(y.size // size,)``; ``out`` (recvBuf): a C-contiguous,
        writable array of ``y.size // size`` elements to write it into instead of a new array.
        """
        what = f"reduce_scatter on '{self.name}'"
        self._check_usable(what)
        y = self._array(y, what, writable=False)
        redop = self._op(op, y.dtype, what)
        if y.size % self.size:
            raise HcclParamError(f"{what}: y.size={y.size} is not divisible by the communicator size {self.size}")
        count = y.size // self.size
        shape = (y.shape[0] // self.size, *y.shape[1:]) if y.ndim >= 1 and y.shape[0] % self.size == 0 else (count,)
        result = self._out(out, count, y.dtype, what)
        flat = _apart_from(np.ascontiguousarray(y).reshape(-1), result)
        self._collective(OpKind.REDUCE_SCATTER, "reduce_scatter", algo, (flat, result.reshape(-1)), count, y.dtype, redop)
        return result.reshape(shape)

    def _out(self, out: np.ndarray | None, count: int, dtype: np.dtype, what: str) -> np.ndarray:
        """The caller's output buffer, checked, or a new one."""
        if out is None:
            return np.empty(count, dtype)
        out = self._array(out, f"{what} (out=)", writable=True)
        if out.dtype != dtype or out.size != count:
            raise HcclParamError(f"{what}: out= must hold {count} elements of {dtype}, got {out.size} of {out.dtype}")
        return out

    def barrier(self, *, monitored: bool = False) -> None:
        """Return once every rank of the communicator has entered the barrier (``HcclBarrier``).

        ``monitored=True`` (like torch's ``monitored_barrier``): every rank reports to rank 0,
        which releases them; when ``HCCL_EXEC_TIMEOUT`` expires, rank 0's error names *every*
        missing rank, and the other ranks raise with rank 0's finding::

            comm.barrier(monitored=True)   # HcclTimeoutError: ... Waiting peer rank(s): 2, 3
        """
        what = f"barrier on '{self.name}'"
        self._check_usable(what)
        algo = "monitored" if monitored else "dissemination"
        call = self._calls.get(("barrier", algo))
        if call is None:
            call = self._prepare(OpKind.BARRIER, "barrier", algo, 0, _BYTE, None, 0)
            if monitored:
                # Rank 0 names the missing ranks and tells the others; they wait a little
                # longer than rank 0 so that its finding, not their own timeout, reaches them.
                timeout = None if self._timeout_s is None else (self._timeout_s if self._rank == 0 else self._timeout_s + 2.0)
                call = call._replace(notify_on_timeout=self._rank == 0, ctx=dataclasses.replace(call.ctx, timeout_s=timeout))
            call = self._remember(("barrier", algo), call)
        self._run_call(call, (_NO_DATA, _NO_DATA), _BYTE)

    # -- point to point ---------------------------------------------------------------------------------
    def send(self, x: np.ndarray, dst: int) -> None:
        """Send ``x`` to rank ``dst``, which posts a matching :meth:`recv` (``HcclSend``).

        Returns once the data has been handed over (copied out of ``x``); a large message
        waits for the receiver to drain it, as MPI's rendezvous protocol does.
        """
        what = f"send on '{self.name}'"
        self._check_usable(what)
        x = self._array(x, what, writable=False)
        dst = self._root(dst, what, "dst")
        if dst == self._rank:
            raise HcclParamError(f"{what}: dst={dst} is this rank; send to another rank")
        flat = np.ascontiguousarray(x).reshape(-1)
        seq = P2P_SEQ_BIT | self._next_p2p(self._p2p_sent, dst)
        self._run_call(self._p2p_call("send", flat.size, x.dtype, dst), (flat, flat), x.dtype, seq)

    def recv(self, x: np.ndarray, src: int) -> np.ndarray:
        """Receive into ``x`` from rank ``src``'s matching :meth:`send`, in place; returns ``x``."""
        what = f"recv on '{self.name}'"
        self._check_usable(what)
        x = self._array(x, what, writable=True)
        src = self._root(src, what, "src")
        if src == self._rank:
            raise HcclParamError(f"{what}: src={src} is this rank; receive from another rank")
        flat = x.reshape(-1)
        seq = P2P_SEQ_BIT | self._next_p2p(self._p2p_received, src)
        self._run_call(self._p2p_call("recv", flat.size, x.dtype, src), (flat, flat), x.dtype, seq)
        return x

    def _p2p_call(self, kind: str, count: int, dtype: np.dtype, peer: int) -> "_Call":
        key = (kind, count, dtype, peer)
        call = self._calls.get(key)
        if call is None:
            sending = kind == "send"
            src, dst = (self._rank, peer) if sending else (peer, self._rank)
            sig = CallSignature(OpKind.SEND, 0, dtype_code(dtype, where=kind), 0, count, src)
            costs = (self._rc.cost_model.p2p_costs(self._world_ranks[src], self._world_ranks[dst], count * dtype.itemsize, sender=sending)
                     if self._rc.modeled else None)
            schedule = p2p.send_schedule(count, peer) if sending else p2p.recv_schedule(count, peer)
            ctx = CallContext(self._id, self.name, 0, sig, self._world_ranks, self._rank, ALL_ALGOS, self._timeout_s)
            call = self._remember(key, _Call(kind, "p2p", schedule, costs, None, count * dtype.itemsize, ctx, dtype.name))
        return call

    @staticmethod
    def _next_p2p(counters: dict[int, int], peer: int) -> int:
        # The n-th send to a peer is its n-th receive from us: both sides count one direction,
        # and the mailbox key carries the sender, so the two directions never collide.
        counters[peer] = counters.get(peer, 0) + 1
        return counters[peer]

    # -- sub-communicators ---------------------------------------------------------------------------------
    def split(self, color: int | None, key: int = 0) -> "Communicator | None":
        """Partition by ``color`` (``MPI_Comm_split``); ranks ordered by ``key`` then rank.

        Every rank calls it; a rank with ``color=None`` takes part but gets ``None``::

            sub = comm.split(color=comm.rank % 2, key=comm.rank)
        """
        what = f"split on '{self.name}'"
        self._check_usable(what)
        for name, value in (("color", color), ("key", key)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))):
                raise HcclParamError(f"{what}: {name} must be an int{' or None' if name == 'color' else ''}, got {value!r}")
        if color is not None and color < 0:
            raise HcclParamError(f"{what}: color must be >= 0 or None, got {color}")
        mine = np.array([-1 if color is None else color, key], np.int64)
        table = self.all_gather(mine)
        seq = self._seq
        if color is None:
            return None
        members = sorted((int(k), r) for r, (c, k) in enumerate(table) if c == color)
        ranks = [r for _, r in members]
        return self._child(ranks, _comm_id(self._id, seq, "split", int(color)), f"{self.name}/split({color})")

    def create_group(self, ranks: Sequence[int]) -> "Communicator | None":
        """A communicator of ``ranks`` (ranks of this communicator, in that order).

        Like ``HcclCreateSubCommConfig``: every rank of this communicator calls it with the
        same list; ranks outside the list get ``None``::

            grp = comm.create_group([0, 2])
        """
        what = f"create_group on '{self.name}'"
        self._check_usable(what)
        try:
            ranks = [int(r) for r in ranks]
        except (TypeError, ValueError):
            raise HcclParamError(f"{what}: ranks must be a sequence of ints, got {ranks!r}") from None
        if not ranks:
            raise HcclParamError(f"{what}: ranks is empty; a group needs at least one rank")
        for r in ranks:
            self._root(r, what, "rank")
        if len(set(ranks)) != len(ranks):
            raise HcclParamError(f"{what}: ranks {ranks} lists a rank twice")
        seq = self._agree(what, ranks, "rank list")
        if self._rank not in ranks:
            return None
        return self._child(ranks, _comm_id(self._id, seq, "group", tuple(ranks)), f"{self.name}/group{ranks}")

    def create_groups(self, groups: "str | Sequence[Sequence[int]]" = "auto") -> "Communicator":
        """Partition this communicator into groups in one call; returns this rank's group.

        ``groups`` is ``"auto"`` (HCCL's rule on the topology: by server, then by HCCS island,
        otherwise consecutive ranks), a list of rank lists, or the text form ``"0,2;1,3"``.
        Every rank must pass the same partition; each rank must appear exactly once::

            pair = comm.create_groups([[0, 2], [1, 3]])
        """
        what = f"create_groups on '{self.name}'"
        self._check_usable(what)
        partition = self._partition_of(groups, what)
        seq = self._agree(what, partition, "partition")
        index = next(i for i, group in enumerate(partition) if self._rank in group)
        mine = list(partition[index])
        return self._child(mine, _comm_id(self._id, seq, "groups", index, tuple(mine)), f"{self.name}/groups[{index}]")

    def _partition_of(self, groups: "str | Sequence[Sequence[int]]", what: str) -> list[list[int]]:
        """``groups`` ("auto", rank lists or "0,2;1,3"; a file path too) as a checked partition."""
        try:
            if isinstance(groups, str) and groups.strip().lower() == "auto":
                by_world = auto_partition(self._rc.topology, list(self._world_ranks))
                return [[self._world_ranks.index(w) for w in group] for group in by_world]
            partition = load_partition(groups, self.size) if isinstance(groups, str) else groups
            return validate_partition(partition, self.size)
        except TopologyError as err:
            raise HcclParamError(f"{what}: {err}") from None

    @property
    def partition(self) -> tuple[tuple[int, ...], ...]:
        """The groups ``algo="hier"`` runs on (ranks of this communicator): the last
        :meth:`set_partition`, by default HCCL's automatic grouping of this communicator."""
        if self._partition is None:
            self._partition = tuple(tuple(g) for g in self._partition_of("auto", f"partition of '{self.name}'"))
        return self._partition

    def set_partition(self, groups: "str | Sequence[Sequence[int]]" = "auto") -> None:
        """Set the groups of this communicator's hierarchical collectives (``algo="hier"``):
        ``"auto"``, a list of rank lists, ``"0,2;1,3"`` or a file. Every rank calls it with the
        same partition (checked with one small all_gather)::

            comm.set_partition("1,2;0,3")
            comm.all_reduce(x, algo="hier")     # reduce-scatter in {1,2} and {0,3}, allreduce across, allgather
        """
        what = f"set_partition on '{self.name}'"
        self._check_usable(what)
        partition = self._partition_of(groups, what)
        self._agree(what, partition, "partition")
        self._partition = tuple(tuple(g) for g in partition)
        self._calls = {key: call for key, call in self._calls.items() if not call.algo.startswith("hier")}

    def _agree(self, what: str, value, name: str) -> int:
        """Check that every rank passed the same ``value`` (one small allgather); returns the
        call's sequence number, which names the communicators made from it."""
        digest = np.frombuffer(hashlib.blake2b(repr(value).encode(), digest_size=8).digest(), np.int64)
        digests = self.all_gather(digest.copy()).reshape(-1)
        differ = [r for r in range(self.size) if digests[r] != digests[0]]
        if differ:
            raise HcclParamError(f"{what}: ranks {differ} passed a different {name} than rank 0; every rank must pass the same {name}")
        return self._seq

    def _child(self, ranks: list[int], comm_id: int, name: str) -> "Communicator":
        return Communicator(self._rc, [self._world_ranks[r] for r in ranks], ranks.index(self._rank), comm_id, name)
