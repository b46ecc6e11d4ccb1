"""AllReduce: every rank ends with the reduction of all ranks' buffers (in place).

busbw = algbw * 2(n-1)/n: a ring moves 2(n-1)/n of the buffer over each rank's link.
"""

from __future__ import annotations

from hccl_py.collectives import collective

from .base import Case, Collective, elements, reduce_input, reduced


def counts(nbytes: int, itemsize: int, nranks: int) -> tuple[int, int, int]:
    count = elements(nbytes, itemsize)
    return count, count, count


def init(case: Case):
    return (reduce_input(case.count, case.rank, case.op, case.dtype),
            reduced(case.count, case.nranks, case.op, case.dtype))


COLLECTIVE = Collective("allreduce", collective("allreduce"), counts=counts, init=init)
