"""Mesh scatter (HCCL's ScatterMesh template): the root talks to every rank directly, one after
another in rank order on its one stream, as HCCL's root does (``for (dstRank = 0; dstRank <
rankSize; dstRank++)``: wait for the receiver's ready, send, wait until done; its own block is a
local copy in its turn; hcomm ``temp_scatter/scatter_mesh.cc``). Every rank but the root receives
its block in one step.

Steps: size-1 at the root (its own copy rides with the send after it); rank j receives in the
root's step for j, idle before it. Sent by the
root: (size-1) * count elements, one block per step; received per rank: count. TMP: none.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import numpy as np

from ._common import finish
from .schedule import IN, OUT, Copy, Recv, Region, Schedule, Send, Step, StepFlows


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Mesh scatter: the root sends block j of its IN to rank j, j = 0, 1, ... in turn (its own
    block copied into OUT in its turn); returns the Schedule of rank ``rank``."""
    mine = Region(OUT, 0, count)
    if rank != root:  # idle until the root's turn for this rank: step s is the root's send s everywhere
        turn = rank if rank < root else rank - 1
        return finish([Step()] * turn + [Step(recvs=(Recv(root, mine),))], aligned=True)
    steps, copies = [], []
    for j in range(size):
        if j == root:
            copies.append(Copy(Region(IN, root * count, count), mine))
            continue
        steps.append(Step(copies=tuple(copies), sends=(Send(j, Region(IN, j * count, count)),)))
        copies = []
    if copies:  # the root is the last rank: its copy comes after the last send
        steps.append(Step(copies=tuple(copies)))
    return finish(steps)


def flows(size: int, count: int, root: int = 0) -> Iterator[StepFlows]:
    """Every rank's steps at once: in step j the root (0) sends rank j+1 its block (its own
    block copied on the first step); ``size >= 2``, ``count >= 1``."""
    if size < 2 or count < 1 or root != 0:
        raise ValueError("mesh scatter flows need root 0, size >= 2 and count >= 1")
    counts = np.full(size, count)
    own = np.zeros(size, dtype=np.int64)
    own[0] = count
    for j in range(1, size):
        send_to = np.full(size, -1)
        send_to[0] = j
        recv_from = np.full(size, -1)
        recv_from[j] = 0
        yield StepFlows(send_to, counts, recv_from, False, copies=(own,) if j == 1 else ())
