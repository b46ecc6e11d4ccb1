"""hccl-calibrate: fit the link and overhead figures to a user's own HCCL Test (or nccl-tests) logs.

    mpirun -n 8 ./bin/all_reduce_test -p 8 -b 8K -e 1G -f 2 -d fp32 > all_reduce.log   # on the real cluster
    mpirun -n 8 ./bin/all_gather_test -p 8 -b 8K -e 1G -f 2 -d fp32 > all_gather.log
    hccl-calibrate --preset ascend910b-8p all_reduce.log all_gather.log -o figures.json
    hccl-launch --figures figures.json --topology ascend910b-8p -n 8 infer.py           # modeled with them
    hccl-sim allreduce --preset ascend910b-8p --figures figures.json -b 8K -e 1G    # a sweep beside the real one

Each log is ``FILE`` or ``FILE:COLLECTIVE`` or ``FILE:COLLECTIVE:RANKS`` (the collective is read
from the log's command line, an ``hccl-sim`` sweep's header or the file name when not given;
RANKS, default all of the topology, is how many cards of the preset the run used). Rows are HCCL
Test's (``data_size(Bytes): | aveg_time(us): | alg_bandwidth(GB/s): | check_result:``) or
nccl-tests' (``size count type redop root time algbw busbw #wrong ...``, the out-of-place time);
both define data_size the same way (the buffer of allreduce, the gathered output of allgather).

The fit: the figures named by ``--fit`` (default: bandwidth and latency of every link kind the
runs cross, its collective step's synchronisation where it has one, and the card's launch cost)
are varied in log space by Levenberg-Marquardt to minimise the squared relative error of every row's modeled time (the same simulation as ``hccl-sim``,
HCCL's algorithm choice included), with a faint pull towards the table's values so that figures
the logs cannot tell apart stay where they were. Every row is printed with its fitted prediction
and residual; the figures that changed are written as a figures JSON (``topology.load_figures``).
Bad input stops with the file and line: an unparseable file, a run on another number of cards
than the topology has, a fit that does not converge.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from topology import RankTable, Topology, TopologyError
from topology.cli import quiet_on_closed_pipe
from topology.figures import (
    CARD_MODELS,
    LINK_KINDS,
    Figures,
    figures_to_dict,
    resolve_figures,
)

from ..collectives import CallSpec, spellings
from ..collectives import collective as lookup
from ..dtypes import DTYPE_SPELLINGS, ITEMSIZE_BY_NAME
from ..errors import HcclError
from ..modeled.cost_model import CostModel
from .calls import simulate_call


class CalibrationError(Exception):
    """Bad input or a fit that failed; ``where`` is ``file:line`` when a line is to blame."""

    def __init__(self, message: str, where: str | None = None):
        super().__init__(f"{where}: {message}" if where else message)
        self.where = where


@dataclass(frozen=True)
class Measurement:
    """One row of a log: a call of ``collective`` with HCCL Test's ``data_size`` that took ``time_s``."""

    file: str
    line: int
    collective: str
    size: int
    time_s: float
    ranks: int
    dtype: str = "float32"
    op: str = "sum"

    @property
    def where(self) -> str:
        """``file:line`` of the row, for messages."""
        return f"{self.file}:{self.line}"


@dataclass
class Log:
    """One log as read: its ``path``, ``collective``, ``ranks`` used (None: all), the ranks it
    states itself (``stated_ranks``: with the line), ``dtype``, ``op`` and its ``rows``
    (line, data_size, seconds)."""

    path: str
    collective: str | None = None
    ranks: int | None = None  # cards of the preset the run used (None: all)
    stated_ranks: tuple[int, int] | None = None  # (ranks the log itself states, line)
    dtype: str = "float32"
    op: str = "sum"
    rows: list[tuple[int, int, float]] = field(default_factory=list)  # (line, data_size, time_s)


def parse_log(spec: str) -> Log:
    """Read one log (``FILE[:COLLECTIVE[:RANKS]]``): HCCL Test's table or nccl-tests' table."""
    path, collective, ranks = _split_spec(spec)
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise CalibrationError(f"cannot read the log ({err.strerror or err})", path) from None
    log = Log(path, collective, ranks)
    kind = None  # "hccl" or "nccl"
    columns: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0] if kind == "hccl" else raw
        stripped = raw.strip()
        _read_context(log, raw, number)
        if "data_size" in stripped and "|" in stripped:
            kind = "hccl"
            names = [c.strip().rstrip(":").lower() for c in stripped.split("|")]
            columns = {n.split("(")[0]: i for i, n in enumerate(names)}
            if "data_size" not in columns or not ({"aveg_time", "avg_time"} & set(columns)):
                raise CalibrationError("HCCL Test header without data_size and aveg_time columns", f"{path}:{number}")
            continue
        if stripped.startswith("#") and re.search(r"\bsize\b.*\bcount\b.*\btime\b.*\balgbw\b", stripped):
            kind = "nccl"
            continue
        if kind == "hccl" and "|" in line:
            cells = [c.strip() for c in line.split("|")]
            if cells and cells[0].startswith("local rank_id"):
                raise CalibrationError(
                    "a rank reports a failed result check; calibrate from a run that passes", f"{path}:{number}"
                )
            try:
                size = int(cells[columns["data_size"]])
                time_us = float(cells[columns.get("aveg_time", columns.get("avg_time"))])
            except (ValueError, IndexError):
                raise CalibrationError(
                    f"cannot read this row of the HCCL Test table: {stripped!r}", f"{path}:{number}"
                ) from None
            check = (
                cells[columns["check_result"]].lower()
                if "check_result" in columns and len(cells) > columns["check_result"]
                else ""
            )
            if check.startswith("failed"):
                raise CalibrationError(
                    "this row's result check failed; calibrate from a run that passes", f"{path}:{number}"
                )
            log.rows.append((number, size, time_us * 1e-6))
        elif kind == "nccl" and stripped and not stripped.startswith("#"):
            cells = stripped.split()
            if not cells[0].isdigit():
                continue
            try:
                size, time_us = int(cells[0]), float(cells[5])
            except (ValueError, IndexError):
                raise CalibrationError(
                    f"cannot read this row of the nccl-tests table: {stripped!r}", f"{path}:{number}"
                ) from None
            if len(cells) > 3:
                log.dtype = DTYPE_SPELLINGS.get(cells[2].lower(), log.dtype)
                log.op = cells[3].lower() if cells[3].lower() in ("sum", "prod", "max", "min") else log.op
            log.rows.append((number, size, time_us * 1e-6))
    if not log.rows:
        raise CalibrationError(
            "no HCCL Test table (a 'data_size(Bytes): | aveg_time(us): | ...' header and rows) and no "
            "nccl-tests table found",
            path,
        )
    if log.collective is None:
        log.collective = _collective_from(Path(path).name.lower())
    if log.collective is None:
        raise CalibrationError(
            "cannot tell which collective this log measured (no test command line in it, no "
            "collective in its file name); name it: FILE:allreduce, or call it all_reduce.log",
            path,
        )
    return log


def _split_spec(spec: str) -> tuple[str, str | None, int | None]:
    parts = spec.split(":")
    path, collective, ranks = parts[0], None, None
    if len(parts) > 1 and parts[1]:
        try:
            collective = lookup(parts[1]).name
        except HcclError:
            raise CalibrationError(f"unknown collective {parts[1]!r}", spec) from None
    if len(parts) > 2 and parts[2]:
        if not parts[2].isdigit() or int(parts[2]) < 1:
            raise CalibrationError(f"the ranks of {spec!r} must be a positive whole number", spec)
        ranks = int(parts[2])
    return path, collective, ranks


def _collective_from(text: str) -> str | None:
    """The collective a command line names (``all_reduce_test``, ``reducescatter_perf``): the
    longest spelling found, so ``reduce_scatter`` wins over ``reduce`` and ``scatter``."""
    for spelling, name in _SPELLINGS_LONGEST_FIRST:
        if spelling in text:
            return name
    return None


_SPELLINGS_LONGEST_FIRST = sorted(spellings().items(), key=lambda item: -len(item[0]))


def _read_context(log: Log, raw: str, number: int) -> None:
    """What a log says about its run besides the table: the command (collective, -n, -d, -o) and
    nccl-tests' per-rank lines."""
    if re.search(r"\b\w+_test\b|\b\w+_perf\b", raw) and ("mpirun" in raw or "./" in raw or "bin/" in raw):
        if log.collective is None:
            log.collective = _collective_from(raw.lower())
        n = re.search(r"(?:^|\s)-(?:n|np)\s+(\d+)", raw)
        if n and log.stated_ranks is None:
            log.stated_ranks = (int(n.group(1)), number)
        d = re.search(r"(?:^|\s)-d\s+(\w+)", raw)
        if d:
            log.dtype = DTYPE_SPELLINGS.get(d.group(1).lower(), log.dtype)
        o = re.search(r"(?:^|\s)-o\s+(\w+)", raw)
        if o and o.group(1).lower() in ("sum", "prod", "max", "min"):
            log.op = o.group(1).lower()
    sim = re.match(r"#\s*hccl-sim:\s*(\w+)\s+(\w+)\s+op\s+(\w+)\s+on\s+\S+\s+\((\d+) ranks\)", raw.strip())
    if sim:  # an hccl-sim sweep's own header: what it modeled (a sweep laid beside, or fed back)
        if log.collective is None:
            log.collective = _collective_from(sim.group(1).lower())
        log.dtype = DTYPE_SPELLINGS.get(sim.group(2).lower(), log.dtype)
        log.op = sim.group(3).lower() if sim.group(3).lower() in ("sum", "prod", "max", "min") else log.op
        if log.stated_ranks is None:
            log.stated_ranks = (int(sim.group(4)), number)
    m = re.match(r"#\s*Rank\s+(\d+)\b", raw.strip())
    if m:
        seen = int(m.group(1)) + 1
        if log.stated_ranks is None or seen > log.stated_ranks[0]:
            log.stated_ranks = (seen, number)


# ----------------------------------------------------------------------------------------- fitting

Param = tuple[str, str, str]  # ("links" | "cards", name, field)


def default_params(topologies: list[Topology]) -> list[Param]:
    """Bandwidth and latency of every link kind a card-to-card route of the runs crosses (and its
    ``step_sync_s`` where it has one: collective logs time the latency and the step's
    synchronisation together, so both move, each pulled towards the table), and each card
    model's launch cost."""
    kinds: dict[str, bool] = {}
    cards: dict[str, None] = {}
    for topo in topologies:
        n = topo.num_ranks
        pairs = (
            [(0, b) for b in range(1, n)]
            + [(a, (a + 1) % n) for a in range(n)]
            + [(a, a ^ 1) for a in range(n) if a ^ 1 < n]
        )
        for a, b in pairs:
            if a != b:
                for u, v in topo.route(a, b).hops:
                    spec = topo.link(u, v)
                    kinds.setdefault(spec.kind, spec.step_sync_s > 0)
        cards.setdefault(topo.card(0).name)
    params: list[Param] = []
    for kind, synced in kinds.items():
        params += [("links", kind, "bandwidth_Bps"), ("links", kind, "latency_s")]
        if synced:
            params.append(("links", kind, "step_sync_s"))
    params += [("cards", card, "launch_overhead_s") for card in cards]
    return params


def parse_params(text: str) -> list[Param]:
    """``links.HCCS_910B.bandwidth_Bps,cards.ascend910b.launch_overhead_s`` -> params."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        parts = item.split(".")
        if len(parts) != 3 or parts[0] not in ("links", "cards"):
            raise CalibrationError(f"--fit: {item!r} is not links.<KIND>.<field> or cards.<card>.<field>")
        section, name, fld = parts
        table = LINK_KINDS if section == "links" else CARD_MODELS
        if name not in table or not isinstance(getattr(table[name], fld, None), float):
            raise CalibrationError(
                f"--fit: {item!r} names no figure (kinds: {', '.join(LINK_KINDS)}; cards: {', '.join(CARD_MODELS)})"
            )
        out.append((section, name, fld))
    if not out:
        raise CalibrationError("--fit names no figure")
    return out


def with_values(base: Figures, params: list[Param], values: np.ndarray) -> Figures:
    """``base`` with the figures named by ``params`` set to ``values`` (the tables
    are copied, not changed)."""
    links, cards = dict(base[0]), dict(base[1])
    for (section, name, fld), value in zip(params, values):
        table = links if section == "links" else cards
        table[name] = replace(table[name], **{fld: float(value)})
    return links, cards


@dataclass
class Fit:
    """The fitted figures, each measurement with its fitted prediction, and how the fit went."""

    figures: Figures
    params: list[Param]
    values: np.ndarray
    start: np.ndarray
    measurements: list[Measurement]
    predicted: np.ndarray
    iterations: int

    @property
    def residuals(self) -> np.ndarray:
        """(predicted - measured) / measured per row."""
        measured = np.array([m.time_s for m in self.measurements])
        return (self.predicted - measured) / measured


class Runs:
    """The logs as measurements on their topologies, and the model's times for them."""

    def __init__(self, logs: list[Log], make_topology, base: Figures):
        self.logs = logs
        self.make_topology = make_topology
        self.base = base
        self.measurements: list[Measurement] = []
        for log in logs:
            topo = make_topology(log.ranks, base)
            if log.stated_ranks is not None and log.stated_ranks[0] != topo.num_ranks:
                raise CalibrationError(
                    f"this run used {log.stated_ranks[0]} ranks but the topology has {topo.num_ranks} "
                    f"({topo.name}); name the cards it used as FILE:COLLECTIVE:RANKS or pick the preset it ran on",
                    f"{log.path}:{log.stated_ranks[1]}",
                )
            spec = lookup(log.collective)
            itemsize = ITEMSIZE_BY_NAME.get(log.dtype, 4)
            for line, size, time_s in log.rows:
                if time_s <= 0:
                    raise CalibrationError("a row with a time of zero or less", f"{log.path}:{line}")
                if spec.test_elements(size, itemsize, topo.num_ranks) < 1:
                    continue  # below one element per rank: HCCL Test skips these too
                self.measurements.append(
                    Measurement(log.path, line, spec.name, size, time_s, topo.num_ranks, log.dtype, log.op)
                )
        if not self.measurements:
            raise CalibrationError("no usable rows in the logs")

    def predict(self, figures: Figures) -> np.ndarray:
        """Modeled seconds of every measurement with ``figures``, in measurement order."""
        out = []
        topos: dict[tuple, Topology] = {}
        for log in self.logs:
            key = (log.ranks,)
            if key not in topos:
                topos[key] = self.make_topology(log.ranks, figures)
        by_file = {log.path: log for log in self.logs}
        models: dict[tuple, CostModel] = {}
        for m in self.measurements:
            log = by_file[m.file]
            topo = topos[(log.ranks,)]
            model = models.setdefault((log.ranks,), CostModel(topo))
            itemsize = ITEMSIZE_BY_NAME.get(m.dtype, 4)
            count = lookup(m.collective).test_elements(m.size, itemsize, topo.num_ranks)
            out.append(
                simulate_call(CallSpec.of(m.collective, count, dtype=m.dtype, op=m.op), topo, cost_model=model).time_s
            )
        return np.array(out)


PRIOR = 1e-2  # weight of the pull towards the table's values (log space)
SENSITIVITY = 0.01  # a figure that moves no row's time by 1% per 100% of itself is left out of a default fit


def identifiable(runs: Runs, params: list[Param]) -> tuple[list[Param], list[Param]]:
    """(figures the rows can tell, figures they cannot): a default fit leaves out figures whose
    doubling changes no row's modeled time by 1% (e.g. latencies, for a log of one large size)."""
    base = runs.base
    start = np.array([getattr((base[0] if s == "links" else base[1])[n], f) for s, n, f in params], dtype=np.float64)
    t0 = runs.predict(base)
    keep, drop = [], []
    for j, param in enumerate(params):
        values = start.copy()
        values[j] *= 2
        moved = np.max(np.abs(np.log(runs.predict(with_values(base, params, values)) / t0)))
        (keep if moved >= SENSITIVITY * math.log(2) else drop).append(param)
    return keep, drop


def fit(runs: Runs, params: list[Param], *, max_iterations: int = 60, tolerance: float = 1e-10) -> Fit:
    """Levenberg-Marquardt in log space on the rows' relative errors; CalibrationError when it
    does not converge."""
    base = runs.base
    start = np.array([getattr((base[0] if s == "links" else base[1])[n], f) for s, n, f in params], dtype=np.float64)
    x0 = np.log(start)
    measured = np.array([m.time_s for m in runs.measurements])

    def residual(x: np.ndarray) -> np.ndarray:
        predicted = runs.predict(with_values(base, params, np.exp(x)))
        return np.concatenate([np.log(predicted / measured), PRIOR * (x - x0)])

    x = x0.copy()
    r = residual(x)
    cost = float(r @ r)
    damping = 1e-3
    for iteration in range(1, max_iterations + 1):
        jac = np.empty((r.size, x.size))
        for j in range(x.size):
            h = 1e-6
            step = x.copy()
            step[j] += h
            jac[:, j] = (residual(step) - r) / h
        grad = jac.T @ r
        normal = jac.T @ jac
        improved = False
        for _ in range(20):
            try:
                delta = np.linalg.solve(normal + damping * np.diag(np.diag(normal) + 1e-12), -grad)
            except np.linalg.LinAlgError:
                damping *= 10
                continue
            candidate = x + delta
            r_new = residual(candidate)
            cost_new = float(r_new @ r_new)
            if np.isfinite(cost_new) and cost_new < cost:
                x, r, improved = candidate, r_new, True
                done = cost - cost_new <= tolerance * max(cost, 1e-30) or float(np.max(np.abs(delta))) < 1e-9
                cost = cost_new
                damping = max(damping / 10, 1e-12)
                break
            damping *= 10
        if not improved or done:
            if not improved and float(np.max(np.abs(grad))) > 1e-6 * max(1.0, cost):
                raise CalibrationError(
                    f"the fit did not converge: no step lowers the error after {iteration} iterations "
                    f"(squared relative error {cost:.3g}); fit fewer figures (--fit) or give more sizes"
                )
            figures = with_values(base, params, np.exp(x))
            return Fit(figures, params, np.exp(x), start, runs.measurements, runs.predict(figures), iteration)
    raise CalibrationError(
        f"the fit did not converge in {max_iterations} iterations (squared relative error {cost:.3g}); "
        "fit fewer figures (--fit) or give more sizes"
    )


def format_fit(fit_: Fit) -> str:
    """The fit as text: each figure's change, then every row with its measured and
    fitted time and residual."""
    lines = ["# figures fitted (table value -> fitted):"]
    for (section, name, fld), before, after in zip(fit_.params, fit_.start, fit_.values):
        lines.append(f"#   {section}.{name}.{fld}: {before:.6g} -> {after:.6g}")
    lines.append(f"# {len(fit_.measurements)} rows, {fit_.iterations} iterations")
    head = ("file:line", "collective", "data_size", "measured us", "fitted us", "residual")
    rows = [
        (m.where, m.collective, str(m.size), f"{m.time_s * 1e6:.2f}", f"{p * 1e6:.2f}", f"{res * 100:+.2f}%")
        for m, p, res in zip(fit_.measurements, fit_.predicted, fit_.residuals)
    ]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for row in [head, *rows]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    res = np.abs(fit_.residuals)
    lines.append(f"# residuals: max {res.max() * 100:.2f}%, rms {math.sqrt(float(np.mean(res**2))) * 100:.2f}%")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``hccl-calibrate``."""
    parser = argparse.ArgumentParser(
        prog="hccl-calibrate", description="Fit link and overhead figures to HCCL Test logs."
    )
    parser.add_argument("logs", nargs="+", metavar="FILE[:COLLECTIVE[:RANKS]]", help="HCCL Test or nccl-tests outputs")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--preset", help="the cluster the logs ran on, e.g. ascend910b-8p or 2x8p-roce")
    where.add_argument("--rank-table", metavar="FILE", help="the rank table they ran with")
    parser.add_argument("--wiring", default=None, help="server preset of a --rank-table")
    parser.add_argument("--figures", metavar="FILE", default=None, help="start from these figures instead of the table")
    parser.add_argument(
        "--fit",
        default=None,
        metavar="FIGURES",
        help="comma-separated figures to fit, e.g. links.HCCS_910B.bandwidth_Bps,cards.ascend910b.launch_overhead_s "
        "(default: bandwidth, latency and any step sync of every link kind the runs cross, and the launch cost)",
    )
    parser.add_argument("-o", "--output", metavar="FILE", default=None, help="write the fitted figures JSON here")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``hccl-calibrate``: fit the figures to the logs, print the fit; exit
    status 0, or 2 for bad input."""
    quiet_on_closed_pipe(argv)
    args = build_parser().parse_args(argv)
    try:
        base = resolve_figures(args.figures)
        table = RankTable.load(args.rank_table) if args.rank_table else None

        def make_topology(ranks: int | None, figures: Figures) -> Topology:
            if table is not None:
                topo = Topology.from_rank_table(table, preset=args.wiring, figures=figures)
                if ranks is not None and ranks != topo.num_ranks:
                    raise CalibrationError(
                        f"a rank table has {topo.num_ranks} ranks; a log for {ranks} needs its own table"
                    )
                return topo
            return Topology.preset(args.preset, n=ranks, figures=figures)

        logs = [parse_log(spec) for spec in args.logs]
        runs = Runs(logs, make_topology, base)
        skipped: list[Param] = []
        if args.fit:
            params = parse_params(args.fit)
        else:
            params, skipped = identifiable(runs, default_params([make_topology(log.ranks, base) for log in logs]))
            if not params:
                raise CalibrationError("the logs constrain no figure (no row's time depends on them); give more sizes")
        result = fit(runs, params)
    except CalibrationError as err:
        print(f"hccl-calibrate: {err}", file=sys.stderr)
        return 2
    except (TopologyError, HcclError) as err:
        print(f"hccl-calibrate: {err}", file=sys.stderr)
        return 2
    print(format_fit(result))
    for section, name, fld in skipped:
        print(
            f"# not fitted: {section}.{name}.{fld} (no row's time depends on it; kept at {getattr((base[0] if section == 'links' else base[1])[name], fld):.6g})"
        )
    if args.output:
        Path(args.output).write_text(json.dumps(figures_to_dict(result.figures), indent=1) + "\n", encoding="utf-8")
        print(f"# wrote {args.output}: hccl-launch --figures {args.output} ..., hccl-sim ... --figures {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
