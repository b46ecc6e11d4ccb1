"""Shared-memory transport for ranks on one host.

Each rank owns one shared segment (a memfd: it has no name, so nothing can leak into
/dev/shm, and the kernel frees it when the last rank holding it exits) cut into per-peer slots.
Large slices are copied once into a slot; the receiver reduces or copies straight out of the
mapped slot into its destination and then acknowledges the slot. Slices up to 64 KiB travel
inline, in the datagram (no slot, no ack).

Control and doorbell: one unix datagram socket per rank, a file in the job's 0700 directory
(``rundir.py``), so only this user's processes can reach it; the rank removes it on close. A
datagram wakes the receiver in a few microseconds; before blocking, a waiting rank spins
briefly, since a blocking wake-up costs ~20 us here while a spin costs ~3 us. When ranks
outnumber cores the spin yields the CPU each turn so peers are not starved.

Every datagram is checked before it is used: a header too short, an unknown kind or sender, a
payload whose length does not match its header, a slot outside the sender's segment, an ack for
a slot that was not lent: each raises :class:`HcclRemoteError` naming the sender (``peer``:
its rank, or ``None`` when the header does not say) instead of corrupting a result.
"""

from __future__ import annotations

import array
import mmap
import os
import select
import socket
import struct
import time
from collections import deque

import numpy as np

from .. import rundir
from ..errors import HcclRemoteError, HcclTimeoutError
from . import cma
from .base import (
    HEADER_BYTES,
    KIND_ACK,
    KIND_CAPS,
    KIND_FIN,
    KIND_HELLO,
    KIND_INLINE,
    KIND_NOTICE,
    KIND_RNDV,
    KIND_SLOT,
    KIND_WAKE,
    Incoming,
    SliceHeader,
    plain_inline_slice,
    sender_of,
)
from .common import INLINE_MAX_BYTES, process_alive, slice_layout

# From this size the receiver reads the sender's buffer directly (one copy instead of two). Below
# it two copies through a slot are cheaper: process_vm_readv pins every page it reads, ~4x a
# memcpy of cache-hot data here (a 1 MiB broadcast to 3 ranks took 1.6x longer that way).
RNDV_MIN_BYTES = 2 * 1024 * 1024
_PROBE_MAGIC = 0x48434C4C50594D41  # what a peer reads to check it may read this process
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
# Up to this a slice rides in the datagram: the kernel's two copies cost no more than a slot's
# here, and an inline slice needs no ack (32 KiB allreduce: 15-20% faster than by slot at 2 and
# 4 ranks; from 256 KiB the slot is faster again). Keep _RECV_BYTES below 128 KiB: a larger
# receive buffer is an mmap per datagram (14 us instead of 2.4).
SHM_INLINE_MAX_BYTES = max(64 * 1024, INLINE_MAX_BYTES)
_RECV_BYTES = HEADER_BYTES + SHM_INLINE_MAX_BYTES + 8 * 4096
_unpack_header = SliceHeader.unpack_from
_unpack_fields = SliceHeader.unpack_fields


def socket_name(tag: str, rank: int, pid: int) -> str:
    """The file name of a rank's socket in its job's directory, e.g. ``g1.0.4242``: the
    generation (and host) tag, the rank, and its pid (no two live processes share a name)."""
    return f"{tag}.{rank}.{pid}"


def malformed(data: bytes, src: int | None, what: str, me: int) -> HcclRemoteError:
    """The error for a datagram that breaks the protocol: names the sender when the header is
    readable (``err.peer``), else "an unidentified sender" with the datagram's size."""
    who = f"rank {src}" if src is not None else f"an unidentified sender ({len(data)} bytes)"
    return HcclRemoteError(
        f"rank {me} received a malformed message from {who}: {what}; that process does not speak "
        "this hccl-py version's protocol (or is not one of this job's ranks)",
        peer=src,
        nbytes=len(data),
    )


_FD_SPACE = socket.CMSG_LEN(array.array("i").itemsize)  # room for the one descriptor a handshake passes


def _passed_fds(ancdata) -> list[int]:
    """The file descriptors an SCM_RIGHTS message passed (every one, so none leaks)."""
    fds = array.array("i")
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return list(fds)


class ShmTransport:
    """Shared-memory slots plus unix-datagram doorbells between the ranks of one host."""

    def __init__(
        self,
        job_id: str,
        world_rank: int,
        world_size: int,
        buffsize_bytes: int,
        *,
        spin_s: float,
        yield_when_spinning: bool,
        single_copy: bool = True,
        tag: str = "g1",
    ):
        self.job_id = job_id
        self.tag = tag  # generation (and host) of this communicator: part of every socket name
        self.world_rank = world_rank
        self.world_size = world_size
        # The job's rank of each rank this transport numbers 0..world_size-1 (they differ when it
        # serves only one host's ranks, under HostSplitTransport): for messages and error fields.
        self.world_of: tuple[int, ...] = tuple(range(world_size))
        self.spin_s = spin_s
        self.yield_when_spinning = yield_when_spinning
        self.slots_per_peer, self.slot_bytes = slice_layout(world_size, buffsize_bytes)
        self._peers = [p for p in range(world_size) if p != world_rank]
        self._peer_set = frozenset(self._peers)
        region = self.slots_per_peer * self.slot_bytes
        self._segment_bytes = max(region * len(self._peers), mmap.PAGESIZE)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
        try:
            self._path, self._inode = rundir.bind(self._sock, job_id, socket_name(tag, world_rank, os.getpid()))
        except BaseException:
            self._sock.close()
            raise
        # Blocking, with a receive timeout (SO_RCVTIMEO): a rank with nothing to do waits in one
        # receive rather than a poll and then a receive; every other read says MSG_DONTWAIT or
        # asks poll first.
        self._sock.setblocking(True)
        self._receive_timeout = -1.0  # what SO_RCVTIMEO is set to (seconds), -1: not set yet
        try:
            self._fd = os.memfd_create(f"hccl_py.{job_id}.{world_rank}", os.MFD_CLOEXEC)
            try:
                os.ftruncate(self._fd, self._segment_bytes)
                self._segment = mmap.mmap(self._fd, self._segment_bytes)
            except BaseException:
                os.close(self._fd)
                raise
        except BaseException:
            self._sock.close()
            rundir.unbind(self._path, self._inode)
            raise
        self._free: dict[int, list[int]] = {
            p: [(i * region) + s * self.slot_bytes for s in reversed(range(self.slots_per_peer))]
            for i, p in enumerate(self._peers)
        }
        self._lent: dict[int, int] = {}  # slot offset -> the peer it was lent to (until its ack)
        self._out_socks: dict[int, socket.socket] = {}
        self._outbox: dict[int, deque[bytes]] = {p: deque() for p in self._peers}
        self._acks: dict[int, list[int]] = {p: [] for p in self._peers}
        self._peer_segments: dict[int, memoryview] = {}
        self._peer_maps: list[mmap.mmap] = []
        self._peer_pids: dict[int, int] = {}
        self._early: list[Incoming] = []
        self._queued = False  # acks or datagrams wait in _acks/_outbox
        self._poll = select.poll()
        self._poll.register(self._sock, select.POLLIN)
        self._closed = False
        self._wake_sock: socket.socket | None = None  # to ourselves, made at the first wake()
        # Single-copy rendezvous (cma.py): who may read whom, and reads not yet acknowledged.
        self._single_copy = single_copy  # HCCL_PY_CMA=0 turns the rendezvous off (every payload via slots)
        cma.allow_readers()
        self._probe = np.full(1, _PROBE_MAGIC, np.uint64)
        self._peer_probes: dict[int, int] = {}
        self._peer_reads_me: dict[int, bool] = {}
        self._rndv_out: dict[int, int] = {p: 0 for p in self._peers}
        self._fins: dict[int, int] = {p: 0 for p in self._peers}
        self._scratch = np.empty(0, np.uint8)
        # Slices sent per path beyond the inline one: "direct" (the peer reads our buffer), "slot",
        # "shared" (one slot read by several peers).
        self.sent_by_path = {"direct": 0, "slot": 0, "shared": 0}
        self._shared: dict[
            int, tuple[set[int], int]
        ] = {}  # slot read by several peers -> (peers yet to ack, owning peer)

    # -- setup -----------------------------------------------------------------------------
    def connect(self, peer_pids: dict[int, int], deadline: float) -> None:
        """Open a socket to every peer, hand each our segment, and collect theirs.

        Sending and receiving interleave: a peer's queue holds only a few datagrams
        (net.unix.max_dgram_qlen), so a rank that only sent while everyone else also only sent
        would wait forever.
        """
        self._peer_pids = dict(peer_pids)
        # offset: where this process keeps the probe word a peer reads to test direct reads
        hello = SliceHeader.control(
            KIND_HELLO, self.world_rank, offset=self._probe.ctypes.data, slot=self._segment_bytes
        ).pack()
        for peer in self._peers:
            out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            out.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
            try:
                out.connect(rundir.socket_path(self.job_id, socket_name(self.tag, peer, self._peer_pids[peer])))
            except (ConnectionRefusedError, FileNotFoundError):
                out.close()
                raise HcclRemoteError(
                    f"init: rank {self.world_rank} cannot reach rank {peer}'s socket; did rank {peer} exit during init?"
                ) from None
            except OSError as err:
                out.close()
                raise HcclRemoteError(
                    f"init: rank {self.world_rank} cannot reach rank {peer}'s socket: {err.strerror}"
                ) from None
            out.setblocking(False)
            self._out_socks[peer] = out
        unsent = list(self._peers)
        missing = set(self._peers)
        while unsent or missing:
            for peer in list(unsent):
                try:
                    socket.send_fds(self._out_socks[peer], [hello], [self._fd])
                except BlockingIOError:
                    continue  # its queue is full; receive meanwhile and retry
                except OSError as err:
                    raise HcclRemoteError(
                        f"init: rank {self.world_rank} cannot reach rank {peer}: {err.strerror}"
                    ) from None
                unsent.remove(peer)
            self._receive_hellos(missing)
            if not unsent and not missing:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise HcclTimeoutError(
                    f"init: rank {self.world_rank} got no shared-memory handshake from rank(s) {sorted(missing)} "
                    f"(and could not reach rank(s) {sorted(unsent)}) within HCCL_CONNECT_TIMEOUT; check that they are alive"
                )
            poll = select.poll()
            poll.register(self._sock, select.POLLIN)
            for peer in unsent:
                poll.register(self._out_socks[peer], select.POLLOUT)
            poll.poll(min(remaining, 0.05) * 1000)
        self._exchange_caps(deadline)

    def _exchange_caps(self, deadline: float) -> None:
        """Probe whether this rank may read each peer's memory, and learn which peers may read
        ours: rendezvous sends go only to peers that said yes."""
        for peer in self._peers:
            ok = (
                self._single_copy
                and peer in self._peer_pids
                and cma.can_read(self._peer_pids[peer], self._peer_probes[peer], _PROBE_MAGIC)
            )
            self._put(
                peer, SliceHeader.control(KIND_CAPS, self.world_rank, count=int(ok)).pack()
            )  # count 1: "I may read you"
        while len(self._peer_reads_me) < len(self._peers):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(self._peers) - set(self._peer_reads_me))
                raise HcclTimeoutError(
                    f"init: rank {self.world_rank} got no capability message from rank(s) {missing} within HCCL_CONNECT_TIMEOUT"
                )
            if self._queued:
                self._flush()
            self._receive_hellos(set())
            if len(self._peer_reads_me) < len(self._peers):
                self._poll.poll(min(remaining, 0.05) * 1000)

    def _receive_hellos(self, missing: set[int]) -> None:
        while True:
            try:
                # recvmsg, not socket.recv_fds: Python 3.11's recv_fds drops its flags argument.
                data, ancdata, _flags, _addr = self._sock.recvmsg(_RECV_BYTES, _FD_SPACE, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            fds = _passed_fds(ancdata)
            if data[:1] == bytes([KIND_HELLO]):
                try:
                    self._hello(data, fds)
                finally:
                    for fd in fds:
                        os.close(fd)
                missing.discard(_unpack_header(data).src)
            else:  # a peer that finished connecting already started a collective
                for fd in fds:
                    os.close(fd)
                self._decode(data, self._early)

    def _hello(self, data: bytes, fds: list[int]) -> None:
        """Map a peer's segment (read-only), after checking the hello names a peer yet to
        connect and carries one segment at least as large as it says."""
        src = self._sender(data)
        if src is None:
            raise self._malformed(data, None, "a handshake that names no peer of this rank")
        header = _unpack_header(data)
        peer, size = src, header.slot
        if peer in self._peer_segments:
            raise self._malformed(data, src, "a second handshake")
        if len(fds) != 1 or size <= 0:
            raise self._malformed(data, src, f"a handshake with {len(fds)} segment(s) of {size} bytes")
        try:
            actual = os.fstat(fds[0]).st_size
            if actual < size:
                raise self._malformed(data, src, f"a segment of {actual} bytes announced as {size}")
            peer_map = mmap.mmap(fds[0], size, prot=mmap.PROT_READ)
        except OSError as err:
            raise self._malformed(data, src, f"a segment that cannot be mapped ({err.strerror})") from None
        self._peer_probes[peer] = header.offset
        self._peer_maps.append(peer_map)
        self._peer_segments[peer] = memoryview(peer_map)

    def _sender(self, data: bytes) -> int | None:
        """The sender's rank if the datagram holds a whole header naming one of our peers."""
        if len(data) < HEADER_BYTES:
            return None
        src = sender_of(data)
        return src if src in self._peer_set else None

    # -- data path ---------------------------------------------------------------------------
    def wake(self) -> None:
        """Interrupt a wait in :meth:`progress` from another thread (a datagram to ourselves):
        the progress thread of asynchronous calls waits here while new calls arrive."""
        if self._wake_sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.connect(self._path)
            sock.setblocking(False)
            self._wake_sock = sock
        try:
            self._wake_sock.send(SliceHeader.control(KIND_WAKE, self.world_rank).pack())
        except (BlockingIOError, OSError):
            pass  # the queue is full of datagrams: the waiter wakes anyway

    def max_slice_bytes(self, peer: int) -> int:
        return self.slot_bytes

    def try_send(self, peer: int, header: SliceHeader, data: np.ndarray) -> bool:
        """Send one slice inline, by slot or for a direct read, whichever its size calls for."""
        nbytes = data.nbytes
        if nbytes <= INLINE_MAX_BYTES:  # small: joining the bytes costs less than a gathered send
            self._put(peer, header.pack_as(KIND_INLINE) + data.tobytes())
            return True
        if nbytes <= SHM_INLINE_MAX_BYTES:
            self._put(peer, header.pack_as(KIND_INLINE), data.view(np.uint8))
            return True
        if nbytes >= RNDV_MIN_BYTES and self._peer_reads_me.get(peer):
            # The peer reads it from where it is; this buffer stays untouched until its FIN
            # (the step does not end before: flush() waits for it).
            self._put(peer, header.pack_as(KIND_RNDV, data.ctypes.data))
            self._rndv_out[peer] += 1
            self.sent_by_path["direct"] += 1
            return True
        offset = self._stage(peer, data)
        if offset is None:
            return False
        self._put(peer, header.pack_as(KIND_SLOT, offset))
        self.sent_by_path["slot"] += 1
        return True

    def try_send_shared(self, peers: list[int], headers: list[SliceHeader], data: np.ndarray) -> bool:
        """One slice to several peers, staged once: every peer reads the same slot, which is free
        again when the last of them has acknowledged it (a mesh allgather or broadcast sends one
        block to every peer: one copy instead of one per peer). False when the slice does not go
        through a slot (inline, direct) or no slot is free: then send it peer by peer."""
        nbytes = data.nbytes
        if (
            nbytes <= SHM_INLINE_MAX_BYTES
            or nbytes > self.slot_bytes
            or (nbytes >= RNDV_MIN_BYTES and any(self._peer_reads_me.get(p) for p in peers))
        ):
            return False
        offset = self._stage(peers[0], data)
        if offset is None:
            return False
        del self._lent[offset]
        self._shared[offset] = (set(peers), peers[0])
        for peer, header in zip(peers, headers):
            self._put(peer, header.pack_as(KIND_SLOT, offset))
        self.sent_by_path["shared"] += 1
        return True

    def _stage(self, peer: int, data: np.ndarray) -> int | None:
        """Copy ``data`` into a free slot of ``peer``'s region; its offset, or None when none is free."""
        free = self._free[peer]
        if not free:
            return None
        offset = free.pop()
        self._lent[offset] = peer
        np.copyto(np.frombuffer(self._segment, dtype=data.dtype, count=data.size, offset=offset), data, casting="no")
        return offset

    def notify(self, peer: int, comm_id: int, seq: int, body: bytes) -> None:
        header = SliceHeader.control(KIND_NOTICE, self.world_rank, comm_id=comm_id, seq=seq).pack()
        try:
            self._put(peer, header + body[:INLINE_MAX_BYTES])
        except HcclRemoteError:
            pass  # a notice to a rank that is gone has no one to tell

    def release(self, incoming: Incoming) -> None:
        if incoming.kind == KIND_SLOT:
            self._acks[incoming.src].append(incoming.slot)
            self._queued = True
        elif incoming.kind == KIND_RNDV:
            self._fins[incoming.src] += 1
            self._queued = True

    def _put(self, peer: int, datagram: bytes, payload: np.ndarray | None = None) -> None:
        """Send ``datagram`` (followed by the bytes of ``payload``, a contiguous uint8 view,
        gathered by the kernel) to ``peer``, or queue it while the peer's queue is full."""
        outbox = self._outbox[peer]
        if not outbox:  # (else it queues behind what waits already: order per peer is kept)
            try:
                if payload is None:
                    self._out_socks[peer].send(datagram)
                else:
                    self._out_socks[peer].sendmsg((datagram, payload))
                return
            except BlockingIOError:  # the peer's queue is full: keep it, progress() retries
                self._queued = True
            except OSError as err:  # refused, reset, not connected: the peer's socket is gone
                raise HcclRemoteError(
                    f"rank {self.world_of[peer]} is gone (its socket refused a message from rank "
                    f"{self.world_of[self.world_rank]}: {err.strerror})",
                    peer=self.world_of[peer],
                ) from None
        outbox.append(datagram if payload is None else datagram + payload.tobytes())

    def flush(self) -> bool:
        """Send what is queued now (acks above all: a peer may wait on them for free slots);
        True when nothing is left waiting for room in a peer's queue, and every peer has read
        what it was to read from our buffers."""
        if self._queued:
            self._flush()
        return not self._queued and not any(self._rndv_out.values())

    def backlog(self) -> list[int]:
        """Peers with datagrams of ours waiting for room, or yet to read our buffers."""
        return [peer for peer, outbox in self._outbox.items() if outbox or self._rndv_out[peer]]

    def _flush(self) -> bool:
        """Send queued acks and datagrams; True if anything is still waiting for space."""
        self._queued = False
        for peer, acks in self._acks.items():
            if acks:
                ack = SliceHeader.control(KIND_ACK, self.world_rank, nelem=len(acks)).pack()
                ack += np.array(acks, np.int64).tobytes()
                acks.clear()
                try:
                    self._put(peer, ack)
                except HcclRemoteError:
                    pass  # a peer that has exited needs no acks; a send to it will say it is gone
        for peer, fins in self._fins.items():
            if fins:
                self._fins[peer] = 0
                try:
                    self._put(peer, SliceHeader.control(KIND_FIN, self.world_rank, nelem=fins).pack())
                except HcclRemoteError:
                    pass
        blocked = False
        gone = None
        for peer, outbox in self._outbox.items():
            sock = self._out_socks[peer]
            while outbox:
                try:
                    sock.send(outbox[0])
                except BlockingIOError:
                    blocked = self._queued = True
                    break
                except OSError as err:  # the peer is gone: drop what it will never read, serve the others
                    outbox.clear()
                    gone = gone or HcclRemoteError(
                        f"rank {self.world_of[peer]} is gone (its socket refused a message from rank "
                        f"{self.world_of[self.world_rank]}: {err.strerror})",
                        peer=self.world_of[peer],
                    )
                    break
                outbox.popleft()
        if gone is not None:
            raise gone
        return blocked

    def progress(self, timeout_s: float) -> list[Incoming]:
        got, self._early = self._early, []
        blocked = self._flush() if self._queued else False
        # Return as soon as anything arrived, acks included: an ack frees a slot a send waits for.
        if self._drain(got) or got or timeout_s <= 0:
            return got
        spin_until = time.perf_counter() + min(self.spin_s, timeout_s)
        while time.perf_counter() < spin_until:
            if self.yield_when_spinning:
                os.sched_yield()
            if self._drain(got):
                return got
        if blocked:  # wait for our message or for room in a full peer's queue
            poll = select.poll()
            poll.register(self._sock, select.POLLIN)
            for peer, outbox in self._outbox.items():
                if outbox:
                    poll.register(self._out_socks[peer], select.POLLOUT)
            try:
                poll.poll(timeout_s * 1000.0)
            except InterruptedError:
                pass
            if self._queued:
                self._flush()
            self._drain(got)
            return got
        # One system call: a receive that blocks until a datagram comes or the timeout passes
        # (what is queued behind it, the next call's drain takes).
        if abs(timeout_s - self._receive_timeout) > 1e-3:
            self._set_receive_timeout(timeout_s)
        try:
            data = self._sock.recv(_RECV_BYTES)
        except (BlockingIOError, InterruptedError):  # the timeout passed (or a signal came)
            return got
        self._decode(data, got)
        if self._queued:
            self._flush()
        return got

    def _set_receive_timeout(self, timeout_s: float) -> None:
        seconds = max(timeout_s, 1e-6)  # 0 would mean "block forever"
        whole = int(seconds)
        self._sock.setsockopt(
            socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", whole, int((seconds - whole) * 1e6))
        )
        self._receive_timeout = timeout_s

    def _drain(self, got: list[Incoming]) -> int:
        """Decode every datagram waiting on the socket; how many there were. (Asking poll first:
        a receive on an empty socket raises, and raising costs more than the poll.)"""
        ready = self._poll.poll
        recv = self._sock.recv
        n = 0
        while ready(0):
            try:
                data = recv(_RECV_BYTES)
            except BlockingIOError:
                return n
            n += 1
            self._decode(data, got)
        return n

    def _decode(self, data: bytes, got: list[Incoming]) -> None:
        """Check one datagram against the protocol and queue what it carries (see the module doc:
        anything malformed raises HcclRemoteError naming the sender)."""
        try:
            fields = _unpack_fields(data)
        except struct.error:
            raise self._malformed(data, None, f"shorter than a message header ({HEADER_BYTES} bytes)") from None
        # The common case first, on the plain fields: a well-formed inline slice of a peer.
        if plain_inline_slice(fields, len(data), self._peer_set):
            got.append(Incoming(fields, data, None, HEADER_BYTES))
            return
        h = SliceHeader._make(fields)
        nelem = h.nelem
        kind, src = h.kind, h.src
        if kind == KIND_WAKE and src == self.world_rank:
            return
        if src not in self._peer_set:
            raise self._malformed(
                data,
                None,
                f"a header claiming rank {src}, not a peer of rank {self.world_rank} (world of {self.world_size})",
            )
        if kind == KIND_INLINE:
            raise self._bad_slice(data, h, len(data) - HEADER_BYTES)
        if kind == KIND_ACK:
            if len(data) != HEADER_BYTES + 8 * nelem:
                raise self._malformed(
                    data, src, f"an acknowledgement of {nelem} slot(s) in {len(data) - HEADER_BYTES} bytes"
                )
            for offset in np.frombuffer(data, np.int64, nelem, HEADER_BYTES).tolist():
                if self._lent.get(offset) == src:
                    del self._lent[offset]
                    self._free[src].append(offset)
                    continue
                shared = self._shared.get(offset)
                if shared is None or src not in shared[0]:
                    raise self._malformed(
                        data,
                        src,
                        f"an acknowledgement for slot offset {offset}, which rank {self.world_rank} had not lent to it",
                    )
                shared[0].discard(src)
                if not shared[0]:
                    del self._shared[offset]
                    self._free[shared[1]].append(offset)
            return
        if kind == KIND_FIN:
            if not 0 < nelem <= self._rndv_out[src]:
                raise self._malformed(
                    data, src, f"a receipt for {nelem} direct read(s) while {self._rndv_out[src]} were outstanding"
                )
            self._rndv_out[src] -= nelem
            return
        if kind == KIND_CAPS:
            self._peer_reads_me[src] = bool(h.count)
            return
        fetch = None
        if kind == KIND_SLOT:
            segment = self._peer_segments.get(src)
            end = h.slot + h.payload_bytes if h.known_dtype else -1
            if segment is None or h.slot < 0 or end < h.slot or end > len(segment) or h.offset + nelem > h.msg_count:
                raise self._bad_slice(data, h, None)
            payload = segment[h.slot : end]
        elif kind == KIND_RNDV:
            if not h.known_dtype or h.offset + nelem > h.msg_count:
                raise self._bad_slice(data, h, None)
            payload, fetch = None, self._fetcher(src, h.slot)
        elif kind == KIND_NOTICE:
            payload = memoryview(data)[HEADER_BYTES:]
        else:
            raise self._malformed(
                data, src, f"message kind {kind}" + (" after the handshake" if kind == KIND_HELLO else " (unknown)")
            )
        got.append(Incoming(h, payload, fetch))

    def _malformed(self, data: bytes, src: int | None, what: str) -> HcclRemoteError:
        """``malformed`` with this transport's ranks as the job numbers them."""
        return malformed(data, None if src is None else self.world_of[src], what, self.world_of[self.world_rank])

    def _bad_slice(self, data: bytes, h: SliceHeader, inline_bytes: int | None) -> HcclRemoteError:
        if not h.known_dtype:
            what = f"dtype code {h.dtype} (unknown)"
        elif h.offset + h.nelem > h.msg_count:
            what = f"elements {h.offset}..{h.offset + h.nelem} of a message of {h.msg_count}"
        elif inline_bytes is not None:
            what = f"{h.nelem} elements of dtype code {h.dtype} in {inline_bytes} bytes"
        else:
            size = len(self._peer_segments[h.src]) if h.src in self._peer_segments else 0
            what = f"slot offset {h.slot} + {h.payload_bytes} bytes, outside its {size}-byte segment"
        return self._malformed(data, h.src, f"a {'inline ' if h.kind == KIND_INLINE else ''}slice with {what}")

    def _fetcher(self, src: int, address: int):
        def fetch(dst: np.ndarray | None, dtype: np.dtype, nelem: int) -> np.ndarray:
            if dst is None:  # to be reduced: read into scratch, reused call after call (warm pages)
                need = nelem * np.dtype(dtype).itemsize
                if self._scratch.nbytes < need:
                    self._scratch = np.empty(need, np.uint8)
                dst = self._scratch[:need].view(dtype)
            try:
                cma.read_into(self._peer_pids[src], address, dst)
            except (ProcessLookupError, PermissionError) as err:
                raise HcclRemoteError(
                    f"rank {self.world_of[self.world_rank]} cannot read rank {self.world_of[src]}'s buffer: {err}",
                    peer=self.world_of[src],
                ) from None
            return dst

        return fetch

    def peer_pid(self, peer: int) -> int | None:
        return self._peer_pids.get(peer)

    def peer_alive(self, peer: int) -> bool:
        pid = self._peer_pids.get(peer)
        return pid is None or process_alive(pid)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sock in self._out_socks.values():
            sock.close()
        if self._wake_sock is not None:
            self._wake_sock.close()
        self._sock.close()
        rundir.unbind(self._path, self._inode)
        for view in self._peer_segments.values():
            view.release()
        for peer_map in self._peer_maps:
            try:
                peer_map.close()
            except BufferError:
                pass  # a caller still holds a view; the mapping goes with the process
        try:
            self._segment.close()
        except BufferError:
            pass
        os.close(self._fd)
