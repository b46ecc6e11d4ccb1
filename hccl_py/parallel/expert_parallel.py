"""Expert parallelism for the mixture-of-experts model of ``moe.py``: the experts are spread over
the cards, tokens travel to their experts and back with ``all_to_all_v`` (HCCL's AlltoAllV, as
MoE inference on Ascend dispatches and combines them).

:class:`ExpertParallel`: each card holds the attention, router and shared
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

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..communicator import Communicator
from ..errors import HcclParamError
from .moe import LayerRouting, MoETransformer, expert_mlp, gather_rows, kept_table, route, scatter_rows, weighted_sum
from .overlap import OverlapDriver
from .sharding import even_split
from .timeline import Timeline
from .transformer import attention_residual


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

    def __init__(
        self,
        comm: Communicator,
        model: MoETransformer,
        *,
        overlap: bool = False,
        chunks: int | None = None,
        timeline: Timeline | None = None,
    ):
        if not isinstance(model, MoETransformer):
            raise HcclParamError(
                f"ExpertParallel: needs an MoETransformer, got {model.name}", arg="model", value=model.name
            )
        cfg = model.config
        if cfg.experts < comm.size:
            raise HcclParamError(
                f"ExpertParallel: {cfg.experts} experts cannot spread over {comm.size} cards; use at most "
                f"{cfg.experts} cards or more experts",
                arg="experts",
                value=cfg.experts,
                rule="range",
                expected=f">= {comm.size}",
            )
        super().__init__("ExpertParallel", comm, model, overlap, chunks, timeline)
        counts = even_split(cfg.experts, comm.size)
        self.owner = tuple(c for c, n in enumerate(counts) for _ in range(n))
        self.mine = tuple(e for e in range(cfg.experts) if self.owner[e] == comm.rank)
        load, dev = model.load_tensor, comm.device
        self.embed = {n: load(dev, 0, n) for n in ("tokens", "positions")}
        self.layers: list[dict[str, np.ndarray]] = []
        for i in range(1, 1 + cfg.layers):
            block = model.blocks[i]
            wanted = [
                s.name
                for s in block.params
                if not s.name.startswith("experts.") or int(s.name.split(".")[1]) in self.mine
            ]
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
        y = self._run(x[start : start + shares[me]], n * self.model.config.seq_len, start)
        cfg = self.model.config
        layers = tuple(self._routing)
        total = lambda field: tuple(int(sum(getattr(r, field)[e] for r in layers)) for e in range(cfg.experts))  # noqa: E731
        self.last = ExpertParallelRun(
            total("routed"),
            total("kept"),
            total("padded"),
            self.owner,
            tuple(r.capacity for r in layers),
            self.chunks,
            layers,
        )
        if on_piece is not None:
            on_piece(shares[me])
        shape, dtype = self.model.output_spec(n)
        if p == 1:
            return y
        padded = np.zeros((max(shares), *shape[1:]), dtype)
        padded[: len(y)] = y
        with self.timeline.comm("all_gather outputs"):
            table = self.comm.all_gather(padded)
        out = np.empty(shape, dtype)
        at = 0
        for r, share in enumerate(shares):
            out[at : at + share] = table[r, :share]
            at += share
        return self.device.adopt(out, "output")

    def _run(self, ids: np.ndarray, tokens: int, first: int) -> np.ndarray:
        """This card's sequences through every layer, in ``chunks`` micro-batches (module doc)."""
        ops, tl, cfg = self.ops, self.timeline, self.model.config
        capacity = cfg.capacity(tokens)
        mbs = []
        at = 0
        for size in even_split(len(ids), self.chunks):
            mbs.append(_MicroBatch(len(mbs), ids[at : at + size], (first + at) * cfg.seq_len))
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
            self._routing.append(
                LayerRouting(
                    tuple(int(v) for v in routed), tuple(int(v) for v in kept), tuple(int(v) for v in padded), capacity
                )
            )
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
                mb.combine = self.issuer.issue(
                    f"layers.{layer} combine mb{mb.index}",
                    self.comm.all_to_all_v,
                    out,
                    [r * d for r in mb.rows_from],
                    None,
                    back,
                    [r * d for r in mb.rows_to],
                    None,
                )
                mb.layer = layer
        for mb in mbs:
            self._finish(mb)
        with tl.compute("head"):
            hp = self.head
            outs = [
                ops.linear(
                    ops.mean(ops.layer_norm(mb.x, hp["ln.gamma"], hp["ln.beta"]), axis=1),
                    hp["classifier.weight"],
                    hp["classifier.bias"],
                )
                for mb in mbs
            ]
        return outs[0] if len(outs) == 1 else np.concatenate(outs)

    # -- the steps of one micro-batch -------------------------------------------------------------
    def _attend(self, p: dict, mb: "_MicroBatch") -> None:
        """1. attention, LayerNorm and the router."""
        ops, cfg = self.ops, self.model.config
        mb.x = attention_residual(ops, p, mb.x, cfg.heads)
        b, s, d = mb.x.shape
        mb.h = ops.layer_norm(mb.x, p["ln2.gamma"], p["ln2.beta"]).reshape(b * s, d)
        mb.experts, mb.gates = route(
            ops, mb.h, p["router.weight"], p["router.bias"], cfg.top_k, self.model.skew, mb.first_token
        )

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
        mb.dispatch = self.issuer.issue(
            f"layers.{layer} dispatch mb{mb.index}",
            self.comm.all_to_all_v,
            send,
            [r * d for r in mb.rows_to],
            None,
            recv,
            [r * d for r in mb.rows_from],
            None,
        )

    def _experts(
        self, layer: int, p: dict, mb: "_MicroBatch", recv: np.ndarray, padded: np.ndarray | None
    ) -> np.ndarray:
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
                rows = np.concatenate(
                    [np.arange(starts[i, e], starts[i, e] + mb.kept[i, e]) for i in range(self.comm.size)]
                )
                pad = 0 if padded is None else int(padded[e])
                if len(rows) + pad == 0:
                    continue
                y = expert_mlp(ops, p, f"experts.{e}", gather_rows(ops, recv, rows, pad))
                scatter_rows(ops, out, rows, y[: len(rows)])
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
