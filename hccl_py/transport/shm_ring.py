"""Shared-memory mailboxes: the shm transport's messages without a system call.

Every ordered pair of ranks on a host gets a single-producer single-consumer byte ring. The
sender's ring for a receiver lies in the sender's own segment (which the receiver has mapped
read-only); the receiver says how far it has read in a counter in *its* segment (which the
sender has mapped). A message is the same bytes a datagram would carry, framed by its length::

    control page: u64 sleeping | u64 head[world_size] | u64 tail[world_size]
    then one ring of RING_BYTES per peer, in the order of the peers

``head[w]``: bytes this rank has written into its ring for rank ``w``; ``tail[w]``: bytes it has
read from ``w``'s ring for it. The sender stores the message, then the head; the receiver loads
the head, then the message, and stores the tail once it has copied the message out. x86 keeps
stores in order and loads in order, and every counter is one aligned 8-byte access (numpy
scalar stores and loads), so a receiver never sees a head ahead of its message.

A receiver about to sleep sets ``sleeping``, then looks at its rings once more; a sender that has
stored a message looks at the receiver's ``sleeping`` and, if set, rings the doorbell (a
one-byte datagram on the receiver's socket). Each side's store must be visible before its load
(a store-load fence), which Python cannot ask for directly: an uncontended lock is taken and
released instead (a locked instruction on x86, a full fence). In case a fence were ever missed,
a sleeping rank still wakes every ``MAX_SLEEP_S`` to look.

Only on x86-64 (elsewhere loads and stores may pass each other without explicit barriers); the
transport falls back to datagrams there, with ``HCCL_PY_SHM_RING=0``, and for a pair of ranks
of which one has no rings.
"""

from __future__ import annotations

import mmap
import platform
import struct
import threading

import numpy as np

RING_BYTES = 256 * 1024  # per ordered pair; holds several of the largest inline messages (64 KiB)
MAX_SLEEP_S = 0.02  # a sleeping rank looks at its rings at least this often
_WRAP = 0xFFFFFFFFFFFFFFFF  # length word: the rest of the ring is unused, continue at its start
_LEN = struct.Struct("<Q")
_FENCE = threading.Lock()


def supported() -> bool:
    """Whether this machine keeps the order the rings rely on (x86-64)."""
    return platform.machine().lower() in ("x86_64", "amd64")


def _fence() -> None:
    _FENCE.acquire()
    _FENCE.release()


def control_bytes(world_size: int) -> int:
    need = 8 * (1 + 2 * world_size)
    return -(-need // mmap.PAGESIZE) * mmap.PAGESIZE


def area_bytes(world_size: int) -> int:
    """Bytes of a rank's segment the rings take (control page and one ring per peer)."""
    return control_bytes(world_size) + (world_size - 1) * RING_BYTES


def _index_among_peers(rank: int, of: int) -> int:
    """Where ``rank`` sits in the peer list of rank ``of`` (every rank but ``of``, ascending)."""
    return rank if rank < of else rank - 1


class Rings:
    """This rank's rings (in ``segment`` from byte ``base``) and the peers' rings for it."""

    def __init__(self, segment: mmap.mmap, base: int, world_rank: int, world_size: int):
        self.world_rank = world_rank
        self.world_size = world_size
        self._mv = memoryview(segment)
        control = np.frombuffer(segment, np.uint64, count=1 + 2 * world_size, offset=base)
        self._sleeping = control[0:1]
        self._heads = control[1 : 1 + world_size]
        self._tails = control[1 + world_size :]
        self._ring_base = base + control_bytes(world_size)
        self._head: dict[int, int] = {}  # peer -> bytes written into our ring for it (mirror of _heads)
        self._tail: dict[int, int] = {}  # peer -> bytes read from its ring for us (mirror of _tails)
        self._peer_mv: dict[int, memoryview] = {}
        self._peer_control: dict[int, np.ndarray] = {}
        self._peer_ring_at: dict[int, int] = {}
        self._my_ring_at: dict[int, int] = {}
        self.peers: list[int] = []  # peers whose rings are attached, ascending

    def attach(self, peer: int, peer_segment: mmap.mmap, peer_base: int) -> None:
        """Use the rings with ``peer``, whose segment (mapped here) has its rings at ``peer_base``."""
        self._peer_mv[peer] = memoryview(peer_segment)
        self._peer_control[peer] = np.frombuffer(peer_segment, np.uint64, count=1 + 2 * self.world_size, offset=peer_base)
        self._peer_ring_at[peer] = peer_base + control_bytes(self.world_size) + \
            _index_among_peers(self.world_rank, peer) * RING_BYTES
        self._my_ring_at[peer] = self._ring_base + _index_among_peers(peer, self.world_rank) * RING_BYTES
        self._head[peer] = 0
        self._tail[peer] = 0
        self.peers = sorted(self._peer_mv)

    # -- sending -----------------------------------------------------------------------------
    def write(self, peer: int, message: bytes, payload: np.ndarray | None = None) -> bool:
        """Store ``message`` (and then ``payload``'s bytes, a uint8 view) as one message for
        ``peer``; False when its ring has no room for it now."""
        length = len(message) + (0 if payload is None else payload.nbytes)
        need = 8 + ((length + 7) & ~7)
        head = self._head[peer]
        pos = head % RING_BYTES
        skip = RING_BYTES - pos if RING_BYTES - pos < need else 0
        # How far the peer has read: its tail for us, in its segment.
        if head + skip + need - int(self._peer_control[peer][1 + self.world_size + self.world_rank]) > RING_BYTES:
            return False
        at = self._my_ring_at[peer]
        mv = self._mv
        if skip:
            _LEN.pack_into(mv, at + pos, _WRAP)
            head += skip
            pos = 0
        start = at + pos + 8
        _LEN.pack_into(mv, start - 8, length)
        mv[start : start + len(message)] = message
        if payload is not None:
            mv[start + len(message) : start + length] = payload
        head += need
        self._head[peer] = head
        self._heads[peer] = head  # published last: the message is complete before the peer can see it
        return True

    def peer_sleeping(self, peer: int) -> bool:
        """After writing: whether ``peer`` may be asleep and needs its doorbell rung."""
        _fence()
        return bool(self._peer_control[peer][0])

    # -- receiving ---------------------------------------------------------------------------
    def read(self, deliver, into: list) -> int:
        """Hand every message waiting in the peers' rings to ``deliver(bytes, into)``, oldest
        first per peer; how many there were."""
        me = 1 + self.world_rank
        n = 0
        for peer in self.peers:
            tail = self._tail[peer]
            head = int(self._peer_control[peer][me])
            if head == tail:
                continue
            mv = self._peer_mv[peer]
            at = self._peer_ring_at[peer]
            while tail != head:
                pos = tail % RING_BYTES
                length = _LEN.unpack_from(mv, at + pos)[0]
                if length == _WRAP:
                    tail += RING_BYTES - pos
                    continue
                data = bytes(mv[at + pos + 8 : at + pos + 8 + length])
                tail += 8 + ((length + 7) & ~7)
                n += 1
                deliver(data, into)
            self._tail[peer] = tail
            self._tails[peer] = tail  # after the copies: the peer may overwrite what we have read
        return n

    def waiting(self) -> bool:
        """Whether any peer's ring holds a message for us (no copying)."""
        me = 1 + self.world_rank
        return any(int(self._peer_control[p][me]) != self._tail[p] for p in self.peers)

    def set_sleeping(self, sleeping: bool) -> None:
        self._sleeping[0] = 1 if sleeping else 0
        if sleeping:
            _fence()  # the flag is visible before we look at the rings one last time

    def close(self) -> None:
        """Drop the views into the segments (so the mappings can be closed)."""
        for view in self._peer_mv.values():
            view.release()
        self._peer_mv.clear()
        self._peer_control.clear()
        self._mv.release()
        self._sleeping = self._heads = self._tails = None  # type: ignore[assignment]
        self.peers = []
