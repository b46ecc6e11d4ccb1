"""What every communicator of one rank shares: the executor engine, the simulated card, the
topology and its cost model, the call records, and the settings read at init."""

from __future__ import annotations

from dataclasses import dataclass, field

from topology import Topology

from .cost_model import CostModel
from .device import Device
from .executor import Engine
from .records import Recorder


@dataclass
class RankContext:
    engine: Engine
    device: Device
    topology: Topology
    exec_timeout_s: float | None
    algo_env: dict[str, str]
    wall_origin: float
    modeled: bool = True  # False: HCCL_PY_MODELED_TIME=0, clocks stay at 0 (to measure what modeling costs)
    cost_model: CostModel = field(init=False)
    recorder: Recorder = field(default_factory=Recorder)

    def __post_init__(self) -> None:
        self.cost_model = CostModel(self.topology)
