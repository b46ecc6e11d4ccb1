"""HCCL's NHR (nonuniform hierarchical ring): the step structure its reduce-scatter, allgather and
allreduce share, for any number of ranks.

Source: CANN hcomm (``libochao-huawei/hcomm@8958adbf``,
``src/legacy/ascend910/algorithm/base/alg_template/``): ``nonuniform_hierarchical_ring_base.cc``
(step count L139-147, rank mapping L20-91, slice merging L94-136),
``temp_reduce_scatter/reduce_scatter_nhr.cc`` (GetStepInfo L552-593),
``temp_all_gather/all_gather_nhr.cc`` (GetStepInfo L228-268); the same formulas in
``hicann/hccl@09300b70`` ``src/ops/*/template/aicpu/ins_temp_*_nhr.cc``; costs in
``docs/zh/user_guide/coll_algo_intro/NHR.md``.

With n ranks there are S = ceil(log2 n) steps. In reduce-scatter step k every rank r sends to
r - 2^k the ``c_k = (n - 1 + 2^k) // 2^(k+1)`` blocks ``(r - 2^k - i 2^(k+1)) mod n`` (i < c_k)
and receives from r + 2^k the blocks ``(r - i 2^(k+1)) mod n``, reducing them in: each block is
reduced along a binomial tree rooted at its owner (n trees), and the c_k sum to n - 1, so every
rank sends (n-1)/n of the data in ceil(log2 n) steps whatever n is. Allgather is the same steps
reversed in time and direction (the largest step last).

Blocks are *logical*; HCCL's allreduce lays logical block x at physical chunk ``tree_map(n)[x]``
(an even/odd reordering, bit reversal for powers of two), so that a step's blocks lie next to each
other and merge into few transfers; standalone reduce-scatter and allgather keep the user's
layout and send one transfer per block.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


def nsteps(n: int) -> int:
    """Steps of an NHR reduce-scatter or allgather on ``n`` ranks: ceil(log2 n) (0 for one rank)."""
    return (n - 1).bit_length()


def blocks_per_step(n: int, k: int) -> int:
    """Blocks each rank moves in reduce-scatter step ``k`` (allgather step S-1-k)."""
    return (n - 1 + (1 << k)) >> (k + 1)


def rs_step(rank: int, n: int, k: int) -> tuple[int, list[int], int, list[int]]:
    """Reduce-scatter step ``k`` of ``rank``: (peer sent to, logical blocks sent, peer received
    from, logical blocks received and reduced in), blocks in HCCL's order."""
    d, stride, c = 1 << k, 2 << k, blocks_per_step(n, k)
    sent = [(rank - d - i * stride) % n for i in range(c)]
    got = [(rank - i * stride) % n for i in range(c)]
    return (rank - d) % n, sent, (rank + d) % n, got


def ag_step(rank: int, n: int, k: int) -> tuple[int, list[int], int, list[int]]:
    """Allgather step ``k`` of ``rank``: (peer sent to, logical blocks sent, peer received from,
    logical blocks received): reduce-scatter step S-1-k run backwards."""
    j = nsteps(n) - 1 - k
    d, stride, c = 1 << j, 2 << j, blocks_per_step(n, j)
    sent = [(rank - i * stride) % n for i in range(c)]
    got = [(rank - d - i * stride) % n for i in range(c)]
    return (rank + d) % n, sent, (rank - d) % n, got


@lru_cache(maxsize=64)
def tree_map(n: int) -> tuple[int, ...]:
    """Physical chunk of each logical block in HCCL's allreduce (``GetRankMapping`` without
    ``keepOrder``): while a step moves more than one block, cut the order into parts of the
    current length, move each part's even offsets to its front and odd offsets behind them, and
    halve the length (stop after a pass with a part of odd length); the map is the inverse of
    the resulting order. n = 6: (0, 3, 1, 4, 2, 5); powers of two: bit reversal."""
    order = list(range(n))
    length = n
    step = 0
    while length > 0 and blocks_per_step(n, step) > 1:
        odd = False
        moved = list(order)
        for start in range(0, n, length):
            part = order[start : start + length]
            odd = odd or len(part) % 2 == 1
            for offset, value in enumerate(part):
                moved[start + (offset // 2 if offset % 2 == 0 else (offset + length) // 2)] = value
        order = moved
        if odd:
            break
        length //= 2
        step += 1
    mapping = [0] * n
    for position, block in enumerate(order):
        mapping[block] = position
    return tuple(mapping)


def runs(chunks: list[int]) -> list[tuple[int, int]]:
    """Physical chunk indices merged into maximal runs [lo, hi) of adjacent chunks, in order of
    position (HCCL's ``MergeSlices``: one transfer per run)."""
    out: list[list[int]] = []
    for c in sorted(chunks):
        if out and out[-1][1] == c:
            out[-1][1] = c + 1
        else:
            out.append([c, c + 1])
    return [(lo, hi) for lo, hi in out]


def step_runs(n: int, k: int, send: bool) -> tuple[np.ndarray, np.ndarray]:
    """For reduce-scatter step ``k`` of allreduce's tree layout, every rank's runs at once:
    (lo, hi) arrays of shape (lanes, n), -1 where a rank has fewer runs. ``send``: the runs each
    rank sends, else those it receives (the same set as its sender's)."""
    d, stride, c = 1 << k, 2 << k, blocks_per_step(n, k)
    mapping = np.asarray(tree_map(n))
    if n & (n - 1) == 0:  # bit reversal: the blocks = a (mod 2^(k+1)) are the one run from map[a]
        lo = mapping[(np.arange(n) - (d if send else 0)) % stride][None, :]
        return lo, lo + c
    ranks = np.arange(n)[:, None]
    logical = (ranks - (d if send else 0) - np.arange(c)[None, :] * stride) % n
    chunks = np.sort(mapping[logical], axis=1)
    starts = np.ones(chunks.shape, dtype=bool)
    starts[:, 1:] = chunks[:, 1:] != chunks[:, :-1] + 1
    ends = np.ones(chunks.shape, dtype=bool)
    ends[:, :-1] = starts[:, 1:]
    lanes = int(starts.sum(axis=1).max())
    lo = np.full((lanes, n), -1, dtype=np.int64)
    hi = np.full((lanes, n), -1, dtype=np.int64)
    lane_of = np.cumsum(starts, axis=1) - 1
    rows, cols = np.nonzero(starts)
    lo[lane_of[rows, cols], rows] = chunks[rows, cols]
    rows, cols = np.nonzero(ends)
    hi[lane_of[rows, cols], rows] = chunks[rows, cols] + 1
    return lo, hi
