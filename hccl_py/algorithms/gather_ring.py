"""Chain gather (HCCL's ring Gather): the mirror of ``scatter_ring``. Blocks flow up the chain
root-1, ..., root+1, root: in step s relative rank v sends its parent v-1 the block of relative
rank v+s (its own IN first, then what it received the step before) and receives from v+1 the
block of rank v+1+s; the root receives block v+1+s straight into its OUT.

Steps: size-1 (the root's own block is a copy on its first step). Sent per rank: (size-v) * count elements. TMP: 2 * count.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

from ._common import absolute, block_chain_flows, finish, relative
from .schedule import IN, OUT, TMP, Copy, Recv, Region, Schedule, Send, Step, StepFlows

# the schedules number ranks from the root: flows for root 0 serve any root, rotated (simulator._Rotated)
RELATIVE_TO_ROOT = True


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Ring (chain) gather: over size-1 steps the blocks flow up the chain to the root, forwarded through
    two TMP slots; returns the Schedule of rank ``rank``."""
    v = relative(rank, root, size)
    up, down = absolute(v - 1, root, size), absolute(v + 1, root, size)
    slot = [Region(TMP, 0, count), Region(TMP, count, count)]
    steps = []
    for s in range(size - 1):
        sends, recvs = (), ()
        if v > 0 and v + s <= size - 1:
            sends = (Send(up, Region(IN, 0, count) if s == 0 else slot[(s - 1) % 2]),)
        if v + 1 + s <= size - 1:
            origin = v + 1 + s
            recvs = (Recv(down, Region(OUT, absolute(origin, root, size) * count, count) if v == 0 else slot[s % 2]),)
        steps.append(Step(sends=sends, recvs=recvs))
    if v == 0:  # the root's own block: a local copy on its first step (it receives another block then)
        own = Copy(Region(IN, 0, count), Region(OUT, root * count, count))
        steps[:1] = [Step(copies=(own,), recvs=steps[0].recvs)] if steps else [Step(copies=(own,))]
    return finish(steps)


def flows(size: int, count: int, root: int = 0) -> Iterator[StepFlows]:
    """Every rank's steps at once (``StepFlows.senders``: in step s ranks 1 .. size-1-s pass a
    block up); root 0,
    ``size >= 2``, ``count >= 1``."""
    return block_chain_flows("ring gather", size, count, root, True, lambda s: slice(1, size - s))
