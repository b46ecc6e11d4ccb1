"""AlltoAll: block j of rank r's buffer goes to rank j, where it becomes block r (out of place).

Size is the whole send buffer (n blocks), as in nccl-tests. busbw = algbw * (n-1)/n.
Each (source, destination) block has its own pattern (seed ``n*source + destination``), so a
block delivered to the wrong rank or into the wrong slot is caught.
"""

from __future__ import annotations

import numpy as np

from hccl_py.collectives import collective

from .base import Case, Collective, elements, pattern


def counts(nbytes: int, itemsize: int, nranks: int) -> tuple[int, int, int]:
    """``nbytes`` is the whole send buffer, rounded to n blocks: (block, n blocks, n blocks)."""
    total = elements(nbytes, itemsize, unit=nranks)
    return total // nranks, total, total


def _block(case: Case, src: int, dst: int) -> np.ndarray:
    return pattern(case.count, case.nranks * src + dst, case.dtype)


def init(case: Case):
    """Rank r sends block (r, j) to every rank j and expects block (i, r) from every rank i, in slot i."""
    n, r = case.nranks, case.rank
    return (
        np.concatenate([_block(case, r, j) for j in range(n)]),
        np.concatenate([_block(case, i, r) for i in range(n)]),
    )


COLLECTIVE = Collective("alltoall", collective("alltoall"), counts=counts, init=init)
