"""The narrow seam between the executor and a transport (gloo's ``Pair``, astra-sim's
``sim_send``/``sim_recv``).

A message is the data of one ``Send`` of a schedule; a transport may cut it into slices (it
says how large with ``max_slice_bytes``). Every slice carries a :class:`SliceHeader` that names
the call it belongs to, so the receiver can match it and detect a peer whose call differs; it
is the one header type every transport packs and unpacks.
"""

from __future__ import annotations

import functools
import struct
from typing import Callable, NamedTuple, Protocol

import numpy as np

from ..dtypes import ITEMSIZE_BY_CODE


class CallSignature(NamedTuple):
    """What every rank of one collective call must agree on; sent in every slice. A tuple, so a
    receiver compares the header's fields with it as they come, without building one."""

    op: int  # OpKind
    algo: int  # index into the registry's algorithm names; 0 for point-to-point
    dtype: int  # HcclDataType code
    redop: int  # ReduceOp, 0 when the op does not reduce
    count: int
    root: int


_WIRE = struct.Struct("<BHQQIBBBBQIQQQqdd")  # SliceHeader's fields in order: 99 bytes, little-endian


class SliceHeader(NamedTuple):
    """The header of every slice (and control message) on every transport, in wire order.

    The executor fills in what it knows about a slice (``kind`` 0 and ``slot`` -1: the
    transport decides how the payload travels and packs with :meth:`pack_as`); transports read
    fields by name and never know field numbers or dtype codes (``payload_bytes``)::

        header = SliceHeader(0, src, comm_id, seq, msg_index, *sig, msg_count, offset, nelem, -1, t0, t1)
        datagram = header.pack_as(KIND_INLINE) + data.tobytes()
        SliceHeader.unpack_from(datagram).nelem
    """

    kind: int  # KIND_*
    src: int  # the sender's rank, as the transport numbers ranks
    comm_id: int
    seq: int  # the call's sequence number on its communicator
    msg_index: int  # which message of the call from src (schedule.message_numbers)
    op: int  # op .. root: the call's CallSignature
    algo: int
    dtype: int
    redop: int
    count: int
    root: int
    msg_count: int  # elements of the whole message
    offset: int  # this slice's first element within the message
    nelem: int  # elements in this slice (ACK: slot offsets that follow; FIN: direct reads done)
    slot: int  # SLOT: byte offset in the sender's segment; RNDV: the buffer's address; HELLO: segment bytes; else -1
    sent_at: float  # modeled seconds: when the sender posted the message
    arrival: float  # and when it arrives

    @classmethod
    def unpack_from(cls, data, offset: int = 0) -> "SliceHeader":
        """The header at ``data[offset:]`` (``struct.error`` when there are fewer than SIZE bytes)."""
        return cls._make(_WIRE.unpack_from(data, offset))

    @staticmethod
    def unpack_fields(data, offset: int = 0) -> tuple:
        """The header's fields at ``data[offset:]`` as a plain tuple, in wire order (the receive
        fast path: no named tuple built)."""
        return _WIRE.unpack_from(data, offset)

    @classmethod
    def control(
        cls,
        kind: int,
        src: int,
        *,
        comm_id: int = 0,
        seq: int = 0,
        count: int = 0,
        offset: int = 0,
        nelem: int = 0,
        slot: int = -1,
    ) -> "SliceHeader":
        """A control message's header (handshakes, acknowledgements, notices): no call, no data."""
        return cls(kind, src, comm_id, seq, 0, 0, 0, 0, 0, count, 0, 0, offset, nelem, slot, 0.0, 0.0)

    def pack(self) -> bytes:
        """The header as its HEADER_BYTES wire bytes, fields as they are."""
        return _WIRE.pack(*self)

    def pack_as(self, kind: int, slot: int = -1) -> bytes:
        """The header with ``kind`` and ``slot`` set, packed: how a transport sends a slice."""
        return _WIRE.pack(kind, *self[1:14], slot, self[15], self[16])

    def pack_into(self, buffer, offset: int = 0) -> None:
        """Write the packed header into writable ``buffer`` at ``offset`` (no bytes object made)."""
        _WIRE.pack_into(buffer, offset, *self)

    @property
    def sig(self) -> tuple:
        """The call's signature fields (compare with a ``CallSignature``)."""
        return self[5:11]

    @property
    def known_dtype(self) -> bool:
        """Whether the dtype code names a dtype hccl-py knows (a peer's header may not)."""
        return self.dtype in ITEMSIZE_BY_CODE

    @property
    def payload_bytes(self) -> int:
        """Bytes of the ``nelem`` elements this slice carries (KeyError for an unknown dtype code)."""
        return self.nelem * ITEMSIZE_BY_CODE[self.dtype]


HEADER_BYTES = _WIRE.size
_KIND_SRC = struct.Struct("<BH")  # the first two fields of the wire form: kind, src
_ITEMSIZES = tuple(ITEMSIZE_BY_CODE.get(code, -1) for code in range(256))  # by dtype code; -1: unknown
# A header from its fields in wire order, without namedtuple._make's Python frame (the executor's
# hot path; the order is SliceHeader's).
new_header = functools.partial(tuple.__new__, SliceHeader)


def sender_of(datagram) -> int:
    """The ``src`` field of a packed header, read without unpacking the rest (the caller checks
    the length: at least HEADER_BYTES)."""
    return _KIND_SRC.unpack_from(datagram)[1]


def plain_inline_slice(fields: tuple, datagram_bytes: int, peers) -> bool:
    """Whether unpacked header ``fields`` (``SliceHeader.unpack_fields``) are a well-formed inline
    slice from one of ``peers`` whose payload fills the rest of a ``datagram_bytes`` datagram: the
    receive fast path, on the plain tuple (kind, src, dtype, msg_count, offset, nelem by position
    here, the one place that knows them)."""
    return (
        fields[0] == KIND_INLINE
        and fields[1] in peers
        and fields[12] + fields[13] <= fields[11]
        and datagram_bytes - HEADER_BYTES == fields[13] * _ITEMSIZES[fields[7]]
    )


KIND_INLINE = 1  # payload follows the header in the same datagram
KIND_SLOT = 2  # payload sits in the sender's shared segment at byte offset `slot`
KIND_ACK = 3  # payload: slot offsets the receiver has finished with
KIND_NOTICE = 4  # a peer tells the communicator it failed (mismatch, abort, a dead peer); payload: errors.to_wire
KIND_HELLO = 5  # connection setup; carries the sender's segment fd as ancillary data
KIND_CAPS = 6  # connection setup: "I can read your memory directly" (count=1) or not
KIND_RNDV = 7  # payload stays in the sender's buffer at address `slot`; the receiver reads it (CMA)
KIND_FIN = 8  # the receiver has read `nelem` rendezvous payloads: the sender's buffers are free
KIND_WAKE = 9  # a rank to itself: another thread has work for the one waiting in the transport


class Incoming:
    """One received slice (or a notice): its header's fields by name, ``sig`` as a plain tuple,
    and the payload: ``payload[start:]`` (a datagram whose payload follows its header, or a
    mapped slot). ``array()`` views the payload without copying."""

    __slots__ = (
        "kind",
        "src",
        "comm_id",
        "seq",
        "msg_index",
        "sig",
        "msg_count",
        "offset",
        "nelem",
        "slot",
        "sent_at",
        "arrival",
        "payload",
        "fetch",
        "start",
    )

    def __init__(
        self,
        header: SliceHeader | tuple,
        payload=None,
        fetch: Callable[[np.ndarray | None, np.dtype, int], np.ndarray] | None = None,
        start: int = 0,
    ):
        (
            self.kind,
            self.src,
            self.comm_id,
            self.seq,
            self.msg_index,
            op,
            algo,
            dtype,
            redop,
            count,
            root,
            self.msg_count,
            self.offset,
            self.nelem,
            self.slot,
            self.sent_at,
            self.arrival,
        ) = header
        self.sig = (op, algo, dtype, redop, count, root)
        self.payload = payload  # the bytes that hold the payload from ``start`` on
        self.start = start
        # rendezvous: fetch(dst or None, dtype, nelem) reads the payload into dst (or a scratch array) and returns it
        self.fetch = fetch

    def array(self, dtype: np.dtype) -> np.ndarray:
        """The payload as an array (a view where it can be; read into scratch for a rendezvous)."""
        if self.fetch is not None:
            return self.fetch(None, dtype, self.nelem)
        return np.frombuffer(self.payload, dtype, self.nelem, self.start)

    def body(self) -> memoryview:
        """The payload's bytes (a view)."""
        return memoryview(self.payload)[self.start :]

    def copy_into(self, dst: np.ndarray) -> None:
        """Copy the payload into ``dst`` (a rendezvous reads straight into it: one copy)."""
        if self.fetch is not None:
            self.fetch(dst, dst.dtype, self.nelem)
        elif dst.dtype.isbuiltin == 1:  # numpy's own types (2: user-defined)
            start = self.start
            memoryview(dst).cast("B")[:] = memoryview(self.payload)[
                start : start + dst.nbytes
            ]  # a quarter of numpy's cost
        else:  # types without a buffer format (bfloat16)
            np.copyto(dst, np.frombuffer(self.payload, dst.dtype, self.nelem, self.start))


class Transport(Protocol):
    """What the executor asks of a transport: send slices, progress, release, notify. The
    transports (shm, tcp, mpi, and HostSplitTransport over shm and tcp) match it without
    subclassing it."""

    world_rank: int
    world_size: int

    def max_slice_bytes(self, peer: int) -> int:
        """The largest payload of one slice to ``peer``, in bytes: the executor cuts each message
        into slices of at most this size (at least one element)."""

    def try_send(self, peer: int, header: SliceHeader, data: np.ndarray) -> bool:
        """Hand one slice (``header``: kind 0 and slot -1, the transport sets them) to the
        transport. False when it cannot take it now (no free slot); True once the data has been
        copied out of ``data`` (the caller may reuse it), or, for a transport whose peer reads
        ``data`` in place, once that read is arranged (``flush()`` stays False until it is done)."""

    def progress(self, timeout_s: float) -> list[Incoming]:
        """Move pending output and return what arrived, waiting up to ``timeout_s`` for
        something to happen when nothing is ready."""

    def release(self, incoming: Incoming) -> None:
        """The executor has consumed ``incoming``; its slot may be reused by the sender."""

    def flush(self) -> bool:
        """Push queued output; True when all of it has left (a step is done only then)."""

    def backlog(self) -> list[int]:
        """Peers that still have output of ours queued."""

    def notify(self, peer: int, comm_id: int, seq: int, body: bytes) -> None:
        """Send ``body`` (an error in its wire form, ``errors.to_wire``) to ``peer`` as a notice
        for communicator ``comm_id``; a peer that is gone is skipped."""

    def peer_alive(self, peer: int) -> bool:
        """False once ``peer`` is known to be gone (its process has exited, its connection was
        lost); True while it lives or when the transport cannot tell (a peer on another host)."""

    def peer_pid(self, peer: int) -> int | None:
        """``peer``'s process id when it runs on this host and the transport knows it, else None."""
        return None

    def close(self) -> None:
        """Release sockets, shared memory and the like; a second call does nothing."""
