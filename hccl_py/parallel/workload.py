"""``dp-infer``: one data-parallel inference step as a workload the partition search judges
(``hccl_py.planning.partition``): the model's modeled compute on every card, then its outputs
all-gathered with the hierarchical all_gather on the partition.

    w = DpInferWorkload(batch_per_card=8)
    w.time_s(Topology.preset("mixed-4p"), ((0, 3), (1, 2)), CostModel(topo))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from topology import Topology
from topology.units import format_size

from ..algorithms.hierarchical import Partition, schedule_for
from ..errors import HcclParamError
from ..modeled.cost_model import CostModel
from ..modeled.simulator import simulate
from .transformer import TransformerEncoder


@dataclass(frozen=True)
class DpInferWorkload:
    """``dp-infer``: one step of data-parallel inference of the default model.

    Every card holds the whole model (:class:`~hccl_py.parallel.TransformerEncoder` with its
    default config in FP16, as Ascend inference runs, unless ``model`` is given) and runs ``batch_per_card`` samples of the step's
    global batch (``batch_per_card`` x cards): its modeled compute is ``Model.estimate`` on its own
    card (the same roofline the cards use at run time). Then the step's outputs — the encoder's
    per-token hidden states (``share x seq x d_model``, what a decoder or a token-level head on
    every card consumes), or with ``output="logits"`` just the classifier's logits — are
    all-gathered to every card with the *hierarchical* all_gather on the partition (level1
    across groups, then level0 inside), ``dtype_bytes`` per element on the wire (2: fp16, as
    Ascend inference runs). As :class:`~hccl_py.parallel.DataParallel` does, every card ends
    with the whole output; the partition changes only which links carry it. Modeled step time =
    the last card's end (compute and gather do not overlap); throughput = global batch / step
    time. One card's throughput is ``batch_per_card`` / its compute time for that batch (one
    card running the same batches back to back, no communication), so the speedup over one card
    is ``cards x compute / step time``.
    """

    batch_per_card: int = 64
    output: str = "hidden"
    dtype_bytes: int = 2
    inner: str = "ring"
    outer: str = "ring"
    model: object = field(default=None, compare=False)

    name = "dp-infer"

    def __post_init__(self):
        if self.batch_per_card < 1:
            raise HcclParamError(f"dp-infer: batch per card must be >= 1, got {self.batch_per_card}")
        if self.output not in ("hidden", "logits"):
            raise HcclParamError(f"dp-infer: output {self.output!r}: use hidden or logits")

    def _model(self):
        if self.model is None:
            object.__setattr__(self, "model", _default_model())
        return self.model

    def compute_s(self, topo: Topology, rank: int) -> float:
        """Modeled seconds of one card's share of the step."""
        return float(sum(self._model().estimate(topo.card(rank), self.batch_per_card)[0]))

    def count(self) -> int:
        """Elements of one card's outputs."""
        model = self._model()
        index = len(model.blocks) - (1 if self.output == "hidden" else 0)
        shape, _ = model.boundary_spec(self.batch_per_card, index)
        return int(np.prod(shape))

    def _starts(self, topo: Topology) -> list[float]:
        return [self.compute_s(topo, r) for r in range(topo.num_ranks)]

    def time_s(self, topo: Topology, partition: Partition, model: CostModel) -> float:
        """Modeled step time on ``partition``: each card's compute, then the hierarchical all_gather of the
        outputs starting from those clocks; the last card's end."""
        fn = schedule_for("allgather", partition, self.inner, self.outer)
        return max(
            simulate(
                "allgather",
                fn,
                topo,
                self.count(),
                itemsize=self.dtype_bytes,
                cost_model=model,
                start_clocks=self._starts(topo),
            ).end_clocks
        )

    def flat_time_s(self, topo: Topology, algo: str, model: CostModel) -> float:
        """Modeled step time with a flat all_gather of algorithm ``algo`` instead: the
        reference without groups."""
        return max(
            simulate(
                "allgather",
                algo,
                topo,
                self.count(),
                itemsize=self.dtype_bytes,
                cost_model=model,
                start_clocks=self._starts(topo),
            ).end_clocks
        )

    def one_card_s(self, topo: Topology) -> float | None:
        """Seconds one card takes for the same global batch at its own pace (per-card batches
        back to back): cards x compute."""
        return topo.num_ranks * self.compute_s(topo, 0)

    def describe(self, topo: Topology) -> str:
        """The workload in words: model, batch per card, what is all-gathered and how."""
        model = self._model()
        what = "per-token hidden states" if self.output == "hidden" else "logits"
        per = self.count() * self.dtype_bytes
        return (
            f"dp-infer: {model.describe()}; {self.batch_per_card} samples per card "
            f"(global batch {self.batch_per_card * topo.num_ranks}); outputs ({what}, {format_size(per)} per card) "
            f"all-gathered to every card, hierarchical {self.inner}/{self.outer}"
        )


@lru_cache(maxsize=1)
def _default_model():
    return TransformerEncoder(dtype=np.float16)
