"""Scatter: rank r gets block r of the root's buffer (out of place).

Size is the root's whole buffer (n blocks), as in nccl-tests. busbw = algbw * (n-1)/n.
Only the root has an input (the others' is empty, as hccl-py's ``scatter`` takes ``x=None``
there); block r is rank r's own pattern, so a block sent to the wrong rank is caught.
"""

from __future__ import annotations

import numpy as np

from hccl_py.collectives import collective

from .base import Case, Collective, elements, pattern


def counts(nbytes: int, itemsize: int, nranks: int) -> tuple[int, int, int]:
    """``nbytes`` is the root's send buffer, rounded to n blocks: (block, n blocks, block)."""
    total = elements(nbytes, itemsize, unit=nranks)
    return total // nranks, total, total // nranks


def init(case: Case):
    """The root sends all n patterns in rank order (the others an empty buffer); rank r expects
    pattern r."""
    if case.rank == case.root:
        send = np.concatenate([pattern(case.count, r, case.dtype) for r in range(case.nranks)])
    else:
        send = np.empty(0, case.dtype)
    return send, pattern(case.count, case.rank, case.dtype)


COLLECTIVE = Collective("scatter", collective("scatter"), counts=counts, init=init)
