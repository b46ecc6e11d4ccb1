"""HCCL's two-level all-to-alls: staged (``RunAlltoAllVStaged``) and pipelined (below).

Staged: on a partition of the ranks into G groups of M (servers, or a 910 server's HCCS
islands), stage 1 inside every group, stage 2 across groups among the ranks with the same index
in their group, so every message between groups carries M blocks.

Rank (g, i) is member i of group g. Stage 1 (``inner``: mesh, every member at once, or pairwise,
M-1 rounds): (g, i) sends member (g, t) what it has for index t of *every* group, G blocks packed
into one message; the block for (g, t) itself is final. Stage 2 (``outer``: pairwise, G-1 rounds,
or mesh): (g, i) sends (h, i) the M blocks its group has for (h, i), its own from IN and the
others from what stage 1 brought, packed into one message, and receives (h, i)'s message for it:
the blocks of every member of group h, into TMP, then copied to their places in OUT (so a rank's
steps and costs depend on the counts alone, never on its caller's displacements). A pack of one
block is sent from where it lies, so one group is a mesh (or pairwise) all-to-all and groups of one rank are the
flat ``outer`` algorithm.

Blocks may differ in size (``schedule_v``: AlltoAllV/VC, ``counts[i][j]`` elements from rank i
to rank j); ``schedule_for(partition, inner, outer)`` gives the equal-block (AlltoAll) schedule
function, ``fn(rank, size, count)``. Groups must be of equal size (HCCL runs the flat pairwise
all-to-all otherwise).

Steps: stage 1 (1 or M-1) + stage 2 (G-1 or 1) + a final copy out of TMP. Sent
per rank: its blocks to others, those for other groups twice (inside, then across; HCCL's
staging too). TMP: the packs of both stages and what stage 1 receives, up to ~3x the rank's data.
IN is never written.

**Pipelined** (``outer="pipeline"``, HCCL's ``RunAlltoAllVTwoLevelPipeline``, template
``AlltoallPipelineMeshPairwiseCCLEnough``: hcomm ``libochao-huawei/hcomm@8958adbf``
``alg_template/temp_alltoall/allltoall_pipeline_mesh_pairwise_ccl_enough.cc`` L27-300): the same
transfers with the levels overlapped, G steps. In step s, (g, i) sends (g+1+s, i) its blocks for
every member of group g+1+s in one message (s < G-1) and receives from (g-1-s, i) that rank's
blocks for every member of its own group, into TMP; at the same time it sends each member (g, t)
the block for (g, t) that originated at (g-s, i) (its own IN block at s = 0, else what it received
in step s-1) and receives from each member the block for itself that originated at (g-s, t),
into OUT; its own block from (g-s, i) is copied out first. Steps: G. TMP: the packs and what
the ring of groups brings, ~2x the rank's data.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, Iterator, Sequence

import numpy as np

from ..errors import HcclParamError
from ._common import finish, packed_displacements
from .schedule import IN, OUT, TMP, Copy, Recv, Region, Schedule, Send, Step, StepFlows

Partition = tuple[tuple[int, ...], ...]
LEVEL_ALGOS = ("mesh", "pairwise")  # what each stage can run
PIPELINE = "pipeline"  # the outer level of HCCL's pipelined two-level all-to-all (inner: mesh)
CONTINUOUS = "continuous"  # ... of HCCL's continuous pipeline, AlltoAllV only (alltoallv_continuous.py)
MESH_LANES_MAX = 1 << 24  # flows of a mesh across the groups: (groups - 1) x ranks elements per array at most


def check_partition(partition: Partition, inner: str, outer: str) -> None:
    """HcclParamError unless the groups are of one size and both stages name mesh or pairwise."""
    sizes = {len(g) for g in partition}
    if len(sizes) != 1:
        raise HcclParamError(
            f"staged all-to-all needs groups of one size, got sizes {sorted(sizes)} (HCCL runs the flat "
            "pairwise all-to-all there: algo='pairwise')",
            collective="alltoall",
            arg="partition",
            value=[len(g) for g in partition],
            rule="equal groups",
        )
    if outer in (PIPELINE, CONTINUOUS) and inner == "mesh":
        return
    for level, algo in (("inner", inner), ("outer", outer)):
        if algo not in LEVEL_ALGOS:
            raise HcclParamError(
                f"staged all-to-all: the {level} level runs mesh or pairwise, not {algo!r}",
                collective="alltoall",
                arg=level,
                value=algo,
                rule="choices",
                choices=list(LEVEL_ALGOS),
            )


def schedule_for(partition: Partition, inner: str = "mesh", outer: str = "pairwise") -> Callable[..., Schedule]:
    """The equal-block staged all-to-all on ``partition`` (cached: equal arguments, one function)."""
    check_partition(partition, inner, outer)
    if outer == CONTINUOUS:
        raise HcclParamError(
            "HCCL's continuous pipeline runs AlltoAllV (all_to_all_v) only",
            collective="alltoall",
            arg="outer",
            value=outer,
            rule="choices",
            choices=[*LEVEL_ALGOS, PIPELINE],
        )
    return _equal_blocks(partition, inner, outer)


@lru_cache(maxsize=128)
def _equal_blocks(partition: Partition, inner: str, outer: str) -> Callable[..., Schedule]:
    size = sum(len(g) for g in partition)

    @lru_cache(maxsize=256)
    def schedule(rank: int, size_: int, count: int, root: int = 0) -> Schedule:
        """Staged all-to-all of ``count`` elements per block on the partition; rank ``rank``'s Schedule."""
        if size_ != size:
            raise HcclParamError(
                f"staged all-to-all on {len(partition)} groups serves {size} ranks, not {size_}",
                collective="alltoall",
                arg="size",
                value=size_,
                rule="const",
                expected=size,
            )
        if count == 0:  # nothing moves: no steps (what finish leaves of both stages), without building them
            return finish([])
        counts = ((count,) * size,) * size
        displs = packed_displacements(counts[0])
        return schedule_v(rank, counts, displs, displs, partition, inner, outer)

    return schedule


def schedule_v(
    rank: int,
    counts: Sequence[Sequence[int]],
    send_displs: Sequence[int],
    recv_displs: Sequence[int],
    partition: Partition,
    inner: str = "mesh",
    outer: str = "pairwise",
) -> Schedule:
    """Rank ``rank``'s staged all-to-all for ``counts[i][j]`` elements from i to j (displacements
    as in ``alltoall_pairwise.schedule_v``) on ``partition``."""
    if outer == PIPELINE:
        return _pipelined(rank, counts, send_displs, recv_displs, partition)
    if outer == CONTINUOUS:  # its own module (alltoallv_continuous), which builds on this one's places
        raise ValueError("HCCL's continuous pipeline is alltoallv_continuous.schedule_v")
    me_g, me_i = block_places(partition, inner, outer)[rank]
    groups, m = len(partition), len(partition[0])
    tmp = TmpLayout()

    def block_in(dst: int) -> Region:  # my block for rank dst, in IN
        return Region(IN, send_displs[dst], counts[rank][dst])

    # Stage 1: to member t of my group, my blocks for index t of every group, in group order.
    firsts: list[Copy] = [Copy(block_in(rank), Region(OUT, recv_displs[rank], counts[rank][rank]))]
    stage1_sends: dict[int, Region] = {}
    for t in range(m):
        if t == me_i:
            continue
        dsts = [partition[h][t] for h in range(groups)]
        stage1_sends[partition[me_g][t]] = tmp.pack([block_in(d) for d in dsts], firsts)
    # ... and from member u, its blocks for my index in every group: sub-block h at arrived[u][h]
    stage1_recvs: dict[int, Region] = {}
    arrived: dict[int, list[Region]] = {}
    for u in range(m):
        if u == me_i:
            continue
        src = partition[me_g][u]
        if groups == 1:  # nothing to forward: straight into OUT
            stage1_recvs[src] = Region(OUT, recv_displs[src], counts[src][rank])
            continue
        sizes = [counts[src][partition[h][me_i]] for h in range(groups)]
        area = tmp.take(sum(sizes))
        stage1_recvs[src] = area
        arrived[u] = split_blocks(area, sizes)
    steps = _exchange(partition[me_g], me_i, inner, stage1_sends, stage1_recvs, firsts) if m > 1 else []

    # Stage 2: what my group has for (h, my index): members' blocks in member order.
    seconds: list[Copy] = [] if m > 1 else firsts  # groups of one: the own block's copy rides here
    for u, parts in arrived.items():  # blocks for me from my own group: final
        src = partition[me_g][u]
        seconds.append(Copy(parts[me_g], Region(OUT, recv_displs[src], counts[src][rank])))
    same_index = [partition[h][me_i] for h in range(groups)]
    stage2_sends: dict[int, Region] = {}
    for h in range(groups):
        if h == me_g:
            continue
        pieces = [block_in(partition[h][me_i]) if u == me_i else arrived[u][h] for u in range(m)]
        stage2_sends[partition[h][me_i]] = tmp.pack(pieces, seconds)
    stage2_recvs: dict[int, Region] = {}
    lasts: list[Copy] = []
    for h in range(groups):
        if h == me_g:
            continue
        # Through TMP whatever the layout: a rank's steps and costs must not depend on where its
        # caller put the blocks (AlltoAllV's displacements), only on the counts.
        srcs = partition[h]
        sizes = [counts[s][rank] for s in srcs]
        area = tmp.take(sum(sizes))
        stage2_recvs[partition[h][me_i]] = area
        lasts += [
            Copy(part, Region(OUT, recv_displs[s], n)) for part, s, n in zip(split_blocks(area, sizes), srcs, sizes)
        ]
    steps += _exchange(same_index, me_g, outer, stage2_sends, stage2_recvs, seconds)
    if lasts:
        steps.append(Step(copies=tuple(lasts)))
    return finish(steps)


def _pipelined(
    rank: int,
    counts: Sequence[Sequence[int]],
    send_displs: Sequence[int],
    recv_displs: Sequence[int],
    partition: Partition,
) -> Schedule:
    """HCCL's pipelined two-level all-to-all (module doc) on ``partition``: rank ``rank``'s steps."""
    n, l = block_places(partition, "mesh", PIPELINE)[rank]
    groups, m = len(partition), len(partition[0])
    at = lambda g, t: partition[g % groups][t % m]  # noqa: E731 - member t of group g, round the ring
    tmp = TmpLayout()

    def block_in(dst: int) -> Region:  # my block for rank dst, in IN
        return Region(IN, send_displs[dst], counts[rank][dst])

    def into_out(src: int) -> Region:  # the block from rank src, in OUT
        return Region(OUT, recv_displs[src], counts[src][rank])

    came: list[Region] | None = None  # what the ring brought in the step before, by member of my group
    steps = []
    for s in range(groups):
        origin = at(n - s, l)  # the rank whose blocks this step hands round my group
        copies = [Copy(block_in(rank) if s == 0 else came[l], into_out(origin))]
        sends, recvs = [], []
        if s < groups - 1:
            sends.append(Send(at(n + 1 + s, l), tmp.pack([block_in(at(n + 1 + s, t)) for t in range(m)], copies)))
            src = at(n - 1 - s, l)
            sizes = [counts[src][at(n, t)] for t in range(m)]
            area = tmp.take(sum(sizes))
            recvs.append(Recv(src, area))
        for i in range(1, m):
            peer = at(n, l + i)
            sends.append(Send(peer, block_in(peer) if s == 0 else came[(l + i) % m]))
            recvs.append(Recv(peer, into_out(at(n - s, l + i))))
        steps.append(Step(tuple(copies), tuple(sends), tuple(recvs)))
        if s < groups - 1:
            came = split_blocks(area, sizes)
    return finish(steps)


@lru_cache(maxsize=32)
def block_places(partition: Partition, inner: str, outer: str) -> dict[int, tuple[int, int]]:
    """rank -> (its group, its index there), once per partition (checked), not once per rank."""
    check_partition(partition, inner, outer)
    return {r: (g, t) for g, members in enumerate(partition) for t, r in enumerate(members)}


class TmpLayout:
    """TMP handed out front to back."""

    def __init__(self) -> None:
        self.used = 0

    def take(self, n: int) -> Region:
        """The next ``n`` elements of TMP."""
        region = Region(TMP, self.used, n)
        self.used += n
        return region

    def pack(self, pieces: list[Region], copies: list[Copy]) -> Region:
        """One region holding ``pieces`` in order: the piece itself when there is one, else a TMP
        area the ``copies`` fill."""
        if len(pieces) == 1:
            return pieces[0]
        area = self.take(sum(p.count for p in pieces))
        offset = area.offset
        for p in pieces:
            copies.append(Copy(p, Region(TMP, offset, p.count)))
            offset += p.count
        return area


def flows(partition: Partition, inner: str, outer: str, size: int, count: int) -> Iterator[StepFlows]:
    """Every rank's steps at once (``StepFlows``) of the equal-block staged or pipelined
    all-to-all, ``count`` elements a block, on ``partition`` (G >= 2 groups of M >= 2, any ranks),
    as :func:`schedule_for`'s schedules run them; ValueError where that does not hold (the
    simulator then goes rank by rank). Every block's pack copy is listed, in schedule order: the
    copies' seconds are summed one by one as the rank-by-rank cost model sums them."""
    check_partition(partition, inner, outer)
    mat = np.array(partition, dtype=np.int64)  # (G, M): group g, member i -> rank
    groups, m = mat.shape
    if outer == CONTINUOUS or groups < 2 or m < 2 or count < 1 or mat.size != size:
        raise ValueError("staged all-to-all flows: AlltoAll on >= 2 groups of >= 2 ranks, count >= 1")
    if outer == "mesh" and (groups - 1) * size > MESH_LANES_MAX:
        raise ValueError(
            f"staged all-to-all flows: a mesh across {groups} groups is {groups - 1} lanes of {size} ranks"
        )
    g_of = np.empty(size, dtype=np.int64)
    i_of = np.empty(size, dtype=np.int64)
    g_of[mat] = np.arange(groups)[:, None]
    i_of[mat] = np.arange(m)[None, :]

    flat = mat.ravel()
    place = g_of * m + i_of  # every rank's place in ``flat``
    in_order = bool((flat == np.arange(size)).all())

    def at(dg, di=0) -> np.ndarray:  # every rank's (g + dg, i + di)
        where = (place + dg * m) % size if not di else (g_of + dg) % groups * m + (i_of + di) % m
        return where if in_order else flat[where]

    if outer == PIPELINE:
        yield from _pipelined_flows(at, groups, m, size, count)
        return
    none = np.full(size, -1)

    def stage(members: int, algo: str, peer, length: int, copies: tuple) -> Iterator[StepFlows]:
        """One stage as ``_exchange`` runs it: peer(d) is every rank's member d places on."""
        if algo == "mesh":
            to = np.stack([peer(d) for d in range(1, members)])
            lane = np.broadcast_to(np.arange(members - 2, -1, -1)[:, None], to.shape)
            yield StepFlows(to, np.full(to.shape, length), to, False, recv_lane=lane, copies=copies)
            return
        for d in range(1, members):
            yield StepFlows(peer(d), np.full(size, length), peer(-d), False, copies=copies if d == 1 else ())

    # stage 1: the own block, then a pack of G blocks for each other member; stage 2: the blocks
    # stage 1 brought for me, then a pack of M blocks for each other group; then TMP into OUT
    yield from stage(m, inner, lambda d: at(0, d), groups * count, (count,) * (1 + (m - 1) * groups))
    yield from stage(groups, outer, lambda d: at(d), m * count, (count,) * (m - 1 + (groups - 1) * m))
    yield StepFlows(none, np.zeros(size, dtype=np.int64), none, False, copies=(count,) * ((groups - 1) * m))


def _pipelined_flows(at, groups: int, m: int, size: int, count: int) -> Iterator[StepFlows]:
    """``_pipelined`` for every rank at once: lane 0 the ring of groups (``-1`` in the last
    step), lanes 1..M-1 the members (i + d); receive d comes from member i + d's lane M - d."""
    members = [at(0, d) for d in range(1, m)]
    lane = np.broadcast_to(np.array([0, *range(m - 1, 0, -1)])[:, None], (m, size))
    sent = np.stack([np.full(size, m * count), *[np.full(size, count)] * (m - 1)])
    none = np.full(size, -1)
    for s in range(groups):
        ring = s < groups - 1
        to = np.stack([at(1 + s) if ring else none, *members])
        frm = np.stack([at(-1 - s) if ring else none, *members])
        yield StepFlows(to, sent, frm, False, recv_lane=lane, copies=(count,) * (1 + (m if ring else 0)))


def split_blocks(area: Region, sizes: list[int]) -> list[Region]:
    """``area`` cut, front to back, into consecutive regions of ``sizes`` elements."""
    parts, offset = [], area.offset
    for n in sizes:
        parts.append(Region(area.buf, offset, n))
        offset += n
    return parts


def _exchange(
    members: Sequence[int], me: int, algo: str, sends: dict[int, Region], recvs: dict[int, Region], copies: list[Copy]
) -> list[Step]:
    """One stage among ``members`` (me = my index there): every send and receive in one step
    (mesh), or a round per distance (pairwise); ``copies`` run before the first."""
    n = len(members)
    if n == 1:
        return [Step(copies=tuple(copies))] if copies else []
    if algo == "mesh":
        peers = [members[(me + s) % n] for s in range(1, n)]
        return [
            Step(
                copies=tuple(copies),
                sends=tuple(Send(p, sends[p]) for p in peers),
                recvs=tuple(Recv(p, recvs[p]) for p in peers),
            )
        ]
    steps = []
    for s in range(1, n):
        to, frm = members[(me + s) % n], members[(me - s) % n]
        steps.append(
            Step(copies=tuple(copies) if s == 1 else (), sends=(Send(to, sends[to]),), recvs=(Recv(frm, recvs[frm]),))
        )
    return steps
