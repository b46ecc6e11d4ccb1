"""Helpers shared by the schedule modules: building a ``Schedule`` and naming chunk spans."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from .schedule import TMP, Buf, Region, Schedule, Step, StepFlows, chunk_bounds

Bounds = Sequence[tuple[int, int]]  # (offset, count) per chunk, contiguous and in order


def finish(steps: Iterable[Step], *, aligned: bool = False, whole_rounds: bool = False) -> Schedule:
    """The schedule of ``steps`` with zero-count copies, sends and receives left out, then empty
    steps; ``tmp_count`` is the end of the highest TMP region used.

    Both ends of a transfer compute the same count, so dropping the empty ones here keeps FIFO
    matching consistent and lets the algorithms be written without special cases for
    ``count < size``. (Barrier messages carry one element, so they are kept.)

    ``aligned``: keep the empty steps before a rank's last non-empty one, so that step k of every
    rank is the algorithm's step k (a chain's rank idles until the data reaches it). The cost
    model shares links among the k-th steps of all ranks, and the cluster-scale simulator's flows
    need a message's two ends in the same step.

    ``whole_rounds`` (with ``aligned``): keep the trailing empty steps too, when anything moves at
    all, so that every rank has every round (the tree allreduce): a phase after it in a two-level
    composite then starts at the same step on every rank.
    """
    kept = []
    for step in steps:
        if not (
            all(c.dst.count for c in step.copies)
            and all(s.src.count for s in step.sends)
            and all(r.dst.count for r in step.recvs)
        ):  # rebuilt only when something is empty
            step = Step(
                copies=tuple(c for c in step.copies if c.dst.count),
                sends=tuple(s for s in step.sends if s.src.count),
                recvs=tuple(r for r in step.recvs if r.dst.count),
            )
        if step.copies or step.sends or step.recvs or aligned:
            kept.append(step)
    moves = any(step.copies or step.sends or step.recvs for step in kept)
    while (
        aligned and kept and not (whole_rounds and moves) and not (kept[-1].copies or kept[-1].sends or kept[-1].recvs)
    ):
        kept.pop()
    regions = [
        region
        for step in kept
        for region in (
            *(c.src for c in step.copies),
            *(c.dst for c in step.copies),
            *(c.reduce_with for c in step.copies if c.reduce_with is not None),
            *(s.src for s in step.sends),
            *(r.dst for r in step.recvs),
            *(r.reduce_with for r in step.recvs if r.reduce_with is not None),
        )
    ]
    tmp_count = max((r.end for r in regions if r.buf == TMP), default=0)
    return Schedule(steps=tuple(kept), tmp_count=tmp_count)


def span(buf: Buf, bounds: Bounds, lo: int, hi: int) -> Region:
    """Region of ``buf`` covering chunks ``lo .. hi-1`` of ``bounds`` (empty when ``lo >= hi``)."""
    if lo >= hi:
        return Region(buf, 0, 0)
    start = bounds[lo][0]
    end = bounds[hi - 1][0] + bounds[hi - 1][1]
    return Region(buf, start, end - start)


def block_bounds(count: int, blocks: int) -> list[tuple[int, int]]:
    """``blocks`` equal blocks of ``count`` elements: the per-rank layout of allgather's OUT and
    reduce_scatter's IN."""
    return [(i * count, count) for i in range(blocks)]


def relative(rank: int, root: int, size: int) -> int:
    """Rank renumbered so that ``root`` is 0 (how rooted trees and chains are laid out)."""
    return (rank - root) % size


def absolute(vrank: int, root: int, size: int) -> int:
    """Inverse of ``relative``."""
    return (vrank + root) % size


def ring_indices(rank: int, size: int, shift: int) -> list[tuple[int, int]]:
    """Chunk indices (sent, received) in each of the ``size - 1`` steps of one trip round the
    ring, sending to ``rank + 1`` and receiving from ``rank - 1``.

    In step s rank r sends chunk ``r + shift - s`` and receives chunk ``r + shift - s - 1``
    (mod size): what it receives in one step is what it sends in the next. After the trip
    (reduce-scatter) the rank has completed chunk ``r + shift + 1``; in an allgather it starts
    owning chunk ``r + shift``.
    """
    return [((rank + shift - s) % size, (rank + shift - s - 1) % size) for s in range(size - 1)]


def packed_displacements(counts: Sequence[int]) -> tuple[int, ...]:
    """Offsets of blocks of ``counts`` elements laid end to end: ``(3, 0, 2)`` -> ``(0, 3, 3)``."""
    out, offset = [], 0
    for n in counts:
        out.append(offset)
        offset += n
    return tuple(out)


def equal_blocks(schedule_v, rank: int, size: int, count: int) -> Schedule:
    """An all-to-all of ``count`` elements per block as its counts-per-pair form ``schedule_v``
    (``(rank, counts, send_displs, recv_displs)``) with equal, packed counts; no steps when
    nothing moves (without building the peers' empty messages)."""
    if count == 0:
        return finish([])
    counts = ((count,) * size,) * size
    displs = packed_displacements(counts[0])
    return schedule_v(rank, counts, displs, displs)


def chain_pattern(size: int, towards_root: bool) -> tuple[np.ndarray, np.ndarray]:
    """(send_to, recv_from) of the chain 0 -> 1 -> ... -> size-1 (or back towards 0): the whole
    pattern that chain flows (``StepFlows.senders``) take their active part of, step by step."""
    ranks = np.arange(size)
    ahead = np.where(ranks < size - 1, ranks + 1, -1)
    behind = np.where(ranks > 0, ranks - 1, -1)
    return (behind, ahead) if towards_root else (ahead, behind)


def block_chain_flows(what: str, size: int, count: int, root: int, towards_root: bool, senders):
    """The flows of a chain that passes whole blocks of ``count`` elements (ring scatter and
    gather): ``senders(s)`` is the slice of ranks that send in step s; the root (0) copies its own
    block on the first step. ValueError unless root 0, ``size >= 2`` and ``count >= 1``."""
    if size < 2 or count < 1 or root != 0:
        raise ValueError(f"{what} flows need root 0, size >= 2 and count >= 1")
    send_to, recv_from = chain_pattern(size, towards_root)
    counts = np.full(size, count)
    own = np.zeros(size, dtype=np.int64)
    own[0] = count
    for s in range(size - 1):
        yield StepFlows(send_to, counts, recv_from, False, copies=(own,) if s == 0 else (), senders=senders(s))


def chunk_prefix(count: int, parts: int) -> np.ndarray:
    """Prefix sums of the sizes of ``chunk_bounds(count, parts)``: chunks i .. j-1 hold
    ``prefix[j] - prefix[i]`` elements (flows read whole ranges of chunks per rank this way)."""
    return np.concatenate(([0], np.cumsum([n for _, n in chunk_bounds(count, parts)])))


def without_empty(step: StepFlows) -> StepFlows:
    """A one-lane step without its zero-element messages, as ``finish`` leaves them out of the
    schedules (fewer elements than chunks: some chunks are empty)."""
    if step.send_to.ndim != 1 or step.recv_lane is not None or step.senders is not None:
        raise ValueError("without_empty takes one-lane steps of plain arrays")
    empty = step.send_count == 0
    if not empty.any():
        return step
    sending = np.where(empty, -1, step.send_to)
    has = step.recv_from >= 0
    receiving = np.where(has & ~empty[np.where(has, step.recv_from, 0)], step.recv_from, -1)
    return StepFlows(sending, step.send_count, receiving, step.reduce, copies=step.copies, repeat=step.repeat)


# Flows list the root's size-1 transfers as lanes of size entries each: kept to servers and
# groups (rank by rank, a root's exchange with every rank is only 2 * (size - 1) messages).
ROOT_LANES_MAX_SIZE = 1024


def root_lanes(what: str, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(to_root, from_peers, lanes) of the step in which every rank sends rank 0 one message:
    rank 0 receives rank j's in its lane j-1 (rank order), each sender's lane 0. ValueError
    unless ``2 <= size <= ROOT_LANES_MAX_SIZE``."""
    if not 2 <= size <= ROOT_LANES_MAX_SIZE:
        raise ValueError(f"{what} flows need 2 <= size <= {ROOT_LANES_MAX_SIZE}")
    to_root = np.zeros(size, dtype=np.int64)
    to_root[0] = -1
    from_peers = np.full((size - 1, size), -1)
    from_peers[:, 0] = np.arange(1, size)
    return to_root, from_peers, np.zeros((size - 1, size), dtype=np.int64)


def chunk_windows(count: int, parts: int, size: int) -> np.ndarray:
    """The sizes of ``chunk_bounds(count, parts)`` at ``size..size+parts-1`` of an array of
    ``parts + 2 * size`` zeros, so that each step of a pipelined chain reads its ranks' chunk sizes
    as one view (``[t + 1 : t + 1 + size]``, or reversed)."""
    padded = np.zeros(parts + 2 * size, dtype=np.int64)
    padded[size : size + parts] = [n for _, n in chunk_bounds(count, parts)]
    return padded


def mesh_lanes(size: int) -> tuple[np.ndarray, np.ndarray]:
    """(peers, lanes): ``peers[j, r]`` is rank r's j-th peer in rank order (j < size - 1), the
    order its sends and receives are listed in; ``lanes[j, r]`` is the position of r among that
    peer's own peers, i.e. the lane of the peer's send that r receives."""
    ranks = np.arange(size)
    j = np.arange(size - 1)[:, None]
    peers = np.where(j < ranks, j, j + 1)
    lanes = np.where(ranks < peers, ranks, ranks - 1)
    return peers, lanes
