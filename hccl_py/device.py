"""The simulated NPU card each rank hosts: a modeled clock, HBM with an allocator that enforces
the card's capacity, and compute whose numpy result is real and whose modeled cost follows the
card's roofline.

    dev = comm.device
    w = dev.empty((256, 256), np.float32)      # counts against HBM; freed when w is collected
    y = dev.matmul(x, w)                        # real result; clock += max(flops/rate, bytes/BW) + launch
    h = dev.gelu(dev.linear(x, w, b))           # the layer helpers a model needs (linear, softmax,
                                                # layer_norm, gelu, embedding, mean), same roofline

With ``dry=True`` a card runs the cost model only: every kernel advances the clock exactly as it
would, but returns an uninitialised array of the right shape instead of computing it (planning,
cost estimates, and scaling sweeps that need modeled time without the arithmetic).
"""

from __future__ import annotations

import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from topology import CardModel

from .cost_model import cube_flops, kernel_s
from .errors import HcclMemoryError, HcclParamError

ALIGNMENT = 512  # HBM allocations are rounded up to 512 bytes, as the Ascend runtime does


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to the 512-byte HBM allocation granule."""
    return (nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


@dataclass
class DeviceTime:
    """Modeled seconds by kind, for reports: busy computing, moving data, waiting for peers, and
    how long the compute stream stood still at ``wait()`` for an asynchronous call (the part of
    that call's communication that compute did not hide)."""

    compute_s: float = 0.0
    comm_s: float = 0.0
    wait_s: float = 0.0
    exposed_s: float = 0.0


class Stream:
    """A queue of work on one card with its own modeled clock. A card computes on its compute
    stream (``Device.clock``) and runs a communicator's collectives on a stream apart, as a real
    card runs HCCL tasks; an asynchronous call advances only its stream, ``wait()`` joins them::

        work = comm.all_reduce(x, async_op=True)    # the communication stream moves on
        y = comm.device.matmul(a, b)                # the compute stream moves on meanwhile
        work.wait()                                 # compute clock = max(both)
    """

    __slots__ = ("name", "clock")

    def __init__(self, name: str, clock: float = 0.0):
        self.name = name
        self.clock = clock

    def __repr__(self) -> str:
        return f"Stream({self.name!r}, clock={self.clock!r})"


@dataclass
class Device:
    """One simulated card: ``model`` (a topology ``CardModel``), ``clock`` in modeled seconds."""

    model: CardModel
    rank: int = 0
    clock: float = 0.0
    slow_factor: float = 1.0  # > 1: a straggler card, its compute takes that much longer
    dry: bool = False  # True: kernels advance the clock but skip the arithmetic (see module doc)
    used_bytes: int = 0
    peak_bytes: int = 0
    time: DeviceTime = field(default_factory=DeviceTime)
    waited_for: dict[int, float] = field(default_factory=dict)  # world rank -> modeled seconds spent waiting for it
    # the part of time.wait_s that blocking calls waited for peers (asynchronous calls' waiting goes
    # on meanwhile): with time.exposed_s, what a timeline shows as a blocking call's wait
    blocking_wait_s: float = 0.0
    kernels: "deque | None" = None  # (name, modeled start, seconds) of recent kernels when tracing, else None
    _allocations: dict[int, int] = field(default_factory=dict)
    _next_handle: int = 0

    def wait_for(self, clock: float) -> None:
        """The compute stream stands still until ``clock`` (modeled) for communication it did not
        hide: an asynchronous call's end at ``wait``, or the end of the calls a blocking call
        follows on its stream. That stand-still is ``time.exposed_s``."""
        if clock > self.clock:
            self.time.exposed_s += clock - self.clock
            self.clock = clock

    # -- memory ------------------------------------------------------------------------------
    @property
    def capacity_bytes(self) -> int:
        """The card's HBM in bytes."""
        return self.model.hbm_bytes

    @property
    def free_bytes(self) -> int:
        """HBM bytes not yet allocated."""
        return self.capacity_bytes - self.used_bytes

    def malloc(self, nbytes: int, what: str = "buffer") -> int:
        """Reserve ``nbytes`` (rounded up to 512) of HBM; returns a handle for :meth:`free`."""
        if nbytes < 0:
            raise HcclParamError(f"device {self.rank}: cannot allocate {nbytes} bytes", rank=self.rank, allocation=what,
                                 requested=nbytes, rule="range", expected=">= 0")
        size = aligned(nbytes)
        if size > self.free_bytes:
            raise HcclMemoryError(
                f"device {self.rank} ({self.model.name}): out of memory allocating {what}: requested {size} bytes, "
                f"free {self.free_bytes} of {self.capacity_bytes}, peak so far {self.peak_bytes}; "
                f"shard the model over more cards or lower the batch size",
                rank=self.rank, allocation=what, requested=size, free=self.free_bytes, capacity=self.capacity_bytes,
                peak=self.peak_bytes,
            )
        self._next_handle += 1
        handle = self._next_handle
        self._allocations[handle] = size
        self.used_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)
        return handle

    def free(self, handle: int) -> None:
        """Release the allocation of a :meth:`malloc` handle; an unknown handle is ignored."""
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
    def kernel_time_s(self, flops: float, nbytes: float, dtype: "np.dtype | str | None" = None) -> float:
        """Modeled seconds of one kernel on this card (``cost_model.kernel_s``: the roofline at the
        peak of ``dtype`` (None: FP16) plus the launch overhead, times the card's slow factor)."""
        return kernel_s(self.model, flops, nbytes, self.slow_factor, _dtype_name(dtype))

    def run(self, flops: float, nbytes: float, dtype: "np.dtype | str | None" = None, name: str = "kernel") -> float:
        """Advance the compute stream's clock by one kernel's modeled time (computing in ``dtype``);
        returns that time. With ``kernels`` set (tracing), the kernel's span is kept for the trace."""
        seconds = self.kernel_time_s(flops, nbytes, dtype)
        if self.kernels is not None:
            self.kernels.append((name, self.clock, seconds))
        self.clock += seconds
        self.time.compute_s += seconds
        return seconds

    def _exec(self, compute: Callable[[], np.ndarray], spec: Callable[[], tuple[tuple[int, ...], np.dtype]]) -> np.ndarray:
        """One kernel's numpy result; on a ``dry`` card an uninitialised array of the
        ``(shape, dtype)`` that ``spec()`` gives."""
        if self.dry:
            shape, dtype = spec()
            return np.empty(shape, dtype)
        return compute()

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``a @ b`` (batched allowed): 2·m·n·k FLOPs in whole 16x16x16 cube tiles
        (``cost_model.cube_flops``) at the rate of the operands' dtype, inputs and output through HBM."""
        out = self._exec(lambda: np.matmul(a, b), lambda: (_matmul_shape(a.shape, b.shape), np.result_type(a, b)))
        self.run(_matmul_flops(a.shape, b.shape, out.shape), a.nbytes + b.nbytes + out.nbytes, out.dtype, "matmul")
        return out

    def elementwise(self, fn: Callable[..., np.ndarray], *arrays: np.ndarray, flops_per_element: float = 1.0) -> np.ndarray:
        """``fn(*arrays)`` for a memory-bound elementwise kernel (GELU, add, scale, ...).

        On a ``dry`` card the result takes the broadcast shape and result type of ``arrays``."""
        out = self._exec(lambda: fn(*arrays), lambda: (np.broadcast_shapes(*(a.shape for a in arrays)), np.result_type(*arrays)))
        self.run(flops_per_element * out.size, sum(a.nbytes for a in arrays) + out.nbytes, out.dtype, getattr(fn, "__name__", "elementwise"))
        return out

    # -- layer helpers: one fused kernel each, real numpy result, roofline cost ----------------
    def linear(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        """``x @ w + b`` as one kernel (bias fused): 2·m·k·n (+ m·n) FLOPs.

        >>> dev.linear(np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)).shape   # doctest: +SKIP
        (2, 4)
        """

        def compute() -> np.ndarray:
            out = np.matmul(x, w)
            if b is not None:
                out += b
            return out

        out = self._exec(compute, lambda: (_matmul_shape(x.shape, w.shape), np.result_type(x, w)))
        flops = _matmul_flops(x.shape, w.shape, out.shape) + (out.size if b is not None else 0)
        self.run(flops, x.nbytes + w.nbytes + (b.nbytes if b is not None else 0) + out.nbytes, out.dtype, "linear")
        return out

    def softmax(self, x: np.ndarray, axis: int = -1, scale: float = 1.0) -> np.ndarray:
        """``softmax(scale * x)`` along ``axis``, numerically stable (max subtracted): 5 FLOPs per
        element (scale, max, subtract, exp, divide; the sum rides along)."""

        def compute() -> np.ndarray:
            z = x * np.asarray(scale, x.dtype) if scale != 1.0 else x.copy()
            z -= z.max(axis=axis, keepdims=True)
            np.exp(z, out=z)
            z /= z.sum(axis=axis, keepdims=True)
            return z

        out = self._exec(compute, lambda: (x.shape, x.dtype))
        self.run(5.0 * out.size, x.nbytes + out.nbytes, out.dtype, "softmax")
        return out

    def layer_norm(self, x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = 1e-5) -> np.ndarray:
        """LayerNorm over the last axis: ``(x - mean) / sqrt(var + eps) * gamma + beta``;
        8 FLOPs per element (mean, centre, square, variance, normalise, scale, shift)."""

        def compute() -> np.ndarray:
            mean = x.mean(axis=-1, keepdims=True)
            centred = x - mean
            var = np.mean(centred * centred, axis=-1, keepdims=True)
            centred /= np.sqrt(var + np.asarray(eps, x.dtype))
            centred *= gamma
            centred += beta
            return centred

        out = self._exec(compute, lambda: (x.shape, np.result_type(x, gamma, beta)))
        self.run(8.0 * out.size, x.nbytes + gamma.nbytes + beta.nbytes + out.nbytes, out.dtype, "layer_norm")
        return out

    def gelu(self, x: np.ndarray) -> np.ndarray:
        """GELU, tanh form (as BERT/GPT-2): ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))``;
        10 FLOPs per element."""

        def compute() -> np.ndarray:
            c = np.asarray(np.sqrt(2.0 / np.pi), x.dtype)
            inner = x * x
            inner *= np.asarray(0.044715, x.dtype)
            inner += 1
            inner *= x
            inner *= c
            np.tanh(inner, out=inner)
            inner += 1
            inner *= x
            inner *= np.asarray(0.5, x.dtype)
            return inner

        out = self._exec(compute, lambda: (x.shape, x.dtype))
        self.run(10.0 * out.size, x.nbytes + out.nbytes, out.dtype, "gelu")
        return out

    def embedding(self, table: np.ndarray, ids: np.ndarray, positions: np.ndarray | None = None) -> np.ndarray:
        """Row gather ``table[ids]`` (+ ``positions[:seq]`` broadcast over the batch, fused):
        memory-bound, reads the gathered rows and the ids, writes the result."""
        shape = (*ids.shape, table.shape[-1])

        def compute() -> np.ndarray:
            out = np.take(table, ids, axis=0)
            if positions is not None:
                out += positions[: ids.shape[-1]]
            return out

        out = self._exec(compute, lambda: (shape, table.dtype))
        used = positions[: ids.shape[-1]].nbytes if positions is not None else 0
        self.run(float(out.size) if positions is not None else 0.0, 2 * out.nbytes + ids.nbytes + used, out.dtype, "embedding")
        return out

    def mean(self, x: np.ndarray, axis: int) -> np.ndarray:
        """``x.mean(axis)`` (e.g. pooling over the sequence): one FLOP per input element."""
        shape = x.shape[:axis % x.ndim] + x.shape[axis % x.ndim + 1:]
        out = self._exec(lambda: x.mean(axis=axis, dtype=x.dtype), lambda: (shape, x.dtype))
        self.run(float(x.size), x.nbytes + out.nbytes, out.dtype, "mean")
        return out


def _dtype_name(dtype) -> str | None:
    return None if dtype is None else np.dtype(dtype).name


def _matmul_flops(a: tuple[int, ...], b: tuple[int, ...], out: tuple[int, ...]) -> float:
    """Cube FLOPs of ``np.matmul`` with operand shapes ``a``, ``b`` and result shape ``out``."""
    m = a[-2] if len(a) > 1 else 1
    n = b[-1] if len(b) > 1 else 1
    k = a[-1]
    batch = int(np.prod(out[:-2])) if len(out) > 2 else 1
    return cube_flops(m, n, k, batch)


def _matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of ``np.matmul`` of operands with shapes ``a`` and ``b`` (numpy's rules)."""
    if len(a) == 1 and len(b) == 1:
        return ()
    if len(a) == 1:
        return (*b[:-2], b[-1])
    if len(b) == 1:
        return a[:-1]
    return (*np.broadcast_shapes(a[:-2], b[:-2]), a[-2], b[-1])
