"""A model the parallel drivers can run: a stack of *blocks* whose every kernel goes through a
simulated card, with its weights and activations held in that card's HBM.

A block is the unit a pipeline can cut between (the embedding, one encoder layer, the head).
Weights come from a seed (each tensor from its own generator, keyed by its name, so any subset of
blocks materialises the same values) or from a user's ``.npz`` file whose keys are the tensor
names (``model.param_shapes()`` lists them; ``model.save_npz(path)`` writes a valid file)::

    model = TransformerEncoder(TransformerConfig(layers=2, d_model=64, heads=4, seq_len=16))
    shard = model.load(comm.device)              # every weight reserved in HBM, then created
    logits = shard.forward(model.sample_inputs(8))
    part = model.load(comm.device, blocks=range(0, 2))   # a pipeline stage: the first two blocks

HBM is reserved *before* a tensor is created, so a model that does not fit raises the card's
:class:`~hccl_py.HcclMemoryError` without touching host memory. On a ``dry`` card (see
``hccl_py.modeled.card``) weights are left uninitialised and kernels only advance the clock.

The first ``load`` in a rank process limits numpy's BLAS threads to cores / ranks on the host
(``blas.py``), unless ``OPENBLAS_NUM_THREADS`` or the like is set.
"""

from __future__ import annotations

import dataclasses
import weakref
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from topology import CARD_MODELS, CardModel

from ..errors import HcclParamError
from ..modeled.card import Device
from .blas import auto_limit
from .timeline import Timeline

UNLIMITED_HBM = 1 << 62  # the planning card of cost estimates: no capacity check
_SHAPE_CARD = CARD_MODELS["ascend910"]  # any card: shapes only


@dataclass(frozen=True)
class ParamSpec:
    """One weight tensor of a block: ``name`` (relative to the block's prefix), ``shape`` and how
    a seed initialises it: ``normal`` (std ``scale``), ``ones`` or ``zeros``."""

    name: str
    shape: tuple[int, ...]
    init: str = "normal"
    scale: float = 1.0


class Ops:
    """A card's kernels whose results are held in that card's HBM (adopted, so the memory peak
    counts live activations): ``ops.linear(x, w, b)``, ``ops.gelu(h)``, ... as on ``Device``."""

    __slots__ = ("device",)

    def __init__(self, device: Device):
        self.device = device

    def _keep(self, array: np.ndarray) -> np.ndarray:
        return self.device.adopt(array, "activation")

    def linear(self, x, w, b=None):
        """``x @ w + b`` (``Device.linear``), the result counted in HBM."""
        return self._keep(self.device.linear(x, w, b))

    def matmul(self, a, b):
        """``a @ b`` (``Device.matmul``, batched allowed), the result counted in HBM."""
        return self._keep(self.device.matmul(a, b))

    def softmax(self, x, axis=-1, scale=1.0):
        """``softmax(scale * x)`` along ``axis`` (``Device.softmax``), the result counted in HBM."""
        return self._keep(self.device.softmax(x, axis, scale))

    def layer_norm(self, x, gamma, beta, eps=1e-5):
        """LayerNorm over the last axis (``Device.layer_norm``), the result counted in HBM."""
        return self._keep(self.device.layer_norm(x, gamma, beta, eps))

    def gelu(self, x):
        """GELU, tanh form (``Device.gelu``), the result counted in HBM."""
        return self._keep(self.device.gelu(x))

    def embedding(self, table, ids, positions=None):
        """``table[ids]`` plus ``positions[:seq]`` (``Device.embedding``), the result counted in HBM."""
        return self._keep(self.device.embedding(table, ids, positions))

    def mean(self, x, axis):
        """``x.mean(axis)`` (``Device.mean``), the result counted in HBM."""
        return self._keep(self.device.mean(x, axis))

    def add(self, a, b):
        """``a + b`` as an elementwise kernel, the result counted in HBM."""
        return self._keep(self.device.elementwise(np.add, a, b))

    def elementwise(self, fn, *arrays, flops_per_element: float = 1.0):
        """``fn(*arrays)`` as a memory-bound kernel (``Device.elementwise``), the result counted in HBM."""
        return self._keep(self.device.elementwise(fn, *arrays, flops_per_element=flops_per_element))


class Block:
    """One pipeline-cuttable unit: ``prefix`` names its weights (``layers.3``), ``params`` lists
    them, ``forward(ops, p, x)`` computes it with ``p`` mapping param names to arrays."""

    prefix: str = ""
    params: tuple[ParamSpec, ...] = ()

    def forward(self, ops: Ops, p: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
        """The block's output for input ``x``, every kernel through ``ops`` (subclasses)."""
        raise NotImplementedError

    def key(self, name: str) -> str:
        """The model-wide key of this block's weight ``name``: ``layers.3.attn.qkv.weight``."""
        return f"{self.prefix}.{name}" if self.prefix else name


class Model:
    """A stack of blocks with deterministic weights. Subclasses give the blocks and the inputs."""

    name = "model"

    def __init__(
        self,
        blocks: Sequence[Block],
        *,
        seed: int = 0,
        weights: "str | Path | Mapping[str, np.ndarray] | None" = None,
        dtype=np.float32,
    ):
        self.blocks = tuple(blocks)
        self.seed = int(seed)
        self.dtype = np.dtype(dtype)
        self._weights = None
        self._weights_source = None
        if weights is not None:
            self._weights = np.load(weights) if isinstance(weights, (str, Path)) else weights
            self._weights_source = str(weights) if isinstance(weights, (str, Path)) else "a mapping"
            self._check_keys()
        self._estimates: dict[tuple, tuple[list[float], list[tuple[tuple[int, ...], np.dtype]]]] = {}

    # -- description --------------------------------------------------------------------------
    @property
    def block_names(self) -> list[str]:
        """Each block's prefix, in order (``["embed", "layers.0", ...]``)."""
        return [b.prefix for b in self.blocks]

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight's key and shape, in block order: the ``.npz`` format."""
        return {b.key(s.name): s.shape for b in self.blocks for s in b.params}

    def param_bytes(self, blocks: Iterable[int] | None = None) -> int:
        """Bytes of the weights of ``blocks`` (indices; all by default) in the model's dtype."""
        chosen = range(len(self.blocks)) if blocks is None else blocks
        return sum(int(np.prod(s.shape)) * self.dtype.itemsize for i in chosen for s in self.blocks[i].params)

    def describe(self) -> str:
        """One line for reports: the model, its size and its weights' MiB."""
        return f"{self.name}: {len(self.blocks)} blocks, {self.param_bytes() / 2**20:.1f} MiB of weights"

    # -- inputs (subclasses) ------------------------------------------------------------------
    def input_spec(self, batch: int) -> tuple[tuple[int, ...], np.dtype]:
        """(shape, dtype) of the input for a batch of ``batch`` (subclasses)."""
        raise NotImplementedError

    def sample_inputs(self, batch: int, seed: int = 1234) -> np.ndarray:
        """A deterministic input batch of ``batch`` from ``seed``, the same on every rank (subclasses)."""
        raise NotImplementedError

    # -- weights --------------------------------------------------------------------------------
    def _check_keys(self) -> None:
        expected = self.param_shapes()
        present = set(getattr(self._weights, "files", None) or self._weights.keys())
        missing = [k for k in expected if k not in present]
        extra = sorted(present - set(expected))
        if missing or extra:
            raise HcclParamError(
                f"weights from {self._weights_source} do not match {self.name}: "
                + (f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}" if missing else "")
                + ("; " if missing and extra else "")
                + (f"unexpected {extra[:5]}{' ...' if len(extra) > 5 else ''}" if extra else "")
                + "; model.param_shapes() lists the expected keys and shapes",
                missing_keys=missing,
                unexpected_keys=extra,
            )

    def _make(self, block: Block, spec: ParamSpec) -> np.ndarray:
        key = block.key(spec.name)
        if self._weights is not None:
            array = np.asarray(self._weights[key])
            if array.shape != spec.shape:
                raise HcclParamError(
                    f"weight {key!r} from {self._weights_source} has shape {array.shape}, "
                    f"{self.name} expects {spec.shape}",
                    key=key,
                    value=list(array.shape),
                    rule="shape",
                    expected=list(spec.shape),
                )
            return np.array(array, dtype=self.dtype)  # own copy, in the model's dtype
        if spec.init == "ones":
            return np.ones(spec.shape, self.dtype)
        if spec.init == "zeros":
            return np.zeros(spec.shape, self.dtype)
        rng = np.random.default_rng([self.seed, zlib.crc32(key.encode())])
        return (rng.standard_normal(spec.shape, np.float32) * np.float32(spec.scale)).astype(self.dtype, copy=False)

    def weights(self) -> dict[str, np.ndarray]:
        """Every weight as a host array (not on any card)."""
        return {b.key(s.name): self._make(b, s) for b in self.blocks for s in b.params}

    def save_npz(self, path: str | Path) -> None:
        """Write the weights in the ``.npz`` format ``weights=`` accepts."""
        np.savez(path, **self.weights())

    def load(self, device: Device, blocks: Iterable[int] | None = None) -> "ModelShard":
        """Place ``blocks`` (all by default; a ``range`` for a pipeline stage) on ``device``.

        Each weight's HBM is reserved before the tensor is created: a model that does not fit
        raises ``HcclMemoryError`` naming the tensor, the requested and the free bytes.
        """
        auto_limit()  # ranks share the host's cores: see blas.py
        chosen = list(range(len(self.blocks)) if blocks is None else blocks)
        if (
            not chosen
            or chosen != list(range(chosen[0], chosen[-1] + 1))
            or not 0 <= chosen[0] <= chosen[-1] < len(self.blocks)
        ):
            raise HcclParamError(
                f"load: blocks must be a non-empty contiguous range of 0..{len(self.blocks) - 1}, got {chosen}"
            )
        params = []
        for i in chosen:
            block = self.blocks[i]
            placed = {}
            for spec in block.params:
                placed[spec.name] = _reserve_then_make(
                    device,
                    self.dtype,
                    spec.shape,
                    f"weight {block.key(spec.name)}",
                    lambda b=block, s=spec: self._make(b, s),
                )
            params.append(placed)
        return ModelShard(self, device, chosen[0], chosen[-1] + 1, params)

    def load_tensor(
        self, device: Device, block: int, name: str, ranges: Sequence[tuple[int, int]] | None = None, axis: int = 0
    ) -> np.ndarray:
        """One weight of block ``block`` placed on ``device``; with ``ranges``, only those
        ``(start, stop)`` ranges along ``axis``, concatenated (a tensor- or expert-parallel
        card's shard of it). HBM is reserved for the shard before it is created."""
        auto_limit()
        b = self.blocks[block]
        spec = next((s for s in b.params if s.name == name), None)
        if spec is None:
            raise HcclParamError(f"load_tensor: block {b.prefix!r} has no weight {name!r}", key=b.key(name))
        if ranges is None:
            shape = spec.shape
            make = lambda: self._make(b, spec)  # noqa: E731
        else:
            ranges = [(int(lo), int(hi)) for lo, hi in ranges]
            axis = axis % len(spec.shape)
            if any(not 0 <= lo <= hi <= spec.shape[axis] for lo, hi in ranges):
                raise HcclParamError(
                    f"load_tensor: ranges {ranges} fall outside axis {axis} of {b.key(name)} {spec.shape}",
                    key=b.key(name),
                    value=ranges,
                    rule="range",
                )
            shape = spec.shape[:axis] + (sum(hi - lo for lo, hi in ranges),) + spec.shape[axis + 1 :]

            def make() -> np.ndarray:
                full = self._make(b, spec)
                index = [slice(None)] * full.ndim
                parts = []
                for lo, hi in ranges:
                    index[axis] = slice(lo, hi)
                    parts.append(full[tuple(index)])
                return np.ascontiguousarray(np.concatenate(parts, axis=axis)) if parts else np.empty(shape, self.dtype)

        return _reserve_then_make(device, self.dtype, shape, f"weight {b.key(name)}", make)

    # -- cost estimates (dry runs on a planning card) ----------------------------------------------
    def estimate(
        self, card: CardModel, batch: int, slow_factor: float = 1.0
    ) -> tuple[list[float], list[tuple[tuple[int, ...], np.dtype]]]:
        """(modeled seconds of each block, (shape, dtype) at each block boundary) for a batch of
        ``batch`` on ``card``: a dry run, no arithmetic. Boundary 0 is the input, boundary i+1
        block i's output. Cached per (card, batch, slow_factor)."""
        key = (card, int(batch), float(slow_factor))
        cached = self._estimates.get(key)
        if cached is None:
            dev = Device(dataclasses.replace(card, hbm_bytes=UNLIMITED_HBM), slow_factor=float(slow_factor), dry=True)
            shard = self.load(dev)
            shape, dtype = self.input_spec(batch)
            x = np.empty(shape, dtype)
            costs, specs = [], [(x.shape, x.dtype)]
            ops = Ops(dev)
            for block, p in zip(self.blocks, shard.params):
                start = dev.clock
                x = block.forward(ops, p, x)
                costs.append(dev.clock - start)
                specs.append((x.shape, x.dtype))
            cached = self._estimates[key] = (costs, specs)
        return cached

    def boundary_spec(self, batch: int, index: int) -> tuple[tuple[int, ...], np.dtype]:
        """(shape, dtype) entering block ``index`` for a batch of ``batch`` (``index`` = number of
        blocks: the model's output). Shapes do not depend on the card."""
        return self.estimate(_SHAPE_CARD, batch)[1][index]

    def output_spec(self, batch: int) -> tuple[tuple[int, ...], np.dtype]:
        """(shape, dtype) of the model's output for a batch of ``batch``."""
        return self.boundary_spec(batch, len(self.blocks))


def _reserve_then_make(
    device: Device, dtype: np.dtype, shape: tuple[int, ...], what: str, make: Callable[[], np.ndarray]
) -> np.ndarray:
    handle = device.malloc(int(np.prod(shape)) * dtype.itemsize, what)
    try:
        array = np.empty(shape, dtype) if device.dry else make()
    except BaseException:
        device.free(handle)
        raise
    weakref.finalize(array, device.free, handle)
    return array


class ModelShard:
    """Blocks ``lo .. hi-1`` of a model placed on one card. As a data-parallel replica it is a
    *runner*: ``forward(x, splits)``, ``piece_costs(sizes)``, ``output_spec(n)``.

        shard = model.load(comm.device)
        y = shard.forward(x)                     # one batch
        y = shard.forward(x, splits=[8, 8, 4])   # three pieces in turn, outputs concatenated
    """

    comm = None  # a single card: no collective needed to agree on costs

    def __init__(self, model: Model, device: Device, lo: int, hi: int, params: list[dict[str, np.ndarray]]):
        self.model = model
        self.device = device
        self.lo = lo
        self.hi = hi
        self.params = params
        self.ops = Ops(device)
        self.timeline: Timeline | None = None  # where forward records compute segments, if set

    @property
    def block_names(self) -> list[str]:
        """The prefixes of the blocks this shard holds."""
        return self.model.block_names[self.lo : self.hi]

    def run_blocks(self, x: np.ndarray, timeline: Timeline | None = None, label: str = "") -> np.ndarray:
        """The shard's blocks on one piece, each recorded as a compute segment of ``timeline``."""
        for block, p in zip(self.model.blocks[self.lo : self.hi], self.params):
            if timeline is None:
                x = block.forward(self.ops, p, x)
            else:
                with timeline.compute(f"{label}{block.prefix}"):
                    x = block.forward(self.ops, p, x)
        return x

    def forward(
        self,
        x: np.ndarray,
        splits: Sequence[int] | None = None,
        *,
        timeline: Timeline | None = None,
        on_piece: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        """Run the shard on ``x`` (one batch, or pieces of ``splits`` samples in turn)."""
        timeline = timeline if timeline is not None else self.timeline
        sizes = [len(x)] if splits is None else list(splits)
        if sum(sizes) != len(x):
            raise HcclParamError(f"forward: splits {sizes} do not add up to the batch of {len(x)}")
        outs, at = [], 0
        for i, size in enumerate(sizes):
            label = f"piece {i} " if len(sizes) > 1 else "batch "
            outs.append(self.run_blocks(x[at : at + size], timeline, label))
            at += size
            if on_piece is not None:
                on_piece(size)
        return outs[0] if len(outs) == 1 else np.concatenate(outs)

    def piece_costs(self, sizes: Sequence[int]) -> list[float]:
        """Modeled seconds this card takes for a piece of each size (a dry run; no collective)."""
        card, slow = self.device.model, self.device.slow_factor
        return [sum(self.model.estimate(card, int(n), slow)[0][self.lo : self.hi]) if n else 0.0 for n in sizes]

    def output_spec(self, batch: int) -> tuple[tuple[int, ...], np.dtype]:
        """(shape, dtype) of the shard's output (the input of block ``hi``) for a batch of ``batch``."""
        return self.model.boundary_spec(batch, self.hi)
