"""The model held against public measurements of real HCCL and Ascend cards.

``measurements.json`` (next to this file) holds every public measurement found: source URL,
hardware, CANN version, tool, collective, cards, servers, size, the measured value, how the source
defines its bandwidth, the source's own sentence or table row, and how the model evaluates the same
thing (``model``). A row with a ``tolerance`` (relative: 0.15 = within 15%) or a ``factor`` (2.0 =
within 2x) is *held*: ``hccl-sim validate`` fails when the model drifts beyond it. A row without
either says why in ``not_held`` (and docs/fidelity.md says more)::

    checks = validate()                      # one Check per row, model beside measurement
    print(format_checks(checks))
    assert all(c.ok for c in checks if c.held)

A modeled answer says how sure it is (:func:`nearest`, :func:`sureness`): the nearest held row of
the same collective, card, link class, server count and rank count, its size within 4x, and the
model's error there; or that no row is that near and the figure is extrapolated.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from topology import Topology
from topology import figures as fig
from topology.figures import CARD_MODELS, FiguresArg, resolve_figures
from topology.units import format_size

from ...algorithms.alltoallv_continuous import CCL_BUFFER_BYTES
from ...collectives import CallSpec
from ...collectives import collective as lookup
from ...errors import HcclError
from ...modeled.cost_model import CostModel, cube_flops, kernel_s
from ...modeled.simulator import simulate_p2p
from ..calls import simulate_call

TABLE = Path(__file__).with_name("measurements.json")
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1, "int32": 4, "float64": 8}


def load_table(path: str | os.PathLike | None = None) -> list[dict]:
    """The rows of a measurements file (default: the one shipped with hccl-py)."""
    return json.loads(Path(path or TABLE).read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Check:
    """One row: what the source measured and what the model says, in the row's metric."""

    row: dict
    metric: str
    measured: float
    model: float
    algo: str

    @property
    def ratio(self) -> float:
        """model / measured."""
        return self.model / self.measured

    @property
    def held(self) -> bool:
        """Whether the row has a tolerance or a factor, so that validation fails when
        the model drifts beyond it."""
        return self.row.get("tolerance") is not None or self.row.get("factor") is not None

    @property
    def target(self) -> str:
        """The row's bound in words: ``±15%`` for a tolerance, ``2x`` for a factor, ``-`` when not held."""
        if self.row.get("tolerance") is not None:
            return f"±{self.row['tolerance'] * 100:.0f}%"
        if self.row.get("factor") is not None:
            return f"{self.row['factor']:g}x"
        return "-"

    @property
    def ok(self) -> bool:
        """Within the row's tolerance (always True for rows not held)."""
        tol, factor = self.row.get("tolerance"), self.row.get("factor")
        if tol is not None:
            return abs(self.ratio - 1) <= tol
        if factor is not None:
            return 1 / factor <= self.ratio <= factor
        return True


def predict(row: dict, figures: FiguresArg = None) -> tuple[float, str]:
    """(the model's value in the row's metric, the algorithm or kernel that gives it)."""
    spec = row["model"]
    metric = spec["metric"]
    if row["kind"] == "matmul":
        links, cards = resolve_figures(figures)
        card = cards.get(spec["card"], CARD_MODELS[spec["card"]])
        m, n, k, dtype = spec["m"], spec["n"], spec["k"], spec["dtype"]
        nbytes = (m * k + k * n + m * n) * ITEMSIZE[dtype]
        seconds = kernel_s(card, cube_flops(m, n, k), nbytes, dtype=dtype)
        value = seconds * 1e6 if metric == "time_us" else 2.0 * m * n * k / seconds / 1e12
        return value, f"matmul {m}x{k}x{n} {dtype}"
    topo = Topology.preset(spec["preset"], n=spec.get("n"), figures=figures)
    size = spec["size_bytes"]
    if row["kind"] == "p2p":
        seconds = simulate_p2p(topo, spec["src"], spec["dst"], size).time_s
        return (
            size / seconds / 1e9 if metric == "bandwidth_GBps" else seconds * 1e6
        ), f"send {spec['src']}->{spec['dst']}"
    itemsize = ITEMSIZE[spec["dtype"]]
    c = lookup(row["collective"])
    count = c.test_elements(size, itemsize, topo.num_ranks)
    request = CallSpec.of(c.name, count, dtype=spec["dtype"], algo=spec.get("algo", "auto"))
    call = simulate_call(request, topo, cost_model=CostModel(topo))
    seconds = call.time_s
    value = size / seconds / 1e9 if metric == "algbw_GBps" else seconds * 1e6
    return value, call.algo


def validate(table: str | os.PathLike | None = None, figures: FiguresArg = None) -> list[Check]:
    """Every row of the table beside the model's prediction."""
    checks = []
    for row in load_table(table):
        metric = row["model"]["metric"]
        measured = float(row["measured"][metric])
        model, algo = predict(row, figures)
        checks.append(Check(row, metric, measured, model, algo))
    return checks


_UNITS = {"algbw_GBps": "GB/s", "time_us": "us", "tflops": "TFLOPS", "bandwidth_GBps": "GB/s"}


def format_checks(checks: list[Check]) -> str:
    """The table ``hccl-sim validate`` prints: one line per row, then a summary."""
    head = ("id", "hardware", "what", "measured", "model", "ratio", "target", "status")
    lines = []
    for c in checks:
        row = c.row
        what = row.get("collective") or "matmul"
        if row["kind"] == "matmul":
            spec = row["model"]
            what = f"matmul {spec['m']}x{spec['n']}x{spec['k']} {spec['dtype']}"
        elif row["model"].get("size_bytes"):
            what = f"{what} {format_size(row['model']['size_bytes'])} ({c.algo})"
        unit = _UNITS[c.metric]
        status = ("ok" if c.ok else "DRIFT") if c.held else "not held"
        lines.append(
            (
                row["id"],
                _short(row["hardware"]),
                what,
                f"{c.measured:.4g} {unit}",
                f"{c.model:.4g} {unit}",
                f"{c.ratio:.3f}",
                c.target,
                status,
            )
        )
    widths = [max(len(str(x[i])) for x in [head, *lines]) for i in range(len(head))]
    out = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in [head, *lines]]
    held = [c for c in checks if c.held]
    out.append("")
    out.append(
        "# cross-server terms of 910B clusters, fitted to the 2 x 8 x 910B3 sweep and HIXL's 16 KB writes "
        "through a communicator (topology/figures.py):"
    )
    out.extend(f"#   {line}" for line in cross_server_terms())
    out.append(
        f"# {len(checks)} rows, {len(held)} held: {sum(c.ok for c in held)} within their target, "
        f"{sum(not c.ok for c in held)} drifted; rows not held say why in measurements.json and docs/fidelity.md"
    )
    return "\n".join(out)


def _short(text: str) -> str:
    text = text.split(",")[0].split("(")[0].strip()
    return text if len(text) <= 34 else text[:33] + "…"


def cross_server_terms() -> list[str]:
    """The cross-server model's terms, one line each: value, bound and source (``hccl-sim validate``
    prints them; docs/fidelity.md explains them)."""
    ports = fig.LEVEL1_PORTS
    return [
        f"port bandwidth     {fig.ROCE200_PORT_Bps / 1e9:.1f} GB/s per RoCE port and direction (fitted; bound 17.5-25: "
        "msmodeling's 25 x 0.7 to 200 GbE's line rate; HCCL 21.5, HIXL single flow 22.5-22.6)",
        f"RDMA operation     {fig.ROCE200_RDMA_OP_S * 1e6:.0f} us per transfer across servers, what a send pays "
        "(fitted to HIXL's 16 KB writes; bound 1.5-22.8: msmodeling's model latency to HIXL's whole 16 KB block; "
        "HCCL measured 7)",
        f"step sync          {fig.ROCE200_STEP_SYNC_S * 1e6:.0f} us more per collective step across servers: "
        "ready and done notifies, stream sync (fitted, at its bound; bound 14-"
        f"{(60e-6 - fig.ROCE200_RDMA_OP_S) * 1e6:.0f}: two notifies at HCCL's 7 us RDMA op to HCCL's level-1 LATENCY "
        f"of 60 us a step less the RDMA operation); a step: "
        f"{(fig.ROCE200_RDMA_OP_S + fig.ROCE200_STEP_SYNC_S) * 1e6:.0f} us",
        f"server uplink      {ports:g} ports' worth per server, any server count (fitted; bound 1-8: one per NPU; "
        "HCCL's level 1 drives all 8 planes, the sweep's network gave about one port's worth)",
        f"CCL buffer         {CCL_BUFFER_BYTES // 2**20} MB a loop (HCCL_BUFFSIZE's default, not fitted: the "
        "sweep's pipeline slices, at most 64 MiB, fit one loop)",
    ]


# ---------------------------------------------------------------- how sure an answer is

NEAR_FACTOR = 4.0  # a measurement counts as near when its size is within this factor


@dataclass(frozen=True)
class Situation:
    """What a modeled answer is about, in the terms a measurement is matched on: the collective
    (``p2p`` for a send), the card model, the link class (the link kinds the call crosses, inside
    a server and across), and the servers and ranks it spans."""

    collective: str
    card: str
    links: str
    servers: int
    ranks: int

    def describe(self) -> str:
        """One line naming the situation, e.g. ``allreduce on 16 x ascend910b in 2 server(s) over hccs, roce``."""
        return f"{self.collective} on {self.ranks} x {self.card} in {self.servers} server(s) over {self.links}"


def situation(topology: Topology, collective: str, src: int | None = None, dst: int | None = None) -> Situation:
    """The :class:`Situation` of a collective over all of ``topology`` or, with ``src`` and ``dst``,
    of a send between two ranks."""
    if src is not None and dst is not None:
        kinds = {topology.link(u, v).kind for u, v in topology.route(src, dst).hops}
        servers = len({topology.server_of(src), topology.server_of(dst)})
        return Situation("p2p", topology.card(src).name, "+".join(sorted(kinds)), servers, 2)
    kinds: set[str] = set()
    first = topology.server_ranks(0)
    for r in first[1:]:
        kinds.update(topology.link(u, v).kind for u, v in topology.route(first[0], r).hops)
    if topology.num_servers > 1:
        other = topology.server_ranks(1)[0]
        kinds.update(topology.link(u, v).kind for u, v in topology.route(first[0], other).hops)
    try:
        name = lookup(collective).name
    except (KeyError, ValueError, HcclError):  # a batch of sends and the like: matched by its own name
        name = collective
    return Situation(name, topology.card(0).name, "+".join(sorted(kinds)), topology.num_servers, topology.num_ranks)


_ROW_SITUATIONS: dict[str, Situation] = {}


def _row_situation(row: dict) -> Situation | None:
    if row["kind"] == "matmul":
        return None
    found = _ROW_SITUATIONS.get(row["id"])
    if found is None:
        spec = row["model"]
        topo = Topology.preset(spec["preset"], n=spec.get("n"))
        if row["kind"] == "p2p":
            found = situation(topo, "p2p", spec["src"], spec["dst"])
        else:
            found = situation(topo, row["collective"])
        _ROW_SITUATIONS[row["id"]] = found
    return found


@dataclass(frozen=True)
class Nearest:
    """The nearest held measurement to an answer: the row checked against the model (``check``) and
    how far its size is (``distance``: the larger size over the smaller, 1.0 = the same size)."""

    check: Check
    distance: float

    @property
    def time_error(self) -> float:
        """The model's error there as modeled time / measured time - 1 (bandwidth rows inverted)."""
        ratio = self.check.ratio
        return ratio - 1 if self.check.metric == "time_us" else 1 / ratio - 1


def nearest(
    where: Situation,
    size_bytes: int,
    figures: FiguresArg = None,
    table: str | os.PathLike | None = None,
) -> Nearest | None:
    """The held row of ``table`` of the same collective, card, link class, servers and ranks as
    ``where`` whose size is nearest ``size_bytes`` and within :data:`NEAR_FACTOR`, checked against
    the model with ``figures``; None when there is none (the answer is extrapolated)."""
    best: tuple[float, dict] | None = None
    for row in load_table(table):
        if row.get("tolerance") is None and row.get("factor") is None:
            continue
        if _row_situation(row) != where:
            continue
        size = row["model"]["size_bytes"]
        if size <= 0 or size_bytes <= 0:
            continue
        distance = max(size, size_bytes) / min(size, size_bytes)
        if distance <= NEAR_FACTOR and (best is None or distance < best[0]):
            best = (distance, row)
    if best is None:
        return None
    row = best[1]
    metric = row["model"]["metric"]
    model, algo = predict(row, figures)
    return Nearest(Check(row, metric, float(row["measured"][metric]), model, algo), best[0])


def sureness(where: Situation, size_bytes: int, figures: FiguresArg = None, *, short: bool = False) -> str:
    """How sure a modeled answer of ``size_bytes`` in ``where`` is, in words: the nearest held
    measurement, its distance and the model's error there, or that the figure is extrapolated.
    ``short``: one clause for a sweep's line."""
    near = nearest(where, size_bytes, figures)
    if near is None:
        if short:
            return f"extrapolated: no held measurement within {NEAR_FACTOR:g}x"
        return (
            f"no held public measurement of {where.describe()} within {NEAR_FACTOR:g}x of "
            f"{format_size(size_bytes)}: the figure is extrapolated"
        )
    c = near.check
    size = format_size(c.row["model"]["size_bytes"])
    if short:
        return f"nearest {c.row['id']} ({size}, {near.distance:.2g}x away): model {near.time_error:+.1%}"
    unit = _UNITS[c.metric]
    return (
        f"nearest held measurement: {c.row['id']} ({size}, {near.distance:.2g}x the size away; "
        f"{_short(c.row['hardware'])}); the model there: {c.model:.4g} {unit} against {c.measured:.4g} {unit} "
        f"measured ({c.ratio:.3f}x, held {c.target}; modeled time {near.time_error:+.1%})"
    )
