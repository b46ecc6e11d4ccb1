"""HCCL's C API in a process that hosts hccl-py's npu device (a ctypes client such as vLLM's
pyhccl, under ``hccl-npu torchrun``): the card memory, current device and streams are torch's.

Nothing here imports torch: in a process without the npu device every function answers None and
the C API keeps its own devices, memory and streams (a C program). With it:

- an npu tensor's ``data_ptr()`` is device memory of its card (the npu allocator's blocks), and
  ``aclrtMalloc`` allocates from that pool (one HBM ledger per card);
- the current device is torch's (``torch.npu.set_device``, ``with torch.npu.device(d)``), and
  ``aclrtSetDevice`` sets torch's too;
- ``torch.npu.current_stream().npu_stream`` resolves to that stream, whose modeled clock is the
  card's (the npu device's one clock, of the world its "hccl" group joined; without one the stream
  keeps its own clock);
- ``torch.npu.Event().npu_event`` resolves to that event: C's ``aclrtRecordEvent`` stamps it and
  ``aclrtEventElapsedTime`` reads it, as torch's ``record`` and ``elapsed_time`` do.
"""

from __future__ import annotations

import ctypes
import importlib
import sys

import numpy as np

from ..modeled.card import Stream, stream_of_handle


def _extension():
    device = sys.modules.get("hccl_py.torch.device")
    return device.installed() if device is not None else None


def current_device() -> int | None:
    """torch's current npu card of this thread, or None without the npu device."""
    ext = _extension()
    return None if ext is None else int(ext.current_device())


def set_device(index: int) -> None:
    """Make card ``index`` torch's current card too (aclrtSetDevice is torch_npu's set_device)."""
    ext = _extension()
    if ext is not None:
        ext.set_device(index)


def npu_allocate(index: int, nbytes: int) -> tuple[object, np.ndarray] | None:
    """``nbytes`` of card ``index`` from the npu device's pool (its HBM booking, its out-of-memory
    error), zeroed: (the npu tensor that owns them, their bytes); None without the npu device."""
    ext = _extension()
    if ext is None:
        return None
    torch = sys.modules["torch"]
    owner = torch.zeros(nbytes, dtype=torch.uint8, device=torch.device("npu", index))
    return owner, ext.as_cpu(owner).numpy()


def memory_info(index: int) -> tuple[int, int] | None:
    """(free, total) bytes of card ``index``'s HBM as the npu device's pool counts them, or None."""
    npu = sys.modules.get("hccl_py.torch.npu")
    return npu.mem_get_info(index) if npu is not None and _extension() is not None else None


def npu_block(address: int, nbytes: int) -> tuple[int, int, np.ndarray] | None:
    """(card, start, the block's bytes) of the npu allocation holding ``nbytes`` at ``address``."""
    ext = _extension()
    found = ext.block_at(address, nbytes) if ext is not None else None
    if found is None:
        return None
    card, start, size = found
    memory = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(start)) if size else np.empty(0, np.uint8)
    return card, start, memory


class CardClock(Stream):
    """The modeled clock of a torch npu stream: the card's (the npu device's compute stream, which
    torch's events stamp), of the world its "hccl" group joined or, without one, the process's."""

    __slots__ = ()

    def __init__(self, name: str):  # not Stream's: setting the clock would move the card's
        self.name = name

    @property
    def clock(self) -> float:
        """Modeled seconds of the stream: the card's."""
        return _npu().modeled_clock()

    @clock.setter
    def clock(self, value: float) -> None:
        _npu().set_modeled_clock(value)


def torch_stream(handle: int) -> tuple[int, int] | None:
    """(card, torch stream id) of an ``npu_stream`` handle while the npu device is loaded, or None."""
    return stream_of_handle(handle) if _extension() is not None else None


class TorchEvent:
    """A torch npu event as the C API sees one (an ``AclEvent``'s fields): its card and its stamp,
    which is the torch event's own (recorded from C or from torch, read by both)."""

    __slots__ = ("handle", "card")

    def __init__(self, handle: int, card):
        self.handle = handle
        self.card = card

    @property
    def stamp(self) -> float | None:
        """Modeled seconds of the torch event's last record (None: no live event there)."""
        found = _extension().event_stamp(self.handle)
        return None if found is None else found[1]

    @stamp.setter
    def stamp(self, modeled_s: float | None) -> None:
        # torch has no unrecorded state for an event it made: a reset leaves the last stamp
        if modeled_s is not None:
            _extension().set_event_stamp(self.handle, modeled_s)


def torch_event(handle: int) -> int | None:
    """The card of a live torch npu event at ``handle`` (its ``npu_event``), or None."""
    ext = _extension()
    found = ext.event_stamp(handle) if ext is not None and handle else None
    return None if found is None else found[0]


def _npu():
    """hccl_py.torch.npu (torch is loaded: a torch stream's handle was resolved)."""
    return importlib.import_module("hccl_py.torch.npu")
