"""Reduce: root ends with the reduction of all ranks' buffers (in place). busbw = algbw.

Only root's result is defined (torch gloo, for one, leaves partial sums on other ranks), so
only root's is checked.
"""

from __future__ import annotations

from hccl_py.collectives import collective

from .base import Case, Collective, reduce_input, reduced, same_counts


def init(case: Case):
    """Each rank's :func:`reduce_input`; the root expects the reduction, the others nothing (None)."""
    expected = reduced(case.count, case.nranks, case.op, case.dtype) if case.rank == case.root else None
    return reduce_input(case.count, case.rank, case.op, case.dtype), expected


COLLECTIVE = Collective("reduce", collective("reduce"), counts=same_counts, init=init)
