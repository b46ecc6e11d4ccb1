"""A mixture-of-experts transformer on one card, and the kernels expert parallelism
(``expert_parallel.py``: the experts spread over the cards, tokens sent to them and back with
``all_to_all_v``) shares with it. A router picks ``top_k`` experts per token.

The model (:class:`MoETransformer`, one card): the encoder of ``transformer.py`` with every MLP
replaced by an MoE feed-forward layer (DeepSeek / Mixtral style)::

    h      = LayerNorm(x)
    probs  = softmax(h @ router.weight + router.bias + skew)       # (tokens, experts), float64
    top    = the top_k experts of each token (ties: lower index); gates = their probs / their sum
    routed = sum over the k slots of gate * expert_e(h)              # expert_e: fc1 -> GELU -> fc2
    x      = x + routed + shared(h)                                  # shared: an always-on expert

*Router skew* (``router_skew = s``, Zipf): experts get a popularity order (a permutation from the
model's seed) and the router adds ``-s * ln(rank + 1)`` to the logit of the expert of popularity
``rank`` (0 = most popular), so the router's prior over experts is Zipf, ``∝ (rank + 1)^-s``:
``s = 0`` is a uniform router, ``s = 1.2`` sends most tokens to a few experts — the load
imbalance of real MoE inference.

*Capacity factor* (``capacity_factor = cf``): each expert takes at most
``C = ceil(cf * tokens * top_k / experts)`` tokens per layer; assignments beyond ``C`` are
**dropped** (earlier tokens first: global token order; a dropped slot adds nothing), and an
expert with fewer is **padded** to ``C`` rows (static shapes, as graph-compiled MoE runs on
Ascend): a small ``cf`` drops tokens, a large one computes padding. Without a capacity factor
the layer is dropless and experts take what they get.

Expert parallelism over cards, on this model: ``expert_parallel.py``.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from ..errors import HcclParamError
from .model import Block, Model, Ops, ParamSpec
from .transformer import ClassifierHead, Embedding, TransformerConfig, attention_params, attention_residual


@dataclass(frozen=True)
class MoEConfig:
    """Sizes of the MoE encoder. ``shared_hidden`` 0: no shared expert; ``capacity_factor``
    None: dropless."""

    layers: int = 4
    d_model: int = 256
    heads: int = 4
    seq_len: int = 128
    vocab: int = 1000
    classes: int = 10
    experts: int = 8
    top_k: int = 2
    expert_hidden: int = 512
    shared_hidden: int = 512
    router_skew: float = 0.0
    capacity_factor: float | None = None

    def __post_init__(self) -> None:
        for name in ("layers", "d_model", "heads", "seq_len", "vocab", "classes", "experts", "top_k", "expert_hidden"):
            if getattr(self, name) < 1:
                raise HcclParamError(
                    f"MoEConfig: {name} must be >= 1, got {getattr(self, name)}", arg=name, value=getattr(self, name)
                )
        if self.d_model % self.heads:
            raise HcclParamError(
                f"MoEConfig: d_model={self.d_model} is not divisible by heads={self.heads}", arg="heads"
            )
        if self.top_k > self.experts:
            raise HcclParamError(
                f"MoEConfig: top_k={self.top_k} exceeds the {self.experts} experts",
                arg="top_k",
                value=self.top_k,
                rule="range",
                expected=f"<= {self.experts}",
            )
        if self.shared_hidden < 0 or not self.router_skew >= 0 or not math.isfinite(self.router_skew):
            raise HcclParamError(
                "MoEConfig: shared_hidden and router_skew must be >= 0 (and finite)",
                arg="router_skew",
                value=self.router_skew,
            )
        if self.capacity_factor is not None and not (self.capacity_factor > 0 and math.isfinite(self.capacity_factor)):
            raise HcclParamError(
                f"MoEConfig: capacity_factor must be > 0, got {self.capacity_factor}",
                arg="capacity_factor",
                value=self.capacity_factor,
                rule="range",
                expected="> 0",
            )

    def capacity(self, tokens: int) -> int | None:
        """Rows per expert per layer for ``tokens`` tokens: ``ceil(cf * tokens * top_k / experts)``."""
        if self.capacity_factor is None:
            return None
        return math.ceil(self.capacity_factor * tokens * self.top_k / self.experts)

    def attention(self) -> TransformerConfig:
        """The same sizes as a :class:`TransformerConfig`: the dense encoder whose embedding, attention and
        head the MoE layers share."""
        return TransformerConfig(
            layers=self.layers,
            d_model=self.d_model,
            heads=self.heads,
            seq_len=self.seq_len,
            vocab=self.vocab,
            classes=self.classes,
        )


@dataclass(frozen=True)
class LayerRouting:
    """One MoE layer's routing of one forward: per expert, assignments the router made
    (``routed``), rows the expert computed for real tokens (``kept``) and for padding
    (``padded``); ``capacity`` rows per expert (None: dropless)."""

    routed: tuple[int, ...]
    kept: tuple[int, ...]
    padded: tuple[int, ...]
    capacity: int | None


# -- kernels shared by the one-card model and the expert-parallel driver ----------------------------
def route(
    ops: Ops,
    h: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray,
    top_k: int,
    skew: np.ndarray | None = None,
    first_token: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """(experts ``(tokens, top_k)`` int64, gates ``(tokens, top_k)`` in ``h``'s dtype) for the
    rows of ``h``: softmax of the router logits ``h @ weight + bias + skew`` in float64 (a row's
    choice then depends on its own values only, not on the batch it is in), top_k by
    probability (ties: lower expert), gates renormalised over the chosen. One kernel.

    On a ``dry`` card (no values) each token is routed by the skew's prior alone: top_k drawn
    without replacement (Gumbel top-k) from noise that depends only on the token's position in
    the batch (``first_token`` + row), so any split of the batch routes it alike; equal gates."""
    dev = ops.device
    n, d = h.shape
    e = weight.shape[1]
    skew = np.zeros(e) if skew is None else skew
    if dev.dry:
        keys = skew + _gumbel(np.arange(first_token, first_token + n, dtype=np.uint64), e)
        experts = np.argsort(-keys, axis=1, kind="stable")[:, :top_k]
        gates = np.full((n, top_k), 1.0 / top_k, h.dtype)
    else:
        logits = h.astype(np.float64) @ weight.astype(np.float64) + bias + skew
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        experts = np.argsort(-probs, axis=1, kind="stable")[:, :top_k]
        top = np.take_along_axis(probs, experts, axis=1)
        gates = (top / top.sum(axis=1, keepdims=True)).astype(h.dtype)
    dev.run(
        2.0 * n * d * e + 6.0 * n * e + n * e * top_k,
        h.nbytes + weight.nbytes + 4 * n * e + (8 + h.itemsize) * n * top_k,
        h.dtype,
        "router",
    )
    return experts.astype(np.int64), gates


def _gumbel(tokens: np.ndarray, experts: int) -> np.ndarray:
    """Gumbel noise ``(len(tokens), experts)`` from a hash (splitmix64) of (token, expert)."""
    with np.errstate(over="ignore"):
        z = tokens[:, None] * np.uint64(experts) + np.arange(experts, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    u = ((z >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
    return -np.log(-np.log(u))


def gather_rows(ops: Ops, src: np.ndarray, rows: np.ndarray, pad: int = 0) -> np.ndarray:
    """``src[rows]`` followed by ``pad`` zero rows: one memory-bound kernel."""
    out = np.zeros((len(rows) + pad, src.shape[1]), src.dtype)
    if len(rows) and not ops.device.dry:
        np.take(src, rows, axis=0, out=out[: len(rows)])
    ops.device.run(
        0.0,
        2 * len(rows) * src.shape[1] * src.itemsize + pad * src.shape[1] * src.itemsize + rows.nbytes,
        name="gather",
    )
    return ops.device.adopt(out, "activation")


def scatter_rows(ops: Ops, dst: np.ndarray, index, values: np.ndarray) -> None:
    """``dst[index] = values``: one memory-bound kernel."""
    if len(values) and not ops.device.dry:
        dst[index] = values
    ops.device.run(0.0, 2 * values.nbytes, name="scatter")


def weighted_sum(ops: Ops, gates: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """``sum_j gates[:, j] * slots[:, j]`` in slot order: one kernel."""
    if ops.device.dry:
        out = np.empty(slots[:, 0].shape, np.result_type(gates, slots))
    else:
        out = gates[:, 0, None] * slots[:, 0]
        for j in range(1, gates.shape[1]):
            out += gates[:, j, None] * slots[:, j]
    ops.device.run(2.0 * slots.size, slots.nbytes + gates.nbytes + out.nbytes, name="combine")
    return ops.device.adopt(out, "activation")


def expert_mlp(ops: Ops, p: Mapping[str, np.ndarray], prefix: str, x: np.ndarray) -> np.ndarray:
    """``fc2(GELU(fc1(x)))`` with the weights under ``prefix`` (``experts.3``, ``shared``)."""
    hidden = ops.gelu(ops.linear(x, p[f"{prefix}.fc1.weight"], p[f"{prefix}.fc1.bias"]))
    return ops.linear(hidden, p[f"{prefix}.fc2.weight"], p[f"{prefix}.fc2.bias"])


def kept_table(table: np.ndarray, capacity: int | None) -> np.ndarray:
    """Assignments kept under ``capacity`` from ``table[..., e]`` assignments per group, groups in
    global token order along the flattened leading axes: each expert keeps the first ``capacity``.

    >>> kept_table(np.array([[3, 1], [2, 0]]), 4).tolist()
    [[3, 1], [1, 0]]
    """
    if capacity is None:
        return table.copy()
    flat = table.reshape(-1, table.shape[-1])
    before = np.cumsum(flat, axis=0) - flat
    return np.clip(capacity - before, 0, flat).reshape(table.shape)


class MoELayer(Block):
    """Attention, then the MoE feed-forward (see the module doc)."""

    def __init__(self, cfg: MoEConfig, index: int, skew: np.ndarray):
        d, f, fs, e = cfg.d_model, cfg.expert_hidden, cfg.shared_hidden, cfg.experts
        self.prefix = f"layers.{index}"
        self.cfg = cfg
        self.skew = skew
        self.last: LayerRouting | None = None
        params = [
            *attention_params(d),
            ParamSpec("ln2.gamma", (d,), "ones"),
            ParamSpec("ln2.beta", (d,), "zeros"),
            ParamSpec("router.weight", (d, e), scale=1 / math.sqrt(d)),
            ParamSpec("router.bias", (e,), "zeros"),
        ]
        for i in range(e):
            params += [
                ParamSpec(f"experts.{i}.fc1.weight", (d, f), scale=1 / math.sqrt(d)),
                ParamSpec(f"experts.{i}.fc1.bias", (f,), scale=0.02),
                ParamSpec(f"experts.{i}.fc2.weight", (f, d), scale=1 / math.sqrt(f)),
                ParamSpec(f"experts.{i}.fc2.bias", (d,), scale=0.02),
            ]
        if fs:
            params += [
                ParamSpec("shared.fc1.weight", (d, fs), scale=1 / math.sqrt(d)),
                ParamSpec("shared.fc1.bias", (fs,), scale=0.02),
                ParamSpec("shared.fc2.weight", (fs, d), scale=1 / math.sqrt(fs)),
                ParamSpec("shared.fc2.bias", (d,), scale=0.02),
            ]
        self.params = tuple(params)

    def forward(self, ops: Ops, p: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
        cfg = self.cfg
        x = attention_residual(ops, p, x, cfg.heads)
        b, s, d = x.shape
        h = ops.layer_norm(x, p["ln2.gamma"], p["ln2.beta"]).reshape(b * s, d)
        experts, gates = route(ops, h, p["router.weight"], p["router.bias"], cfg.top_k, self.skew)
        capacity = cfg.capacity(len(h))
        slots = ops.device.adopt(np.zeros((len(h), cfg.top_k, d), h.dtype), "activation")
        routed, kept, padded = [], [], []
        for e in range(cfg.experts):
            tokens, slot = np.nonzero(experts == e)  # token order
            n = len(tokens) if capacity is None else min(len(tokens), capacity)
            pad = 0 if capacity is None else capacity - n
            routed.append(len(tokens))
            kept.append(n)
            padded.append(pad)
            if n + pad == 0:
                continue
            y = expert_mlp(ops, p, f"experts.{e}", gather_rows(ops, h, tokens[:n], pad))
            scatter_rows(ops, slots, (tokens[:n], slot[:n]), y[:n])
        self.last = LayerRouting(tuple(routed), tuple(kept), tuple(padded), capacity)
        ffn = weighted_sum(ops, gates, slots)
        if cfg.shared_hidden:
            ffn = ops.add(ffn, expert_mlp(ops, p, "shared", h))
        return ops.add(x, ffn.reshape(b, s, d))


class MoETransformer(Model):
    """The MoE encoder classifier (see the module doc); ``weights`` an ``.npz`` path or a mapping
    (``param_shapes()`` lists the keys), else deterministic from ``seed``."""

    name = "moe-transformer"

    def __init__(
        self,
        config: MoEConfig = MoEConfig(),
        *,
        seed: int = 0,
        weights: "str | Path | Mapping[str, np.ndarray] | None" = None,
        dtype=np.float32,
    ):
        self.config = config
        rng = np.random.default_rng([int(seed), zlib.crc32(b"router.popularity")])
        #: experts from most to least popular (the skew's order; a permutation from the seed)
        self.popularity = tuple(int(e) for e in rng.permutation(config.experts))
        skew = np.zeros(config.experts, np.float64)
        for rank, e in enumerate(self.popularity):
            skew[e] = -config.router_skew * math.log(rank + 1)
        self.skew = skew
        base = config.attention()
        blocks = [Embedding(base), *(MoELayer(config, i, skew) for i in range(config.layers)), ClassifierHead(base)]
        super().__init__(blocks, seed=seed, weights=weights, dtype=dtype)

    def prior(self) -> np.ndarray:
        """The router skew's prior share of each expert, ``∝ (popularity rank + 1)^-skew``."""
        share = np.exp(self.skew)
        return share / share.sum()

    def input_spec(self, batch: int) -> tuple[tuple[int, ...], np.dtype]:
        return (batch, self.config.seq_len), np.dtype(np.int64)

    def output_spec(self, batch: int) -> tuple[tuple[int, ...], np.dtype]:
        return (batch, self.config.classes), self.dtype

    def sample_inputs(self, batch: int, seed: int = 1234) -> np.ndarray:
        """Deterministic token ids ``(batch, seq_len)``: the same batch on every rank."""
        return np.random.default_rng(seed).integers(0, self.config.vocab, (batch, self.config.seq_len), dtype=np.int64)

    def routing(self) -> list[LayerRouting]:
        """Each layer's routing of the last one-card forward."""
        return [b.last for b in self.blocks if isinstance(b, MoELayer) and b.last is not None]

    def describe(self) -> str:
        c = self.config
        shared = f", shared expert {c.shared_hidden}" if c.shared_hidden else ""
        cap = f"capacity factor {c.capacity_factor:g}" if c.capacity_factor is not None else "dropless"
        return (
            f"MoE transformer: {c.layers} layers, d_model {c.d_model}, {c.heads} heads, seq {c.seq_len}, "
            f"{c.experts} experts (hidden {c.expert_hidden}) top-{c.top_k}{shared}, router skew {c.router_skew:g}, {cap}, "
            f"{self.param_bytes() / 2**20:.1f} MiB fp32 weights"
        )
