"""Reduce to one rank, then broadcast from it (HCCL's ``AllReduceReduceBcast``, the template its
``AllReduceMeshSmallCountExecutor`` runs inside one 910B server up to 256 KB: hcomm
``libochao-huawei/hcomm@8958adbf`` ``alg_template/temp_all_reduce/all_reduce_reduce_broadcast.cc``
and ``coll_all_reduce_mesh_small_count_executor.cc`` L200-203).

Step 1: every rank but rank 0 sends its whole buffer to rank 0, all at once, each over its own
link; rank 0 reduces each into its OUT as it lands (HCCL's peers write with the transfer
engine's inline reduce, in arrival order; here in rank order, so the result never depends on
arrival order). Step 2: rank 0 sends the result to every rank at once. Only rank 0 computes, so
all ranks end bit-identical. HCCL's rank 0 also copies its input into its CCL buffer first and
the result back out (2 x 2n / HBM, 0.7 us at 256 KB on a 910B), which is not charged here: only
rank 0 would copy, and the two-level small-count allreduce's flows need every rank to copy alike.

Steps: 2. Sent: (size-1) * count elements by rank 0 and count by every other rank (as many
received). TMP: none (in place). Allreduce only.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import numpy as np

from ._common import finish, root_lanes
from .schedule import OUT, Recv, Region, Schedule, Send, Step, StepFlows


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Reduce-broadcast allreduce: every rank's buffer reduced into rank 0's in rank order, then rank
    0's result sent to all; returns the Schedule of rank ``rank`` (none for size 1 or count 0)."""
    if size == 1 or count == 0:
        return finish([])
    whole = Region(OUT, 0, count)
    if rank == 0:
        return finish(
            [
                Step(recvs=tuple(Recv(j, whole, reduce_with=whole) for j in range(1, size))),
                Step(sends=tuple(Send(j, whole) for j in range(1, size))),
            ]
        )
    return finish([Step(sends=(Send(0, whole),)), Step(recvs=(Recv(0, whole),))])


def flows(size: int, count: int, root: int = 0) -> Iterator[StepFlows]:
    """Every rank's steps at once (rank 0's transfers one lane per peer);
    ``2 <= size <= ROOT_LANES_MAX_SIZE``, ``count >= 1``."""
    if count < 1:
        raise ValueError("reduce-broadcast flows need count >= 1")
    to_root, from_peers, lanes = root_lanes("reduce-broadcast", size)
    counts = np.full(size, count)
    yield StepFlows(to_root, counts, from_peers, True, lanes)
    lane = np.zeros((1, size), dtype=np.int64)
    lane[0, 1:] = np.arange(size - 1)  # rank r receives rank 0's lane r-1
    yield StepFlows(from_peers, np.broadcast_to(counts, (size - 1, size)), to_root, False, lane)
