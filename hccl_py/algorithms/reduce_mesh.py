"""Full-mesh reduce: direct reduce-scatter, then every chunk owner sends its chunk to the root.

The buffer is cut into ``size`` chunks; rank j owns chunk j. Step 1: every rank sends chunk j
of IN to rank j; the owner reduces its own chunk with the incoming ones in rank order (receives
listed by peer rank) - into OUT on the root, into TMP elsewhere (non-root buffers stay
untouched). Step 2: every non-root owner sends its reduced chunk to the root.

Steps: 2. Sent per non-root rank: (size-1)/size * count + count/size elements; received by the
root: (size-1)/size * count in each step. TMP: one chunk (ceil(count/size) elements) on
non-root ranks.
"""

from __future__ import annotations

from functools import lru_cache

from ._common import finish
from .schedule import IN, OUT, TMP, Recv, Region, Schedule, Send, Step, chunk_bounds


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Mesh reduce: one step of direct reduce-scatter (chunk j to rank j), then every owner sends its
    reduced chunk to the root; returns the Schedule of rank ``rank``."""
    bounds = chunk_bounds(count, size)
    own = Region(IN, *bounds[rank])
    acc = Region(OUT, *bounds[rank]) if rank == root else Region(TMP, 0, bounds[rank][1])
    peers = [j for j in range(size) if j != rank]
    scatter = Step(
        sends=tuple(Send(j, Region(IN, *bounds[j])) for j in peers),
        recvs=tuple(Recv(j, acc, reduce_with=acc if i else own) for i, j in enumerate(peers)),
    )
    if rank == root:
        gather = Step(recvs=tuple(Recv(j, Region(OUT, *bounds[j])) for j in peers))
    else:
        gather = Step(sends=(Send(root, acc),))
    return finish([scatter, gather])
