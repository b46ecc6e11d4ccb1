"""Gather to one rank, fold there, broadcast (HCCL's ``AllReduceLocalReduceBcast``, the template
its small-count allreduce runs inside servers whose NPU count is not a power of two, and its
deterministic allreduce up to 128 KB in one server not of 8: hcomm
``libochao-huawei/hcomm@8958adbf`` ``alg_template/temp_all_reduce/all_reduce_local_reduce_bcast.cc``).

Step 1: rank 0 copies its buffer into slot 0 of g-1 TMP slots; rank 1 sends its buffer to rank 0,
which reduces it into slot 0 (HCCL's rank 1 writes with the transfer engine's inline reduce),
and every rank r >= 2 sends its buffer into slot r-1, all at once. Step 2: rank 0 folds the
slots in HCCL's fixed order (``RunLocalReduce``): with p the largest power of two <= g-1, slots
p .. g-2 onto slots 0 .. g-2-p in one reduction, then halving: slots [s, 2s) onto [0, s) for
s = p/2, p/4, .., 1; then it copies slot 0 to its OUT and sends it to every rank at once. Only
rank 0 computes, so all ranks end bit-identical.

Steps: 2. Sent: (size-1) * count elements by rank 0 and count by every other rank (as many
received). TMP: (size-1) * count on rank 0. Allreduce only.
"""

from __future__ import annotations

from functools import lru_cache

from ._common import finish
from .schedule import OUT, TMP, Copy, Recv, Region, Schedule, Send, Step


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Gather-fold-broadcast allreduce: every rank's buffer into a slot of rank 0's, folded there in
    HCCL's order, the result sent to all; returns the Schedule of rank ``rank`` (none for size 1 or
    count 0)."""
    if size == 1 or count == 0:
        return finish([])
    whole = Region(OUT, 0, count)
    if rank != 0:
        return finish([Step(sends=(Send(0, whole),)), Step(recvs=(Recv(0, whole),))])
    slots = size - 1

    def span(first: int, n: int) -> Region:  # slots first .. first+n-1
        return Region(TMP, first * count, n * count)

    gather = Step(
        copies=(Copy(whole, span(0, 1)),),
        recvs=(Recv(1, span(0, 1), reduce_with=span(0, 1)), *(Recv(r, span(r - 1, 1)) for r in range(2, size))),
    )
    power = 1 << (slots.bit_length() - 1)  # the largest power of two <= size - 1
    folds = []
    if power < slots:
        folds.append(Copy(span(power, slots - power), span(0, slots - power), reduce_with=span(0, slots - power)))
    half = power // 2
    while half:
        folds.append(Copy(span(half, half), span(0, half), reduce_with=span(0, half)))
        half //= 2
    bcast = Step(copies=(*folds, Copy(span(0, 1), whole)), sends=tuple(Send(r, span(0, 1)) for r in range(1, size)))
    return finish([gather, bcast])
