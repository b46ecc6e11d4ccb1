"""The public communicator: argument checks, call signatures, algorithm choice; its sends and
receives (point_to_point.py), its all-to-all with counts per pair (alltoallv.py) and
sub-communicators (subgroups.py) are mixins of this one class.

Every argument is checked before a byte moves, so bad input never hangs a peer or half-writes
a buffer. Names follow HCCL's operators in Python style (``HcclAllReduce`` -> ``all_reduce``).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from topology import Topology

from ..algorithms.registry import algo_code
from ..choice import names as algo_names
from ..choice import select as algo_select
from ..collectives import CallSpec, OpKind, blocks_count
from ..collectives import collective as collective_named
from ..dtypes import DTYPE_CODES, UFUNCS, ReduceOp, check_op_dtype, dtype_code, signature_redop, then_code
from ..engine.context import RankContext
from ..engine.issuing import Call, Issuer, entry
from ..engine.run import quiet_floats
from ..errors import HcclError, HcclParamError
from ..modeled.card import Device
from ..records import CommStats
from ..transport.base import CallSignature
from .alltoallv import AllToAllV
from .alltoallv_args import whole
from .point_to_point import PointToPoint
from .subgroups import SubGroups

_CHECKED_OPS: dict[tuple, ReduceOp] = {}  # (op as passed, dtype) -> ReduceOp, for pairs that passed the checks
_BYTE = np.dtype(np.uint8)
_NO_DATA = np.empty(0, _BYTE)


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


class Communicator(AllToAllV, PointToPoint, SubGroups):
    """A group of ranks that run collectives together (an ``HcclComm``).

    Obtain the world communicator from :func:`hccl_py.init`; derive others with
    :meth:`split` or :meth:`create_group`. Usable as a context manager (destroys on exit)::

        with hccl_py.init() as comm:
            x = np.full(4, comm.rank, np.float32)
            comm.all_reduce(x)          # x == sum of ranks on every rank
    """

    def __init__(
        self,
        rc: RankContext,
        world_ranks: Sequence[int],
        comm_rank: int,
        comm_id: int,
        name: str,
        *,
        on_destroy=None,
        timeout_s: float | None | str = "job",
    ):
        self._rc = rc
        self._engine = rc.engine
        self._world_ranks = tuple(world_ranks)
        self._rank = comm_rank
        self._id = comm_id
        self.name = name
        self._algo_env = rc.algo_env
        self._calls: dict[tuple, Call] = {}  # per call request (CallSpec): algorithm, schedule, costs, signature
        self._v_names: dict[tuple[str, bool], str] = {}  # (algo, AlltoAllV?) -> what an all-to-all-v runs
        self._on_destroy = on_destroy
        self._partition: tuple[tuple[int, ...], ...] | None = None  # groups of algo="hier"; None: auto
        # The call path: numbers, closing, refusals and notices, issuing (public for adapters).
        self.issuer = Issuer(
            rc, comm_id, name, self._world_ranks, comm_rank, rc.exec_timeout_s if timeout_s == "job" else timeout_s
        )

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

    @property
    def timeout_s(self) -> float | None:
        """Seconds any wait inside this communicator's calls may take (``HCCL_EXEC_TIMEOUT``; None: no limit)."""
        return self.issuer.timeout_s

    @property
    def closed_reason(self) -> str | None:
        """Why the communicator can no longer be used (``"was destroyed"``, ``"was aborted (...)"``), or None."""
        return self.issuer.closed_reason

    # -- lifecycle -------------------------------------------------------------------------------
    def abort(self, reason: str = "abort() was called") -> None:
        """Stop using this communicator: pending messages are dropped, later calls fail at once."""
        self.issuer.abort(reason)

    def destroy(self) -> None:
        """Release the communicator (``HcclCommDestroy``); later calls fail at once. Calls still
        queued on it finish first. Raises a failure a peer reported that no call of this rank has
        raised yet, after releasing."""
        unreported = self.issuer.close(f"destroy of communicator '{self.name}'")
        if self._on_destroy is not None:
            callback, self._on_destroy = self._on_destroy, None
            callback()
        if unreported is not None:
            raise unreported

    @entry(None)
    def refuse(self, error: HcclError, *, send_to: int | None = None, recv_from: int | None = None) -> None:
        """Refuse this rank's next call on every rank that takes part, with ``error``: for an
        adapter that checks arguments of its own before it calls the communicator (torch's
        process group). As a refusal of the communicator's own, it spends the call's number (the
        next collective's; with ``send_to`` the next send to that rank) and the other ranks'
        matching call fails with ``error``; the communicator stays usable. A refused receive
        (``recv_from``) consumes nothing: the peer's message waits for the next receive from it.
        The caller raises ``error`` itself::

            except HcclParamError as err:
                comm.refuse(err)
                raise
        """
        if send_to is not None:
            self.issuer.refuse("send", (None, send_to), {}, error)
        elif recv_from is not None:
            self.issuer.refuse("recv", (None, recv_from), {}, error)
        else:
            self.issuer.refuse("collective", (), {}, error)

    # -- argument checks ---------------------------------------------------------------------------
    def _bad(self, what: str, message: str, **fields) -> HcclParamError:
        """HcclParamError for input to ``what`` that is rejected before anything moves; ``fields``
        name it (``arg``, ``value``, ``rule``, ...)."""
        return HcclParamError(f"{what}: {message}", **self.issuer.fields(what), **fields)

    def _array(self, x, what: str, *, writable: bool, arg: str = "x") -> np.ndarray:
        if not isinstance(x, np.ndarray):
            raise self._bad(
                what,
                f"buffer must be a numpy.ndarray, got {type(x).__name__}",
                arg=arg,
                rule="type",
                expected="numpy.ndarray",
            )
        if x.dtype not in DTYPE_CODES:  # (a dict lookup: this runs on every call)
            try:
                dtype_code(x.dtype, where=what)
            except HcclParamError as err:
                raise HcclParamError(err.message, **self.issuer.fields(what), arg=arg, **err.fields) from None
        if writable:
            flags = x.flags
            if not flags.c_contiguous:
                raise self._bad(
                    what,
                    "buffer must be C-contiguous (it is written in place); pass np.ascontiguousarray(x) and copy back",
                    arg=arg,
                    rule="contiguous",
                )
            if not flags.writeable:
                raise self._bad(
                    what, "buffer is read-only but the operation writes it in place", arg=arg, rule="writable"
                )
        return x

    def _root(self, root, what: str, name: str = "root") -> int:
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < self.size:
            raise self._bad(
                what,
                f"{name}={root!r} is not a rank of communicator '{self.name}' (0..{self.size - 1})",
                arg=name,
                value=root.item() if isinstance(root, np.generic) else root,
                rule="range",
                expected=f"0..{self.size - 1}",
            )
        return int(root)

    def _op(self, op, dtype: np.dtype, what: str) -> ReduceOp:
        try:
            return _CHECKED_OPS[(op, dtype)]
        except (KeyError, TypeError):
            pass
        try:
            redop = ReduceOp.parse(op)
            check_op_dtype(redop, dtype, where=what)
        except HcclParamError as err:
            message = err.message if err.message.startswith(what) else f"{what}: {err.message}"
            raise HcclParamError(message, **self.issuer.fields(what), **err.fields) from None
        if isinstance(op, (str, ReduceOp)):
            _CHECKED_OPS[(op, dtype)] = redop
        return redop

    def _then(self, then: str, what: str) -> int:
        """The signature code of a reduction's ``then`` (``dtypes.then_code``; "" at once: the
        common case), refused with this call's fields."""
        if not then:
            return 0
        try:
            return then_code(then, where=what)
        except HcclParamError as err:
            raise HcclParamError(err.message, **self.issuer.fields(what), **err.fields) from None

    # -- the call path: one for every operation --------------------------------------------------
    def _collective(self, spec: CallSpec, bufs, result, async_op: bool = False):
        """Issue the call ``spec`` on ``bufs`` (flat IN and OUT), its plan prepared once per spec;
        returns ``result`` (or the Work)."""
        call = self._calls.get(spec)
        if call is None:
            call = self._remember(spec, self._prepare(spec))
        return self.issuer.issue(call, bufs, result, async_op)

    def _prepare(self, spec: CallSpec, fn=None, sig_count: int | None = None) -> Call:
        """Everything about the call ``spec`` that depends only on it (not on the buffers): its
        algorithm, schedule, costs and signature, resolved once. ``fn``: a schedule function of
        the caller's (all-to-all with counts per pair; ``spec.algo`` names it), else the one
        ``spec.algo`` resolves to; ``sig_count``: the count peers check (default ``spec.count``)."""
        rc = self._rc
        collective, count, root, dtype = spec.collective, spec.count, spec.root, spec.dtype
        if fn is None:
            name = algo_names.resolve(
                collective,
                spec.algo,
                lambda level1=None: algo_select.auto(
                    rc.cost_model, spec, self._world_ranks, level1, deterministic=rc.deterministic
                ),
                self._algo_env,
            )
            # auto's two-level algorithms run on HCCL's partition (@server, @groups), a plain hier: on ours
            fn = algo_names.schedule_fn(rc.topology, collective, name, self._world_ranks, lambda: self.partition)
        else:
            name = spec.algo
        sig = CallSignature(
            spec.kind,
            algo_code(name, getattr(fn, "__qualname__", "") + repr(getattr(fn, "staged", None))),
            dtype_code(dtype, where=collective),
            signature_redop(spec.op, spec.then),
            count if sig_count is None else sig_count,
            root,
        )
        costs = (
            rc.cost_model.call_costs(fn, spec, self._world_ranks)[self._rank] if rc.modeled and spec.modeled else None
        )
        schedule = fn(self._rank, self.size, count, root)
        in_count, out_count = (
            fn.buffer_counts(self._rank)
            if hasattr(fn, "buffer_counts")
            else collective_named(collective).buffer_counts(self.size, count, self._rank, root)
        )
        nbytes = (in_count or out_count) * dtype.itemsize  # the call's input on this rank (what it receives if none)
        ufunc = UFUNCS.get(spec.op)
        return Call(
            collective,
            name,
            schedule,
            costs,
            ufunc,
            nbytes,
            self.issuer.context(sig),
            dtype,
            dtype.name,
            quiet=quiet_floats(ufunc, dtype),
        )

    def _remember(self, key: tuple, call: Call) -> Call:
        if len(self._calls) >= 1024:  # a program with ever-new shapes keeps the latest ones
            self._calls.clear()
        self._calls[key] = call
        return call

    # -- collectives -----------------------------------------------------------------------------------
    @entry("collective")
    def all_reduce(
        self,
        x: np.ndarray,
        op: ReduceOp | str = "sum",
        *,
        out: np.ndarray | None = None,
        algo: str = "auto",
        async_op: bool = False,
        then: str = "",
    ):
        """Reduce ``x`` over all ranks (``HcclAllReduce``): in place by default, returning ``x``;
        into ``out`` (HCCL's recvBuf) when given, returning ``out``. ``async_op=True`` returns a
        :class:`~hccl_py.work.Work` at once (``wait()`` gives the result). ``then``: what the caller
        does to the result afterwards, which every rank must share (``"average"``: it divides it by
        the group size, as torch's AVG over HCCL; the call itself reduces with ``op``); ranks that
        disagree fail with a call mismatch, as for ``op`` (also on :meth:`reduce` and
        :meth:`reduce_scatter`)::

            comm.all_reduce(np.ones(3, np.float32))      # array([4., 4., 4.]) with 4 ranks
        """
        what = f"all_reduce on '{self.name}'"
        self.issuer.check_usable(what)
        x = self._array(x, what, writable=out is None)
        redop = self._op(op, x.dtype, what)
        target = x if out is None else self._into(out, x, what)
        flat = target.reshape(-1)
        step = self._then(then, what)
        spec = CallSpec("allreduce", OpKind.ALLREDUCE, algo, flat.size, x.dtype, redop, then=step)
        return self._collective(spec, (flat, flat), target, async_op)

    @entry("collective", name="all_reduce")
    def all_reduce_flat(self, flat: np.ndarray, redop: ReduceOp, what: str, then: int = 0) -> None:
        """Blocking, in-place ``all_reduce(flat, redop)`` without :meth:`all_reduce`'s argument
        checks, for an adapter that made the buffer and the op itself: ``flat`` a 1-D, C-contiguous,
        writable array of a dtype ``redop`` takes (the torch process group's float32 path).
        ``what`` names the call as all_reduce would ("all_reduce on 'world'"); ``then`` the code
        of all_reduce's ``then`` (``dtypes.then_code``)::

            comm.all_reduce_flat(buf, ReduceOp.SUM, "all_reduce on 'world'")
        """
        self.issuer.check_usable(what)
        self._collective(
            CallSpec("allreduce", OpKind.ALLREDUCE, "auto", flat.size, flat.dtype, redop, then=then), (flat, flat), flat
        )

    @entry("collective")
    def all_gather(self, x: np.ndarray, *, out: np.ndarray | None = None, algo: str = "auto", async_op: bool = False):
        """Gather every rank's ``x`` into an array of shape ``(size, *x.shape)`` (``HcclAllGather``).

        ``out`` (``HcclAllGather``'s recvBuf): a C-contiguous, writable array of ``size * x.size``
        elements of ``x``'s dtype to gather into, reused across calls; otherwise a new array.
        ``x`` may be this rank's block of ``out`` (NCCL's in-place form). Returns the result,
        shaped ``(size, *x.shape)``::

            buf = np.empty((comm.size, 1024), np.float32)
            comm.all_gather(x, out=buf)
        """
        what = f"all_gather on '{self.name}'"
        self.issuer.check_usable(what)
        x = self._array(x, what, writable=False)
        flat = np.ascontiguousarray(x).reshape(-1)
        result = self._out(out, self.size * flat.size, x.dtype, what)
        flat = _apart_from(flat, result)
        spec = CallSpec("allgather", OpKind.ALLGATHER, algo, flat.size, x.dtype)
        return self._collective(spec, (flat, result.reshape(-1)), result.reshape((self.size, *x.shape)), async_op)

    @entry("collective")
    def all_gather_v(
        self, x: np.ndarray, counts, *, out: np.ndarray | None = None, algo: str = "auto", async_op: bool = False
    ):
        """Gather blocks of another size per rank (``HcclAllGatherV``; torch_npu's uneven
        all_gather): rank i's ``x`` holds ``counts[i]`` elements, and every rank passes the same
        ``counts`` (ranks whose lists differ fail with a call mismatch, even where the largest
        count agrees). The blocks travel padded to the largest count, as one allgather of that
        count (its modeled time too). Returns the rows, shape ``(size, max(counts))``, into ``out``
        when given: row i's first ``counts[i]`` elements are rank i's block, the rest zeros::

            rows = comm.all_gather_v(x, [3, 1, 2, 2])
            blocks = [rows[i, :n] for i, n in enumerate([3, 1, 2, 2])]
        """
        what = f"all_gather_v on '{self.name}'"
        self.issuer.check_usable(what)
        x = self._array(x, what, writable=False)
        counts = self._block_counts(counts, what, own=x.size)
        width = max(counts)
        padded = np.zeros(width, x.dtype)
        padded[: x.size] = x.reshape(-1)
        result = self._out(out, self.size * width, x.dtype, what)
        call = self._blocks_call("allgather", OpKind.ALLGATHER, algo, counts, x.dtype, None)
        return self.issuer.issue(call, (padded, result.reshape(-1)), result.reshape(self.size, width), async_op)

    def _block_counts(self, counts, what: str, *, own: int | None = None) -> tuple[int, ...]:
        """A v-call's counts: one whole non-negative number per rank (this rank's ``own``, if given)."""
        try:
            found = tuple(whole(c) for c in counts)
        except (TypeError, ValueError):
            raise self._bad(what, f"counts must be {self.size} whole numbers", arg="counts", rule="type") from None
        if len(found) != self.size or min(found, default=0) < 0:
            raise self._bad(
                what,
                f"counts must be {self.size} non-negative counts, one per rank; got {list(found)}",
                arg="counts",
                rule="shape",
                expected=self.size,
            )
        if own is not None and found[self._rank] != own:
            raise self._bad(
                what,
                f"counts[{self._rank}]={found[self._rank]} but this rank's block holds {own} elements",
                arg="counts",
                value=found[self._rank],
                expected=own,
                rule="own",
            )
        return found

    def _blocks_call(self, collective: str, kind: OpKind, algo: str, counts: tuple, dtype, redop, then=0) -> Call:
        """The call of blocks padded to the largest of ``counts``, whose signature carries the
        counts (``blocks_count``): a rank with another list is a call mismatch."""
        key = ("blocks", collective, algo, counts, dtype, redop, then)
        call = self._calls.get(key)
        if call is None:
            spec = CallSpec(collective, kind, algo, max(counts), np.dtype(dtype), redop, then=then)
            call = self._remember(key, self._prepare(spec, sig_count=blocks_count(counts)))
        return call

    @entry("collective")
    def broadcast(
        self, x: np.ndarray, root: int = 0, *, out: np.ndarray | None = None, algo: str = "auto", async_op: bool = False
    ):
        """Copy root's ``x`` to every rank (``HcclBroadcast``): in place by default, returning
        ``x``; into ``out`` when given (on the root ``out`` gets a copy of ``x``), returning ``out``."""
        what = f"broadcast on '{self.name}'"
        self.issuer.check_usable(what)
        x = self._array(x, what, writable=out is None)
        root = self._root(root, what)
        target = x if out is None else self._into(out, x, what, copy=self._rank == root)
        flat = target.reshape(-1)
        spec = CallSpec("broadcast", OpKind.BROADCAST, algo, flat.size, x.dtype, None, root)
        return self._collective(spec, (flat, flat), target, async_op)

    @entry("collective")
    def reduce(
        self,
        x: np.ndarray,
        root: int = 0,
        op: ReduceOp | str = "sum",
        *,
        out: np.ndarray | None = None,
        algo: str = "auto",
        async_op: bool = False,
        then: str = "",
    ):
        """Reduce ``x`` over all ranks onto ``root`` (``HcclReduce``): in place by default
        (returns ``x``), into ``out`` on the root when given (returns ``out``). Other ranks' ``x``
        and ``out`` are left untouched."""
        what = f"reduce on '{self.name}'"
        self.issuer.check_usable(what)
        x = self._array(x, what, writable=out is None and self._rank == root)
        root = self._root(root, what)
        redop = self._op(op, x.dtype, what)
        if out is None:
            target = result = x
        elif self._rank == root:
            target = result = self._into(out, x, what)
        else:  # a non-root rank only reads its input
            result = self._into(out, x, what, copy=False)
            target = x
        flat = np.ascontiguousarray(target).reshape(-1)
        step = self._then(then, what)
        spec = CallSpec("reduce", OpKind.REDUCE, algo, flat.size, x.dtype, redop, root, then=step)
        return self._collective(spec, (flat, flat), result, async_op)

    @entry("collective")
    def reduce_scatter(
        self,
        y: np.ndarray,
        op: ReduceOp | str = "sum",
        *,
        out: np.ndarray | None = None,
        algo: str = "auto",
        async_op: bool = False,
        then: str = "",
    ):
        """Reduce ``y`` over all ranks and return this rank's block (``HcclReduceScatter``).

        ``y.size`` must divide by ``size``. The result has shape ``(y.shape[0] // size, *y.shape[1:])``
        when the first axis divides, else ``(y.size // size,)``; ``out`` (recvBuf): a C-contiguous,
        writable array of ``y.size // size`` elements to write it into instead of a new array (it
        may be this rank's block of ``y``, NCCL's in-place form).
        """
        what = f"reduce_scatter on '{self.name}'"
        self.issuer.check_usable(what)
        y = self._array(y, what, writable=False, arg="y")
        redop = self._op(op, y.dtype, what)
        if y.size % self.size:
            raise self._bad(
                what,
                f"y.size={y.size} is not divisible by the communicator size {self.size}",
                arg="y.size",
                value=y.size,
                rule="divisible",
                expected=self.size,
            )
        count = y.size // self.size
        shape = (y.shape[0] // self.size, *y.shape[1:]) if y.ndim >= 1 and y.shape[0] % self.size == 0 else (count,)
        result = self._out(out, count, y.dtype, what)
        flat = _apart_from(np.ascontiguousarray(y).reshape(-1), result)
        step = self._then(then, what)
        spec = CallSpec("reduce_scatter", OpKind.REDUCE_SCATTER, algo, count, y.dtype, redop, then=step)
        return self._collective(spec, (flat, result.reshape(-1)), result.reshape(shape), async_op)

    @entry("collective")
    def reduce_scatter_v(
        self,
        y: np.ndarray,
        counts,
        op: ReduceOp | str = "sum",
        *,
        out: np.ndarray | None = None,
        algo: str = "auto",
        async_op: bool = False,
        then: str = "",
    ):
        """Reduce blocks of another size per rank and give rank i the reduction of every rank's
        block i (``HcclReduceScatterV``; torch_npu's uneven reduce_scatter): ``y`` holds the blocks
        packed in rank order, ``counts[i]`` elements each, the same ``counts`` on every rank
        (ranks whose lists differ fail with a call mismatch). The blocks travel padded to the
        largest count, as one reduce_scatter of that count. Returns this rank's block
        (``counts[rank]`` elements), into ``out`` when given (``max(counts)`` elements, this rank's
        block first); ``then`` as :meth:`all_reduce`'s::

            mine = comm.reduce_scatter_v(y, [3, 1, 2, 2])
        """
        what = f"reduce_scatter_v on '{self.name}'"
        self.issuer.check_usable(what)
        y = self._array(y, what, writable=False, arg="y")
        redop = self._op(op, y.dtype, what)
        counts = self._block_counts(counts, what)
        if sum(counts) != y.size:
            raise self._bad(
                what,
                f"y holds {y.size} elements but the counts add up to {sum(counts)}",
                arg="y.size",
                value=y.size,
                expected=sum(counts),
                rule="size",
            )
        width = max(counts)
        padded = np.zeros((self.size, width), y.dtype)
        flat, start = y.reshape(-1), 0
        for row, n in zip(padded, counts):
            row[:n] = flat[start : start + n]
            start += n
        result = self._out(out, width, y.dtype, what)
        step = self._then(then, what)
        call = self._blocks_call("reduce_scatter", OpKind.REDUCE_SCATTER, algo, counts, y.dtype, redop, step)
        mine = result.reshape(-1)[: counts[self._rank]]
        return self.issuer.issue(call, (padded.reshape(-1), result.reshape(-1)), mine, async_op)

    @entry("collective")
    def all_to_all(self, x: np.ndarray, *, out: np.ndarray | None = None, algo: str = "auto", async_op: bool = False):
        """Exchange blocks with every rank (``HcclAlltoAll``): ``x``'s first axis splits into
        ``size`` equal blocks, block j goes to rank j; the result's block i came from rank i.
        ``out``: where to put it (``x``'s shape and dtype; may be ``x`` itself), else a new array.
        ``algo``: ``pairwise``, ``mesh`` or ``auto``::

            got = comm.all_to_all(np.arange(comm.size * 2).reshape(comm.size, 2))
        """
        what = f"all_to_all on '{self.name}'"
        self.issuer.check_usable(what)
        x = self._array(x, what, writable=False)
        if x.ndim == 0 or x.shape[0] % self.size:
            raise self._bad(
                what,
                f"x's first axis ({x.shape[0] if x.ndim else 'none'}) does not split into {self.size} equal "
                f"blocks; give x a first axis divisible by the communicator size",
                arg="x.shape",
                value=list(x.shape),
                rule="divisible",
                expected=self.size,
            )
        count = x.size // self.size
        result = self._out(out, x.size, x.dtype, what)
        flat = _apart_from(np.ascontiguousarray(x).reshape(-1), result)
        spec = CallSpec("alltoall", OpKind.ALLTOALL, algo, count, x.dtype)
        return self._collective(
            spec, (flat, result.reshape(-1)), result.reshape(x.shape) if out is None else result, async_op
        )

    @staticmethod
    def _v_bufs(send: np.ndarray, recv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The flat buffers of an all-to-all-v (the input copied first when it overlaps the output)."""
        flat_recv = recv.reshape(-1)
        return _apart_from(np.ascontiguousarray(send).reshape(-1), flat_recv), flat_recv

    @entry("collective")
    def scatter(
        self,
        x: np.ndarray | None,
        root: int = 0,
        *,
        out: np.ndarray | None = None,
        algo: str = "auto",
        async_op: bool = False,
    ):
        """Rank r gets block r of the root's ``x`` (``HcclScatter``): ``x``'s first axis splits
        into ``size`` blocks. Other ranks pass ``out`` (or an ``x`` of the root's shape and dtype,
        whose values are ignored) to say what they receive. Returns the block (``out`` if given)::

            part = comm.scatter(table if comm.rank == 0 else None, root=0, out=np.empty(4, np.float32))
        """
        what = f"scatter on '{self.name}'"
        self.issuer.check_usable(what)
        root = self._root(root, what)
        if x is None:
            if self._rank == root or out is None:
                raise self._bad(
                    what,
                    "x is None: the root passes the array to scatter, the others x or out",
                    arg="x",
                    rule="required",
                )
            out = self._array(out, what, writable=True, arg="out")
            count, dtype, shape, flat = out.size, out.dtype, out.shape, _NO_DATA
        else:
            x = self._array(x, what, writable=False)
            if x.ndim == 0 or x.shape[0] % self.size:
                raise self._bad(
                    what,
                    f"x's first axis does not split into {self.size} blocks",
                    arg="x.shape",
                    value=list(x.shape),
                    rule="divisible",
                    expected=self.size,
                )
            count, dtype, shape = x.size // self.size, x.dtype, (x.shape[0] // self.size, *x.shape[1:])
            flat = np.ascontiguousarray(x).reshape(-1) if self._rank == root else _NO_DATA.view(x.dtype)
        result = self._out(out, count, dtype, what)
        if self._rank == root:
            flat = _apart_from(flat, result)
        spec = CallSpec("scatter", OpKind.SCATTER, algo, count, dtype, None, root)
        return self._collective(
            spec, (flat, result.reshape(-1)), result.reshape(shape) if out is None else result, async_op
        )

    @entry("collective")
    def gather(
        self, x: np.ndarray, root: int = 0, *, out: np.ndarray | None = None, algo: str = "auto", async_op: bool = False
    ):
        """The root gets every rank's ``x`` as an array of shape ``(size, *x.shape)``, or in ``out``;
        the other ranks get None (HCCL has no Gather operator, only ``HCCL_CMD_GATHER`` inside its
        Reduce; this is the mirror of ``HcclScatter``)::

            table = comm.gather(row, root=0)
        """
        what = f"gather on '{self.name}'"
        self.issuer.check_usable(what)
        x = self._array(x, what, writable=False)
        root = self._root(root, what)
        flat = np.ascontiguousarray(x).reshape(-1)
        if self._rank == root:
            result = self._out(out, self.size * flat.size, x.dtype, what)
            flat = _apart_from(flat, result)
            bufs, value = (flat, result.reshape(-1)), result.reshape((self.size, *x.shape))
        else:
            bufs, value = (flat, _NO_DATA.view(x.dtype)), None
        return self._collective(
            CallSpec("gather", OpKind.GATHER, algo, flat.size, x.dtype, None, root), bufs, value, async_op
        )

    def _out(self, out: np.ndarray | None, count: int, dtype: np.dtype, what: str) -> np.ndarray:
        """The caller's output buffer, checked, or a new one."""
        if out is None:
            return np.empty(count, dtype)
        out = self._array(out, f"{what} (out=)", writable=True, arg="out")
        if out.dtype != dtype or out.size != count:
            raise self._bad(
                what,
                f"out= must hold {count} elements of {dtype}, got {out.size} of {out.dtype}",
                arg="out",
                value=[out.size, out.dtype.name],
                expected=[count, np.dtype(dtype).name],
            )
        return out

    def _into(self, out: np.ndarray, x: np.ndarray, what: str, copy: bool = True) -> np.ndarray:
        """``out`` checked to take ``x``'s result (same size and dtype), with ``x`` copied in when
        ``copy`` (an out-of-place call runs in place on its output; when ``out`` is ``x`` that is
        the in-place call itself)."""
        out = self._out(out, x.size, x.dtype, what)
        if copy and out is not x:
            np.copyto(out.reshape(-1), _apart_from(np.ascontiguousarray(x).reshape(-1), out.reshape(-1)))
        return out

    @entry("collective")
    def barrier(self, *, monitored: bool = False, async_op: bool = False):
        """Return once every rank of the communicator has entered the barrier (``HcclBarrier``).

        ``monitored=True`` (like torch's ``monitored_barrier``): every rank reports to rank 0,
        which releases them; when ``HCCL_EXEC_TIMEOUT`` expires, rank 0's error names *every*
        missing rank, and the other ranks raise with rank 0's finding::

            comm.barrier(monitored=True)   # HcclTimeoutError: ... Waiting peer rank(s): 2, 3
        """
        what = f"barrier on '{self.name}'"
        self.issuer.check_usable(what)
        algo = "monitored" if monitored else "dissemination"
        call = self._calls.get(("barrier", algo))
        if call is None:
            call = self._prepare(CallSpec("barrier", OpKind.BARRIER, algo, 0, _BYTE))
            if monitored:
                # Rank 0 names the missing ranks and tells the others; they wait a little
                # longer than rank 0 so that its finding, not their own timeout, reaches them.
                own = self.timeout_s
                timeout = None if own is None else (own if self._rank == 0 else own + 2.0)
                call = call._replace(
                    notify_on_timeout=self._rank == 0, ctx=dataclasses.replace(call.ctx, timeout_s=timeout)
                )
            call = self._remember(("barrier", algo), call)
        return self.issuer.issue(call, (_NO_DATA, _NO_DATA), None, async_op)
