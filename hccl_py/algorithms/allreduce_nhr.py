"""NHR allreduce (HCCL's ``AllReduceNHR``): NHR reduce-scatter, then NHR allgather, in place, on
HCCL's tree layout (the step structure and the layout are in ``_nhr``).

OUT is cut into size chunks; logical block x lies at chunk ``tree_map(size)[x]``, which puts the
blocks of one step next to each other, and each run of adjacent chunks is one message (HCCL's
``MergeSlices``; one run per step when size is a power of two). Reduce-scatter step k sends to
rank - 2^k the runs of blocks ``r - 2^k - i 2^(k+1)`` and reduces into its own copy those of
blocks ``r - i 2^(k+1)`` from rank + 2^k; after S = ceil(log2 size) steps rank r holds block r
complete, and the allgather's S steps hand the complete blocks back along the same trees. Every
element is reduced by one rank and then copied, so all ranks end bit-identical. At <= 256 KiB
per device HCCL runs NHR's one-shot form instead, a binomial reduce of the whole buffer to rank 0
and a binomial broadcast: that is ``tree``, which ``auto`` runs there (below 512 KB on servers of
3 or more NPUs HCCL takes a small-count executor instead, see docs/fidelity.md); ``nhr`` by name
is the segmented algorithm at every size.

Steps: 2 * ceil(log2 size), for any size (no fold). Sent per rank: 2 * (size-1)/size * count
elements (as many received). TMP: none (in place).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import numpy as np

from ._common import chunk_prefix, finish, span
from ._nhr import ag_step, nsteps, rs_step, runs, step_runs, tree_map
from .schedule import OUT, Recv, Schedule, Send, Step, StepFlows, chunk_bounds


@lru_cache(maxsize=256)
def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """NHR allreduce: ceil(log2 size) reduce-scatter steps, then as many allgather steps, each a
    message per run of adjacent chunks in HCCL's tree layout; returns the Schedule of rank
    ``rank``."""
    chunks = chunk_bounds(count, size)
    mapping = tree_map(size)

    def regions(blocks: list[int]) -> list:  # one region of OUT per run of adjacent chunks
        return [span(OUT, chunks, lo, hi) for lo, hi in runs([mapping[x] for x in blocks])]

    steps = []
    for k in range(nsteps(size)):
        to, sent, frm, got = rs_step(rank, size, k)
        steps.append(
            Step(
                sends=tuple(Send(to, r) for r in regions(sent)),
                recvs=tuple(Recv(frm, r, reduce_with=r) for r in regions(got)),
            )
        )
    for k in range(nsteps(size)):
        to, sent, frm, got = ag_step(rank, size, k)
        steps.append(
            Step(sends=tuple(Send(to, r) for r in regions(sent)), recvs=tuple(Recv(frm, r) for r in regions(got)))
        )
    return finish(steps)


def flows(size: int, count: int, root: int = 0) -> Iterator[StepFlows]:
    """Every rank's steps at once (see ``StepFlows``): one lane per run; needs ``size >= 2`` and
    ``count >= size`` so no chunk is empty."""
    if size < 2 or count < size:
        raise ValueError("nhr allreduce flows need size >= 2 and count >= size")
    prefix = chunk_prefix(count, size)
    ranks = np.arange(size)
    top = nsteps(size) - 1

    def lanes(k: int, send: bool) -> tuple[np.ndarray, np.ndarray]:  # (elements, valid) per lane
        lo, hi = step_runs(size, k, send)
        valid = lo >= 0
        return np.where(valid, prefix[np.maximum(hi, 0)] - prefix[np.maximum(lo, 0)], 0), valid

    for k in range(top + 1):  # reduce-scatter: runs to rank - 2^k, reduce those from rank + 2^k
        elements, valid = lanes(k, True)
        _, got = lanes(k, False)
        to = np.where(valid, (ranks - (1 << k)) % size, -1)
        frm = np.where(got, (ranks + (1 << k)) % size, -1)
        yield StepFlows(to, elements, frm, True)
    for k in range(top + 1):  # allgather: reduce-scatter step j backwards, to rank + 2^j
        j = top - k
        elements, valid = lanes(j, False)  # sends what rs step j received
        _, got = lanes(j, True)
        to = np.where(valid, (ranks + (1 << j)) % size, -1)
        frm = np.where(got, (ranks - (1 << j)) % size, -1)
        yield StepFlows(to, elements, frm, False)
