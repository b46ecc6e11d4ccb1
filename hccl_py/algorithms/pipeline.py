"""HCCL's two-level pipeline (910B across servers): the level-1 ring across servers and the
level-0 full mesh inside a server run in the same step, so the slower level hides the other.

Source: CANN hcomm (``libochao-huawei/hcomm@8958adbf``, ``src/legacy/ascend910/algorithm/base/
alg_template/``): ``temp_all_gather/all_gather_pipeline.cc`` (L132-233),
``temp_reduce_scatter/reduce_scatter_pipeline.cc`` (L58-172),
``temp_all_reduce/all_reduce_opbase_pipeline.cc`` (L64-300); HCCL's docs
``hicann/hccl@09300b70`` ``docs/zh/user_guide/coll_algo_intro/Pipeline.md``.

m groups (servers) of g ranks; rank (n, l) is member l of group n; the level-1 ring links the
ranks of one index l. Two TMP slots of one block each stand for HCCL's CCL buffers (HCCL's
reduce-scatter keeps three so its copy, SDMA and RDMA engines overlap; two suffice here, where a
rank's steps follow one another).

* **allgather** (m steps, ring towards n+1): in step s rank (n, l) holds the block of rank
  (n-s, l) in slot s; it copies it to OUT (step 0 first copies IN into slot 0), sends it to
  (n+1, l) unless s = m-1, and to every member of its group, receiving the next block from
  (n-1, l) into the other slot and each member's held block into OUT.
* **reduce_scatter** (m steps + a copy, ring towards n-1): in step k rank (n, l) accumulates
  the block of rank (n+k+1, l) in slot k: it copies its IN block there, every member of its group
  reduces its own IN block for that target in, and (k >= 1) (n+1, l) reduces in its partial of
  the same target, while (n, l) sends its finished partial of step k-1 to (n-1, l). The last
  target is (n, l) itself: the slot is copied to OUT.
* **allreduce** (2m steps, in place): the reduce-scatter's m steps on size slices of OUT (slice r
  reduced on rank r), then an allgather of the slices whose ring also runs towards n-1.

Every block is reduced once, at the rank it ends on, in the order copy, ring, members; allreduce
results are then only copied, so every rank ends bit-identical.

Steps: allgather m, reduce_scatter m + 1, allreduce 2m. Sent per rank and step: one block across
servers and g-1 inside (allgather, allreduce), or g-1 IN blocks inside and one partial across
(reduce_scatter). TMP: 2 blocks (allreduce: 2 of the largest slice).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Callable, Iterator

import numpy as np

from ..errors import HcclParamError
from ._common import finish
from .schedule import IN, OUT, TMP, Copy, Recv, Region, Schedule, Send, Step, StepFlows, chunk_bounds

PIPELINED = ("allgather", "reduce_scatter", "allreduce")

Partition = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class _Grid:
    """The partition as m equal groups of g: rank (n, l) = groups[n][l]."""

    groups: Partition

    @cached_property
    def m(self) -> int:
        return len(self.groups)

    @cached_property
    def g(self) -> int:
        return len(self.groups[0])

    @cached_property
    def where(self) -> dict[int, tuple[int, int]]:
        return {r: (n, l) for n, group in enumerate(self.groups) for l, r in enumerate(group)}

    def at(self, n: int, l: int) -> int:
        """The rank of member l of group n (n taken round the ring)."""
        return self.groups[n % self.m][l % self.g]

    @cached_property
    def matrix(self) -> np.ndarray:
        return np.array(self.groups)


def schedule_for(collective: str, partition: Partition) -> Callable[..., Schedule]:
    """The pipeline's schedule function of ``collective`` on ``partition`` (equal groups);
    ValueError for another collective or unequal groups."""
    if collective not in PIPELINED:
        raise ValueError(f"HCCL's pipeline serves {', '.join(PIPELINED)}, not {collective}")
    if len({len(group) for group in partition}) != 1:
        raise ValueError("HCCL's pipeline needs groups of one size")
    return _schedule_for(collective, tuple(tuple(g) for g in partition))


@lru_cache(maxsize=64)
def _schedule_for(collective: str, partition: Partition) -> Callable[..., Schedule]:
    grid = _Grid(partition)
    build = {"allgather": _allgather, "reduce_scatter": _reduce_scatter, "allreduce": _allreduce}[collective]
    name = f"hier[{';'.join(','.join(map(str, g)) for g in partition)}]:mesh/pipeline"

    @lru_cache(maxsize=256)
    def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
        if size != grid.m * grid.g:
            raise HcclParamError(
                f"{name} ({collective}) serves {grid.m * grid.g} ranks, not {size}",
                collective=collective,
                arg="size",
                value=size,
                rule="const",
                expected=grid.m * grid.g,
            )
        if count == 0:
            return finish([])
        return build(grid, rank, count)

    schedule.__qualname__ = schedule.__name__ = name
    schedule.collective, schedule.partition, schedule.inner, schedule.outer = collective, partition, "mesh", "pipeline"
    return schedule


def _rs_phase(
    grid: _Grid, rank: int, source: Callable[[int], Region], slot: Callable[[int, int], Region]
) -> list[Step]:
    """The pipelined reduce-scatter's m steps on rank ``rank``: in step k, accumulate the block of
    rank (n+k+1, l) in ``slot(k, that rank)`` from ``source`` (its own copy, then the ring's and the
    members' partials), sending the finished partial of step k-1 to (n-1, l)."""
    n, l = grid.where[rank]
    steps = []
    for k in range(grid.m):
        target = grid.at(n + k + 1, l)
        acc = slot(k, target)
        ring = k >= 1
        sends = ((Send(grid.at(n - 1, l), slot(k - 1, grid.at(n + k, l))),) if ring else ()) + tuple(
            Send(grid.at(n, l + i), source(grid.at(n + k + 1, l + i))) for i in range(1, grid.g)
        )
        recvs = ((Recv(grid.at(n + 1, l), acc, reduce_with=acc),) if ring else ()) + tuple(
            Recv(grid.at(n, l + i), acc, reduce_with=acc) for i in range(1, grid.g)
        )
        steps.append(Step((Copy(source(target), acc),), sends, recvs))
    return steps


def _ag_phase(
    grid: _Grid, rank: int, way: int, first: int, slot: Callable[[int, int], Region], out: Callable[[int], Region]
) -> list[Step]:
    """The pipelined allgather's m steps on rank ``rank``, the ring running towards n + ``way``: in
    step s the rank holds the block of (n - way*s, l) in ``slot(first + s, ...)``, copies it to
    ``out``, passes it along the ring (but the last step) and to every member, and receives the
    next block into the other slot and the members' blocks into ``out``."""
    n, l = grid.where[rank]
    m = grid.m
    steps = []
    for s in range(m):
        held = grid.at(n - way * s, l)
        mine = slot(first + s, held)
        ring = s < m - 1
        sends = ((Send(grid.at(n + way, l), mine),) if ring else ()) + tuple(
            Send(grid.at(n, l + i), mine) for i in range(1, grid.g)
        )
        recvs = (
            (Recv(grid.at(n - way, l), slot(first + s + 1, grid.at(n - way * (s + 1), l))),) if ring else ()
        ) + tuple(Recv(grid.at(n, l + i), out(grid.at(n - way * s, l + i))) for i in range(1, grid.g))
        steps.append(Step((Copy(mine, out(held)),), sends, recvs))
    return steps


def _allgather(grid: _Grid, rank: int, count: int) -> Schedule:
    slot = lambda s, r: Region(TMP, (s % 2) * count, count)  # noqa: E731
    steps = _ag_phase(grid, rank, +1, 0, slot, lambda r: Region(OUT, r * count, count))
    steps[0] = Step((Copy(Region(IN, 0, count), slot(0, rank)), *steps[0].copies), steps[0].sends, steps[0].recvs)
    return finish(steps)


def _reduce_scatter(grid: _Grid, rank: int, count: int) -> Schedule:
    slot = lambda k, r: Region(TMP, (k % 2) * count, count)  # noqa: E731
    steps = _rs_phase(grid, rank, lambda r: Region(IN, r * count, count), slot)
    steps.append(Step(copies=(Copy(slot(grid.m - 1, rank), Region(OUT, 0, count)),)))  # the last target is the rank
    return finish(steps)


def _allreduce(grid: _Grid, rank: int, count: int) -> Schedule:
    chunks = chunk_bounds(count, grid.m * grid.g)
    width = chunks[0][1]  # the largest slice
    part = lambda r: Region(OUT, *chunks[r])  # noqa: E731 - slice r (reduced on rank r)
    slot = lambda k, r: Region(TMP, (k % 2) * width, chunks[r][1])  # noqa: E731 - slot k holding slice r
    # the reduce-scatter leaves slice (n, l) in slot m-1; the allgather's ring runs towards n-1
    return finish(_rs_phase(grid, rank, part, slot) + _ag_phase(grid, rank, -1, grid.m - 1, slot, part))


# ------------------------------------------------------------------------------------ all at once
def flows(collective: str, partition: Partition, size: int, count: int) -> Iterator[StepFlows]:
    """Every rank's steps at once (``StepFlows``): lane 0 the ring, lanes 1..g-1 the group's
    members (l + i); receive i comes from member l + i's lane g - i. Needs ``count >= 1``
    (allreduce: ``count >= size``, no empty slice)."""
    grid = _Grid(tuple(tuple(g) for g in partition))
    m, g = grid.m, grid.g
    if collective not in PIPELINED or m * g != size or count < (size if collective == "allreduce" else 1):
        raise ValueError("pipeline flows: allgather, reduce_scatter or allreduce, count >= 1 (allreduce: >= size)")
    n_of = np.empty(size, dtype=np.int64)
    l_of = np.empty(size, dtype=np.int64)
    n_of[grid.matrix] = np.arange(m)[:, None]
    l_of[grid.matrix] = np.arange(g)[None, :]
    mat = grid.matrix

    def at(dn, dl=0) -> np.ndarray:  # every rank's (n + dn, l + dl); dn may be an array
        return mat[(n_of + dn) % m, (l_of + dl) % g]

    members = [at(0, i) for i in range(1, g)]
    no_ring = np.full(size, -1)
    lane = np.broadcast_to(np.array([0, *[g - i for i in range(1, g)]])[:, None], (g, size))

    def lanes(ring_to: np.ndarray, ring_from: np.ndarray, ring: bool):
        to = np.stack([ring_to if ring else no_ring, *members])
        frm = np.stack([ring_from if ring else no_ring, *members])
        return to, frm

    def rs_phase(length):  # length: every block's elements (an int), or each slice's (by rank)
        first, on = lanes(at(-1), at(1), False), lanes(at(-1), at(1), True)
        uniform = np.full((g, size), length) if np.ndim(length) == 0 else None
        for k in range(m):  # the ring sends the partial of (n+k, l); member l+i gets (n+k+1, l+i)
            to, frm = on if k else first
            if uniform is not None:
                yield StepFlows(to, uniform, frm, True, lane, (length,))
            else:
                sent = np.stack([length[at(k)], *[length[at(k + 1, i)] for i in range(1, g)]])
                yield StepFlows(to, sent, frm, True, lane, (length[at(k + 1)],))

    def ag_phase(length, way: int, first_copy: tuple):  # the ring towards n + way; every send is the held block
        on, last = lanes(at(way), at(-way), True), lanes(at(way), at(-way), False)
        uniform = np.full((g, size), length) if np.ndim(length) == 0 else None
        for s in range(m):
            to, frm = on if s < m - 1 else last
            held = length if uniform is not None else length[at(-way * s)]
            sent = uniform if uniform is not None else np.broadcast_to(held, (g, size))
            yield StepFlows(to, sent, frm, False, lane, (*first_copy, held) if s == 0 else (held,))

    if collective == "allgather":
        yield from ag_phase(count, +1, (count,))  # step 0 first copies IN into its slot
    elif collective == "reduce_scatter":
        yield from rs_phase(count)
        none = np.full(size, -1)
        yield StepFlows(none, np.zeros(size, dtype=np.int64), none, False, None, (count,))
    else:
        lengths = np.array([c for _, c in chunk_bounds(count, size)])
        yield from rs_phase(lengths)
        yield from ag_phase(lengths, -1, ())
