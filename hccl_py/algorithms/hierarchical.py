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

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Callable, Sequence

from topology import TopologyError, validate_partition

from ..errors import HcclParamError
from . import alltoall_staged, pipeline
from ._common import finish
from .registry import SCHEDULES, get_schedule
from .schedule import IN, OUT, TMP, Copy, Recv, Region, Schedule, Send, Step, chunk_bounds

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
        raise HcclParamError(
            f"no hierarchical algorithm for {collective!r}; use one of {', '.join(TWO_LEVEL)}",
            arg="collective",
            value=collective,
            rule="choices",
            choices=list(TWO_LEVEL),
        )
    if outer == "pipeline" and collective != "alltoall":  # HCCL's pipeline: its own schedule, level 0 a full mesh
        if inner != "mesh" or collective not in pipeline.PIPELINED:
            raise HcclParamError(
                f"HCCL's pipeline is hier:mesh/pipeline for {', '.join(pipeline.PIPELINED)}, "
                f"not {collective} with {inner!r} inside",
                collective=collective,
                arg="algo",
                value=f"hier:{inner}/{outer}",
                rule="choices",
                choices=list(pipeline.PIPELINED),
            )
        try:
            return pipeline.schedule_for(collective, partition)
        except ValueError as err:
            raise HcclParamError(
                f"hierarchical {collective}: {err}", collective=collective, arg="partition", rule="equal groups"
            ) from None
    if collective == "alltoall":
        staged = alltoall_staged.schedule_for(partition, inner, outer)
        staged.collective, staged.partition, staged.inner, staged.outer = collective, partition, inner, outer
        return staged
    inner_names, outer_names = LEVELS[collective]
    plan = LevelPlan.of(partition)
    build = _BUILDERS[collective]
    if across_first(outer):
        if collective != "reduce_scatter" or not plan.uniform:
            raise HcclParamError(
                f"across first ({outer!r}): reduce_scatter on groups of one size only, not {collective}",
                collective=collective,
                arg="algo",
                value=f"hier:{inner}/{outer}",
                rule="choices",
                choices=["reduce_scatter"],
            )
        name, outer, build = outer, outer[: -len(FIRST)], _reduce_scatter_across_first
    else:
        name = outer
    if collective == "allreduce" and whole_buffer(inner):  # an allreduce-only algorithm inside: whole buffers
        if not plan.uniform:
            raise HcclParamError(
                f"hierarchical allreduce with {inner!r} inside needs groups of one size",
                collective=collective,
                arg="partition",
                rule="equal groups",
            )
        inner_names, build = ("allreduce",), _allreduce_whole
    fns = {("inner", c): get_schedule(c, inner) for c in inner_names}
    fns.update({("outer", c): get_schedule(c, outer) for c in outer_names})

    @lru_cache(maxsize=256)
    def schedule(rank: int, size: int, count: int, root: int = 0) -> Schedule:
        if size != plan.size:
            raise HcclParamError(
                f"hierarchical {collective} on partition {format_partition(partition)} "
                f"serves {plan.size} ranks, not {size}",
                collective=collective,
                arg="size",
                value=size,
                rule="const",
                expected=plan.size,
            )
        if count == 0:
            return finish([])
        return build(plan, fns, rank, count, root)

    schedule.__qualname__ = schedule.__name__ = f"hier[{format_partition(partition)}]:{inner}/{name}"
    schedule.collective, schedule.partition, schedule.inner, schedule.outer = collective, partition, inner, outer
    schedule.across_first = name != outer
    return schedule


@dataclass(frozen=True)
class LevelPlan:
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
    def of(cls, groups: Partition) -> "LevelPlan":
        """The plan of ``groups`` (each a list of ranks)."""
        where = [(0, 0)] * sum(len(g) for g in groups)
        for i, group in enumerate(groups):
            for t, r in enumerate(group):
                where[r] = (i, t)
        m = max(len(g) for g in groups)
        table = tuple(tuple(g[j % len(g)] for g in groups) for j in range(m))
        return cls(groups, len(where), tuple(where), m, all(len(g) == m for g in groups), table)

    @property
    def k(self) -> int:
        """The number of groups."""
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

    def run(
        self,
        sub: Schedule,
        ranks: Sequence[int],
        in_base: Region,
        out_base: Region,
        *,
        me: int = -1,
        deaf: int | None = None,
    ) -> None:
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
            copies = [
                Copy(at(c.src), at(c.dst), None if c.reduce_with is None else at(c.reduce_with)) for c in s.copies
            ]
            copies = [c for c in copies if c.src != c.dst or c.reduce_with is not None]
            sends = [Send(ranks[x.peer], at(x.src)) for x in s.sends if x.peer != deaf]
            recvs = (
                []
                if me == deaf
                else [
                    Recv(
                        ranks[x.peer], at(x.dst), None if x.reduce_with is None else at(x.reduce_with), x.incoming_first
                    )
                    for x in s.recvs
                ]
            )
            self.steps.append(Step(tuple(self.pending + copies), tuple(sends), tuple(recvs)))
            self.pending = []

    def idle(self, steps: int) -> None:
        """``steps`` empty steps (a phase this rank has no part in, kept by ``done(aligned=True)``)."""
        for _ in range(steps):
            self.step()

    def done(self, *, aligned: bool = False, whole_rounds: bool = False) -> Schedule:
        if self.pending:
            self.step()
        return finish(self.steps, aligned=aligned, whole_rounds=whole_rounds)


def _sub(fns, level: str, collective: str, rank: int, size: int, count: int, root: int = 0) -> Schedule:
    return fns[(level, collective)](rank, size, count, root)


# ---------------------------------------------------------------------------------------- chunked
# allreduce, broadcast and reduce cut the buffer into m chunks; member t of G_i holds slots(i, t).


@dataclass(frozen=True)
class Chunks:
    """One level's chunks of a call of ``count`` elements on a :class:`LevelPlan`."""

    plan: LevelPlan
    count: int

    @cached_property
    def bounds(self) -> list[tuple[int, int]]:  # read for every chunk of every rank: computed once
        return chunk_bounds(self.count, self.plan.m)

    @property
    def q(self) -> int:
        """Slot width: the largest chunk's elements."""
        return self.bounds[0][1]

    @property
    def direct(self) -> bool:
        """Every member holds one chunk and chunks are equal: work in place in the user buffer."""
        return self.plan.uniform and self.count % self.plan.m == 0

    def chunk(self, j: int) -> Region:
        """Chunk ``j`` of OUT."""
        return Region(OUT, *self.bounds[j])

    def bundle(self, i: int) -> int:
        """Staging elements per member of group ``i``."""
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


def _allreduce(plan: LevelPlan, fns, rank: int, count: int, root: int) -> Schedule:
    i, t = plan.where[rank]
    group, g, k = plan.groups[i], len(plan.groups[i]), plan.k
    ch = Chunks(plan, count)
    if ch.direct:
        q = ch.q
        held = Region(TMP, 0, q)
        c = _Compose(persistent=q)
        c.run(_sub(fns, "inner", "reduce_scatter", t, g, q), group, Region(OUT, 0, count), held, me=t)
        c.run(_sub(fns, "outer", "allreduce", i, k, q), plan.holders(t), held, held, me=i)
        c.run(_sub(fns, "inner", "allgather", t, g, q), group, held, Region(OUT, 0, count), me=t)
        return c.done(aligned=True)  # an aligned outer algorithm (tree) keeps its idle rounds
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
    return c.done(aligned=True)


FIRST = "-first"  # an outer level named "<algo>-first" runs before the inner one (reduce_scatter)


def across_first(outer: str) -> bool:
    """Whether ``outer`` names the outer level of a reduce_scatter that runs across groups first."""
    return outer.endswith(FIRST)


def _reduce_scatter_across_first(plan: LevelPlan, fns, rank: int, count: int, root: int) -> Schedule:
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


def _allreduce_whole(plan: LevelPlan, fns, rank: int, count: int, root: int) -> Schedule:
    """Whole buffers (HCCL's small-count executor, AllReduceMeshOpbaseSmallCountDeterministicExecutor):
    the inner allreduce of the whole buffer in every group, then the outer allreduce of the whole
    buffer among the ranks with one index (each index's ranks compute the same sums in the same
    order, so every rank ends bit-identical)."""
    i, t = plan.where[rank]
    whole = Region(OUT, 0, count)
    c = _Compose()
    c.run(_sub(fns, "inner", "allreduce", t, len(plan.groups[i]), count), plan.groups[i], whole, whole, me=t)
    c.run(_sub(fns, "outer", "allreduce", i, plan.k, count), plan.holders(t), whole, whole, me=i)
    return c.done(aligned=True, whole_rounds=True)  # an outer tree's last idle rounds too: every rank ends alike


def _broadcast(plan: LevelPlan, fns, rank: int, count: int, root: int) -> Schedule:
    i, t = plan.where[rank]
    i0, t0 = plan.where[root]
    group, g, k = plan.groups[i], len(plan.groups[i]), plan.k
    ch = Chunks(plan, count)
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
            c.step(
                sends=[
                    Send(m, ch.chunk(j))
                    for u, m in enumerate(group)
                    if u != t0
                    for j in plan.slots(i, u)
                    if ch.bounds[j][1]
                ]
            )
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


def _reduce(plan: LevelPlan, fns, rank: int, count: int, root: int) -> Schedule:
    i, t = plan.where[rank]
    i0, t0 = plan.where[root]
    group, g, k = plan.groups[i], len(plan.groups[i]), plan.k
    ch = Chunks(plan, count)
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
            c.step(
                recvs=[
                    Recv(m, ch.chunk(j))
                    for u, m in enumerate(group)
                    if u != t0
                    for j in plan.slots(i, u)
                    if ch.bounds[j][1]
                ]
            )
        else:
            c.step(sends=[Send(root, region) for region in mine.values()])
    return c.done(aligned=True)


# ---------------------------------------------------------------------------------------- blocked
# allgather and reduce_scatter move per-rank blocks; column j < m is the blocks of G_i[j] for every
# group i that has a member j, held by plan.holders(j); a column's slot is k blocks (group order).


def _allgather(plan: LevelPlan, fns, rank: int, count: int, root: int) -> Schedule:
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
        c.run(
            _sub(fns, "outer", "allgather", i, k, count),
            plan.holders(j),
            Region(IN, 0, count),
            Region(TMP, t * b + s * slot, slot),
            me=i,
        )
    c.run(_sub(fns, "inner", "allgather", t, g, b), group, Region(TMP, t * b, b), Region(TMP, 0, g * b), me=t)
    for u in range(g):
        for s, j in enumerate(plan.slots(i, u)):
            for x, other in enumerate(plan.groups):
                if j < len(other):
                    c.copy(Region(TMP, u * b + s * slot + x * count, count), Region(OUT, other[j] * count, count))
    return c.done()


def _reduce_scatter(plan: LevelPlan, fns, rank: int, count: int, root: int) -> Schedule:
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
        c.run(
            _sub(fns, "outer", "reduce_scatter", i, k, count),
            plan.holders(j),
            Region(TMP, held + s * slot, slot),
            out,
            me=i,
        )
    return c.done()


def _rooted_plan(plan: LevelPlan, collective: str) -> None:
    if not plan.uniform:
        raise HcclParamError(
            f"hierarchical {collective} needs groups of one size, got sizes {sorted({len(g) for g in plan.groups})}",
            collective=collective,
            arg="partition",
            value=[len(g) for g in plan.groups],
            rule="equal groups",
        )


def _group_blocks(plan: LevelPlan, count: int, c: _Compose, whole: Region, into_stage: bool) -> list[Region]:
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


def _unstage(plan: LevelPlan, count: int, c: _Compose, whole: Region, areas: list[Region]) -> None:
    for area, group in zip(areas, plan.groups):
        if area.buf == TMP:
            for u, r in enumerate(group):
                c.copy(Region(TMP, area.offset + u * count, count), Region(whole.buf, whole.offset + r * count, count))


def _scatter(plan: LevelPlan, fns, rank: int, count: int, root: int) -> Schedule:
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


def _gather(plan: LevelPlan, fns, rank: int, count: int, root: int) -> Schedule:
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
