"""Power-of-two folding and the recursive halving / doubling exchanges built on it.

A group of ``size`` ranks that is not a power of two is folded onto p = the largest power of two
<= size, as in MPICH's Rabenseifner allreduce: with e = size - p, each *odd* rank below 2e is an
*extra* that hands its data to the even rank just below it (its *proxy*) and waits; the other p
ranks are renumbered 0 .. p-1 (*newranks*), run the power-of-two algorithm and finally the
proxies hand the result back. Odd extras (rather than MPICH's even ones) keep rank 0, the root
of rooted collectives in relative numbering, a proxy.

Newrank v stands for the ranks ``first(v) .. first(v+1)-1``: (proxy, extra) for v < e, itself
otherwise. Consecutive newranks cover consecutive ranks, so any range of newranks covers one
contiguous range of ranks, and of per-rank blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

Range = tuple[int, int]  # half-open range of newranks


@dataclass(frozen=True)
class Fold:
    """The folding of ``size`` ranks onto ``p`` newranks, p the largest power of two <= size
    (see the module docstring)."""

    size: int

    @property
    def p(self) -> int:
        """The largest power of two <= size: the number of newranks."""
        return 1 << (self.size.bit_length() - 1)

    @property
    def e(self) -> int:
        """The number of extras, size - p."""
        return self.size - self.p

    def is_extra(self, u: int) -> bool:
        """Whether rank u is an extra (odd and below 2e), which hands its data to proxy u-1."""
        return u < 2 * self.e and u % 2 == 1

    def extra_of(self, u: int) -> int | None:
        """The extra folded onto proxy u, or None."""
        return u + 1 if u < 2 * self.e and u % 2 == 0 else None

    def newrank(self, u: int) -> int:
        """Newrank of a non-extra rank u."""
        return u // 2 if u < 2 * self.e else u - self.e

    def first(self, v: int) -> int:
        """The rank that plays newrank v (v = p gives size, closing the last range)."""
        return 2 * v if v < self.e else v + self.e

    def group_bounds(self, count: int) -> list[tuple[int, int]]:
        """Per newrank, (offset, count) of the per-rank blocks of ``count`` elements it stands for."""
        return [(self.first(v) * count, (self.first(v + 1) - self.first(v)) * count) for v in range(self.p)]


def halving(v: int, p: int) -> list[tuple[int, Range, Range]]:
    """Recursive halving among p newranks: per step (partner, sent, kept).

    The range held starts as all of [0, p); in each step, with distance p/2, p/4, ..., 1, it is
    split in two, the half not containing v goes to the partner v ^ distance and the partner's
    copy of the half kept is received (and reduced). v ends with [v, v+1).
    """
    out = []
    lo, hi = 0, p
    dist = p // 2
    while dist:
        mid = lo + dist
        sent, kept = ((mid, hi), (lo, mid)) if v < mid else ((lo, mid), (mid, hi))
        out.append((v ^ dist, sent, kept))
        lo, hi = kept
        dist //= 2
    return out


def doubling(v: int, p: int) -> list[tuple[int, Range, Range]]:
    """Recursive doubling among p newranks: per step (partner, mine, theirs).

    With distance 1, 2, ..., p/2, v swaps the aligned range it holds ([v, v+1) at the start)
    with partner v ^ distance, doubling it; v ends with [0, p).
    """
    out = []
    dist = 1
    while dist < p:
        w = v ^ dist
        mine = (v - v % dist, v - v % dist + dist)
        theirs = (w - w % dist, w - w % dist + dist)
        out.append((w, mine, theirs))
        dist *= 2
    return out
