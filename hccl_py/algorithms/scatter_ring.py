"""Chain scatter (HCCL's ring Scatter): the root feeds its blocks down the chain root, root+1,
..., root-1, farthest destination first; every rank forwards what is not its own one step
later, so all blocks arrive together in the last step.

In step s the root sends the block of relative rank size-1-s; relative rank v receives in steps
v-1 .. size-2 (its own block last, straight into OUT) and forwards in steps v .. size-2 what it
received the step before. Received blocks alternate between two TMP slots, so a step never
receives into the slot it sends from.

Steps: size-1 (the root's own block is a copy on its first step); relative rank v idles for v-1
steps until the chain reaches it, so step s is the same moment on every rank. Sent per rank:
(size-1-v) * count elements. TMP: 2 * count.
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
    """Ring (chain) scatter: over size-1 steps the root feeds blocks down the chain, farthest destination
    first, forwarded through two TMP slots; returns the Schedule of rank ``rank``."""
    v = relative(rank, root, size)
    nxt, prev = absolute(v + 1, root, size), absolute(v - 1, root, size)
    slot = [Region(TMP, 0, count), Region(TMP, count, count)]
    # the root's own block is a local copy riding on its first step (it sends other blocks then)
    steps = [Step(copies=(Copy(Region(IN, root * count, count), Region(OUT, 0, count)),))] if v == 0 else []
    for s in range(size - 1):
        sends, recvs = (), ()
        if v == 0:
            dest = size - 1 - s
            sends = (Send(nxt, Region(IN, absolute(dest, root, size) * count, count)),)
        else:
            if s >= v and v < size - 1:
                sends = (Send(nxt, slot[(s - 1) % 2]),)
            if s >= v - 1:
                dest = size - 2 - s + v
                recvs = (Recv(prev, Region(OUT, 0, count) if dest == v else slot[s % 2]),)
        if v == 0 and s == 0:
            steps[0] = Step(copies=steps[0].copies, sends=sends)
        else:
            steps.append(Step(sends=sends, recvs=recvs))
    return finish(steps, aligned=True)


def flows(size: int, count: int, root: int = 0) -> Iterator[StepFlows]:
    """Every rank's steps at once (``StepFlows.senders``: in step s ranks 0 .. s pass a block on); root 0,
    ``size >= 2``, ``count >= 1``."""
    return block_chain_flows("ring scatter", size, count, root, False, lambda s: slice(0, min(s, size - 2) + 1))
