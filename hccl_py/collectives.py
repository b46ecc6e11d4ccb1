"""One description per collective: the single place that says what each operation is.

The executor (wire op codes, call descriptions), the in-process player (buffer sizes, in-place
rule), hierarchical composition, the partition search and hccl-sim (size conventions,
bus-bandwidth factors), hccl-bench and the fault grammar (names) all read this table instead of
keeping their own alias maps and factors::

    spec = collective("reducescatter")       # HCCL's and nccl-tests' spelling
    spec.name, spec.hccl_name                # ('reduce_scatter', 'HcclReduceScatter')
    spec.buffer_counts(size=4, count=10)     # (40, 10): IN and OUT elements of one rank
    spec.bus_factor(8)                       # 0.875 = (n-1)/n, as nccl-tests
    spec.count_of(1 << 20, 4, 8)             # elements per rank for a 1 MiB message in hccl-sim's convention
    spec.test_elements(1 << 20, 4, 8)        # the call's count for HCCL Test's data_size of 1 MiB
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

import numpy as np

from .dtypes import ReduceOp, default_dtype, dtype_named
from .errors import HcclParamError


class OpKind(IntEnum):
    """Wire code of an operation (the header's ``op`` field)."""

    ALLREDUCE = 1
    ALLGATHER = 2
    BROADCAST = 3
    REDUCE = 4
    REDUCE_SCATTER = 5
    BARRIER = 6
    SEND = 7
    ALLTOALL = 8
    ALLTOALLV = 9
    SCATTER = 10
    GATHER = 11

    @property
    def label(self) -> str:
        """The operation's name in lower case (``allreduce``, ``reduce_scatter``)."""
        return self.name.lower()


@dataclass(frozen=True)
class Collective:
    """What one collective is.

    ``in_count(size, count)`` / ``out_count(size, count)``: elements of a rank's input and output
    for a call of ``count`` (the call's count: per-rank block of allgather and reduce_scatter,
    the whole buffer otherwise). ``in_place``: the call's input *is* its output (IN and OUT name
    one array in the schedules). ``bus_factor(n)``: nccl-tests' busbw = algbw * factor.
    ``message_elements(nbytes, itemsize, n)``: the call's count for a message of ``nbytes`` in the
    convention of hccl-sim and the partition search: ``nbytes`` is each rank's input (allgather:
    its block; reduce_scatter: the whole input it reduces). ``test_elements(nbytes, itemsize, n)``:
    the call's count in HCCL Test's convention, where ``data_size`` is the buffer of allreduce,
    broadcast and reduce and the whole gathered output / reduced input of allgather and
    reduce_scatter (each rank's block is ``data_size / n``), and ``alg_bandwidth = data_size /
    time`` for all of them.
    """

    name: str
    kind: OpKind
    hccl_name: str
    rooted: bool
    reduces: bool
    in_place: bool
    aliases: tuple[str, ...]
    in_count: Callable[[int, int], int]
    out_count: Callable[[int, int], int]
    bus_factor: Callable[[int], float]
    message_elements: Callable[[int, int, int], int]
    root_only: str | None = None  # "in" (scatter) or "out" (gather): the buffer only the root has
    test_elements: "Callable[[int, int, int], int] | None" = None

    def buffer_counts(self, size: int, count: int, rank: int | None = None, root: int = 0) -> tuple[int, int]:
        """(IN, OUT) elements of one rank for a call of ``count`` on ``size`` ranks (of ``rank``,
        when given: a rank other than the root has no ``root_only`` buffer)."""
        in_count, out_count = self.in_count(size, count), self.out_count(size, count)
        if rank is not None and rank != root:
            if self.root_only == "in":
                in_count = 0
            elif self.root_only == "out":
                out_count = 0
        return in_count, out_count


def _whole(size: int, count: int) -> int:
    return count


def _blocks(size: int, count: int) -> int:
    return size * count


def _none(size: int, count: int) -> int:
    return 0


def _per_element(nbytes: int, itemsize: int, n: int) -> int:
    return nbytes // itemsize


def _per_rank_block(nbytes: int, itemsize: int, n: int) -> int:
    return nbytes // itemsize // n


COLLECTIVES: dict[str, Collective] = {
    c.name: c
    for c in (
        Collective(
            "allreduce",
            OpKind.ALLREDUCE,
            "HcclAllReduce",
            rooted=False,
            reduces=True,
            in_place=True,
            aliases=("all_reduce",),
            in_count=_whole,
            out_count=_whole,
            bus_factor=lambda n: 2 * (n - 1) / n,
            message_elements=_per_element,
        ),
        Collective(
            "allgather",
            OpKind.ALLGATHER,
            "HcclAllGather",
            rooted=False,
            reduces=False,
            in_place=False,
            aliases=("all_gather",),
            in_count=_whole,
            out_count=_blocks,
            bus_factor=lambda n: (n - 1) / n,
            message_elements=_per_element,
            test_elements=_per_rank_block,
        ),
        Collective(
            "broadcast",
            OpKind.BROADCAST,
            "HcclBroadcast",
            rooted=True,
            reduces=False,
            in_place=True,
            aliases=("bcast",),
            in_count=_whole,
            out_count=_whole,
            bus_factor=lambda n: 1.0,
            message_elements=_per_element,
        ),
        Collective(
            "reduce",
            OpKind.REDUCE,
            "HcclReduce",
            rooted=True,
            reduces=True,
            in_place=True,
            aliases=(),
            in_count=_whole,
            out_count=_whole,
            bus_factor=lambda n: 1.0,
            message_elements=_per_element,
        ),
        Collective(
            "reduce_scatter",
            OpKind.REDUCE_SCATTER,
            "HcclReduceScatter",
            rooted=False,
            reduces=True,
            in_place=False,
            aliases=("reducescatter", "reduce-scatter"),
            in_count=_blocks,
            out_count=_whole,
            bus_factor=lambda n: (n - 1) / n,
            message_elements=_per_rank_block,
            test_elements=_per_rank_block,
        ),
        Collective(
            "alltoall",
            OpKind.ALLTOALL,
            "HcclAlltoAll",
            rooted=False,
            reduces=False,
            in_place=False,
            aliases=("all_to_all",),
            in_count=_blocks,
            out_count=_blocks,
            bus_factor=lambda n: (n - 1) / n,
            message_elements=_per_rank_block,
        ),
        # counts per pair vary (AlltoAllV / AlltoAllVC): the buffers are the caller's, the call's
        # count is a digest of the counts matrix (so a rank with another matrix is a mismatch)
        Collective(
            "alltoallv",
            OpKind.ALLTOALLV,
            "HcclAlltoAllV",
            rooted=False,
            reduces=False,
            in_place=False,
            aliases=("all_to_all_v", "alltoallvc", "all_to_all_vc"),
            in_count=_none,
            out_count=_none,
            bus_factor=lambda n: (n - 1) / n,
            message_elements=_per_rank_block,
        ),
        Collective(
            "scatter",
            OpKind.SCATTER,
            "HcclScatter",
            rooted=True,
            reduces=False,
            in_place=False,
            aliases=(),
            in_count=_blocks,
            out_count=_whole,
            bus_factor=lambda n: (n - 1) / n,
            message_elements=_per_rank_block,
            root_only="in",
        ),
        Collective(
            "gather",
            OpKind.GATHER,
            "HcclGather",
            rooted=True,
            reduces=False,
            in_place=False,
            aliases=(),
            in_count=_whole,
            out_count=_blocks,
            bus_factor=lambda n: (n - 1) / n,
            message_elements=_per_element,
            root_only="out",
        ),
        Collective(
            "barrier",
            OpKind.BARRIER,
            "HcclBarrier",
            rooted=False,
            reduces=False,
            in_place=False,
            aliases=(),
            in_count=_none,
            out_count=_none,
            bus_factor=lambda n: 0.0,
            message_elements=lambda nbytes, itemsize, n: 0,
        ),
    )
}

for _c in COLLECTIVES.values():
    if _c.test_elements is None:
        object.__setattr__(_c, "test_elements", _c.message_elements)

# Collectives whose calls move data by an algorithm (everything but the barrier)
DATA_COLLECTIVES = tuple(name for name in COLLECTIVES if name != "barrier")

_BY_ALIAS = {
    alias: c
    for c in COLLECTIVES.values()
    for alias in (c.name, *c.aliases, c.hccl_name.lower(), c.hccl_name.lower().removeprefix("hccl"))
}
_BY_KIND = {c.kind: c for c in COLLECTIVES.values()}


def collective(name: str) -> Collective:
    """The collective called ``name`` in any of its spellings (hccl-py's ``reduce_scatter``,
    nccl-tests' ``reducescatter``, HCCL's ``HcclReduceScatter``); HcclParamError otherwise."""
    found = _BY_ALIAS.get(str(name).strip().lower())
    if found is None:
        raise HcclParamError(f"unknown collective {name!r}; use one of {', '.join(COLLECTIVES)}")
    return found


def spellings() -> dict[str, str]:
    """Every spelling of every collective (lower case) -> its hccl-py name."""
    return {alias: c.name for alias, c in _BY_ALIAS.items()}


def of_kind(kind: int) -> Collective | None:
    """The collective with wire code ``kind``; None for point-to-point (``OpKind.SEND``)."""
    return _BY_KIND.get(kind)


# A v-call's signature count (all_gather_v, reduce_scatter_v): the count itself when every block
# has it (the call pairs with the plain one), else this bit and a digest of the counts, so that
# ranks whose lists differ are a call mismatch even where the largest count agrees.
BLOCKS_BIT = 1 << 63


def blocks_count(counts: tuple[int, ...]) -> int:
    """The signature count of blocks of ``counts`` elements, one per rank::

    blocks_count((4, 4)) == 4;  blocks_count((3, 4)) & BLOCKS_BIT
    """
    if len(set(counts)) <= 1:
        return counts[0] if counts else 0
    return (
        BLOCKS_BIT
        | int.from_bytes(hashlib.blake2b(repr(tuple(counts)).encode(), digest_size=8).digest(), "little") >> 1
    )


class CallSpec(NamedTuple):
    """One call's request: what a program asks of a communicator, before any algorithm is chosen
    or any byte moves. The communicator builds one per call, the algorithm choice
    (``algo_select.auto``), the cost model, the simulator and the plan cache take it, and it is
    the cache key of the call's prepared plan (so it costs what a tuple costs). ``algo`` is the
    name asked for (``"auto"``, ``"ring"``, ``"hier:mesh/ring"``); ``op`` is None for an operation
    that does not reduce; ``modeled`` False for an exchange that costs no modeled time; ``then``
    the step the caller takes on the result afterwards (``dtypes.THEN_STEPS``' code: 1, torch's
    AVG), which only the signature carries::

        spec = CallSpec.of("allreduce", 1024, dtype="float32", op="max")
        spec.nbytes, spec.op_name              # (4096, 'max')
    """

    collective: str
    kind: OpKind
    algo: str
    count: int
    dtype: np.dtype
    op: ReduceOp | None = None
    root: int = 0
    modeled: bool = True
    then: int = 0

    @classmethod
    def of(
        cls,
        collective: str,
        count: int,
        *,
        dtype: "np.dtype | str | None" = None,
        itemsize: int = 4,
        op: "ReduceOp | str | None" = "sum",
        root: int = 0,
        algo: str = "auto",
    ) -> "CallSpec":
        """The request for ``collective`` (any spelling) of ``count`` elements of ``dtype`` (None:
        the usual dtype of ``itemsize``-byte elements, as hccl-sim's ``--bytes`` calls); ``op`` is
        dropped for an operation that does not reduce."""
        c = collective_named(collective)
        return cls(
            c.name,
            c.kind,
            algo,
            int(count),
            dtype_named(default_dtype(itemsize) if dtype is None else dtype),
            ReduceOp.parse(op) if c.reduces and op is not None else None,
            int(root),
        )

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of ``count`` elements."""
        return self.count * self.dtype.itemsize

    @property
    def op_name(self) -> str:
        """The reduction's lower-case name; ``"sum"`` for an operation that does not reduce (the
        cost model's default)."""
        return "sum" if self.op is None else self.op.name.lower()

    @property
    def dtype_name(self) -> str:
        """numpy's name of the dtype (``"float32"``)."""
        return self.dtype.name


collective_named = collective  # CallSpec.of's name for it (its own argument is called collective)
