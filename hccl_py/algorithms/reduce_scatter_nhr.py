"""NHR reduce-scatter (HCCL's ``ReduceScatterNHR``; the step structure is in ``_nhr``).

In step k = 0 .. S-1 (S = ceil(log2 size)) rank r sends to r - 2^k its partials of the c_k blocks
``r - 2^k - i 2^(k+1)`` and reduces the partials r + 2^k sends of blocks ``r - i 2^(k+1)``: block
x travels down a binomial tree rooted at rank x, one level a step, and arrives complete. One
message per block, in the user's layout, as HCCL's standalone reduce-scatter sends (no merging).
Partials live in TMP (IN is never written); rank r accumulates its own block in OUT.

Steps: ceil(log2 size), for any size (no fold). Sent per rank: (size-1) * count elements (as
many received), in size-1 messages. TMP: size * count elements (blocks forwarded).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import numpy as np

from ._common import block_bounds, finish
from ._nhr import blocks_per_step, nsteps, rs_step
from .schedule import IN, OUT, TMP, Copy, Recv, Region, Schedule, Send, Step, StepFlows


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """NHR reduce-scatter: ceil(log2 size) steps, each sending c_k partials to rank - 2^k and
    reducing c_k from rank + 2^k; returns the Schedule of rank ``rank``."""
    blocks = block_bounds(count, size)
    if size == 1:
        return finish([Step(copies=(Copy(Region(IN, 0, count), Region(OUT, 0, count)),))])
    partial = {x: Region(IN, *blocks[x]) for x in range(size)}  # where this rank's partial of x lies
    steps = []
    for k in range(nsteps(size)):
        to, sent, frm, got = rs_step(rank, size, k)
        sends = tuple(Send(to, partial[x]) for x in sent)
        recvs = []
        for x in got:
            acc = Region(OUT, 0, count) if x == rank else Region(TMP, *blocks[x])
            recvs.append(Recv(frm, acc, reduce_with=partial[x]))
            partial[x] = acc
        steps.append(Step(sends=sends, recvs=tuple(recvs)))
    return finish(steps)


def flows(size: int, count: int, root: int = 0) -> Iterator[StepFlows]:
    """Every rank's steps at once (see ``StepFlows``): step k is c_k messages of ``count`` to
    rank - 2^k (one lane, repeated); needs ``size >= 2`` and ``count >= 1``."""
    if size < 2 or count < 1:
        raise ValueError("nhr reduce_scatter flows need size >= 2 and count >= 1")
    ranks = np.arange(size)
    counts = np.full(size, count)
    for k in range(nsteps(size)):
        to, frm = (ranks - (1 << k)) % size, (ranks + (1 << k)) % size
        yield StepFlows(to, counts, frm, True, repeat=blocks_per_step(size, k))
