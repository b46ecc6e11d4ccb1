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

Operands are checked before anything is computed or charged, on real and dry cards alike: a
kernel takes numpy arrays (not lists) of numbers, of shapes that fit (a matmul's inner axes, a
bias that broadcasts onto the result, ...); anything else raises HcclParamError naming the
argument and the shapes or dtype (``err.arg``, ``err.value``, ``err.rule``, ``err.expected``).
"""

from __future__ import annotations

import math
import numbers
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from topology import CardModel

from ..errors import HcclMemoryError, HcclParamError
from .cost_model import cube_flops, kernel_s

ALIGNMENT = 512  # HBM allocations are rounded up to 512 bytes, as the Ascend runtime does


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to the 512-byte HBM allocation granule."""
    return (nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


@dataclass
class DeviceTime:
    """Modeled seconds by kind, for reports: busy computing (kernels, and the runtime's own work on
    the compute stream), moving data (collectives, copies to and from the host), waiting for peers, and
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


# A torch npu stream as C sees it (torch_npu's ``npu_stream``, an aclrtStream): a tag, the card and
# torch's stream id in one integer, which HCCL's C API (hccl_py.capi) resolves to the same stream.
_STREAM_TAG = 0x4E5 << 48  # "NP"; far above any address or handle the C API hands out


def stream_handle(device: int, stream_id: int) -> int:
    """The aclrtStream of torch's stream ``stream_id`` on card ``device``::

    stream_handle(1, 0)     # 0x4e50001_00000000: card 1's default stream
    """
    return _STREAM_TAG | (device & 0xFFFF) << 32 | (stream_id & 0xFFFFFFFF)


def stream_of_handle(handle: int) -> tuple[int, int] | None:
    """(card, torch stream id) of a :func:`stream_handle`, or None for any other value."""
    if handle >> 48 != _STREAM_TAG >> 48:
        return None
    stream_id = handle & 0xFFFFFFFF
    return (handle >> 32) & 0xFFFF, stream_id - (1 << 32) if stream_id >= 1 << 31 else stream_id


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
        _check_text("malloc", "what", what)
        if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral):
            raise HcclParamError(
                f"device {self.rank}: malloc(nbytes={nbytes!r}): nbytes must be an int (a count of bytes)",
                rank=self.rank,
                allocation=what,
                arg="nbytes",
                value=repr(nbytes),
                rule="type",
                expected="int",
            )
        nbytes = int(nbytes)
        if nbytes < 0:
            raise HcclParamError(
                f"device {self.rank}: cannot allocate {nbytes} bytes",
                rank=self.rank,
                allocation=what,
                requested=nbytes,
                rule="range",
                expected=">= 0",
            )
        size = aligned(nbytes)
        if size > self.free_bytes:
            raise HcclMemoryError(
                f"device {self.rank} ({self.model.name}): out of memory allocating {what}: requested {size} bytes, "
                f"free {self.free_bytes} of {self.capacity_bytes}, peak so far {self.peak_bytes}; "
                f"shard the model over more cards or lower the batch size",
                rank=self.rank,
                allocation=what,
                requested=size,
                free=self.free_bytes,
                capacity=self.capacity_bytes,
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
        """A numpy array held in this card's HBM: allocation is checked against capacity (before the
        host allocates anything) and released when the array is garbage-collected."""
        shape = _checked_shape(shape)
        try:
            dtype = np.dtype(dtype)
        except TypeError:
            raise HcclParamError(
                f"device.empty: dtype={dtype!r} is not a numpy dtype; give one such as np.float32",
                arg="dtype",
                value=repr(dtype),
                rule="type",
                expected="numpy dtype",
            ) from None
        handle = self.malloc(math.prod(shape) * dtype.itemsize, what)
        try:
            array = np.empty(shape, dtype)
        except (MemoryError, ValueError) as err:  # fits the card's HBM, not this host's memory
            self.free(handle)
            raise HcclMemoryError(
                f"device {self.rank}: the host cannot hold {what} of shape {shape} {dtype.name} "
                f"({math.prod(shape) * dtype.itemsize} bytes) that the card's HBM has room for: {err}; "
                "use a smaller shape or a dry card (Device(dry=True)) to model it without the memory",
                rank=self.rank,
                allocation=what,
                requested=math.prod(shape) * dtype.itemsize,
            ) from None
        weakref.finalize(array, self.free, handle)
        return array

    def adopt(self, array: np.ndarray, what: str = "tensor") -> np.ndarray:
        """Count an existing array against HBM until it is collected (e.g. loaded weights)."""
        _operand("adopt", "array", array, numeric=False)
        handle = self.malloc(array.nbytes, what)
        weakref.finalize(array, self.free, handle)
        return array

    # -- compute -----------------------------------------------------------------------------
    def kernel_time_s(self, flops: float, nbytes: float, dtype: "np.dtype | str | None" = None) -> float:
        """Modeled seconds of one kernel on this card (``cost_model.kernel_s``: the roofline at the
        peak of ``dtype`` (None: FP16) plus the launch overhead, times the card's slow factor)."""
        _check_amount("kernel_time_s", "flops", flops)
        _check_amount("kernel_time_s", "nbytes", nbytes)
        return kernel_s(self.model, flops, nbytes, self.slow_factor, _dtype_name(dtype))

    def run(self, flops: float, nbytes: float, dtype: "np.dtype | str | None" = None, name: str = "kernel") -> float:
        """Advance the compute stream's clock by one kernel's modeled time (computing in ``dtype``);
        returns that time. With ``kernels`` set (tracing), the kernel's span is kept for the trace."""
        _check_text("run", "name", name)
        seconds = self.kernel_time_s(flops, nbytes, dtype)
        if self.kernels is not None:
            self.kernels.append((name, self.clock, seconds))
        self.clock += seconds
        self.time.compute_s += seconds
        return seconds

    def occupy(self, seconds: float, name: str, *, moving: bool = False) -> float:
        """Advance the compute stream's clock by ``seconds`` of work that is not a kernel: a copy
        between host memory and the card (``moving``: counted as moving data, ``time.comm_s``),
        or the runtime's own work on the stream, such as reserving a memory segment
        (``time.compute_s``). Traced as a span named ``name``, as kernels are; returns ``seconds``."""
        _check_text("occupy", "name", name)
        _check_amount("occupy", "seconds", seconds)
        if self.kernels is not None:
            self.kernels.append((name, self.clock, seconds))
        self.clock += seconds
        if moving:
            self.time.comm_s += seconds
        else:
            self.time.compute_s += seconds
        return seconds

    def _exec(
        self, compute: Callable[[], np.ndarray], spec: Callable[[], tuple[tuple[int, ...], np.dtype]]
    ) -> np.ndarray:
        """One kernel's numpy result; on a ``dry`` card an uninitialised array of the
        ``(shape, dtype)`` that ``spec()`` gives."""
        if self.dry:
            shape, dtype = spec()
            return np.empty(shape, dtype)
        return compute()

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``a @ b`` (batched allowed): 2·m·n·k FLOPs in whole 16x16x16 cube tiles
        (``cost_model.cube_flops``) at the rate of the operands' dtype, inputs and output through HBM."""
        shape = _matmul_shape("matmul", ("a", _operand("matmul", "a", a)), ("b", _operand("matmul", "b", b)))
        out = self._exec(lambda: np.matmul(a, b), lambda: (shape, np.result_type(a, b)))
        self.run(_matmul_flops(a.shape, b.shape, out.shape), a.nbytes + b.nbytes + out.nbytes, out.dtype, "matmul")
        return out

    def elementwise(
        self, fn: Callable[..., np.ndarray], *arrays: np.ndarray, flops_per_element: float = 1.0
    ) -> np.ndarray:
        """``fn(*arrays)`` for a memory-bound elementwise kernel (GELU, add, scale, ...).

        On a ``dry`` card the result takes the broadcast shape and result type of ``arrays``."""
        if not callable(fn):
            raise HcclParamError(
                f"device.elementwise: fn must be a function of the arrays (e.g. np.add), got {type(fn).__name__}",
                arg="fn",
                value=repr(fn),
                rule="type",
                expected="callable",
            )
        if not arrays:
            raise HcclParamError("device.elementwise: give at least one array for fn", arg="arrays", rule="required")
        for i, a in enumerate(arrays):
            _operand("elementwise", f"arrays[{i}]", a)
        _check_amount("elementwise", "flops_per_element", flops_per_element)
        shape = _broadcast("elementwise", [(f"arrays[{i}]", a) for i, a in enumerate(arrays)])
        out = self._exec(lambda: np.asanyarray(fn(*arrays)), lambda: (shape, np.result_type(*arrays)))
        self.run(
            flops_per_element * out.size,
            sum(a.nbytes for a in arrays) + out.nbytes,
            out.dtype,
            getattr(fn, "__name__", "elementwise"),
        )
        return out

    # -- layer helpers: one fused kernel each, real numpy result, roofline cost ----------------
    def linear(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        """``x @ w + b`` as one kernel (bias fused): 2·m·k·n (+ m·n) FLOPs.

        >>> dev.linear(np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)).shape   # doctest: +SKIP
        (2, 4)
        """
        shape = _matmul_shape("linear", ("x", _operand("linear", "x", x)), ("w", _operand("linear", "w", w)))
        if b is not None:
            _bias("linear", "b", _operand("linear", "b", b), shape, np.result_type(x, w))

        def compute() -> np.ndarray:
            out = np.matmul(x, w)
            if b is not None:
                out += b
            return out

        out = self._exec(compute, lambda: (shape, np.result_type(x, w)))
        flops = _matmul_flops(x.shape, w.shape, out.shape) + (out.size if b is not None else 0)
        self.run(flops, x.nbytes + w.nbytes + (b.nbytes if b is not None else 0) + out.nbytes, out.dtype, "linear")
        return out

    def softmax(self, x: np.ndarray, axis: int = -1, scale: float = 1.0) -> np.ndarray:
        """``softmax(scale * x)`` along ``axis``, numerically stable (max subtracted): 5 FLOPs per
        element (scale, max, subtract, exp, divide; the sum rides along)."""
        _operand("softmax", "x", x, floating=True)
        _check_axis("softmax", x, axis)
        _check_number("softmax", "scale", scale)

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
        _operand("layer_norm", "x", x, floating=True)
        if x.ndim == 0:
            raise HcclParamError(
                "device.layer_norm: x is a 0-d array; it normalises over the last axis, give at least 1-D",
                arg="x",
                value=[],
                rule="shape",
                expected="at least 1-D",
            )
        _bias("layer_norm", "gamma", _operand("layer_norm", "gamma", gamma), x.shape, x.dtype)
        _bias("layer_norm", "beta", _operand("layer_norm", "beta", beta), x.shape, x.dtype)
        _check_amount("layer_norm", "eps", eps)

        def compute() -> np.ndarray:
            mean = x.mean(axis=-1, keepdims=True)
            centred = x - mean
            var = np.mean(centred * centred, axis=-1, keepdims=True)
            centred /= np.sqrt(var + np.asarray(eps, x.dtype))
            centred *= gamma
            centred += beta
            return centred

        out = self._exec(compute, lambda: (x.shape, x.dtype))  # gamma and beta scale x in place
        self.run(8.0 * out.size, x.nbytes + gamma.nbytes + beta.nbytes + out.nbytes, out.dtype, "layer_norm")
        return out

    def gelu(self, x: np.ndarray) -> np.ndarray:
        """GELU, tanh form (as BERT/GPT-2): ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))``;
        10 FLOPs per element."""
        _operand("gelu", "x", x, floating=True)

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
        self._check_embedding(table, ids, positions)
        shape = (*ids.shape, table.shape[-1])

        def compute() -> np.ndarray:
            out = np.take(table, ids, axis=0)
            if positions is not None:
                out += positions[: ids.shape[-1]]
            return out

        out = self._exec(compute, lambda: (shape, table.dtype))
        used = positions[: ids.shape[-1]].nbytes if positions is not None else 0
        self.run(
            float(out.size) if positions is not None else 0.0,
            2 * out.nbytes + ids.nbytes + used,
            out.dtype,
            "embedding",
        )
        return out

    def mean(self, x: np.ndarray, axis: int) -> np.ndarray:
        """``x.mean(axis)`` (e.g. pooling over the sequence): one FLOP per input element."""
        _operand("mean", "x", x)
        _check_axis("mean", x, axis)
        shape = x.shape[: axis % x.ndim] + x.shape[axis % x.ndim + 1 :]
        out = self._exec(lambda: x.mean(axis=axis, dtype=x.dtype), lambda: (shape, x.dtype))
        self.run(float(x.size), x.nbytes + out.nbytes, out.dtype, "mean")
        return out

    def _check_embedding(self, table, ids, positions) -> None:
        _operand("embedding", "table", table)
        if table.ndim != 2:
            raise HcclParamError(
                f"device.embedding: table has shape {table.shape}; it must be 2-D (rows, hidden)",
                arg="table",
                value=list(table.shape),
                rule="shape",
                expected="(rows, hidden)",
            )
        _operand("embedding", "ids", ids, numeric=False)
        if ids.dtype.kind not in "iu":
            raise HcclParamError(
                f"device.embedding: ids has dtype {ids.dtype.name}; row ids are integers (e.g. np.int64)",
                arg="ids",
                value=ids.dtype.name,
                dtype=ids.dtype.name,
                rule="dtype",
                expected="an integer dtype",
            )
        if ids.size and not self.dry:  # a dry card's ids are not computed: nothing to check
            low, high = int(ids.min()), int(ids.max())
            if low < 0 or high >= table.shape[0]:
                bad = low if low < 0 else high
                raise HcclParamError(
                    f"device.embedding: ids holds {bad}, but table has {table.shape[0]} rows (ids 0.."
                    f"{table.shape[0] - 1})" + ("; a negative id is not counted from the end here" if bad < 0 else ""),
                    arg="ids",
                    value=bad,
                    rule="range",
                    expected=f"0..{table.shape[0] - 1}",
                )
        if positions is None:
            return
        _operand("embedding", "positions", positions)
        seq = ids.shape[-1] if ids.ndim else 0
        if ids.ndim == 0 or positions.ndim != 2 or positions.shape[0] < seq or positions.shape[1] != table.shape[1]:
            raise HcclParamError(
                f"device.embedding: positions of shape {positions.shape} do not fit ids of shape {ids.shape} "
                f"and table of shape {table.shape}: positions must be (at least {max(seq, 1)}, "
                f"{table.shape[1]}), one row per position along the ids' last axis",
                arg="positions",
                value=list(positions.shape),
                rule="shape",
                expected=[max(seq, 1), table.shape[1]],
            )
        _bias("embedding", "positions", positions, (*ids.shape, table.shape[1]), table.dtype, check_shape=False)


def _dtype_name(dtype) -> str | None:
    if dtype is None:
        return None
    try:
        return np.dtype(dtype).name
    except TypeError:
        raise HcclParamError(
            f"device: dtype={dtype!r} is not a numpy dtype",
            arg="dtype",
            value=repr(dtype),
            rule="type",
            expected="numpy dtype",
        ) from None


def _is_numeric(dtype: np.dtype, floating: bool = False) -> bool:
    if dtype.name == "bfloat16":  # ml_dtypes' (kind "V")
        return True
    return dtype.kind == "f" if floating else dtype.kind in "biufc"


def _operand(what: str, arg: str, value, *, numeric: bool = True, floating: bool = False) -> np.ndarray:
    """``value`` when it is a numpy array (of numbers with ``numeric``, of floating-point numbers with
    ``floating``); HcclParamError naming ``arg`` of kernel ``what`` otherwise."""
    if not isinstance(value, np.ndarray):
        raise HcclParamError(
            f"device.{what}: {arg} must be a numpy.ndarray, got {type(value).__name__}; a card computes "
            f"on arrays: convert it first (np.asarray)",
            arg=arg,
            value=type(value).__name__,
            rule="type",
            expected="numpy.ndarray",
        )
    if (numeric or floating) and not _is_numeric(value.dtype, floating):
        kinds = "floating-point numbers (float16, bfloat16, float32, float64)" if floating else "numbers"
        raise HcclParamError(
            f"device.{what}: {arg} has dtype {value.dtype.name}; {what} computes on {kinds}: cast it first "
            f"({arg}.astype(np.float32))",
            arg=arg,
            value=value.dtype.name,
            dtype=value.dtype.name,
            rule="dtype",
            expected="floating-point dtype" if floating else "numeric dtype",
        )
    return value


def _check_amount(what: str, arg: str, value) -> None:
    """``value`` is a finite real number >= 0 (FLOPs, bytes, an epsilon)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise HcclParamError(
            f"device.{what}: {arg}={value!r} must be a number",
            arg=arg,
            value=repr(value),
            rule="type",
            expected="number >= 0",
        )
    if not 0 <= value < math.inf:  # nan fails too
        raise HcclParamError(
            f"device.{what}: {arg}={value!r} must be a finite number >= 0",
            arg=arg,
            value=float(value),
            rule="range",
            expected="finite, >= 0",
        )


def _check_number(what: str, arg: str, value) -> None:
    """``value`` is a finite real number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise HcclParamError(
            f"device.{what}: {arg}={value!r} must be a finite number",
            arg=arg,
            value=repr(value),
            rule="type" if not isinstance(value, numbers.Real) else "range",
            expected="finite number",
        )


def _check_text(what: str, arg: str, value) -> None:
    if not isinstance(value, str):
        raise HcclParamError(
            f"device.{what}: {arg} must be a str (it names the allocation or kernel in reports), got "
            f"{type(value).__name__}",
            arg=arg,
            value=repr(value),
            rule="type",
            expected="str",
        )


def _check_axis(what: str, x: np.ndarray, axis) -> None:
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise HcclParamError(
            f"device.{what}: axis={axis!r} must be an int", arg="axis", value=repr(axis), rule="type", expected="int"
        )
    if not -x.ndim <= axis < x.ndim:
        raise HcclParamError(
            f"device.{what}: axis {axis} is out of range for x of shape {x.shape} "
            f"({x.ndim}-D: axes {-x.ndim}..{x.ndim - 1})"
            if x.ndim
            else f"device.{what}: x is a 0-d array, which has no axis {axis}; give at least 1-D",
            arg="axis",
            value=int(axis),
            rule="range",
            expected=f"{-x.ndim}..{x.ndim - 1}" if x.ndim else "an array of at least 1-D",
        )


def _checked_shape(shape) -> tuple[int, ...]:
    """``shape`` (an int or a sequence of ints >= 0) as a tuple; HcclParamError otherwise."""
    dims = (shape,) if isinstance(shape, numbers.Integral) else shape
    try:
        dims = tuple(dims)
    except TypeError:
        dims = None
    if dims is None or any(isinstance(d, bool) or not isinstance(d, numbers.Integral) for d in dims):
        raise HcclParamError(
            f"device.empty: shape={shape!r} must be an int or a tuple of ints",
            arg="shape",
            value=repr(shape),
            rule="type",
            expected="tuple of ints",
        )
    if any(d < 0 for d in dims):
        raise HcclParamError(
            f"device.empty: shape {shape!r} has a negative dimension",
            arg="shape",
            value=[int(d) for d in dims],
            rule="range",
            expected="dimensions >= 0",
        )
    return tuple(int(d) for d in dims)


def _broadcast(what: str, named: list[tuple[str, np.ndarray]]) -> tuple[int, ...]:
    """The broadcast shape of the named arrays; HcclParamError naming their shapes when they do not broadcast."""
    try:
        return np.broadcast_shapes(*(a.shape for _, a in named))
    except ValueError:
        listed = ", ".join(f"{name} {a.shape}" for name, a in named)
        raise HcclParamError(
            f"device.{what}: the shapes do not broadcast together: {listed}",
            arg=", ".join(n for n, _ in named),
            value=[list(a.shape) for _, a in named],
            rule="shape",
            expected="shapes that broadcast",
        ) from None


def _bias(
    what: str, arg: str, b: np.ndarray, shape: tuple[int, ...], dtype: np.dtype, *, check_shape: bool = True
) -> None:
    """``b`` is added into (or scales) a result of ``shape`` and ``dtype`` in place: it must broadcast
    onto that shape without growing it and cast to that dtype."""
    if check_shape:
        try:
            fits = np.broadcast_shapes(shape, b.shape) == tuple(shape)
        except ValueError:
            fits = False
        if not fits:
            raise HcclParamError(
                f"device.{what}: {arg} of shape {b.shape} does not broadcast onto the result's shape "
                f"{tuple(shape)}; give it the result's trailing axes (e.g. {tuple(shape[-1:])})",
                arg=arg,
                value=list(b.shape),
                rule="shape",
                expected=list(shape),
            )
    if not np.can_cast(b.dtype, dtype, "same_kind") and not (_is_numeric(b.dtype) and dtype.name == "bfloat16"):
        raise HcclParamError(
            f"device.{what}: {arg} has dtype {b.dtype.name}, which the result's {np.dtype(dtype).name} cannot "
            f"take in place; cast {arg} first ({arg}.astype(np.{np.dtype(dtype).name}))",
            arg=arg,
            value=b.dtype.name,
            dtype=b.dtype.name,
            rule="dtype",
            expected=np.dtype(dtype).name,
        )


def _matmul_flops(a: tuple[int, ...], b: tuple[int, ...], out: tuple[int, ...]) -> float:
    """Cube FLOPs of ``np.matmul`` with operand shapes ``a``, ``b`` and result shape ``out``."""
    m = a[-2] if len(a) > 1 else 1
    n = b[-1] if len(b) > 1 else 1
    k = a[-1]
    batch = int(np.prod(out[:-2])) if len(out) > 2 else 1
    return cube_flops(m, n, k, batch)


def _matmul_shape(what: str, left: tuple[str, np.ndarray], right: tuple[str, np.ndarray]) -> tuple[int, ...]:
    """The shape of ``np.matmul`` of two (name, array) operands (numpy's rules); HcclParamError
    naming both shapes when they do not multiply."""
    (na, x), (nb, y) = left, right
    a, b = x.shape, y.shape
    if not a or not b:
        name = na if not a else nb
        raise HcclParamError(
            f"device.{what}: {name} is a 0-d array (a scalar); a matmul needs operands of at least 1-D "
            f"(multiply by a scalar with device.elementwise)",
            arg=name,
            value=[],
            rule="shape",
            expected="at least 1-D",
        )
    k_a, k_b = a[-1], (b[-2] if len(b) > 1 else b[0])
    if k_a != k_b:
        raise HcclParamError(
            f"device.{what}: {na} of shape {a} and {nb} of shape {b} do not multiply: {na}'s last axis "
            f"({k_a}) must equal {nb}'s {'second-to-last' if len(b) > 1 else 'only'} axis ({k_b})",
            arg=f"{na}, {nb}",
            value=[list(a), list(b)],
            rule="shape",
            expected=f"{na} (..., m, k) with {nb} (..., k, n)",
        )
    try:
        np.broadcast_shapes(a[:-2], b[:-2])
    except ValueError:
        raise HcclParamError(
            f"device.{what}: {na} of shape {a} and {nb} of shape {b}: the batch axes {a[:-2]} and "
            f"{b[:-2]} do not broadcast together",
            arg=f"{na}, {nb}",
            value=[list(a), list(b)],
            rule="shape",
            expected="batch axes that broadcast",
        ) from None
    if len(a) == 1 and len(b) == 1:
        return ()
    if len(a) == 1:
        return (*b[:-2], b[-1])
    if len(b) == 1:
        return a[:-1]
    return (*np.broadcast_shapes(a[:-2], b[:-2]), a[-2], b[-1])
