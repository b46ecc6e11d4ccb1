"""Hierarchical collectives at cluster scale: the composite of ``hierarchical.schedule_for`` on
equal groups as whole steps of every rank at once (``StepFlows``), for the simulator where rank
by rank is out of reach.

Each phase is the flat algorithm's flows, run by every group (inner) or every column of holders
(outer) at once and mapped to communicator ranks; local copies come from one rank's composite
schedule (every rank of equal groups copies the same amounts, checked). Flows equal the rank by
rank walk of the same schedules (tests/hccl_py/modeled/test_flows.py, ``test_two_level_*flows*``)::

    fn = schedule_for("allreduce", [[0, 1], [2, 3]], inner="ring", outer="hd")
    for step in flows_of(fn, 4, 1024): ...
"""

from __future__ import annotations

import itertools

import numpy as np

from . import alltoall_staged, pipeline
from .hierarchical import Chunks, LevelPlan, ScheduleFn, whole_buffer
from .registry import FLOWS, SCHEDULES
from .schedule import StepFlows

_FLOW_PHASES = {"allreduce", "allgather", "reduce_scatter"}


def flows_of(fn: ScheduleFn, size: int, count: int):
    """Every rank's steps at once for a hierarchical schedule function of ``schedule_for``
    (allreduce, allgather, reduce_scatter on equal groups whose levels have flows; scatter,
    gather, broadcast and reduce with root 0; the staged and pipelined all-to-all); ValueError
    where it does not apply (the simulator then goes rank by rank)."""
    collective = getattr(fn, "collective", None)
    if collective == "alltoall":
        return alltoall_staged.flows(fn.partition, fn.inner, fn.outer, size, count)
    if getattr(fn, "outer", None) == "pipeline":
        return pipeline.flows(collective, fn.partition, size, count)
    if collective in ("scatter", "gather"):
        return _rooted_flows(fn, size, count)
    if collective in ("broadcast", "reduce"):
        return _chunked_rooted_flows(fn, size, count)
    if collective not in _FLOW_PHASES or count < 1:
        raise ValueError("hierarchical flows: allreduce, allgather or reduce_scatter with count >= 1")
    plan = LevelPlan.of(fn.partition)
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
            factories[n] = lambda n=n: FLOWS[(collective, name)](members, n)
            these = len(SCHEDULES[(collective, name)](0, members, n).steps)
            if steps is not None and these != steps:
                raise ValueError("hierarchical flows: columns with different step counts")
            steps = these
        return steps, factories, counts

    if collective == "allreduce" and whole_buffer(fn.inner):
        phases = [
            ("inner", phase(fn.inner, "allreduce", [count], g)),
            ("outer", phase(fn.outer, "allreduce", [count] * g, k)),
        ]
    elif collective == "allreduce":
        ch = Chunks(plan, count)
        phases = [
            ("inner", phase(fn.inner, "reduce_scatter", [ch.q], g)),
            ("outer", phase(fn.outer, "allreduce", [ch.bounds[t][1] for t in range(g)], k)),
            ("inner", phase(fn.inner, "allgather", [ch.q], g)),
        ]
    elif collective == "allgather":
        phases = [
            ("outer", phase(fn.outer, "allgather", [count] * g, k)),
            ("inner", phase(fn.inner, "allgather", [k * count], g)),
        ]
    elif getattr(fn, "across_first", False):
        phases = [
            ("outer", phase(fn.outer, "reduce_scatter", [g * count] * g, k)),
            ("inner", phase(fn.inner, "reduce_scatter", [count], g)),
        ]
    else:
        phases = [
            ("inner", phase(fn.inner, "reduce_scatter", [k * count], g)),
            ("outer", phase(fn.outer, "reduce_scatter", [count] * g, k)),
        ]
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
                lanes = (
                    None if f.recv_lane is None else mapped("lane", (f.recv_lane,), lambda: inner_value(f.recv_lane))
                )
                yield StepFlows(
                    send_to, send_count, recv_from, f.reduce, lanes, _copies(copies[step_index], size), f.repeat
                )
                step_index += 1
        else:
            iterators = {n: iter(factory()) for n, factory in factories.items()}
            for _ in range(steps):
                now = {n: next(it) for n, it in iterators.items()}
                cols = tuple(now[n] for n in counts)
                first = cols[0]
                if any(c.repeat != first.repeat for c in cols):
                    raise ValueError("hierarchical flows: columns repeat their messages differently")
                send_to = mapped(
                    "to", tuple(c.send_to for c in cols), lambda: outer_rank(tuple(c.send_to for c in cols))
                )
                send_count = mapped(
                    "n", tuple(c.send_count for c in cols), lambda: stacked(tuple(c.send_count for c in cols))
                )
                recv_from = mapped(
                    "from", tuple(c.recv_from for c in cols), lambda: outer_rank(tuple(c.recv_from for c in cols))
                )
                lanes = (
                    None
                    if first.recv_lane is None
                    else mapped(
                        "lane", tuple(c.recv_lane for c in cols), lambda: stacked(tuple(c.recv_lane for c in cols))
                    )
                )
                yield StepFlows(
                    send_to, send_count, recv_from, first.reduce, lanes, _copies(copies[step_index], size), first.repeat
                )
                step_index += 1
    if step_index < len(copies):  # the copies out of the staging area ride on a step of their own
        none = np.full(size, -1)
        yield StepFlows(none, np.zeros(size, dtype=np.int64), none, False, None, _copies(copies[step_index], size))


def _rooted_flows(fn: ScheduleFn, size: int, count: int):
    """Flows of the two-level scatter / gather with root 0 on equal groups of consecutive ranks:
    the outer algorithm's flows on the root's plane (member 0 of every group) and the inner
    algorithm's in every group at once, mapped to world ranks; each rank's local copies come from
    the composite schedules of its role (the root, another plane rank, any other rank)."""
    collective = fn.collective
    plan = LevelPlan.of(fn.partition)
    g, k = plan.m, plan.k
    if not plan.in_rank_order or plan.size != size or g < 2 or k < 2 or count < 1:
        raise ValueError(
            f"hierarchical {collective} flows need equal groups of consecutive ranks in order, at least 2 "
            "of at least 2, and count >= 1"
        )
    if (collective, fn.outer) not in FLOWS or (collective, fn.inner) not in FLOWS:
        raise ValueError(f"no flows for {collective}/{fn.outer} or {collective}/{fn.inner}")
    outer = FLOWS[(collective, fn.outer)](k, g * count)
    inner = FLOWS[(collective, fn.inner)](g, count)
    outer_first, inner_first = next(outer), next(inner)  # ValueError when they do not apply
    outer = itertools.chain([outer_first], outer)
    inner = itertools.chain([inner_first], inner)
    roles = [fn(r, size, count, 0).steps for r in (0, g, 1)]  # the root, another plane rank, any other
    phase_steps = len(SCHEDULES[(collective, fn.outer)](0, k, g * count, 0).steps) + len(
        SCHEDULES[(collective, fn.inner)](0, g, count, 0).steps
    )  # the sub-roots' are the longest
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
                send_to, recv_from, counts, senders = (
                    in_groups(sub_to),
                    in_groups(sub_from),
                    group_values(f.send_count),
                    None,
                )
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
        yield StepFlows(
            none, np.zeros(size, dtype=np.int64), none, False, None, _role_copies(roles, step_index, role_of)
        )
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
    ranks, ``count >= g``: each member's chunk in place (``Chunks.direct``), or, chunks of two
    sizes, staged through TMP (each column then runs the outer algorithm on its own count).
    Broadcast: the root scatters the chunks in its group (the others idle), every column
    broadcasts its chunk across the groups (the outer algorithm's flows, all columns at once),
    every group allgathers (the root receives nothing). Reduce: every group reduce-scatters, every
    column reduces across the groups, the root gathers its group's chunks. Local copies come from
    the composite schedules of each role (checked alike on several ranks of each)."""
    collective = fn.collective
    plan = LevelPlan.of(fn.partition)
    g, k = plan.m, plan.k
    if not plan.in_rank_order or plan.size != size or g < 2 or k < 2 or count < g:
        raise ValueError(
            f"hierarchical {collective} flows need equal groups of consecutive ranks in order, at least 2 "
            "of at least 2, and at least an element per rank of a group"
        )
    if fn.outer not in _ALIGNED_OUTER[collective]:
        raise ValueError(
            f"hierarchical {collective} flows: {fn.outer!r} across the groups ends at different steps on "
            "different groups (rank by rank)"
        )
    chunk = [n for _, n in Chunks(plan, count).bounds]  # column t's elements (chunk t)
    q = chunk[0]  # a slot: the largest chunk (what the inner level moves per member)
    level0 = "allgather" if collective == "broadcast" else "reduce_scatter"
    if (collective, fn.outer) not in FLOWS or (level0, fn.inner) not in FLOWS:
        raise ValueError(f"no flows for {collective}/{fn.outer} or {level0}/{fn.inner}")
    inner = FLOWS[(level0, fn.inner)](g, q)
    inner = itertools.chain([next(inner)], inner)  # ValueError when they do not apply
    if len(set(chunk)) == 1:  # every column alike: one outer algorithm's flows, mapped
        outer = FLOWS[(collective, fn.outer)](k, q)
        outer = _without_trailing_idle(itertools.chain([next(outer)], outer))
    else:  # two chunk sizes: each column its own count (staged through TMP, ``Chunks``)
        outer = _columns_of(collective, fn.outer, k, chunk)
    role_of = np.full(size, 3)  # the root, its group's others, member 0 of another group, any other
    role_of[:g], role_of[0], role_of[g::g] = 1, 0, 2
    samples = [(0,), (1, g - 1), (g, (k - 1) * g, (k // 2) * g), (g + 1, size - 1, (k // 2) * g + g // 2)]
    roles = []
    for ranks in samples:
        steps = [fn(r, size, count, 0).steps for r in ranks]
        copies = [_trimmed([tuple(c.src.count for c in step.copies) for step in s]) for s in steps]
        if any(c != copies[0] for c in copies) or any(
            c.reduce_with is not None for s in steps for st in s for c in st.copies
        ):
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
            return StepFlows(
                np.where(to >= 0, to * g + member_of, -1),
                pick([c.send_count for c in f]),
                np.where(frm >= 0, frm * g + member_of, -1),
                f[0].reduce,
                None,
                copies,
                f[0].repeat,
            )
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
    per_count = {n: list(_without_trailing_idle(FLOWS[(collective, outer)](k, n))) for n in set(chunk)}
    lengths = {len(steps) for steps in per_count.values()}
    plain = all(
        f.senders is None and f.send_to.ndim == 1 and f.recv_lane is None and not f.copies
        for steps in per_count.values()
        for f in steps
    )
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
