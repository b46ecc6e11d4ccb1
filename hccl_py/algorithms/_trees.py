"""Binomial trees over ranks ``0 .. n-1`` rooted at 0 (use ``relative`` ranks for other roots).

The parent of v is v with its lowest set bit cleared; the subtree of v is the contiguous range
``[v, v + lowbit(v))`` (clipped to n), which is why gathers and scatters along the tree move
one contiguous region per message.
"""

from __future__ import annotations


def lowbit(v: int, n: int) -> int:
    """Lowest set bit of v; for the root (v = 0) the smallest power of two >= n."""
    if v:
        return v & -v
    return 1 << max(n - 1, 0).bit_length()


def parent(v: int) -> int:
    """Parent of v != 0."""
    return v & (v - 1)


def children(v: int, n: int) -> list[int]:
    """Children of v, nearest (smallest subtree) first: v+1, v+2, v+4, ... below lowbit(v)."""
    out = []
    mask = 1
    while mask < lowbit(v, n) and v + mask < n:
        out.append(v + mask)
        mask <<= 1
    return out


def subtree(v: int, n: int) -> tuple[int, int]:
    """Half-open range of the ranks in v's subtree."""
    return v, min(v + lowbit(v, n), n)
