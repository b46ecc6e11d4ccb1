"""The simulated NPU card each rank hosts: a modeled clock, HBM with an allocator that enforces
the card's capacity, and compute whose numpy result is real and whose modeled cost follows the
card's roofline.

    dev = comm.device
    w = dev.empty((256, 256), np.float32)      # counts against HBM; freed when w is collected
    y = dev.matmul(x, w)                        # real result; clock += max(flops/peak, bytes/BW) + launch
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from topology import CardModel

from .errors import HcclMemoryError, HcclParamError

ALIGNMENT = 512  # HBM allocations are rounded up to 512 bytes, as the Ascend runtime does


def aligned(nbytes: int) -> int:
    return (nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


@dataclass
class DeviceTime:
    """Modeled seconds by kind, for reports: busy computing, moving data, waiting for peers."""

    compute_s: float = 0.0
    comm_s: float = 0.0
    wait_s: float = 0.0


@dataclass
class Device:
    """One simulated card: ``model`` (a topology ``CardModel``), ``clock`` in modeled seconds."""

    model: CardModel
    rank: int = 0
    clock: float = 0.0
    slow_factor: float = 1.0  # > 1: a straggler card, its compute takes that much longer
    used_bytes: int = 0
    peak_bytes: int = 0
    time: DeviceTime = field(default_factory=DeviceTime)
    _allocations: dict[int, int] = field(default_factory=dict)
    _next_handle: int = 0

    # -- memory ------------------------------------------------------------------------------
    @property
    def capacity_bytes(self) -> int:
        return self.model.hbm_bytes

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes

    def malloc(self, nbytes: int, what: str = "buffer") -> int:
        """Reserve ``nbytes`` (rounded up to 512) of HBM; returns a handle for :meth:`free`."""
        if nbytes < 0:
            raise HcclParamError(f"device {self.rank}: cannot allocate {nbytes} bytes")
        size = aligned(nbytes)
        if size > self.free_bytes:
            raise HcclMemoryError(
                f"device {self.rank} ({self.model.name}): out of memory allocating {what}: requested {size} bytes, "
                f"free {self.free_bytes} of {self.capacity_bytes}, peak so far {self.peak_bytes}; "
                f"shard the model over more cards or lower the batch size"
            )
        self._next_handle += 1
        handle = self._next_handle
        self._allocations[handle] = size
        self.used_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)
        return handle

    def free(self, handle: int) -> None:
        size = self._allocations.pop(handle, None)
        if size is not None:
            self.used_bytes -= size

    def empty(self, shape, dtype=np.float32, what: str = "tensor") -> np.ndarray:
        """A numpy array held in this card's HBM: allocation is checked against capacity and
        released when the array is garbage-collected."""
        array = np.empty(shape, dtype)
        self.adopt(array, what)
        return array

    def adopt(self, array: np.ndarray, what: str = "tensor") -> np.ndarray:
        """Count an existing array against HBM until it is collected (e.g. loaded weights)."""
        handle = self.malloc(array.nbytes, what)
        weakref.finalize(array, self.free, handle)
        return array

    # -- compute -----------------------------------------------------------------------------
    def kernel_time_s(self, flops: float, nbytes: float) -> float:
        """Roofline: the slower of compute and memory traffic, plus the launch overhead."""
        model = self.model
        return self.slow_factor * (max(flops / model.peak_fp16_flops, nbytes / model.hbm_bandwidth_Bps) + model.launch_overhead_s)

    def run(self, flops: float, nbytes: float) -> float:
        """Advance the clock by one kernel's modeled time; returns that time."""
        seconds = self.kernel_time_s(flops, nbytes)
        self.clock += seconds
        self.time.compute_s += seconds
        return seconds

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``a @ b`` (batched allowed): 2·m·n·k FLOPs, inputs and output through HBM."""
        out = np.matmul(a, b)
        k = a.shape[-1]
        self.run(2.0 * out.size * k, a.nbytes + b.nbytes + out.nbytes)
        return out

    def elementwise(self, fn: Callable[..., np.ndarray], *arrays: np.ndarray, flops_per_element: float = 1.0) -> np.ndarray:
        """``fn(*arrays)`` for a memory-bound elementwise kernel (GELU, add, scale, ...)."""
        out = fn(*arrays)
        self.run(flops_per_element * out.size, sum(a.nbytes for a in arrays) + out.nbytes)
        return out
