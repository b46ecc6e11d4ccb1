"""The narrow seam between the executor and a transport (gloo's ``Pair``, astra-sim's
``sim_send``/``sim_recv``).

A message is the data of one ``Send`` of a schedule; a transport may cut it into slices (it
says how large with ``max_slice_bytes``). Every slice carries a ``SliceHeader`` that names the
call it belongs to, so the receiver can match it and detect a peer whose call differs.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable, NamedTuple, Protocol

import numpy as np


class CallSignature(NamedTuple):
    """What every rank of one collective call must agree on; sent in every slice. A tuple, so a
    receiver compares the header's fields with it as they come, without building one."""

    op: int  # OpKind
    algo: int  # index into the registry's algorithm names; 0 for point-to-point
    dtype: int  # HcclDataType code
    redop: int  # ReduceOp, 0 when the op does not reduce
    count: int
    root: int


# kind, src, comm_id, seq, msg_index, op, algo, dtype, redop, count, root, msg_count, offset,
# nelem, slot, then modeled seconds: when the sender posted the message and when it arrives
HEADER = struct.Struct("<BHQQIBBBBQIQQQqdd")
KIND_INLINE = 1  # payload follows the header in the same datagram
KIND_SLOT = 2  # payload sits in the sender's shared segment at byte offset `slot`
KIND_ACK = 3  # payload: slot offsets the receiver has finished with
KIND_NOTICE = 4  # a peer tells the communicator it failed (mismatch, abort, a dead peer); payload: errors.to_wire
KIND_HELLO = 5  # connection setup; carries the sender's segment fd as ancillary data
KIND_CAPS = 6  # connection setup: "I can read your memory directly" (count=1) or not
KIND_RNDV = 7  # payload stays in the sender's buffer at address `slot`; the receiver reads it (CMA)
KIND_FIN = 8  # the receiver has read `nelem` rendezvous payloads: the sender's buffers are free


@dataclass(slots=True)
class Incoming:
    """One received slice (or a notice). ``array()`` views the payload without copying."""

    kind: int
    src: int
    comm_id: int
    seq: int
    msg_index: int
    sig: tuple  # the header's CallSignature fields, as a plain tuple
    msg_count: int
    offset: int
    nelem: int
    sent_at: float
    arrival: float
    payload: memoryview | None = None  # inline bytes, or the mapped slot
    slot: int = -1
    # rendezvous: fetch(dst or None, dtype, nelem) reads the payload into dst (or a scratch array) and returns it
    fetch: Callable[[np.ndarray | None, np.dtype, int], np.ndarray] | None = None

    def array(self, dtype: np.dtype) -> np.ndarray:
        """The payload as an array (a view where it can be; read into scratch for a rendezvous)."""
        if self.fetch is not None:
            return self.fetch(None, dtype, self.nelem)
        return np.frombuffer(self.payload, dtype=dtype, count=self.nelem)

    def copy_into(self, dst: np.ndarray) -> None:
        """Copy the payload into ``dst`` (a rendezvous reads straight into it: one copy)."""
        if self.fetch is not None:
            self.fetch(dst, dst.dtype, self.nelem)
        elif dst.dtype.isbuiltin == 1 and len(self.payload) == dst.nbytes:  # numpy's own types (2: user-defined)
            memoryview(dst).cast("B")[:] = self.payload  # a byte copy: a quarter of numpy's cost for a small slice
        else:  # types without a buffer format (bfloat16)
            np.copyto(dst, np.frombuffer(self.payload, dtype=dst.dtype, count=self.nelem))


class Transport(Protocol):
    world_rank: int
    world_size: int

    def max_slice_bytes(self, peer: int) -> int: ...

    def try_send(self, peer: int, fields: tuple, stamps: tuple[float, float], data: np.ndarray) -> bool:
        """Hand one slice to the transport. False when it cannot take it now (no free slot);
        True once the data has been copied out of ``data`` (the caller may reuse it), or, for a
        transport whose peer reads ``data`` in place, once that read is arranged (``flush()``
        stays False until it is done)."""

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

    def peer_alive(self, peer: int) -> bool: ...

    def close(self) -> None: ...
