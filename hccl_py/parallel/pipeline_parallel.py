"""Pipeline parallelism: a model's blocks cut into stages over the ranks of a communicator;
micro-batches flow stage to stage with ``send``/``recv`` over the topology's links.

Schedule: fill-drain. Stage ``s`` takes micro-batch ``i`` (from the input on stage 0, else a
``recv`` from stage ``s-1``), runs its blocks and sends the activation on to ``s+1``; the last
stage keeps the outputs and broadcasts the whole output to every stage at the end. For inference
there is no backward pass, so 1F1B degenerates to exactly this order; an interleaved schedule
would only add hops. With ``p`` equal stages and ``m`` micro-batches the idle share of the
pipeline (the *bubble*) is ``(p-1)/(m+p-1)`` — see :attr:`PipelineParallel.last`.

Stage balancing (``split="balanced"``): every stage computes the same cut from dry-run costs of
each block on each stage's card (its model and slow factor, exchanged once) plus the transfer of
the activation to the next stage over that route; the cut minimises the slowest stage
(``balance.balanced_split``). Or an explicit ``split=[blocks per stage]``.

Modeled time: a ``send`` occupies the sender for the transfer (latency + bytes / link bandwidth),
a ``recv`` waits for the sender (the executor counts the part before the sender even sent as
*waiting*, the transfer as communication).

Example (4 ranks, 4 stages)::

    comm = hccl_py.init()
    model = TransformerEncoder(TransformerConfig(layers=8))
    pp = PipelineParallel(comm, model, microbatches=8)
    logits = pp.forward(model.sample_inputs(64))      # the full output, on every stage
    pp.last.bubble_fraction                           # ~ (p-1)/(m+p-1) for equal stages
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..communicator import Communicator
from ..errors import HcclParamError
from ..modeled.cost_model import transfer_s
from .balance import balanced_split, split_from_counts, stage_times
from .model import Model
from .sharding import even_split
from .timeline import Timeline


@dataclass(frozen=True)
class PipelineRun:
    """One forward's pipeline phase (first micro-batch in to last out; the final broadcast of the
    output is not part of it), in modeled seconds. ``stage_*`` lists are per stage;
    ``bubble_fraction`` is the mean of ``stage_bubble``: the share of the span a stage is
    neither computing nor transferring."""

    microbatches: int
    start_s: float
    end_s: float
    stage_busy_s: tuple[float, ...]
    stage_bubble: tuple[float, ...]

    @property
    def span_s(self) -> float:
        """Modeled seconds from the first micro-batch in to the last out."""
        return self.end_s - self.start_s

    @property
    def bubble_fraction(self) -> float:
        """The mean over the stages of ``stage_bubble`` (0 with no stages)."""
        return sum(self.stage_bubble) / len(self.stage_bubble) if self.stage_bubble else 0.0


def ideal_bubble(stages: int, microbatches: int) -> float:
    """The fill-drain bubble of equal stages without communication: ``(p-1)/(m+p-1)``."""
    return (stages - 1) / (microbatches + stages - 1)


class PipelineParallel:
    """``model``'s blocks split into ``comm.size`` stages, stage ``comm.rank`` on this card.

    ``microbatches``: how many pieces ``forward`` cuts a batch into when no ``splits`` are given.
    ``split``: ``"balanced"``, a list of blocks per stage, or the text ``"3,3,2,2"``.
    ``balance_batch``: micro-batch size the balancing estimates costs at.
    """

    def __init__(
        self,
        comm: Communicator,
        model: Model,
        *,
        microbatches: int = 8,
        split: "str | Sequence[int]" = "balanced",
        balance_batch: int = 8,
        timeline: Timeline | None = None,
    ):
        if microbatches < 1:
            raise HcclParamError(f"PipelineParallel: microbatches must be >= 1, got {microbatches}")
        self.comm = comm
        self.model = model
        self.microbatches = int(microbatches)
        self.stages = comm.size
        self.stage = comm.rank
        self.device = comm.device
        self.timeline = timeline if timeline is not None else Timeline(comm.device)
        n = len(model.blocks)
        if self.stages > n:
            raise HcclParamError(
                f"PipelineParallel: {self.stages} stages but {model.name} has only {n} blocks; use at most {n} stages"
            )
        slows = self._slow_factors()
        self._cards = [comm.topology.card(w) for w in comm.world_ranks]
        self._slows = slows
        costs = [model.estimate(self._cards[s], balance_batch, slows[s])[0] for s in range(self.stages)]
        specs = model.estimate(self._cards[0], balance_batch)[1]
        send = [[self._send_s(s, specs[j + 1]) for j in range(n)] for s in range(self.stages - 1)]
        if isinstance(split, str) and split.strip().lower() == "balanced":
            self.bounds = balanced_split(costs, send)
        else:
            counts = [int(c) for c in split.split(",")] if isinstance(split, str) else list(split)
            if len(counts) != self.stages:
                raise HcclParamError(
                    f"PipelineParallel: split {counts} has {len(counts)} stages, the communicator {self.stages}"
                )
            self.bounds = split_from_counts(counts, n)
        #: modeled seconds per stage for one micro-batch of ``balance_batch`` (compute + send)
        self.estimated_stage_s = stage_times(self.bounds, costs, send)
        lo, hi = self.bounds[self.stage], self.bounds[self.stage + 1]
        self.shard = model.load(comm.device, range(lo, hi))
        self.last: PipelineRun | None = None

    # -- description ---------------------------------------------------------------------------
    def stage_blocks(self, stage: int) -> list[str]:
        """Block names of ``stage``."""
        return self.model.block_names[self.bounds[stage] : self.bounds[stage + 1]]

    def _slow_factors(self) -> list[float]:
        mine = np.array([self.device.slow_factor], np.float64)
        return [float(v) for v in (self.comm.all_gather(mine).reshape(-1) if self.comm.size > 1 else mine)]

    def _send_s(self, stage: int, spec) -> float:
        shape, dtype = spec
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        topo = self.comm.topology
        src, dst = self.comm.world_ranks[stage], self.comm.world_ranks[stage + 1]
        return transfer_s(topo, src, dst, nbytes, Counter(topo.route(src, dst).hops), collective=False)

    def _sizes(self, n: int, splits: Sequence[int] | None) -> list[int]:
        sizes = even_split(n, min(self.microbatches, n)) if splits is None else [int(s) for s in splits]
        if sum(sizes) != n or any(s < 1 for s in sizes):
            raise HcclParamError(
                f"PipelineParallel.forward: micro-batch sizes {sizes} must be >= 1 and add up to the batch of {n}"
            )
        return sizes

    # -- runner protocol (DataParallel over pipelines) ----------------------------------------------------
    def output_spec(self, batch: int):
        """(shape, dtype) of the output for a batch of ``batch``: the model's, on every stage."""
        return self.model.output_spec(batch)

    def piece_costs(self, sizes: Sequence[int]) -> list[float]:
        """Steady-state modeled seconds per piece of each size: the slowest stage's compute plus
        send (one all_reduce(max) over the stages, so every stage returns the same)."""
        lo, hi = self.bounds[self.stage], self.bounds[self.stage + 1]
        card, slow = self.device.model, self.device.slow_factor
        mine = []
        for size in sizes:
            if size < 1:
                mine.append(0.0)
                continue
            costs, specs = self.model.estimate(card, int(size), slow)
            t = sum(costs[lo:hi])
            if self.stage < self.stages - 1:
                t += self._send_s(self.stage, specs[hi])
            mine.append(t)
        values = np.array(mine, np.float64)
        if self.stages > 1 and values.size:
            self.comm.all_reduce(values, op="max")
        return values.tolist()

    # -- the pipeline ------------------------------------------------------------------------------------
    def forward(
        self, x: np.ndarray, splits: Sequence[int] | None = None, *, on_piece: Callable[[int], None] | None = None
    ) -> np.ndarray:
        """Run the batch ``x`` through the pipeline; every stage passes the same ``x`` (only stage 0
        reads its values) and gets the whole output back. ``splits``: micro-batch sizes."""
        n = len(x)
        out_shape, out_dtype = self.model.output_spec(n)
        if n == 0:
            return np.empty(out_shape, out_dtype)
        sizes = self._sizes(n, splits)
        comm, dev, tl = self.comm, self.device, self.timeline
        s, last = self.stage, self.stages - 1
        start, compute0, comm0 = dev.clock, dev.time.compute_s, dev.time.comm_s
        outs, at = [], 0
        for i, size in enumerate(sizes):
            if s == 0:
                inp = x[at : at + size]
            else:
                shape, dtype = self.model.boundary_spec(size, self.bounds[s])
                inp = dev.empty(shape, dtype, "activation")
                with tl.comm(f"recv mb {i} <- stage {s - 1}"):
                    comm.recv(inp, src=s - 1)
            y = self.shard.run_blocks(inp, tl, f"mb {i} ")
            if s < last:
                with tl.comm(f"send mb {i} -> stage {s + 1}"):
                    comm.send(y, dst=s + 1)
            else:
                outs.append(y)
            at += size
            if on_piece is not None:
                on_piece(size)
        end = dev.clock
        busy = (dev.time.compute_s - compute0) + (dev.time.comm_s - comm0)
        if s == last:
            out = np.concatenate(outs) if len(outs) > 1 else np.ascontiguousarray(outs[0])
            dev.adopt(out, "output")
        else:
            out = dev.empty(out_shape, out_dtype, "output")
        if self.stages > 1:
            with tl.comm("broadcast output"):
                comm.broadcast(out, root=last)
            with tl.comm("all_gather stage times"):
                table = comm.all_gather(np.array([start, end, busy], np.float64))
        else:
            table = np.array([[start, end, busy]])
        span_start, span_end = float(table[:, 0].min()), float(table[:, 1].max())
        span = span_end - span_start
        bubbles = tuple(max(0.0, 1.0 - float(b) / span) if span > 0 else 0.0 for b in table[:, 2])
        self.last = PipelineRun(len(sizes), span_start, span_end, tuple(float(b) for b in table[:, 2]), bubbles)
        return out
