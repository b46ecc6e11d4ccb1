"""HCCL's continuous pipeline for AlltoAllV across servers (``RunAlltoAllVContinuousPipeline``,
template ``AlltoallvContinuousPipeline``: hcomm ``libochao-huawei/hcomm@8958adbf``
``alg_template/temp_alltoallv/alltoallv_continuous_pipeline.cc``), which HCCL runs for AlltoAllV
(not AlltoAll, not AlltoAllVC) on 910B servers of two or more NPUs each.

On a partition of the ranks into M groups (servers) of G, rank (n, l) reaches the other servers
through the same-index NPU of each: in inter step k = 1 .. M-1 it sends (n+k, l) its blocks for
every member of server n+k in one RDMA message and receives from (n-k, l) that rank's blocks for
every member of its own server. Each block passes three stages, one step apart, so the stages of
consecutive inter steps overlap (the template's ``TaskState``s): a local copy from IN into the
CCL buffer, the RDMA transfer, and the distribution inside the server, where member (n, j) takes
from each member (n, i) the block that came from (n-k, i) for it, straight into OUT. Blocks for
the rank's own server go directly from IN to each member in the step of inter step 1 and are
copied into OUT the step after; the rank's own block is one local copy then.

The CCL buffer (200 MB, HCCL_BUFFSIZE's default) is cut into one block per rank (two per rank on
two servers, ping-pong), its size rounded down to 16 KB, less the N x N counts table; a pair's
data larger than a block moves in loops of a block each, the server's loop count the most any of
its members needs (``GetLocalLoopNum``), a loop's local copies starting as soon as the previous
loop's are done. Every step with an SDMA task (a distribution, the own-server send) begins with a
handshake with every member of the server (``DoSdmaSync``): here a step of its own before it,
one one-element message each way per member, so no member starts the step's transfers before
the whole server has finished the step before.

HCCL's AlltoAllV gathers no counts before this pipeline: each rank sends its receive counts to
the members of its server in the first step (``DoIntraInfoBroadcast``), which the first
handshake here carries (8 bytes a rank and a 4-byte flag); hccl-py's ``all_to_all_v`` still
gathers every rank's counts first (it needs the whole matrix), without charging modeled time.

Steps: (M-1) x max(loops, 1) + 2, each after its handshake step (every step has SDMA work). Sent per rank: its blocks to other servers twice (RDMA, then by the
relay inside the destination server), its own server's once. TMP: the packed blocks of every
step and what arrives, ~2-3x the rank's data.
"""

from __future__ import annotations

from typing import Sequence

from ..errors import HcclMemoryError, HcclParamError
from ._common import finish
from .alltoall_staged import CONTINUOUS, TmpLayout, block_places, split_blocks
from .schedule import IN, OUT, Copy, Recv, Region, Schedule, Send, Step

Partition = tuple[tuple[int, ...], ...]
CCL_BUFFER_BYTES = 200 * 1024 * 1024  # HCCL_BUFFSIZE's default, 200 (MB): externalinput_pub.h L37
_ALIGN, _ALIGN_SMALL = 16384, 128  # HCCL_MIN_SLICE_ALIGN_910_93 / HCCL_MIN_SLICE_ALIGN (alg_template_base_pub.h)


def fits(size: int, servers: int, buffer_bytes: int = CCL_BUFFER_BYTES) -> bool:
    """Whether the CCL buffer holds the size x size table of 8-byte counts and a 128-byte block
    per rank (two on two servers); HCCL's ``SplitBuffer`` fails the call with HCCL_E_MEMORY
    otherwise (with 200 MB: from 5,120 ranks)."""
    blocks = size * (2 if servers == 2 else 1)
    return buffer_bytes >= 8 * size * size + _ALIGN_SMALL * blocks


def block_elements(size: int, servers: int, itemsize: int, buffer_bytes: int = CCL_BUFFER_BYTES) -> int:
    """Elements per block of the CCL buffer (``SplitBuffer``): one block per rank, two on two
    servers (ping-pong), after the size x size table of 8-byte counts, rounded down to 16 KB
    (128 B when the buffer is too small for that); HcclMemoryError where it does not fit
    (:func:`fits`)."""
    blocks = size * (2 if servers == 2 else 1)
    table = 8 * size * size
    if not fits(size, servers, buffer_bytes):
        raise HcclMemoryError(
            f"HCCL's continuous pipeline (AlltoAllV) cannot split its {buffer_bytes}-byte CCL buffer "
            f"for {size} ranks: it needs {table + _ALIGN_SMALL * blocks} bytes (the {size} x {size} "
            "counts table and 128 bytes a block); HCCL fails this call with HCCL_E_MEMORY "
            "(alltoallv_continuous_pipeline.cc SplitBuffer). Run it as all_to_all_vc, or name "
            "algo='hier:mesh/pairwise@groups'",
            collective="alltoallv",
            ranks=size,
            expected=table + _ALIGN_SMALL * blocks,
            value=buffer_bytes,
        )
    align = _ALIGN if buffer_bytes > table + _ALIGN * blocks else _ALIGN_SMALL
    return max(1, (buffer_bytes - table) // blocks // align * align // itemsize)


def iterations(steps_per_loop: int, loops: int) -> list[dict]:
    """The template's ``RunAsync`` state machine (one RDMA step at a time): per step, which loop
    and inter step (1-based) each stage works on (``copy``, ``inter``, ``intra``: (loop, k) or
    None), ``l0_write`` / ``l0_copy`` (the loop whose own-server blocks are sent / copied out, or
    None), ``self_copy`` and ``sdma`` (a handshake with every member of the server)."""
    copy, inter, intra = [0, 1, 0], [0, 0, 0], [0, 0, 0]  # [step, next, loop]
    repeat, broadcast, out = 0, True, []
    s = steps_per_loop
    while copy[0] < s or inter[0] < s or intra[0] < s:
        l0_write = inter[1] != 0 and inter[0] == 0
        l0_copy = intra[1] != 0 and intra[0] == 0
        do_intra, do_inter = intra[0] < intra[1], inter[0] < inter[1]
        step = {
            "sdma": do_intra or l0_write or broadcast,
            "l0_write": inter[2] if l0_write else None,
            "self_copy": l0_write and inter[2] == 0,
            "l0_copy": intra[2] if l0_copy else None,
        }
        if inter[2] == 0 and do_inter:
            repeat = loops - 1 if loops > 0 else 0
            if copy[0] == s and copy[2] < repeat:
                copy = [0, 1, copy[2] + 1]
        step["intra"] = (intra[2], intra[0] + 1) if do_intra else None
        step["inter"] = (inter[2], inter[0] + 1) if do_inter else None
        step["copy"] = (copy[2], copy[0] + 1) if copy[0] < copy[1] else None
        broadcast = False
        out.append(step)
        intra[0], inter[0], copy[0] = intra[1], inter[1], copy[1]
        intra[1], inter[1], copy[1] = inter[1], copy[1], min(copy[1] + 1, s)
        if intra[0] == s and intra[2] < inter[2]:
            intra = [0, 1, intra[2] + 1]
        if inter[0] == s and inter[2] < copy[2]:
            inter = [0, 1, inter[2] + 1]
        if copy[0] == s and copy[2] < repeat:
            copy = [0, 1, copy[2] + 1]
    return out


def schedule_v(
    rank: int,
    counts: Sequence[Sequence[int]],
    send_displs: Sequence[int],
    recv_displs: Sequence[int],
    partition: Partition,
    itemsize: int,
    buffer_bytes: int = CCL_BUFFER_BYTES,
) -> Schedule:
    """Rank ``rank``'s continuous-pipeline AlltoAllV of ``counts[i][j]`` elements of ``itemsize``
    bytes from i to j on ``partition`` (groups of one size, at least 2 of at least 2), with a CCL
    buffer of ``buffer_bytes``."""
    n, l = block_places(partition, "mesh", CONTINUOUS)[rank]
    servers, g = len(partition), len(partition[0])
    if servers < 2 or g < 2:
        raise HcclParamError(
            f"HCCL's continuous pipeline needs at least 2 servers of at least 2 NPUs, not {servers} of {g}",
            collective="alltoallv",
            arg="partition",
            value=[servers, g],
            rule="range",
        )
    size = servers * g
    at = lambda h, t: partition[h % servers][t % g]  # noqa: E731 - member t of group h, round the ring
    block = block_elements(size, servers, itemsize, buffer_bytes)

    def loops_of(r: int) -> int:  # GetLocalLoopNum: the most this rank moves to or from one other rank
        most = max(max(counts[r][j], counts[j][r]) for j in range(size) if j != r)
        return -(-most // block)

    loops = max(loops_of(r) for r in partition[n])  # the server's: WaitAndCalReceiveInfo's intraLoopNum_

    def piece(src: int, dst: int, loop: int) -> tuple[int, int]:  # (offset, count) of one loop's share
        start = loop * block
        return start, max(0, min(block, counts[src][dst] - start))

    def from_in(dst: int, loop: int) -> Region:
        offset, n_ = piece(rank, dst, loop)
        return Region(IN, send_displs[dst] + offset, n_)

    def into_out(src: int, loop: int) -> Region:
        offset, n_ = piece(src, rank, loop)
        return Region(OUT, recv_displs[src] + offset, n_)

    tmp = TmpLayout()
    mates = [at(n, l + i) for i in range(1, g)]
    sync_out = tmp.take(1)
    sync_in = {m: tmp.take(1) for m in mates}
    # the first handshake carries the rank's receive counts and a flag to every member
    # (DoIntraInfoBroadcast: N 8-byte counts and 4 bytes), which HCCL's AlltoAllV exchanges instead
    # of gathering every rank's counts first
    info = -(-(8 * size + 4) // itemsize)
    info_out = tmp.take(info)
    info_in = {m: tmp.take(info) for m in mates}
    handshake = Step(sends=tuple(Send(m, sync_out) for m in mates), recvs=tuple(Recv(m, sync_in[m]) for m in mates))
    staged: dict[tuple[int, int], Region] = {}  # (loop, k): my packed blocks for server n+k
    arrived: dict[tuple[int, int], list[Region]] = {}  # (loop, k): from (n-k, l), by member of my server
    own_server: dict[int, dict[int, Region]] = {}  # loop: what each member sent me, to copy out
    steps = []
    for it in iterations(servers - 1, loops):  # with one RDMA step at a time, every step has SDMA work
        copies, sends, recvs = [], [], []
        to_mates = {m: [] for m in mates}
        from_mates = {m: [] for m in mates}
        if it["sdma"]:  # the handshake first, a step of its own: a one-element flow must not share a link with data
            steps.append(
                handshake
                if steps
                else Step(
                    sends=tuple(Send(m, info_out) for m in mates), recvs=tuple(Recv(m, info_in[m]) for m in mates)
                )
            )
        if it["self_copy"]:
            copies.append(
                Copy(
                    Region(IN, send_displs[rank], counts[rank][rank]),
                    Region(OUT, recv_displs[rank], counts[rank][rank]),
                )
            )
        if it["l0_copy"] is not None:
            loop = it["l0_copy"]
            copies += [Copy(area, into_out(m, loop)) for m, area in own_server.pop(loop).items()]
        if it["intra"] is not None:
            loop, k = it["intra"]
            parts = arrived.pop((loop, k))
            copies.append(Copy(parts[l], into_out(at(n - k, l), loop)))
            for i, m in enumerate(mates, 1):
                to_mates[m].append(parts[(l + i) % g])
                from_mates[m].append(into_out(at(n - k, l + i), loop))
        if it["l0_write"] is not None:
            loop = it["l0_write"]
            own_server[loop] = {}
            for m in mates:
                to_mates[m].append(from_in(m, loop))
                area = tmp.take(piece(m, rank, loop)[1])
                from_mates[m].append(area)
                own_server[loop][m] = area
        if it["inter"] is not None:
            loop, k = it["inter"]
            sends.append(Send(at(n + k, l), staged.pop((loop, k))))
            src = at(n - k, l)
            sizes = [piece(src, at(n, t), loop)[1] for t in range(g)]
            area = tmp.take(sum(sizes))
            recvs.append(Recv(src, area))
            arrived[(loop, k)] = split_blocks(area, sizes)
        if it["copy"] is not None:
            loop, k = it["copy"]
            staged[(loop, k)] = tmp.pack([from_in(at(n + k, t), loop) for t in range(g)], copies)
        for m in mates:
            sends += [Send(m, r) for r in to_mates[m]]
            recvs += [Recv(m, r) for r in from_mates[m]]
        steps.append(Step(tuple(copies), tuple(sends), tuple(recvs)))
    return finish(steps, aligned=True)
