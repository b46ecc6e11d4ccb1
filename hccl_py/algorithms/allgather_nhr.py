"""NHR allgather (HCCL's ``AllGatherNHR``; the step structure is in ``_nhr``).

Every rank copies IN into its block of OUT. In step k = 0 .. S-1 (S = ceil(log2 size)), with
j = S-1-k, rank r sends to r + 2^j the c_j blocks ``r - i 2^(j+1)`` it holds and receives from
r - 2^j the blocks ``r - 2^j - i 2^(j+1)``: the reduce-scatter's binomial trees run backwards, the
largest step last. One message per block, in the user's layout, as HCCL's standalone allgather
sends (no merging).

Steps: ceil(log2 size), for any size (no fold). Sent per rank: (size-1) * count elements (as
many received), in size-1 messages. TMP: none.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import numpy as np

from ._common import block_bounds, finish
from ._nhr import ag_step, blocks_per_step, nsteps
from .schedule import IN, OUT, Copy, Recv, Region, Schedule, Send, Step, StepFlows


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """NHR allgather: copy IN to its block, then ceil(log2 size) steps sending the blocks held to
    rank + 2^j and receiving from rank - 2^j, j falling; returns the Schedule of rank ``rank``."""
    blocks = block_bounds(count, size)
    steps = [Step(copies=(Copy(Region(IN, 0, count), Region(OUT, *blocks[rank])),))]
    for k in range(nsteps(size)):
        to, sent, frm, got = ag_step(rank, size, k)
        sends = tuple(Send(to, Region(OUT, *blocks[x])) for x in sent)
        recvs = tuple(Recv(frm, Region(OUT, *blocks[x])) for x in got)
        if k == 0:
            steps[0] = Step(copies=steps[0].copies, sends=sends, recvs=recvs)
        else:
            steps.append(Step(sends=sends, recvs=recvs))
    return finish(steps)


def flows(size: int, count: int, root: int = 0) -> Iterator[StepFlows]:
    """Every rank's steps at once (see ``StepFlows``): step k is c_j messages of ``count`` to
    rank + 2^j (one lane, repeated); needs ``size >= 2`` and ``count >= 1``."""
    if size < 2 or count < 1:
        raise ValueError("nhr allgather flows need size >= 2 and count >= 1")
    ranks = np.arange(size)
    counts = np.full(size, count)
    top = nsteps(size) - 1
    for k in range(top + 1):
        j = top - k
        to, frm = (ranks + (1 << j)) % size, (ranks - (1 << j)) % size
        yield StepFlows(to, counts, frm, False, copies=(count,) if k == 0 else (), repeat=blocks_per_step(size, j))
