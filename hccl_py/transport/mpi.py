"""MPI transport: ranks started by ``mpiexec`` or ``srun`` move slices with mpi4py.

Framing: one MPI message per slice, on a communicator duplicated from ``MPI_COMM_WORLD`` (so
hccl-py's traffic never matches the application's own receives) with one tag: a ``SliceHeader`` in
the first ``PREFIX`` bytes, the payload after it (``PREFIX`` keeps the payload 64-byte aligned).
``try_send`` copies the slice into a fresh buffer and posts ``Isend`` from it (the caller may
reuse its array at once). The receiver does not know sizes in advance: it asks MPI for matched
messages (``Improbe``, any source), allocates exactly the bytes the status reports and posts
``Imrecv`` for that message (a matched receive: nothing else can take it). MPI keeps messages
of one sender, communicator and tag in order, and slices are handed to the executor in that
order per sender, which its FIFO matching needs.

Waiting: MPI has no wait with a deadline, so nothing here blocks inside MPI. ``progress``
tests sends and receives, spins briefly (yielding the CPU each turn when ranks outnumber
cores), then naps in growing steps of up to 250 us until its timeout. HCCL_EXEC_TIMEOUT and the
executor's liveness checks therefore hold exactly as with shared memory.

Flow control mirrors the shared-memory slots: a slice larger than ``INLINE_MAX_BYTES`` takes one
of the ``slots`` credits the sender holds for that peer, and the receiver returns credits
(``KIND_ACK``) when the executor releases the slice; so a sender far ahead of its receiver
parks at most ``HCCL_BUFFSIZE`` worth of slices there.

Liveness: MPI launchers end the whole job when a rank dies; ``peer_alive`` also looks at the
pid of peers on this host, so a dead neighbour is noticed within a second as with shm.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque

import numpy as np

from ..errors import HcclNotSupportedError, HcclRemoteError, HcclTimeoutError
from .base import HEADER_BYTES, KIND_ACK, KIND_INLINE, KIND_NOTICE, Incoming, SliceHeader
from .common import INLINE_MAX_BYTES, process_alive, slice_layout

PREFIX = 128  # header bytes reserved at the front of each message; the payload starts aligned
assert PREFIX >= HEADER_BYTES
# MPI offers no wait with a deadline: a waiting rank polls, spinning this long before it naps,
# and naps at most this long (the most a wake-up can be late; ~4000 polls/s while idle).
MIN_SPIN_S = 200e-6
MAX_NAP_S = 250e-6
TAG = 0x4843  # "HC"
_INFO_BYTES = 256


def import_mpi():
    """``mpi4py.MPI`` (initialises MPI), or :class:`HcclNotSupportedError` saying what to install."""
    try:
        from mpi4py import MPI
    except ImportError as err:
        raise HcclNotSupportedError(
            f"the MPI transport needs mpi4py, which cannot be imported here ({err}); "
            "install it with `pip install 'hccl-py[mpi]'` (mpi4py plus the mpich wheel and its mpiexec)",
            module="mpi4py",
        ) from None
    return MPI


def library_version(MPI) -> str:
    """``"MPICH 5.0.2"``, ``"Open MPI v4.1.5"``: the first words of MPI_Get_library_version."""
    first = MPI.Get_library_version().strip().splitlines()[0]
    first = first.split(",")[0]
    words = first.replace("Version:", "").split()
    return " ".join(words)


def wait_request(request, deadline: float, what: str) -> None:
    """Test ``request`` until it completes; HcclTimeoutError at ``deadline`` (never blocks in MPI)."""
    nap = 20e-6
    while not request.Test():
        now = time.monotonic()
        if now >= deadline:
            raise HcclTimeoutError(what)
        time.sleep(min(nap, deadline - now))
        nap = min(nap * 2, 1e-3)


class MpiTransport:
    """Slices as MPI messages on a private duplicate of ``MPI_COMM_WORLD``; see the module doc."""

    def __init__(self, MPI, comm, infos: list[dict], buffsize_bytes: int, *, spin_s: float, yield_when_spinning: bool):
        self.MPI = MPI
        self.comm = comm
        self.world_rank = comm.Get_rank()
        self.world_size = comm.Get_size()
        self.infos = infos
        self.spin_s = spin_s
        self.yield_when_spinning = yield_when_spinning
        self.slots, self.slice_bytes = slice_layout(self.world_size, buffsize_bytes)
        self._peers = [p for p in range(self.world_size) if p != self.world_rank]
        mine = infos[self.world_rank]["host_id"]
        self._local_pids = {p: infos[p]["pid"] for p in self._peers if infos[p]["host_id"] == mine}
        self._credits = {p: self.slots for p in self._peers}
        self._acks = {p: 0 for p in self._peers}
        self._sends: dict[int, list] = {p: [] for p in self._peers}  # [(request, buffer)]
        self._recvs: dict[int, deque] = {p: deque() for p in self._peers}  # [(request, buffer)] in match order
        self._receiving = 0  # posted receives not yet handed out
        # Buffers of large messages are reused: memory touched for the first time costs page
        # faults (~2 ms per MiB here), more than the copy itself.
        self._pool: dict[int, list[np.ndarray]] = {}
        self._status = MPI.Status()
        self._closed = False

    @classmethod
    def create(
        cls,
        buffsize_bytes: int,
        deadline: float,
        *,
        host_id: str,
        host_label: str,
        spin_s: float,
        yield_when_spinning: bool,
    ) -> "MpiTransport":
        """Join the MPI job: duplicate COMM_WORLD and exchange (pid, host) with every rank, both
        nonblocking and bounded by ``deadline`` (HCCL_CONNECT_TIMEOUT)."""
        MPI = import_mpi()
        world = MPI.COMM_WORLD
        comm, request = world.Idup()
        # Nonblocking, so a rank that never calls init() makes the others time out, not hang.
        wait_request(
            request,
            deadline,
            f"init: rank {world.Get_rank()} of the MPI job: not every rank of MPI_COMM_WORLD "
            f"({world.Get_size()} ranks) called hccl_py.init() within HCCL_CONNECT_TIMEOUT",
        )
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        mine = json.dumps({"pid": os.getpid(), "host_id": host_id, "host": host_label[:64]}).encode()
        send = np.zeros(_INFO_BYTES, np.uint8)
        send[: len(mine)] = np.frombuffer(mine, np.uint8)
        recv = np.zeros(_INFO_BYTES * comm.Get_size(), np.uint8)
        request = comm.Iallgather([send, MPI.BYTE], [recv, MPI.BYTE])
        wait_request(
            request,
            deadline,
            f"init: rank {comm.Get_rank()}: the MPI rendezvous did not finish within HCCL_CONNECT_TIMEOUT",
        )
        infos = [
            json.loads(bytes(recv[i * _INFO_BYTES : (i + 1) * _INFO_BYTES]).rstrip(b"\0"))
            for i in range(comm.Get_size())
        ]
        return cls(MPI, comm, infos, buffsize_bytes, spin_s=spin_s, yield_when_spinning=yield_when_spinning)

    # -- data path ---------------------------------------------------------------------------
    def max_slice_bytes(self, peer: int) -> int:
        return self.slice_bytes

    def try_send(self, peer: int, header: SliceHeader, data: np.ndarray) -> bool:
        nbytes = data.nbytes
        large = nbytes > INLINE_MAX_BYTES
        if large:
            if not self._credits[peer]:
                return False
            self._credits[peer] -= 1
        buf = self._buffer(PREFIX + nbytes)
        header._replace(kind=KIND_INLINE).pack_into(buf, 0)
        if nbytes:
            buf[PREFIX:] = data.reshape(-1).view(np.uint8)
        self._isend(peer, buf)
        return True

    def notify(self, peer: int, comm_id: int, seq: int, body: bytes) -> None:
        body = body[:INLINE_MAX_BYTES]
        buf = np.zeros(PREFIX + len(body), np.uint8)
        SliceHeader.control(KIND_NOTICE, self.world_rank, comm_id=comm_id, seq=seq, nelem=len(body)).pack_into(buf, 0)
        buf[PREFIX:] = np.frombuffer(body, np.uint8)
        try:
            self._isend(peer, buf)
        except HcclRemoteError:
            pass  # a notice to a rank that is gone has no one to tell

    def _isend(self, peer: int, buf: np.ndarray) -> None:
        try:
            request = self.comm.Isend([buf, self.MPI.BYTE], peer, TAG)
        except self.MPI.Exception as err:
            raise HcclRemoteError(
                f"rank {self.world_rank} cannot send to rank {peer} over MPI: {err.Get_error_string()}", peer=peer
            ) from None
        self._sends[peer].append((request, buf))

    def release(self, incoming: Incoming) -> None:
        if incoming.kind == KIND_INLINE and len(incoming.payload) > INLINE_MAX_BYTES:
            self._acks[incoming.src] += 1
            self._recycle(incoming.payload.obj)

    def _buffer(self, nbytes: int) -> np.ndarray:
        free = self._pool.get(nbytes)
        return free.pop() if free else np.empty(nbytes, np.uint8)

    def _recycle(self, buf) -> None:
        if isinstance(buf, np.ndarray) and buf.nbytes > PREFIX + INLINE_MAX_BYTES:
            free = self._pool.setdefault(buf.nbytes, [])
            if len(free) < 2 * self.slots:
                free.append(buf)

    def flush(self) -> bool:
        """Post pending credit returns. Always True: every send is posted to MPI as soon as it is
        made, and MPI delivers a posted send even if this rank then leaves (MPI_Finalize
        completes it). Waiting for completion here would make a large send wait until the
        receiver is inside a collective, where shared memory lets it go at once."""
        self._send_acks()
        self._test_sends()
        return True

    def backlog(self) -> list[int]:
        """Peers that have not yet taken sends of ours (MPI sends not complete)."""
        return [peer for peer, sends in self._sends.items() if sends]

    def progress(self, timeout_s: float) -> list[Incoming]:
        got: list[Incoming] = []
        if self._poll(got) or got or timeout_s <= 0:
            return got
        now = time.perf_counter()
        end = now + timeout_s
        spin_until = now + min(max(self.spin_s, MIN_SPIN_S), timeout_s)
        nap = 10e-6
        while True:
            if self.yield_when_spinning:
                os.sched_yield()
            if self._poll(got) or got:
                return got
            now = time.perf_counter()
            if now >= end:
                return got
            if now >= spin_until:
                time.sleep(min(nap, end - now))
                nap = min(nap * 1.5, MAX_NAP_S)

    def _poll(self, got: list[Incoming]) -> int:
        """Move everything that can move now; how many sends or receives completed."""
        self._send_acks()
        events = self._test_sends()
        comm, status, MPI = self.comm, self._status, self.MPI
        while True:  # match every message that has arrived and post its receive
            message = comm.Improbe(MPI.ANY_SOURCE, TAG, status)
            if message is None:
                break
            buf = self._buffer(status.Get_count(MPI.BYTE))
            self._recvs[status.Get_source()].append((message.Irecv([buf, MPI.BYTE]), buf))
            self._receiving += 1
        if self._receiving:
            for src, queue in self._recvs.items():
                while queue and queue[0][0].Test():
                    _, buf = queue.popleft()
                    self._receiving -= 1
                    events += 1
                    self._decode(buf, got)
        return events

    def _test_sends(self) -> int:
        done = 0
        for peer, sends in self._sends.items():
            if sends:
                left = []
                for send in sends:
                    if send[0].Test():
                        self._recycle(send[1])
                    else:
                        left.append(send)
                done += len(sends) - len(left)
                self._sends[peer] = left
        return done

    def _send_acks(self) -> None:
        for peer, count in self._acks.items():
            if count:
                self._acks[peer] = 0
                buf = np.zeros(PREFIX, np.uint8)
                SliceHeader.control(KIND_ACK, self.world_rank, nelem=count).pack_into(buf, 0)
                try:
                    self._isend(peer, buf)
                except HcclRemoteError:
                    pass  # a peer that has gone needs no credits back

    def _decode(self, buf: np.ndarray, got: list[Incoming]) -> None:
        header = SliceHeader.unpack_from(buf, 0)
        if header.kind == KIND_ACK:
            self._credits[header.src] += header.nelem
            return
        got.append(Incoming(header, memoryview(buf)[PREFIX:]))

    def peer_pid(self, peer: int) -> int | None:
        return self._local_pids.get(peer)

    def peer_alive(self, peer: int) -> bool:
        pid = self._local_pids.get(peer)
        return pid is None or process_alive(pid)

    def close(self) -> None:
        """Give sends in flight a moment to leave, then free the communicator."""
        if self._closed:
            return
        self._closed = True
        give_up = time.monotonic() + 1.0
        while any(self._sends.values()) and time.monotonic() < give_up:
            self._test_sends()
            time.sleep(1e-4)
        try:
            self.comm.Free()
        except self.MPI.Exception:
            pass
