"""Point to point: the communicator's ``send``, ``recv`` and ``batch_send_recv`` (a mixin of
:class:`~hccl_py.communicator.Communicator`). Each send and receive is numbered per peer and
direction (the k-th send to a peer is its k-th receive from us), apart from the collectives'
numbers, so sends and receives in any order never deadlock.

Example::

    comm.batch_send_recv([("send", x, right), ("recv", y, left)])
"""

from __future__ import annotations

import numpy as np

from ..algorithms import p2p
from ..collectives import CallSpec, OpKind
from ..dtypes import dtype_code
from ..engine.issuing import Call, Part, entry
from ..engine.plan import P2P_SEQ_BIT
from ..transport.base import CallSignature
from ..work import Work


class PointToPoint:
    """The point-to-point half of the communicator (see the module doc)."""

    @entry("send")
    def send(self, x: np.ndarray, dst: int, *, async_op: bool = False):
        """Send ``x`` to rank ``dst``, which posts a matching :meth:`recv` (``HcclSend``).

        Returns once the data has been handed over (copied out of ``x``); a large message
        waits for the receiver to drain it, as MPI's rendezvous protocol does. Sends and
        receives progress per peer and direction, so ``async_op=True`` sends and receives in any
        order never deadlock.
        """
        what = f"send on '{self.name}'"
        self.issuer.check_usable(what)
        x, dst = self._p2p_args(what, x, dst, "dst", writable=False)
        flat = np.ascontiguousarray(x).reshape(-1)
        seq = P2P_SEQ_BIT | self.issuer.counter.next_p2p(True, dst)
        call = self._p2p_call("send", flat.size, x.dtype, dst)
        return self.issuer.issue(call, (flat, flat), None, async_op, seq, ("send", dst))

    @entry("recv")
    def recv(self, x: np.ndarray, src: int, *, async_op: bool = False):
        """Receive into ``x`` from rank ``src``'s matching :meth:`send`, in place; returns ``x``."""
        what = f"recv on '{self.name}'"
        self.issuer.check_usable(what)
        x, src = self._p2p_args(what, x, src, "src", writable=True)
        flat = x.reshape(-1)
        seq = P2P_SEQ_BIT | self.issuer.counter.next_p2p(False, src)
        call = self._p2p_call("recv", flat.size, x.dtype, src)
        return self.issuer.issue(call, (flat, flat), x, async_op, seq, ("recv", src))

    @entry("batch")
    def batch_send_recv(self, items, *, async_op: bool = False):
        """Several sends and receives as one call (``HcclBatchSendRecv``): ``items`` are
        ``("send", array, peer)`` and ``("recv", array, peer)``; they progress together, so no
        order of them (on either side) can deadlock. Each matches the peer's send or receive
        as separate calls would (the k-th send to a peer is its k-th receive from us)::

            comm.batch_send_recv([("send", x, right), ("recv", y, left)])
        """
        what = f"batch_send_recv on '{self.name}'"
        self.issuer.check_usable(what)
        parts = []
        try:
            items = list(items)
        except TypeError:
            raise self._bad(
                what,
                f"items must be a sequence of ('send' or 'recv', array, peer), got {type(items).__name__}",
                arg="items",
                rule="type",
                expected="sequence",
            ) from None
        for i, item in enumerate(items):
            try:
                kind, array, peer = item
            except (TypeError, ValueError):
                raise self._bad(
                    what,
                    f"items[{i}] must be ('send' or 'recv', array, peer), got {item!r}",
                    arg=f"items[{i}]",
                    rule="format",
                ) from None
            if kind not in ("send", "recv"):
                raise self._bad(
                    what,
                    f"items[{i}]: {kind!r} is neither 'send' nor 'recv'",
                    arg=f"items[{i}]",
                    value=kind,
                    rule="choices",
                    choices=["send", "recv"],
                )
            array, peer = self._p2p_args(what, array, peer, "peer", writable=kind == "recv")
            parts.append((kind, array, peer))
        if not parts:
            return self._done_work(what, []) if async_op else []
        counter = self.issuer.counter
        counter.issued += 1  # before its items are numbered: a failure from here on is no refusal
        prepared = []
        for kind, array, peer in parts:
            flat = np.ascontiguousarray(array).reshape(-1) if kind == "send" else array.reshape(-1)
            seq = P2P_SEQ_BIT | counter.next_p2p(kind == "send", peer)
            prepared.append(Part(self._p2p_call(kind, flat.size, array.dtype, peer), flat, seq))
        results = [array for kind, array, _ in parts if kind == "recv"]
        return self.issuer.issue_batch(what, prepared, results, async_op)

    def _done_work(self, what: str, result) -> Work:
        work = Work(what, result, self._rc.device)
        work.finish(None, self._rc.device.clock)
        return work

    def _p2p_args(self, what: str, x, peer, name: str, *, writable: bool) -> tuple[np.ndarray, int]:
        x = self._array(x, what, writable=writable)
        peer = self._root(peer, what, name)
        if peer == self._rank:
            raise self._bad(
                what,
                f"{name}={peer} is this rank; {'receive from' if name == 'src' else 'send to'} another rank",
                arg=name,
                value=peer,
                rule="self",
            )
        return x, peer

    def _p2p_call(self, kind: str, count: int, dtype: np.dtype, peer: int) -> Call:
        key = CallSpec(kind, OpKind.SEND, "p2p", count, dtype, None, peer)  # a send's or receive's root: its peer
        call = self._calls.get(key)
        if call is None:
            sending = kind == "send"
            src, dst = (self._rank, peer) if sending else (peer, self._rank)
            sig = CallSignature(OpKind.SEND, 0, dtype_code(dtype, where=kind), 0, count, src)
            costs = (
                self._rc.cost_model.p2p_costs(
                    self._world_ranks[src], self._world_ranks[dst], count * dtype.itemsize, sender=sending
                )
                if self._rc.modeled
                else None
            )
            schedule = p2p.send_schedule(count, peer) if sending else p2p.recv_schedule(count, peer)
            nbytes = count * dtype.itemsize
            call = self._remember(
                key, Call(kind, "p2p", schedule, costs, None, nbytes, self.issuer.context(sig), dtype, dtype.name)
            )
        return call
