"""Gather: the root ends with all ranks' buffers, in rank order (out of place).

Size is the gathered buffer (n blocks), as in nccl-tests. busbw = algbw * (n-1)/n.
Only the root receives (the harness gives the others no output buffer), so only its result is checked.
"""

from __future__ import annotations

import numpy as np

from hccl_py.collectives import collective

from .base import Case, Collective, elements, pattern


def counts(nbytes: int, itemsize: int, nranks: int) -> tuple[int, int, int]:
    """``nbytes`` is the root's gathered buffer, rounded to n blocks: (block, block, n blocks)."""
    total = elements(nbytes, itemsize, unit=nranks)
    return total // nranks, total // nranks, total


def init(case: Case):
    """Rank r sends its pattern (seed r); the root expects all n patterns in rank order, the others nothing
    (None)."""
    expected = None
    if case.rank == case.root:
        expected = np.concatenate([pattern(case.count, r, case.dtype) for r in range(case.nranks)])
    return pattern(case.count, case.rank, case.dtype), expected


COLLECTIVE = Collective("gather", collective("gather"), counts=counts, init=init)
