"""AllGather: every rank ends with all ranks' buffers, in rank order (out of place).

Size is the gathered buffer (n blocks), as in nccl-tests. busbw = algbw * (n-1)/n.
"""

from __future__ import annotations

import numpy as np

from hccl_py.collectives import collective

from .base import Case, Collective, elements, pattern


def counts(nbytes: int, itemsize: int, nranks: int) -> tuple[int, int, int]:
    """``nbytes`` is the gathered buffer, rounded to n blocks: (block, block, n blocks)."""
    total = elements(nbytes, itemsize, unit=nranks)
    return total // nranks, total // nranks, total


def init(case: Case):
    """Rank r sends its pattern (seed r); every rank expects all n patterns in rank order."""
    expected = np.concatenate([pattern(case.count, r, case.dtype) for r in range(case.nranks)])
    return pattern(case.count, case.rank, case.dtype), expected


COLLECTIVE = Collective("allgather", collective("allgather"), counts=counts, init=init)
