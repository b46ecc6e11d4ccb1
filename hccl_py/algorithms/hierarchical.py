"""Hierarchical (two-level) collectives on a partition of the communicator into groups: HCCL's
level0 (inside a group: a server or an HCCS island) and level1 (across groups) algorithms,
composed from the flat schedules.

A schedule function has the registry's signature ``(rank, size, count, root)``, which has no room
for a partition, so hierarchical schedules come from a cached *factory*::

    fn = schedule_for("allreduce", [[0, 1], [2, 3]], inner="ring", outer="hd")
    fn(rank, 4, count)                       # a Schedule, like any flat algorithm's
    simulate("allreduce", fn, topo, count)   # the simulator, cost model, executor and playback
                                             # take the function like a registry name

``schedule_for`` is cached per (collective, partition, inner, outer), so the same partition
always yields the same function object and the per-function caches downstream keep working.

Notation: groups G_0 .. G_{k-1} (in the order given), sizes g_i, m = max g_i; rank (i, t) is
member t of G_i. ``inner`` names the flat algorithm of every intra-group phase, ``outer`` that of
every inter-group phase.

* **allreduce** with an allreduce-only algorithm inside (``rd``, ``oneshot``; HCCL's small-count
  executor): the inner allreduce of the whole buffer in every group, then the outer allreduce of
  the whole buffer among the ranks with one index; equal groups only.
* **allreduce** (HCCL's hierarchical allreduce): the buffer is cut into m chunks; inner
  reduce-scatter in every group leaves member t with the group's partial sum of chunk t; an outer
  allreduce of chunk t among the k ranks holding it (one per group: the "same device id" across
  servers); inner allgather. Each rank sends 2(k-1)/k * n/m elements across groups (n the
  count) and 2(g-1)/g * n inside its group.
* **reduce_scatter** across first (``outer`` named ``<algo>-first``, HCCL's small-count
  executor, ``ReduceScatterMeshOpbaseSmallCountDeterministicExecutor``): the outer
  reduce-scatter of the whole input among the ranks with one index, in k parts of a whole
  group's blocks, then the inner reduce-scatter of that part in every group; equal groups only.
* **reduce_scatter**: inner reduce-scatter, then outer reduce-scatter; **allgather**: outer
  allgather, then inner allgather. In both the slow level moves the least data (the order of
  HCCL's hierarchical *pipeline* AllGather: across servers among equal device ids first, then
  inside). HCCL's plain hierarchical RS/AG take the other order to keep each level's chunks
  contiguous in the user buffer; here a local copy re-arranges them instead (modeled at HBM
  bandwidth).
* **broadcast**: scatter from the root inside its group (direct: the root sends each member its
  chunk in one step), outer broadcast of each chunk from its holder in the root's group to the
  holders in the other groups, inner allgather in every group (the root only sends). The other
  groups idle through the root's scatter, and every rank through the outer algorithm's idle
  steps, so step k is the same moment on every rank (as for scatter and gather below).
* **scatter** (HCCL's two-level Scatter): an outer scatter of whole groups' blocks among the ranks
  with the root's index in their group, then an inner scatter in every group from that rank;
  **gather** mirrors it (inner gather, then outer). Equal groups only; the root stages its
  buffer through TMP when groups are not runs of consecutive ranks.
* **alltoall**: the staged all-to-all of ``alltoall_staged.py`` (HCCL's ``RunAlltoAllVStaged``),
  ``inner`` and ``outer`` each mesh or pairwise, on equal groups.
* **reduce** mirrors broadcast: inner reduce-scatter, outer reduce of each chunk to its holder in
  the root's group, gather to the root inside the root's group (direct, one step); aligned the
  same way.

Uneven groups (g_i < m): member t of G_i holds the chunks (allreduce, broadcast, reduce) or
columns (allgather, reduce_scatter) j < m with j mod g_i == t, so some ranks take part in several
outer phases, one after the other in order of j (every rank orders them alike, so FIFO matching
holds and nothing deadlocks). Chunks that do not fill their slot are padded with a copy of real
data, so a padded reduction never reduces uninitialised memory; padding is never copied out.

Buffers: a phase's sub-schedule is renumbered to the group's ranks and its IN / OUT / TMP are
mapped onto regions of the composite's buffers. When the chunks a phase needs lie contiguously in
the user buffer (equal groups, and for allreduce / broadcast / reduce a count divisible by m) the
phases work in place; otherwise they work on a staging area in TMP, with local copies in and out.

Results equal the flat algorithms' (exactly for integers and max/min; float sums in another
order) and are identical on every rank: each element is reduced by exactly one rank per level
and then only copied.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Callable, Sequence

import numpy as np
from topology import TopologyError, validate_partition

from ..errors import HcclParamError
from ._common import finish
from .registry import SCHEDULES, get_schedule
from .schedule import IN, OUT, TMP, Copy, Recv, Region, Schedule, Send, Step, StepFlows, chunk_bounds

ScheduleFn = Callable[..., Schedule]
Partition = tuple[tuple[int, ...], ...]

HIER_COLLECTIVES = ("allreduce", "allgather", "broadcast", "reduce", "reduce_scatter")
# Flat collectives each hierarchical collective runs: (inside groups, across groups).
LEVELS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "allreduce": (("reduce_scatter", "allgather"), ("allreduce",)),
    "allgather": (("allgather",), ("allgather",)),
    "reduce_scatter": (("reduce_scatter",), ("reduce_scatter",)),
    "broadcast": (("allgather",), ("broadcast",)),
    "reduce": (("reduce_scatter",), ("reduce",)),
    "scatter": (("scatter",), ("scatter",)),
    "gather": (("gather",), ("gather",)),
    "alltoall": (("alltoall",), ("alltoall",)),  # staged: alltoall_staged.py, not composed here
}
# Every collective with a two-level algorithm: the composed ones (scatter and gather on equal
# groups only) and the staged all-to-all
TWO_LEVEL = (*HIER_COLLECTIVES, "scatter", "gather", "alltoall")


def _checked_partition(groups) -> Partition:
    """``groups`` as a tuple of tuples of ints, checked by topology's partition rule (every rank
    0..n-1 of the n listed in exactly one non-empty group); HcclParamError otherwise."""
    try:
        return tuple(tuple(group) for group in validate_partition(groups))
    except TopologyError as err:
        fields = {k: v for k, v in err.fields.items() if v is not None}
        raise HcclParamError(f"hierarchical partition {groups!r}: {err.message}", arg="partition", **fields) from None


def format_partition(partition: Sequence[Sequence[int]]) -> str:
    """The ``--groups`` text form: ``((0, 2), (1, 3))`` -> ``"0,2;1,3"``."""
    return ";".join(",".join(str(r) for r in group) for group in partition)


def schedule_for(collective: str, partition, inner: str = "ring", outer: str = "ring") -> ScheduleFn:
    """The schedule function of ``collective`` on ``partition`` (a list of rank lists covering
    0..size-1), with flat algorithm ``inner`` inside groups and ``outer`` across them. Cached:
    the same arguments give the same function object."""
    return _schedule_for(collective, _checked_partition(partition), inner, outer)


@lru_cache(maxsize=512)
def _schedule_for(collective: str, partition: Partition, inner: str, outer: str) -> ScheduleFn:
    if collective not in LEVELS:
        raise HcclParamError(f"no hierarchical algorithm for {collective!r}; use one of {', '.join(TWO_LEVEL)}",
                             arg="collective", value=collective, rule="choices", choices=list(TWO_LEVEL))
    if outer == "pipeline" and collective != "alltoall":  # HCCL's pipeline: its own schedule, level 0 a full mesh
        from . import pipeline

        if inner != "mesh" or collective not in pipeline.PIPELINED:
            raise HcclParamError(f"HCCL's pipeline is hier:mesh/pipeline for {', '.join(pipeline.PIPELINED)}, "
                                 f"not {collective} with {inner!r} inside", collective=collective, arg="algo",
                                 value=f"hier:{inner}/{outer}", rule="choices", choices=list(pipeline.PIPELINED))
        try:
            return pipeline.schedule_for(collective, partition)
        except ValueError as err:
            raise HcclParamError(f"hierarchical {collective}: {err}", collective=collective, arg="partition",
                                 rule="equal groups") from None
    if collective == "alltoall":
        from . import alltoall_staged

        staged = alltoall_staged.schedule_for(partition, inner, outer)
        staged.collective, staged.partition, staged.inner, staged.outer = collective, partition, inner, outer
        return staged
    inner_names, outer_names = LEVELS[collective]
    plan = _Plan.of(partition)
    build = _BUILDERS[collective]
    if across_first(outer):
        if collective != "reduce_scatter" or not plan.uniform:
            raise HcclParamError(f"across first ({outer!r}): reduce_scatter on groups of one size only, not {collective}",
                                 collective=collective, arg="algo", value=f"hier:{inner}/{outer}", rule="choices",
                                 choices=["reduce_scatter"])
        name, outer, build = outer, outer[:-len(FIRST)], _reduce_scatter_across_first
    else:
        name = outer
    if collective == "allreduce" and whole_buffer(inner):  # an allreduce-only algorithm inside: whole buffers
        if not plan.uniform:
            raise HcclParamError(f"hierarchical allreduce with {inner!r} inside needs groups of one size",
                                 collective=collective, arg="partition", rule="equal groups")
        inner_names, build = ("allreduce",), _allreduce_whole
    fns = {("inner", c): get_schedule(c, inner) for c in inner_names}
    fns.update({("outer", c): get_schedule(c, outer) for c in outer_names})

    @lru_cache(maxsize=256)
    def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
        if size != plan.size:
            raise HcclParamError(f"hierarchical {collective} on partition {format_partition(partition)} "
                                 f"serves {plan.size} ranks, not {size}", collective=collective, arg="size", value=size,
                                 rule="const", expected=plan.size)
        if count == 0:
            return finish([])
        return build(plan, fns, rank, count, root)

    schedule.__qualname__ = schedule.__name__ = f"hier[{format_partition(partition)}]:{inner}/{name}"
    schedule.collective, schedule.partition, schedule.inner, schedule.outer = collective, partition, inner, outer
    schedule.across_first = name != outer
    return schedule


@dataclass(frozen=True)
class _Plan:
    """Facts about one partition shared by every rank's schedule."""

    groups: Partition
    size: int
    where: tuple[tuple[int, int], ...]  # rank -> (group, index in group)
    m: int  # largest group
    uniform: bool
    # holder_table[j]: the rank of every group holding chunk / column j, built once per partition
    # (per rank it would be quadratic at 65,536 ranks)
    holder_table: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, groups: Partition) -> "_Plan":
        where = [(0, 0)] * sum(len(g) for g in groups)
        for i, group in enumerate(groups):
            for t, r in enumerate(group):
                where[r] = (i, t)
        m = max(len(g) for g in groups)
        table = tuple(tuple(g[j % len(g)] for g in groups) for j in range(m))
        return cls(groups, len(where), tuple(where), m, all(len(g) == m for g in groups), table)

    @property
    def k(self) -> int:
        return len(self.groups)

    def holders(self, j: int) -> tuple[int, ...]:
        """The rank of every group (in group order) that holds chunk / column j < m."""
        return self.holder_table[j]

    def slots(self, i: int, t: int) -> list[int]:
        """The chunks / columns member t of group i holds, ascending."""
        return list(range(t, self.m, len(self.groups[i])))

    def per_member(self, i: int) -> int:
        """Slots per member of group i (the most any member holds)."""
        return math.ceil(self.m / len(self.groups[i]))

    @property
    def runs(self) -> bool:
        """Whether every group is a run of consecutive ranks in order (then a group's blocks of a
        per-rank buffer lie together)."""
        return all(g == tuple(range(g[0], g[0] + len(g))) for g in self.groups)

    @cached_property
    def in_rank_order(self) -> bool:
        """Whether group i is ranks i*m .. (i+1)*m - 1 for every i (equal groups of consecutive
        ranks, in rank order: what the all-ranks-at-once flows of the rooted collectives map)."""
        return all(g == tuple(range(i * self.m, (i + 1) * self.m)) for i, g in enumerate(self.groups))

    def columns_contiguous(self) -> bool:
        """Whether the holders of column t are the ranks t*k .. t*k+k-1 in order, for every t
        (then a member's column of blocks is one contiguous range of the user buffer)."""
        k = self.k
        return self.uniform and all(self.holders(t) == tuple(range(t * k, (t + 1) * k)) for t in range(self.m))


class _Compose:
    """One rank's composite schedule: sub-schedules run one after another, renumbered and with
    their buffers mapped; pending local copies ride on the next step (copies run first)."""

    def __init__(self, persistent: int = 0):
        self.steps: list[Step] = []
        self.pending: list[Copy] = []
        self.scratch = persistent  # TMP of every sub-schedule starts here (phases never overlap in time)

    def copy(self, src: Region, dst: Region) -> None:
        if src.count and src != dst:
            self.pending.append(Copy(src, dst))

    def step(self, sends=(), recvs=()) -> None:
        self.steps.append(Step(tuple(self.pending), tuple(sends), tuple(recvs)))
        self.pending = []

    def run(self, sub: Schedule, ranks: Sequence[int], in_base: Region, out_base: Region, *,
            me: int = -1, deaf: int | None = None) -> None:
        """Append ``sub`` (a schedule of sub-rank ``me`` over ``ranks``) with its IN mapped to
        ``in_base``, OUT to ``out_base`` and TMP to the scratch area. Sub-rank ``deaf`` receives
        nothing: messages to it are left out (it already holds everything it would receive)."""
        bases = {IN: in_base, OUT: out_base, TMP: Region(TMP, self.scratch, sub.tmp_count)}
        same = {buf for buf, base in bases.items() if base.buf == buf and base.offset == 0}

        def at(r: Region) -> Region:
            if r.buf in same:  # mapped onto itself: no new object (65,536 ranks build millions)
                return r
            base = bases[r.buf]
            return Region(base.buf, base.offset + r.offset, r.count)

        for s in sub.steps:
            copies = [Copy(at(c.src), at(c.dst), None if c.reduce_with is None else at(c.reduce_with)) for c in s.copies]
            copies = [c for c in copies if c.src != c.dst or c.reduce_with is not None]
            sends = [Send(ranks[x.peer], at(x.src)) for x in s.sends if x.peer != deaf]
            recvs = [] if me == deaf else [
                Recv(ranks[x.peer], at(x.dst), None if x.reduce_with is None else at(x.reduce_with), x.incoming_first)
                for x in s.recvs]
            self.steps.append(Step(tuple(self.pending + copies), tuple(sends), tuple(recvs)))
            self.pending = []

    def idle(self, steps: int) -> None:
        """``steps`` empty steps (a phase this rank has no part in, kept by ``done(aligned=True)``)."""
        for _ in range(steps):
            self.step()

    def done(self, *, aligned: bool = False) -> Schedule:
        if self.pending:
            self.step()
        return finish(self.steps, aligned=aligned)


def _sub(fns, level: str, collective: str, rank: int, size: int, count: int, root: int = 0) -> Schedule:
    return fns[(level, collective)](rank, size, count, root)


# ---------------------------------------------------------------------------------------- chunked
# allreduce, broadcast and reduce cut the buffer into m chunks; member t of G_i holds slots(i, t).

@dataclass(frozen=True)
class _Chunks:
    plan: _Plan
    count: int

    @cached_property
    def bounds(self) -> list[tuple[int, int]]:  # read for every chunk of every rank: computed once
        return chunk_bounds(self.count, self.plan.m)

    @property
    def q(self) -> int:  # slot width: the largest chunk
        return self.bounds[0][1]

    @property
    def direct(self) -> bool:
        """Every member holds one chunk and chunks are equal: work in place in the user buffer."""
        return self.plan.uniform and self.count % self.plan.m == 0

    def chunk(self, j: int) -> Region:
        return Region(OUT, *self.bounds[j])

    def bundle(self, i: int) -> int:  # staging elements per member of group i
        return self.plan.per_member(i) * self.q

    def slot(self, i: int, u: int, j: int, base: int) -> Region:
        """Where chunk j of member u of group i lies in a staging area of group i at TMP ``base``."""
        s = self.plan.slots(i, u).index(j)
        return Region(TMP, base + u * self.bundle(i) + s * self.q, self.bounds[j][1])

    def stage_out(self, c: _Compose, i: int) -> None:
        """Copy every member's slots of group i from the staging area back into OUT's chunks."""
        for u in range(len(self.plan.groups[i])):
            for j in self.plan.slots(i, u):
                c.copy(self.slot(i, u, j, 0), self.chunk(j))

    def stage_in(self, c: _Compose, i: int, base: int, members: Sequence[int], pad: bool) -> None:
        """Copy the chunks of ``members`` of group i from OUT into the staging area; ``pad`` fills
        each slot's unused tail with real data (a reduction over it then stays harmless)."""
        q = self.q
        for u in members:
            held = self.plan.slots(i, u)
            for s in range(self.plan.per_member(i)):
                at = base + u * self.bundle(i) + s * q
                n = self.bounds[held[s]][1] if s < len(held) else 0
                if n:
                    c.copy(self.chunk(held[s]), Region(TMP, at, n))
                if pad and n < q:
                    c.copy(Region(OUT, 0, q - n), Region(TMP, at + n, q - n))


def _allreduce(plan: _Plan, fns, rank: int, count: int, root: int) -> Schedule:
    i, t = plan.where[rank]
    group, g, k = plan.groups[i], len(plan.groups[i]), plan.k
    ch = _Chunks(plan, count)
    if ch.direct:
        q = ch.q
        held = Region(TMP, 0, q)
        c = _Compose(persistent=q)
        c.run(_sub(fns, "inner", "reduce_scatter", t, g, q), group, Region(OUT, 0, count), held, me=t)
        c.run(_sub(fns, "outer", "allreduce", i, k, q), plan.holders(t), held, held, me=i)
        c.run(_sub(fns, "inner", "allgather", t, g, q), group, held, Region(OUT, 0, count), me=t)
        return c.done()
    b = ch.bundle(i)
    stage, held = Region(TMP, 0, g * b), Region(TMP, g * b, b)
    c = _Compose(persistent=(g + 1) * b)
    ch.stage_in(c, i, 0, range(g), pad=True)
    c.run(_sub(fns, "inner", "reduce_scatter", t, g, b), group, stage, held, me=t)
    for s, j in enumerate(plan.slots(i, t)):
        n = ch.bounds[j][1]
        if n:
            mine = Region(TMP, held.offset + s * ch.q, n)
            c.run(_sub(fns, "outer", "allreduce", i, k, n), plan.holders(j), mine, mine, me=i)
    c.run(_sub(fns, "inner", "allgather", t, g, b), group, held, stage, me=t)
    ch.stage_out(c, i)
    return c.done()


FIRST = "-first"  # an outer level named "<algo>-first" runs before the inner one (reduce_scatter)


def across_first(outer: str) -> bool:
    """Whether ``outer`` names the outer level of a reduce_scatter that runs across groups first."""
    return outer.endswith(FIRST)


def _reduce_scatter_across_first(plan: _Plan, fns, rank: int, count: int, root: int) -> Schedule:
    """HCCL's small-count reduce_scatter (module doc): across groups, then inside."""
    i, t = plan.where[rank]
    m, k = plan.m, plan.k
    part = m * count  # a whole group's blocks
    in_order = plan.in_rank_order
    staged = 0 if in_order else k * part  # the input in group order, when the groups are not runs in order
    c = _Compose(persistent=staged + part)
    if in_order:
        whole = Region(IN, 0, k * part)
    else:
        whole = Region(TMP, 0, k * part)
        for h, group in enumerate(plan.groups):
            for u, r in enumerate(group):
                c.copy(Region(IN, r * count, count), Region(TMP, h * part + u * count, count))
    held = Region(TMP, staged, part)
    c.run(_sub(fns, "outer", "reduce_scatter", i, k, part), plan.holders(t), whole, held, me=i)
    c.run(_sub(fns, "inner", "reduce_scatter", t, m, count), plan.groups[i], held, Region(OUT, 0, count), me=t)
    return c.done()


def whole_buffer(inner: str) -> bool:
    """Whether a hierarchical allreduce with ``inner`` inside groups reduces whole buffers: an
    allreduce-only algorithm (``rd``, ``oneshot``) has no reduce-scatter to cut the buffer with."""
    return ("allreduce", inner) in SCHEDULES and ("reduce_scatter", inner) not in SCHEDULES


def _allreduce_whole(plan: _Plan, fns, rank: int, count: int, root: int) -> Schedule:
    """Whole buffers (HCCL's small-count executor, AllReduceMeshOpbaseSmallCountDeterministicExecutor):
    the inner allreduce of the whole buffer in every group, then the outer allreduce of the whole
    buffer among the ranks with one index (each index's ranks compute the same sums in the same
    order, so every rank ends bit-identical)."""
    i, t = plan.where[rank]
    whole = Region(OUT, 0, count)
    c = _Compose()
    c.run(_sub(fns, "inner", "allreduce", t, len(plan.groups[i]), count), plan.groups[i], whole, whole, me=t)
    c.run(_sub(fns, "outer", "allreduce", i, plan.k, count), plan.holders(t), whole, whole, me=i)
    return c.done()


def _broadcast(plan: _Plan, fns, rank: int, count: int, root: int) -> Schedule:
    i, t = plan.where[rank]
    i0, t0 = plan.where[root]
    group, g, k = plan.groups[i], len(plan.groups[i]), plan.k
    ch = _Chunks(plan, count)
    deaf = t0 if i == i0 else None  # the root only sends in its group's allgather
    # Aligned (``_Compose.done``): the other groups idle while the root scatters in its group, and
    # through the outer algorithm's idle steps, so step k is the same moment on every rank.
    if ch.direct:
        c = _Compose()
        mine = ch.chunk(t)
        if i == i0:  # scatter inside the root's group
            if rank == root:
                c.step(sends=[Send(m, ch.chunk(u)) for u, m in enumerate(group) if u != t0])
            else:
                c.step(recvs=[Recv(root, mine)])
        else:
            c.idle(1)
        c.run(_sub(fns, "outer", "broadcast", i, k, ch.q, i0), plan.holders(t), mine, mine, me=i)
        c.run(_sub(fns, "inner", "allgather", t, g, ch.q), group, mine, Region(OUT, 0, count), me=t, deaf=deaf)
        return c.done(aligned=True)
    b = ch.bundle(i)
    stage = Region(TMP, 0, g * b)
    c = _Compose(persistent=g * b)
    if rank == root:
        ch.stage_in(c, i, 0, range(g), pad=False)
    if i == i0:
        if rank == root:
            c.step(sends=[Send(m, ch.chunk(j)) for u, m in enumerate(group) if u != t0 for j in plan.slots(i, u)
                          if ch.bounds[j][1]])
        else:
            c.step(recvs=[Recv(root, ch.slot(i, t, j, 0)) for j in plan.slots(i, t) if ch.bounds[j][1]])
    else:
        c.idle(1)
    for j in plan.slots(i, t):
        if ch.bounds[j][1]:
            mine = ch.slot(i, t, j, 0)
            c.run(_sub(fns, "outer", "broadcast", i, k, mine.count, i0), plan.holders(j), mine, mine, me=i)
    c.run(_sub(fns, "inner", "allgather", t, g, b), group, Region(TMP, t * b, b), stage, me=t, deaf=deaf)
    if rank != root:
        ch.stage_out(c, i)
    return c.done(aligned=True)


def _reduce(plan: _Plan, fns, rank: int, count: int, root: int) -> Schedule:
    i, t = plan.where[rank]
    i0, t0 = plan.where[root]
    group, g, k = plan.groups[i], len(plan.groups[i]), plan.k
    ch = _Chunks(plan, count)
    if ch.direct:
        q = ch.q
        held = Region(TMP, 0, q)
        c = _Compose(persistent=q)
        c.run(_sub(fns, "inner", "reduce_scatter", t, g, q), group, Region(OUT, 0, count), held, me=t)
        c.run(_sub(fns, "outer", "reduce", i, k, q, i0), plan.holders(t), held, held, me=i)
        if i == i0:  # gather inside the root's group
            if rank == root:
                c.copy(held, ch.chunk(t))
                c.step(recvs=[Recv(m, ch.chunk(u)) for u, m in enumerate(group) if u != t0])
            else:
                c.step(sends=[Send(root, held)])
        return c.done(aligned=True)  # through the outer algorithm's idle steps (as broadcast)
    b = ch.bundle(i)
    stage, held = Region(TMP, 0, g * b), Region(TMP, g * b, b)
    c = _Compose(persistent=(g + 1) * b)
    ch.stage_in(c, i, 0, range(g), pad=True)
    c.run(_sub(fns, "inner", "reduce_scatter", t, g, b), group, stage, held, me=t)
    mine = {}
    for s, j in enumerate(plan.slots(i, t)):
        n = ch.bounds[j][1]
        if n:
            mine[j] = Region(TMP, held.offset + s * ch.q, n)
            c.run(_sub(fns, "outer", "reduce", i, k, n, i0), plan.holders(j), mine[j], mine[j], me=i)
    if i == i0:
        if rank == root:
            for j, region in mine.items():
                c.copy(region, ch.chunk(j))
            c.step(recvs=[Recv(m, ch.chunk(j)) for u, m in enumerate(group) if u != t0 for j in plan.slots(i, u)
                          if ch.bounds[j][1]])
        else:
            c.step(sends=[Send(root, region) for region in mine.values()])
    return c.done(aligned=True)


# ---------------------------------------------------------------------------------------- blocked
# allgather and reduce_scatter move per-rank blocks; column j < m is the blocks of G_i[j] for every
# group i that has a member j, held by plan.holders(j); a column's slot is k blocks (group order).

def _allgather(plan: _Plan, fns, rank: int, count: int, root: int) -> Schedule:
    i, t = plan.where[rank]
    group, g, k, p = plan.groups[i], len(plan.groups[i]), plan.k, plan.size
    whole = Region(OUT, 0, p * count)
    if plan.columns_contiguous():  # column t is the blocks of ranks t*k .. t*k+k-1: work in OUT
        mine = Region(OUT, t * k * count, k * count)
        c = _Compose()
        c.run(_sub(fns, "outer", "allgather", i, k, count), plan.holders(t), Region(IN, 0, count), mine, me=i)
        c.run(_sub(fns, "inner", "allgather", t, g, k * count), group, mine, whole, me=t)
        return c.done()
    slot = k * count
    b = plan.per_member(i) * slot
    c = _Compose(persistent=g * b)
    for s, j in enumerate(plan.slots(i, t)):
        c.run(_sub(fns, "outer", "allgather", i, k, count), plan.holders(j), Region(IN, 0, count),
              Region(TMP, t * b + s * slot, slot), me=i)
    c.run(_sub(fns, "inner", "allgather", t, g, b), group, Region(TMP, t * b, b), Region(TMP, 0, g * b), me=t)
    for u in range(g):
        for s, j in enumerate(plan.slots(i, u)):
            for x, other in enumerate(plan.groups):
                if j < len(other):
                    c.copy(Region(TMP, u * b + s * slot + x * count, count), Region(OUT, other[j] * count, count))
    return c.done()


def _reduce_scatter(plan: _Plan, fns, rank: int, count: int, root: int) -> Schedule:
    i, t = plan.where[rank]
    group, g, k, p = plan.groups[i], len(plan.groups[i]), plan.k, plan.size
    mine = Region(OUT, 0, count)
    slot = k * count
    if plan.columns_contiguous():  # column t is the blocks of ranks t*k .. t*k+k-1: read IN in place
        held = Region(TMP, 0, slot)
        c = _Compose(persistent=slot)
        c.run(_sub(fns, "inner", "reduce_scatter", t, g, slot), group, Region(IN, 0, p * count), held, me=t)
        c.run(_sub(fns, "outer", "reduce_scatter", i, k, count), plan.holders(t), held, mine, me=i)
        return c.done()
    b = plan.per_member(i) * slot
    held, spare = g * b, (g + 1) * b  # TMP: staging [0, g*b), this member's sums, then a spare block
    c = _Compose(persistent=spare + count)
    for u in range(g):
        held_cols = plan.slots(i, u)
        for s in range(plan.per_member(i)):
            for x, other in enumerate(plan.groups):
                at = Region(TMP, u * b + s * slot + x * count, count)
                real = s < len(held_cols) and held_cols[s] < len(other)
                c.copy(Region(IN, (other[held_cols[s]] if real else 0) * count, count), at)
    c.run(_sub(fns, "inner", "reduce_scatter", t, g, b), group, Region(TMP, 0, g * b), Region(TMP, held, b), me=t)
    for s, j in enumerate(plan.slots(i, t)):
        out = mine if j == t else Region(TMP, spare, count)  # j != t: a column this group has no member of
        c.run(_sub(fns, "outer", "reduce_scatter", i, k, count), plan.holders(j), Region(TMP, held + s * slot, slot),
              out, me=i)
    return c.done()


def _rooted_plan(plan: _Plan, collective: str) -> None:
    if not plan.uniform:
        raise HcclParamError(f"hierarchical {collective} needs groups of one size, got sizes "
                             f"{sorted({len(g) for g in plan.groups})}", collective=collective, arg="partition",
                             value=[len(g) for g in plan.groups], rule="equal groups")


def _group_blocks(plan: _Plan, count: int, c: _Compose, whole: Region, into_stage: bool) -> list[Region]:
    """Where group h's blocks (its members' blocks in member order, m * count) lie in ``whole``
    (the root's size * count buffer): in place when every group is a run of consecutive ranks in
    order, else in a TMP staging area (copied in from ``whole`` when ``into_stage``, else to be
    copied out to it by :func:`_unstage`)."""
    m = plan.m
    if plan.runs:
        return [Region(whole.buf, whole.offset + g[0] * count, m * count) for g in plan.groups]
    areas = []
    for h, group in enumerate(plan.groups):
        area = Region(TMP, h * m * count, m * count)
        areas.append(area)
        if into_stage:
            for u, r in enumerate(group):
                c.copy(Region(whole.buf, whole.offset + r * count, count), Region(TMP, area.offset + u * count, count))
    return areas


def _unstage(plan: _Plan, count: int, c: _Compose, whole: Region, areas: list[Region]) -> None:
    for area, group in zip(areas, plan.groups):
        if area.buf == TMP:
            for u, r in enumerate(group):
                c.copy(Region(TMP, area.offset + u * count, count), Region(whole.buf, whole.offset + r * count, count))


def _scatter(plan: _Plan, fns, rank: int, count: int, root: int) -> Schedule:
    """HCCL's two-level Scatter (ScatterMeshExecutor / ScatterRingExecutor on several servers): an
    outer scatter of whole groups' blocks among the ranks with the root's index in their group
    (the root's plane), then an inner scatter inside every group from its plane rank."""
    _rooted_plan(plan, "scatter")
    i, t = plan.where[rank]
    i0, t0 = plan.where[root]
    m, k, size = plan.m, plan.k, plan.size
    staged = rank == root and not plan.runs
    c = _Compose(persistent=size * count + m * count if staged else (m * count if t == t0 else 0))
    # every rank's inner scatter starts at the same step: the outer phase lasts as long as its root's
    # schedule (the longest) on every plane rank, and ranks off the plane idle through it
    phase = len(_sub(fns, "outer", "scatter", i0, k, m * count, i0).steps)
    if t == t0:
        plane = [g[t0] for g in plan.groups]
        if rank == root:
            blocks = _group_blocks(plan, count, c, Region(IN, 0, size * count), into_stage=True)
            source = Region(blocks[0].buf, blocks[0].offset, k * m * count)
            # the outer root's copy of its own group's blocks goes to TMP (IN is never written); the
            # inner scatter reads them where they already lie
            landing = Region(TMP, size * count if staged else 0, m * count)
            outer = _sub(fns, "outer", "scatter", i, k, m * count, i0)
            c.run(outer, plane, source, landing, me=i)
            mine = blocks[i]
        else:
            mine = Region(TMP, 0, m * count)
            outer = _sub(fns, "outer", "scatter", i, k, m * count, i0)
            c.run(outer, plane, mine, mine, me=i)
        c.idle(phase - len(outer.steps))
    else:
        mine = Region(TMP, 0, 0)  # an inner scatter's non-root never reads IN
        c.idle(phase)
    c.run(_sub(fns, "inner", "scatter", t, m, count, t0), plan.groups[i], mine, Region(OUT, 0, count), me=t)
    return c.done(aligned=True)


def _gather(plan: _Plan, fns, rank: int, count: int, root: int) -> Schedule:
    """The mirror of :func:`_scatter` (HCCL has no Gather operator; its GatherMesh / GatherRing
    templates serve its Reduce): an inner gather to every group's plane rank, then an outer
    gather of whole groups' blocks to the root among the root's plane."""
    _rooted_plan(plan, "gather")
    i, t = plan.where[rank]
    i0, t0 = plan.where[root]
    m, k, size = plan.m, plan.k, plan.size
    staged = rank == root and not plan.runs
    c = _Compose(persistent=size * count if staged else (m * count if t == t0 else 0))
    whole = Region(OUT, 0, size * count)
    if rank == root:
        blocks = _group_blocks(plan, count, c, whole, into_stage=False)
        mine = blocks[i]
    else:
        mine = Region(TMP, 0, m * count if t == t0 else 0)
    c.run(_sub(fns, "inner", "gather", t, m, count, t0), plan.groups[i], Region(IN, 0, count), mine, me=t)
    if t == t0:
        plane = [g[t0] for g in plan.groups]
        target = Region(blocks[0].buf, blocks[0].offset, k * m * count) if rank == root else Region(TMP, 0, 0)
        c.run(_sub(fns, "outer", "gather", i, k, m * count, i0), plane, mine, target, me=i)
        if rank == root:
            _unstage(plan, count, c, whole, blocks)
    return c.done()


_BUILDERS = {
    "scatter": _scatter,
    "gather": _gather,
    "allreduce": _allreduce,
    "allgather": _allgather,
    "broadcast": _broadcast,
    "reduce": _reduce,
    "reduce_scatter": _reduce_scatter,
}


# ------------------------------------------------------------------------------- flows at scale
# The composite on equal groups as whole steps of every rank (``StepFlows``), for the simulator
# at cluster scale: each phase is the flat algorithm's flows, run by every group (inner) or every
# column of holders (outer) at once and mapped to communicator ranks; local copies come from one
# rank's composite schedule (every rank of equal groups copies the same amounts, checked).

_FLOW_PHASES = {"allreduce", "allgather", "reduce_scatter"}


def flows_of(fn: ScheduleFn, size: int, count: int):
    """Every rank's steps at once for a hierarchical schedule function of ``schedule_for``
    (allreduce, allgather, reduce_scatter on equal groups whose levels have flows; scatter,
    gather, broadcast and reduce with root 0; the staged and pipelined all-to-all); ValueError
    where it does not apply (the simulator then goes rank by rank)."""
    from .registry import FLOWS

    collective = getattr(fn, "collective", None)
    if collective == "alltoall":
        from . import alltoall_staged

        return alltoall_staged.flows(fn.partition, fn.inner, fn.outer, size, count)
    if getattr(fn, "outer", None) == "pipeline":
        from . import pipeline

        return pipeline.flows(collective, fn.partition, size, count)
    if collective in ("scatter", "gather"):
        return _rooted_flows(fn, size, count)
    if collective in ("broadcast", "reduce"):
        return _chunked_rooted_flows(fn, size, count)
    if collective not in _FLOW_PHASES or count < 1:
        raise ValueError("hierarchical flows: allreduce, allgather or reduce_scatter with count >= 1")
    plan = _Plan.of(fn.partition)
    if not plan.uniform or plan.size != size or plan.m < 2 or plan.k < 2:
        raise ValueError("hierarchical flows need equal groups of at least 2, at least 2 groups")
    g, k = plan.m, plan.k
    matrix = np.array(plan.groups)  # (k, g): group i, member t -> rank

    def phase(name: str, collective: str, counts: list[int], members: int):
        """(steps, {count: flows factory}, count per column or None) of one phase."""
        if (collective, name) not in FLOWS:
            raise ValueError(f"no flows for {collective}/{name}")
        factories = {}
        steps = None
        for n in dict.fromkeys(counts):
            next(iter(FLOWS[(collective, name)](members, n)))  # ValueError when they do not apply
            factories[n] = (lambda n=n: FLOWS[(collective, name)](members, n))
            these = len(SCHEDULES[(collective, name)](0, members, n).steps)
            if steps is not None and these != steps:
                raise ValueError("hierarchical flows: columns with different step counts")
            steps = these
        return steps, factories, counts

    if collective == "allreduce" and whole_buffer(fn.inner):
        phases = [("inner", phase(fn.inner, "allreduce", [count], g)),
                  ("outer", phase(fn.outer, "allreduce", [count] * g, k))]
    elif collective == "allreduce":
        ch = _Chunks(plan, count)
        phases = [("inner", phase(fn.inner, "reduce_scatter", [ch.q], g)),
                  ("outer", phase(fn.outer, "allreduce", [ch.bounds[t][1] for t in range(g)], k)),
                  ("inner", phase(fn.inner, "allgather", [ch.q], g))]
    elif collective == "allgather":
        phases = [("outer", phase(fn.outer, "allgather", [count] * g, k)),
                  ("inner", phase(fn.inner, "allgather", [k * count], g))]
    elif getattr(fn, "across_first", False):
        phases = [("outer", phase(fn.outer, "reduce_scatter", [g * count] * g, k)),
                  ("inner", phase(fn.inner, "reduce_scatter", [count], g))]
    else:
        phases = [("inner", phase(fn.inner, "reduce_scatter", [k * count], g)),
                  ("outer", phase(fn.outer, "reduce_scatter", [count] * g, k))]
    copies = _uniform_copies(fn, size, count)
    nsteps = sum(steps for _, (steps, _, _) in phases)
    if len(copies) not in (nsteps, nsteps + 1):
        raise ValueError("hierarchical flows: the composite's steps do not line up with its phases")
    return _compose_flows(phases, matrix, copies, size)


def _uniform_copies(fn: ScheduleFn, size: int, count: int) -> list[tuple[int, ...]]:
    """Per step of the composite, the element counts of its plain local copies; the same for every
    rank (checked on the first, a middle and the last rank), else ValueError."""
    seen = None
    for r in sorted({0, size // 2, size - 1}):
        steps = fn(r, size, count).steps
        if any(c.reduce_with is not None for step in steps for c in step.copies):
            raise ValueError("hierarchical flows: local reductions")
        mine = [tuple(c.src.count for c in step.copies) for step in steps]
        if seen is not None and mine != seen:
            raise ValueError("hierarchical flows: ranks copy different amounts")
        seen = mine
    return seen


class _ByIdentity:
    """World arrays built once per distinct tuple of sub-flow arrays, by identity: sub-flows reuse
    their arrays from step to step, so the world arrays are reused too and the simulator routes
    each pattern once. At most ``limit`` kept::

        mapped = _ByIdentity(64)
        send_to = mapped("to", (f.send_to,), lambda: world(f.send_to))
    """

    def __init__(self, limit: int):
        self._limit = limit
        self._cache: dict = {}

    def __call__(self, tag: str, arrays: tuple, build):
        key = (tag, *map(id, arrays))
        hit = self._cache.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], arrays)):  # the arrays are kept alive
            return hit[1]
        value = build()
        if len(self._cache) > self._limit:
            self._cache.clear()
        self._cache[key] = (arrays, value)
        return value


def _compose_flows(phases, matrix: np.ndarray, copies: list[tuple[int, ...]], size: int):
    k, g = matrix.shape
    group_of = np.empty(size, dtype=np.int64)
    member_of = np.empty(size, dtype=np.int64)
    group_of[matrix] = np.arange(k)[:, None]
    member_of[matrix] = np.arange(g)[None, :]
    mapped = _ByIdentity(256)

    def inner_rank(sub_rank: np.ndarray) -> np.ndarray:  # member sub_rank[l, t] of the group
        local = np.atleast_2d(sub_rank)[:, member_of]
        return np.where(local >= 0, matrix[group_of, np.maximum(local, 0)], -1)

    def inner_value(values: np.ndarray) -> np.ndarray:
        return np.atleast_2d(values)[:, member_of]

    def stacked(per_column: tuple) -> np.ndarray:  # (lanes, size): column t's value of group i
        rows = np.stack([np.atleast_2d(a) for a in per_column])  # (g, lanes, k)
        return rows[member_of, :, group_of].T

    def outer_rank(per_column: tuple) -> np.ndarray:  # group sub_rank of the rank's column
        picked = stacked(per_column)
        return np.where(picked >= 0, matrix[np.maximum(picked, 0), member_of], -1)

    step_index = 0
    for level, (steps, factories, counts) in phases:
        if level == "inner":
            (factory,) = factories.values()
            for f in factory():
                send_to = mapped("to", (f.send_to,), lambda: inner_rank(f.send_to))
                send_count = mapped("n", (f.send_count,), lambda: inner_value(f.send_count))
                recv_from = mapped("from", (f.recv_from,), lambda: inner_rank(f.recv_from))
                lanes = None if f.recv_lane is None else mapped("lane", (f.recv_lane,), lambda: inner_value(f.recv_lane))
                yield StepFlows(send_to, send_count, recv_from, f.reduce, lanes, _copies(copies[step_index], size),
                                f.repeat)
                step_index += 1
        else:
            iterators = {n: iter(factory()) for n, factory in factories.items()}
            for _ in range(steps):
                now = {n: next(it) for n, it in iterators.items()}
                cols = tuple(now[n] for n in counts)
                first = cols[0]
                if any(c.repeat != first.repeat for c in cols):
                    raise ValueError("hierarchical flows: columns repeat their messages differently")
                send_to = mapped("to", tuple(c.send_to for c in cols), lambda: outer_rank(tuple(c.send_to for c in cols)))
                send_count = mapped("n", tuple(c.send_count for c in cols), lambda: stacked(tuple(c.send_count for c in cols)))
                recv_from = mapped("from", tuple(c.recv_from for c in cols), lambda: outer_rank(tuple(c.recv_from for c in cols)))
                lanes = None if first.recv_lane is None else mapped(
                    "lane", tuple(c.recv_lane for c in cols), lambda: stacked(tuple(c.recv_lane for c in cols)))
                yield StepFlows(send_to, send_count, recv_from, first.reduce, lanes, _copies(copies[step_index], size),
                                first.repeat)
                step_index += 1
    if step_index < len(copies):  # the copies out of the staging area ride on a step of their own
        none = np.full(size, -1)
        yield StepFlows(none, np.zeros(size, dtype=np.int64), none, False, None, _copies(copies[step_index], size))


def _rooted_flows(fn: ScheduleFn, size: int, count: int):
    """Flows of the two-level scatter / gather with root 0 on equal groups of consecutive ranks:
    the outer algorithm's flows on the root's plane (member 0 of every group) and the inner
    algorithm's in every group at once, mapped to world ranks; each rank's local copies come from
    the composite schedules of its role (the root, another plane rank, any other rank)."""
    from .registry import FLOWS

    collective = fn.collective
    plan = _Plan.of(fn.partition)
    g, k = plan.m, plan.k
    if not plan.in_rank_order or plan.size != size or g < 2 or k < 2 or count < 1:
        raise ValueError(f"hierarchical {collective} flows need equal groups of consecutive ranks in order, at least 2 "
                         "of at least 2, and count >= 1")
    if (collective, fn.outer) not in FLOWS or (collective, fn.inner) not in FLOWS:
        raise ValueError(f"no flows for {collective}/{fn.outer} or {collective}/{fn.inner}")
    outer = FLOWS[(collective, fn.outer)](k, g * count)
    inner = FLOWS[(collective, fn.inner)](g, count)
    outer_first, inner_first = next(outer), next(inner)  # ValueError when they do not apply
    outer = itertools.chain([outer_first], outer)
    inner = itertools.chain([inner_first], inner)
    roles = [fn(r, size, count, 0).steps for r in (0, g, 1)]  # the root, another plane rank, any other
    phase_steps = (len(SCHEDULES[(collective, fn.outer)](0, k, g * count, 0).steps)
                   + len(SCHEDULES[(collective, fn.inner)](0, g, count, 0).steps))  # the sub-roots' are the longest
    if max(len(steps) for steps in roles) not in (phase_steps, phase_steps + 1):
        raise ValueError("hierarchical flows: the composite's steps do not line up with its phases")
    if any(c.reduce_with is not None for steps in roles for step in steps for c in step.copies):
        raise ValueError("hierarchical flows: local reductions")
    role_of = np.full(size, 2)
    role_of[::g] = 1
    role_of[0] = 0
    plane = np.arange(k) * g
    tile = np.arange(k)[:, None] * g
    mapped = _ByIdentity(64)  # a mesh level hands new arrays every step: keep memory bounded

    def on_plane(sub_ranks: np.ndarray) -> np.ndarray:  # plane member v -> its world rank, elsewhere -1
        rows = np.atleast_2d(sub_ranks)
        world = np.full((rows.shape[0], size), -1)
        world[:, plane] = np.where(rows >= 0, plane[np.maximum(rows, 0)], -1)
        return world if np.ndim(sub_ranks) == 2 else world[0]

    def plane_values(values: np.ndarray) -> np.ndarray:
        rows = np.atleast_2d(values)
        world = np.zeros((rows.shape[0], size), dtype=rows.dtype)
        world[:, plane] = rows
        return world if np.ndim(values) == 2 else world[0]

    def in_groups(sub_ranks: np.ndarray) -> np.ndarray:  # member t of every group -> its world rank
        rows = np.atleast_2d(sub_ranks)
        world = np.where(rows[:, None, :] >= 0, tile[None] + rows[:, None, :], -1).reshape(rows.shape[0], size)
        return world if np.ndim(sub_ranks) == 2 else world[0]

    def group_values(values: np.ndarray) -> np.ndarray:
        return np.tile(values, k)

    def world_step(f: StepFlows, on_the_plane: bool, copies) -> StepFlows:
        ranks, values = (on_plane, plane_values) if on_the_plane else (in_groups, group_values)
        level = "plane " if on_the_plane else "groups "  # one array object mapped two ways: two entries
        send_to = mapped(level + "to", (f.send_to,), lambda: ranks(f.send_to))
        recv_from = mapped(level + "from", (f.recv_from,), lambda: ranks(f.recv_from))
        lanes = None if f.recv_lane is None else mapped(level + "lane", (f.recv_lane,), lambda: values(f.recv_lane))
        counts = values(f.send_count) if f.senders is None else f.send_count
        senders = f.senders
        if senders is not None:
            start, stop, stride = senders.indices(g if not on_the_plane else k)
            if on_the_plane:
                counts = mapped("plane n", (f.send_count,), lambda: plane_values(f.send_count))
                senders = slice(start * g, stop * g, stride * g)
            elif stop - start == 1:  # one member of every group
                counts = mapped("groups n", (f.send_count,), lambda: group_values(f.send_count))
                senders = slice(start, size, g)
            else:  # several members of every group: whole arrays
                active = np.zeros(g, dtype=bool)
                active[senders] = True
                sub_to = np.where(active, f.send_to, -1)
                sub_from = np.full(g, -1)
                sub_from[sub_to[active]] = np.flatnonzero(active)
                send_to, recv_from, counts, senders = in_groups(sub_to), in_groups(sub_from), group_values(f.send_count), None
        return StepFlows(send_to, counts, recv_from, f.reduce, lanes, copies, f.repeat, senders)

    phases = [(outer, True), (inner, False)] if collective == "scatter" else [(inner, False), (outer, True)]
    nsteps = max(len(steps) for steps in roles)
    step_index = 0
    for flows, on_the_plane in phases:
        for f in flows:
            yield world_step(f, on_the_plane, _role_copies(roles, step_index, role_of))
            step_index += 1
    if step_index < nsteps:  # the root's copies out of a staging area, on a step of their own
        none = np.full(size, -1)
        yield StepFlows(none, np.zeros(size, dtype=np.int64), none, False, None, _role_copies(roles, step_index, role_of))
        step_index += 1
    if step_index != nsteps:
        raise ValueError("hierarchical flows: the composite's steps do not line up with its phases")


# The outer algorithms whose schedules keep the two-level broadcast / reduce aligned, so that one
# step of the flows is one step of every rank's composite: a broadcast's every rank runs as many
# steps (its groups then allgather at the same step); a reduce's root runs the most (its group's
# gather comes last). A test holds the property.
_ALIGNED_OUTER = {"broadcast": ("hd",), "reduce": ("hd", "ring")}


def _chunked_rooted_flows(fn: ScheduleFn, size: int, count: int):
    """Flows of the two-level broadcast / reduce with root 0 on equal groups of g consecutive
    ranks, ``count >= g``: each member's chunk in place (``_Chunks.direct``), or, chunks of two
    sizes, staged through TMP (each column then runs the outer algorithm on its own count).
    Broadcast: the root scatters the chunks in its group (the others idle), every column
    broadcasts its chunk across the groups (the outer algorithm's flows, all columns at once),
    every group allgathers (the root receives nothing). Reduce: every group reduce-scatters, every
    column reduces across the groups, the root gathers its group's chunks. Local copies come from
    the composite schedules of each role (checked alike on several ranks of each)."""
    from .registry import FLOWS

    collective = fn.collective
    plan = _Plan.of(fn.partition)
    g, k = plan.m, plan.k
    if not plan.in_rank_order or plan.size != size or g < 2 or k < 2 or count < g:
        raise ValueError(f"hierarchical {collective} flows need equal groups of consecutive ranks in order, at least 2 "
                         "of at least 2, and at least an element per rank of a group")
    if fn.outer not in _ALIGNED_OUTER[collective]:
        raise ValueError(f"hierarchical {collective} flows: {fn.outer!r} across the groups ends at different steps on "
                         "different groups (rank by rank)")
    chunk = [n for _, n in _Chunks(plan, count).bounds]  # column t's elements (chunk t)
    q = chunk[0]  # a slot: the largest chunk (what the inner level moves per member)
    level0 = "allgather" if collective == "broadcast" else "reduce_scatter"
    if (collective, fn.outer) not in FLOWS or (level0, fn.inner) not in FLOWS:
        raise ValueError(f"no flows for {collective}/{fn.outer} or {level0}/{fn.inner}")
    inner = FLOWS[(level0, fn.inner)](g, q)
    inner = itertools.chain([next(inner)], inner)  # ValueError when they do not apply
    if len(set(chunk)) == 1:  # every column alike: one outer algorithm's flows, mapped
        outer = FLOWS[(collective, fn.outer)](k, q)
        outer = _without_trailing_idle(itertools.chain([next(outer)], outer))
    else:  # two chunk sizes: each column its own count (staged through TMP, ``_Chunks``)
        outer = _columns_of(collective, fn.outer, k, chunk)
    role_of = np.full(size, 3)  # the root, its group's others, member 0 of another group, any other
    role_of[:g], role_of[0], role_of[g::g] = 1, 0, 2
    samples = [(0,), (1, g - 1), (g, (k - 1) * g, (k // 2) * g), (g + 1, size - 1, (k // 2) * g + g // 2)]
    roles = []
    for ranks in samples:
        steps = [fn(r, size, count, 0).steps for r in ranks]
        copies = [_trimmed([tuple(c.src.count for c in step.copies) for step in s]) for s in steps]
        if any(c != copies[0] for c in copies) or any(c.reduce_with is not None for s in steps for st in s
                                                      for c in st.copies):
            raise ValueError("hierarchical flows: ranks of one role copy differently, or reduce locally")
        roles.append(steps[0])
    group_of, member_of = np.arange(size) // g, np.arange(size) % g
    mapped = _ByIdentity(64)

    def across(sub: np.ndarray) -> np.ndarray:  # group sub[.., i] -> the same member of that group
        rows = np.atleast_2d(sub)[:, group_of]
        world = np.where(rows >= 0, rows * g + member_of, -1)
        return world if np.ndim(sub) == 2 else world[0]

    def columns(values: np.ndarray) -> np.ndarray:
        rows = np.atleast_2d(values)[:, group_of]
        return rows if np.ndim(values) == 2 else rows[0]

    deaf = collective == "broadcast"  # the root receives nothing in its group's allgather

    def inside(sub: np.ndarray, sending: bool) -> np.ndarray:  # member sub[.., t] of the same group
        rows = np.atleast_2d(sub)[:, member_of]
        world = np.where(rows >= 0, group_of * g + rows, -1)
        if deaf and sending:
            world[world == 0] = -1
        elif deaf:
            world[:, 0] = -1
        return world if np.ndim(sub) == 2 else world[0]

    def members(values: np.ndarray) -> np.ndarray:
        rows = np.atleast_2d(values)[:, member_of]
        return rows if np.ndim(values) == 2 else rows[0]

    def world_outer(f, copies) -> StepFlows:
        if isinstance(f, tuple):  # one StepFlows per column
            def pick(arrays):  # column t's array, entry i, for rank (i, t)
                return np.stack(arrays)[member_of, group_of]
            to, frm = pick([c.send_to for c in f]), pick([c.recv_from for c in f])
            return StepFlows(np.where(to >= 0, to * g + member_of, -1), pick([c.send_count for c in f]),
                             np.where(frm >= 0, frm * g + member_of, -1), f[0].reduce, None, copies, f[0].repeat)
        send_to = mapped("outer to", (f.send_to,), lambda: across(f.send_to))
        recv_from = mapped("outer from", (f.recv_from,), lambda: across(f.recv_from))
        counts = mapped("outer n", (f.send_count,), lambda: columns(f.send_count))
        lanes = None if f.recv_lane is None else mapped("outer lane", (f.recv_lane,), lambda: columns(f.recv_lane))
        senders = f.senders
        if senders is not None:
            start, stop, stride = senders.indices(k)
            if stride == 1:  # groups start..stop-1, every member
                senders = slice(start * g, stop * g)
            else:  # whole arrays
                active = np.zeros(k, dtype=bool)
                active[senders] = True
                sub_to = np.where(active, f.send_to, -1)
                sub_from = np.full(k, -1)
                sub_from[sub_to[active]] = np.flatnonzero(active)
                send_to, recv_from, senders = across(sub_to), across(sub_from), None
        return StepFlows(send_to, counts, recv_from, f.reduce, lanes, copies, f.repeat, senders)

    def world_inner(f: StepFlows, copies) -> StepFlows:
        send_to = mapped("inner to", (f.send_to,), lambda: inside(f.send_to, True))
        recv_from = mapped("inner from", (f.recv_from,), lambda: inside(f.recv_from, False))
        counts = mapped("inner n", (f.send_count,), lambda: members(f.send_count))
        lanes = None if f.recv_lane is None else mapped("inner lane", (f.recv_lane,), lambda: members(f.recv_lane))
        if f.senders is not None:
            raise ValueError("hierarchical flows: a chain inside the groups")
        return StepFlows(send_to, counts, recv_from, f.reduce, lanes, copies, f.repeat)

    def root_step(copies) -> StepFlows:  # the root's scatter to (gather from) its group's members
        peers = np.arange(1, g)
        lanes = np.full((g - 1, size), -1)
        towards = np.full((g - 1, size), -1)
        counts = np.zeros((g - 1, size), dtype=np.int64)
        if collective == "broadcast":
            lanes[peers - 1, 0] = peers
            counts[peers - 1, 0] = np.array(chunk)[peers]  # member u's chunk
            towards[0, peers] = 0
            recv_lane = np.zeros((g - 1, size), dtype=np.int64)
            recv_lane[0, peers] = peers - 1
            return StepFlows(lanes, counts, towards, False, recv_lane, copies)
        towards[0, peers] = 0  # one send each, to the root
        counts[0, peers] = np.array(chunk)[peers]
        lanes[peers - 1, 0] = peers  # the root's receives, in member order
        return StepFlows(towards, counts, lanes, False, np.zeros((g - 1, size), dtype=np.int64), copies)

    nsteps = max(len(steps) for steps in roles)
    step_index = 0

    def copies_now():
        return _role_copies(roles, step_index, role_of)

    if collective == "broadcast":
        phases = [("root", None), ("outer", outer), ("inner", inner)]
    else:
        phases = [("inner", inner), ("outer", outer), ("root", None)]
    for phase, flows in phases:
        if phase == "root":
            yield root_step(copies_now())
            step_index += 1
            continue
        for f in flows:
            yield (world_outer if phase == "outer" else world_inner)(f, copies_now())
            step_index += 1
    if step_index < nsteps:  # the copies out of the staging area ride on a step of their own
        none = np.full(size, -1)
        yield StepFlows(none, np.zeros(size, dtype=np.int64), none, False, None, copies_now())
        step_index += 1
    if step_index != nsteps:
        raise ValueError("hierarchical flows: the composite's steps do not line up with its phases")


def _columns_of(collective: str, outer: str, k: int, chunk: list[int]) -> list[tuple]:
    """The outer algorithm's steps for every column at once when columns hold two chunk sizes:
    per step a tuple of StepFlows, column t's for ``chunk[t]`` elements; ValueError unless every
    column runs as many steps of plain one-lane flows."""
    from .registry import FLOWS

    per_count = {n: list(_without_trailing_idle(FLOWS[(collective, outer)](k, n))) for n in set(chunk)}
    lengths = {len(steps) for steps in per_count.values()}
    plain = all(f.senders is None and f.send_to.ndim == 1 and f.recv_lane is None and not f.copies
                for steps in per_count.values() for f in steps)
    if len(lengths) != 1 or not plain:
        raise ValueError(f"hierarchical {collective} flows: columns of two chunk sizes run different steps across")
    return [tuple(per_count[n][j] for n in chunk) for j in range(lengths.pop())]


def _without_trailing_idle(flows):
    """``flows`` without the steps at the end in which nobody sends (chunks too small to fill every
    rank: a reduce's last gather rounds carry nothing), as every rank's schedule ends before them
    and the next phase follows at once."""
    idle = []
    for f in flows:
        if f.senders is None and not (f.send_to >= 0).any():
            idle.append(f)
            continue
        yield from idle
        idle = []
        yield f


def _trimmed(per_step: list) -> list:
    """``per_step`` without its trailing empty entries (a rank whose schedule ends sooner copies nothing after)."""
    while per_step and not per_step[-1]:
        per_step = per_step[:-1]
    return per_step


def _role_copies(roles, step_index: int, role_of: np.ndarray) -> tuple:
    """``StepFlows.copies`` of one step from each role's composite schedule: per-rank arrays of
    the element counts of its plain copies in order (0 where a role has fewer)."""
    counts = [[c.src.count for c in steps[step_index].copies] if step_index < len(steps) else [] for steps in roles]
    width = max(len(c) for c in counts)
    return tuple(np.array([c[j] if j < len(c) else 0 for c in counts], dtype=np.int64)[role_of] for j in range(width))


def _copies(counts: tuple[int, ...], size: int) -> tuple[int, ...]:
    """A step's plain copies, the same count on every rank (``StepFlows.copies`` takes ints)."""
    return counts
