"""Pieces the MPI and TCP transports share (the shm transport keeps its own)."""

from __future__ import annotations

INLINE_MAX_BYTES = 16 * 1024  # up to this, a slice needs no credit (as shm sends it inline)
MAX_SLICE_BYTES = 4 * 1024 * 1024
MIN_SLICE_BYTES = 64 * 1024


def slice_layout(world_size: int, buffsize_bytes: int) -> tuple[int, int]:
    """(credits per peer, bytes per slice) from ``HCCL_BUFFSIZE``, cut as the shm slots are: a
    sender parks at most ``credits`` slices larger than ``INLINE_MAX_BYTES`` at one receiver."""
    per_peer = max(buffsize_bytes // max(world_size - 1, 1), 2 * MIN_SLICE_BYTES)
    slots = max(2, min(8, per_peer // MAX_SLICE_BYTES))
    slice_bytes = max(MIN_SLICE_BYTES, (per_peer // slots) // 4096 * 4096)
    return slots, min(slice_bytes, MAX_SLICE_BYTES)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` (on this host) exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in (b"Z", b"X")
