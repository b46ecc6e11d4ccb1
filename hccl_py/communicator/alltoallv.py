"""The communicator's all-to-all with counts per pair, a mixin of the one class
(:class:`~hccl_py.communicator.Communicator`): ``all_to_all_v``, whose ranks first exchange their
counts as HCCL does, and ``all_to_all_vc``, whose counts matrix every rank knows; the checks of
counts and displacements are plain functions in alltoallv_args.py."""

from __future__ import annotations

import numpy as np

from ..algorithms.alltoallv import VSchedule
from ..algorithms.alltoallv import digest as alltoallv_digest
from ..choice import names as algo_names
from ..choice import select as algo_select
from ..collectives import CallSpec, OpKind
from ..engine.issuing import Call, entry
from ..errors import HcclError, HcclParamError
from .alltoallv_args import agreed, layout, vc_matrix


class AllToAllV:
    """The Communicator's all_to_all_v and all_to_all_vc; the state they use (``_v_names``,
    ``_calls``, the issuer) is the Communicator's."""

    @entry("alltoallv")
    def all_to_all_v(
        self,
        send: np.ndarray,
        send_counts,
        send_displs,
        recv: np.ndarray,
        recv_counts,
        recv_displs,
        *,
        algo: str = "auto",
        async_op: bool = False,
    ):
        """All-to-all with a count per peer (``HcclAlltoAllV``): ``send_counts[j]`` elements from
        ``send[send_displs[j]:]`` go to rank j, ``recv_counts[i]`` elements from rank i land at
        ``recv[recv_displs[i]:]``; displacements ``None`` mean packed blocks. As HCCL, the ranks
        first exchange their counts (one small allgather, charged to modeled time; where the call
        runs HCCL's continuous pipeline, which exchanges counts inside each server in its own first
        step, not charged), so a count that disagrees with the peer's fails on every rank before
        any data moves. Returns ``recv``::

            comm.all_to_all_v(tokens, sizes_out, None, buf, sizes_in, None)
        """
        what = f"all_to_all_v on '{self.name}'"
        self.issuer.check_usable(what)
        send, recv, problem = self._v_buffers(what, send, recv)
        counts_out = counts_in = displs_out = displs_in = None
        if problem is None:
            try:
                counts_out, displs_out = layout(self.size, what, "send", send_counts, send_displs, send.size, self._bad)
                counts_in, displs_in = layout(self.size, what, "recv", recv_counts, recv_displs, recv.size, self._bad)
            except HcclParamError as err:
                problem = err
        # Every rank takes part in the exchange of counts, also one whose own are bad: the others
        # then fail with it rather than wait for it until HCCL_EXEC_TIMEOUT.
        charged = True
        if problem is None:
            try:
                charged = not algo_names.is_continuous(self._v_name(algo, exchange=True))
            except HcclError as err:
                problem = err
        mine = np.full(1 + 2 * self.size, -1, np.int64)
        if problem is None:
            mine[0] = 1
            mine[1 : 1 + self.size], mine[1 + self.size :] = counts_out, counts_in
        if not async_op:
            try:
                table = self._counts_exchange(mine, charged)
                if problem is not None:
                    raise problem
                matrix = agreed(self.size, what, table, self._bad)
            except HcclError:
                self.issuer.counter.seq += 1  # the data exchange's number, which the others spend too (as async)
                raise
            call = self._v_call(matrix, displs_out, displs_in, algo, send.dtype, exchange=True)
            return self.issuer.issue(call, self._v_bufs(send, recv), recv)
        # Asynchronous: the counts exchange and the data exchange queue one after the other; the
        # data exchange learns its matrix when its turn comes, and the caller goes on at once.
        gathered = self._counts_exchange(mine, charged, async_op=True)
        if problem is not None:
            self.issuer.counter.seq += 1  # the data exchange's number, which the other ranks spend on theirs
            raise problem

        def resolve() -> Call:
            matrix = agreed(
                self.size, what, gathered.peek(), self._bad
            )  # the counts exchange has ended: it queued first
            return self._v_call(matrix, displs_out, displs_in, algo, send.dtype, exchange=True)

        return self.issuer.issue_later(what, resolve, self._v_bufs(send, recv), recv)

    @entry("collective")
    def all_to_all_vc(self, send: np.ndarray, counts, recv: np.ndarray, *, algo: str = "auto", async_op: bool = False):
        """All-to-all with a counts matrix every rank knows (``HcclAlltoAllVC``): ``counts[i][j]``
        elements from rank i to rank j, the same matrix on every rank (a rank with another
        matrix is a call mismatch); blocks packed in rank order in ``send`` and ``recv``. No
        exchange of counts. Returns ``recv``::

            comm.all_to_all_vc(tokens, routing_matrix, buf)
        """
        what = f"all_to_all_vc on '{self.name}'"
        self.issuer.check_usable(what)
        send, recv, problem = self._v_buffers(what, send, recv)
        if problem is not None:
            raise problem
        matrix = vc_matrix(self.size, what, counts, self._bad)
        row, column = matrix[self._rank], [r[self._rank] for r in matrix]
        counts_out, displs_out = layout(self.size, what, "send", row, None, send.size, self._bad)
        counts_in, displs_in = layout(self.size, what, "recv", column, None, recv.size, self._bad)
        call = self._v_call(matrix, displs_out, displs_in, algo, send.dtype)
        return self.issuer.issue(call, self._v_bufs(send, recv), recv, async_op)

    def _v_buffers(self, what: str, send, recv) -> tuple[np.ndarray, np.ndarray, HcclParamError | None]:
        send = self._array(send, what, writable=False, arg="send")
        recv = self._array(recv, what, writable=True, arg="recv")
        if send.dtype != recv.dtype:
            return (
                send,
                recv,
                self._bad(
                    what,
                    f"send and recv differ in dtype ({send.dtype} and {recv.dtype})",
                    arg="recv",
                    value=recv.dtype.name,
                    expected=send.dtype.name,
                ),
            )
        return send, recv, None

    def _counts_exchange(self, mine: np.ndarray, charged: bool, async_op: bool = False):
        """all_to_all_v's exchange of every rank's counts: an allgather, charged to modeled time
        unless ``charged`` is False (HCCL's continuous pipeline exchanges counts in its first step)."""
        if charged:
            return self.all_gather(mine, async_op=async_op)
        result = np.empty((self.size, mine.size), mine.dtype)
        spec = CallSpec("allgather", OpKind.ALLGATHER, "auto", mine.size, mine.dtype, modeled=False)
        return self._collective(spec, (mine, result.reshape(-1)), result, async_op)

    def _v_name(self, algo: str, *, exchange: bool) -> str:
        """The algorithm an all-to-all-v runs: the caller's, HCCL_ALGO's, or HCCL's all-to-all rule
        (which does not look at the counts; ``exchange``: AlltoAllV's, else AlltoAllVC's). Resolved
        once per (algo, exchange): every all_to_all_v call asks before its counts exchange."""
        name = self._v_names.get((algo, exchange))
        if name is None:
            name = self._v_names[(algo, exchange)] = self._resolve_v(algo, exchange)
        return name

    def _resolve_v(self, algo: str, exchange: bool) -> str:
        name = algo_names.resolve(
            "alltoallv",
            algo,
            lambda level1=None: (
                algo_select.alltoallv_auto(self._rc.topology, self._world_ranks, level1, exchange=exchange).algo
            ),
            self._algo_env,
        )
        if exchange and algo.strip().lower() == "auto" and algo_names.hier_levels(name) == ("mesh", "pipeline"):
            # HCCL_ALGO's level-1 pipeline: AlltoAllV tries the continuous pipeline first (alltoall_operator.cc
            # L287, L738), as auto does
            continuous = algo_select.alltoallv_auto(self._rc.topology, self._world_ranks, exchange=True).algo
            name = continuous if continuous == algo_names.A2A_CONTINUOUS else name
        return name

    def _v_call(self, matrix, displs_out, displs_in, algo: str, dtype: np.dtype, *, exchange: bool = False) -> Call:
        """The data exchange of an all-to-all with counts per pair, on a checked matrix
        (``exchange``: AlltoAllV's, whose counts the ranks exchanged; else AlltoAllVC's)."""
        key = ("alltoallv", algo, matrix, tuple(displs_out), tuple(displs_in), dtype, exchange)
        call = self._calls.get(key)
        if call is None:
            name = self._v_name(algo, exchange=exchange)
            levels = algo_names.hier_levels(name)
            staged = (
                None
                if levels is None
                else (
                    algo_names.groups_for(self._rc.topology, name, self._world_ranks, lambda: self.partition),
                    *levels,
                )
            )
            fn = VSchedule(
                name,
                matrix,
                owner=self._rank,
                send_displs=displs_out,
                recv_displs=displs_in,
                staged=staged,
                itemsize=np.dtype(dtype).itemsize,
            )
            call = self._remember(
                key,
                self._prepare(
                    CallSpec("alltoallv", OpKind.ALLTOALLV, name, 0, np.dtype(dtype)), fn, alltoallv_digest(matrix)
                ),
            )
        return call
