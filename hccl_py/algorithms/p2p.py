"""Point-to-point as one-step schedules, so send/recv run through the same executor (matching,
deadlines, mismatch checks, modeled clock) as the collectives."""

from __future__ import annotations

from functools import lru_cache

from .schedule import IN, OUT, Recv, Region, Schedule, Send, Step


@lru_cache(maxsize=256)
def send_schedule(count: int, dst: int) -> Schedule:
    """One step sending the ``count`` elements of IN to rank ``dst``."""
    return Schedule((Step(sends=(Send(dst, Region(IN, 0, count)),)),))


@lru_cache(maxsize=256)
def recv_schedule(count: int, src: int) -> Schedule:
    """One step receiving ``count`` elements from rank ``src`` into OUT."""
    return Schedule((Step(recvs=(Recv(src, Region(OUT, 0, count)),)),))
