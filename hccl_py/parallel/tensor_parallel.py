"""Tensor parallelism (Megatron-LM style): every encoder layer's attention heads and MLP hidden
units split over the cards of a communicator, one all_reduce after each half of a layer.

Per layer, card ``r`` of ``p`` holds (shards of the :class:`TransformerEncoder`'s own weights,
so the output equals the one-card model's within float rounding):

- attention, *column-parallel* QKV: the q, k and v columns of its heads (``heads / p`` of them),
  so it computes those heads' attention alone; *row-parallel* output projection: the rows of
  ``attn.out.weight`` that its heads' context multiplies. Its product is a partial sum of the
  projection: **all_reduce**, then ``+ bias`` (once) and the residual.
- MLP, *column-parallel* ``fc1`` (``f / p`` hidden units with their bias), GELU on its own
  units, *row-parallel* ``fc2`` (the matching rows): partial sum, **all_reduce**, ``+ bias``,
  residual.

LayerNorms, the embedding and the classifier head are replicated (every card computes them on the
whole batch, as Megatron does for LayerNorm). Each card does ``1/p`` of the matmuls and sends two
all_reduces of ``batch x seq x d_model`` per layer; every card returns the whole output.

``overlap=True`` cuts a batch into ``chunks`` groups of sequences that walk the layers in
lockstep, and issues each chunk's all_reduce asynchronously: while chunk ``i``'s partial sums are
reduced on the communication stream, the card computes chunk ``i+1``'s half-layer (the math allows
it: sequences are independent). Modeled time then shows the overlap; ``device.time.exposed_s``
counts what compute did not hide.

As a data-parallel replica it is a *runner* (``forward(x, splits)``, ``piece_costs``,
``output_spec``), so tensor-parallel groups nest under :class:`DataParallel`::

    comm = hccl_py.init()
    model = TransformerEncoder()
    tp = TensorParallel(comm, model, overlap=True)             # heads and MLP over every card
    logits = tp.forward(model.sample_inputs(64))               # (64, 10) on every card
    tp_comm, dp_comm = tp_dp_groups(comm, tp=2)                # 4 ranks: tp [0,1] [2,3]; dp [0,2] [1,3]
    logits = DataParallel(dp_comm, TensorParallel(tp_comm, model)).forward(x)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..choice import argmin as algo_argmin
from ..communicator import Communicator
from ..errors import HcclParamError
from ..modeled.card import Device
from ..modeled.cost_model import CostModel
from ..modeled.simulator import simulate
from .model import UNLIMITED_HBM, Ops
from .overlap import OverlapDriver
from .sharding import even_split
from .timeline import Timeline
from .transformer import TransformerEncoder, self_attention


@dataclass(frozen=True)
class TensorParallelRun:
    """One forward: ``chunks`` the batch was cut into, ``all_reduces`` issued by each card and the
    elements each reduced (per chunk and half-layer, ``chunk samples x seq x d_model``)."""

    chunks: int
    all_reduces: int
    elements: int


def _ranges(counts: Sequence[int]) -> list[tuple[int, int]]:
    out, at = [], 0
    for c in counts:
        out.append((at, at + c))
        at += c
    return out


class _Shard:
    """Card ``rank``'s share of the encoder's weights (of ``size`` cards) on ``device``."""

    def __init__(self, model: TransformerEncoder, device: Device, rank: int, size: int):
        cfg = model.config
        d, f, dh = cfg.d_model, cfg.mlp_ratio * cfg.d_model, cfg.d_model // cfg.heads
        self.heads = even_split(cfg.heads, size)[rank]
        h0, h1 = _ranges(even_split(cfg.heads, size))[rank]
        f0, f1 = _ranges(even_split(f, size))[rank]
        heads_cols = [(part * d + h0 * dh, part * d + h1 * dh) for part in range(3)]  # q, k, v columns of its heads
        load = model.load_tensor
        self.embed = {n: load(device, 0, n) for n in ("tokens", "positions")}
        self.layers = []
        for i in range(1, 1 + cfg.layers):
            self.layers.append(
                {
                    **{
                        n: load(device, i, n)
                        for n in ("ln1.gamma", "ln1.beta", "ln2.gamma", "ln2.beta", "attn.out.bias", "mlp.fc2.bias")
                    },
                    "attn.qkv.weight": load(device, i, "attn.qkv.weight", heads_cols, axis=1),
                    "attn.qkv.bias": load(device, i, "attn.qkv.bias", heads_cols, axis=0),
                    "attn.out.weight": load(device, i, "attn.out.weight", [(h0 * dh, h1 * dh)], axis=0),
                    "mlp.fc1.weight": load(device, i, "mlp.fc1.weight", [(f0, f1)], axis=1),
                    "mlp.fc1.bias": load(device, i, "mlp.fc1.bias", [(f0, f1)], axis=0),
                    "mlp.fc2.weight": load(device, i, "mlp.fc2.weight", [(f0, f1)], axis=0),
                }
            )
        last = len(model.blocks) - 1
        self.head = {n: load(device, last, n) for n in ("ln.gamma", "ln.beta", "classifier.weight", "classifier.bias")}

    # -- the kernels of one card (no communication) ------------------------------------------------
    def embedding(self, ops: Ops, ids: np.ndarray) -> np.ndarray:
        return ops.embedding(self.embed["tokens"], ids, self.embed["positions"])

    def attention_partial(self, ops: Ops, p: dict, x: np.ndarray) -> np.ndarray:
        """This card's heads, then its rows of the output projection: a partial sum, no bias."""
        context = self_attention(
            ops, ops.layer_norm(x, p["ln1.gamma"], p["ln1.beta"]), p["attn.qkv.weight"], p["attn.qkv.bias"], self.heads
        )
        return ops.matmul(context, p["attn.out.weight"])

    def mlp_partial(self, ops: Ops, p: dict, x: np.ndarray) -> np.ndarray:
        """This card's hidden units of the MLP: a partial sum of fc2, no bias."""
        hidden = ops.gelu(
            ops.linear(ops.layer_norm(x, p["ln2.gamma"], p["ln2.beta"]), p["mlp.fc1.weight"], p["mlp.fc1.bias"])
        )
        return ops.matmul(hidden, p["mlp.fc2.weight"])

    def classify(self, ops: Ops, x: np.ndarray) -> np.ndarray:
        p = self.head
        return ops.linear(
            ops.mean(ops.layer_norm(x, p["ln.gamma"], p["ln.beta"]), axis=1),
            p["classifier.weight"],
            p["classifier.bias"],
        )


def residual(ops: Ops, x: np.ndarray, reduced: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """``x + (reduced + bias)`` as one kernel (the one-card layer's order of additions)."""
    return ops.elementwise(lambda a, r, b: a + (r + b), x, reduced, bias, flops_per_element=2.0)


class TensorParallel(OverlapDriver):
    """``model`` (a :class:`TransformerEncoder`) with its heads and MLP split over ``comm``'s
    cards (see the module doc). ``overlap``: asynchronous all_reduces overlapped with the next
    chunk's compute; ``chunks``: sequence groups a batch is cut into (default 2 with overlap,
    else 1)."""

    def __init__(
        self,
        comm: Communicator,
        model: TransformerEncoder,
        *,
        overlap: bool = False,
        chunks: int | None = None,
        timeline: Timeline | None = None,
    ):
        if not isinstance(model, TransformerEncoder):
            raise HcclParamError(
                f"TensorParallel: needs a TransformerEncoder (attention heads and MLP to split), got {model.name}",
                arg="model",
                value=model.name,
                expected="transformer",
            )
        cfg = model.config
        if cfg.heads < comm.size:
            raise HcclParamError(
                f"TensorParallel: {cfg.heads} attention heads cannot split over {comm.size} cards; "
                f"use at most {cfg.heads} cards per tensor-parallel group or more heads",
                arg="heads",
                value=cfg.heads,
                rule="range",
                expected=f">= {comm.size}",
            )
        super().__init__("TensorParallel", comm, model, overlap, chunks, timeline)
        self.heads_per_card = tuple(even_split(cfg.heads, comm.size))
        self.hidden_per_card = tuple(even_split(cfg.mlp_ratio * cfg.d_model, comm.size))
        self.shard = _Shard(model, comm.device, comm.rank, comm.size)
        self.last: TensorParallelRun | None = None
        self._estimates: dict[tuple, float] = {}

    # -- runner protocol ------------------------------------------------------------------------------
    def output_spec(self, batch: int):
        """(shape, dtype) of the output for a batch of ``batch``: the model's, on every card."""
        return self.model.output_spec(batch)

    def forward(
        self, x: np.ndarray, splits: Sequence[int] | None = None, *, on_piece: Callable[[int], None] | None = None
    ) -> np.ndarray:
        """Run the batch ``x`` (the same on every card of the group); every card returns the whole
        output. ``splits``: pieces run one after another (a data-parallel work-stealing plan)."""
        sizes = [len(x)] if splits is None else [int(s) for s in splits]
        if sum(sizes) != len(x) or any(s < 0 for s in sizes):
            raise HcclParamError(f"TensorParallel.forward: splits {sizes} do not add up to the batch of {len(x)}")
        outs, at, reduces, elements = [], 0, 0, 0
        chunks = 0
        for size in sizes:
            y, stats = self._run(x[at : at + size])
            outs.append(y)
            chunks, reduces, elements = max(chunks, stats[0]), reduces + stats[1], elements + stats[2]
            at += size
            if on_piece is not None:
                on_piece(size)
        self.last = TensorParallelRun(chunks, reduces, elements)
        return outs[0] if len(outs) == 1 else np.concatenate(outs)

    def _run(self, x: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int]]:
        n = len(x)
        if n == 0:
            shape, dtype = self.model.output_spec(0)
            return np.empty(shape, dtype), (0, 0, 0)
        ops, tl, shard, issuer = self.ops, self.timeline, self.shard, self.issuer
        single = self.comm.size == 1
        bounds = _ranges(even_split(n, min(self.chunks, n)))
        m = len(bounds)
        with tl.compute("embed"):
            xs = [shard.embedding(ops, x[a:b]) for a, b in bounds]
        pending: list = [None] * m  # per chunk: (residual input, Pending or partial, bias)
        reduces = elements = 0

        def finish(c: int) -> None:
            if pending[c] is None:
                return
            resid, call, bias = pending[c]
            reduced = call if single else issuer.wait(call)
            with tl.compute(f"residual c{c}"):
                xs[c] = residual(ops, resid, reduced, bias)
            pending[c] = None

        for i, p in enumerate(shard.layers):
            for half, part, bias in (
                ("attn", shard.attention_partial, "attn.out.bias"),
                ("mlp", shard.mlp_partial, "mlp.fc2.bias"),
            ):
                for c in range(m):
                    finish(c)
                    with tl.compute(f"layers.{i} {half} c{c}"):
                        partial = part(ops, p, xs[c])
                    if single:
                        pending[c] = (xs[c], partial, p[bias])
                        continue
                    call = issuer.issue(f"all_reduce layers.{i} {half} c{c}", self.comm.all_reduce, partial)
                    pending[c] = (xs[c], call, p[bias])
                    reduces += 1
                    elements += partial.size
        for c in range(m):
            finish(c)
        with tl.compute("head"):
            outs = [shard.classify(ops, xc) for xc in xs]
        y = outs[0] if m == 1 else np.concatenate(outs)
        return y, (m, reduces, elements)

    def piece_costs(self, sizes: Sequence[int]) -> list[float]:
        """Modeled seconds of a piece of each size: this card's kernels (a dry run) plus the
        all_reduces (the cost model's fastest algorithm on this group), without overlap; the
        largest over the group's cards, so every card returns the same."""
        mine = np.array([self._estimate(int(n)) if n > 0 else 0.0 for n in sizes], np.float64)
        if self.comm.size > 1 and mine.size:
            self.comm.all_reduce(mine, op="max")
        return mine.tolist()

    def _estimate(self, n: int) -> float:
        dev = self.device
        key = (dev.model, dev.slow_factor, n)
        if key not in self._estimates:
            card = Device(
                dataclasses.replace(dev.model, hbm_bytes=UNLIMITED_HBM), slow_factor=dev.slow_factor, dry=True
            )
            shard, ops = _Shard(self.model, card, self.comm.rank, self.comm.size), Ops(card)
            shape, dtype = self.model.input_spec(n)
            x = shard.embedding(ops, np.empty(shape, dtype))
            for p in shard.layers:
                for part, bias in ((shard.attention_partial, "attn.out.bias"), (shard.mlp_partial, "mlp.fc2.bias")):
                    x = residual(ops, x, part(ops, p, x), p[bias])
            shard.classify(ops, x)
            reduce_s = 0.0
            if self.comm.size > 1:
                cfg = self.model.config
                count = n * cfg.seq_len * cfg.d_model
                cost = self._cost_model = getattr(self, "_cost_model", None) or CostModel(self.comm.topology)
                ranks = tuple(self.comm.world_ranks)
                itemsize = self.model.dtype.itemsize
                algo = algo_argmin.fastest(cost, "allreduce", count, itemsize, ranks)
                reduce_s = (
                    2
                    * cfg.layers
                    * simulate(
                        "allreduce",
                        algo,
                        self.comm.topology,
                        count,
                        itemsize=itemsize,
                        world_ranks=ranks,
                        cost_model=cost,
                    ).time_s
                )
            self._estimates[key] = card.clock + reduce_s
        return self._estimates[key]
