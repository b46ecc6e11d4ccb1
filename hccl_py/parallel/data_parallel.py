"""Data parallelism: a global batch sharded over the ranks of a communicator, each rank running a
whole replica, the outputs gathered back in the original order on every rank.

A replica is a *runner*: a :class:`~hccl_py.parallel.model.ModelShard` holding the whole model on
this card, or a :class:`~hccl_py.parallel.pipeline_parallel.PipelineParallel` over other ranks
(hybrid: data parallelism over pipelines). Runners provide ``forward(x, splits)``,
``piece_costs(sizes)`` (modeled seconds per piece, agreed over the replica's ranks) and
``output_spec(n)``.

Sharding policies (``sharding.py``): ``even``; ``proportional`` to each replica's speed;
``work-stealing`` in chunks, replayed in modeled time so that it is deterministic. Costs are dry
runs of the replica on its own card (model and slow factor), exchanged with one small all_gather;
the outputs travel back with one all_gather (padded to the largest share).

Example (4 ranks)::

    comm = hccl_py.init()
    model = TransformerEncoder()
    dp = DataParallel(comm, model, policy="work-stealing", chunk=4)
    logits = dp.forward(model.sample_inputs(64))      # (64, 10) on every rank, original order
    dp.plan.counts                                    # samples per rank, e.g. (16, 16, 16, 16)

Hybrid (2 pipelines of 2 stages on 4 ranks)::

    pp_comm, dp_comm = hybrid_groups(comm, stages=2)
    dp = DataParallel(dp_comm, PipelineParallel(pp_comm, model, microbatches=4))
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..communicator import Communicator
from ..errors import HcclParamError
from .model import Model
from .sharding import POLICIES, ShardPlan, chunk_ranges, even_plan, proportional_plan, work_stealing_plan
from .timeline import Timeline


class DataParallel:
    """Shard batches over ``comm``'s ranks; ``replica`` is a :class:`Model` (loaded whole onto this
    rank's card) or a runner. ``policy``: ``even``, ``proportional`` or ``work-stealing``;
    ``chunk``: samples per work-stealing chunk; by default the power of two (up to an even
    share) whose modeled replay finishes first — small chunks balance finely, but every chunk
    pays the kernels' fixed costs again."""

    def __init__(
        self,
        comm: Communicator,
        replica,
        *,
        policy: str = "even",
        chunk: int | None = None,
        timeline: Timeline | None = None,
    ):
        if policy not in POLICIES:
            raise HcclParamError(f"DataParallel: policy {policy!r} is not one of {', '.join(POLICIES)}")
        if chunk is not None and chunk < 1:
            raise HcclParamError(f"DataParallel: chunk must be >= 1 sample, got {chunk}")
        self.comm = comm
        self.policy = policy
        self.chunk = chunk
        self.timeline = (
            timeline if timeline is not None else getattr(replica, "timeline", None) or Timeline(comm.device)
        )
        self.runner = replica.load(comm.device) if isinstance(replica, Model) else replica
        if getattr(self.runner, "timeline", "absent") is None:  # a ModelShard records into ours
            self.runner.timeline = self.timeline
        self.plan: ShardPlan | None = None

    # -- planning ---------------------------------------------------------------------------------
    def _gather_costs(self, sizes: list[int]) -> np.ndarray:
        """Every replica's modeled seconds for pieces of ``sizes``: shape (ranks, len(sizes))."""
        with self.timeline.comm("plan: exchange costs"):
            mine = np.array(self.runner.piece_costs(sizes), np.float64)  # a pipeline agrees over its stages
            return mine.reshape(1, -1) if self.comm.size == 1 else self.comm.all_gather(mine)

    def make_plan(self, n: int) -> ShardPlan:
        """The shard plan for a batch of ``n`` (collective when the policy needs costs)."""
        p = self.comm.size
        if self.policy == "even" or p == 1:
            return even_plan(n, p)
        if self.policy == "proportional":
            ref = max(1, math.ceil(n / p))
            costs = self._gather_costs([ref])[:, 0]
            return proportional_plan(n, [ref / c if c > 0 else 1.0 for c in costs])
        share = max(1, math.ceil(n / p))
        candidates = (
            [self.chunk] if self.chunk else sorted({*(2**k for k in range(share.bit_length()) if 2**k <= share), share})
        )
        cut = {c: chunk_ranges(n, c) for c in candidates}
        sizes = sorted({b - a for chunks in cut.values() for a, b in chunks})
        table = self._gather_costs(sizes)
        column = {size: i for i, size in enumerate(sizes)}
        best = None
        for c in candidates:  # chunk="auto": the chunk size whose replay finishes first (ties: larger)
            costs = [[float(table[r, column[b - a]]) for a, b in cut[c]] for r in range(p)]
            plan = work_stealing_plan(n, c, costs)
            if best is None or max(plan.predicted_s, default=0.0) <= max(best.predicted_s, default=0.0):
                best = plan
        return best

    # -- forward ------------------------------------------------------------------------------------
    def forward(self, x: np.ndarray, *, on_piece: Callable[[int], None] | None = None) -> np.ndarray:
        """Run the global batch ``x`` (the same on every rank) and return the whole output, in
        the original sample order, on every rank."""
        n = len(x)
        plan = self.plan = self.make_plan(n)
        me = self.comm.rank
        ranges = plan.pieces[me]
        if len(ranges) == 1:
            mine = x[ranges[0][0] : ranges[0][1]]
        else:
            mine = np.concatenate([x[a:b] for a, b in ranges]) if ranges else x[:0]
        splits = plan.sizes(me) if plan.policy == "work-stealing" else None
        out = self.runner.forward(mine, splits, on_piece=on_piece) if len(mine) else None
        return self._gather(plan, out, n)

    def _gather(self, plan: ShardPlan, out: np.ndarray | None, n: int) -> np.ndarray:
        shape, dtype = self.runner.output_spec(n)
        if self.comm.size == 1:
            return out if out is not None else np.empty(shape, dtype)
        width = max(plan.counts)
        padded = np.zeros((width, *shape[1:]), dtype)
        if out is not None:
            padded[: len(out)] = out
        with self.timeline.comm("all_gather outputs"):
            table = self.comm.all_gather(padded)
        result = np.empty(shape, dtype)
        for r, ranges in enumerate(plan.pieces):
            at = 0
            for a, b in ranges:
                result[a:b] = table[r, at : at + (b - a)]
                at += b - a
        return self.comm.device.adopt(result, "output")
