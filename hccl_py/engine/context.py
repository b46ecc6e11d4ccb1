"""What every communicator of one rank shares: the executor engine, the simulated card, the
topology and its cost model, the flight recorder, the injected faults, and the settings read at
init; and how a rank builds it from its :class:`~hccl_py.job.JobConfig` (``make_context``)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from topology import Topology, TopologyError, default_preset, load_figures

from .. import env
from ..env import HCCL_DETERMINISTIC
from ..errors import HcclNotSupportedError, HcclParamError
from ..faults import Fault
from ..job import JobConfig, read_job
from ..modeled.card import Device
from ..modeled.cost_model import CostModel
from ..records import CallRecord, Recorder
from .executor import Engine


@dataclass
class RankContext:
    """One rank's shared state (see the module doc), built by :func:`make_context` and held by every
    communicator of the rank. ``wall_origin``: the ``time.monotonic()`` reading that wall seconds in
    reports count from (the launcher's, else this rank's init)."""

    engine: Engine
    device: Device
    topology: Topology
    exec_timeout_s: float | None
    algo_env: dict[str, str]
    wall_origin: float
    deterministic: str = "false"  # HCCL_DETERMINISTIC: which executors HCCL's selection picks
    modeled: bool = True  # False: HCCL_PY_MODELED_TIME=0, clocks stay at 0 (to measure what modeling costs)
    faults: list[Fault] = field(default_factory=list)  # every fault of the job (all ranks)
    flight_dir: str | None = None  # where dump() writes flight_rank<r>.json (HCCL_PY_FLIGHT_DIR)
    cost_model: CostModel = field(init=False)
    recorder: Recorder = field(default_factory=Recorder)
    pending_faults: list[Fault] = field(init=False)  # this rank's call faults not yet fired
    _reasons: list[str] = field(default_factory=list)  # why the flight recorder was dumped, in order
    _scratch: np.ndarray | None = None

    def __post_init__(self) -> None:
        rank = self.device.rank
        degraded = {f.link: f.factor for f in self.faults if f.action == "degrade"}
        self.cost_model = CostModel(self.topology, degraded=degraded)
        for fault in self.faults:
            if fault.action == "slow" and fault.rank == rank:
                self.device.slow_factor = fault.factor
        self.pending_faults = [
            f for f in self.faults if f.rank == rank and f.action in ("hang", "crash", "delay", "drop")
        ]

    def scratch(self, count: int, dtype: np.dtype) -> np.ndarray:
        """A scratch array (a schedule's TMP), reused from call to call: memory touched for the
        first time is slow (page faults), and a call never needs two scratch arrays at once."""
        need = count * dtype.itemsize
        if self._scratch is None or self._scratch.nbytes < need:
            self._scratch = np.empty(max(need, 4096), np.uint8)
        return self._scratch[:need].view(dtype)

    def inject(self, record: CallRecord, *, on_device: bool = True) -> float:
        """Fire this rank's faults that match the call just entered (each fires once); returns
        the seconds of an injected delay. ``on_device=False`` (a call entered on the progress
        thread, whose shape was settled there) leaves the card's clock to its own thread: the
        caller then starts the call that much later instead."""
        late = 0.0
        for fault in list(self.pending_faults):
            if not fault.matches(record.op, record.seq, record.comm):
                continue
            self.pending_faults.remove(fault)
            where = f"{record.op} #{record.seq} on communicator '{record.comm}'"
            if fault.action == "delay":
                time.sleep(fault.seconds)
                late += fault.seconds  # late in modeled time too: the same spec, the same outcome
                if on_device:
                    self.device.clock += fault.seconds
                    self.device.time.compute_s += fault.seconds
                    record.modeled_start = self.device.clock
            elif fault.action == "drop":
                self.engine.drop_next_message = True
            elif fault.action == "crash":
                self.dump(f"injected crash ({fault.spec}) entering {where}")
                print(
                    f"hccl-py: rank {self.device.rank}: injected crash ({fault.spec}) entering {where}",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(1)
            elif fault.action == "hang":
                self.dump(f"injected hang ({fault.spec}) in {where}")
                while True:  # until the launcher stops this rank
                    time.sleep(3600)
        return late

    def dump(self, reason: str) -> Path | None:
        """Write the flight recorder to HCCL_PY_FLIGHT_DIR (set by hccl-launch), if any. A later
        dump (say, on the SIGTERM that stops a hung rank) keeps the first reason: the cause."""
        self._reasons.append(reason)
        if not self.flight_dir:
            return None
        return self.recorder.dump(
            Path(self.flight_dir) / f"flight_rank{self.device.rank}.json",
            rank=self.device.rank,
            reason=self._reasons[0],
            wall_origin=self.wall_origin,
            extra={**self.summary(), "events": list(self._reasons)},
        )

    def summary(self) -> dict:
        """Modeled clock and time split of this card, for reports."""
        t = self.device.time
        return {
            "clock": self.device.clock,
            "compute_s": t.compute_s,
            "comm_s": t.comm_s,
            "wait_s": t.wait_s,
            "waited_for": {str(k): v for k, v in sorted(self.device.waited_for.items())},
            "slow_factor": self.device.slow_factor,
            "peak_bytes": self.device.peak_bytes,
        }


def load_topology(
    size: int | None, *, preset: str | None = None, rank_table: str | None = None, figures: str | None = None
) -> Topology:
    """The modeled cluster: the rank table at ``rank_table``, else the ``preset``, else the
    default preset for ``size`` cards; link and card figures overridden from the JSON file
    ``figures`` (as RANK_TABLE_FILE, HCCL_PY_TOPOLOGY and HCCL_PY_FIGURES say). ``size`` None:
    the preset's or the rank table's own cards, unchecked (a host's cards on a larger cluster)::

        load_topology(8).name        # 'ascend910-8p'
    """
    try:
        loaded = load_figures(figures) if figures else None
        if rank_table:
            from topology import RankTable

            topology = Topology.from_rank_table(RankTable.load(rank_table), preset=preset, figures=loaded)
        else:
            topology = Topology.preset(preset or default_preset(size or 1), n=size, figures=loaded)
    except TopologyError as err:
        raise HcclParamError(f"topology: {err}") from None
    if size is not None and topology.num_ranks != size:
        raise HcclParamError(
            f"topology '{topology.name}' has {topology.num_ranks} cards but the job has {size} ranks; "
            f"choose a preset or rank table with {size} cards"
        )
    return topology


def make_context(job: JobConfig, engine: Engine) -> RankContext:
    """This rank's shared state for ``job`` around ``engine``: its card on the modeled cluster,
    the settings and faults the job was started with."""
    topology = load_topology(job.size, preset=job.topology, rank_table=job.rank_table, figures=job.figures)
    card = topology.card(job.rank).name
    if job.deterministic == "strict" and card != "ascend910b":  # externalinput.cc L591-600: 910B and A3 only
        raise HcclNotSupportedError(
            f"{HCCL_DETERMINISTIC}=strict: HCCL takes it on 910B (and A3) only, not on this "
            f"rank's {card}; use true or false",
            variable=HCCL_DETERMINISTIC,
            value="strict",
            card=card,
        )
    wall_origin = job.wall_origin if job.wall_origin is not None else time.monotonic()
    return RankContext(
        engine,
        Device(topology.card(job.rank), job.rank),
        topology,
        job.exec_timeout_s,
        job.algo,
        wall_origin,
        deterministic=job.deterministic,
        modeled=job.modeled_time,
        faults=list(job.faults),
        flight_dir=job.flight_dir,
    )


def device_count_from_env(environ=None) -> int:
    """Cards this host shows (torch's npu device, AscendCL's ``aclrtGetDeviceCount``):
    ``HCCL_PY_NPU_DEVICES`` (hccl-npu), else LOCAL_WORLD_SIZE (hccl-launch, torchrun), else 1."""
    environ = os.environ if environ is None else environ
    for name in (env.HCCL_PY_NPU_DEVICES, env.LOCAL_WORLD_SIZE):
        text = (environ.get(name) or "").strip()
        if text:
            if not text.isdigit() or not 1 <= int(text) <= 64:
                raise HcclParamError(
                    f"{name}={text!r}: expected a count of NPUs from 1 to 64",
                    arg=name,
                    value=text,
                    rule="range",
                    min=1,
                    max=64,
                )
            return int(text)
    return 1


def host_cards(count: int, environ: Mapping[str, str] | None = None) -> list:
    """Each of this host's ``count`` cards' model on the modeled cluster (HCCL_PY_TOPOLOGY /
    RANK_TABLE_FILE as the runtime reads them from ``environ``, default the process's, else the
    default preset): its HBM is the pool's capacity (torch's npu device, AscendCL's
    ``aclrtMalloc``). HcclParamError when the topology has fewer cards (hccl-npu checks first)."""
    environ = os.environ if environ is None else environ
    job = read_job(
        {k: v for k, v in environ.items() if k not in (env.RANK, env.WORLD_SIZE)}
        | {env.RANK: "0", env.WORLD_SIZE: environ.get(env.WORLD_SIZE) or str(count)}
    )
    topology = load_topology(job.size, preset=job.topology, rank_table=job.rank_table, figures=job.figures)
    return [topology.card(i % job.size) for i in range(count)]
