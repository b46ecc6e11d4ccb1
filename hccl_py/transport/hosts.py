"""Shared memory within a host, TCP across hosts: one transport over both.

The shared-memory transport numbers only the ranks of its host (0..k-1 in world-rank order)
and knows nothing of the others; this wrapper translates world ranks to those local numbers on
the way in (peer, and the ``src`` field of the header the executor builds) and back on the
way out (``Incoming.src``), and sends everything else over TCP::

    HostSplitTransport(shm, tcp, local=(4, 5, 6, 7), world_rank=5, world_size=8)
"""

from __future__ import annotations

import time

import numpy as np

from .base import Incoming, SliceHeader

WAIT_SLICE_S = 0.001  # while idle, look at the TCP side at least this often


class HostSplitTransport:
    """One :class:`~.base.Transport` over two: ``shm`` for the ranks of this host (``local``, in
    world-rank order), ``tcp`` for the rest; ranks are world ranks on both sides of it."""

    def __init__(self, shm, tcp, local: tuple[int, ...], world_rank: int, world_size: int):
        self.shm = shm
        self.tcp = tcp
        self.world_rank = world_rank
        self.world_size = world_size
        self._local = tuple(local)  # local number -> world rank
        self._to_local = {r: i for i, r in enumerate(local)}
        self._me = self._to_local[world_rank]
        shm.world_of = self._local

    def max_slice_bytes(self, peer: int) -> int:
        local = self._to_local.get(peer)
        return self.tcp.max_slice_bytes(peer) if local is None else self.shm.max_slice_bytes(local)

    def try_send(self, peer: int, header: SliceHeader, data: np.ndarray) -> bool:
        local = self._to_local.get(peer)
        if local is None:
            return self.tcp.try_send(peer, header, data)
        return self.shm.try_send(local, header._replace(src=self._me), data)

    def notify(self, peer: int, comm_id: int, seq: int, body: bytes) -> None:
        local = self._to_local.get(peer)
        if local is None:
            self.tcp.notify(peer, comm_id, seq, body)
        else:
            self.shm.notify(local, comm_id, seq, body)

    def release(self, incoming: Incoming) -> None:
        local = self._to_local.get(incoming.src)
        if local is None:
            self.tcp.release(incoming)
        else:
            incoming.src = local  # as the shm transport handed it out
            self.shm.release(incoming)

    def flush(self) -> bool:
        shm_done = self.shm.flush()
        return self.tcp.flush() and shm_done

    def backlog(self) -> list[int]:
        return sorted([self._local[p] for p in self.shm.backlog()] + self.tcp.backlog())

    def progress(self, timeout_s: float) -> list[Incoming]:
        got = self._both(0.0)
        if got or timeout_s <= 0:
            return got
        end = time.monotonic() + timeout_s
        while True:
            remaining = end - time.monotonic()
            if remaining <= 0:
                return got
            got = self._both(min(remaining, WAIT_SLICE_S))
            if got:
                return got

    def _both(self, shm_wait_s: float) -> list[Incoming]:
        got = self.shm.progress(shm_wait_s)
        for inc in got:
            inc.src = self._local[inc.src]
        got.extend(self.tcp.progress(0.0))
        return got

    def peer_pid(self, peer: int) -> int | None:
        local = self._to_local.get(peer)
        return self.tcp.peer_pid(peer) if local is None else self.shm.peer_pid(local)

    def peer_alive(self, peer: int) -> bool:
        local = self._to_local.get(peer)
        return self.tcp.peer_alive(peer) if local is None else self.shm.peer_alive(local)

    def close(self) -> None:
        try:
            self.shm.close()
        finally:
            self.tcp.close()
