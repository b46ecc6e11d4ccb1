"""A mixture-of-experts transformer and expert parallelism: a router picks ``top_k`` experts
per token, the experts are spread over the cards, tokens travel to their experts and back with
``all_to_all_v`` (HCCL's AlltoAllV, as MoE inference on Ascend dispatches and combines them).

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

Expert parallelism (:class:`ExpertParallel`): each card holds the attention, router and shared
expert (replicated) and ``experts / p`` experts; a batch's sequences are split evenly over the
cards (attention is data-parallel). Per layer, card ``r``:

1. attention and the router on its own tokens;
2. an ``all_gather`` of its tokens per expert (every card then knows the whole routing table,
   so capacity is decided before anything moves, in global token order, as on one card);
3. **dispatch**: ``all_to_all_v`` of the kept token rows, grouped by destination card and expert;
4. its experts on the rows they received (padded to capacity if set);
5. **combine**: ``all_to_all_v`` of the results back to the tokens' cards;
6. the gate-weighted sum over each token's slots, plus the shared expert, plus the residual.

A card whose experts are popular computes longer in step 4; the others wait for it in step 5:
routing skew shows as modeled waiting time on the other cards.

``overlap=True`` cuts each card's sequences into ``chunks`` micro-batches (default 2) and
issues the dispatches and combines asynchronously: micro-batch 0's dispatch overlaps micro-batch
1's attention, 1's dispatch overlaps 0's experts, 0's combine overlaps 1's shared expert and
experts, 1's combine overlaps 0's attention in the next layer. (With a capacity factor a layer's
routing table needs every micro-batch's routing first; there 0's dispatch overlaps the shared
expert.) Every micro-batch launches the kernels again: overlap pays where communication is
costlier than those launches (wide layers, slow links).

    comm = hccl_py.init()
    model = MoETransformer(MoEConfig(experts=8, top_k=2, router_skew=1.2, capacity_factor=1.25))
    ep = ExpertParallel(comm, model, overlap=True)
    logits = ep.forward(model.sample_inputs(64))      # (64, 10) on every card
    ep.last.processed, ep.last.dropped                # tokens per expert, dropped per expert
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from ..communicator import Communicator
from ..errors import HcclParamError
from .model import Block, Model, Ops, ParamSpec
from .overlap import OverlapDriver
from .sharding import even_split
from .timeline import Timeline
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
                raise HcclParamError(f"MoEConfig: {name} must be >= 1, got {getattr(self, name)}", arg=name, value=getattr(self, name))
        if self.d_model % self.heads:
            raise HcclParamError(f"MoEConfig: d_model={self.d_model} is not divisible by heads={self.heads}", arg="heads")
        if self.top_k > self.experts:
            raise HcclParamError(f"MoEConfig: top_k={self.top_k} exceeds the {self.experts} experts", arg="top_k",
                                 value=self.top_k, rule="range", expected=f"<= {self.experts}")
        if self.shared_hidden < 0 or not self.router_skew >= 0 or not math.isfinite(self.router_skew):
            raise HcclParamError("MoEConfig: shared_hidden and router_skew must be >= 0 (and finite)", arg="router_skew",
                                 value=self.router_skew)
        if self.capacity_factor is not None and not (self.capacity_factor > 0 and math.isfinite(self.capacity_factor)):
            raise HcclParamError(f"MoEConfig: capacity_factor must be > 0, got {self.capacity_factor}", arg="capacity_factor",
                                 value=self.capacity_factor, rule="range", expected="> 0")

    def capacity(self, tokens: int) -> int | None:
        """Rows per expert per layer for ``tokens`` tokens: ``ceil(cf * tokens * top_k / experts)``."""
        if self.capacity_factor is None:
            return None
        return math.ceil(self.capacity_factor * tokens * self.top_k / self.experts)

    def attention(self) -> TransformerConfig:
        """The same sizes as a :class:`TransformerConfig`: the dense encoder whose embedding, attention and
        head the MoE layers share."""
        return TransformerConfig(layers=self.layers, d_model=self.d_model, heads=self.heads, seq_len=self.seq_len,
                                 vocab=self.vocab, classes=self.classes)


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
def route(ops: Ops, h: np.ndarray, weight: np.ndarray, bias: np.ndarray, top_k: int,
          skew: np.ndarray | None = None, first_token: int = 0) -> tuple[np.ndarray, np.ndarray]:
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
    dev.run(2.0 * n * d * e + 6.0 * n * e + n * e * top_k, h.nbytes + weight.nbytes + 4 * n * e + (8 + h.itemsize) * n * top_k,
            h.dtype, "router")
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
        np.take(src, rows, axis=0, out=out[:len(rows)])
    ops.device.run(0.0, 2 * len(rows) * src.shape[1] * src.itemsize + pad * src.shape[1] * src.itemsize + rows.nbytes, name="gather")
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
            ParamSpec("ln2.gamma", (d,), "ones"), ParamSpec("ln2.beta", (d,), "zeros"),
            ParamSpec("router.weight", (d, e), scale=1 / math.sqrt(d)), ParamSpec("router.bias", (e,), "zeros"),
        ]
        for i in range(e):
            params += [ParamSpec(f"experts.{i}.fc1.weight", (d, f), scale=1 / math.sqrt(d)),
                       ParamSpec(f"experts.{i}.fc1.bias", (f,), scale=0.02),
                       ParamSpec(f"experts.{i}.fc2.weight", (f, d), scale=1 / math.sqrt(f)),
                       ParamSpec(f"experts.{i}.fc2.bias", (d,), scale=0.02)]
        if fs:
            params += [ParamSpec("shared.fc1.weight", (d, fs), scale=1 / math.sqrt(d)), ParamSpec("shared.fc1.bias", (fs,), scale=0.02),
                       ParamSpec("shared.fc2.weight", (fs, d), scale=1 / math.sqrt(fs)), ParamSpec("shared.fc2.bias", (d,), scale=0.02)]
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

    def __init__(self, config: MoEConfig = MoEConfig(), *, seed: int = 0,
                 weights: "str | Path | Mapping[str, np.ndarray] | None" = None, dtype=np.float32):
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
        return (f"MoE transformer: {c.layers} layers, d_model {c.d_model}, {c.heads} heads, seq {c.seq_len}, "
                f"{c.experts} experts (hidden {c.expert_hidden}) top-{c.top_k}{shared}, router skew {c.router_skew:g}, {cap}, "
                f"{self.param_bytes() / 2**20:.1f} MiB fp32 weights")


@dataclass(frozen=True)
class ExpertParallelRun:
    """One expert-parallel forward, summed over the layers: per expert, assignments routed to
    it, rows it computed for tokens (``processed``) and for padding, and assignments dropped;
    ``owner[e]``: the card holding expert ``e``; ``capacity`` per layer; ``chunks`` per layer."""

    routed: tuple[int, ...]
    processed: tuple[int, ...]
    padded: tuple[int, ...]
    owner: tuple[int, ...]
    capacity: tuple[int | None, ...]
    chunks: int
    layers: tuple[LayerRouting, ...] = ()

    @property
    def dropped(self) -> tuple[int, ...]:
        """Per expert, assignments the capacity dropped (routed minus processed)."""
        return tuple(r - k for r, k in zip(self.routed, self.processed))

    def per_card(self, values: Sequence[int]) -> tuple[int, ...]:
        """Sum of a per-expert count over each card's experts."""
        cards = max(self.owner) + 1
        return tuple(sum(v for v, o in zip(values, self.owner) if o == c) for c in range(cards))


class ExpertParallel(OverlapDriver):
    """``model`` (a :class:`MoETransformer`) with its experts spread over ``comm``'s cards (see
    the module doc). ``overlap``: asynchronous dispatch and combine; ``chunks``: token chunks per
    layer (default 2 with overlap, else 1)."""

    def __init__(self, comm: Communicator, model: MoETransformer, *, overlap: bool = False, chunks: int | None = None,
                 timeline: Timeline | None = None):
        if not isinstance(model, MoETransformer):
            raise HcclParamError(f"ExpertParallel: needs an MoETransformer, got {model.name}", arg="model", value=model.name)
        cfg = model.config
        if cfg.experts < comm.size:
            raise HcclParamError(f"ExpertParallel: {cfg.experts} experts cannot spread over {comm.size} cards; use at most "
                                 f"{cfg.experts} cards or more experts", arg="experts", value=cfg.experts, rule="range",
                                 expected=f">= {comm.size}")
        super().__init__("ExpertParallel", comm, model, overlap, chunks, timeline)
        counts = even_split(cfg.experts, comm.size)
        self.owner = tuple(c for c, n in enumerate(counts) for _ in range(n))
        self.mine = tuple(e for e in range(cfg.experts) if self.owner[e] == comm.rank)
        load, dev = model.load_tensor, comm.device
        self.embed = {n: load(dev, 0, n) for n in ("tokens", "positions")}
        self.layers: list[dict[str, np.ndarray]] = []
        for i in range(1, 1 + cfg.layers):
            block = model.blocks[i]
            wanted = [s.name for s in block.params if not s.name.startswith("experts.")
                      or int(s.name.split(".")[1]) in self.mine]
            self.layers.append({n: load(dev, i, n) for n in wanted})
        last = len(model.blocks) - 1
        self.head = {n: load(dev, last, n) for n in ("ln.gamma", "ln.beta", "classifier.weight", "classifier.bias")}
        self.last: ExpertParallelRun | None = None

    @property
    def experts_of(self) -> list[tuple[int, ...]]:
        """Each card's experts."""
        return [tuple(e for e, o in enumerate(self.owner) if o == c) for c in range(self.comm.size)]

    def output_spec(self, batch: int):
        """(shape, dtype) of the output for a batch of ``batch``: the model's, on every card."""
        return self.model.output_spec(batch)

    # -- forward ------------------------------------------------------------------------------------
    def shares(self, batch: int) -> list[int]:
        """Sequences of a batch of ``batch`` each card runs attention on."""
        return even_split(batch, self.comm.size)

    def forward(self, x: np.ndarray, *, on_piece: Callable[[int], None] | None = None) -> np.ndarray:
        """Run the batch ``x`` (the same on every card): each card its share of the sequences,
        experts where they live; every card returns the whole output, in order. ``on_piece``:
        called with this card's share when it is done."""
        n, p, me = len(x), self.comm.size, self.comm.rank
        shares = self.shares(n)
        start = sum(shares[:me])
        self._routing: list[LayerRouting] = []
        y = self._run(x[start:start + shares[me]], n * self.model.config.seq_len, start)
        cfg = self.model.config
        layers = tuple(self._routing)
        total = lambda field: tuple(int(sum(getattr(r, field)[e] for r in layers)) for e in range(cfg.experts))  # noqa: E731
        self.last = ExpertParallelRun(total("routed"), total("kept"), total("padded"), self.owner,
                                      tuple(r.capacity for r in layers), self.chunks, layers)
        if on_piece is not None:
            on_piece(shares[me])
        shape, dtype = self.model.output_spec(n)
        if p == 1:
            return y
        padded = np.zeros((max(shares), *shape[1:]), dtype)
        padded[:len(y)] = y
        with self.timeline.comm("all_gather outputs"):
            table = self.comm.all_gather(padded)
        out = np.empty(shape, dtype)
        at = 0
        for r, share in enumerate(shares):
            out[at:at + share] = table[r, :share]
            at += share
        return self.device.adopt(out, "output")

    def _run(self, ids: np.ndarray, tokens: int, first: int) -> np.ndarray:
        """This card's sequences through every layer, in ``chunks`` micro-batches (module doc)."""
        ops, tl, cfg = self.ops, self.timeline, self.model.config
        capacity = cfg.capacity(tokens)
        mbs = []
        at = 0
        for size in even_split(len(ids), self.chunks):
            mbs.append(_MicroBatch(len(mbs), ids[at:at + size], (first + at) * cfg.seq_len))
            at += size
        with tl.compute("embed"):
            for mb in mbs:
                mb.x = ops.embedding(self.embed["tokens"], mb.ids, self.embed["positions"])
        for layer, p in enumerate(self.layers):
            routed = np.zeros(cfg.experts, np.int64)
            kept = np.zeros(cfg.experts, np.int64)
            # A: the previous layer's end, attention and router; the routing table; dispatch
            for mb in mbs:
                self._finish(mb)
                with tl.compute(f"layers.{layer} attention mb{mb.index}"):
                    self._attend(p, mb)
                if capacity is None:  # dropless: each micro-batch on its own, dispatched at once
                    table = self._counts(layer, [mb])
                    self._plan(mb, table[:, 0])
                    routed += table.sum(axis=(0, 1))
                    kept += table.sum(axis=(0, 1))
                    self._dispatch(layer, mb)
            padded = np.zeros(cfg.experts, np.int64)
            if capacity is not None:  # capacity: one table over every micro-batch (global token order)
                table = self._counts(layer, mbs)
                keep = kept_table(table, capacity)
                for mb in mbs:
                    self._plan(mb, keep[:, mb.index])
                routed, kept = table.sum(axis=(0, 1)), keep.sum(axis=(0, 1))
                padded = capacity - kept
                self._dispatch(layer, mbs[0])
            self._routing.append(LayerRouting(tuple(int(v) for v in routed), tuple(int(v) for v in kept),
                                              tuple(int(v) for v in padded), capacity))
            # B: per micro-batch, the shared expert, this card's experts, combine
            for mb in mbs:
                if cfg.shared_hidden:
                    with tl.compute(f"layers.{layer} shared mb{mb.index}"):
                        mb.shared = expert_mlp(ops, p, "shared", mb.h)
                recv = self.issuer.wait(mb.dispatch)
                if capacity is not None and mb.index + 1 < len(mbs):
                    self._dispatch(layer, mbs[mb.index + 1])
                out = self._experts(layer, p, mb, recv, padded if mb.index == len(mbs) - 1 else None)
                back = ops.device.empty((sum(mb.rows_to), out.shape[1]), out.dtype, "activation")
                d = out.shape[1]
                mb.combine = self.issuer.issue(f"layers.{layer} combine mb{mb.index}", self.comm.all_to_all_v, out,
                                               [r * d for r in mb.rows_from], None, back, [r * d for r in mb.rows_to], None)
                mb.layer = layer
        for mb in mbs:
            self._finish(mb)
        with tl.compute("head"):
            hp = self.head
            outs = [ops.linear(ops.mean(ops.layer_norm(mb.x, hp["ln.gamma"], hp["ln.beta"]), axis=1), hp["classifier.weight"],
                               hp["classifier.bias"]) for mb in mbs]
        return outs[0] if len(outs) == 1 else np.concatenate(outs)

    # -- the steps of one micro-batch -------------------------------------------------------------
    def _attend(self, p: dict, mb: "_MicroBatch") -> None:
        """1. attention, LayerNorm and the router."""
        ops, cfg = self.ops, self.model.config
        mb.x = attention_residual(ops, p, mb.x, cfg.heads)
        b, s, d = mb.x.shape
        mb.h = ops.layer_norm(mb.x, p["ln2.gamma"], p["ln2.beta"]).reshape(b * s, d)
        mb.experts, mb.gates = route(ops, mb.h, p["router.weight"], p["router.bias"], cfg.top_k, self.model.skew,
                                     mb.first_token)

    def _counts(self, layer: int, mbs: list["_MicroBatch"]) -> np.ndarray:
        """2. every card's assignments per (micro-batch, expert): ``(cards, len(mbs), experts)``."""
        experts = self.model.config.experts
        counts = np.stack([np.bincount(mb.experts.ravel(), minlength=experts) for mb in mbs]).astype(np.int64)
        with self.timeline.comm(f"layers.{layer} all_gather routing counts"):
            return self.comm.all_gather(counts) if self.comm.size > 1 else counts[None]

    def _plan(self, mb: "_MicroBatch", kept: np.ndarray) -> None:
        """Which rows go where: ``kept[card, expert]`` assignments kept for this micro-batch.
        Send rows ``(token, slot)`` in order of destination card, then expert, then token."""
        me, owner, mine = self.comm.rank, self.owner, list(self.mine)
        tok_parts, slot_parts, rows_to = [], [], [0] * self.comm.size
        for e in range(len(owner)):  # experts ascend with their owner card
            tokens, slot = np.nonzero(mb.experts == e)
            n = int(kept[me, e])
            tok_parts.append(tokens[:n])
            slot_parts.append(slot[:n])
            rows_to[owner[e]] += n
        mb.tok, mb.slot, mb.rows_to = np.concatenate(tok_parts), np.concatenate(slot_parts), rows_to
        mb.rows_from = [int(kept[i, mine].sum()) for i in range(self.comm.size)]
        mb.kept = kept

    def _dispatch(self, layer: int, mb: "_MicroBatch") -> None:
        """3. pack the kept rows and issue their all_to_all_v."""
        ops, d = self.ops, mb.h.shape[1]
        with self.timeline.compute(f"layers.{layer} pack mb{mb.index}"):
            send = gather_rows(ops, mb.h, mb.tok)
        recv = ops.device.empty((sum(mb.rows_from), d), mb.h.dtype, "activation")
        mb.dispatch = self.issuer.issue(f"layers.{layer} dispatch mb{mb.index}", self.comm.all_to_all_v, send,
                                        [r * d for r in mb.rows_to], None, recv, [r * d for r in mb.rows_from], None)

    def _experts(self, layer: int, p: dict, mb: "_MicroBatch", recv: np.ndarray, padded: np.ndarray | None) -> np.ndarray:
        """4. this card's experts on the rows they received (grouped by source card, then
        expert), each padded by ``padded[e]`` rows if given; results in the same layout."""
        ops = self.ops
        out = ops.device.empty(recv.shape, recv.dtype, "activation")
        starts, at = {}, 0
        for i in range(self.comm.size):
            for e in self.mine:
                starts[i, e] = at
                at += int(mb.kept[i, e])
        with self.timeline.compute(f"layers.{layer} experts mb{mb.index}"):
            for e in self.mine:
                rows = np.concatenate([np.arange(starts[i, e], starts[i, e] + mb.kept[i, e]) for i in range(self.comm.size)])
                pad = 0 if padded is None else int(padded[e])
                if len(rows) + pad == 0:
                    continue
                y = expert_mlp(ops, p, f"experts.{e}", gather_rows(ops, recv, rows, pad))
                scatter_rows(ops, out, rows, y[:len(rows)])
        return out

    def _finish(self, mb: "_MicroBatch") -> None:
        """5-6. wait for the combine, the gate-weighted sum plus the shared expert, the residual."""
        if mb.combine is None:
            return
        ops = self.ops
        back = self.issuer.wait(mb.combine)
        mb.combine = None
        b, s, d = mb.x.shape
        with self.timeline.compute(f"layers.{mb.layer} unpack mb{mb.index}"):
            slots = ops.device.adopt(np.zeros((b * s, self.model.config.top_k, d), mb.h.dtype), "activation")
            scatter_rows(ops, slots, (mb.tok, mb.slot), back)
            ffn = weighted_sum(ops, mb.gates, slots)
            if mb.shared is not None:
                ffn = ops.add(ffn, mb.shared)
            mb.x = ops.add(mb.x, ffn.reshape(b, s, d))
        mb.shared = None


class _MicroBatch:
    """One micro-batch's state on its way through a layer."""

    def __init__(self, index: int, ids: np.ndarray, first_token: int):
        self.index = index
        self.ids = ids
        self.first_token = first_token  # position of its first token in the whole batch
        self.x = self.h = self.experts = self.gates = self.shared = None
        self.tok = self.slot = self.kept = None
        self.rows_to: list[int] = []
        self.rows_from: list[int] = []
        self.dispatch = self.combine = None
        self.layer = 0
