"""TCP transport between ranks on different hosts (or all ranks, with HCCL_PY_TRANSPORT=tcp).

Each rank listens on ``HCCL_IF_IP`` (default: the address its host uses to reach the rendezvous
store) and publishes the endpoint through the store; every pair of ranks shares one TCP
connection (the lower rank connects), which keeps each direction's slices in order. A frame is
``LENGTH`` (payload bytes) + a ``SliceHeader`` + payload.

Plain nonblocking sockets rather than zmq: a slice counts as sent only once the kernel holds all
of it, so ``flush()`` can say truthfully that a step's output has left, as the shared-memory
transport does: a rank may exit right after its last step (``os._exit``, a crash) without
taking undelivered messages with it, which zmq's user-space queues would. What the kernel does
not take at once waits in a per-peer outbox (the unsent rest of a payload is copied there, so
the caller may reuse its array). Large payloads are received straight into their own buffer.
A peer that exits closes its connection: everything it sent before is read first, then EOF
marks it gone, so ``peer_alive`` answers at once.

Only the job's ranks get a connection accepted: each listener draws a random token and publishes
it with its endpoint (``host:port/token``) in the rendezvous store, which only holders of the job
secret may read; a connecting rank's hello carries the token, and the listener closes any
connection whose hello does not (anyone on the network may reach the port, nobody else knows it).

Flow control mirrors the shared-memory slots: a slice larger than ``INLINE_MAX_BYTES`` takes one
of the ``slots`` credits the sender holds for that peer, and the receiver returns credits
(``KIND_ACK``) when the executor releases the slice, so at most ``HCCL_BUFFSIZE`` of slices
wait at a receiver.
"""

from __future__ import annotations

import hmac
import secrets
import select
import socket
import struct
import time
from collections import deque

import numpy as np

from ..errors import HcclConnectError, HcclRemoteError, HcclTimeoutError
from .base import HEADER_BYTES, KIND_ACK, KIND_HELLO, KIND_INLINE, KIND_NOTICE, Incoming, SliceHeader
from .common import INLINE_MAX_BYTES, process_alive, slice_layout

LENGTH = struct.Struct("<Q")
PREFIX = LENGTH.size + HEADER_BYTES
TOKEN_BYTES = 16  # the listener's secret a hello must carry
RECV_CHUNK = 64 * 1024  # payloads larger than what one read brings are received into their own buffer
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
_EMPTY = memoryview(b"")


def advertised_address(master_addr: str, master_port: int, if_ip: str | None) -> str:
    """The address peers reach this rank on: ``HCCL_IF_IP`` if set, else the local address of the
    route to the rendezvous store (127.0.0.1 when the store is on loopback, ::1 on IPv6's; the
    store's host may be given bracketed, ``[::1]``)."""
    if if_ip:
        return if_ip
    host = unbracketed(master_addr)
    try:
        with socket.socket(address_family(host), socket.SOCK_DGRAM) as probe:
            probe.connect((host, master_port or 9))  # UDP connect: picks a route, sends nothing
            return probe.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def unbracketed(host: str) -> str:
    """``[::1]`` (an IPv6 address as URLs write it) -> ``::1``; anything else as it is."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def address_family(host: str) -> socket.AddressFamily:
    """AF_INET6 for an IPv6 address (or a name that resolves only to one), else AF_INET."""
    try:
        infos = socket.getaddrinfo(unbracketed(host), None, type=socket.SOCK_STREAM)
    except OSError:
        return socket.AF_INET6 if ":" in host else socket.AF_INET
    families = [info[0] for info in infos]
    return socket.AF_INET if socket.AF_INET in families or not families else families[0]


class _Reader:
    """Receive state of one connection: bytes of a partial frame, or a large payload being filled."""

    __slots__ = ("buf", "header", "payload", "filled")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.header: tuple | None = None
        self.payload: np.ndarray | None = None
        self.filled = 0


class TcpTransport:
    """One TCP connection to each peer in ``peers`` (world ranks); see the module doc."""

    def __init__(
        self,
        world_rank: int,
        world_size: int,
        peers: list[int],
        host: str,
        buffsize_bytes: int,
        *,
        local_pids: dict[int, int] | None = None,
    ):
        self.world_rank = world_rank
        self.world_size = world_size
        self.slots, self.slice_bytes = slice_layout(world_size, buffsize_bytes)
        self._peers = list(peers)
        self._local_pids = dict(local_pids or {})  # peers on this host: their pid tells if they live
        host = unbracketed(host)
        self._listener = socket.socket(address_family(host), socket.SOCK_STREAM)
        try:
            self._listener.bind((host, 0))
            self._listener.listen(max(len(self._peers), 16))
        except OSError as err:
            self._listener.close()
            raise HcclConnectError(
                f"rank {world_rank}: cannot listen on {host} for TCP peers: {err.strerror} "
                "(set HCCL_IF_IP to an address of this host)"
            ) from None
        self._token = secrets.token_bytes(TOKEN_BYTES)
        # host:port/token: published through the store (readable only with the job secret)
        self.endpoint = f"{host}:{self._listener.getsockname()[1]}/{self._token.hex()}"
        self._socks: dict[int, socket.socket] = {}
        self._by_fd: dict[int, int] = {}
        self._readers = {p: _Reader() for p in self._peers}
        self._outbox: dict[int, deque] = {p: deque() for p in self._peers}
        self._credits = {p: self.slots for p in self._peers}
        self._acks = {p: 0 for p in self._peers}
        self._gone: set[int] = set()
        self._pool: dict[int, list[np.ndarray]] = {}  # large receive buffers, reused (first touch costs page faults)
        self._poll = select.poll()
        self._early: list[Incoming] = []
        self._closed = False

    # -- setup -----------------------------------------------------------------------------
    def connect(self, endpoints: dict[int, str], deadline: float) -> None:
        """One connection per pair: connect to higher ranks (their listen backlog takes it
        before they accept), then accept the lower ones, each naming itself in a hello."""
        hello = LENGTH.pack(TOKEN_BYTES) + SliceHeader.control(KIND_HELLO, self.world_rank, nelem=TOKEN_BYTES).pack()
        for peer in (p for p in self._peers if p > self.world_rank):
            address, _, token = endpoints[peer].partition("/")
            host, _, port = address.rpartition(":")
            while True:
                try:
                    sock = socket.create_connection((host, int(port)), timeout=max(deadline - time.monotonic(), 0.01))
                    sock.settimeout(max(deadline - time.monotonic(), 0.01))
                    sock.sendall(hello + bytes.fromhex(token))
                    break
                except OSError as err:
                    if time.monotonic() >= deadline:
                        raise HcclTimeoutError(
                            f"init: rank {self.world_rank} could not reach rank {peer} at {address} within "
                            f"HCCL_CONNECT_TIMEOUT ({err.strerror or err}); check that it is alive and that its address "
                            "(HCCL_IF_IP) is reachable from this host"
                        ) from None
                    time.sleep(0.05)
            self._add(peer, sock)
        waiting = {p for p in self._peers if p < self.world_rank}
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise HcclTimeoutError(
                    f"init: rank {self.world_rank} got no TCP connection from rank(s) {sorted(waiting)} within "
                    "HCCL_CONNECT_TIMEOUT; check that they are alive and can reach this host"
                )
            self._listener.settimeout(remaining)
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            try:
                sock.settimeout(max(deadline - time.monotonic(), 0.01))
                frame = _recv_exactly(sock, PREFIX)
                header = SliceHeader.unpack_from(frame, LENGTH.size)
                known = (
                    LENGTH.unpack_from(frame)[0] == TOKEN_BYTES
                    and header.kind == KIND_HELLO
                    and header.src in waiting
                    and hmac.compare_digest(_recv_exactly(sock, TOKEN_BYTES), self._token)
                )
            except (OSError, struct.error):  # timed out, reset or garbled: not a peer of ours
                known = False
            if not known:  # not one of the job's ranks (it could not know our token): ignore it
                sock.close()
                continue
            waiting.discard(header.src)
            self._add(header.src, sock)

    def _add(self, peer: int, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)
        sock.setblocking(False)
        self._socks[peer] = sock
        self._by_fd[sock.fileno()] = peer
        self._poll.register(sock, select.POLLIN)

    # -- data path ---------------------------------------------------------------------------
    def max_slice_bytes(self, peer: int) -> int:
        return self.slice_bytes

    def try_send(self, peer: int, header: SliceHeader, data: np.ndarray) -> bool:
        nbytes = data.nbytes
        large = nbytes > INLINE_MAX_BYTES
        if large and not self._credits[peer]:
            return False
        if peer in self._gone:
            raise HcclRemoteError(
                f"rank {peer} is gone (its TCP connection to rank {self.world_rank} was closed)", peer=peer
            )
        head = LENGTH.pack(nbytes) + header.pack_as(KIND_INLINE)
        self._send(peer, head, data.reshape(-1).view(np.uint8) if nbytes else _EMPTY)
        if large:
            self._credits[peer] -= 1
        return True

    def notify(self, peer: int, comm_id: int, seq: int, body: bytes) -> None:
        body = body[:INLINE_MAX_BYTES]
        head = (
            LENGTH.pack(len(body))
            + SliceHeader.control(KIND_NOTICE, self.world_rank, comm_id=comm_id, seq=seq, nelem=len(body)).pack()
        )
        try:
            self._send(peer, head, memoryview(body))
        except HcclRemoteError:
            pass  # a notice to a rank that is gone has no one to tell

    def _send(self, peer: int, head: bytes, payload) -> None:
        """Hand ``head`` + ``payload`` to the kernel now if the outbox is empty; what it does not
        take waits in the outbox (the payload's rest copied: the caller may reuse its array)."""
        if peer in self._gone:
            return  # acks and notices for a rank that has left: no one to read them
        out = self._outbox[peer]
        sent = 0
        if not out:
            try:
                sent = self._socks[peer].sendmsg([head, payload])
            except BlockingIOError:
                sent = 0
            except OSError as err:
                self._lost(peer)
                raise HcclRemoteError(
                    f"rank {peer} is gone (its TCP connection refused a message from rank "
                    f"{self.world_rank}: {err.strerror})",
                    peer=peer,
                ) from None
        if sent < len(head):
            out.append(head[sent:])
            if len(payload):
                out.append(bytes(payload))
        elif sent < len(head) + len(payload):
            out.append(bytes(payload[sent - len(head) :]))
        else:
            return
        self._poll.modify(self._socks[peer], select.POLLIN | select.POLLOUT)

    def release(self, incoming: Incoming) -> None:
        if incoming.kind == KIND_INLINE and len(incoming.payload) > INLINE_MAX_BYTES:
            self._acks[incoming.src] += 1
            buf = incoming.payload.obj
            if isinstance(buf, np.ndarray):
                free = self._pool.setdefault(buf.nbytes, [])
                if len(free) < 2 * self.slots:
                    free.append(buf)

    def flush(self) -> bool:
        """Send credit returns and what waits in outboxes; True once the kernel holds all of it."""
        self._write()
        return not any(out for peer, out in self._outbox.items() if peer not in self._gone)

    def backlog(self) -> list[int]:
        return [peer for peer, out in self._outbox.items() if out and peer not in self._gone]

    def _write(self) -> None:
        for peer, count in self._acks.items():
            if count:
                self._acks[peer] = 0
                ack = LENGTH.pack(0) + SliceHeader.control(KIND_ACK, self.world_rank, nelem=count).pack()
                try:
                    self._send(peer, ack, _EMPTY)
                except HcclRemoteError:
                    pass  # a peer that has gone needs no credits back
        for peer, out in self._outbox.items():
            if not out or peer in self._gone:
                continue
            sock = self._socks[peer]
            try:
                while out:
                    n = sock.send(out[0])
                    if n < len(out[0]):
                        out[0] = memoryview(out[0])[n:]
                        break
                    out.popleft()
            except BlockingIOError:
                pass
            except OSError:
                self._lost(peer)
                continue
            if not out:
                self._poll.modify(sock, select.POLLIN)

    def progress(self, timeout_s: float) -> list[Incoming]:
        got, self._early = self._early, []
        self._write()
        if self._drain(got, 0) or got or timeout_s <= 0:
            return got
        self._drain(got, timeout_s)
        return got

    def _drain(self, got: list[Incoming], timeout_s: float) -> int:
        """Read every connection that has data (waiting up to ``timeout_s`` for one); how many
        connections had something (data, room for output, or EOF)."""
        try:
            events = self._poll.poll(timeout_s * 1000.0)
        except InterruptedError:
            return 0
        for fd, mask in events:
            peer = self._by_fd.get(fd)
            if peer is None:
                continue
            if mask & select.POLLOUT:
                self._write()
            if mask & (select.POLLIN | select.POLLHUP | select.POLLERR):
                self._read(peer, got)
        return len(events)

    def _read(self, peer: int, got: list[Incoming]) -> None:
        sock, st = self._socks[peer], self._readers[peer]
        while True:
            try:
                if st.payload is not None:  # a large payload: straight into its buffer
                    n = sock.recv_into(memoryview(st.payload)[st.filled :])
                    if n:
                        st.filled += n
                        if st.filled == st.payload.nbytes:
                            self._deliver(st.header, memoryview(st.payload), got)
                            st.header, st.payload = None, None
                        continue
                else:
                    chunk = sock.recv(RECV_CHUNK)
                    n = len(chunk)
                    if n:
                        st.buf += chunk
                        self._parse(st, got)
                        continue
            except BlockingIOError:
                return
            except OSError:
                n = 0
            self._lost(peer)  # EOF or reset: everything the peer sent before has been read
            return

    def _parse(self, st: _Reader, got: list[Incoming]) -> None:
        buf, pos = st.buf, 0
        while len(buf) - pos >= PREFIX:
            nbytes = LENGTH.unpack_from(buf, pos)[0]
            header = SliceHeader.unpack_from(buf, pos + LENGTH.size)
            start = pos + PREFIX
            have = len(buf) - start
            if have >= nbytes:
                self._deliver(header, memoryview(bytes(buf[start : start + nbytes])), got)
                pos = start + nbytes
                continue
            if nbytes > RECV_CHUNK:  # the rest goes straight into the payload's own buffer
                free = self._pool.get(nbytes)
                st.header, st.payload = header, (free.pop() if free else np.empty(nbytes, np.uint8))
                st.payload[:have] = np.frombuffer(buf, np.uint8, have, start)
                st.filled = have
                pos = len(buf)
            break
        del buf[:pos]

    def _deliver(self, header: SliceHeader, payload: memoryview, got: list[Incoming]) -> None:
        if header.kind == KIND_ACK:
            self._credits[header.src] += header.nelem
            return
        got.append(Incoming(header, payload))

    def _lost(self, peer: int) -> None:
        if peer in self._gone:
            return
        self._gone.add(peer)
        self._outbox[peer].clear()
        sock = self._socks[peer]
        try:
            self._poll.unregister(sock)
        except (KeyError, ValueError):
            pass

    def peer_pid(self, peer: int) -> int | None:
        return self._local_pids.get(peer)

    def peer_alive(self, peer: int) -> bool:
        if peer in self._gone:
            return False
        pid = self._local_pids.get(peer)
        return pid is None or process_alive(pid)

    def close(self) -> None:
        """Close every connection: read what is left first (closing over unread data would make
        the kernel reset the connection), then a FIN the peer reads as EOF after our data."""
        if self._closed:
            return
        self._closed = True
        for peer, sock in self._socks.items():
            try:
                while sock.recv(RECV_CHUNK):
                    pass
            except OSError:
                pass
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            sock.close()
        self._listener.close()


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise TimeoutError("connection closed during the handshake")
        data += chunk
    return data
