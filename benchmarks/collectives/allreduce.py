"""AllReduce: every rank ends with the reduction of all ranks' buffers (in place).

busbw = algbw * 2(n-1)/n: a ring moves 2(n-1)/n of the buffer over each rank's link.
"""

from __future__ import annotations

from hccl_py.collectives import collective

from .base import Case, Collective, reduce_input, reduced, same_counts


def init(case: Case):
    """Each rank's :func:`reduce_input`; every rank expects the reduction over all ranks."""
    return (
        reduce_input(case.count, case.rank, case.op, case.dtype),
        reduced(case.count, case.nranks, case.op, case.dtype),
    )


COLLECTIVE = Collective("allreduce", collective("allreduce"), counts=same_counts, init=init)
