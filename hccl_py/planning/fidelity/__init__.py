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
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from topology import Topology
from topology.figures import CARD_MODELS, FiguresArg, resolve_figures
from topology.units import format_size

from ...collectives import collective as lookup
from ...cost_model import CostModel, cube_flops, kernel_s
from ...simulator import simulate_p2p
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
    call = simulate_call(
        c.name,
        topo,
        count,
        algo=spec.get("algo", "auto"),
        itemsize=itemsize,
        dtype=spec["dtype"],
        cost_model=CostModel(topo),
    )
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
        f"# {len(checks)} rows, {len(held)} held: {sum(c.ok for c in held)} within their target, "
        f"{sum(not c.ok for c in held)} drifted; rows not held say why in measurements.json and docs/fidelity.md"
    )
    return "\n".join(out)


def _short(text: str) -> str:
    text = text.split(",")[0].split("(")[0].strip()
    return text if len(text) <= 34 else text[:33] + "…"
