"""ReduceScatter: rank r ends with block r of the reduction of all ranks' buffers (out of place).

Size is the whole input (n blocks), as in nccl-tests. busbw = algbw * (n-1)/n.
"""

from __future__ import annotations

from hccl_py.collectives import collective

from .base import Case, Collective, elements, reduce_input, reduced


def counts(nbytes: int, itemsize: int, nranks: int) -> tuple[int, int, int]:
    """``nbytes`` is each rank's input, rounded to n blocks: (block, n blocks, block)."""
    total = elements(nbytes, itemsize, unit=nranks)
    return total // nranks, total, total // nranks


def init(case: Case):
    """Each rank's :func:`reduce_input` of n blocks; rank r expects block r of their reduction."""
    n, count = case.nranks, case.count
    return (
        reduce_input(n * count, case.rank, case.op, case.dtype),
        reduced(count, n, case.op, case.dtype, start=case.rank * count),
    )


COLLECTIVE = Collective("reducescatter", collective("reduce_scatter"), counts=counts, init=init)
