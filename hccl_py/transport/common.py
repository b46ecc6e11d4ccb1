"""Pieces every transport shares: slice sizes cut from ``HCCL_BUFFSIZE``, the inline limit of the
TCP and MPI transports, and the liveness check of a peer process on this host."""

from __future__ import annotations

# Up to this, a slice rides inline in its frame or message and needs no credit (tcp, mpi). The shm
# transport inlines more, up to ``shm.SHM_INLINE_MAX_BYTES`` (64 KiB) in the datagram; below this
# size it joins header and payload into one buffer, above it the kernel gathers them (sendmsg).
INLINE_MAX_BYTES = 16 * 1024
MAX_SLICE_BYTES = 4 * 1024 * 1024  # larger slices amortise the per-slice cost; smaller ones pipeline
MIN_SLICE_BYTES = 64 * 1024


def slice_layout(world_size: int, buffsize_bytes: int) -> tuple[int, int]:
    """(slots or credits per peer, bytes per slice) from ``HCCL_BUFFSIZE``: a sender parks at most
    that many slices at one receiver (shm: its slots; tcp and mpi: credits, taken by slices larger
    than ``INLINE_MAX_BYTES``)."""
    per_peer = max(buffsize_bytes // max(world_size - 1, 1), 2 * MIN_SLICE_BYTES)
    slots = max(2, min(8, per_peer // MAX_SLICE_BYTES))
    slice_bytes = max(MIN_SLICE_BYTES, (per_peer // slots) // 4096 * 4096)
    return slots, min(slice_bytes, MAX_SLICE_BYTES)


def process_exit_code(pid: int) -> int | None:
    """The exit code of process ``pid`` while it is a zombie (its parent has not reaped it yet):
    the code it exited with, or minus the signal that killed it; None once it is gone or alive."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    if len(fields) < 50 or fields[0] != b"Z":  # fields[49] is stat's field 52, exit_code (waitpid's status)
        return None
    status = int(fields[49])
    return -(status & 0x7F) if status & 0x7F else status >> 8


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` (on this host) exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in (b"Z", b"X")
