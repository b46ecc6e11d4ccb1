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
  keeps its own clock).
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np

from ..device import Stream, stream_of_handle


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
    """The modeled clock of a torch npu stream: the card's (the npu device's compute stream), kept
    here too while the process has no card (no "hccl" world)."""

    __slots__ = ("_own",)

    def __init__(self, name: str):  # not Stream's: setting the clock would move the card's
        self.name = name
        self._own = 0.0

    @property
    def clock(self) -> float:
        """Modeled seconds of the stream: the card's clock (its own while there is no card)."""
        card = _card()
        return self._own if card is None else _modeled_clock()

    @clock.setter
    def clock(self, value: float) -> None:
        card = _card()
        if card is None:
            self._own = value
        else:
            card.clock = value


def torch_stream(handle: int) -> tuple[int, int] | None:
    """(card, torch stream id) of an ``npu_stream`` handle while the npu device is loaded, or None."""
    return stream_of_handle(handle) if _extension() is not None else None


def _card():
    npu = sys.modules.get("hccl_py.torch.npu")
    return npu.process_card() if npu is not None else None


def _modeled_clock() -> float:
    return sys.modules["hccl_py.torch.npu"].modeled_clock()
