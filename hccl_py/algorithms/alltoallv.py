"""All-to-all with counts per pair (HCCL's AlltoAllV and AlltoAllVC) as a schedule function.

``counts[i][j]`` is the number of elements rank i sends to rank j, the same matrix on every
rank (AlltoAllVC takes it so; AlltoAllV gathers it from every rank's send and receive counts
first, as HCCL does). A :class:`VSchedule` is called like a registry schedule,
``fn(rank, size, count, root)``, so the executor, the cost model, the simulator and the player
take it like any algorithm::

    fn = VSchedule("pairwise", ((1, 2), (3, 0)))
    fn(0, 2, 0).steps                   # rank 0 sends 2 elements to rank 1, receives 3
    VSchedule("mesh", counts, owner=rank, send_displs=sd, recv_displs=rd)   # with this rank's layout
    VSchedule("hier:mesh/pairwise", counts, staged=(((0, 1), (2, 3)), "mesh", "pairwise"))   # alltoall_staged.py

The blocks of ``owner`` sit at the displacements its caller gave; every other rank's are packed
(its displacements change no modeled cost, and this rank never touches its buffers). Equal
functions (same algorithm and matrix) compare equal whatever the displacements, so the cost
model computes a matrix's costs once.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Sequence

from . import alltoall_mesh, alltoall_pairwise, alltoall_staged, alltoallv_continuous
from ._common import packed_displacements
from .schedule import Schedule

_BUILDERS = {"pairwise": alltoall_pairwise.schedule_v, "mesh": alltoall_mesh.schedule_v}
Partition = tuple[tuple[int, ...], ...]
Staged = tuple[Partition, str, str]  # the staged all-to-all's (partition, inner, outer)


Matrix = tuple[tuple[int, ...], ...]


def as_matrix(counts: Sequence[Sequence[int]]) -> Matrix:
    """``counts`` as a tuple of tuples of ints."""
    return tuple(tuple(int(c) for c in row) for row in counts)


def skewed_counts(size: int, per_pair: int, skew: float = 0.0) -> Matrix:
    """A ``size`` x ``size`` counts matrix with the elements of a uniform all-to-all of ``per_pair``
    elements per pair, every rank's row spread over the receivers by Zipf's law: rank j gets a
    share ``∝ 1 / (j + 1) ** skew`` (MoE routing skew; 0 is uniform). Rows are rounded by largest
    remainder, so each still sums to ``size * per_pair``::

        skewed_counts(3, 4)          # ((4, 4, 4),) * 3
        skewed_counts(3, 4, 1.2)     # ((7, 3, 2),) * 3
    """
    if size < 1 or per_pair < 0 or not skew >= 0 or skew == float("inf"):
        raise ValueError(f"need size >= 1, per_pair >= 0 and a finite skew >= 0 (got {size}, {per_pair}, {skew})")
    total = size * per_pair
    weights = [1.0 / (j + 1) ** skew for j in range(size)]
    ideal = [total * w / sum(weights) for w in weights]
    row = [int(x) for x in ideal]
    for j in sorted(range(size), key=lambda j: (row[j] - ideal[j], j))[: total - sum(row)]:
        row[j] += 1
    return (tuple(row),) * size


def digest(counts: Matrix) -> int:
    """A 63-bit digest of the matrix: the ``count`` of the call's signature, so ranks that pass
    different matrices are a call mismatch."""
    return int.from_bytes(hashlib.blake2b(repr(counts).encode(), digest_size=8).digest(), "little") >> 1


class VSchedule:
    """The schedule function of one all-to-all with counts per pair (see the module doc)."""

    def __init__(
        self,
        algo: str,
        counts: Matrix,
        owner: int = -1,
        send_displs: Sequence[int] | None = None,
        recv_displs: Sequence[int] | None = None,
        staged: Staged | None = None,
        itemsize: int | None = None,
    ):
        if staged is None and algo not in _BUILDERS:
            raise KeyError(algo)
        if staged is not None:
            alltoall_staged.check_partition(*staged)
        self.algo = algo
        self.staged = staged  # (partition, inner, outer) of a two-level name: the staged all-to-all
        self.counts = counts
        self.owner = owner
        self.send_displs = tuple(send_displs) if send_displs is not None else None
        self.recv_displs = tuple(recv_displs) if recv_displs is not None else None
        # the element's bytes: HCCL's continuous pipeline cuts its buffer into blocks of bytes
        continuous = staged is not None and staged[2] == alltoall_staged.CONTINUOUS
        if continuous and itemsize is None:
            raise ValueError("VSchedule: the continuous pipeline needs itemsize")
        self.itemsize = itemsize if continuous else None
        self.__name__ = f"alltoallv_{algo}"

    def __call__(self, rank: int, size: int, count: int = 0, root: int = 0) -> Schedule:
        if rank == self.owner and self.send_displs is not None:
            return _schedule(
                self.algo, self.counts, rank, self.send_displs, self.recv_displs, self.staged, self.itemsize
            )
        return _schedule(
            self.algo,
            self.counts,
            rank,
            packed_displacements(self.counts[rank]),
            packed_displacements([row[rank] for row in self.counts]),
            self.staged,
            self.itemsize,
        )

    def buffer_counts(self, rank: int) -> tuple[int, int]:
        """(send, receive) elements rank ``rank``'s buffers need (packed, for ranks but the owner)."""
        sends, recvs = self.counts[rank], [row[rank] for row in self.counts]
        if rank == self.owner and self.send_displs is not None:
            return (
                max((d + n for d, n in zip(self.send_displs, sends)), default=0),
                max((d + n for d, n in zip(self.recv_displs, recvs)), default=0),
            )
        return sum(sends), sum(recvs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VSchedule) and (
            (self.algo, self.counts, self.staged, self.itemsize)
            == (other.algo, other.counts, other.staged, other.itemsize)
        )

    def __hash__(self) -> int:
        return hash((VSchedule, self.algo, self.counts, self.staged, self.itemsize))

    def __repr__(self) -> str:
        return f"VSchedule({self.algo!r}, {len(self.counts)} ranks)"


@lru_cache(maxsize=512)
def _schedule(
    algo: str,
    counts: Matrix,
    rank: int,
    send_displs: tuple[int, ...],
    recv_displs: tuple[int, ...],
    staged: Staged | None,
    itemsize: int | None,
) -> Schedule:
    if staged is not None and staged[2] == alltoall_staged.CONTINUOUS:
        return alltoallv_continuous.schedule_v(rank, counts, send_displs, recv_displs, staged[0], itemsize)
    if staged is not None:
        return alltoall_staged.schedule_v(rank, counts, send_displs, recv_displs, *staged)
    return _BUILDERS[algo](rank, counts, send_displs, recv_displs)
