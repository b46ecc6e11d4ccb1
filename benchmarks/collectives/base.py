"""What a collective tells the harness (as nccl-tests' per-collective files do), and the data
patterns that make every result cheap to check.

A collective file says only: how many elements a message of ``nbytes`` moves (``counts``), each
rank's input and expected output (``init``), and the bus-bandwidth factor (``bus_factor``).

Inputs are periodic small integers, so the expected result of any reduction is exact in every
dtype (float sums of small integers do not depend on the order of additions; integer overflow
wraps identically everywhere) and costs one table of ``period`` entries, tiled::

    pattern(5, seed=1, dtype=np.int32, period=13)      # [7, 8, 9, 10, 11]: (i + 7*seed) % 13
    reduced(5, nranks=2, op="sum", dtype=np.int32)     # [7, 9, 11, 13, 15] = pattern(seed 0) + pattern(seed 1)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from hccl_py.collectives import Collective as CollectiveSpec

__all__ = ["Case", "Collective", "pattern", "reduce_input", "reduced", "COPY_PERIOD", "REDUCE_PERIOD"]

# Copies (gather, broadcast) use values 0..100: exact in int8 and bfloat16. A prime period keeps a
# block misplaced by a power-of-two offset from looking right.
COPY_PERIOD = 101
# Reductions use values 0..12 (sum of n ranks <= 12n: exact in bf16 up to n = 21, fp16 to 170).
REDUCE_PERIOD = 13
_SEED_STRIDE = 7  # rank r's pattern is shifted by 7r: every rank sends different data


@dataclass(frozen=True)
class Case:
    """One rank's view of one size: what ``Collective.init`` builds buffers for."""

    rank: int
    nranks: int
    count: int  # elements per rank in the collective's own unit (see Collective.counts)
    dtype: np.dtype
    op: str  # "sum", "prod", "max", "min" (ignored by copies)
    root: int  # ignored by rootless collectives


@dataclass(frozen=True)
class Collective:
    """A collective as the harness runs it: what hccl-py says it is (``spec``, from
    ``hccl_py.collectives``: rooted, reduces, in place, bus factor) plus the harness's own parts.

    ``name`` is the CLI name (nccl-tests' spelling: ``reducescatter``).
    ``counts(nbytes, itemsize, nranks) -> (count, send_count, recv_count)``: ``count`` goes into
    :class:`Case`; send/recv counts are buffer lengths in elements. The row's size is
    ``max(send, recv) * itemsize`` (nccl-tests' convention: the whole gathered/scattered buffer).
    ``init(case) -> (input, expected)``: the rank's input (the buffer itself for in-place
    collectives; empty where the rank sends nothing: scatter off the root) and its expected
    result, flat; ``None`` where the rank's result is undefined or absent (reduce, gather off the
    root: gather's other ranks get an empty output buffer, see :meth:`receives`).
    """

    name: str
    spec: CollectiveSpec
    counts: Callable[[int, int, int], tuple[int, int, int]]
    init: Callable[[Case], tuple[np.ndarray, np.ndarray | None]]

    @property
    def title(self) -> str:
        """HCCL's operator name without the prefix: ``ReduceScatter``."""
        return self.spec.hccl_name.removeprefix("Hccl")

    @property
    def reduces(self) -> bool:
        """Whether the collective reduces (it takes ``-o``): ``spec.reduces``."""
        return self.spec.reduces

    @property
    def rooted(self) -> bool:
        """Whether the collective has a root (it takes ``-r``): ``spec.rooted``."""
        return self.spec.rooted

    @property
    def in_place(self) -> bool:
        """Whether the call's input buffer is its output (``spec.in_place``)."""
        return self.spec.in_place

    def receives(self, rank: int, root: int) -> bool:
        """Whether ``rank`` has an output buffer (gather: the root only, as ``spec.root_only`` says)."""
        return self.spec.root_only != "out" or rank == root

    def bus_factor(self, nranks: int) -> float:
        """busbw = algbw * bus_factor(nranks), as nccl-tests."""
        return self.spec.bus_factor(nranks)


def _fill_periodic(table: np.ndarray, count: int) -> np.ndarray:
    """``table`` repeated to ``count`` elements, by doubling copies (memcpy speed for 64 MiB)."""
    out = np.empty(count, table.dtype)
    filled = min(count, table.size)
    out[:filled] = table[:filled]
    while filled < count:
        n = min(filled, count - filled)
        out[filled : filled + n] = out[:n]
        filled += n
    return out


def _table(seed: int, period: int, start: int) -> np.ndarray:
    return (np.arange(period, dtype=np.int64) + start + _SEED_STRIDE * seed) % period


def _cast(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    # int64 -> narrower int wraps (C cast): what a wrapping reduction in the narrow type gives.
    return values.astype(dtype)


def pattern(count: int, seed: int, dtype: np.dtype, period: int = COPY_PERIOD, start: int = 0) -> np.ndarray:
    """Element ``i`` is ``(start + i + 7*seed) % period``, in ``dtype``."""
    return _fill_periodic(_cast(_table(seed, period, start % period), dtype), count)


def _reduce_table(seed: int, op: str, start: int) -> np.ndarray:
    values = _table(seed, REDUCE_PERIOD, start % REDUCE_PERIOD)
    if op == "prod":  # 1 everywhere, 2 where the value is 0: products stay tiny and exact
        return np.where(values == 0, 2, 1).astype(np.int64)
    return values


def reduce_input(count: int, rank: int, op: str, dtype: np.dtype, start: int = 0) -> np.ndarray:
    """Rank ``rank``'s input to a reduction with ``op`` (element ``i`` counted from ``start``)."""
    return _fill_periodic(_cast(_reduce_table(rank, op, start), dtype), count)


_NP_REDUCE = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def reduced(count: int, nranks: int, op: str, dtype: np.dtype, start: int = 0) -> np.ndarray:
    """The ``op``-reduction over ranks 0..nranks-1 of :func:`reduce_input` (exact, in ``dtype``)."""
    ufunc = _NP_REDUCE[op]
    table = _reduce_table(0, op, start)
    for r in range(1, nranks):
        table = ufunc(table, _reduce_table(r, op, start))
    return _fill_periodic(_cast(table, dtype), count)


def elements(nbytes: int, itemsize: int, unit: int = 1) -> int:
    """Elements in ``nbytes``, rounded down to a multiple of ``unit`` and at least ``unit``."""
    return max(unit, nbytes // itemsize // unit * unit)


def same_counts(nbytes: int, itemsize: int, nranks: int) -> tuple[int, int, int]:
    """``Collective.counts`` of a collective whose every buffer is the whole message
    (allreduce, broadcast, reduce): count = send = recv."""
    count = elements(nbytes, itemsize)
    return count, count, count
