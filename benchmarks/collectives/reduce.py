"""Reduce: root ends with the reduction of all ranks' buffers (in place). busbw = algbw.

Only root's result is defined (torch gloo, for one, leaves partial sums on other ranks), so
only root's is checked.
"""

from __future__ import annotations

from hccl_py.collectives import collective

from .base import Case, Collective, elements, reduce_input, reduced


def counts(nbytes: int, itemsize: int, nranks: int) -> tuple[int, int, int]:
    count = elements(nbytes, itemsize)
    return count, count, count


def init(case: Case):
    expected = reduced(case.count, case.nranks, case.op, case.dtype) if case.rank == case.root else None
    return reduce_input(case.count, case.rank, case.op, case.dtype), expected


COLLECTIVE = Collective("reduce", collective("reduce"), counts=counts, init=init)
